"""The market between pools: price discovery over the jobs' throughput matrix (paper 004, Alg. 2).

Jobs of a cluster mix utility families (004 Sec. 2.2), while :func:`allocator.pricing.solve` takes one object that
implements the :class:`allocator.utilities.Utility` protocol for all ``n`` jobs. :class:`MixedUtility` is that object:
it keeps one vectorised utility per family and scatters each call over the family's rows, so the per-job subproblem
(Alg. 1, eqs. 15-16) stays vectorised within every family.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from allocator import pricing, utilities
from allocator._xp import Array, convert_index, flatnonzero, index_like, namespace, numel
from allocator.pricing.primal.polish import feasible, polish_allocation
from walras.planner.spec import UtilitySpec

#: Markets with at most this many usable (job, pool) cells get the primal polish of :func:`polish_allocation`
#: (SLSQP's dense QP grows cubically with the cells: 300 cells took ~40 s per plan on a busy 2-core machine).
POLISH_CELLS = 256


class MixedUtility:
    """A :class:`allocator.utilities.Utility` whose job ``i`` uses family ``family[i]`` (an index into ``parts``).

    ``parts[f]`` describes the jobs of family ``f`` in their order; ``row[i]`` is job i's row within its part.
    ``family`` and ``row`` are int64 arrays: numpy on the CPU route of :func:`allocator.pricing.solve`, torch tensors
    on its torch route (:meth:`to` moves them with the parts).
    """

    def __init__(self, family: Array, row: Array, parts: Sequence[utilities.Utility]) -> None:
        self.family = family
        self.row = row
        self.parts = list(parts)
        self._members = [flatnonzero(family == f) for f in range(len(self.parts))]

    @property
    def n_jobs(self) -> int:
        return int(self.family.shape[0])

    def _apply(self, name: str, *args: Array) -> Array:
        out = namespace(args[0]).empty_like(args[0])
        for f, part in enumerate(self.parts):
            idx = self._members[f]
            if numel(idx) == 0:
                continue
            sub = part.take(self.row[idx])
            out[idx] = getattr(sub, name)(*(a[idx] for a in args))
        return out

    def value(self, t: Array) -> Array:
        return self._apply("value", t)

    def derivative(self, t: Array) -> Array:
        return self._apply("derivative", t)

    def argmax(self, alpha: Array, gamma: Array, delta: Array) -> Array:
        return self._apply("argmax", alpha, gamma, delta)

    def take(self, index: Array) -> MixedUtility:
        index = index_like(index, self.family)
        return MixedUtility(self.family[index], self.row[index], self.parts)

    def to(self, device: Any = None, dtype: Any = None) -> MixedUtility:
        """A copy on ``device`` in ``dtype`` (the library follows :func:`allocator._xp.convert`: a numpy dtype on the
        CPU gives numpy arrays, a torch dtype or a CUDA device torch tensors)."""
        return MixedUtility(
            convert_index(self.family, device, dtype),
            convert_index(self.row, device, dtype),
            [p.to(device, dtype) for p in self.parts],
        )


def build_utility(specs: Sequence[UtilitySpec], weights: Sequence[float]) -> MixedUtility:
    """One :class:`MixedUtility` for jobs with the given utility specs; ``weights`` multiply each spec's weight.

    Families (004 Sec. 2.2): linear ``w t``; log ``w log t`` (eq. 1); power ``w t^p`` / ``-w t^p``; alpha-fair
    ``w t^(1-a)/(1-a)``; target-priority ``w min(t - t_des, 0)`` (eq. 2). Jobs of one family with different
    parameters share a part (parameters are per-job tensors).
    """
    n = len(specs)
    kinds = ["linear", "log", "power", "alpha-fair", "target-priority"]
    family = np.array([kinds.index(s.type) for s in specs], dtype=np.int64)
    row = np.zeros(n, dtype=np.int64)
    parts: list[utilities.Utility] = []
    for f, kind in enumerate(kinds):
        index = np.flatnonzero(family == f)
        row[index] = np.arange(index.size)
        members = index.tolist()
        w = np.array([specs[i].weight * weights[i] for i in members], dtype=np.float64)
        if not members:
            w = np.ones(1)
        if kind == "linear":
            parts.append(utilities.Linear(weight=w))
        elif kind == "log":
            parts.append(utilities.Log(weight=w))
        elif kind == "power":
            p = np.array([specs[i].exponent for i in members] or [1.0], dtype=np.float64)
            parts.append(utilities.Power(p, weight=w))
        elif kind == "alpha-fair":
            a = np.array([specs[i].alpha for i in members] or [0.0], dtype=np.float64)
            parts.append(utilities.AlphaFair(a, weight=w))
        else:
            t = np.array([specs[i].target for i in members] or [1.0], dtype=np.float64)
            parts.append(utilities.TargetPriority(t, weight=w))
    return MixedUtility(family, row, parts)


def utility_values(specs: Sequence[UtilitySpec], weights: Sequence[float], t: np.ndarray) -> np.ndarray:
    """``u_i(t_i)`` for every job, in float64 (what the JobPlan reports)."""
    mixed = build_utility(specs, weights).to("cpu", np.float64)
    return np.asarray(mixed.value(np.asarray(t, dtype=np.float64)))


@dataclass
class MarketResult:
    """Prices per pool, the allocation X (time fractions) and the solver's statistics."""

    prices: np.ndarray
    allocation: np.ndarray
    throughputs: np.ndarray
    iterations: int
    gap: float
    primal: float
    dual: float
    converged: bool
    seconds: float
    device: str
    repaired: float = 0.0  #: largest constraint violation of the solver's allocation that :func:`feasible` removed
    eps: float = 0.0  #: the tolerance ``converged`` was judged against (the allocator's, :func:`pricing.default_eps`)
    #: the previous plan's result, taken because every input of the solve was equal (no solve ran: ``seconds`` 0,
    #: the other statistics those of the solve that produced it)
    reused: bool = False


@dataclass(frozen=True)
class MarketSettings:
    """How :func:`solve_market` runs: the device, the bound on dual evaluations and the duality-gap tolerance (None:
    the allocator's default)."""

    device: str = "cpu"
    max_iter: int = 60
    eps: float | None = None


def solve_market(
    throughput: np.ndarray,
    capacity: np.ndarray,
    specs: Sequence[UtilitySpec],
    weights: Sequence[float],
    demand: np.ndarray,
    prices: np.ndarray | None,
    settings: MarketSettings = MarketSettings(),
) -> MarketResult:
    """Price discovery (004, Alg. 2) for ``n`` jobs over ``m`` pools, warm-started at ``prices`` when given.

    ``demand[i, j]`` is job i's use of pool j's priced resource when it runs there all the time (its replicas times
    its demand per replica), so the coupling constraint is ``sum_i demand_ij x_ij <= capacity_j`` (004 Sec. 7.1).
    ``settings.max_iter`` bounds the dual evaluations so that one plan stays within its time budget; the returned
    allocation is feasible either way and the gap says how far from optimal it may be. ``settings.eps`` is the
    allocator's tolerance on the duality gap ``g(p) - U(X)`` (default ``1e-3 n``, the default of
    :func:`allocator.pricing.solve`); ``settings.device`` where the solve runs.

    The prices of :func:`allocator.pricing.solve` are dual-optimal, but its allocation (the column-scaled point of
    004 Sec. 5) can stay a few percent below ``U*`` when jobs are indifferent between pools at those prices (kinks of
    ``g``; linear and target-priority utilities make this common in a real cluster). The solver's LP split of the tied
    jobs (``allocator.pricing.primal.recovery``) closes most of that; where it still leaves the gap open, small markets
    (at most :data:`POLISH_CELLS` usable cells) that did not converge get their allocation polished by
    :func:`polish_allocation` and the gap is recomputed against the solver's dual bound.
    """
    n, m = throughput.shape
    if n == 0 or m == 0:
        return MarketResult(
            prices=np.zeros(m) if prices is None else np.asarray(prices, dtype=np.float64),
            allocation=np.zeros((n, m)),
            throughputs=np.zeros(n),
            iterations=0,
            gap=0.0,
            primal=0.0,
            dual=0.0,
            converged=True,
            seconds=0.0,
            device=settings.device,
        )
    utility = build_utility(specs, weights)
    # pricing.solve runs a CPU solve on the numpy route (no torch), a CUDA one on torch (allocator.pricing.problem).
    result = _solve(throughput, capacity, utility, demand, prices, settings)
    allocation, repaired = feasible(np.asarray(result.allocation, dtype=np.float64), demand, capacity)
    tol = float(result.eps)  # the allocator's own tolerance (1e-3 n for log, scaled per job for target-priority)
    throughputs = np.asarray(result.throughputs, dtype=np.float64)
    primal, dual = float(result.utility_value), float(result.dual_value)
    gap, converged = float(result.gap), bool(result.converged)
    if not converged and int(np.count_nonzero(throughput > 0)) <= POLISH_CELLS and math.isfinite(dual):
        polished = polish_allocation(throughput, capacity, utility, demand, allocation, target=dual - tol / 2)
        if polished is not None:
            value = float(utility.to("cpu", np.float64).value(_rates(throughput, polished)).sum())
            if value > primal:
                allocation, primal = polished, value
                throughputs = _rates(throughput, polished)
                gap = max(dual - primal, 0.0)
                converged = gap <= tol
    return MarketResult(
        prices=np.asarray(result.prices, dtype=np.float64),
        allocation=allocation,
        throughputs=throughputs,
        iterations=int(result.iterations),
        gap=gap,
        primal=primal,
        dual=dual,
        converged=converged,
        seconds=float(result.seconds),
        device=str(result.device),
        repaired=repaired,
        eps=tol,
    )


def _solve(
    throughput: np.ndarray,
    capacity: np.ndarray,
    utility: MixedUtility,
    demand: np.ndarray,
    prices: np.ndarray | None,
    settings: MarketSettings,
) -> pricing.PricingResult:
    return pricing.solve(
        throughput,
        capacity,
        utility,
        demand=demand,
        prices=prices,
        max_iter=settings.max_iter,
        device=settings.device,
        dtype="float64",
        eps=settings.eps,
    )


def _rates(throughput: np.ndarray, allocation: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", throughput, allocation)
