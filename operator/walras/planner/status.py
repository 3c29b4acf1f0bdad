"""Phase *status*: what each job and pool reports, from what was placed (not from what was priced).

A job's status carries the market's priced allocation (``allocation``: time fraction per pool, ``pricedThroughput``
``a_i^T x_i``, ``pricedCost`` ``sum_j p_j d_ij x_ij``; 004 Sec. 2) and, separately, what placement realised: replicas
per pool that run or have a node (``replicas``), what the market wanted (``wantedReplicas``), and the throughput and
cost of the placed replicas (replica k of N runs a 1/N share of the job: ``sum_j a_ij placed_ij / N_i``).
``Scheduled=True`` only when every wanted replica is placed; otherwise the reason says why: ``DegreeLimited``,
``Fragmented``, ``InsufficientCapacity``, ``NoEligibleNode`` (taints, selectors, affinity), or ``NoAllocation``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

import numpy as np

from walras.planner.market import utility_values
from walras.planner.model import Condition, JobPlan, PlanEvent, PodPlan, PoolPlan, evolve
from walras.planner.results import Actions, JobStatuses, Outcome, PlanContext, PoolStatuses, Resizes
from walras.planner.reuse import Inputs, Same, matches

_WHY = {
    "DegreeLimited": "the pool's degree limit leaves no slot on a node with room",
    "Fragmented": "the pool has the room in total but no single node has room for a whole pod",
    "InsufficientCapacity": "the pool has no room left for the pod's requests",
    "NoEligibleNode": "no usable node of the pool admits the pod (taints, nodeSelector, node affinity)",
    "NoRoom": "no node of the pool has room for a pod of this job now",
    "TooLarge": "the pod's requests exceed the allocatable of the largest node the pod may use",
}
_name = attrgetter("name")
#: Reasons that no change of load can cure: the job can never run in that pool as it is specified.
_STRUCTURAL = ("TooLarge", "NoEligibleNode")


def allocation_text(allocation: dict[str, float]) -> str:
    """``a100=0.46,v100=0.54``: the priced allocation, two decimals, largest first (for printer columns)."""
    items = sorted(allocation.items(), key=lambda kv: (-kv[1], kv[0]))
    return ",".join(f"{name}={value:.2f}" for name, value in items) or "-"


def _first_few(items: list[str], shown: int = 5) -> str:
    return "; ".join(items[:shown]) + ("; ..." if len(items) > shown else "")


PoolCounts = tuple[tuple[str, int, int], ...]
"""Per pool (in first-seen order): the pods planned there (live, with a node) and those bound (existing, kept or
resized)."""
Given = tuple[Any, ...]
"""Everything :func:`_conditions` reads of one job (its inputs, see there), compared by value."""
Concluded = tuple[tuple[Condition, ...], str, tuple[PlanEvent, ...]]
"""What :func:`_conditions` returns: the conditions it adds, the phase, the events it raises."""


@dataclass(frozen=True)
class StatusEntry:
    """One job's record of the status phase (:mod:`.reuse`), in three parts, each reused where its own inputs
    :func:`~.reuse.matches` the present ones: ``inputs`` (``(Same(listed),)``, its pod plans as the reconcile phase
    listed them) for those plans in name order (``ordered``) and what :func:`_pod_counts` (``live``, ``resized``,
    ``bound``) and :func:`_pool_counts` (``pools``) found in them; ``allocation`` (its priced allocation) for its
    ``text`` (:func:`allocation_text`); ``given`` (:func:`_conditions`'s inputs) for ``done``, its result."""

    inputs: Inputs
    ordered: tuple[PodPlan, ...]
    live: int
    resized: int
    bound: bool
    pools: PoolCounts
    allocation: dict[str, float]
    text: str
    given: Given
    done: Concluded


def job_statuses(ctx: PlanContext, outcome: Outcome, actions: Actions, resizes: Resizes,
                 job_plans: Mapping[tuple[str, str], JobPlan]) -> JobStatuses:
    """Fill every valid job's :class:`JobPlan` and its events. With the context's reuse (a :class:`StatusEntry`
    per job, :mod:`.reuse`), a job takes from the recorded entry, each part only where every input of that part is
    equal to what it was then:

    - its pods' name order and counts, where its pod plans are the same objects in the same order as then (the
      reconcile phase reuses unchanged jobs' ``keep`` plans, :mod:`.reconcile`);
    - its allocation text, where its priced allocation (the non-zero entries of its row of X, rounded) is equal;
    - its conditions, phase and the events they raise, where every input of :func:`_conditions` is equal (the job's
      replicas and minimum, placed and wanted totals, pools offered, pod counts, the pools no longer offered with
      why, what was unplaced, deferred, resize-blocked and resize-deferred, the replicas below its minimum).

    The numbers that depend on the prices or on X (throughputs, costs, utility) are computed for every job at once,
    and the ``Planned`` event (which compares with the previous plan's replicas) for each job. This plan's entries
    are recorded. Returns each valid job's plan (its plan in ``job_plans`` filled in), its pods planned and bound per
    pool (for :func:`pool_statuses`) and the events raised."""
    objects, previous, reuse = ctx.objects, ctx.previous, ctx.reuse
    jobs = objects.jobs
    n, m = len(jobs), len(objects.pools)
    prices = outcome.market.prices if outcome.market.prices.size == m else np.zeros(m)
    X = outcome.allocation
    names = [p.name for p in objects.pools]
    column = {name: j for j, name in enumerate(names)}
    A = outcome.throughput
    priced_t = np.einsum("ij,ij->i", A, X) if n else np.zeros(0)
    priced_cost = (outcome.demand * X) @ prices if n and m else np.zeros(n)
    keys = [info.key for info in jobs]
    placed_all = np.zeros((n, m), dtype=np.float64)
    for i, key in enumerate(keys):
        for name, count in actions.placed.get(key, {}).items():
            j = column.get(name)
            if j is not None:
                placed_all[i, j] = count
    big_ns = np.maximum(np.array([info.spec.replicas for info in jobs], dtype=np.float64), 1.0)
    placed_t = np.einsum("ij,ij->i", A, placed_all) / big_ns if n else np.zeros(0)
    utilities = utility_values([info.spec.utility for info in jobs], [1.0] * n, placed_t) if n else np.zeros(0)
    # Python lists of the per-job rows: the loop below reads them element by element.
    wanted_all = outcome.target + outcome.dropped if outcome.dropped.shape == outcome.target.shape else outcome.target
    rows_target = wanted_all.tolist()
    demands = np.array([info.spec.demand for info in jobs], dtype=np.float64)
    costs = ((placed_all * demands[:, None]) @ prices).tolist() if n and m else [0.0] * n
    utilities_l, priced_t_l, priced_cost_l = utilities.tolist(), priced_t.tolist(), priced_cost.tolist()
    placed_t_l = placed_t.tolist() if m else [0.0] * n
    # each row's non-zero entries only, in column order (a job uses a few of the pools)
    allocations: list[dict[str, float]] = [{} for _ in range(n)]
    wanted_rows: list[dict[str, int]] = [{} for _ in range(n)]
    if n and m:
        rows, cols = np.nonzero(X > 1e-9)
        for i, j, x in zip(rows.tolist(), cols.tolist(), X[rows, cols].tolist(), strict=True):
            allocations[i][names[j]] = round(x, 6)
        rows, cols = np.nonzero(wanted_all > 0)
        for i, j, t in zip(rows.tolist(), cols.tolist(), wanted_all[rows, cols].tolist(), strict=True):
            wanted_rows[i][names[j]] = int(t)
    no_pods: tuple[PodPlan, ...] = ()
    per_pool: dict[tuple[str, str], PoolCounts] = {}
    offered_counts = outcome.offered.sum(axis=1).tolist() if n else []
    blocked_by_row = outcome.blocked_by_row
    below_min, deferred, unplaced_all = outcome.below_min, actions.deferred, actions.unplaced
    resize_blocked, resize_later = resizes.blocked, resizes.later
    events: list[PlanEvent] = []
    out: dict[tuple[str, str], JobPlan] = {}
    for i, info in enumerate(jobs):
        key = keys[i]
        spec = info.spec
        placed = actions.placed.get(key, {})
        allocation = allocations[i]
        replicas = {name: int(c) for name, c in sorted(placed.items()) if c > 0}
        listed = actions.pods.get(key, no_pods)
        before = reuse.recorded(StatusEntry, key)
        inputs = (Same(tuple(listed)),)
        if before is not None and matches(before.inputs, inputs):
            ordered, live, resized, bound = before.ordered, before.live, before.resized, before.bound
            pools = before.pools
        else:
            ordered = tuple(sorted(listed, key=_name))
            live, resized, bound = _pod_counts(ordered)
            pools = _pool_counts(ordered)
        per_pool[key] = pools
        text = before.text if before is not None and matches((before.allocation,), (allocation,)) else (
            allocation_text(allocation))
        blocked_pools = [(names[j], why) for j, why in blocked_by_row.get(i, ())]
        given = (spec.replicas, spec.min_replicas, sum(replicas.values()), sum(rows_target[i]), offered_counts[i],
                 live, resized, bound, blocked_pools, unplaced_all.get(key), deferred.get(key),
                 resize_blocked.get(key), resize_later.get(key), below_min.get(i))
        done = before.done if before is not None and matches((before.given,), (given,)) else _conditions(key, given)
        conditions, phase, raised = done
        if raised:
            events.extend(raised)
        reuse.store(StatusEntry(inputs, ordered, live, resized, bound, pools, allocation, text, given, done), key)
        jp = out[key] = evolve(
            job_plans[key], utility=utilities_l[i], allocation=allocation, throughput_unit=spec.throughput_unit,
            wanted=wanted_rows[i], replicas=replicas, priced_throughput=priced_t_l[i], priced_cost=priced_cost_l[i],
            throughput=placed_t_l[i], cost=costs[i], pods=ordered, allocation_text=text, phase=phase,
            conditions=job_plans[key].conditions + conditions)
        old = previous.jobs.get(key) if previous is not None else None
        if old is None or old.replicas != jp.replicas:
            placed_text = ", ".join(f"{k}={v}" for k, v in jp.replicas.items()) or "none"
            events.append(PlanEvent(
                "FungibleJob", spec.namespace, spec.name, "Normal", "Planned",
                f"Placed replicas: {placed_text} (wanted {sum(jp.wanted.values())}); throughput "
                f"{jp.throughput:.4g}, cost {jp.cost:.4g} at current prices."))
    return JobStatuses(out, per_pool, tuple(events))


def _pool_counts(pods: Sequence[PodPlan]) -> PoolCounts:
    """Of a job's pod plans, per pool: the live ones with a node (planned), and those of them that exist and are
    kept or resized (bound)."""
    planned: dict[str, int] = {}
    bound: dict[str, int] = {}
    for p in pods:
        action = p.action
        if action == "delete" or action == "evict" or p.node is None:
            continue
        at = p.pool
        planned[at] = planned.get(at, 0) + 1
        if p.exists and (action == "keep" or action == "resize"):
            bound[at] = bound.get(at, 0) + 1
    return tuple((at, count, bound.get(at, 0)) for at, count in planned.items())


def _pod_counts(pods: Sequence[PodPlan]) -> tuple[int, int, bool]:
    """Of a job's pod plans: the live ones (neither deleted nor evicted), those resized in place, and whether every
    live pod is kept (or resized) on a node."""
    live = resized = 0
    bound = True
    for p in pods:  # one pass over the job's pods: a plan reads 20,000 of them here
        action = p.action
        if action == "delete" or action == "evict":
            continue
        live += 1
        if action == "resize":
            resized += 1
        elif action != "keep":
            bound = False
        if p.node is None:
            bound = False
    return live, resized, bound


def _conditions(key: tuple[str, str], given: Given) -> Concluded:
    """The conditions a job adds to its status, its phase, and the events they raise, from what was placed (see the
    module docstring). ``given``, as :func:`job_statuses` builds it: the job's ``spec.replicas`` and
    ``spec.replicas.min``, its placed and wanted replica totals, how many pools it is offered, its pods' live,
    resized and bound counts (:func:`_pod_counts`), the pools no longer offered to it with why (in pool order), and
    what was unplaced per pool, how many deletions were deferred, which pods' resizes are blocked and deferred, and
    the replicas the fair share would give it below its minimum (None where these do not apply)."""
    (replicas, minimum, placed, wanted, offered, live, resized, bound, blocked_pools, unplaced, deferred, blocked,
     later, below_min) = given
    conditions: list[Condition] = []
    raised: list[PlanEvent] = []
    warn = raised.append
    ns, name = key
    phase: str
    if resized:
        conditions.append(Condition(
            "ResourcesCurrent", "False", "ResizeNeeded",
            f"{resized} running pod(s) get new requests/limits in place (pods/resize where the cluster serves it, "
            "else with the next pod)"))
    if blocked:
        message = (f"{len(blocked)} running pod(s) keep their resources: the new ones do not fit on their node "
                   f"({_first_few(blocked)}); the next pod gets them")
        conditions.append(Condition("ResizeBlocked", "True", "NoRoomOnNode", message))
        warn(PlanEvent("FungibleJob", ns, name, "Warning", "ResizeBlocked", message))
    if later:
        message = (f"{len(later)} running pod(s) keep resources that cannot change in place ({_first_few(later)}); "
                   "the change waits for the next pod")
        conditions.append(Condition("ResizeDeferred", "True", "NotResizableInPlace", message))
        warn(PlanEvent("FungibleJob", ns, name, "Normal", "ResizeDeferred", message))
    if below_min is not None:
        message = (f"the fair share gives {below_min} replica(s), fewer than spec.replicas.min {minimum}; "
                   "no new pod is created until it reaches the minimum")
        conditions.append(Condition("MinimumReplicas", "False", "BelowMinimum", message))
        warn(PlanEvent("FungibleJob", ns, name, "Warning", "BelowMinimum", message))
    if deferred:
        message = f"{deferred} surplus pod(s) wait for the next plan (churn budget of this plan spent)"
        conditions.append(Condition("ChurnLimited", "True", "DeletionsDeferred", message))
    unplaced = unplaced or {}
    reasons = [why for _, (_, why) in sorted(unplaced.items())] + [why for _, why in sorted(blocked_pools)]
    if unplaced:
        detail = "; ".join(f"{count} in pool {pool!r}: {_WHY.get(why, why)}" for pool, (count, why)
                           in sorted(unplaced.items()))
        message = f"{sum(c for c, _ in unplaced.values())} wanted replica(s) have no node: {detail}"
        conditions.append(Condition("ReplicasPlaceable", "False", reasons[0] or "NoRoom", message))
        warn(PlanEvent("FungibleJob", ns, name, "Warning", "Unplaceable", message))
    if blocked_pools:
        detail = "; ".join(f"pool {pool!r}: {_WHY.get(why, why)}" for pool, why in blocked_pools)
        conditions.append(Condition("PlacedAsPriced", "False", "MarketRepriced",
                                    f"not offered in {detail}; the market priced the job without it"))
    structural = [(pool, why) for pool, why in blocked_pools if why in _STRUCTURAL]
    if replicas > 0 and structural and len(structural) == offered:
        phase = "Unschedulable"
        message = "no pod of this job can run in its pools: " + "; ".join(
            f"pool {pool!r}: {_WHY[why]}" for pool, why in structural)
        conditions.append(Condition("Schedulable", "False", structural[0][1], message))
        warn(PlanEvent("FungibleJob", ns, name, "Warning", structural[0][1], message))
    elif replicas > 0 and wanted == 0:
        phase = "Pending"
        if blocked_pools:
            reason = blocked_pools[0][1] if blocked_pools[0][1] != "NoRoom" else "InsufficientCapacity"
            message = "no replica of this job can be placed in its pools: " + "; ".join(
                f"{pool!r} ({_WHY.get(why, why)})" for pool, why in blocked_pools)
        else:
            reason, message = "NoAllocation", "the market gives this job no replicas at current prices"
        conditions.append(Condition("Scheduled", "False", reason, message))
    elif placed < wanted:
        phase = "Pending"
        reason = next((r for r in reasons if r), "InsufficientCapacity")
        conditions.append(Condition("Scheduled", "False", reason,
                                    f"{placed} of {wanted} wanted replica(s) placed"))
    else:
        phase = "Running" if live and bound else "Pending"
        what = "running" if phase == "Running" else "placed"
        conditions.append(Condition("Scheduled", "True", "AllPodsPlaced", f"{placed} of {wanted} pod(s) {what}"))
    return tuple(conditions), phase, tuple(raised)


def pool_statuses(ctx: PlanContext, outcome: Outcome, actions: Actions, pool_plans: Mapping[str, PoolPlan],
                  counted: Mapping[tuple[str, str], PoolCounts] | None = None) -> PoolStatuses:
    """Every valid pool's :class:`PoolPlan`, from its plan in ``pool_plans`` with its price, what is used and its
    pods; and a ``Priced`` event for each pool whose price changed.
    ``counted``: what :func:`job_statuses` returned for the same ``actions`` (the jobs' pods per pool, counted
    there); the pods of other jobs are counted here."""
    objects, previous = ctx.objects, ctx.previous
    table = outcome.table
    prices = outcome.market.prices
    planned: dict[str, int] = {}
    bound: dict[str, int] = {}
    for key, plans in actions.pods.items():
        pools = counted.get(key) if counted is not None else None
        for at, count, held in pools if pools is not None else _pool_counts(plans):
            planned[at] = planned.get(at, 0) + count
            bound[at] = bound.get(at, 0) + held
    events: list[PlanEvent] = []
    out: dict[str, PoolPlan] = {}
    for j, pool in enumerate(objects.pools):
        price = float(prices[j]) if j < prices.size else 0.0
        c = table.column.get(pool.spec.resource)
        used = float(table.used[pool.usable, c].sum()) if c is not None and pool.usable.size else 0.0
        alloc = float(table.alloc[pool.usable, c].sum()) if c is not None and pool.usable.size else 0.0
        capacity = alloc if pool.spec.capacity is None else float(pool.spec.capacity)
        out[pool.name] = replace(pool_plans[pool.name], price=price, capacity=capacity, used=used,
                                 utilisation=float(min(used / capacity, 1.0)) if capacity > 0 else 0.0,
                                 pods_planned=planned.get(pool.name, 0), pods_bound=bound.get(pool.name, 0))
        old = previous.pools.get(pool.name) if previous is not None else None
        if old is None or abs(old.price - price) > 1e-3 * max(abs(old.price), 1e-9):
            events.append(PlanEvent("ResourcePool", "", pool.name, "Normal", "Priced",
                                    f"Price is {price:.6g} per {pool.spec.resource} (capacity {capacity:g})."))
    return PoolStatuses(out, tuple(events))
