"""The dual oracle of price discovery (004 Sec. 3 and 5): at prices ``p``, every job's subproblem is solved
(:mod:`allocator.pricing.dual.subproblem`), giving the dual value ``g(p) = p^T R + sum_i max_x [u_i - (p * d_i)^T x_i]``
(an upper bound on ``U*``), the subgradient ``q = R - r`` (eq. 9), and the utility of the column-scaled feasible
allocation (a lower bound, Sec. 5). The LP split of tied jobs at an evaluation's prices
(:func:`allocator.pricing.primal.recovery.recover`) may raise that bound; it is stored in the evaluation.

Where the walk runs compiled (CPU arrays, a built-in utility family), it also accumulates the usage per pool and
what the jobs pay in the same pass over the jobs (:func:`allocator.pricing._compiled.kernels.walk`), and the utility
sums are taken by numpy on both array routes (:attr:`DualOracle.compiled_utility`): an evaluation of 10^6 jobs then
makes one pass over them plus numpy's vectorised ``value`` instead of the walk and five array expressions after it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from allocator._xp import Array, as_numpy, device_of, fsum, is_tensor, namespace, numel, pick, scatter_sum
from allocator._xp import torch as _torch
from allocator.pricing.dual.reuse import Reuse
from allocator.pricing.dual.subproblem import Subsolution, compiled_args, solve_hull, solve_pairs
from allocator.pricing.problem import ArrayLike, Problem, prepare, resolve_route
from allocator.utilities import Utility

__all__ = ["DualOracle", "Evaluation", "FeasiblePoint", "dual_evaluation", "usage_weights"]


class FeasiblePoint(Protocol):
    """A feasible allocation found at an evaluation's prices by other means than column scaling (the LP split of
    :func:`allocator.pricing.primal.recovery.recover`): what the driver reads of it."""

    allocation: Array  #: (n, m)
    throughputs: Array  #: (n,)
    usage: np.ndarray  #: (m,) float64
    utility: float  #: exact sum of utilities of ``allocation``


@dataclass
class Evaluation:
    prices: np.ndarray  # float64 (m,)
    dual: float
    primal: float
    usage: np.ndarray  # float64 (m,)
    grad: np.ndarray  # R - r
    scale: np.ndarray  # float64 (m + 1,) column scaling of the feasible allocation (last entry: the "none" pool)
    #: the subproblem solutions (``None`` once released: an evaluation that is neither the best dual nor the best
    #: primal one of its run is never used again, and a 10^6-job float32 subsolution holds 28-44 MB)
    sol: Subsolution | None
    t_feasible: Array | None
    #: set when the LP split of tied jobs (:mod:`allocator.pricing.primal.recovery`) beats column scaling
    recovered: FeasiblePoint | None = None
    #: this process's sums at ``prices``: usage per pool (float64, ``m + 1``, last: "none"), ``sum_i u_i(t_i) -
    #: c_i(t_i)`` and ``sum_i u_i(t_i)`` of the subproblem solutions (what an incremental re-solve updates row by row)
    r_local: np.ndarray | None = None
    net_local: float = math.nan
    u_local: float = math.nan

    def subsolution(self) -> Subsolution:
        """The subproblem solutions of this evaluation (``RuntimeError`` after :meth:`release`)."""
        if self.sol is None:
            raise RuntimeError("the subproblem solutions of this evaluation were released")
        return self.sol

    def feasible_throughputs(self) -> Array:
        """The column-scaled feasible throughputs (``RuntimeError`` after :meth:`release`)."""
        if self.t_feasible is None:
            raise RuntimeError("the feasible throughputs of this evaluation were released")
        return self.t_feasible

    def release(self) -> None:
        """Drop the per-job arrays; bounds, usage and gradient stay."""
        self.sol = None
        self.t_feasible = None
        self.r_local = None


class DualOracle:
    """Evaluates ``g(p)``, its subgradient and the feasible-allocation utility for a (possibly sharded) problem.
    The problem's arrays are numpy arrays or torch tensors (:func:`allocator.pricing.problem.resolve_route`); prices,
    bounds and usage are float64 numpy arrays and Python floats either way."""

    def __init__(self, prob: Problem, method: str = "hull", group: Any = None) -> None:
        self.prob = prob
        self.group = group
        self.method = method
        a = prob.a
        self.n, self.m = a.shape
        self._a_pos: Array | None = None
        self._compiled_utility: Utility | bool | None = False  # not determined yet
        self.cap64 = as_numpy(prob.capacity).astype(np.float64)
        self.evaluations = 0
        #: (the previous solve's state, rows to solve again, the private copy of the throughputs kept for the next
        #: re-solve): set by a solve given ``previous=``; used once, by the first evaluation at exactly the state's
        #: prices; the state is only read
        self.reuse: tuple[Reuse, Array, Array] | None = None
        self.resolved: int | None = None

    @property
    def compiled_utility(self) -> Utility | None:
        """The utility with numpy parameters, for evaluations whose walk runs compiled (CPU arrays or CPU tensors of a
        built-in family): their utility sums are computed by numpy on both array routes, so a torch-route CPU solve
        evaluates exactly what the numpy route does (the same price path, not one that parts in the last bits).
        ``None`` where the walk is not compiled (CUDA, user-defined utilities)."""
        if self._compiled_utility is False:
            prob = self.prob
            util: Utility | None = None
            spec = getattr(prob.utility, "kernel_spec", None)
            if self.method == "hull" and device_of(prob.a) == "cpu" and spec is not None and spec() is not None:
                util = prob.utility
                if is_tensor(prob.a):
                    util = util.to(None, as_numpy(prob.a[:0]).dtype)
            self._compiled_utility = util
        return self._compiled_utility  # type: ignore[return-value]

    def utility_sum(self, t: Array) -> float:
        """``sum_i u_i(t_i)`` in float64: by numpy where the walk is compiled (:attr:`compiled_utility`)."""
        util = self.compiled_utility
        if util is not None:
            return fsum(util.value(as_numpy(t)))
        return fsum(self.prob.utility.value(t))

    @property
    def a_pos(self) -> Array:
        """``a > 0``, computed once when a walk needs it (the compiled walk does not)."""
        if self._a_pos is None:
            self._a_pos = self.prob.a > 0
        return self._a_pos

    def _incremental(self, prices: np.ndarray, c: Array) -> tuple[Subsolution, np.ndarray, float, float] | None:
        """The subproblem solutions and their sums ``(sol, r, net, u)`` at ``prices`` from the previous solve's state,
        when it was evaluated at exactly these prices: only the changed rows are solved again (rows are independent,
        so this is a full solve up to last-bit rounding of vectorised functions), and the sums are updated by the
        changed rows' old and new contributions. ``None`` otherwise (a full evaluation follows)."""
        if self.reuse is None or self.method != "hull" or not np.array_equal(prices, self.reuse[0].prices):
            return None
        state, rows, kept_a = self.reuse
        self.reuse = None
        self.resolved = numel(rows)
        prob = self.prob
        base = state.sol
        sums: tuple[np.ndarray, float, float] | None = None
        if state.r_local is not None and math.isfinite(state.net_local) and math.isfinite(state.u_local):
            sums = (state.r_local.copy(), state.net_local, state.u_local)
        new: Subsolution | None = None
        if numel(rows):
            old = base.rows(rows)
            util = prob.utility.take(rows)
            new = solve_hull(prob.a[rows], c[rows], util)
            if sums is not None:
                r, net, u_sum = sums
                old_d = None if state.demand is None else state.demand[rows]
                new_d = None if prob.demand is None else prob.demand[rows]
                parts = ((-1.0, old, old_d, state.utility.take(rows)), (1.0, new, new_d, util))
                for sign, part, d_rows, part_util in parts:
                    r_part, net_part, u_part = self._part_sums(part, d_rows, part_util)
                    net = net + sign * net_part
                    u_sum = u_sum + sign * u_part
                    r = r + sign * r_part
                sums = (r, net, u_sum) if math.isfinite(net) and math.isfinite(u_sum) else None
        # a new subsolution (the previous solve's state is left as it is): the changed rows patched into copies, end
        # values still to be gathered from the new private throughputs ``kept_a`` and the costs at these same prices
        sol = base.patched(rows, base if new is None else new, kept_a)
        if sums is None:
            sums = self._sums(sol)
        return sol, sums[0], sums[1], sums[2]

    def _part_sums(self, part: Subsolution, demand: Array | None, util: Utility) -> tuple[np.ndarray, float, float]:
        """``(r, net, u)`` of some jobs' solutions ``part`` (their demands and utility), in the arithmetic of a full
        evaluation, so that an incremental re-solve's sums differ from a full evaluation's by summation order only:
        where the walk is compiled, the usage of working-dtype products (as the walk adds them), what the jobs pay
        as float64 products (as the walk sums it) and the utilities by numpy (:attr:`compiled_utility`)."""
        w_lo, w_hi = usage_weights(part, demand, self.m)
        r = as_numpy(scatter_sum(part.j_lo, w_lo, self.m + 1)) + as_numpy(scatter_sum(part.j_hi, w_hi, self.m + 1))
        if self.compiled_utility is None:
            u_t = util.value(part.t)
            return r, fsum(u_t - part.cost()), fsum(u_t)
        if is_tensor(part.t):
            util = util.to(None, as_numpy(part.t[:0]).dtype)
        u_part = fsum(util.value(as_numpy(part.t)))
        wide = [as_numpy(v).astype(np.float64) for v in (part.x_lo, part.c_lo, part.x_hi, part.c_hi)]
        paid = float(np.sum(wide[0] * wide[1] + wide[2] * wide[3]))
        return r, u_part - paid, u_part

    def _walk_sums(self, c: Array) -> tuple[Subsolution, np.ndarray, float, float] | None:
        """The compiled walk with the usage and cost sums in the same pass
        (:func:`allocator.pricing._compiled.kernels.walk`) and the utilities after it: ``(sol, r, net, u)`` as
        :meth:`_sums` gives them, or ``None`` where the compiled walk does not apply."""
        prob = self.prob
        args = compiled_args(prob.a, c, prob.utility)
        if args is None:
            return None
        from allocator.pricing._compiled.kernels import walk

        demand = None if prob.demand is None else as_numpy(prob.demand)
        # With unit demands the costs are one shared row, and the end values are gathered from it and from ``a``
        # when read; with demands the costs are an n x m array that a lazy subsolution would keep alive (more than
        # the two cost columns it replaces), so the walk writes the end values.
        lazy = demand is None
        fields, r, paid = walk(*args, demand, ends=not lazy)
        u_sum = self.utility_sum(fields[0])
        part: list[Array] = [v for v in fields if v is not None]
        if is_tensor(prob.a):
            part = [_torch().from_numpy(v) for v in part]
        if lazy:
            sol = Subsolution(part[0], part[1], part[2], None, None, part[3], part[4], None, None, ends=args[:2])
        else:
            sol = Subsolution(part[0], part[1], part[2], part[3], part[4], part[5], part[6], part[7], part[8])
        return sol, r, u_sum - paid, u_sum

    def _sums(self, sol: Subsolution) -> tuple[np.ndarray, float, float]:
        """``(r, net, u)`` of every job: usage per pool (float64, ``m + 1``), ``sum_i u_i(t_i) - c_i(t_i)`` and
        ``sum_i u_i(t_i)`` (:meth:`_part_sums` of all rows)."""
        return self._part_sums(sol, self.prob.demand, self.prob.utility)

    def _allreduce(self, values: list[float] | np.ndarray) -> np.ndarray:
        """The sums of ``values`` over the ranks of the group (a float64 copy of them without a group)."""
        if self.group is None:
            return np.asarray(values, dtype=np.float64)
        import torch.distributed as dist

        torch = _torch()
        buf = torch.tensor(np.asarray(values, dtype=np.float64), dtype=torch.float64)
        backend = dist.get_backend(self.group)
        dev = self.prob.a.device if backend == "nccl" else torch.device("cpu")
        buf = buf.to(dev)
        dist.all_reduce(buf, group=self.group)
        return buf.cpu().numpy()

    def prices_array(self, prices: np.ndarray) -> Array:
        """``prices`` (float64 numpy) in the problem's library, device and dtype."""
        a = self.prob.a
        if is_tensor(a):
            return _torch().as_tensor(prices).to(device=a.device, dtype=a.dtype)
        return np.asarray(prices, dtype=a.dtype)

    def costs(self, p: Array) -> Array:
        """``c_ij = p_j d_ij`` (unit demands: ``p`` broadcast to ``n x m`` without a copy)."""
        d = self.prob.demand
        if d is None:
            return namespace(p).broadcast_to(p, (self.n, self.m))
        if d.ndim == 1:
            return d[:, None] * p
        return d * p

    def __call__(self, prices: np.ndarray) -> Evaluation:
        prob = self.prob
        self.evaluations += 1
        c = self.costs(self.prices_array(prices))
        inc = self._incremental(np.asarray(prices, dtype=np.float64), c)
        if inc is not None:
            sol, r, net, u_sum = inc
        else:
            fused = self._walk_sums(c) if self.method == "hull" else None
            if fused is not None:
                sol, r, net, u_sum = fused
            else:
                if self.method == "hull":
                    sol = solve_hull(prob.a, c, prob.utility, a_pos=self.a_pos)
                else:
                    sol = solve_pairs(prob.a, c, prob.utility)
                r, net, u_sum = self._sums(sol)
        packed = self._allreduce(np.append(r[: self.m], net))
        usage = packed[: self.m]
        dual = float(np.dot(prices, self.cap64) + packed[self.m])
        over = usage > self.cap64
        scale64 = np.ones(self.m + 1)
        scale64[: self.m][over] = self.cap64[over] / usage[over]
        if over.any():
            t_feas = feasible_throughputs(sol, scale64, prob.a)
            primal_local = self.utility_sum(t_feas)
        else:
            t_feas = sol.t
            primal_local = u_sum
        primal = float(self._allreduce([primal_local])[0])
        if math.isnan(primal):
            primal = -math.inf
        return Evaluation(
            prices=np.asarray(prices, dtype=np.float64),
            dual=dual,
            primal=primal,
            usage=usage,
            grad=self.cap64 - usage,
            scale=scale64,
            sol=sol,
            t_feasible=t_feas,
            r_local=r,
            net_local=float(net),
            u_local=float(u_sum),
        )


def feasible_throughputs(sol: Subsolution, scale64: np.ndarray, a: Array) -> Array:
    """Each job's throughput after column scaling by ``scale64`` (``m + 1``, float64; 004 Sec. 5): ``a_lo x_lo
    s[j_lo] + a_hi x_hi s[j_hi]``, the ends' throughputs read from the problem's ``a`` (one compiled pass on the
    CPU)."""
    if is_tensor(sol.t) and sol.t.device.type != "cpu":
        scale = _torch().as_tensor(scale64, dtype=sol.t.dtype).to(sol.t.device)
        return sol.a_lo * sol.x_lo * scale[sol.j_lo] + sol.a_hi * sol.x_hi * scale[sol.j_hi]
    from allocator.pricing._compiled.kernels import scaled_throughput

    an = np.ascontiguousarray(as_numpy(a))
    out = scaled_throughput(an, as_numpy(sol.j_lo), as_numpy(sol.x_lo), as_numpy(sol.j_hi), as_numpy(sol.x_hi), scale64)
    return _torch().from_numpy(out) if is_tensor(sol.t) else out


def usage_weights(sol: Subsolution, demand: Array | None, m: int) -> tuple[Array, Array]:
    """What each job's two pools carry of its demand: ``x_lo d_lo`` and ``x_hi d_hi`` (``demand``: the jobs' rows)."""
    if demand is None:
        return sol.x_lo, sol.x_hi
    if demand.ndim == 1:
        return sol.x_lo * demand, sol.x_hi * demand
    xp = namespace(demand)
    d_lo = pick(demand, xp.clip(sol.j_lo, None, m - 1))
    d_hi = pick(demand, xp.clip(sol.j_hi, None, m - 1))
    return sol.x_lo * d_lo, sol.x_hi * d_hi


def dual_evaluation(
    throughput: ArrayLike,
    capacity: ArrayLike,
    utility: Utility,
    prices: ArrayLike,
    *,
    demand: ArrayLike | None = None,
    method: str = "hull",
    device: Any = None,
    dtype: Any = None,
    backend: str | None = None,
) -> tuple[float, np.ndarray, float]:
    """Evaluate the dual function once: ``(g(p), usage r, utility of the column-scaled feasible allocation)``
    (route: :func:`allocator.pricing.problem.resolve_route`)."""
    route = resolve_route(device, dtype, backend, (throughput, capacity))
    prob = prepare(throughput, capacity, utility, demand, route)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ev = DualOracle(prob, method=method)(np.asarray(prices, dtype=np.float64))
    return ev.dual, ev.usage, ev.primal
