"""The driver of price discovery (004 Alg. 2): :class:`PriceDiscovery` (configuration, presolve on a job sample,
float64 escalation, incremental re-solves) and the entry points :func:`solve` and :func:`solve_distributed`."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from allocator._xp import (
    Array,
    as_numpy,
    asarray_like,
    astype,
    copy,
    device_of,
    equal,
    flatnonzero,
    index_like,
    is_tensor,
    namespace,
    numel,
    zeros,
)
from allocator._xp import torch as _torch
from allocator.pricing._compiled import kernels
from allocator.pricing.dual.oracle import DualOracle, Evaluation
from allocator.pricing.dual.reuse import Reuse, changed_rows
from allocator.pricing.optim.lbfgs import LBFGSOptions, LBFGSRun
from allocator.pricing.primal.repair import Repair, shed_overuse
from allocator.pricing.problem import (
    ArrayLike,
    Problem,
    Route,
    first_bad,
    prepare,
    resolve_route,
    to_array,
    validate_throughput,
)
from allocator.pricing.result import IterationRecord, PricingResult, Status
from allocator.pricing.threads import intra_op_threads
from allocator.utilities import Utility, initial_prices

__all__ = ["EPS_RELATIVE", "PriceDiscovery", "default_eps", "solve", "solve_distributed", "utility_scale"]

#: The default tolerance on the duality gap is this fraction of the utility scale (:func:`utility_scale`).
EPS_RELATIVE = 1e-3


def utility_scale(utility: Utility, n: int) -> float:
    """``sum_i s_i``: the utilities' scale for the default stopping rule (:func:`default_eps`).

    ``s_i`` is what the utility defines (:meth:`allocator.utilities.UtilityBase.gap_scale`): 1 for log, linear,
    power and alpha-fair utilities, ``w_i t_des_i`` for target-priority; 1 per job for a utility that defines none.
    """
    fn = getattr(utility, "gap_scale", None)
    return float(n) if fn is None else float(fn(n))


def default_eps(utility: Utility, n: int) -> float:
    """The default tolerance on ``g(p) - U(X)`` (Alg. 2 step 2): ``1e-3 sum_i s_i`` (:func:`utility_scale`).

    004 Sec. 5 proposes ``eps = 1e-3 n``: for log utility a gap of ``1e-3`` per job is a 0.1 % error in throughput.
    The same absolute gap is not the same accuracy for every utility. A target-priority utility (eq. 2) is a
    shortfall in throughput units, ``-w_i t_des_i`` at zero throughput: on 004 Sec. 6.2 (``t_des = 0.2``,
    ``w in {1, 2}``) the optimum is about ``-1.3e-3`` per job, so ``1e-3 n`` accepts allocations whose total
    shortfall is 1.6 times the optimal one (measured: 77 % of jobs at their target at n = 10^6 instead of 96 %).
    Scaling the tolerance by each job's utility range ``w_i t_des_i`` keeps the paper's 0.1 % in throughput terms
    for both families; for log (and the other families) it is the paper's ``1e-3 n``.
    """
    return EPS_RELATIVE * (utility_scale(utility, n) if n > 0 else 1.0)


@dataclass
class PriceDiscovery:
    """Configuration of Algorithm 2; :meth:`solve` runs it. :func:`solve` uses the defaults.

    ``method`` selects the subproblem solver (``"hull"``: convex-hull walk; ``"pairs"``: all ``m(m+1)/2`` chords).
    ``memory`` is the L-BFGS memory; ``max_line_search`` the backtracking trials per iteration; ``max_ratio`` is the
    initial trust region: the first trial step changes no positive price by more than that factor; the factor is
    squared after a full step is accepted and square-rooted (down to ``max_ratio``) after backtracking.

    Presolve (cold starts of at least ``presolve_min_jobs`` jobs on one process): the market restricted to a
    deterministic random sample of ``n / 10`` jobs (at least 1000, at most ``presolve_jobs``), with capacities
    scaled by the sample fraction, is solved
    first from eq. (17). Its optimal prices are those of the full market up to ``O(1/sqrt(sample))`` (the dual
    function is a sum over jobs, so the sample's ``g`` is an unbiased estimate of the full ``g`` times the fraction),
    so Alg. 2 on the full market starts from them, with the sample's L-BFGS pairs rescaled as its initial curvature.
    This replaces most full-size dual evaluations by cheap ones (13 -> 2 on 004 Sec. 6.2, n = 1e6); the stopping
    test and the bounds are those of the full market, so the result has the same guarantee.
    """

    eps: float | None = None
    max_iter: int | None = None
    method: Literal["hull", "pairs"] = "hull"
    memory: int = 10
    max_line_search: int = 12
    armijo: float = 1e-4
    max_ratio: float = 1.5
    #: the device (``None`` or ``"auto"``: CUDA when the machine has it, else the CPU), the working dtype and the
    #: array backend (``None``, ``"numpy"`` or ``"torch"``): the route table of
    #: :func:`allocator.pricing.problem.resolve_route`
    device: Any = None
    dtype: Any = None
    backend: Literal["numpy", "torch"] | None = None
    record_history: bool = True
    recover: bool = True
    presolve_min_jobs: int = 5_000
    presolve_jobs: int = 20_000
    #: A float32 run (one process) whose gap stays open and has not shrunk by 1 % over :attr:`LBFGSRun.PRECISION_WINDOW`
    #: evaluations stops and continues in float64 from its best prices, with the evaluations it has left: near the
    #: optimum, float32 dual values differ by less than their rounding noise and the line search stalls.
    escalate: bool = True
    #: torch intra-op threads of a torch-route solve; ``None``: the policy of :mod:`allocator.pricing.threads` (one
    #: on the CPU); the numpy route is single-threaded
    threads: int | None = None
    #: called with each dual evaluation's :class:`IterationRecord` as it happens (progress reports of long solves;
    #: needs ``record_history``); not called by the presolve
    on_evaluation: Callable[[IterationRecord], None] | None = None

    def solve(
        self,
        throughput: ArrayLike,
        capacity: ArrayLike,
        utility: Utility,
        *,
        demand: ArrayLike | None = None,
        prices: ArrayLike | None = None,
        group: Any = None,
        previous: PricingResult | None = None,
    ) -> PricingResult:
        """Run price discovery; with ``group`` (a ``torch.distributed`` group) the rows are this rank's shard.
        ``previous``: see :func:`solve`.

        The route (numpy on the CPU, torch on CUDA, in a ``torch.distributed`` group, for tensor inputs or with
        ``backend="torch"``) is :func:`allocator.pricing.problem.resolve_route`; both run this same code. Torch-route
        CPU solves run on the torch thread count of :mod:`allocator.pricing.threads` (one, or ``threads``; the
        process-wide count is restored on return) and under ``torch.inference_mode()``: no autograd bookkeeping per
        operation (about 10 % of a 10^4-job solve, which is per-op overhead bound); every result is returned as
        numpy, so no inference tensor leaves this method.
        """
        # One-time costs of the process (kernel loading, compilation) are paid before the clock starts.
        startup = 0.0 if kernels.loaded() is not None else kernels.load().seconds
        start = time.perf_counter()
        try:
            numel = int(np.prod(np.shape(throughput)))
        except ValueError:  # ragged input: prepare reports it
            numel = 0
        route = resolve_route(self.device, self.dtype, self.backend, (throughput, capacity), group)
        with intra_op_threads(numel, route.device, self.threads, route.backend), _array_mode(route):
            res = self._solve(throughput, capacity, utility, demand, prices, group, start, previous)
            res.startup_seconds = startup
            left = (200 if self.max_iter is None else int(self.max_iter)) - res.iterations
            if not (res._precision_stall and self.escalate and group is None and left > 0):
                return res
            wide = replace(self, dtype="float64", max_iter=left)
            more = wide._solve(throughput, capacity, utility, demand, res.prices, group, start, None)
            if not more.converged and more.gap >= res.gap:
                res.message += f" (a float64 continuation of {more.iterations} evaluations did not narrow the gap)"
                res.iterations += more.iterations
                return res
            for record in more.history:
                record.iteration += res.iterations
            more.history = res.history + more.history
            more.message += (
                f" (float32 stalled with gap {res.gap:.3g} after {res.iterations} evaluations; continued in float64)"
            )
            more.iterations += res.iterations
            more.resolved_jobs = res.resolved_jobs
            more.presolve_evaluations += res.presolve_evaluations
            more.startup_seconds = startup
            return more

    def _lbfgs_options(self) -> LBFGSOptions:
        """The options of one run of Alg. 2 (:class:`~allocator.pricing.optim.lbfgs.LBFGSRun`) in this
        configuration."""
        return LBFGSOptions(
            memory=self.memory,
            max_line_search=self.max_line_search,
            armijo=self.armijo,
            max_ratio=self.max_ratio,
            record_history=self.record_history,
            recover=self.recover,
            on_evaluation=self.on_evaluation,
        )

    def _solve(
        self,
        throughput: ArrayLike,
        capacity: ArrayLike,
        utility: Utility,
        demand: ArrayLike | None,
        prices: ArrayLike | None,
        group: Any,
        start: float,
        previous: PricingResult | None = None,
    ) -> PricingResult:
        """One run of Alg. 2 of 004 in this configuration's dtype, in named steps: :meth:`_setup` (validation,
        tolerance, warm start, change detection, infeasible jobs, closed pools), :meth:`_oracle` (the dual oracle,
        with the reuse of ``previous``), :meth:`_optimise` (the price iterations), :meth:`_repair` and
        :func:`_outcome` (status), :meth:`_allocation` (the returned allocation) and :meth:`_reuse_state` (what a
        later ``previous=`` reuses). ``previous`` is only read."""
        setup = self._setup(throughput, capacity, utility, demand, prices, group, previous)
        evaluator, a_copy = self._oracle(setup, group)
        run, presolved = self._optimise(setup, evaluator, group)
        best_d, best_e = run.best_dual[1], run.best_primal
        repaired = self._repair(setup, best_e, evaluator, group)
        gap = best_d.dual - best_e.primal
        status, converged, gap, message = _outcome(setup, run, gap, presolved)
        best_p, x, t, usage = self._allocation(setup, run, repaired, throughput, group)
        primal, dual = best_e.primal, best_d.dual
        if status == "infeasible":
            primal, dual, gap = -math.inf, -math.inf, math.inf
        seconds = time.perf_counter() - start
        return PricingResult(
            prices=best_p,
            allocation=as_numpy(x),
            throughputs=as_numpy(t),
            usage=usage,
            utility_value=primal,
            dual_value=dual,
            gap=float(gap),
            eps=setup.eps,
            iterations=run.evaluations,
            converged=converged,
            status=status,
            message=message,
            seconds=seconds,
            device=setup.route.device,
            dtype=setup.route.dtype,
            infeasible_jobs=setup.infeasible.astype(np.int64),
            history=run.history,
            presolve_evaluations=presolved,
            resolved_jobs=evaluator.resolved,
            _precision_stall=run.precision_stall and not converged,
            _reuse=self._reuse_state(setup, run, a_copy, group),
        )

    def _setup(
        self,
        throughput: ArrayLike,
        capacity: ArrayLike,
        utility: Utility,
        demand: ArrayLike | None,
        prices: ArrayLike | None,
        group: Any,
        previous: PricingResult | None,
    ) -> _Setup:
        """The problem Alg. 2 runs on (eq. 4 with the demands of 004 Sec. 7.1): validated inputs on the route of
        :func:`~allocator.pricing.problem.resolve_route`, the rows that changed since ``previous`` (its reuse state
        applies to single-process hull-walk solves only), the stopping tolerance (Alg. 2 step 2, :func:`_tolerance`),
        the warm start (:func:`_warm_start`), the jobs removed as infeasible (:func:`_infeasible_jobs`) and the
        closed pools masked out (:func:`_mask_closed_pools`)."""
        if self.method not in ("hull", "pairs"):
            raise ValueError(f"method must be 'hull' or 'pairs', got {self.method!r}")
        route = resolve_route(self.device, self.dtype, self.backend, (throughput, capacity), group)
        if previous is not None and not isinstance(previous, PricingResult):
            raise ValueError(f"previous must be a PricingResult, got {type(previous).__name__}")
        state = previous._reuse if previous is not None and group is None and self.method == "hull" else None
        prob = prepare(throughput, capacity, utility, demand, route, check_throughput=state is None)
        rows: Array | None = None  # rows to solve again in an incremental re-solve (None: no reuse)
        if state is not None:
            rows = changed_rows(state, prob)
            if rows is not None and not equal(state.capacity > 0, prob.capacity > 0):
                rows = None  # pools opened or closed: the masked problem changed everywhere
            # unchanged rows equal rows validated by the previous solve
            validate_throughput(prob.a, rows)
        n, m = prob.a.shape
        n_total, eps = _tolerance(prob, group, route, self.eps)
        max_iter = 200 if self.max_iter is None else int(self.max_iter)
        if max_iter < 1:
            raise ValueError(f"max_iter must be at least 1, got {self.max_iter!r}")
        p0 = _warm_start(prices, previous, m)
        prob, infeasible, keep, rows = _infeasible_jobs(prob, rows)
        a_raw, closed, prob = _mask_closed_pools(prob)
        return _Setup(
            route=route,
            prob=prob,
            a_raw=a_raw,
            n=n,
            m=m,
            n_total=n_total,
            eps=eps,
            max_iter=max_iter,
            p0=p0,
            infeasible=infeasible,
            keep=keep,
            closed=closed,
            state=state,
            rows=rows,
        )

    def _oracle(self, setup: _Setup, group: Any) -> tuple[DualOracle, Array | None]:
        """The dual oracle of 004 Sec. 3 and 5 for the set-up problem, and the private copy of the throughputs the
        result keeps for a later re-solve when the previous solve's state is reused (``None``: the result copies
        them). With reuse, the first evaluation solves again only the changed rows (the jobs' subproblems are
        independent at fixed prices, Sec. 3); the previous state is only read, its buffers are copied where rows
        change."""
        evaluator = DualOracle(setup.prob, method=self.method, group=group)
        state, rows = setup.state, setup.rows
        if state is None or rows is None or setup.keep is not None:
            return evaluator, None
        a_raw = setup.a_raw
        a_copy = state.a  # never written: shared with the previous state when no row changed
        if numel(rows):
            a_copy = copy(state.a)
            a_copy[rows] = a_raw[rows]
        evaluator.reuse = (state, rows, a_copy)
        return evaluator, a_copy

    def _optimise(self, setup: _Setup, evaluator: DualOracle, group: Any) -> tuple[LBFGSRun, int]:
        """Alg. 2 of 004: from the warm start, else (cold starts of many jobs on one process) from the presolve's
        prices and curvature (:meth:`_presolve`), else from eq. (17) (:meth:`_initial_prices`), the projected L-BFGS
        price iterations until ``g(p) - U(X) <= eps`` (:class:`~allocator.pricing.optim.lbfgs.LBFGSRun`), then the
        last-resort recovery at the best dual prices. Returns the run and the presolve's evaluations."""
        prob = setup.prob
        run = LBFGSRun(self._lbfgs_options(), evaluator, setup.eps, setup.max_iter)
        run.low_precision = self.escalate and setup.route.dtype == "float32" and group is None
        presolved = 0
        if setup.p0 is not None:
            p0 = setup.p0
            run.warm = True
        elif group is None and prob.a.shape[0] >= max(self.presolve_min_jobs, 1):
            p0, run.mem_s, run.mem_y, presolved = self._presolve(prob, setup.eps)
        else:
            p0 = self._initial_prices(prob, group)
        run.optimise(p0)
        run.finish()
        return run, presolved

    @staticmethod
    def _repair(setup: _Setup, best_e: Evaluation, evaluator: DualOracle, group: Any) -> Repair | None:
        """The column-scaled allocation of the best primal evaluation (004 Sec. 5), improved where a pool is over-used
        by the exact per-pool shed of :mod:`allocator.pricing.primal.repair`: the repair when its utility is higher
        (``best_e.primal`` is raised to it), else ``None``."""
        prob = setup.prob
        if group is None and best_e.recovered is None and prob.a.shape[0] > 0:
            repaired = shed_overuse(prob, best_e.subsolution(), best_e.usage, evaluator.cap64)
            if repaired is not None and repaired.utility > best_e.primal:
                best_e.primal = repaired.utility
                return repaired
        return None

    def _allocation(
        self, setup: _Setup, run: LBFGSRun, repaired: Repair | None, throughput: ArrayLike, group: Any
    ) -> tuple[np.ndarray, Array, Array, np.ndarray]:
        """``(prices, x, t, usage)`` of the result: the best dual prices, with the closed pools priced so that no
        job wants them (:meth:`_closed_pool_prices`), and the best feasible allocation: the LP recovery's, else the
        repaired one, else the column-scaled one of 004 Sec. 5; rows of infeasible jobs are zero."""
        prob, closed, keep, m = setup.prob, setup.closed, setup.keep, setup.m
        best_p = run.best_dual[0]
        best_e = run.best_primal
        sol, scale = best_e.subsolution(), best_e.scale
        if closed.any() and not closed.all():
            best_p = self._closed_pool_prices(prob, best_e, best_p, closed, throughput, keep, setup.route, group)
        if best_e.recovered is not None:
            x, t = best_e.recovered.allocation, best_e.recovered.throughputs
            usage = best_e.recovered.usage
        elif repaired is not None:
            x = sol.with_fractions(repaired.x_lo, repaired.x_hi).dense(m)
            t, usage = repaired.throughputs, repaired.usage
        else:
            x = sol.dense(m, scale[:m])
            t = best_e.feasible_throughputs()
            usage = best_e.usage * best_e.scale[:m]
        if keep is not None:
            x_full = zeros((setup.n, m), like=x)
            x_full[keep] = x
            t_full = zeros(setup.n, like=t)
            t_full[keep] = t
            x, t = x_full, t_full
        return best_p, x, t, usage

    def _reuse_state(self, setup: _Setup, run: LBFGSRun, a_copy: Array | None, group: Any) -> Reuse | None:
        """What a later solve given this result as ``previous=`` reuses (single-process hull-walk solves without
        removed jobs): the best dual evaluation's subsolution and sums and a private copy of the evaluated problem,
        built outside the solve's clock."""
        if group is not None or setup.keep is not None or self.method != "hull":
            return None
        prob = setup.prob
        best_d = run.best_dual[1]
        kept_a = copy(setup.a_raw) if a_copy is None else a_copy  # the throughputs the next solve compares with
        kept_sol = best_d.subsolution()
        # it gathers its end values (if it has not yet) from that private copy, not from the caller's array,
        # which may change after this returns
        kept_sol.rebind_ends(kept_a)
        return Reuse(
            a=kept_a,
            demand=None if prob.demand is None else copy(prob.demand),
            utility=prob.utility,
            prices=best_d.prices.copy(),
            sol=kept_sol,
            capacity=copy(prob.capacity),
            r_local=best_d.r_local,
            net_local=best_d.net_local,
            u_local=best_d.u_local,
        )

    @staticmethod
    def _closed_pool_prices(
        prob: Problem,
        ev: Evaluation,
        prices: np.ndarray,
        closed: np.ndarray,
        throughput: ArrayLike,
        keep: Array | None,
        route: Route,
        group: Any,
    ) -> np.ndarray:
        """Prices of the closed pools (capacity 0): the largest marginal value ``u_i'(t_i) a_ij / d_ij`` any job would
        get from the pool at the feasible throughputs, so that no job wants it."""
        a = to_array("throughput", throughput, route)
        xp = namespace(a)
        if keep is not None:
            a = a[keep]
        t_feas = ev.recovered.throughputs if ev.recovered is not None else ev.feasible_throughputs()
        du = prob.utility.derivative(t_feas)
        du = xp.where(xp.isfinite(du), du, 0.0)[:, None]
        d = prob.demand
        per = a if d is None else a / (d[:, None] if d.ndim == 1 else d)
        value = xp.amax(du * per, axis=0) if per.shape[0] else zeros(per.shape[1], like=a)
        if group is not None:
            import torch.distributed as dist

            torch = _torch()
            buf = value.double().to(route.device if dist.get_backend(group) == "nccl" else torch.device("cpu"))
            dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=group)
            value = buf
        out = prices.copy()
        out[closed] = as_numpy(astype(value, "float64"))[closed]
        return out

    #: Evaluations allowed to the presolve; its best prices are used even when its own gap is still open (markets
    #: of exact job copies, whose column-scaled allocation never closes the gap, would otherwise spend 100 here).
    PRESOLVE_MAX_ITER = 40

    def _presolve(self, prob: Problem, eps: float) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray], int]:
        """Prices and L-BFGS pairs from the market of a random sample of jobs (see the class docstring).

        The sample is drawn with replacement by :func:`presolve_sample` (deterministic, the same on both routes);
        capacities and ``eps``
        scale with the sample fraction ``k / n``, and the pairs' ``y = Delta (R - r)`` are rescaled by ``n / k`` to
        the full market's curvature.
        """
        n = prob.a.shape[0]
        k = max(min(n // 10, self.presolve_jobs), min(1_000, n))
        idx = index_like(presolve_sample(n, k), prob.a)
        frac = k / n
        sub = Problem(
            a=prob.a[idx],
            capacity=prob.capacity * frac,
            demand=None if prob.demand is None else prob.demand[idx],
            utility=prob.utility.take(idx),
        )
        options = replace(self._lbfgs_options(), record_history=False, recover=False, on_evaluation=None)
        run = LBFGSRun(options, DualOracle(sub, method=self.method), eps * frac, self.PRESOLVE_MAX_ITER)
        run.cutting_planes = False  # approximate prices and curvature pairs are what the presolve is for
        backend = "torch" if is_tensor(sub.a) else "numpy"
        with intra_op_threads(sub.a.shape[0] * sub.a.shape[1], device_of(sub.a), self.threads, backend):
            run.optimise(self._initial_prices(sub, None))
        p = run.best_dual[0]
        if not np.all(np.isfinite(p)):
            return self._initial_prices(prob, None), [], [], run.evaluations
        return p.copy(), list(run.mem_s), [y / frac for y in run.mem_y], run.evaluations

    @staticmethod
    def _initial_prices(prob: Problem, group: Any) -> np.ndarray:
        """Eq. (17); under sharding the per-rank sums are all-reduced first."""
        if group is None:
            # in float64, and by numpy wherever the arrays are on the CPU: sums in another order (numpy's against
            # torch's) would start the two routes' runs from prices a few ulps apart, which a float32 run amplifies
            if device_of(prob.a) == "cpu":
                util = prob.utility.to(None, np.float64)
                d = None if prob.demand is None else as_numpy(prob.demand).astype(np.float64)
                a64, cap64 = as_numpy(prob.a).astype(np.float64), as_numpy(prob.capacity).astype(np.float64)
                return as_numpy(initial_prices(util, a64, cap64, d))
            util = prob.utility.to(device_of(prob.a), _torch().float64)
            d = None if prob.demand is None else astype(prob.demand, "float64")
            p0 = initial_prices(util, astype(prob.a, "float64"), astype(prob.capacity, "float64"), d)
            return as_numpy(p0)
        import torch.distributed as dist

        torch = _torch()
        # p_j = (1/R_j) sum_i u'(t_i) a_ij x_ij with x_ij = R_j / D_j: all-reduce D_j, then the sums.
        n, m = prob.a.shape
        d = prob.demand
        total = (
            torch.full((m,), float(n), dtype=torch.float64)
            if d is None
            else (d.double().sum().expand(m).clone() if d.ndim == 1 else d.double().sum(0)).cpu()
        )
        backend = dist.get_backend(group)
        dev = prob.a.device if backend == "nccl" else torch.device("cpu")
        total = total.to(dev)
        dist.all_reduce(total, group=group)
        cap = prob.capacity.double().to(dev)
        share = torch.where(total > 0, cap / total.clamp_min(1e-30), torch.zeros_like(cap))
        x = share.to(prob.a.device, prob.a.dtype).expand(n, m)
        scale = 1.0 / x.sum(1).clamp_min(1.0)
        t = (prob.a * x).sum(1) * scale
        du = prob.utility.derivative(t)
        du = torch.where(torch.isfinite(du), du, torch.zeros_like(du))
        s = ((du * scale).unsqueeze(1) * prob.a * x).sum(0).double().to(dev)
        dist.all_reduce(s, group=group)
        p = torch.where(cap > 0, s / cap.clamp_min(1e-30), torch.zeros_like(s))
        if bool((cap <= 0).any()) and bool((cap > 0).any()):
            p = torch.where(cap > 0, p, p[cap > 0].max())
        return p.clamp_min(0).cpu().numpy()


def presolve_sample(n: int, k: int) -> np.ndarray:
    """``k`` job indices in ``[0, n)`` drawn with replacement for the presolve: the 32-bit outputs of the Mersenne
    Twister seeded with 0, modulo ``n`` (``n < 2^32``). These are the draws of ``torch.randint(n, (k,))`` on a CPU
    generator seeded with 0, the sampler of the torch-only implementation: both routes, and the releases before the
    numpy route, solve the same sample (which job sample is drawn changes the full-size evaluations a presolve leaves,
    2 to 3 on 004 Sec. 6.2 at 10^6 jobs)."""
    raw = np.random.RandomState(0).randint(0, 2**32, size=k, dtype=np.uint32)
    return raw.astype(np.int64) % n


# ----------------------------------------------------------------------------------------------------------------
# The steps of one run (:meth:`PriceDiscovery._solve`)


@dataclass(frozen=True)
class _Setup:
    """The problem one run of Alg. 2 solves (:meth:`PriceDiscovery._setup`): ``prob`` is the evaluated problem (the
    infeasible jobs removed, the closed pools' throughputs masked to 0), ``a_raw`` its throughputs before masking;
    ``n`` and ``m`` the jobs of this process and the pools as given, ``n_total`` the jobs of all processes; ``eps``
    and ``max_iter`` the stopping rule; ``p0`` the warm start (``None``: cold); ``infeasible`` the removed jobs'
    indices and ``keep`` the kept ones' (``None``: all kept); ``closed`` the pools of capacity 0; ``state`` and
    ``rows`` the previous solve's reuse state and the rows to solve again (``None``: no reuse)."""

    route: Route
    prob: Problem
    a_raw: Array
    n: int
    m: int
    n_total: int
    eps: float
    max_iter: int
    p0: np.ndarray | None
    infeasible: np.ndarray
    keep: Array | None
    closed: np.ndarray
    state: Reuse | None
    rows: Array | None


def _tolerance(prob: Problem, group: Any, route: Route, eps: float | None) -> tuple[int, float]:
    """``(n_total, eps)``: the jobs of all processes and the tolerance of the stopping rule ``g(p) - U(X) <= eps``
    (Alg. 2 step 2; default :func:`default_eps`, ``1e-3 sum_i s_i`` over the jobs of every rank)."""
    n = prob.a.shape[0]
    n_total = n
    u_scale = utility_scale(prob.utility, n)
    if group is not None:
        import torch.distributed as dist

        torch = _torch()
        buf = torch.tensor([float(n), u_scale], dtype=torch.float64)
        if dist.get_backend(group) == "nccl":
            buf = buf.to(route.device)
        dist.all_reduce(buf, group=group)
        n_total, u_scale = int(buf[0].item()), float(buf[1].item())
    tol = EPS_RELATIVE * (u_scale if n_total > 0 else 1.0) if eps is None else float(eps)
    if not (tol > 0 and math.isfinite(tol)):
        raise ValueError(f"eps must be positive and finite, got {eps!r}")
    return n_total, tol


def _warm_start(prices: ArrayLike | None, previous: PricingResult | None, m: int) -> np.ndarray | None:
    """The initial prices of a warm start (float64 copies; Alg. 2 step 1 from given prices instead of eq. 17):
    ``prices`` when given, else those of the previous solve's evaluation that its reuse state holds (the returned
    prices, except that closed pools may have been re-priced after the run), else ``None``."""
    p0: np.ndarray | None = None
    if prices is not None:
        given = as_numpy(prices) if is_tensor(prices) else prices
        p0t = to_array("prices", given, Route("numpy", "cpu", "float64"))
        if p0t.shape != (m,):
            raise ValueError(f"prices has shape {tuple(p0t.shape)}: expected ({m},)")
        first_bad("prices", ~np.isfinite(p0t) | (p0t < 0), p0t, "finite and non-negative")
        p0 = p0t.copy()
    if previous is not None:
        if previous.prices.shape != (m,):
            raise ValueError(f"previous was solved with {previous.prices.shape[0]} pools, this problem has {m}")
        if p0 is None:
            kept = previous._reuse
            p0 = (kept.prices if kept is not None else previous.prices).astype(np.float64).copy()
    return p0


def _infeasible_rows(prob: Problem, idx: Array | None) -> Array:
    """Which of the jobs ``idx`` (all with ``None``) make eq. (4) infeasible: utility ``-inf`` at zero throughput
    (log utility, eq. 1) and no open pool with positive throughput."""
    xp = namespace(prob.a)
    open_pools = prob.capacity > 0
    all_open = bool(open_pools.all())
    a_rows = prob.a if idx is None else prob.a[idx]
    util = prob.utility if idx is None else prob.utility.take(idx)
    k = a_rows.shape[0]
    if util.n_jobs is None and k > 1:
        # every parameter is shared (the protocol's ``n_jobs is None``): one value at zero for all jobs
        doomed = xp.broadcast_to(xp.isneginf(util.value(zeros(1, like=a_rows))), (k,))
    else:
        doomed = xp.isneginf(util.value(zeros(k, like=a_rows)))
    if not bool(doomed.any()):
        return doomed
    # throughputs are validated non-negative, so "some open pool with a_ij > 0" is "row max over the open
    # pools > 0": one reduction instead of two n x m boolean temporaries
    reach = a_rows if all_open else a_rows[:, open_pools]
    if not reach.shape[1]:
        served = xp.zeros_like(doomed)
    elif is_tensor(reach):
        served = xp.amax(reach, axis=1) > 0
    else:
        # numpy reduces a short last axis row by row (67 ms at 10^6 x 4); the compiled one-pass comparison
        # with zero (non-negative rows differ from zero exactly where some entry is positive) takes 6 ms
        reach = np.ascontiguousarray(reach)
        served = kernels.rows_differ(reach, np.zeros(reach.shape, dtype=reach.dtype))
    return doomed & ~served


def _infeasible_jobs(
    prob: Problem, rows: Array | None
) -> tuple[Problem, np.ndarray, Array | None, Array | None]:
    """``(prob, infeasible, keep, rows)``: the problem without the jobs that make it infeasible
    (:func:`_infeasible_rows`; they get nothing, and the prices are optimal for the others), their indices, the
    kept jobs' indices (``None``: all kept) and the rows to solve again (``None`` once jobs are removed). In an
    incremental re-solve only the changed rows can be infeasible (the previous solve had none, with the same open
    pools), so only they are checked first."""
    bad_rows: Array | None = None
    if rows is None or bool(_infeasible_rows(prob, rows).any()):
        bad_rows = _infeasible_rows(prob, None)
        rows = None if bool(bad_rows.any()) else rows
    infeasible = np.zeros(0, dtype=np.int64) if bad_rows is None else np.flatnonzero(as_numpy(bad_rows))
    if not infeasible.size:
        return prob, infeasible, None, rows
    assert bad_rows is not None
    keep = flatnonzero(~bad_rows)
    kept = Problem(
        a=prob.a[keep],
        capacity=prob.capacity,
        demand=None if prob.demand is None else prob.demand[keep],
        utility=prob.utility.take(keep),
    )
    return kept, infeasible, keep, rows


def _mask_closed_pools(prob: Problem) -> tuple[Array, np.ndarray, Problem]:
    """``(a_raw, closed, prob)``: degenerate pools with zero capacity may be used by nobody, so the problem is solved
    with their throughputs masked to 0 (``a_raw``: the throughputs before masking; ``closed``: those pools); each is
    priced afterwards at the largest marginal value any job would get from it (:meth:`PriceDiscovery.
    _closed_pool_prices`), so that no job wants it."""
    a_raw = prob.a
    closed = as_numpy(prob.capacity <= 0)
    if closed.any() and not closed.all():
        mask = asarray_like(~closed, prob.a)
        prob = Problem(a=prob.a * mask, capacity=prob.capacity, demand=prob.demand, utility=prob.utility)
    return a_raw, closed, prob


def _outcome(setup: _Setup, run: LBFGSRun, gap: float, presolved: int) -> tuple[Status, bool, float, str]:
    """``(status, converged, gap, message)`` of a run whose best bounds are ``gap`` apart: converged when ``gap <=
    eps`` (Alg. 2 step 2), "empty" without jobs, "infeasible" with removed jobs, else "max_iter" or "stalled"."""
    eps, infeasible = setup.eps, setup.infeasible
    converged = bool(gap <= eps)
    if setup.n_total == 0:
        return "empty", True, 0.0, "no jobs"
    if infeasible.size:
        message = (
            f"{infeasible.size} job(s) have utility -inf at zero throughput and no pool with positive throughput "
            f"and capacity (first: job {int(infeasible[0])}); they get nothing, the rest is solved"
        )
        return "infeasible", False, gap, message
    if converged:
        message = f"duality gap {gap:.3g} <= eps {eps:.3g} after {run.evaluations} evaluations"
        if presolved:
            message += f" (after {presolved} on a job sample)"
        return "optimal", True, gap, message
    status: Status = "max_iter" if run.evaluations >= setup.max_iter else "stalled"
    message = f"stopped after {run.evaluations} evaluations with duality gap {gap:.3g} > eps {eps:.3g}"
    if run.model_stall:
        message += " (the cutting-plane model of g is minimised at the prices: no price step is left)"
    return status, False, gap, message

@contextlib.contextmanager
def _array_mode(route: Route) -> Iterator[None]:
    """The numerical mode of a solve: numpy's floating-point warnings off (``log 0``, ``w / 0`` and ``inf - inf`` are
    part of the method: eqs. 1, 15), and on the torch route ``torch.inference_mode()`` (no autograd bookkeeping)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if route.backend == "torch":
            with _torch().inference_mode():
                yield
        else:
            yield


# ----------------------------------------------------------------------------------------------------------------
# Public entry points


def solve(
    throughput: ArrayLike,
    capacity: ArrayLike,
    utility: Utility,
    *,
    demand: ArrayLike | None = None,
    eps: float | None = None,
    prices: ArrayLike | None = None,
    max_iter: int | None = None,
    device: Any = None,
    dtype: Any = None,
    previous: PricingResult | None = None,
    backend: Literal["numpy", "torch"] | None = None,
) -> PricingResult:
    """Discover optimal pool prices and a near-optimal allocation (Alg. 2 of 004 with the demands of its Sec. 7.1).

    Args:
        throughput: ``(n, m)`` throughputs ``a_ij >= 0`` (numpy array or torch tensor; a tensor selects the torch
            route).
        capacity: ``(m,)`` capacities ``R_j >= 0``.
        utility: a :class:`allocator.utilities.Utility` for the ``n`` jobs (e.g. ``utilities.Log()``).
        demand: ``None`` (1), a scalar, ``(n,)`` per-job or ``(n, m)`` per-job-and-pool demands ``d > 0``.
        eps: stop when ``g(p) - U(X) <= eps``; default :func:`default_eps` (``1e-3 n``, ``1e-3 sum_i w_i t_des_i``
            for target-priority utilities).
        prices: ``(m,)`` initial prices (warm start); default eq. (17).
        max_iter: limit on dual evaluations (default 200).
        device: ``None``/``"auto"`` (default): the input tensor's device, else CUDA when the machine has it
            (decided without importing torch where there is no NVIDIA driver), else the CPU; or a device name
            (``"cpu"``, ``"cuda"``, ``"cuda:1"``) or a ``torch.device``.
        dtype: float32 (default) or float64. A float32 run whose gap stays open (float32 noise near the optimum
            stalls the line search) continues in float64 from its best prices (``PriceDiscovery.escalate``); the
            result then says so in ``message`` and has ``dtype == "float64"``.
        previous: the result of an earlier solve of a similar problem (same jobs and pools, some rows changed):
            an incremental re-solve. The run starts from its prices (unless ``prices`` is given), and the first
            evaluation solves again only the subproblems of jobs whose throughputs, demands or utility parameters
            changed, reusing the other jobs' solutions at those prices (rows are independent, so this is the
            solve with ``prices=previous.prices``, up to the last-bit rounding of vectorised elementwise functions
            such as ``pow``, which can differ between a long and a short batch). Throughputs and demands are
            compared with private copies kept by ``previous``; a change of shape, dtype, device, utility family or
            shared utility parameter falls back to a full evaluation. ``resolved_jobs`` says how many were solved.
            ``previous`` is only read: the new result keeps its own state (copies of the previous buffers with the
            changed rows patched), so a result can seed any number of incremental re-solves.
        backend: ``None`` (the route table of :func:`allocator.pricing.problem.resolve_route`: numpy on the CPU,
            torch on CUDA, for tensor inputs and in distributed runs), ``"numpy"`` or ``"torch"`` (forced; the torch
            route also runs on the CPU). Both routes run the same code and return the same result up to rounding.

    Returns:
        A :class:`PricingResult`. Raises ``ValueError`` on malformed input, naming the job/pool index and field.
    """
    cfg = PriceDiscovery(eps=eps, max_iter=max_iter, device=device, dtype=dtype, backend=backend)
    return cfg.solve(throughput, capacity, utility, demand=demand, prices=prices, previous=previous)


def solve_distributed(
    throughput: ArrayLike,
    capacity: ArrayLike,
    utility: Utility,
    *,
    group: Any = None,
    demand: ArrayLike | None = None,
    eps: float | None = None,
    prices: ArrayLike | None = None,
    max_iter: int | None = None,
    device: Any = None,
    dtype: Any = None,
) -> PricingResult:
    """Price discovery with jobs sharded over the processes of a ``torch.distributed`` group.

    Every rank passes its own rows (``throughput``, ``utility``, ``demand``) and the same ``capacity``; usage, dual
    and primal sums are all-reduced each evaluation (gloo on CPU, nccl on GPUs), so all ranks follow the same price
    path and return the same prices, bounds and (total) ``usage``. The allocation and throughputs returned on each
    rank cover that rank's rows.
    ``group=None`` uses the default (world) group, which must be initialised.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("solve_distributed needs an initialised torch.distributed process group")
    grp = group if group is not None else dist.group.WORLD
    cfg = PriceDiscovery(eps=eps, max_iter=max_iter, device=device, dtype=dtype, backend="torch")
    return cfg.solve(throughput, capacity, utility, demand=demand, prices=prices, group=grp)
