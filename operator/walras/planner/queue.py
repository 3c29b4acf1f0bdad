"""The queue of waiting jobs (docs/preemption.md): one documented order, shared by the status phase (each waiting
job's ``status.queuePosition``, :func:`walras.planner.status.job_statuses`) and the preemption phase (which waiting
job is served first, :mod:`.preemption`).

A job waits while it has fewer replicas placed than it asks for. Waiting jobs are ordered by

1. priority (``Job.priority``, its PriorityClass's value; high first): Kubernetes' PriorityClass order comes before
   the market;
2. ``spec.weight`` (high first), the market's own weight of the job's utility (004 Sec. 2: ``w_i u_i``);
3. bid (high first): the job's largest bid per unit of a priced resource, ``u_i'(t_i) a_ij / (N_i d_i)``, what the
   market compares with the price ``p_j`` (004 Sec. 2.2: at the equilibrium ``u_i'(t_i) a_ij <= p_j N_i d_i``); an
   unbounded bid (a log or power utility with nothing placed) comes first;
4. age (``metadata.creationTimestamp``, the oldest first; a job without one last), then namespace and name.

Also here, as the rules the rounds (which offer a full pool to a waiting job where a running pod may yield to it,
:func:`contested`) and the preemption phase (:mod:`.preemption`, whose docstring states them) share: whether a pod
of one job may yield to another (:func:`yields`, :func:`market_gain`: the restart-cost rule), the utilities as the
integral fill values them (:class:`Valuation`), and a claim pod's reason (:func:`claim_reason`,
:func:`claimed_nodes`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

import numpy as np

from allocator.integral import Utility, utility_value
from walras.planner.model import ObjectKey, Plan
from walras.planner.results import JobInfo, Observed, PlanContext
from walras.planner.spec import JobSpec, PoolSpec, restart_cost

__all__ = ["CLAIM", "MARGIN", "MECHANISM_POLICIES", "QUEUE_ORDER", "HolderSide", "Valuation", "claim_reason",
           "claimed_nodes", "contested", "gang", "market_gain", "market_mask", "may_yield", "queue_key", "waiting_side",
           "yields"]

#: Pools whose placement policy's own mechanism shares the capacity among equal priorities (fair: 002's
#: mechanisms; colocation: 001's): there only PriorityClass order preempts, and a plan's new pods are not swapped.
MECHANISM_POLICIES = frozenset({"fair", "colocation"})

#: The queue order in words (``walras explain`` and the docs say it).
QUEUE_ORDER = "priority (PriorityClass, high first), then spec.weight, then bid (high first), then age (oldest first)"


def queue_key(priority: int, weight: float, bids: Iterable[float | None], created: float | None, namespace: str,
              name: str) -> tuple[float, float, float, float, str, str]:
    """The sort key of one waiting job in the order of the module docstring (smaller first); ``bids`` are its
    per-unit bids (None: unbounded)."""
    best = max((math.inf if b is None else float(b) for b in bids), default=0.0)
    if math.isnan(best):
        best = 0.0
    return (-float(priority), -float(weight), -best, created if created is not None else math.inf, namespace, name)


CLAIM = re.compile(r"\(preemption: waits on node (\S+) for ([^)]*)\)")


def claim_reason(node: str, victims: Collection[str]) -> str:
    """The reason of a claim pod's plan: the node it waits for and the pods that leave it (read back by
    :func:`claimed_nodes`)."""
    return f"(preemption: waits on node {node} for {','.join(sorted(victims))})"


def claimed_nodes(previous: Plan | None) -> dict[ObjectKey, tuple[str, tuple[str, ...]]]:
    """Per claim pod of ``previous`` ((namespace, name)), the node it waits for and the victims' names."""
    out: dict[ObjectKey, tuple[str, tuple[str, ...]]] = {}
    if previous is None:
        return out
    for pod in previous.pods:
        if pod.node is None and pod.reason:
            match = CLAIM.search(pod.reason)
            if match is not None:
                out[(pod.namespace, pod.name)] = (match.group(1), tuple(v for v in match.group(2).split(",") if v))
    return out


def market_gain(u_w: tuple[float, float], u_v: tuple[float, float], restart: tuple[float, float],
                horizon: float) -> tuple[bool, float]:
    """The ``Market`` rule of the module docstring for one (waiting job w, victim v) pair: ``u_w`` is w's utility
    (before, after one more replica), ``u_v`` v's (before, after one fewer), ``restart`` (r_w, r_v) in seconds,
    ``horizon`` H. Returns (whether ``(H - r_w) g_w - H l_v > r_v l_v``, the instantaneous ``g_w - l_v``)."""
    (w0, w1), (v0, v1), (r_w, r_v) = u_w, u_v, restart
    if not math.isfinite(v1) or not math.isfinite(v0) or not math.isfinite(w1):
        return False, -math.inf  # the victim's utility unbounded below without this replica: it never yields
    loss = v0 - v1
    if not math.isfinite(w0):
        return horizon > r_w, math.inf  # a starved job's first replica: an unbounded gain
    gain = w1 - w0
    return (horizon - r_w) * gain - horizon * loss > r_v * loss, gain - loss


def contested(ctx: PlanContext, observed: Observed, pairs: Collection[tuple[int, int]],
              arrays: Utility) -> set[tuple[int, int]]:
    """Of ``pairs`` (job row, pool), those where a waiting job (fewer running and pending pods than
    ``spec.replicas``) may win capacity from running pods by the pool's rule (:mod:`.preemption`), each victim's one
    replica against the job's next one at what runs now (``arrays``: the jobs' utilities): the rounds offer such a
    pool to the job even when no pod of it fits now (:func:`walras.planner.rounds.run_rounds`), so its bid enters the
    market's prices; a pool whose rule lets no running pod yield to it is offered only where a pod fits, as before
    (the job spills elsewhere). Per pool, the running jobs' side of the rule is computed once (:class:`HolderSide`)
    and each waiting job is judged against all of them on arrays (:func:`market_mask`); :func:`yields` confirms
    the holders the arrays keep."""
    objects = ctx.objects
    pools, jobs = objects.pools, objects.jobs
    n, m = len(jobs), len(pools)
    out: set[tuple[int, int]] = set()
    if not n or not m or not pairs or all(p.spec.preemption.rule == "Never" for p in pools):
        return out
    running = observed.counts("running")
    existing = running + observed.counts("pending")
    a = np.zeros((n, m))
    for i, info in enumerate(jobs):
        for j in np.flatnonzero(info.pools).tolist():
            a[i, j] = info.spec.throughput.get(pools[j].name, 0.0)
    big_n = np.array([max(info.spec.replicas, 1) for info in jobs], dtype=np.float64)
    utility = Valuation(jobs, a, (a * running).sum(axis=1) / big_n, arrays)
    priority = np.array([info.job.priority for info in jobs], dtype=np.int64)
    yieldable = np.array([may_yield(info) for info in jobs], dtype=bool)
    holders: dict[int, tuple[np.ndarray, HolderSide | None]] = {}
    for i, j in sorted(pairs):
        pool, info = pools[j], jobs[i]
        if pool.spec.preemption.rule == "Never" or a[i, j] <= 0 or existing[i].sum() >= info.spec.replicas or \
                gang(info):
            continue
        if j not in holders:  # lower priorities first: they yield without a market test
            rows = np.flatnonzero((running[:, j] > 0) & yieldable)
            rows = rows[np.lexsort((rows, priority[rows]))]
            market = pool.spec.preemption.rule == "Market" and pool.spec.policy not in MECHANISM_POLICIES
            holders[j] = rows, _running_side(utility, jobs, a, rows, j) if market else None
        rows, side = holders[j]
        others = rows != i
        if (others & (priority[rows] < info.job.priority)).any():
            out.add((i, j))
            continue
        if side is None:
            continue
        keep = others & (priority[rows] == info.job.priority) & market_mask(
            waiting_side(utility, i, info.spec, float(a[i, j]), 0.0, pool.spec), side)
        if any(yields(ctx, (i, v, j), utility, a, True) for v in rows[keep].tolist()):
            out.add((i, j))
    return out


def _running_side(utility: Valuation, jobs: tuple[JobInfo, ...], a: np.ndarray, rows: np.ndarray, j: int
                  ) -> HolderSide:
    """The running jobs ``rows``' side of the ``Market`` rule in pool j (:class:`HolderSide`): one replica each
    lost, nothing landed, every row with running pods, each value as :func:`yields` computes it."""
    size = rows.size
    v0, v1, r_v = np.empty(size), np.empty(size), np.empty(size)
    for q, v in enumerate(rows.tolist()):
        spec = jobs[v].spec
        t_v = float(utility.t[v])
        v0[q] = utility.value(v, t_v)
        v1[q] = utility.value(v, t_v - a[v, j] / max(spec.replicas, 1) + 0.0)
        r_v[q] = utility.restart(v, spec)
    return HolderSide(v0, v1, v1, r_v, np.zeros(size, dtype=bool), np.ones(size, dtype=bool))


@dataclass(frozen=True)
class HolderSide:
    """The side of the ``Market`` rule of the jobs holding a pool (the victims' side of :func:`market_gain`), per
    holder: its utility now ``v0``, without one replica ``v1p`` (a pod this plan only planned: nothing lands),
    without it but restarted in free room elsewhere ``v1l`` (a running pod; :mod:`.preemption`'s landing), its
    restart cost ``r_v``, whether it has planned pods there and whether it has running pods there that the
    Eviction API may remove."""

    v0: np.ndarray
    v1p: np.ndarray
    v1l: np.ndarray
    r_v: np.ndarray
    planned: np.ndarray
    runs: np.ndarray


#: The relative margin of :func:`market_mask` in the holders' favour (a holder it keeps is judged by
#: :func:`yields` again).
MARGIN = 1e-9


def waiting_side(utility: Valuation, i: int, spec: JobSpec, a_ij: float, gives: float, pool: PoolSpec
                 ) -> tuple[float, float, float, float]:
    """Waiting job row i's (of spec ``spec``) side of the ``Market`` rule for its next replica in a pool of spec
    ``pool`` (throughput ``a_ij``), as :func:`yields` computes it: (utility before, after, the horizon ``H``, its
    restart cost ``r_w``); ``gives`` as in :func:`yields`."""
    t_w = float(utility.t[i])
    after = t_w - gives + a_ij / max(spec.replicas, 1)
    horizon = pool.preemption.horizon
    if spec.remaining_work is not None and after > 0:
        horizon = min(horizon, spec.remaining_work / after)
    return utility.value(i, t_w), utility.value(i, after), horizon, utility.restart(i, spec)


def market_mask(waiting: tuple[float, float, float, float], side: HolderSide) -> np.ndarray:
    """Per holder, whether :func:`market_gain` may hold for its planned pods (no restart on either side) or its
    running ones (both restart costs), for the waiting job's ``(w0, w1, H, r_w)`` (:func:`waiting_side`): the same
    arithmetic on arrays, each inequality loosened by :data:`MARGIN` relative, so a holder it refuses is one
    ``market_gain`` refuses (002/004's objective test of the module :mod:`.preemption`, for all holders at once)."""
    w0, w1, horizon, r_w = waiting
    n = side.v0.size
    if not math.isfinite(w1):
        return np.zeros(n, dtype=bool)
    with np.errstate(invalid="ignore"):
        fin_p = np.isfinite(side.v0) & np.isfinite(side.v1p)
        fin_l = np.isfinite(side.v0) & np.isfinite(side.v1l)
        if not math.isfinite(w0):  # a starved job's first replica: an unbounded gain
            return (fin_p & side.planned & (horizon > 0.0)) | (fin_l & side.runs & (horizon > r_w))
        gain = w1 - w0
        loss_p, loss_l = side.v0 - side.v1p, side.v0 - side.v1l
        lhs_p, rhs_p = (horizon - 0.0) * gain - horizon * loss_p, 0.0 * loss_p
        lhs_l, rhs_l = (horizon - r_w) * gain - horizon * loss_l, side.r_v * loss_l
        ok_p = lhs_p > rhs_p - MARGIN * (np.abs(lhs_p) + np.abs(rhs_p))
        ok_l = lhs_l > rhs_l - MARGIN * (np.abs(lhs_l) + np.abs(rhs_l))
    return (fin_p & side.planned & ok_p) | (fin_l & side.runs & ok_l)


def may_yield(info: JobInfo) -> bool:
    """Whether a job's pods may be preempted at all: ``spec.preemptible`` and not a gang (a job that needs at least
    two replicas together: taking one would leave it running partially)."""
    return info.job.preemptible and not gang(info)


def gang(info: JobInfo) -> bool:
    """A job whose pods run together or not at all: a gang (``spec.replicas.gang``, docs/gangs.md: taking one of
    its pods would release the whole gang) or an elastic job whose ``spec.replicas.min`` is 2 or more."""
    return info.spec.gang or (info.spec.elastic and info.spec.min_replicas > 1)


def yields(ctx: PlanContext, pair: tuple[int, int, int], utility: Valuation, a: np.ndarray,
            restarts: bool, *, gives: float = 0.0, lands: tuple[str, float] | None = None) -> str | None:
    """Why job row v's replica in pool j may yield to job row i by the pool's rule at the throughputs of
    ``utility.t`` (None: it may not); ``restarts``: the victim runs (both restart costs count), else it is a pod this
    plan only planned (nothing restarts: the rule is ``g_w > l_v``).

    The alternatives (:mod:`.preemption`, "weighed against a free slower pool"): ``gives`` is the throughput step
    ``a_wS / N_w`` of a pod job i gives up for this one (its new pod in a slower pool S it would start on now), so
    ``g_w = u_w(t_w - gives + a_wj / N_w) - u_w(t_w)``; ``lands`` is (pool name, ``a_vS' / N_v``) of the free room
    the victim's replica restarts in at once, so ``l_v = u_v(t_v) - u_v(t_v - a_vj / N_v + a_vS' / N_v)`` (a log
    job's last replica may then yield: it moves, it does not stop)."""
    i, v, j = pair
    jobs, pool = ctx.objects.jobs, ctx.objects.pools[j]
    w, info = jobs[i], jobs[v]
    rule = pool.spec.preemption.rule
    if rule == "Never" or not may_yield(info):
        return None
    if info.job.priority < w.job.priority:
        return f"priority {info.job.priority} < {w.job.priority}"
    if rule != "Market" or info.job.priority != w.job.priority or pool.spec.policy in MECHANISM_POLICIES:
        return None
    t_w, t_v = float(utility.t[i]), float(utility.t[v])
    after = t_w - gives + a[i, j] / max(w.spec.replicas, 1)
    landed = lands[1] if lands is not None else 0.0
    v0, v1 = utility.value(v, t_v), utility.value(v, t_v - a[v, j] / max(info.spec.replicas, 1) + landed)
    horizon = pool.spec.preemption.horizon
    remaining = w.spec.remaining_work
    if remaining is not None and after > 0:
        horizon = min(horizon, remaining / after)
    r_w, r_v = (utility.restart(i, w.spec), utility.restart(v, info.spec)) if restarts else (0.0, 0.0)
    ok, delta = market_gain((utility.value(i, t_w), utility.value(i, after)), (v0, v1), (r_w, r_v), horizon)
    if not ok:
        return None
    moved = f"; it restarts in pool {lands[0]!r}" if lands is not None else ""
    return (f"market: objective +{delta:.4g} per s over {horizon:g} s beats restart {r_v:g} s of "
            f"{info.spec.name}{moved}")


class Valuation:
    """Each job's utility at a throughput, as the integral fill values it (:func:`allocator.integral.utility_value`:
    a job with no replica and ``u(0) = -inf`` is worth its first replica less ``STARVED_PENALTY`` times its marginal
    value, so the preemption phase and the fill rank plans alike), and the jobs' current throughputs ``t``."""

    def __init__(self, jobs: tuple[JobInfo, ...], a: np.ndarray, t: np.ndarray, arrays: Utility) -> None:
        self.arrays = arrays  # walras.planner.integral.utility_arrays of the jobs' utility specs
        big = np.array([max(info.spec.replicas, 1) for info in jobs], dtype=np.float64)
        steps = np.where(a > 0, a / big[:, None], np.inf)
        self.t1 = np.min(steps, axis=1) if a.size else np.zeros(len(jobs))
        self.t = np.asarray(t, dtype=np.float64).copy()
        self.memo: dict[tuple[int, float], float] = {}
        self.restarts: dict[int, float] = {}

    def restart(self, i: int, spec: JobSpec) -> float:
        """Row i's restart cost (:func:`walras.planner.spec.restart_cost` of its ``spec``; memoised: a job's spec
        is fixed for the plan)."""
        got = self.restarts.get(i)
        if got is None:
            got = self.restarts[i] = restart_cost(spec)
        return got

    def value(self, i: int, t: float) -> float:
        """Row i's utility at throughput ``t`` (memoised)."""
        t = t if t > 1e-12 else 0.0
        got = self.memo.get((i, t))
        if got is None:
            t1 = float(self.t1[i]) if math.isfinite(float(self.t1[i])) else 1.0
            got = self.memo[(i, t)] = float(utility_value(self.arrays, i, t, t1))
        return got
