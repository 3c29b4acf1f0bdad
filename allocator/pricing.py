"""Price discovery for fungible resources across node pools (paper 004, Sec. 3-5, Alg. 2, vector demands of Sec. 7.1).

The problem (eq. 4 with demands)::

    maximise    sum_i u_i(a_i^T x_i)
    subject to  x_i >= 0,  1^T x_i <= 1,           i = 1..n
                sum_i d_i * x_i <= R                (elementwise; d_i a scalar or an m-vector)

``a_ij`` is job ``i``'s throughput on pool ``j``, ``R_j`` the pool's capacity, ``x_ij`` the fraction of time job
``i`` runs on pool ``j`` and ``u_i`` a concave nondecreasing utility (:mod:`allocator.utilities`).

Method (Alg. 2): the dual function ``g(p) = p^T R + sum_i max_{x_i} [u_i(a_i^T x_i) - (p * d_i)^T x_i]`` (Sec. 3)
splits into one small problem per job, solved analytically and vectorised over all jobs
(:mod:`allocator._pricing_kernel`, Sec. 4 / Alg. 1). ``q = R - r`` is a subgradient (eq. 9). Prices are updated by
a projected L-BFGS on ``p >= 0`` (memory 10, Armijo backtracking along the projected path, preconditioned by the
unit-elasticity scaling ``diag(p / R)``), falling back to projected subgradient steps when the line search fails
(Sec. 5). Every evaluation also yields a feasible allocation, by scaling down the columns of over-used pools
(Sec. 5), whose utility is a lower bound; the method stops when ``g(p) - U(X_feasible) <= eps``
(default ``eps = 1e-3 n``). Initial prices are eq. (17) (:func:`allocator.utilities.initial_prices`), or the given
``prices`` (warm start); cold starts of at least 5000 jobs first solve a seeded random sample of the jobs from eq. (17)
and start from its prices and L-BFGS curvature (:class:`PriceDiscovery`, "presolve"), which leaves two to four
full-size evaluations on 004 Sec. 6.2 instead of 13. CPU problems under :data:`SINGLE_THREAD_BELOW` entries run on
one torch thread.

Scale-out: the dual function is a sum over jobs, so :func:`solve_distributed` shards jobs over the processes of a
``torch.distributed`` group and all-reduces resource usage, dual and primal sums every evaluation; the price update
is replicated identically on every rank.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from allocator._pricing_kernel import Subsolution, solve_hull, solve_pairs
from allocator._pricing_recovery import MAX_SCAN, Recovery, recover_allocation, split_jobs
from allocator.utilities import Utility, UtilityBase, initial_prices

__all__ = [
    "IterationRecord",
    "PriceDiscovery",
    "PricingResult",
    "dual_evaluation",
    "resolve_device",
    "resolve_dtype",
    "solve",
    "solve_distributed",
]

ArrayLike = Any
Status = Literal["optimal", "max_iter", "infeasible", "empty"]


@dataclass
class IterationRecord:
    """One evaluation of the dual function (one entry of the optional history)."""

    iteration: int
    prices: np.ndarray
    usage: np.ndarray  #: resource usage ``r`` of the subproblem solutions (may exceed capacity)
    dual_value: float  #: ``g(p)``, an upper bound on the optimum
    primal_value: float  #: utility of the column-scaled feasible allocation, a lower bound
    gap: float  #: best upper bound minus best lower bound so far
    kind: str  #: "init", "lbfgs", "subgradient"


@dataclass
class _Reuse:
    """What a later solve needs to reuse this solve's per-job subproblem solutions (``previous=`` of :func:`solve`):
    the evaluated problem (a private copy of the throughputs, after closed pools were masked), the utility it was
    solved with, and the subsolution at ``prices`` (the best dual prices, where a warm start begins)."""

    a: Tensor
    demand: Tensor | None
    utility: Utility
    prices: np.ndarray
    sol: Subsolution
    capacity: Tensor
    r_local: Tensor | None  #: the sums of the evaluation at ``prices`` (see :class:`_Evaluation`)
    net_local: float
    u_local: float


@dataclass
class PricingResult:
    """Outcome of price discovery.

    ``utility_value`` (a lower bound on the optimum ``U*``, the utility of ``allocation``) and ``dual_value`` (an upper
    bound, ``g(prices)``) bracket ``U*``; ``gap = dual_value - utility_value``. ``converged`` is true when
    ``gap <= eps``. ``status`` is ``"optimal"`` (converged), ``"max_iter"`` (stopped by the iteration limit; the bounds
    still hold), ``"infeasible"`` (some job has utility ``-inf`` at zero throughput, e.g. log utility, and no pool
    with positive throughput and capacity: ``infeasible_jobs`` lists them, they get nothing, and the prices and
    allocation are optimal for the other jobs) or ``"empty"`` (no jobs).
    """

    prices: np.ndarray  #: (m,) optimal prices (the price vector with the smallest dual value seen)
    allocation: np.ndarray  #: (n, m) feasible allocation X: time fractions, rows sum to <= 1, usage <= capacity
    throughputs: np.ndarray  #: (n,) t_i = a_i^T x_i of ``allocation``
    usage: np.ndarray  #: (m,) sum_i d_i * x_i of ``allocation``
    utility_value: float  #: U(X), lower bound
    dual_value: float  #: g(prices), upper bound
    gap: float
    eps: float
    iterations: int  #: dual-function evaluations, line-search trials included
    converged: bool
    status: Status
    message: str
    seconds: float
    device: str
    dtype: str
    infeasible_jobs: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    history: list[IterationRecord] = field(default_factory=list)
    #: dual evaluations of the presolve on a job sample (cheaper, not counted in ``iterations``; 0 without presolve)
    presolve_evaluations: int = 0
    #: jobs whose subproblem was solved again at the first evaluation of a solve given ``previous=`` (the others
    #: reused the previous solve's solutions); ``None`` when nothing was reused
    resolved_jobs: int | None = None
    _reuse: _Reuse | None = field(default=None, repr=False, compare=False)
    _precision_stall: bool = field(default=False, repr=False, compare=False)

    @property
    def X(self) -> np.ndarray:
        return self.allocation

    @property
    def n_jobs(self) -> int:
        return int(self.allocation.shape[0])

    @property
    def n_resources(self) -> int:
        return int(self.prices.shape[0])

    def summary(self) -> dict[str, Any]:
        """A JSON-serialisable digest (what ``walras solve --json`` prints, minus the problem description)."""
        return {
            "prices": [float(v) for v in self.prices],
            "utility_value": _finite_or_str(self.utility_value),
            "dual_value": _finite_or_str(self.dual_value),
            "gap": _finite_or_str(self.gap),
            "iterations": self.iterations,
            "converged": self.converged,
            "status": self.status,
            "seconds": self.seconds,
            "device": self.device,
        }


def _finite_or_str(v: float) -> float | str:
    return float(v) if math.isfinite(v) else str(v)


# ----------------------------------------------------------------------------------------------------------------
# Input handling

#: Problems with fewer throughput entries than this run single-threaded on the CPU: their element-wise ops take tens
#: of microseconds, less than waking torch's intra-op thread pool costs (and far less on a loaded machine).
SINGLE_THREAD_BELOW = 1 << 17


@contextmanager
def _intra_op_threads(numel: int, device: torch.device) -> Iterator[None]:
    """Use one intra-op thread for small CPU problems (``numel < SINGLE_THREAD_BELOW``); restore the count after."""
    before = torch.get_num_threads()
    single = device.type == "cpu" and numel < SINGLE_THREAD_BELOW and before > 1
    if single:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if single:
            torch.set_num_threads(before)


def resolve_device(device: torch.device | str | None, *inputs: Any) -> torch.device:
    """``device=None``: the device of a torch tensor input, else CUDA when available, else CPU."""
    if device is not None:
        return torch.device(device)
    for x in inputs:
        if isinstance(x, Tensor):
            return x.device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_dtype(dtype: torch.dtype | str | np.dtype | type | None) -> torch.dtype:
    """``None`` -> float32; accepts torch dtypes, numpy dtypes and the names float32/float64."""
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        out = dtype
    else:
        name = np.dtype(dtype).name
        out = {"float32": torch.float32, "float64": torch.float64}.get(name)  # type: ignore[assignment]
        if out is None:
            raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    if out not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    return out


def _to_tensor(name: str, x: ArrayLike, device: torch.device, dtype: torch.dtype) -> Tensor:
    if isinstance(x, Tensor):
        t = x.detach()
    else:
        arr = np.asarray(x)
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
            raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
        t = torch.from_numpy(np.ascontiguousarray(arr))
    return t.to(device=device, dtype=dtype)


def _first_bad(name: str, bad: Tensor, values: Tensor, rule: str) -> None:
    if bool(bad.any()):
        idx = tuple(int(v) for v in torch.nonzero(bad)[0])
        val = float(values[idx])
        where = f"{name}[{', '.join(map(str, idx))}]"
        if name in ("throughput", "demand") and len(idx) >= 1:
            who = f"job {idx[0]}" + (f", pool {idx[1]}" if len(idx) == 2 else "")
        elif name in ("capacity", "prices"):
            who = f"pool {idx[0]}"
        else:
            who = ""
        raise ValueError(f"{where} = {val!r} ({who}): {name} must be {rule}")


@dataclass
class _Problem:
    a: Tensor  # (n, m)
    capacity: Tensor  # (m,)
    demand: Tensor | None  # None, (n,) or (n, m)
    utility: Utility


def _prepare(
    throughput: ArrayLike,
    capacity: ArrayLike,
    utility: Utility,
    demand: ArrayLike | None,
    device: torch.device,
    dtype: torch.dtype,
    check_throughput: bool = True,
) -> _Problem:
    """Validate and convert the inputs (``check_throughput=False``: the caller validates the throughputs)."""
    a = _to_tensor("throughput", throughput, device, dtype)
    if a.ndim != 2:
        raise ValueError(f"throughput must be a 2-d array (jobs x pools), got shape {tuple(a.shape)}")
    n, m = a.shape
    if m == 0:
        raise ValueError("throughput has no columns: there must be at least one pool")
    if check_throughput:
        _check_throughput(a)
    cap = _to_tensor("capacity", capacity, device, dtype)
    if cap.ndim != 1 or cap.shape[0] != m:
        raise ValueError(f"capacity has shape {tuple(cap.shape)} but throughput has {m} pools: expected ({m},)")
    _first_bad("capacity", ~torch.isfinite(cap) | (cap < 0), cap, "finite and non-negative")
    d: Tensor | None = None
    if demand is not None:
        d = _to_tensor("demand", demand, device, dtype)
        if d.ndim == 0:
            d = d.expand(n)
        if d.shape not in ((n,), (n, m)):
            raise ValueError(f"demand has shape {tuple(d.shape)}: expected a scalar, ({n},) or ({n}, {m})")
        _first_bad("demand", ~torch.isfinite(d) | (d <= 0), d, "finite and positive")
        if d.ndim == 1 and bool((d == 1).all()):
            d = None
    if not isinstance(utility, Utility):
        raise ValueError(f"utility must implement allocator.utilities.Utility, got {type(utility).__name__}")
    nu = utility.n_jobs
    if nu is not None and nu != n:
        raise ValueError(f"utility has parameters for {nu} jobs but throughput has {n} rows (jobs)")
    return _Problem(a=a, capacity=cap, demand=d, utility=utility.to(device=device, dtype=dtype))


def _check_throughput(a: Tensor, rows: Tensor | None = None) -> None:
    """``ValueError`` naming the first NaN, infinite or negative throughput (only ``rows`` are scanned when given:
    the others are known to be valid; the message then still names the first bad entry of the whole matrix)."""
    sub = a if rows is None else a.index_select(0, rows)
    if bool((~torch.isfinite(sub) | (sub < 0)).any()):
        _first_bad("throughput", ~torch.isfinite(a) | (a < 0), a, "finite and non-negative")


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, Tensor) or isinstance(y, Tensor):
        return isinstance(x, Tensor) and isinstance(y, Tensor) and x.shape == y.shape and bool(torch.equal(x, y))
    return bool(x == y)


def _changed_rows(state: _Reuse, prob: _Problem) -> Tensor | None:
    """Rows of ``prob`` whose subproblem may differ from the one ``state`` solved (throughputs, demands or utility
    parameters changed), or ``None`` when nothing can be reused (other shapes, dtype or device, another utility
    family or a changed shared parameter; utilities outside :class:`allocator.utilities.UtilityBase`)."""
    a, old = prob.a, state.a
    if a.shape != old.shape or a.dtype != old.dtype or a.device != old.device:
        return None
    if a.device.type == "cpu":
        from allocator._pricing_numba import rows_differ

        changed = torch.from_numpy(rows_differ(a.contiguous().numpy(), old.contiguous().numpy()))
    else:
        changed = (a != old).any(dim=1)
    d, od = prob.demand, state.demand
    if d is not None or od is not None:
        one = torch.ones((), dtype=a.dtype, device=a.device)  # ``None`` means a demand of 1 for every job
        d_, od_ = (one if d is None else d), (one if od is None else od)
        if d is not None and od is not None and d.shape != od.shape:
            return None
        diff = d_ != od_
        changed |= diff if diff.ndim == 1 else diff.any(dim=1)
    u, ou = prob.utility, state.utility
    if type(u) is not type(ou) or not isinstance(u, UtilityBase):
        return None
    mine, theirs = vars(u), vars(ou)
    if mine.keys() != theirs.keys():
        return None
    for name, value in mine.items():
        other = theirs[name]
        if name in u._params and isinstance(value, Tensor) and isinstance(other, Tensor) and value.ndim == 1:
            if other.shape != value.shape:
                return None
            changed |= value != other
        elif not _same(value, other):
            return None
    return torch.nonzero(changed).squeeze(1)


# ----------------------------------------------------------------------------------------------------------------
# Dual evaluation


@dataclass
class _Evaluation:
    prices: np.ndarray  # float64 (m,)
    dual: float
    primal: float
    usage: np.ndarray  # float64 (m,)
    grad: np.ndarray  # R - r
    scale: Tensor  # (m + 1,) column scaling of the feasible allocation (last entry: the "none" pool)
    sol: Subsolution
    t_feasible: Tensor
    recovered: Recovery | None = None  #: set when the LP split of tied jobs beats column scaling
    #: this process's sums at ``prices``: usage per pool (``m + 1``, last: "none"), ``sum_i u_i(t_i) - c_i(t_i)`` and
    #: ``sum_i u_i(t_i)`` of the subproblem solutions (what an incremental re-solve updates row by row)
    r_local: Tensor | None = None
    net_local: float = math.nan
    u_local: float = math.nan


class _Evaluator:
    """Evaluates ``g(p)``, its subgradient and the feasible-allocation utility for a (possibly sharded) problem."""

    def __init__(self, prob: _Problem, method: str = "hull", group: Any = None) -> None:
        self.prob = prob
        self.group = group
        self.method = method
        a = prob.a
        self.n, self.m = a.shape
        self._a_pos: Tensor | None = None
        self.cap64 = prob.capacity.detach().double().cpu().numpy()
        self.evaluations = 0
        #: (the previous solve's state, rows to solve again): set by a solve given ``previous=``; used once, by the
        #: first evaluation at exactly the state's prices
        self.reuse: tuple[_Reuse, Tensor] | None = None
        self.resolved: int | None = None

    @property
    def a_pos(self) -> Tensor:
        """``a > 0``, computed once when a walk needs it (the compiled walk does not)."""
        if self._a_pos is None:
            self._a_pos = self.prob.a > 0
        return self._a_pos

    def _incremental(self, prices: np.ndarray, c: Tensor) -> tuple[Subsolution, Tensor, Tensor, Tensor] | None:
        """The subproblem solutions and their sums ``(sol, r, net, u)`` at ``prices`` from the previous solve's state,
        when it was evaluated at exactly these prices: only the changed rows are solved again (rows are independent,
        so this is a full solve up to last-bit rounding of vectorised functions), and the sums are updated by the
        changed rows' old and new contributions. ``None`` otherwise (a full evaluation follows)."""
        if self.reuse is None or self.method != "hull" or not np.array_equal(prices, self.reuse[0].prices):
            return None
        state, rows = self.reuse
        self.reuse = None
        self.resolved = int(rows.numel())
        prob = self.prob
        base = state.sol
        sums: tuple[Tensor, Tensor, Tensor] | None = None
        if state.r_local is not None and math.isfinite(state.net_local) and math.isfinite(state.u_local):
            sums = (
                state.r_local.clone(),
                torch.tensor(state.net_local, dtype=torch.float64),
                torch.tensor(state.u_local, dtype=torch.float64),
            )
        if rows.numel():
            fields = ("t", "j_lo", "x_lo", "a_lo", "c_lo", "j_hi", "x_hi", "a_hi", "c_hi")
            old = Subsolution(**{name: getattr(base, name).index_select(0, rows) for name in fields})
            util = prob.utility.take(rows)
            new = solve_hull(prob.a.index_select(0, rows), c.index_select(0, rows), util)
            if sums is not None:
                r, net, u_sum = sums
                old_d = None if state.demand is None else state.demand.index_select(0, rows)
                new_d = None if prob.demand is None else prob.demand.index_select(0, rows)
                parts = (
                    (-1.0, old, old_d, state.utility.take(rows).value(old.t)),
                    (1.0, new, new_d, util.value(new.t)),
                )
                for sign, part, d_rows, u_part in parts:
                    net = net + sign * (u_part - part.cost()).sum(dtype=torch.float64)
                    u_sum = u_sum + sign * u_part.sum(dtype=torch.float64)
                    w_lo, w_hi = _usage_weights(part, d_rows, self.m)
                    r.index_add_(0, part.j_lo, sign * w_lo.double())
                    r.index_add_(0, part.j_hi, sign * w_hi.double())
                sums = (r, net, u_sum) if bool(torch.isfinite(net)) and bool(torch.isfinite(u_sum)) else None
            # in place: the previous solve's state is consumed (see ``previous=`` of :func:`solve`)
            for name in fields:
                getattr(base, name).index_copy_(0, rows, getattr(new, name))
        if sums is None:
            sums = self._sums(base)
        return base, sums[0], sums[1], sums[2]

    def _sums(self, sol: Subsolution) -> tuple[Tensor, Tensor, Tensor]:
        """``(r, net, u)``: usage per pool (``m + 1``), ``sum_i u_i(t_i) - c_i(t_i)`` and ``sum_i u_i(t_i)``."""
        u_t = self.prob.utility.value(sol.t)
        net = (u_t - sol.cost()).sum(dtype=torch.float64)
        w_lo, w_hi = self.usage_weights(sol)
        r = torch.zeros(self.m + 1, dtype=torch.float64, device=sol.t.device)
        r.index_add_(0, sol.j_lo, w_lo.double())
        r.index_add_(0, sol.j_hi, w_hi.double())
        return r, net, u_t.sum(dtype=torch.float64)

    def _allreduce(self, values: list[float] | np.ndarray) -> np.ndarray:
        if self.group is None:
            return np.asarray(values, dtype=np.float64)
        buf = torch.tensor(np.asarray(values, dtype=np.float64), dtype=torch.float64)
        if self.group is not None:
            import torch.distributed as dist

            backend = dist.get_backend(self.group)
            dev = self.prob.a.device if backend == "nccl" else torch.device("cpu")
            buf = buf.to(dev)
            dist.all_reduce(buf, group=self.group)
        return buf.cpu().numpy()

    def costs(self, p: Tensor) -> Tensor:
        d = self.prob.demand
        if d is None:
            return p.expand(self.n, self.m)
        if d.ndim == 1:
            return d.unsqueeze(1) * p
        return d * p

    def usage_weights(self, sol: Subsolution) -> tuple[Tensor, Tensor]:
        return _usage_weights(sol, self.prob.demand, self.m)

    #: Candidate-pool tolerances tried in turn by :meth:`recover`: exact ties first, then near ties, which lets the
    #: LP reach U* from prices that are only close to optimal (piecewise-linear g: linear and target utilities).
    RECOVERY_RTOLS = (1e-6, 1e-3, 3e-2)

    def recover(self, ev: _Evaluation, target: float) -> bool:
        """Try the LP recovery of :mod:`allocator._pricing_recovery` at ``ev``'s prices (single process only), with
        each tolerance of :attr:`RECOVERY_RTOLS` until its utility reaches ``target``; keep the best in ``ev``
        (raising ``ev.primal``) when it beats the column-scaled allocation."""
        if self.group is not None or ev.recovered is not None:
            return False
        if split_jobs(ev.sol, self.m) > MAX_SCAN:
            return False  # a large market of distinct jobs: too many tied jobs to sort into classes
        prob = self.prob
        p = torch.as_tensor(ev.prices, dtype=prob.a.dtype).to(prob.a.device)
        costs = self.costs(p)
        best: Recovery | None = None
        for rtol in self.RECOVERY_RTOLS:
            rec = recover_allocation(prob.a, costs, prob.demand, self.cap64, ev.sol, prob.utility, rtol=rtol)
            if rec is not None and (best is None or rec.utility > best.utility):
                best = rec
            if best is not None and best.utility >= target:
                break
        if best is None or not best.utility > ev.primal:
            return False
        ev.recovered = best
        ev.primal = best.utility
        return True

    def __call__(self, prices: np.ndarray) -> _Evaluation:
        prob = self.prob
        self.evaluations += 1
        p = torch.as_tensor(prices, dtype=prob.a.dtype).to(prob.a.device)
        c = self.costs(p)
        inc = self._incremental(np.asarray(prices, dtype=np.float64), c)
        if inc is not None:
            sol, r, net, u_sum = inc
        else:
            if self.method == "hull":
                sol = solve_hull(prob.a, c, prob.utility, a_pos=self.a_pos)
            else:
                sol = solve_pairs(prob.a, c, prob.utility)
            r, net, u_sum = self._sums(sol)
        packed = torch.cat([r[: self.m], net.reshape(1)]).cpu().numpy()
        packed = self._allreduce(packed)
        usage = packed[: self.m]
        dual = float(np.dot(prices, self.cap64) + packed[self.m])
        over = usage > self.cap64
        scale64 = np.ones(self.m + 1)
        scale64[: self.m][over] = self.cap64[over] / usage[over]
        scale = torch.as_tensor(scale64, dtype=prob.a.dtype).to(p.device)
        if over.any():
            if sol.t.device.type == "cpu":
                from allocator._pricing_numba import scaled_throughput

                t_feas = torch.from_numpy(
                    scaled_throughput(
                        sol.a_lo.numpy(),
                        sol.x_lo.numpy(),
                        sol.j_lo.numpy(),
                        sol.a_hi.numpy(),
                        sol.x_hi.numpy(),
                        sol.j_hi.numpy(),
                        scale64,
                    )
                )
            else:
                s_lo, s_hi = scale.index_select(0, sol.j_lo), scale.index_select(0, sol.j_hi)
                t_feas = sol.a_lo * sol.x_lo * s_lo + sol.a_hi * sol.x_hi * s_hi
            primal_local = prob.utility.value(t_feas).sum(dtype=torch.float64)
        else:
            t_feas = sol.t
            primal_local = u_sum
        primal = float(self._allreduce([float(primal_local)])[0])
        if math.isnan(primal):
            primal = -math.inf
        return _Evaluation(
            prices=np.asarray(prices, dtype=np.float64),
            dual=dual,
            primal=primal,
            usage=usage,
            grad=self.cap64 - usage,
            scale=scale,
            sol=sol,
            t_feasible=t_feas,
            r_local=r,
            net_local=float(net),
            u_local=float(u_sum),
        )


def _usage_weights(sol: Subsolution, demand: Tensor | None, m: int) -> tuple[Tensor, Tensor]:
    """What each job's two pools carry of its demand: ``x_lo d_lo`` and ``x_hi d_hi`` (``demand``: the jobs' rows)."""
    if demand is None:
        return sol.x_lo, sol.x_hi
    if demand.ndim == 1:
        return sol.x_lo * demand, sol.x_hi * demand
    d_lo = demand.gather(1, sol.j_lo.clamp(max=m - 1).unsqueeze(1)).squeeze(1)
    d_hi = demand.gather(1, sol.j_hi.clamp(max=m - 1).unsqueeze(1)).squeeze(1)
    return sol.x_lo * d_lo, sol.x_hi * d_hi


def dual_evaluation(
    throughput: ArrayLike,
    capacity: ArrayLike,
    utility: Utility,
    prices: ArrayLike,
    *,
    demand: ArrayLike | None = None,
    method: str = "hull",
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
) -> tuple[float, np.ndarray, float]:
    """Evaluate the dual function once: ``(g(p), usage r, utility of the column-scaled feasible allocation)``."""
    dev = resolve_device(device, throughput)
    prob = _prepare(throughput, capacity, utility, demand, dev, resolve_dtype(dtype))
    ev = _Evaluator(prob, method=method)(np.asarray(prices, dtype=np.float64))
    return ev.dual, ev.usage, ev.primal


# ----------------------------------------------------------------------------------------------------------------
# Price updates (Alg. 2)


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
    device: torch.device | str | None = None
    dtype: torch.dtype | str | None = None
    record_history: bool = True
    recover: bool = True
    presolve_min_jobs: int = 5_000
    presolve_jobs: int = 20_000
    #: A float32 run (one process) whose gap stays open and has not shrunk by 1 % over :attr:`_Run.PRECISION_WINDOW`
    #: evaluations stops and continues in float64 from its best prices, with the evaluations it has left: near the
    #: optimum, float32 dual values differ by less than their rounding noise and the line search stalls.
    escalate: bool = True

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

        CPU problems with fewer than :data:`SINGLE_THREAD_BELOW` throughput entries run with one torch thread (the
        process-wide count is restored on return). The solve runs under ``torch.inference_mode()``: no autograd
        bookkeeping per operation (about 10 % of a 10^4-job solve, which is per-op overhead bound); every result is
        returned as numpy, so no inference tensor leaves this method.
        """
        start = time.perf_counter()
        try:
            numel = int(np.prod(np.shape(throughput)))
        except ValueError:  # ragged input: _prepare reports it
            numel = 0
        dev = resolve_device(self.device, throughput, capacity)
        with _intra_op_threads(numel, dev), torch.inference_mode():
            res = self._solve(throughput, capacity, utility, demand, prices, group, start, previous)
            left = (200 if self.max_iter is None else int(self.max_iter)) - res.iterations
            if not (res._precision_stall and self.escalate and group is None and left > 0):
                return res
            wide = replace(self, dtype=torch.float64, max_iter=left)
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
            return more

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
        if self.method not in ("hull", "pairs"):
            raise ValueError(f"method must be 'hull' or 'pairs', got {self.method!r}")
        dev = resolve_device(self.device, throughput, capacity)
        dtype = resolve_dtype(self.dtype)
        if previous is not None and not isinstance(previous, PricingResult):
            raise ValueError(f"previous must be a PricingResult, got {type(previous).__name__}")
        state = previous._reuse if previous is not None and group is None and self.method == "hull" else None
        prob = _prepare(throughput, capacity, utility, demand, dev, dtype, check_throughput=state is None)
        rows: Tensor | None = None  # rows to solve again in an incremental re-solve (None: no reuse)
        if state is not None:
            rows = _changed_rows(state, prob)
            if rows is not None and not torch.equal(state.capacity > 0, prob.capacity > 0):
                rows = None  # pools opened or closed: the masked problem changed everywhere
            # unchanged rows equal rows validated by the previous solve
            _check_throughput(prob.a, rows)
        n, m = prob.a.shape
        n_total = n
        if group is not None:
            import torch.distributed as dist

            buf = torch.tensor([float(n)], dtype=torch.float64)
            if dist.get_backend(group) == "nccl":
                buf = buf.to(dev)
            dist.all_reduce(buf, group=group)
            n_total = int(buf.item())
        eps = 1e-3 * max(n_total, 1) if self.eps is None else float(self.eps)
        if not (eps > 0 and math.isfinite(eps)):
            raise ValueError(f"eps must be positive and finite, got {self.eps!r}")
        max_iter = 200 if self.max_iter is None else int(self.max_iter)
        if max_iter < 1:
            raise ValueError(f"max_iter must be at least 1, got {self.max_iter!r}")
        p0_given: np.ndarray | None = None
        if prices is not None:
            p0t = _to_tensor("prices", prices, torch.device("cpu"), torch.float64)
            if p0t.shape != (m,):
                raise ValueError(f"prices has shape {tuple(p0t.shape)}: expected ({m},)")
            _first_bad("prices", ~torch.isfinite(p0t) | (p0t < 0), p0t, "finite and non-negative")
            p0_given = p0t.numpy().copy()
        if previous is not None:
            if previous.prices.shape != (m,):
                raise ValueError(f"previous was solved with {previous.prices.shape[0]} pools, this problem has {m}")
            if p0_given is None:
                # the evaluation prices of the stored subsolution: the returned prices, except that closed pools
                # (capacity 0, masked out of every subproblem) may have been re-priced after the run
                kept = previous._reuse
                p0_given = (kept.prices if kept is not None else previous.prices).astype(np.float64).copy()

        # Jobs whose utility is -inf at t = 0 and that cannot get any throughput make the problem infeasible. In an
        # incremental re-solve only the changed rows can be (the previous solve had none, with the same open pools).
        def infeasible_rows(idx: Tensor | None) -> Tensor:
            a_rows = prob.a if idx is None else prob.a.index_select(0, idx)
            util = prob.utility if idx is None else prob.utility.take(idx)
            u0 = util.value(torch.zeros(a_rows.shape[0], dtype=dtype, device=dev))
            return torch.isneginf(u0) & ~((a_rows > 0) & (prob.capacity > 0)).any(dim=1)

        bad_rows: Tensor | None = None
        if rows is None or bool(infeasible_rows(rows).any()):
            bad_rows = infeasible_rows(None)
            rows = None if bool(bad_rows.any()) else rows
        infeasible = (
            np.zeros(0, dtype=np.int64) if bad_rows is None else torch.nonzero(bad_rows).squeeze(1).cpu().numpy()
        )
        keep: Tensor | None = None
        if infeasible.size:
            assert bad_rows is not None
            keep = torch.nonzero(~bad_rows).squeeze(1)
            prob = _Problem(
                a=prob.a.index_select(0, keep),
                capacity=prob.capacity,
                demand=None if prob.demand is None else prob.demand.index_select(0, keep),
                utility=prob.utility.take(keep),
            )
        # Degenerate pools with zero capacity: nobody may use them; solve without them and price each at the
        # largest marginal value any job would get from it, u_i'(t_i) a_ij / d_ij, so that no job wants it.
        a_raw = prob.a
        closed = (prob.capacity <= 0).cpu().numpy()
        if closed.any() and not closed.all():
            mask = torch.as_tensor(~closed, device=dev).to(dtype)
            prob = _Problem(a=prob.a * mask, capacity=prob.capacity, demand=prob.demand, utility=prob.utility)
        evaluator = _Evaluator(prob, method=self.method, group=group)
        a_copy: Tensor | None = None  # the private copy of the throughputs kept for the next incremental solve
        if previous is not None and state is not None and rows is not None and keep is None:
            # consume the previous state: its buffers are patched in place and move to this result
            previous._reuse = None
            evaluator.reuse = (state, rows)
            a_copy = state.a.index_copy_(0, rows, a_raw.index_select(0, rows))
        run = _Run(self, evaluator, eps, max_iter)
        run.low_precision = self.escalate and dtype == torch.float32 and group is None
        presolved = 0
        if p0_given is not None:
            p0 = p0_given
            run.warm = True
        elif group is None and prob.a.shape[0] >= max(self.presolve_min_jobs, 1):
            p0, run.mem_s, run.mem_y, presolved = self._presolve(prob, eps)
        else:
            p0 = self._initial_prices(prob, group)
        run.optimise(p0)
        run.finish()
        best_p, best_d = run.best_dual
        best_e = run.best_primal
        gap = best_d.dual - best_e.primal
        converged = bool(gap <= eps)
        if n_total == 0:
            status: Status = "empty"
            converged = True
            gap = 0.0
            message = "no jobs"
        elif infeasible.size:
            status = "infeasible"
            converged = False
            message = (
                f"{infeasible.size} job(s) have utility -inf at zero throughput and no pool with positive throughput "
                f"and capacity (first: job {int(infeasible[0])}); they get nothing, the rest is solved"
            )
        elif converged:
            status = "optimal"
            message = f"duality gap {gap:.3g} <= eps {eps:.3g} after {run.evaluations} evaluations"
            if presolved:
                message += f" (after {presolved} on a job sample)"
        else:
            status = "max_iter"
            message = f"stopped after {run.evaluations} evaluations with duality gap {gap:.3g} > eps {eps:.3g}"
        sol, scale = best_e.sol, best_e.scale
        if closed.any() and not closed.all():
            best_p = self._closed_pool_prices(prob, best_e, best_p, closed, throughput, keep, dev, dtype, group)
        if best_e.recovered is not None:
            x, t = best_e.recovered.allocation, best_e.recovered.throughputs
            usage = best_e.recovered.usage
        else:
            x = sol.dense(m, scale[:m])
            t = best_e.t_feasible
            usage = best_e.usage * best_e.scale[:m].double().cpu().numpy()
        if keep is not None:
            x_full = torch.zeros((n, m), dtype=dtype, device=dev)
            x_full.index_copy_(0, keep, x)
            t_full = torch.zeros(n, dtype=dtype, device=dev)
            t_full.index_copy_(0, keep, t)
            x, t = x_full, t_full
        primal, dual = best_e.primal, best_d.dual
        if status == "infeasible":
            primal, dual, gap = -math.inf, -math.inf, math.inf
        return PricingResult(
            prices=best_p,
            allocation=x.cpu().numpy(),
            throughputs=t.cpu().numpy(),
            usage=usage,
            utility_value=primal,
            dual_value=dual,
            gap=float(gap),
            eps=eps,
            iterations=run.evaluations,
            converged=converged,
            status=status,
            message=message,
            seconds=time.perf_counter() - start,
            device=str(dev),
            dtype=str(dtype).replace("torch.", ""),
            infeasible_jobs=infeasible.astype(np.int64),
            history=run.history,
            presolve_evaluations=presolved,
            resolved_jobs=evaluator.resolved,
            _precision_stall=run.precision_stall and not converged,
            _reuse=(
                _Reuse(
                    a=a_raw.clone() if a_copy is None else a_copy,
                    demand=None if prob.demand is None else prob.demand.clone(),
                    utility=prob.utility,
                    prices=best_d.prices.copy(),
                    sol=best_d.sol,
                    capacity=prob.capacity.clone(),
                    r_local=best_d.r_local,
                    net_local=best_d.net_local,
                    u_local=best_d.u_local,
                )
                if group is None and keep is None and self.method == "hull"
                else None
            ),
        )

    @staticmethod
    def _closed_pool_prices(
        prob: _Problem,
        ev: _Evaluation,
        prices: np.ndarray,
        closed: np.ndarray,
        throughput: ArrayLike,
        keep: Tensor | None,
        dev: torch.device,
        dtype: torch.dtype,
        group: Any,
    ) -> np.ndarray:
        a = _to_tensor("throughput", throughput, dev, dtype)
        if keep is not None:
            a = a.index_select(0, keep)
        t_feas = ev.recovered.throughputs if ev.recovered is not None else ev.t_feasible
        du = prob.utility.derivative(t_feas)
        du = torch.where(torch.isfinite(du), du, torch.zeros_like(du)).unsqueeze(1)
        d = prob.demand
        per = a if d is None else a / (d.unsqueeze(1) if d.ndim == 1 else d)
        value = (du * per).amax(0) if per.shape[0] else torch.zeros(per.shape[1], dtype=dtype, device=dev)
        if group is not None:
            import torch.distributed as dist

            buf = value.double().to(dev if dist.get_backend(group) == "nccl" else torch.device("cpu"))
            dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=group)
            value = buf
        out = prices.copy()
        out[closed] = value.double().cpu().numpy()[closed]
        return out

    #: Evaluations allowed to the presolve; its best prices are used even when its own gap is still open (markets
    #: of exact job copies, whose column-scaled allocation never closes the gap, would otherwise spend 100 here).
    PRESOLVE_MAX_ITER = 40

    def _presolve(self, prob: _Problem, eps: float) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray], int]:
        """Prices and L-BFGS pairs from the market of a random sample of jobs (see the class docstring).

        The sample is drawn with replacement by a generator seeded with 0 (deterministic); capacities and ``eps``
        scale with the sample fraction ``k / n``, and the pairs' ``y = Delta (R - r)`` are rescaled by ``n / k`` to
        the full market's curvature.
        """
        n = prob.a.shape[0]
        k = max(min(n // 10, self.presolve_jobs), min(1_000, n))
        gen = torch.Generator().manual_seed(0)
        idx = torch.randint(n, (k,), generator=gen).to(prob.a.device)
        frac = k / n
        sub = _Problem(
            a=prob.a.index_select(0, idx),
            capacity=prob.capacity * frac,
            demand=None if prob.demand is None else prob.demand.index_select(0, idx),
            utility=prob.utility.take(idx),
        )
        cfg = replace(self, record_history=False, recover=False, presolve_min_jobs=n + 1)
        run = _Run(cfg, _Evaluator(sub, method=self.method), eps * frac, self.PRESOLVE_MAX_ITER)
        with _intra_op_threads(sub.a.numel(), sub.a.device):
            run.optimise(self._initial_prices(sub, None))
        p = run.best_dual[0]
        if not np.all(np.isfinite(p)):
            return self._initial_prices(prob, None), [], [], run.evaluations
        return p.copy(), list(run.mem_s), [y / frac for y in run.mem_y], run.evaluations

    @staticmethod
    def _initial_prices(prob: _Problem, group: Any) -> np.ndarray:
        """Eq. (17); under sharding the per-rank sums are all-reduced first."""
        if group is None:
            return initial_prices(prob.utility, prob.a, prob.capacity, prob.demand).double().cpu().numpy()
        import torch.distributed as dist

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


class _Run:
    """State of one run of Algorithm 2 (projected L-BFGS on the dual, with best-bound bookkeeping)."""

    def __init__(self, cfg: PriceDiscovery, evaluator: _Evaluator, eps: float, max_iter: int) -> None:
        self.cfg = cfg
        self.evaluate_fn = evaluator
        self.eps = eps
        self.max_iter = max_iter
        self.evaluations = 0
        self.history: list[IterationRecord] = []
        self.best_dual: tuple[np.ndarray, _Evaluation]
        self.best_primal: _Evaluation
        self._started = False
        self.cap = evaluator.cap64
        self.warm = False
        self.recoveries = 0
        self.last_recovery = 0  #: evaluation count at the last recovery attempt
        self.gaps: list[float] = []  #: gap after each evaluation
        #: float32 run that may stop on a precision stall (:attr:`PriceDiscovery.escalate`), and whether it did
        self.low_precision = False
        self.precision_stall = False
        #: L-BFGS pairs (s, y) to start from (a presolve's curvature); the last pairs are left here by optimise.
        self.mem_s: list[np.ndarray] = []
        self.mem_y: list[np.ndarray] = []

    #: LP recoveries tried per solve; each is one HiGHS solve over the tied jobs, so they are rationed.
    MAX_RECOVERIES = 50

    #: Mid-run recovery needs a stall: the gap has not halved over the last ``STALL_WINDOW`` evaluations, nor since
    #: the previous attempt. While L-BFGS still closes the gap, an LP (seconds for a thousand tied jobs) costs far
    #: more than the few evaluations column scaling needs (n = 4000: 13 s with eager recovery, 18 ms without).
    STALL_WINDOW = 8

    def _stalled(self) -> bool:
        w = self.STALL_WINDOW
        if len(self.gaps) < w or self.evaluations - self.last_recovery < w:
            return False
        return self.gap() > 0.5 * self.gaps[-w]

    def _try_recovery(self, ev: _Evaluation) -> None:
        if not self.cfg.recover or self.recoveries >= self.MAX_RECOVERIES:
            return
        self.recoveries += 1
        self.last_recovery = self.evaluations
        if self.evaluate_fn.recover(ev, self.best_dual[1].dual - self.eps) and ev.primal > self.best_primal.primal:
            self.best_primal = ev

    def finish(self) -> None:
        """Last resort when the gap is still open: recover at the best dual prices."""
        if self._started and self.gap() > self.eps:
            self._try_recovery(self.best_dual[1])

    def gap(self) -> float:
        return self.best_dual[1].dual - self.best_primal.primal

    #: Evaluations over which a float32 run's open gap must shrink by 1 % (see :attr:`PriceDiscovery.escalate`).
    PRECISION_WINDOW = 25

    def _precision_stalled(self) -> bool:
        w = self.PRECISION_WINDOW
        if not self.low_precision or len(self.gaps) < w or self.gap() <= self.eps:
            return False
        return self.gap() >= 0.99 * self.gaps[-w]

    def done(self) -> bool:
        if self.gap() <= self.eps or self.evaluations >= self.max_iter:
            return True
        if self._precision_stalled():
            self.precision_stall = True
            return True
        return False

    def evaluate(self, p: np.ndarray, kind: str) -> _Evaluation:
        ev = self.evaluate_fn(p)
        self.evaluations += 1
        if not self._started:
            self.best_dual = (p.copy(), ev)
            self.best_primal = ev
            self._started = True
            if self.warm and self.gap() > self.eps:
                self._try_recovery(ev)  # warm start: the given prices are meant to be (near) optimal
        else:
            previous = self.best_dual[1].dual
            if ev.dual < previous:
                self.best_dual = (p.copy(), ev)
            if ev.primal > self.best_primal.primal:
                self.best_primal = ev
            # The dual has (nearly) stopped improving but the gap is open: the column-scaled allocation is what
            # lags (kinks of g, tied jobs), so split the tied jobs exactly at the best prices.
            if (
                ev.dual <= previous
                and self.gap() > self.eps
                and previous - ev.dual <= 0.1 * self.gap()
                and self._stalled()
            ):
                self._try_recovery(ev)
        self.gaps.append(self.gap())
        if self.cfg.record_history:
            self.history.append(
                IterationRecord(
                    iteration=self.evaluations,
                    prices=p.copy(),
                    usage=ev.usage.copy(),
                    dual_value=ev.dual,
                    primal_value=ev.primal,
                    gap=self.gap(),
                    kind=kind,
                )
            )
        return ev

    def optimise(self, p0: np.ndarray) -> None:
        p = np.maximum(np.asarray(p0, dtype=np.float64), 0.0)
        ev = self.evaluate(p, "init")
        if self.done():
            return
        cap = self.cap
        # Preconditioner diag(p / R): the exact Newton scaling for log utility with one pool (unit price elasticity).
        pscale = p.max() if p.max() > 0 else 1.0
        rscale = cap.max() if cap.max() > 0 else 1.0
        h = np.maximum(p, 1e-3 * pscale) / np.maximum(cap, 1e-3 * rscale)
        mem_s = self.mem_s
        mem_y = self.mem_y
        sub_step = 1.0
        ratio = self.cfg.max_ratio
        while not self.done():
            q = ev.grad
            free = ~((p <= 0) & (q > 0))
            direction = -self._two_loop(q * free, mem_s, mem_y, h) * free
            slope = float(direction @ q)
            if not (slope < 0) or not np.all(np.isfinite(direction)):
                mem_s.clear()
                mem_y.clear()
                direction = -h * q * free
                slope = float(direction @ q)
                if not slope < 0:
                    return  # projected gradient is zero: p is optimal up to ties
            step = self._max_step(p, direction, ratio)
            first_step = step
            accepted: tuple[np.ndarray, _Evaluation] | None = None
            best_trial: tuple[np.ndarray, _Evaluation] | None = None
            for _ in range(self.cfg.max_line_search):
                p_new = np.maximum(p + step * direction, 0.0)
                ev_new = self.evaluate(p_new, "lbfgs")
                if self.done():
                    return
                if best_trial is None or ev_new.dual < best_trial[1].dual:
                    best_trial = (p_new, ev_new)
                decrease = float(q @ (p_new - p))
                if ev_new.dual <= ev.dual + self.cfg.armijo * decrease:
                    accepted = (p_new, ev_new)
                    # Trust-region radius update: widen after a full (bounded) step, narrow after backtracking.
                    ratio = min(ratio * ratio, 1e8) if step == first_step else max(self.cfg.max_ratio, ratio**0.5)
                    break
                # Safeguarded quadratic interpolation of phi(step) = g(p + step d) along the path.
                denom = 2.0 * (ev_new.dual - ev.dual - step * slope)
                cand = -slope * step * step / denom if denom > 0 else 0.5 * step
                step = float(min(max(cand, 0.1 * step), 0.5 * step))
            if accepted is None:
                # Line search failed (nonsmooth g): projected subgradient step with diminishing length.
                mem_s.clear()
                mem_y.clear()
                if best_trial is not None and best_trial[1].dual < ev.dual:
                    accepted = best_trial
                else:
                    sub_step *= 0.5
                    p_new = np.maximum(p - sub_step * h * q, 0.0)
                    accepted = (p_new, self.evaluate(p_new, "subgradient"))
                    if self.done():
                        return
            p_new, ev_new = accepted
            s_vec = p_new - p
            y_vec = ev_new.grad - ev.grad
            # g is convex so s.y >= 0; the sign of y is that of the gradient of g, i.e. -(r - R) = q.
            sy = float(s_vec @ y_vec)
            if sy > 1e-12 * float(np.linalg.norm(s_vec) * np.linalg.norm(y_vec)) and sy > 0:
                mem_s.append(s_vec)
                mem_y.append(y_vec)
                if len(mem_s) > self.cfg.memory:
                    mem_s.pop(0)
                    mem_y.pop(0)
            p, ev = p_new, ev_new

    @staticmethod
    def _max_step(p: np.ndarray, direction: np.ndarray, ratio: float) -> float:
        """Largest step <= 1 that changes no positive price by more than a factor ``ratio`` (a trust region in
        relative price terms: prices of scarce and abundant pools differ by orders of magnitude)."""
        step = 1.0
        pos = p > 0
        up = pos & (direction > 0)
        down = pos & (direction < 0)
        if up.any():
            step = min(step, float(np.min((ratio - 1.0) * p[up] / direction[up])))
        if down.any():
            step = min(step, float(np.min((1.0 - 1.0 / ratio) * p[down] / -direction[down])))
        return max(step, 1e-12)

    @staticmethod
    def _two_loop(g: np.ndarray, mem_s: list[np.ndarray], mem_y: list[np.ndarray], h: np.ndarray) -> np.ndarray:
        """L-BFGS two-loop recursion: ``H g`` with initial matrix ``gamma diag(h)``."""
        q = g.copy()
        alphas = []
        rhos = [1.0 / float(s @ y) for s, y in zip(mem_s, mem_y)]
        for s, y, rho in zip(reversed(mem_s), reversed(mem_y), reversed(rhos)):
            alpha = rho * float(s @ q)
            q -= alpha * y
            alphas.append(alpha)
        if mem_s:
            s, y = mem_s[-1], mem_y[-1]
            gamma = float(s @ y) / float(y @ (h * y))
        else:
            gamma = 1.0
        r = gamma * h * q
        for s, y, rho, alpha in zip(mem_s, mem_y, rhos, reversed(alphas)):
            beta = rho * float(y @ r)
            r += s * (alpha - beta)
        return r


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
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    previous: PricingResult | None = None,
) -> PricingResult:
    """Discover optimal pool prices and a near-optimal allocation (Alg. 2 of 004 with the demands of its Sec. 7.1).

    Args:
        throughput: ``(n, m)`` throughputs ``a_ij >= 0`` (numpy array or torch tensor).
        capacity: ``(m,)`` capacities ``R_j >= 0``.
        utility: a :class:`allocator.utilities.Utility` for the ``n`` jobs (e.g. ``utilities.Log()``).
        demand: ``None`` (1), a scalar, ``(n,)`` per-job or ``(n, m)`` per-job-and-pool demands ``d > 0``.
        eps: stop when ``g(p) - U(X) <= eps``; default ``1e-3 n``.
        prices: ``(m,)`` initial prices (warm start); default eq. (17).
        max_iter: limit on dual evaluations (default 200).
        device: torch device; default the input tensor's device, else CUDA when available, else CPU.
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
            The reuse state moves from ``previous`` to the new result (its buffers are updated in place, so a chain
            of re-solves copies nothing): a result seeds one incremental re-solve, a second one with the same
            ``previous`` starts from its prices with a full evaluation.

    Returns:
        A :class:`PricingResult`. Raises ``ValueError`` on malformed input, naming the job/pool index and field.
    """
    cfg = PriceDiscovery(eps=eps, max_iter=max_iter, device=device, dtype=dtype)
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
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
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
    cfg = PriceDiscovery(eps=eps, max_iter=max_iter, device=device, dtype=dtype)
    return cfg.solve(throughput, capacity, utility, demand=demand, prices=prices, group=grp)
