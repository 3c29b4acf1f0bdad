"""The market between pools: price discovery over the jobs' throughput matrix (paper 004, Alg. 2).

Jobs of a cluster mix utility families (004 Sec. 2.2), while :func:`allocator.pricing.solve` takes one object that
implements the :class:`allocator.utilities.Utility` protocol for all ``n`` jobs. :class:`MixedUtility` is that object:
it keeps one vectorised utility per family and scatters each call over the family's rows, so the per-job subproblem
(Alg. 1, eqs. 15-16) stays vectorised within every family.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
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
    #: with budgets (:func:`budget_equilibrium`): the market weights ``b'`` of the last solve (T6), per row; the
    #: next plan's warm start with these prices (None without budgets)
    weights: np.ndarray | None = None


@dataclass(frozen=True)
class MarketSettings:
    """How :func:`solve_market` runs: the device, the bound on dual evaluations (per solve), the duality-gap
    tolerance (None: the allocator's default) and whether the weights are budgets (:func:`budget_equilibrium`)."""

    device: str = "cpu"
    max_iter: int = 60
    eps: float | None = None
    #: the log weights are budgets (tenants on, docs/budgets.md): solve for the budget-constrained equilibrium
    #: (:func:`budget_equilibrium`, T6), in which a job whose time cap binds still spends its budget
    budgets: bool = False


def solve_market(
    throughput: np.ndarray,
    capacity: np.ndarray,
    specs: Sequence[UtilitySpec],
    weights: Sequence[float],
    demand: np.ndarray,
    prices: np.ndarray | None,
    settings: MarketSettings = MarketSettings(),
    warm_weights: np.ndarray | None = None,
) -> MarketResult:
    """Price discovery (004, Alg. 2) for ``n`` jobs over ``m`` pools, warm-started at ``prices`` when given (and,
    with budgets, at the market weights ``warm_weights`` of the solve that gave those prices).

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

    With ``settings.budgets`` (tenants on: every job a log buyer whose weight is its budget ``b_i``) the result is
    the budget-constrained equilibrium of :func:`budget_equilibrium` (docs/budgets.md, T6).
    """
    n, m = throughput.shape
    if settings.budgets and n > 0 and m > 0 and all(s.type == "log" for s in specs):
        return budget_equilibrium(throughput, capacity, specs, weights, demand, prices, settings, warm_weights)
    return _one_market(throughput, capacity, specs, weights, demand, prices, settings)


def _one_market(
    throughput: np.ndarray,
    capacity: np.ndarray,
    specs: Sequence[UtilitySpec],
    weights: Sequence[float],
    demand: np.ndarray,
    prices: np.ndarray | None,
    settings: MarketSettings,
) -> MarketResult:
    """One price discovery of :func:`solve_market` (its docstring) for the given weights."""
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


#: Market solves of :func:`budget_equilibrium` towards the fixed point (the first one included); each later one is
#: warm-started.
BUDGET_ROUNDS = 12
#: The most solves of :func:`budget_equilibrium`: beyond :data:`BUDGET_ROUNDS` it goes on only while a job is below
#: its capped slice (:func:`slice_throughputs`; 12 alone left 4 of 600 generated instances more than 1 % below a
#: capped slice: the additive step ``b_i - spend_i`` takes a solve per few percent where the price level is far too
#: low) or a job whose weight exceeds its budget spends more than ``1 + BUDGET_TOL`` of it (stopping at 12 while
#: slices held left seed 437 of ``tests/budgets_reference.generate`` 1.2 % over a share, at 30 seed 133 2.4 %: the
#: iterate is then not the fixed point, and a raised weight buys more than the budget; they reach it at 18 and 79).
BUDGET_ROUNDS_MOST = 100
#: The tolerance of that test: a job is below its slice when its throughput is under ``1 - SLICE_TOL`` of it.
SLICE_TOL = 5e-3
#: A job is satiated when its throughput is within this fraction of ``max_j a_ij`` (the most it can have); the
#: fixed point is reached when no weight moves by more than this fraction of its budget.
BUDGET_TOL = 2e-3
#: A job underspends when its spend is below ``1 - SPEND_TOL`` of ``b_i`` (T4's tolerance moves a spend by up to
#: ``sqrt(2e-5)``, about 0.45 %: a narrower band made the weights of jobs at the fixed point step back and forth);
#: it overspends above ``1 + BUDGET_TOL`` (a tenant's spend stays within 1 % of its share).
SPEND_TOL = 5e-3
#: The most a job's market weight may exceed its budget (``b'_i <= BUDGET_GROWTH b_i``).
BUDGET_GROWTH = 1e3


def budget_weights(throughput: np.ndarray, demand: np.ndarray, prices: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The market weight ``b'_i`` with which job i's Eisenberg-Gale demand at ``prices`` (004 eq. 5,
    ``max b'_i log(a_i^T x) - sum_j p_j d_ij x_j``, ``1^T x <= 1``) is its budget-constrained demand of budget
    ``b_i`` (docs/budgets.md, T6).

    The budget-constrained demand is the LP ``max a^T x`` s.t. ``c^T x <= b``, ``1^T x <= 1``, ``x >= 0``
    (``c_j = p_j d_ij``; pools with ``a_ij = 0`` excluded): its optimum is a vertex with at most two pools, either
    one pool ``j`` at ``x_j = min(1, b / c_j)`` or two pools ``j, k`` with ``c_j < b < c_k``, ``x_j + x_k = 1``,
    ``c^T x = b``. The EG conditions ``b' a_l / t = c_l + mu`` on the support, ``<=`` off it, ``mu >= 0``
    (``mu > 0`` only when ``1^T x = 1``) then give ``b'``:

    * one pool, time slack (``x_j < 1``): ``mu = 0``, ``b' = b``;
    * two pools: ``b' = t (c_k - c_j) / (a_k - a_j)``;
    * one pool all the time: any ``b'`` in ``[max(c_j, L), U]`` with ``L = max_{a_l < a_j} (c_j - c_l) /
      (1 - a_l / a_j)`` and ``U = min_{a_l > a_j} (c_l - c_j) / (a_l / a_j - 1)``; the one nearest ``b``."""
    n, m = throughput.shape
    usable = throughput > 0
    cost = np.maximum(demand * prices[None, :], 0.0)
    budget = b[:, None]
    # single-pool vertices
    x1 = np.where(cost > 0, np.minimum(1.0, budget / np.where(cost > 0, cost, 1.0)), 1.0)
    v1 = np.where(usable, throughput * x1, -np.inf)
    j1 = v1.argmax(axis=1)
    best1 = v1[np.arange(n), j1]
    # two-pool vertices (j cheaper than the budget, k dearer): value a_j + (a_k - a_j) (b - c_j) / (c_k - c_j)
    cj, ck = cost[:, :, None], cost[:, None, :]
    aj, ak = throughput[:, :, None], throughput[:, None, :]
    pair = usable[:, :, None] & usable[:, None, :] & (cj < budget[:, :, None]) & (ck > budget[:, :, None])
    share = np.where(pair, (budget[:, :, None] - cj) / np.where(pair, ck - cj, 1.0), 0.0)
    v2 = np.where(pair, aj + (ak - aj) * share, -np.inf).reshape(n, m * m)
    q2 = v2.argmax(axis=1)
    best2 = v2[np.arange(n), q2]
    out = b.copy()
    rows = np.arange(n)
    for i in rows[(best2 > best1 * (1 + 1e-12)) & np.isfinite(best2)]:
        j, k = divmod(int(q2[i]), m)
        if throughput[i, k] > throughput[i, j]:
            out[i] = best2[i] * (cost[i, k] - cost[i, j]) / (throughput[i, k] - throughput[i, j])
    for i in rows[~((best2 > best1 * (1 + 1e-12)) & np.isfinite(best2))]:
        j = int(j1[i])
        if x1[i, j] < 1.0 or not usable[i, j]:
            continue  # time slack: b' = b
        a, c = throughput[i], cost[i]
        ratio = a / a[j]
        lower = usable[i] & (ratio < 1)
        upper = usable[i] & (ratio > 1)
        lo = max(float(c[j]), float(np.max((c[j] - c[lower]) / (1 - ratio[lower]), initial=0.0)))
        hi = float(np.min((c[upper] - c[j]) / (ratio[upper] - 1), initial=np.inf))
        out[i] = min(max(float(b[i]), lo), max(hi, lo))
    return out


def slice_throughputs(throughput: np.ndarray, demand: np.ndarray, capacity: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each job's throughput from its budget's proportional slice of every pool under its time cap (docs/budgets.md,
    guarantee 3): ``max {a_i^T y : d_ij y_j <= (b_i / sum b) R_j, 1^T y <= 1, y >= 0}``, a fractional knapsack
    whose optimum fills the pools in decreasing ``a_ij`` (each bound ``y_j <= (b_i / sum b) R_j / d_ij``) until the
    time is spent."""
    part = b / max(float(b.sum()), 1e-300)
    room = part[:, None] * np.asarray(capacity, dtype=np.float64)[None, :]
    bound = np.where((throughput > 0) & (demand > 0), room / np.where(demand > 0, demand, 1.0), 0.0)
    order = np.argsort(-throughput, axis=1, kind="stable")
    a = np.take_along_axis(throughput, order, axis=1)
    y = np.take_along_axis(bound, order, axis=1)
    before = np.cumsum(y, axis=1) - y
    y = np.clip(np.minimum(y, 1.0 - before), 0.0, None)
    return np.einsum("ij,ij->i", np.where(a > 0, a, 0.0), y)


def budget_equilibrium(
    throughput: np.ndarray,
    capacity: np.ndarray,
    specs: Sequence[UtilitySpec],
    weights: Sequence[float],
    demand: np.ndarray,
    prices: np.ndarray | None,
    settings: MarketSettings,
    warm_weights: np.ndarray | None = None,
) -> MarketResult:
    """The Fisher market's equilibrium with budgets when jobs have time caps (docs/budgets.md, T6).

    Job i's budget is ``b_i`` (its log weight). Its demand at prices p is the **budget-constrained** one,
    ``x_i in argmax {a_i^T x : sum_j p_j d_ij x_j <= b_i, 1^T x <= 1, x >= 0}``: the time cap ``1^T x <= 1`` (a
    job runs each replica at most all the time) is a limit of what it can consume, not a good it pays for. The
    Eisenberg-Gale program (T2) with weights ``b`` prices that cap instead: its KKT conditions (004 eq. 5) give
    ``b_i a_ij / t_i = p_j d_ij + mu_i`` on the job's support, with ``mu_i`` the multiplier of the cap, so the job
    spends ``b_i - mu_i`` and the ``mu_i`` it pays for its own time is lost to it (T3). The same conditions with
    weight ``b'_i`` are those of the budget-constrained demand (``1/lambda_i = b'_i / t_i``, ``kappa_i/lambda_i =
    mu_i`` for the LP's multipliers ``lambda_i`` of the budget and ``kappa_i`` of the cap), so the market is 004's
    dual decomposition of (T2) with weights ``b'`` at the fixed point

        b' = b'(p(b')),   p(b') the prices of (T2) with weights b',
        b'_i(p) the weight whose EG demand at p is job i's budget-constrained demand (:func:`budget_weights`)  (T6)

    found by alternating the two (each solve warm-started at the last prices), at most :data:`BUDGET_ROUNDS`
    solves, until no weight moves by more than :data:`BUDGET_TOL` of its budget. Summing the KKT conditions over the
    support, ``spend_i = b'_i - mu_i`` when the cap binds (``b'_i`` when it does not), so (T6) is equivalently

        spend_i(p(b')) = b_i  for every job that is not satiated,  i.e.  b' = b + mu(b')                    (T7)

    (the LP multipliers are then ``lambda_i = t_i / b'_i``, ``kappa_i = lambda_i mu_i``, both >= 0, with the budget
    spent and ``kappa_i > 0`` only at a full cap). One step of the iteration, per job, after the solve with weights
    ``b'``: a job that **underspends** (``spend_i < (1 - SPEND_TOL) b_i``; not one that is satiated, ``t_i >= (1 -
    BUDGET_TOL) max_j a_ij``) moves up to ``max(b'_i(p), b'_i + (b_i - spend_i))``, a job that **overspends**
    (``spend_i > (1 + BUDGET_TOL) b_i`` with ``b'_i > b_i``) down to ``min(b'_i(p), b'_i - (spend_i - b_i))``
    (``b'_i + (b_i - spend_i) = b_i + mu_i``: the map of (T7)), every other job keeps its weight; a job whose step
    reverses its last step's direction moves to the geometric mean of its weight and the step (the fixed point lies
    between); each weight stays within ``[b_i, BUDGET_GROWTH b_i]``. ``b'_i(p)`` is the best response at fixed
    prices, a jump the additive map would take many solves to make; the downward step is the correction of an
    overshoot: where a job is nearly indifferent between two pools ``b'_i(p) = t (c_k - c_j) / (a_k - a_j)`` is
    very large, the prices the other jobs' steps raise then leave it spending more than its budget, and the step
    down to ``b'_i(p)`` (``b_i`` where the cap is then slack) undoes that in one solve (a multiplicative
    ``b'_i b_i / spend_i`` took a solve per few percent, and kept its neighbours below their slices). A job whose
    time cap does not bind has ``b'_i = b_i``: without binding caps this is one solve of (T2), as before. After
    :data:`BUDGET_ROUNDS` solves it stops as soon as every job has at least ``1 - SLICE_TOL`` of its capped slice
    (:func:`slice_throughputs`, guarantee 3 of docs/budgets.md) and no job whose weight exceeds its budget spends
    more than ``1 + BUDGET_TOL`` of it (guarantee 4), and goes on while one does not, to at most
    :data:`BUDGET_ROUNDS_MOST` solves. The tolerance
    ``settings.eps`` (an absolute gap, T4's ``1e-5 sum b``) is the same for every solve, not scaled by ``sum b' /
    sum b``: one job whose weight grew a hundredfold would otherwise loosen every other job's accuracy as much (over
    seeds 0..599 of ``tests/budgets_reference.generate``, jobs whose caps are slack then overspent by up to 3 %);
    each solve stays within the plan's bound on dual evaluations (``settings.max_iter``). The result's
    ``iterations`` and ``seconds`` add up all the solves; its ``primal``, ``dual`` and ``gap`` are those of the last
    solve, and ``weights`` its weights ``b'``.

    Scale: the iteration runs on each job's throughputs over their largest, ``a_i / max_j a_ij``. That changes
    neither (T2)'s allocation (``log(c t) = log c + log t``) nor a budget-constrained demand, but it makes the
    numerical path (the dual decomposition's iterates, the weights' steps) the same whatever scale a tenant writes
    its throughputs in. It matters because the equilibrium of (T6) is not unique where time caps bind: on seed 242
    of ``tests/budgets_reference.generate`` two allocations, tenant 0 holding 0.45 or 0.66 of pool 2's 3 units, are
    both equilibria (each has prices under which every job buys its budget-constrained demand and spends its
    budget: the LP ``tests.budgets_reference.equilibrium_violation`` finds such prices), and the path on
    throughputs x 1.26e-4 ended at the other one (6.9 % of the pool, against guarantee 1's 1 %). The reported
    ``throughputs``, ``primal`` and ``dual`` are in the jobs' own units again (``primal`` and ``dual`` shifted by
    ``sum_i b'_i log max_j a_ij``).

    Warm start: the fixed point is iterated from ``b' = b``, or from ``warm_weights`` (the ``b'`` of the solve that
    gave the warm ``prices``, clipped to ``[b, BUDGET_GROWTH b]``). A plan of an unchanged cluster then starts at the
    last plan's own fixed point: its first solve returns the warm prices, the weights do not move, and the result is
    the last plan's, so the plan after it reuses the solve (``MarketInputs.key``) and an unchanged cluster's prices
    and statuses do not drift from plan to plan (each restart from ``b`` ended elsewhere within
    :data:`BUDGET_TOL`)."""
    b = np.array([s.weight * float(w) for s, w in zip(specs, weights, strict=True)], dtype=np.float64)
    scale = np.where(throughput > 0, throughput, 0.0).max(axis=1)
    scale = np.where(scale > 0, scale, 1.0)
    result = _fixed_point(throughput / scale[:, None], capacity, specs, b, demand, prices, settings, warm_weights)
    assert result.weights is not None
    shift = float(result.weights @ np.log(scale))  # sum_i b'_i log s_i: the objective in the jobs' own units
    return replace(result, throughputs=result.throughputs * scale, primal=result.primal + shift,
                   dual=result.dual + shift)


def _fixed_point(
    throughput: np.ndarray,
    capacity: np.ndarray,
    specs: Sequence[UtilitySpec],
    b: np.ndarray,
    demand: np.ndarray,
    prices: np.ndarray | None,
    settings: MarketSettings,
    warm_weights: np.ndarray | None,
) -> MarketResult:
    """The iteration of :func:`budget_equilibrium` (its docstring) on throughputs ``throughput`` whose rows are
    already normalised to a largest entry of 1, for budgets ``b``."""
    best = np.where(throughput > 0, throughput, 0.0).max(axis=1)
    w = b.copy()
    if warm_weights is not None and prices is not None and np.shape(warm_weights) == b.shape:
        w = np.clip(np.asarray(warm_weights, dtype=np.float64), b, BUDGET_GROWTH * b)
    used = w
    total_iterations, seconds = 0, 0.0
    result = None
    last = np.zeros_like(b)  # the direction of each job's last step (+1 up, -1 down, 0 none)
    slices = slice_throughputs(throughput, demand, capacity, b)
    for solve in range(BUDGET_ROUNDS_MOST):
        used = w
        eps = settings.eps
        result = _one_market(throughput, capacity, [replace(s, weight=float(v)) for s, v in zip(specs, w, strict=True)],
                             [1.0] * len(specs), demand, prices, replace(settings, eps=eps, budgets=False))
        total_iterations += result.iterations
        seconds += result.seconds
        prices = result.prices
        target = budget_weights(throughput, demand, result.prices, b)
        spend = np.einsum("ij,ij->i", demand * result.prices[None, :], result.allocation)
        satiated = _rates(throughput, result.allocation) >= best * (1 - BUDGET_TOL)
        under = ~satiated & (spend < b * (1 - SPEND_TOL))
        over = (spend > b * (1 + BUDGET_TOL)) & (w > b)
        step = w.copy()
        step[under] = np.maximum(target, w + (b - spend))[under]
        step[over] = np.minimum(target, w - (spend - b))[over]
        step = np.clip(step, b, BUDGET_GROWTH * b)
        direction = np.sign(step - w)
        flip = direction * last < 0
        step[flip] = np.sqrt(w[flip] * step[flip])
        last = np.where(direction != 0, direction, last)
        if np.all(np.abs(step - w) <= BUDGET_TOL * b):
            break
        if (solve + 1 >= BUDGET_ROUNDS and not over.any()
                and np.all(_rates(throughput, result.allocation) >= (1 - SLICE_TOL) * slices)):
            break  # the fixed point's rounds are spent, every job has its capped slice (guarantee 3) and none of
            # those whose weight exceeds its budget overspends (guarantee 4)
        w = step
    assert result is not None
    return replace(result, iterations=total_iterations, seconds=seconds, weights=used.copy())


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
