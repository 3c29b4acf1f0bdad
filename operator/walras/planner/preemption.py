"""Phase *preemption* (docs/preemption.md): after reconcile and migration, decide per pool which running pods yield
to waiting jobs, to whom, within the pool's churn budgets.

Every job bids in every pool it may use, whether or not a pod fits now (:func:`walras.planner.rounds.run_rounds`
offers a full pool to a waiting job), so the market's prices (004 Sec. 2: the duals of the pools' capacities) say
what a waiting job must beat. What runs holds its capacity: a running replica leaves only when this phase says so.
Waiting jobs are served in the queue's order (:mod:`.queue`: PriorityClass priority, then weight, then bid, then age);
a job waits when its placed replicas and its claims (below) are fewer than ``spec.replicas``. For each waiting job
``w``, pool by pool (highest throughput ``a_wj`` first), a running pod of another job ``v`` may yield when the pool's
``spec.preemption.rule`` allows it:

* ``Never``: no pod yields.
* ``LowerPriority``: ``priority_v < priority_w`` (``Job.priority``, PriorityClass order, whatever either bids), as
  kube-scheduler preempts.
* ``Market`` (the default): as ``LowerPriority``, and also ``priority_v == priority_w`` when the market's objective
  ``Phi = sum_i u_i(t_i)`` (004 Sec. 2, with ``t_i = sum_j a_ij n_ij / N_i`` the throughput of the placed replicas,
  as the migration phase counts it) gains more over the time the preemption lasts than the restart costs:

      ``(H - r_w) * g_w - H * l_v > r_v * l_v``,
      ``g_w = u_w(t_w + a_wj / N_w) - u_w(t_w)``, ``l_v = u_v(t_v) - u_v(t_v - a_vj / N_v)``

  with ``r_v``, ``r_w`` the jobs' restart costs (:func:`walras.planner.spec.restart_cost`: the seconds a move or a
  preemption stops a job) and ``H`` the time the preemption lasts: ``spec.preemption.horizonSeconds`` (600 s), or
  less, ``W_w / t_w'``, when the waiting job reports its remaining work ``W_w`` (annotation
  ``walras.dev/remaining-work``), the shape of the migration phase's remaining-work rule (:mod:`.migration`, rule f).
  The left side is the objective's integral over the horizon with the move less without it (the preemptor gains
  only once started, after ``r_w``; the victim loses its replica at once); the right side is the work the victim
  repeats after its restart (its last ``r_v`` seconds). It implies ``g_w > l_v``: the objective rises with every
  such preemption. A waiting job with ``u_w(t_w) = -inf`` (a log job with nothing placed) gains without bound; a
  victim whose utility is unbounded below without the replica (a log job's last one) never yields by the market.

*Weighed against a free slower pool* (issue 31). A job this plan starts in a slower pool ``S`` (a new pod, ``create``
on a node, not running) while a faster pool ``F`` is full is served after the waiting jobs, in the queue's order, as
if it waited for ``F`` with that pod given up: ``g_w = u_w(t_w - a_wS / N_w + a_wF / N_w) - u_w(t_w)``. A running
victim that finds free room now in another pool ``S'`` (:meth:`_Work._landing`; the room the given-up pod leaves
counts free) restarts there at once, in the same plan (its pod evicted, a replacement created on ``S'``), so its
loss is ``l_v = u_v(t_v) - u_v(t_v - a_vF / N_v + a_vS' / N_v)``: a log job's last replica may then yield, since it
moves rather than stops. The rule is the same ``(H - r_w) g_w - H l_v > r_v l_v`` with ``H`` bounded by the
waiting job's remaining time, the shape of the migration phase's rule (f); when it fails the new pod starts on
``S`` now. Every such swap raises ``Phi`` (``g_w > l_v``), so the no-oscillation argument below holds for it; each
victim counts in the budgets. When several victims of one claim land, the room is re-checked in turn; a victim that
finds none left waits as after a plain preemption (with one-accelerator pods, one victim a claim, it does not arise).

Never a pod of a job with ``spec.preemptible: false``, nor a job the lifecycle holds, nor a pod this plan already
removes, resizes or holds (NotReady node, disrupted pool, churn-deferred), nor a pod that has not started. The victims
of one claim are on one node: the fewest running pods (lowest priority, smallest loss, most recently started first)
that free, with the node's free room, the waiting pod's whole request vector (and a slot under the degree limit, and
room under ``spec.capacity``). Each victim is removed through the existing removal path
(:func:`walras.planner.reconcile.removal`: ``evict``, the Eviction API, so PodDisruptionBudgets hold; never a plain
delete), and the waiting job gets a *claim*: a pod created without a node, whose plan names the node it waits for
(:func:`claim_reason`). Later plans reserve that node for it first (:func:`claimed_nodes`, read by the rounds'
placement as a pending pod's previous node), keep it while its victims leave, and ask again for an eviction a
PodDisruptionBudget refused (the same victims, not counted twice in the budgets).

Pods this plan only planned (``create`` on a node, not running yet) may yield too, first, by the same rules with
no restart on either side (the ``Market`` rule is then ``g_w > l_v``): the waiting job's pod takes the node at once,
when it leaves none of the room the dropped pods held idle, and a dropped pod goes where its job still finds room
now. So the placement this plan makes admits no swap the next plan would preempt for (the integral fill's search
route is greedy; without this the plan after it could evict what this one created). For the same reason a running
pod that the previous plan placed while the waiting job was already there (in the previous plan's jobs) does not
yield to it in this plan: that plan priced them against each other. In ``fair`` and ``colocation``
pools the policy's own mechanism shares the capacity among equal priorities
(:data:`walras.planner.queue.MECHANISM_POLICIES`): there only a lower priority yields (the ``LowerPriority`` part of
``Market``), and this plan's pods are not swapped. Gangs (``spec.replicas.gang``, and elastic jobs whose
``spec.replicas.min`` is 2 or more) neither preempt nor yield: a claim is one replica, and taking one of a gang's
would leave it running partially.

Budgets, per pool: at most ``spec.preemption.maxPerPlan`` victims per plan (default 10 % of the pool's running
Walras pods, at least 1) and ``maxPerHour`` over the last hour (default 3 times that; counted from
``PoolPlan.preemptions`` of the previous plan, which needs ``PlanOptions.now``; without a clock only the per-plan
budget applies).

*No oscillation.* Under ``Market`` among equal priorities every preemption raises ``Phi`` by a positive amount and
the victim may take nothing back from its preemptor unless ``Phi`` would rise again, which the reverse of a move that
raised it cannot; a higher-priority job is never a victim of a lower one. So a chain of preemptions ends, and a plan
of the unchanged cluster after it preempts nothing more (tests/test_preemption_properties.py).

*Cost* (issue 33: 5,000 nodes, 1,000 jobs, ~1,300 claims a plan, nearly all finding no victim). Per pool, the
holders' side of the ``Market`` rule is a table of arrays (:class:`.queue.HolderSide`: each holder's utility with
and without one replica, landed or not, its restart cost), kept from claim to claim and computed again only for the
rows whose inputs changed (every change stamps the job rows and pools it touches, :meth:`_Work._mark`; a landing
reads only which pools have room, so it is stale only where a pool's room turns from none to some or back). A claim
is first bounded by the pool's cheapest holders (:meth:`_HolderTable.floor`): where even they cannot yield, it has
no victim by the market. Else every holder is judged at once (:func:`.queue.market_mask`, the rule's arithmetic with
a margin in the holders' favour), and only those kept are weighed one by one as above. Both shortcuts only leave
out holders the rule refuses (tests/test_preemption_speed.py), so the plan is the per-holder loop's.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from walras.planner.capacity import EPS, NodeTable
from walras.planner.cluster import Pod, pod_vector
from walras.planner.integral import utility_arrays
from walras.planner.model import ObjectKey, PlanEvent, PodPlan
from walras.planner.quantity import format_quantity, parse_quantity
from walras.planner.queue import (
    CLAIM,
    MECHANISM_POLICIES,
    HolderSide,
    Valuation,
    claim_reason,
    claimed_nodes,
    gang,
    market_mask,
    may_yield,
    queue_key,
    waiting_side,
    yields,
)
from walras.planner.reconcile import new_pod_name, pod_base, removal
from walras.planner.results import Actions, JobInfo, Observed, Outcome, PlanContext
from walras.planner.spec import PoolSpec, restart_cost

__all__ = ["HOUR", "PASSES", "Preempted", "budgets", "preempt"]

#: The per-hour budget's window (seconds).
HOUR = 3600.0
#: Passes over the queue in one plan (a pass that changes nothing ends them).
PASSES = 8





@dataclass(frozen=True)
class Preempted:
    """What the preemption phase returns: the pods preempted per victim job, the claims made per waiting job, the
    ``Preempted``/``Preempting`` events, the actions after them, and per pool the preemption times of the last hour
    (for the next plan's ``maxPerHour``)."""

    preempted: Mapping[ObjectKey, int]
    claims: Mapping[ObjectKey, int]
    events: tuple[PlanEvent, ...]
    actions: Actions
    outcome: Outcome
    history: Mapping[str, tuple[float, ...]]


def budgets(spec: PoolSpec, running: int) -> tuple[int, int]:
    """A pool's (per plan, per hour) preemption budgets (module docstring): the explicit values, else 10 % of its
    ``running`` Walras pods (at least 1) and 3 times that."""
    default = max(1, int(0.1 * running))
    rules = spec.preemption
    per_plan = default if rules.max_per_plan is None else rules.max_per_plan
    per_hour = 3 * default if rules.max_per_hour is None else rules.max_per_hour
    return per_plan, per_hour


def preempt(ctx: PlanContext, observed: Observed, outcome: Outcome, actions: Actions, *,
            held: Collection[ObjectKey] = ()) -> Preempted:
    """The preemptions of the module docstring; ``held``: the jobs the lifecycle holds (never preempted, never
    served). Passes over the queue until a pass changes nothing (at most :data:`PASSES`). Returns new actions and
    outcome where something changed, else ``actions`` and ``outcome`` themselves."""
    objects, now = ctx.objects, ctx.options.now
    pools, jobs = objects.pools, objects.jobs
    n, m = len(jobs), len(pools)
    history = _history(ctx, now)
    if not n or not m or all(p.spec.preemption.rule == "Never" for p in pools):
        return Preempted({}, {}, (), actions, outcome, history)
    previous = claimed_nodes(ctx.previous)
    a = np.zeros((n, m))
    for i, info in enumerate(jobs):
        for j in np.flatnonzero(info.pools).tolist():
            a[i, j] = info.spec.throughput.get(pools[j].name, 0.0)
    work = _Work(ctx, observed, outcome, actions, held, a)
    renewed: list[tuple[int, PodPlan, str]] = []  # (row, pending pod's plan, its claim reason) carried forward
    for i in range(n):
        if not any(observed.pending[i]):
            continue
        plans_by_name = {p.name: p for p in actions.pods.get(jobs[i].key, [])}
        for j in range(m):
            for pod in observed.pending[i][j]:
                plan = plans_by_name.get(pod.name)
                if plan is not None and plan.node is None and plan.action == "keep":
                    work.claimed[i, j] += 1
                    claim = previous.get(pod.key)
                    if claim is not None:
                        renewed.append((i, plan, claim_reason(*claim)))
    for i, plan, reason in renewed:
        work.renew(i, plan, reason)
    running_in = observed.counts("running").sum(axis=0).tolist()
    caps = []
    for j, pool in enumerate(pools):
        per_plan, per_hour = budgets(pool.spec, running_in[j])
        used_hour = len(history.get(pool.name, ()))
        caps.append(min(per_plan, max(per_hour - used_hour, 0)) if now is not None else per_plan)
    spent = [0] * m
    for _ in range(PASSES):
        changed = False
        wants = work.wanting()
        waiting = [i for i in np.flatnonzero(wants > 0).tolist() if jobs[i].key not in held
                   and jobs[i].spec.replicas > 0 and not gang(jobs[i]) and (a[i] > 0).any()]
        order = sorted(waiting, key=lambda i: queue_key(
            jobs[i].job.priority, jobs[i].spec.weight, _bids(work.utility, i, a[i], jobs[i]), jobs[i].job.created,
            *jobs[i].key))
        for i in order:
            for j in work._pools_of(i):
                if pools[j].spec.preemption.rule == "Never":
                    continue
                while work.wants(i) > 0:
                    got = work.claim(i, j, caps[j] - spent[j])
                    if got is None:
                        break
                    spent[j] += got
                    changed = True
        # jobs this plan starts in a slower pool than one that is full: the new pod is weighed against a claim there
        upgrading = [i for i in work.creating() if jobs[i].key not in held and not gang(jobs[i])
                     and work.slower(i, -1) is not None]
        for i in sorted(upgrading, key=lambda i: queue_key(
                jobs[i].job.priority, jobs[i].spec.weight, _bids(work.utility, i, a[i], jobs[i]),
                jobs[i].job.created, *jobs[i].key)):
            for j in work._pools_of(i):
                if pools[j].spec.preemption.rule == "Never":
                    continue
                while (gives := work.slower(i, j)) is not None:
                    got = work.claim(i, j, caps[j] - spent[j], gives=gives)
                    if got is None:
                        break
                    spent[j] += got
                    changed = True
        if not changed:
            break
    for j, pool in enumerate(pools):
        if spent[j] and now is not None:
            history[pool.name] = (*history.get(pool.name, ()), *([now] * spent[j]))
    if not work.changed:
        return Preempted({}, {}, tuple(work.events), actions, outcome, history)
    return Preempted(dict(work.preempted), dict(work.claims), tuple(work.events), work.actions, work.outcome,
                     history)


def _history(ctx: PlanContext, now: float | None) -> dict[str, tuple[float, ...]]:
    """Per pool, the preemption times of the previous plan within the last hour of ``now`` (empty without a clock)."""
    previous = ctx.previous
    if now is None:
        return {}
    reported = {p.name: p.preemptions for p in ctx.cluster.pools}  # the status, after a restart
    out: dict[str, tuple[float, ...]] = {}
    for pool in ctx.objects.pools:
        old = previous.pools.get(pool.name) if previous is not None else None
        times = old.preemptions if old is not None else reported.get(pool.name, ())
        kept = tuple(s for s in times if now - s < HOUR)
        if kept:
            out[pool.name] = kept
    return out


def _bids(utility: Valuation, i: int, a: np.ndarray, info: JobInfo) -> list[float | None]:
    """A waiting job's per-unit bids (:mod:`.queue`): the slope of its utility at its throughput times
    ``a_ij / (N_i d_i)``, by the finite difference of one replica, ``(u(t + a_ij/N_i) - u(t)) / d_i`` (the fill's
    valuation of a starved job; None: unbounded)."""
    spec = info.spec
    big = max(spec.replicas, 1)
    t = float(utility.t[i])
    out: list[float | None] = []
    for aj in a[a > 0].tolist():
        slope = utility.value(i, t + aj / big) - utility.value(i, t)
        out.append(slope / max(spec.demand, 1e-300) if math.isfinite(slope) else None)
    return out


def _fits(vec: np.ndarray, limit: int | None, room: tuple[np.ndarray, int]) -> bool:
    """Whether a pod of request vector ``vec`` fits a node's free ``room`` (vector, Walras pods) under the degree
    ``limit``."""
    free, count = room
    return bool(np.all(free >= vec - 1e-9)) and (limit is None or count < limit)


@dataclass(frozen=True)
class _HolderTable:
    """Pool j's holders at one ``version`` of the plan (:meth:`_Work._holder_table`): their job ``rows`` (ascending),
    ``priority`` and, in a ``Market`` pool outside the mechanism pools, their side of the rule (None elsewhere);
    ``floors`` and ``lowers`` memoise :meth:`floor` and :meth:`lower`."""

    version: int
    rows: np.ndarray
    priority: np.ndarray
    market: HolderSide | None
    floors: dict[tuple[float, int], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    lowers: dict[int, tuple[int, int]] = field(default_factory=dict)

    def lower(self, priority: int, row: int) -> bool:
        """Whether a holder other than row ``row`` has a priority below ``priority`` (memoised per priority: the
        count of such holders and the first)."""
        got = self.lowers.get(priority)
        if got is None:
            below = self.rows[self.priority < priority]
            got = self.lowers[priority] = (int(below.size), int(below[0]) if below.size else -1)
        count, first = got
        return bool(count > 1 or (count == 1 and first != row))

    def floor(self, horizon: float, priority: int, row: int) -> tuple[float, float]:
        """The smallest cost ``c_v`` a waiting job of ``priority`` at row ``row`` must beat under the ``Market``
        rule with horizon ``H`` among the holders of the same priority other than ``row``, for a running pod
        (``c_v = (H + r_v) l_v``, its landing counted) and for a planned one (``c_v = H l_v``, nothing restarts):
        the rule holds for holder v only where ``(H - r_w) g_w`` (``H g_w``) exceeds ``c_v`` (:func:`.queue.
        market_gain`), inf where no holder is eligible. Memoised per (``H``, priority): the two smallest of each,
        so the waiting job's own row is left out."""
        key = (horizon, priority)
        got = self.floors.get(key)
        if got is None:
            side = self.market
            assert side is not None
            same = self.priority == priority
            with np.errstate(invalid="ignore"):
                fin = np.isfinite(side.v0)
                run = same & side.runs & fin & np.isfinite(side.v1l)
                plan = same & side.planned & fin & np.isfinite(side.v1p)
                run_cost = (horizon + side.r_v) * (side.v0 - side.v1l)
                plan_cost = horizon * (side.v0 - side.v1p)
            got = self.floors[key] = (_two_smallest(run_cost, run, self.rows),
                                      _two_smallest(plan_cost, plan, self.rows))
        run_floor, plan_floor = got
        return (float(run_floor[1, 1] if run_floor[0, 0] == row else run_floor[1, 0]),
                float(plan_floor[1, 1] if plan_floor[0, 0] == row else plan_floor[1, 0]))


def _two_smallest(cost: np.ndarray, ok: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The two smallest of ``cost`` where ``ok``, as a (2, 2) array: their rows (-1 where missing) and values (inf
    where missing)."""
    values = cost[ok]
    order = np.argsort(values, kind="stable")[:2]
    out = np.array([[-1.0, -1.0], [math.inf, math.inf]])
    out[0, :order.size] = rows[ok][order]
    out[1, :order.size] = values[order]
    return out


#: The relative margin of :func:`_may_gain`: far above :data:`.queue.MARGIN` and the rounding of the few operations
#: behind either, so a claim it rules out is one whose :func:`.queue.market_mask` keeps no holder.
_BOUND_MARGIN = 1e-6


def _may_gain(waiting: tuple[float, float, float, float], floors: tuple[float, float]) -> bool:
    """Whether some holder may yield to the waiting job ``(w0, w1, H, r_w)`` (:func:`.queue.waiting_side`) under
    the ``Market`` rule, given the smallest costs it must beat (:meth:`_HolderTable.floor`: running, planned):
    ``(H - r_w) g_w > c_v`` for the running floor or ``H g_w > c_v`` for the planned one, each loosened by
    :data:`_BOUND_MARGIN` relative. ``f(c) = G - c + m (|G| + |c|)`` falls with ``c``, so where it is not positive
    at the floor it is not for any holder, and the holders' rule (:func:`.queue.market_gain`, by
    :func:`.queue.market_mask`) refuses every one: the claim finds no victim by the market."""
    w0, w1, horizon, r_w = waiting
    if not math.isfinite(w1):
        return False  # market_gain: no gain can be counted
    if not math.isfinite(w0):
        return True  # a starved job's first replica: an unbounded gain, judged holder by holder
    gain = w1 - w0
    for big, floor in (((horizon - r_w) * gain, floors[0]), (horizon * gain, floors[1])):
        if math.isfinite(floor) and big - floor > -_BOUND_MARGIN * (abs(big) + abs(floor)):
            return True
    return False


@dataclass
class _Victim:
    """A pod that may yield: ``running`` (evicted; it restarts) or a pod this plan only planned (``create``:
    dropped, nothing restarts), its job row, its order key, its request vector and why it may yield."""

    key: tuple[Any, ...]
    row: int
    name: str
    node: int
    vector: np.ndarray
    running: bool
    why: str
    pod: Pod | None = None
    plan: PodPlan | None = None
    lands: bool = False  # a running victim that restarts at once in free room of another pool


class _Work:
    """The phase's working state: the actions and node table (copied on the first change), what this plan's
    victims will free per node once gone, the placed and claimed replicas and throughputs, the counts and events."""

    def __init__(self, ctx: PlanContext, observed: Observed, outcome: Outcome, actions: Actions,
                 held: Collection[ObjectKey], a: np.ndarray) -> None:
        self.ctx, self.observed, self.held, self.a = ctx, observed, held, a
        self.outcome, self.actions = outcome, actions
        self.changed = False
        jobs, pools = ctx.objects.jobs, ctx.objects.pools
        n, m = len(jobs), len(pools)
        self.pool_index = {p.name: j for j, p in enumerate(pools)}
        self.placed = np.zeros((n, m), dtype=np.int64)
        for v, info in enumerate(jobs):
            for name, count in actions.placed.get(info.key, {}).items():
                if name in self.pool_index:
                    self.placed[v, self.pool_index[name]] = count
        self.claimed = np.zeros((n, m), dtype=np.int64)
        big = np.array([max(info.spec.replicas, 1) for info in jobs], dtype=np.float64)
        self.utility = Valuation(jobs, a, (a * self.placed).sum(axis=1) / big if n else np.zeros(0),
                                 utility_arrays([info.spec.utility for info in jobs]))
        self.taken: set[tuple[str, str]] = set()  # pods chosen as victims in this plan
        self.freed = np.zeros_like(outcome.table.used)  # per node, what this plan's evicted victims will free
        self.slots = np.zeros(len(outcome.table.names), dtype=np.int64)
        self.preempted: defaultdict[ObjectKey, int] = defaultdict(int)
        self.claims: defaultdict[ObjectKey, int] = defaultdict(int)
        self.events: list[PlanEvent] = []
        self._recent: set[tuple[str, str]] | None = None
        self._creating: np.ndarray | None = None
        # memos of what :meth:`_victims` recomputes per claim, each valid while what it reads is unchanged: every
        # change of a job row's throughput, pods or placed counts stamps the row, every change of a node's room or a
        # pool's placed counts stamps the pools the node is in (:meth:`_mark`, ``version`` counts the changes), and
        # an entry recorded at a version is valid while the stamps it depends on are not later
        self.version = 0
        self._row_stamp = np.zeros(n, dtype=np.int64)
        self._pool_stamp = np.zeros(m, dtype=np.int64)
        self._row_of = {info.key: v for v, info in enumerate(jobs)}
        self._priority = np.array([info.job.priority for info in jobs], dtype=np.int64)
        # the rows that may yield at all (not held, preemptible, no gang; fixed for the plan)
        self._yieldable = np.array([info.key not in held and may_yield(info) for info in jobs], dtype=bool)
        self._rooms_version = -1
        # per pool, the nodes it holds (members or usable): a change on a node stamps these pools
        self._member = np.zeros((m, len(outcome.table.names)), dtype=bool)
        for j, pool in enumerate(pools):
            self._member[j, pool.members] = True
            self._member[j, pool.usable] = True
        self._static: dict[tuple[int, int], list[tuple[Pod, ObjectKey, bool]]] = {}
        self._static_pools: dict[int, list[int]] = {}
        self._static_landing: dict[int, list[tuple[int, tuple[Any, ...], np.ndarray, np.ndarray]]] = {}
        self._static_vectors: dict[tuple[Any, ...], np.ndarray] = {}
        self._memo: dict[tuple[Any, ...], tuple[int, Any]] = {}
        self._tables: dict[tuple[Any, ...], _HolderTable] = {}
        # per pool, the version at which one of its room answers (:meth:`_room`) last turned from None to a node or
        # back (what a landing reads), and the version at which they were last checked (:meth:`_rooms`)
        self._room_stamp = np.zeros(m, dtype=np.int64)
        self._rooms_checked = np.zeros(m, dtype=np.int64)
        self._room_args: defaultdict[int, dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray, Any]]] = \
            defaultdict(dict)

    def creating(self) -> list[int]:
        """The job rows that may have a new pod of this plan on a node (``create``, not existing), in row order: those
        with one when the phase began, and those changed since (:meth:`_mark`); :meth:`slower` is None elsewhere."""
        if self._creating is None:
            self._creating = np.array([any(p.action == "create" and not p.exists and p.node is not None
                                           for p in self.actions.pods.get(info.key, ()))
                                       for info in self.ctx.objects.jobs], dtype=bool)
        return np.flatnonzero(self._creating | (self._row_stamp > 0)).tolist()

    def wanting(self) -> np.ndarray:
        """:meth:`wants` of every job row."""
        replicas = np.array([info.spec.replicas for info in self.ctx.objects.jobs], dtype=np.int64)
        return replicas - self.placed.sum(axis=1) - self.claimed.sum(axis=1)

    def wants(self, i: int) -> int:
        """Replicas job row i still waits for (beyond its placed and claimed ones)."""
        return self.ctx.objects.jobs[i].spec.replicas - int(self.placed[i].sum() + self.claimed[i].sum())

    def _mark(self, rows: Iterable[int] = (), nodes: Iterable[int] = (), pools: Iterable[int] = ()) -> None:
        """Record a change (after it is made) of the job rows ``rows`` (throughput, pods, placed counts), the room of
        the nodes ``nodes`` and the placed counts of the pools ``pools``: the memos that read them are stale."""
        self.version += 1
        version = self.version
        for v in rows:
            self._row_stamp[v] = version
        for k in nodes:
            self._pool_stamp[self._member[:, k]] = version
        for j in pools:
            self._pool_stamp[j] = version

    def _own(self) -> Actions:
        if not self.changed:
            src = self.actions
            placed: defaultdict[ObjectKey, dict[str, int]] = defaultdict(lambda: defaultdict(int))
            placed.update((k, defaultdict(int, v)) for k, v in src.placed.items())
            unplaced: defaultdict[ObjectKey, dict[str, tuple[int, str]]] = defaultdict(dict)
            unplaced.update((k, dict(v)) for k, v in src.unplaced.items())
            self.actions = Actions(defaultdict(list, ((k, list(v)) for k, v in src.pods.items())), src.deferred,
                                   placed, unplaced)
            table = self.outcome.table
            self.outcome = replace(self.outcome, table=NodeTable(
                table.nodes, table.names, table.index, table.resources, table.column, table.alloc,
                table.used.copy(), table.usable), walras_count=self.outcome.walras_count.copy())
            self.changed = True
        return self.actions

    def _swap(self, key: ObjectKey, old: PodPlan, new: PodPlan | None) -> None:
        plans = self._own().pods[key]
        at = next(q for q, p in enumerate(plans) if p is old)
        if new is None:
            del plans[at]
        else:
            plans[at] = new
        self._mark(rows=(self._row_of[key],))

    def _plan_of(self, v: int, name: str) -> PodPlan | None:
        for p in self.actions.pods.get(self.ctx.objects.jobs[v].key, []):
            if p.name == name:
                return p
        return None

    def _count(self, key: ObjectKey, pool: str, delta: int) -> None:
        placed = self._own().placed[key]
        placed[pool] = placed.get(pool, 0) + delta
        if placed[pool] <= 0:
            del placed[pool]
        self._mark(rows=(self._row_of[key],), pools=(self.pool_index[pool],))

    def renew(self, i: int, plan: PodPlan, reason: str) -> None:
        """Carry a claim pod's reason forward, and ask again for the evictions of its victims still running."""
        key = self.ctx.objects.jobs[i].key
        self._swap(key, plan, replace(plan, reason=f"waits for preempted pods {reason}"))
        match = CLAIM.search(reason)
        if match is None:
            return
        names = set(match.group(2).split(","))
        table = self.outcome.table
        for v, info in enumerate(self.ctx.objects.jobs):
            for j, row in enumerate(self.observed.running[v]):
                for pod in row:
                    if pod.name not in names or pod.node != match.group(1) or pod.key in self.taken:
                        continue
                    current = self._plan_of(v, pod.name)
                    if current is not None and current.action == "keep" and current.exists:
                        self._swap(info.key, current, replace(current, action=removal(pod, table), grace=None,
                                                              reason=f"preempted for {key[0]}/{key[1]} (eviction "
                                                              "asked again)"))
                        self.taken.add(pod.key)
                        self._count(info.key, self.ctx.objects.pools[j].name, -1)

    def slower(self, i: int, j: int) -> PodPlan | None:
        """Job row i's new pod of this plan (``create`` on a node, not running) in the pool of lowest throughput
        below ``a_ij`` (any pool it runs in when ``j`` is -1) that is not a mechanism pool, or None: the pod it
        gives up to claim pool j (module docstring, "weighed against a free slower pool"); memoised while row i is
        unchanged (:meth:`_mark`)."""
        got = self._memo.get(("slower", i, j))
        if got is None or self._row_stamp[i] > got[0]:
            got = self._memo[("slower", i, j)] = (self.version, self._slower(i, j))
        return got[1]

    def _slower(self, i: int, j: int) -> PodPlan | None:
        """:meth:`slower`, computed."""
        pools = self.ctx.objects.pools
        top = float(self.a[i].max()) if j < 0 else float(self.a[i, j])
        best: tuple[float, str, PodPlan] | None = None
        for p in self.actions.pods.get(self.ctx.objects.jobs[i].key, []):
            if p.action != "create" or p.exists or p.node is None or p.pool not in self.pool_index:
                continue
            s = self.pool_index[p.pool]
            if s == j or pools[s].spec.policy in MECHANISM_POLICIES or self.a[i, s] >= top:
                continue
            if best is None or (float(self.a[i, s]), p.name) < best[:2]:
                best = (float(self.a[i, s]), p.name, p)
        return None if best is None else best[2]

    def _given(self, i: int, plan: PodPlan) -> tuple[float, int, np.ndarray]:
        """(throughput step ``a_iS / N_i``, node index, request vector) of job row i's new pod ``plan``."""
        info = self.ctx.objects.jobs[i]
        table = self.outcome.table
        return (float(self.a[i, self.pool_index[plan.pool]]) / max(info.spec.replicas, 1),
                table.index[plan.node],  # type: ignore[index]
                table.vector({k: parse_quantity(q) for k, q in plan.requests.items()}))

    def _victims(self, i: int, j: int, gives: PodPlan | None = None) -> list[_Victim]:
        """The pods of pool j that may yield to job row i, in the order they are taken (this plan's planned pods
        first, as nothing restarts; then lowest priority, smallest loss, most recently started, name). ``gives``:
        job i's new pod in a slower pool that it gives up for this one (its room counts free for the victims'
        landing). Only the holders :meth:`_candidates` leaves are weighed one by one."""
        ctx = self.ctx
        jobs = ctx.objects.jobs
        table = self.outcome.table
        out: list[_Victim] = []
        previous = ctx.previous
        # a pod the previous plan placed while job i already waited was priced against it then (module docstring)
        waited = previous is not None and jobs[i].key in previous.jobs
        step, bonus = 0.0, None
        if gives is not None:
            step, k_given, vec_given = self._given(i, gives)
            bonus = (k_given, vec_given)
        for v in self._candidates(i, j, step, bonus):
            info = jobs[v]
            loss, planned = self._loss_planned(v, j)
            if planned:
                why = yields(ctx, (i, v, j), self.utility, self.a, False, gives=step)
                if why is not None:
                    out.extend(_Victim((0, info.job.priority, loss, 0.0, name), v, name, k, vec, False, why, plan=plan)
                               for name, k, vec, plan in self._planned_parts(v, j, planned))
            evictable = self._evictable(v, j)
            pods = [pod for pod, key, recent in evictable if key not in self.taken and not (waited and recent)] if (
                self.taken or waited) else [pod for pod, _, _ in evictable]
            if not pods:
                continue
            lands = self._lands(v, j, bonus)
            why = yields(ctx, (i, v, j), self.utility, self.a, True, gives=step, lands=lands)
            if why is None:
                continue
            for pod in pods:
                plan = self._plan_of(v, pod.name)
                if plan is None or plan.action != "keep" or plan.reason or not plan.exists:
                    continue  # removed, resized or held (NotReady, disrupted, deferred) by an earlier phase
                started = pod.started if pod.started is not None else -math.inf
                out.append(_Victim((1, info.job.priority, loss, -started, pod.name), v, pod.name,
                                   table.index[pod.node], table.vector(pod.requests), True, why,  # type: ignore[index]
                                   pod=pod, plan=plan, lands=lands is not None))
        out.sort(key=lambda victim: victim.key)
        return out

    def _planned_parts(self, v: int, j: int, planned: list[PodPlan]) -> list[tuple[str, int, np.ndarray, PodPlan]]:
        """Per planned pod of job row v in pool j (``planned``, :meth:`_loss_planned`'s list): its name, node,
        request vector and plan; memoised with that list."""
        got = self._memo.get(("parts", v, j))
        if got is not None and got[1][0] is planned:
            return got[1][1]
        info, priced = self.ctx.objects.jobs[v], self.ctx.objects.pools[j].spec.resource
        table = self.outcome.table
        parts = []
        for p in planned:
            amount = parse_quantity(p.requests.get(priced, "0")) if priced in p.requests else info.spec.demand
            parts.append((p.name, table.index[p.node], self._vector(v, priced, amount), p))  # type: ignore[index]
        self._memo[("parts", v, j)] = (self.version, (planned, parts))
        return parts

    def _candidates(self, i: int, j: int, step: float, bonus: tuple[int, np.ndarray] | None) -> list[int]:
        """The holders of pool j (:meth:`_holders`, in their order) that :func:`.queue.yields` may let yield to job
        row i: every lower priority; an equal one only under the ``Market`` rule outside the mechanism pools, and
        only where the rule's inequality holds for its planned pods (no restart) or its running ones (with its
        landing, :meth:`_lands`), judged for all holders at once on arrays (:meth:`_holder_table`) by the same
        arithmetic as :func:`.queue.market_gain`, with a margin of 1e-9 relative in the holders' favour: a holder
        left out is one ``yields`` refuses; those kept are weighed again one by one. Where no holder but i has a
        lower priority and the pool's cheapest holders cannot yield (:meth:`_HolderTable.floor`, :func:`_may_gain`),
        none is judged."""
        pool, w = self.ctx.objects.pools[j], self.ctx.objects.jobs[i]
        held = self._holder_table(j, bonus)
        lower = held.lower(w.job.priority, i)
        if held.market is not None:
            waiting = waiting_side(self.utility, i, w.spec, float(self.a[i, j]), step, pool.spec)
            if not lower and not _may_gain(waiting, held.floor(waiting[2], w.job.priority, i)):
                return []  # no lower priority, and no holder of the same one can yield by the market
            keep = (held.priority < w.job.priority) | (
                (held.priority == w.job.priority) & market_mask(waiting, held.market))
        elif not lower:
            return []
        else:
            keep = held.priority < w.job.priority
        keep &= held.rows != i
        return held.rows[keep].tolist()

    def _holder_table(self, j: int, bonus: tuple[int, np.ndarray] | None) -> _HolderTable:
        """Pool j's holders (:meth:`_holders`) as arrays (:class:`_HolderTable`) at the throughputs and landings of
        now: the table of an earlier claim with the rows whose inputs changed since (:meth:`_mark`: the row, or a
        pool it may land in other than j, :meth:`_rooms`) computed again."""
        key = ("table", j) if bonus is None else ("table", j, bonus[0], bonus[1].tobytes())
        old = self._tables.get(key)
        if old is not None and old.version == self.version:
            return old
        if bonus is not None:
            got = self._tables[key] = self._bonus_table(j, bonus)
            return got
        pool = self.ctx.objects.pools[j]
        rows = np.array(self._holders(j), dtype=np.int64)
        priority = self._priority[rows]
        if pool.spec.preemption.rule != "Market" or pool.spec.policy in MECHANISM_POLICIES:
            got = self._tables[key] = _HolderTable(self.version, rows, priority, None)
            return got
        if old is None or old.market is None:
            stale, at = np.ones(rows.size, dtype=bool), np.zeros(rows.size, dtype=np.int64)
        else:
            at = np.minimum(np.searchsorted(old.rows, rows), max(old.rows.size - 1, 0))
            stale = (old.rows[at] != rows) if old.rows.size else np.ones(rows.size, dtype=bool)
            landings = np.where(self.a[rows] > 0, self._rooms(), 0)
            landings[:, j] = 0
            # a row's landing counts only where it has running pods to evict (``runs``, fixed for the plan)
            stale |= (self._row_stamp[rows] > old.version) | (
                old.market.runs[at] & (landings.max(axis=1, initial=0) > old.version))
        if old is None or old.market is None or not old.rows.size:
            side = HolderSide(*(np.empty(rows.size) for _ in range(4)), *(np.zeros(rows.size, dtype=bool)
                                                                           for _ in range(2)))
        else:
            was = old.market
            side = HolderSide(was.v0[at], was.v1p[at], was.v1l[at], was.r_v[at], was.planned[at], was.runs[at])
        self._side_rows(j, bonus, rows, stale, side)
        got = self._tables[key] = _HolderTable(self.version, rows, priority, side)
        return got

    def _bonus_table(self, j: int, bonus: tuple[int, np.ndarray]) -> _HolderTable:
        """Pool j's holder table with the room of a pod the waiting job gives up (``bonus``: node, vector) counted
        free for the landings: the table without it (:meth:`_holder_table`), the landed utility ``v1l`` computed
        again only for the rows with running pods that may land in a pool holding that node (room only grows
        there, and nowhere else changes)."""
        base = self._holder_table(j, None)
        side = base.market
        if side is None:
            return base
        pools = [s for s in np.flatnonzero(self._member[:, bonus[0]]).tolist() if s != j]
        rows = base.rows
        near = side.runs & (self.a[rows][:, pools] > 0).any(axis=1) if pools else np.zeros(rows.size, dtype=bool)
        v1l = side.v1l.copy()
        jobs, utility = self.ctx.objects.jobs, self.utility
        for q in np.flatnonzero(near).tolist():
            v = int(rows[q])
            lands = self._lands(v, j, bonus)
            t_v = float(utility.t[v])
            drop = self.a[v, j] / max(jobs[v].spec.replicas, 1)
            v1l[q] = utility.value(v, t_v - drop + (lands[1] if lands is not None else 0.0))
        return _HolderTable(self.version, rows, base.priority, replace(side, v1l=v1l))

    def _side_rows(self, j: int, bonus: tuple[int, np.ndarray] | None, rows: np.ndarray, stale: np.ndarray,
                   side: HolderSide) -> None:
        """Fill the ``stale`` rows of ``side`` (:class:`HolderSide`) for pool j at the throughputs and landings of
        now, each value as :func:`.queue.yields` computes it."""
        jobs, utility = self.ctx.objects.jobs, self.utility
        for q in np.flatnonzero(stale).tolist():
            v = int(rows[q])
            spec = jobs[v].spec
            t_v = float(utility.t[v])
            drop = self.a[v, j] / max(spec.replicas, 1)
            # a holder with no pod the Eviction API may remove yields only its planned pods: nothing lands
            runs = self._runs(v, j)
            lands = self._lands(v, j, bonus) if runs else None
            side.v0[q] = utility.value(v, t_v)
            side.v1p[q] = utility.value(v, t_v - drop + 0.0)
            side.v1l[q] = utility.value(v, t_v - drop + (lands[1] if lands is not None else 0.0))
            side.r_v[q] = utility.restart(v, spec)
            side.planned[q] = bool(self._loss_planned(v, j)[1])
            side.runs[q] = runs

    def _lands(self, v: int, j: int, bonus: tuple[int, np.ndarray] | None) -> tuple[str, float] | None:
        """Where job row v's replica of pool j restarts at once (:meth:`_landing`) as :func:`.queue.yields` takes
        it: (pool name, ``a_vS' / N_v``), or None (memoised while the room of v's other pools is, :meth:`_rooms`)."""
        rooms = self._rooms()
        if bonus is None:  # the first two pools with room, whatever pool is left out: one memo for all of v's pools
            got = self._memo.get(("landings", v))
            if got is None or any(rooms[s] > got[0] for s in self._pools_of(v)):
                got = self._memo[("landings", v)] = (self.version, self._open_pools(v))
            s = next((s for s in got[1] if s != j), None)
        else:
            key = ("landing", v, j, bonus[0], bonus[1].tobytes())
            got = self._memo.get(key)
            if got is None or any(rooms[s] > got[0] for s in self._pools_of(v) if s != j):
                landing = self._landing(v, j, bonus)
                got = self._memo[key] = (self.version, None if landing is None else landing[0])
            s = got[1]
        if s is None:
            return None
        return (self.ctx.objects.pools[s].name, float(self.a[v, s]) / max(self.ctx.objects.jobs[v].spec.replicas, 1))

    def _open_pools(self, v: int) -> tuple[int, ...]:
        """The first two of job row v's landing pools (:meth:`_landing_pools`, in their order) with room now for
        one of its replicas: :meth:`_landing` with any one pool left out lands in the first of them that is not
        that pool."""
        out: list[int] = []
        for j, key, vec, admitted in self._landing_pools(v):
            if self._room_of(j, key, (vec, admitted, None)) is not None:
                out.append(j)
                if len(out) == 2:
                    break
        return tuple(out)

    def _holders(self, j: int) -> list[int]:
        """The job rows with a replica placed in pool j that may yield at all (not held, preemptible, no gang),
        memoised while pool j's placed counts are unchanged."""
        key = ("holders", j)
        got = self._memo.get(key)
        if got is None or self._pool_stamp[j] > got[0]:
            got = self._memo[key] = (self.version,
                                     np.flatnonzero((self.placed[:, j] > 0) & self._yieldable).tolist())
        return got[1]

    def _loss_planned(self, v: int, j: int) -> tuple[float, list[PodPlan]]:
        """Job row v's loss of one replica in pool j, ``u_v(t_v) - u_v(t_v - a_vj / N_v)``, and its pods this plan
        only planned there (``create`` on a node, not existing; none in a mechanism pool), memoised while row v is
        unchanged."""
        key = ("loss", v, j)
        got = self._memo.get(key)
        if got is None or self._row_stamp[v] > got[0]:
            info, pool = self.ctx.objects.jobs[v], self.ctx.objects.pools[j]
            t_v = float(self.utility.t[v])
            loss = self.utility.value(v, t_v) - self.utility.value(v, t_v - self.a[v, j] / max(info.spec.replicas, 1))
            planned = [p for p in self.actions.pods.get(info.key, []) if p.action == "create" and not p.exists
                       and p.node is not None and p.pool == pool.name] if pool.spec.policy not in \
                MECHANISM_POLICIES else []
            got = self._memo[key] = (self.version, (loss, planned))
        return got[1]

    @property
    def recent(self) -> set[tuple[str, str]]:
        """The pods the previous plan created or bound (computed on first use)."""
        if self._recent is None:
            previous = self.ctx.previous
            self._recent = {(p.namespace, p.name) for p in previous.pods if p.action in ("create", "bind")} if (
                previous is not None) else set()
        return self._recent

    def _runs(self, v: int, j: int) -> bool:
        """Whether :meth:`_evictable` of job row v in pool j is not empty (its first pod found is enough)."""
        got = self._static.get((v, j))
        if got is not None:
            return bool(got)
        table = self.outcome.table
        return any(pod.node in table.index and pod.phase == "Running" and not pod.terminating
                   and removal(pod, table) == "evict" for pod in self.observed.running[v][j])

    def _evictable(self, v: int, j: int) -> list[tuple[Pod, ObjectKey, bool]]:
        """Job row v's running pods in pool j that the Eviction API may remove at all (on a known node, Running,
        not terminating, started), each with its key and whether the previous plan placed it (``recent``): fixed
        for the plan (the victims already taken are filtered by the caller)."""
        got = self._static.get((v, j))
        if got is None:
            table = self.outcome.table
            got = self._static[(v, j)] = [
                (pod, pod.key, pod.key in self.recent) for pod in self.observed.running[v][j]
                if pod.node in table.index and pod.phase == "Running" and not pod.terminating
                and removal(pod, table) == "evict"]
        return got

    def claim(self, i: int, j: int, budget: int, gives: PodPlan | None = None) -> int | None:
        """One replica for job row i in pool j: its victims on one node (at most ``budget`` running ones) dropped
        or evicted, and its pod created on the node (only planned pods yielded) or as a claim without a node; the
        running victims counted, or None when no node can be freed for it. ``gives``: the new pod of job i in a
        slower pool that this replica replaces (dropped when the claim is made)."""
        ctx = self.ctx
        info, pool = ctx.objects.jobs[i], ctx.objects.pools[j]
        victims = self._victims(i, j, gives)
        if not victims:
            return None
        table = self.outcome.table
        vec = table.vector(pod_vector(ctx.templates[i], info.spec, pool.spec.resource, info.spec.demand))
        by_node: defaultdict[int, list[_Victim]] = defaultdict(list)
        for victim in victims:
            by_node[victim.node].append(victim)
        c = table.column.get(pool.spec.resource)
        limit = pool.spec.degree_limit
        best: tuple[tuple[Any, ...], int, list[_Victim]] | None = None
        admitted = ctx.admitted[i]
        # nodes by their first victim: a node's rank is at least (0, 1, (its first victim's key,), k), so once the
        # best rank found is at most that, no later node can beat it
        for k, victims in sorted(by_node.items(), key=lambda item: (item[1][0].key, item[0])):
            if best is not None and (0, 1, (victims[0].key,), k) >= best[0]:
                break
            if not admitted[k] or not table.usable[k]:
                continue
            # now: the room free in this plan's reservations; later: with what this plan's evictions free once done
            now_free = table.alloc[k] - table.used[k]
            later_free = now_free + self.freed[k]
            now_count = int(self.outcome.walras_count[k])
            later_count = now_count - int(self.slots[k])
            chosen: list[_Victim] = []
            runs = 0

            for victim in victims:
                if _fits(vec, limit, (now_free, now_count) if runs == 0 else (later_free, later_count)):
                    break
                if victim.running and runs >= budget:
                    continue
                chosen.append(victim)
                runs += victim.running
                later_free = later_free + victim.vector
                later_count -= 1
                if not victim.running:
                    now_free = now_free + victim.vector
                    now_count -= 1
            if not chosen or not _fits(vec, limit, (now_free, now_count) if runs == 0 else (later_free, later_count)):
                continue
            dropped = sum((v.vector for v in chosen if not v.running), np.zeros_like(vec))
            if runs == 0 and np.any(dropped > vec + 1e-9):
                continue  # a swap of planned pods only when it leaves no room the dropped pods held idle
            if not self._worth(i, j, chosen, gives):
                continue  # the victims together lose more than the waiting job gains
            if pool.spec.capacity is not None and c is not None:
                used = float(table.used[pool.members, c].sum() - self.freed[pool.members, c].sum())
                if used - sum(float(v.vector[c]) for v in chosen) + vec[c] > pool.spec.capacity + 1e-9:
                    continue
            rank = (runs, len(chosen), tuple(v.key for v in chosen), k)
            if best is None or rank < best[0]:
                best = (rank, k, chosen)
        if best is None:
            return None
        _, k, chosen = best
        return self._apply(i, j, k, chosen, vec, gives)

    def _worth(self, i: int, j: int, chosen: list[_Victim], gives: PodPlan | None) -> bool:
        """The ``Market`` rule for a claim's victims together (module docstring): :func:`.queue.yields` judges each
        victim's one replica against the waiting job's next one, but a claim may take several (two one-GPU pods
        for one two-GPU replica), so the waiting job's gain must also beat their joint loss:
        ``(H - r_w) g_w > sum_v (H + r_v) L_v`` over the victims' jobs ``v`` (``g_w > sum_v L_v`` when no victim
        runs), ``L_v = u_v(t_v) - u_v(t_v - k_v a_vj / N_v)`` for the ``k_v`` replicas the claim takes from job v
        (a victim that restarts at once in another pool's free room, ``lands``, moves and is left out). Victims
        that yield by priority are not weighed (a higher priority preempts whatever the objective says). Without
        this, a plan after the integral fill's optimum evicted two replicas of one job for one of another although
        the pair's objective fell (the placement bench's re-plans of the applied plan)."""
        market = [v for v in chosen if v.why.startswith("market:") and not v.lands]
        if len(market) <= 1:
            return True  # one victim: its own rule was the claim's
        ctx, utility = self.ctx, self.utility
        jobs, pool = ctx.objects.jobs, ctx.objects.pools[j]
        w = jobs[i].spec
        step = self._given(i, gives)[0] if gives is not None else 0.0
        t_w = float(utility.t[i])
        after = t_w - step + float(self.a[i, j]) / max(w.replicas, 1)
        w0, w1 = utility.value(i, t_w), utility.value(i, after)
        runs = any(v.running for v in chosen)
        horizon = pool.spec.preemption.horizon
        if w.remaining_work is not None and after > 0:
            horizon = min(horizon, w.remaining_work / after)
        r_w = restart_cost(w) if runs else 0.0
        taken: defaultdict[int, int] = defaultdict(int)
        for victim in market:
            taken[victim.row] += 1
        cost = 0.0
        for v, k in taken.items():
            spec = jobs[v].spec
            t_v = float(utility.t[v])
            loss = utility.value(v, t_v) - utility.value(v, t_v - k * float(self.a[v, j]) / max(spec.replicas, 1))
            if not math.isfinite(loss):
                return False
            cost += (horizon + (restart_cost(spec) if runs else 0.0)) * loss
        if not math.isfinite(w1):
            return False
        if not math.isfinite(w0):
            return horizon > r_w  # a starved job's first replica: an unbounded gain
        return (horizon - r_w if runs else horizon) * (w1 - w0) > cost

    def _apply(self, i: int, j: int, k: int, chosen: list[_Victim], vec: np.ndarray,
               gives: PodPlan | None = None) -> int:
        ctx = self.ctx
        info, pool = ctx.objects.jobs[i], ctx.objects.pools[j]
        spec = info.spec
        actions = self._own()
        table = self.outcome.table
        node = table.names[k]
        runs = [v for v in chosen if v.running]
        if gives is not None:  # job i's new pod in the slower pool is not created: its room is free again
            step, k_given, vec_given = self._given(i, gives)
            self._swap(info.key, gives, None)
            table.used[k_given] -= vec_given
            self.outcome.walras_count[k_given] -= 1
            s = self.pool_index[gives.pool]
            self.placed[i, s] -= 1
            self._count(info.key, gives.pool, -1)
            self.utility.t[i] -= step
            self._mark(rows=(i,), nodes=(k_given,), pools=(s,))
            count, why = actions.unplaced[info.key].get(pool.name, (0, ""))
            actions.unplaced[info.key][pool.name] = (count + 1, why or "InsufficientCapacity")
        for victim in chosen:
            vinfo = ctx.objects.jobs[victim.row]
            assert victim.plan is not None
            self._count(vinfo.key, pool.name, -1)
            self.placed[victim.row, j] -= 1
            self.utility.t[victim.row] -= self.a[victim.row, j] / max(vinfo.spec.replicas, 1)
            self._mark(rows=(victim.row,), pools=(j,))
            if victim.running:
                assert victim.pod is not None
                self._swap(vinfo.key, victim.plan, replace(
                    victim.plan, action=removal(victim.pod, table), grace=None,
                    reason=f"preempted for {spec.namespace}/{spec.name} ({victim.why})"))
                self.taken.add(victim.pod.key)
                self.freed[k] += victim.vector
                self.slots[k] += 1
                self.preempted[vinfo.key] += 1
                self.events.append(PlanEvent(
                    "FungibleJob", vinfo.spec.namespace, vinfo.spec.name, "Warning", "Preempted",
                    f"Pod {victim.name} (node {node}, pool {pool.name!r}) is evicted for {spec.namespace}/{spec.name}: "
                    f"{victim.why}."))
            else:  # a pod this plan only planned: not created, its room given to job i now
                self._swap(vinfo.key, victim.plan, None)
                table.used[k] -= victim.vector
                self.outcome.walras_count[k] -= 1
                self._mark(rows=(victim.row,), nodes=(k,))
                count, why = actions.unplaced[vinfo.key].get(pool.name, (0, ""))
                actions.unplaced[vinfo.key][pool.name] = (count + 1, why or "InsufficientCapacity")
        self.utility.t[i] += self.a[i, j] / max(spec.replicas, 1)
        self._mark(rows=(i,))
        name = self._create(i, j, None if runs else k, vec)
        requests = {**spec.resource_text, pool.spec.resource: format_quantity(spec.demand)}
        if runs:
            self.freed[k] -= vec
            self.slots[k] -= 1
            self.claimed[i, j] += 1
            victims = [v.name for v in runs]
            actions.pods[info.key].append(PodPlan(spec.namespace, name, spec.name, pool.name, None, requests,
                                                  dict(requests), "create", False,
                                                  f"waits for preempted pods {claim_reason(node, victims)}"))
            self.claims[info.key] += 1
            self._mark(rows=(i,))
            self.events.append(PlanEvent("FungibleJob", spec.namespace, spec.name, "Normal", "Preempting",
                                         f"Pod {name} waits on node {node} (pool {pool.name!r}) while "
                                         f"{', '.join(victims)} leave."))
        else:
            self._unwait(info.key, pool.name)
        for victim in chosen:  # a planned pod that yielded, or a running one that moves, goes where its job still
            if not victim.running or victim.lands:  # finds room now, if anywhere
                self._elsewhere(victim.row, skip=j)
        return len(runs)

    def _create(self, i: int, j: int, k: int | None, vec: np.ndarray) -> str:
        """A new pod of job row i in pool j: on node k (reserved there, counted placed) or, with k None, a claim
        (not reserved); returns its name (the plan is appended by the caller for a claim)."""
        ctx = self.ctx
        info, pool = ctx.objects.jobs[i], ctx.objects.pools[j]
        spec = info.spec
        actions = self._own()
        table = self.outcome.table
        name, _ = new_pod_name(self.observed.taken(info.key), pod_base(spec.name, pool.name))
        if k is not None:
            requests = {**spec.resource_text, pool.spec.resource: format_quantity(spec.demand)}
            table.used[k] += vec
            self.outcome.walras_count[k] += 1
            self.placed[i, j] += 1
            self._count(info.key, pool.name, +1)
            actions.pods[info.key].append(PodPlan(spec.namespace, name, spec.name, pool.name, table.names[k],
                                                  requests, dict(requests), "create", False))
            self._mark(rows=(i,), nodes=(k,), pools=(j,))
        return name

    def _landing(self, v: int, skip: int = -1, bonus: tuple[int, np.ndarray] | None = None
                 ) -> tuple[int, int] | None:
        """Where one replica of job row v fits now (pool, node): its pools by throughput (not ``skip``, nor a
        mechanism pool), the admitted usable node with the most free priced resource (under the degree limit and
        spec.capacity), or None. ``bonus`` (node, vector): room that counts free on that node (a pod this plan gives
        up). Each pool's answer (:meth:`_room`) depends only on the pod's request vector, its admitted nodes and
        ``bonus``, so jobs alike share it until the plan changes."""
        extra = () if bonus is None else (bonus[0], bonus[1].tobytes())
        for j, key, vec, admitted in self._landing_pools(v):
            if j == skip:
                continue
            k = self._room_of(j, (*key, *extra), (vec, admitted, bonus))
            if k is not None:
                return j, k
        return None

    def _landing_pools(self, v: int) -> list[tuple[int, tuple[Any, ...], np.ndarray, np.ndarray]]:
        """The pools job row v may land in (:meth:`_landing`: by throughput, not a mechanism pool, with usable
        nodes), each with its room key, the replica's request vector there and v's admitted nodes; fixed for the
        plan."""
        got = self._static_landing.get(v)
        if got is None:
            ctx = self.ctx
            admitted = ctx.admitted[v]
            got = self._static_landing[v] = []
            for j in self._pools_of(v):
                pool = ctx.objects.pools[j]
                if pool.usable.size == 0 or pool.spec.policy in MECHANISM_POLICIES:
                    continue
                vec = self._vector(v, pool.spec.resource)
                got.append((j, ("room", j, vec.tobytes(), id(admitted)), vec, admitted))
        return got

    def _room_of(self, j: int, key: tuple[Any, ...], args: tuple[np.ndarray, np.ndarray, Any]) -> int | None:
        """:meth:`_room` of pool j for ``args`` (vector, admitted nodes, bonus), memoised under ``key`` while pool
        j's nodes are unchanged; an answer computed again that turns from None to a node or back moves the pool's
        room stamp (:meth:`_rooms`)."""
        was = self._memo.get(key)
        if was is not None and was[0] >= self._pool_stamp[j]:
            return was[1]
        now = self._memo[key] = (self.version, self._room(j, *args))
        if was is None:
            self._room_args[j][key] = args
        elif (now[1] is None) != (was[1] is None):
            self._room_stamp[j] = self.version
        return now[1]

    def _rooms(self) -> np.ndarray:
        """Per pool, the version at which a room answer of it that a landing read (:meth:`_room`, memoised by
        :meth:`_landing`) last turned from None to a node or back: each answer of a pool changed since it was
        recorded is computed again here, and only where it flips is the pool's stamp moved (a landing reads only
        which pool has room, not the node)."""
        if self._rooms_version == self.version:
            return self._room_stamp  # nothing changed since the last check
        self._rooms_version = self.version
        changed = np.flatnonzero(self._pool_stamp > self._rooms_checked)
        for j in changed.tolist():
            for key, args in self._room_args[j].items():
                self._room_of(j, key, args)
            self._rooms_checked[j] = self.version
        return self._room_stamp

    def _pools_of(self, v: int) -> list[int]:
        """Job row v's pools by throughput (highest first, then index); fixed for the plan."""
        got = self._static_pools.get(v)
        if got is None:
            got = self._static_pools[v] = sorted(np.flatnonzero(self.a[v] > 0).tolist(),
                                                 key=lambda j: (-self.a[v, j], j))
        return got

    def _vector(self, v: int, resource: str, amount: float | None = None) -> np.ndarray:
        """The request vector of a pod of job row v in a pool that prices ``resource``, ``amount`` of it (the job's
        ``demand`` when None); fixed for the plan."""
        key = (v, resource, amount)
        got = self._static_vectors.get(key)
        if got is None:
            info = self.ctx.objects.jobs[v]
            got = self._static_vectors[key] = self.outcome.table.vector(pod_vector(
                self.ctx.templates[v], info.spec, resource, info.spec.demand if amount is None else amount))
            got.setflags(write=False)  # shared by the victims and landings of the plan
        return got

    def _room(self, j: int, vec: np.ndarray, admitted: np.ndarray, bonus: tuple[int, np.ndarray] | None
              ) -> int | None:
        """The node of pool j where a pod of request vector ``vec`` fits now (:meth:`_landing`), or None."""
        pool = self.ctx.objects.pools[j]
        table = self.outcome.table
        nodes = pool.usable
        used, alloc = table.used[nodes].copy(), table.alloc[nodes]
        count = self.outcome.walras_count[nodes].copy()
        back = 0.0
        at = np.flatnonzero(nodes == bonus[0]) if bonus is not None else np.zeros(0, dtype=np.int64)
        if bonus is not None and at.size:
            used[at[0]] -= bonus[1]
            count[at[0]] -= 1
            c = table.column.get(pool.spec.resource)
            back = float(bonus[1][c]) if c is not None else 0.0
        free = alloc - used
        ok = admitted[nodes] & np.all(used + vec <= alloc + EPS * np.maximum(1.0, alloc), axis=1)
        if pool.spec.degree_limit is not None:
            ok &= count < pool.spec.degree_limit
        c = table.column.get(pool.spec.resource)
        if pool.spec.capacity is not None and c is not None and pool.members.size and \
                float(table.used[pool.members, c].sum()) - back + vec[c] > pool.spec.capacity + 1e-9:
            return None
        if not ok.any():
            return None
        room = free[:, c] if c is not None else np.zeros(nodes.size)
        candidates = np.flatnonzero(ok)
        return int(nodes[candidates[np.lexsort((candidates, -room[candidates]))[0]]])

    def _elsewhere(self, v: int, skip: int = -1) -> None:
        """Place one replica of job row v (whose planned pod yielded, or whose running pod moves) where it fits now
        (:meth:`_landing`)."""
        landing = self._landing(v, skip)
        if landing is None:
            return
        j, k = landing
        info, pool = self.ctx.objects.jobs[v], self.ctx.objects.pools[j]
        table = self.outcome.table
        self._create(v, j, k, table.vector(pod_vector(self.ctx.templates[v], info.spec, pool.spec.resource,
                                                      info.spec.demand)))
        self.utility.t[v] += self.a[v, j] / max(info.spec.replicas, 1)
        self._mark(rows=(v,))
        self._unwait(info.key, pool.name)

    def _unwait(self, key: ObjectKey, pool: str) -> None:
        """One of the job's unplaced replicas is placed now: its count of unplaced ones, that pool's first, drops."""
        unplaced = self.actions.unplaced.get(key, {})
        for at in sorted(unplaced, key=lambda name: (name != pool, name)):
            count, why = unplaced[at]
            if count > 1:
                unplaced[at] = (count - 1, why)
            else:
                del unplaced[at]
            break
