"""Phase *migration* (rebalancing with bounded churn): after reconcile, move running pods of jobs that opted in
(``spec.migration``) towards the pools the market now gives them, one pod at a time and only when it pays.

The replica phase keeps what runs whenever it is a valid rounding (so that an unchanged cluster is a fixed point):
a job placed on a slow pool while a fast one was full stays there after the fast one frees up. For a job with
``spec.migration`` this phase compares its placed pods per pool with the market's integral split, the largest
remainder of ``N_i x_ij`` (004 Sec. 2.1) over the job's placed total, and moves a running pod from a pool it holds
more of than the split to one it holds fewer of, when every rule holds:

(a) the job's utility of its placed throughput ``t = sum_j a_ij placed_ij / N_i`` (its 004 Sec. 2.2 utility, as the
    status reports it) gains at least ``minGain`` relative: ``(u(t') - u(t)) / |u(t)| >= minGain`` (an infinite gain
    when ``u(t) = 0`` and ``u(t') > 0``);
(b) the pod has run at least ``minRunSeconds`` (``status.startTime``; a pod without one is not moved);
(c) the job's previous move (``status.lastMigrationTime``, or the previous plan's) is ``cooldownSeconds`` ago or more;
(d) at most ``maxPodsPerCycle`` pods of the job and ``PlanOptions.max_migrations`` pods in all move in one plan;
(e) a usable node of the target pool that the job's template admits has room for the replacement's whole request
    vector on the node table after this plan's reservations (and a slot under the pool's degree limit, and room
    under the pool's ``spec.capacity``); the replacement is reserved there.

(f) *Remaining work.* When the job reports the work it has left, ``W`` (annotation ``walras.dev/remaining-work``,
    :data:`walras.planner.spec.ANNOTATION_REMAINING_WORK`, in the unit of ``spec.throughput`` times seconds), rule (a)
    is replaced by: the move finishes the job sooner, restart included,

        ``r + W / t' < W / t``

    with ``t`` the placed throughput before this plan's moves, ``t'`` after them (the utility's argument above), and
    ``r`` the restart cost (:func:`walras.planner.spec.restart_cost`: ``spec.migration.restartSeconds``, else the
    template's termination grace period, else 30 s), paid once per plan since every moved pod of the job restarts
    together. The utility gain ignores how long the job still runs: a 10 % faster pool is worth a 30 s restart to a
    job with hours left and not to one a minute from its end. A job without the annotation keeps rule (a).

Each step takes the move with the largest gain (ties to the lower pool indices). The moved pod's action becomes
``evict`` (the operator goes through the Eviction API, so PodDisruptionBudgets and the pod's termination grace period
hold) and a ``create`` is planned for its replacement; the placed replicas and a ``Rebalanced`` event follow. The
evicted pod's room is not counted as free in this plan (it is freed only once the pod is gone). Jobs without
``spec.migration`` are never moved, nor jobs the lifecycle holds below their spec (completing, in backoff), and
without a clock (``now`` None) nothing moves.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, replace

import numpy as np

from walras.planner.capacity import NodeTable
from walras.planner.cluster import Pod, pod_vector
from walras.planner.market import utility_values
from walras.planner.model import ObjectKey, PlanEvent, PodPlan
from walras.planner.quantity import format_quantity
from walras.planner.reconcile import new_pod_name, pod_base
from walras.planner.replicas import largest_remainder
from walras.planner.results import Actions, Migrated, Observed, Outcome, PlanContext
from walras.planner.spec import restart_cost


def relative_gain(before: float, after: float) -> float:
    """``(after - before) / |before|``; infinite when ``before`` is 0 and ``after`` is above it."""
    if after <= before:
        return 0.0 if after == before else (after - before) / max(abs(before), 1e-300)
    if before == 0.0 or not np.isfinite(before):
        return float("inf")
    return (after - before) / abs(before)


def finishes_sooner(remaining: float, before: float, after: float, restart: float) -> bool:
    """Rule (f) of the module docstring: ``restart + remaining / after < remaining / before`` (throughputs ``before``
    and ``after`` of the job's placed pods; a throughput of 0 takes forever)."""
    if after <= 0.0:
        return False
    if before <= 0.0:
        return True
    return restart + remaining / after < remaining / before


@dataclass(frozen=True)
class _Move:
    """One step of a job's rebalancing: its pod ``pod`` (planned ``plan``) moves from pool ``source`` to pool
    ``target``, node ``node``; the utility ``before`` and ``after`` with the relative ``gain``, and a note (rule f)."""

    pod: Pod
    plan: PodPlan
    source: int
    target: int
    node: int
    gain: float
    before: float
    after: float
    note: str = ""


def migrate(ctx: PlanContext, observed: Observed, outcome: Outcome, actions: Actions, *,
            held: Collection[ObjectKey] = ()) -> Migrated:
    """Plan the moves of the module docstring, with the clock and the budget of ``ctx.options``; return the pods
    moved per job, their ``Rebalanced`` events, and the actions and outcome after them (new ones, with the moves'
    pod plans and placed replicas and their reservations on a copy of the node table, where a job may move; else
    ``actions`` and ``outcome`` themselves). Jobs in ``held`` (the lifecycle holds them below their spec:
    completing, in backoff, out of the market) are not moved."""
    moved: dict[ObjectKey, int] = {}
    events: list[PlanEvent] = []
    now, budget, previous = ctx.options.now, ctx.options.max_migrations, ctx.previous
    if now is None or budget <= 0:
        return Migrated(moved, (), actions, outcome)
    candidates: list[int] = []
    for i, info in enumerate(ctx.objects.jobs):
        spec = info.spec
        rules = spec.migration
        if rules is None or spec.replicas <= 0 or info.key in held:
            continue
        old = previous.jobs.get(info.key) if previous is not None else None
        last = [t for t in (info.job.reported.last_migration, old.last_migration if old is not None else None)
                if t is not None]
        if last and now - max(last) < rules.cooldown_seconds:
            continue
        candidates.append(i)
    if not candidates:
        return Migrated(moved, (), actions, outcome)
    table = outcome.table
    outcome = replace(outcome, table=NodeTable(table.nodes, table.names, table.index, table.resources, table.column,
                                               table.alloc, table.used.copy(), table.usable),
                      walras_count=outcome.walras_count.copy())
    placed: defaultdict[ObjectKey, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    placed.update((key, defaultdict(int, counts)) for key, counts in actions.placed.items())
    actions = Actions(defaultdict(list, ((key, list(plans)) for key, plans in actions.pods.items())),
                      actions.deferred, placed, actions.unplaced)
    for i in candidates:
        if budget <= 0:
            break
        info = ctx.objects.jobs[i]
        rules = info.spec.migration
        assert rules is not None
        count = _move_job(ctx, i, observed, outcome, actions, events, min(rules.max_pods_per_cycle, budget))
        if count:
            moved[info.key] = count
            budget -= count
    return Migrated(moved, tuple(events), actions, outcome)


def _move_job(ctx: PlanContext, i: int, observed: Observed, outcome: Outcome, actions: Actions,
              events: list[PlanEvent], limit: int) -> int:
    """Job row i's moves (at most ``limit``), one at a time, the largest gain first, their events added to
    ``events``; the pods moved."""
    objects = ctx.objects
    info = objects.jobs[i]
    now = ctx.options.now
    assert now is not None
    spec = info.spec
    rules = spec.migration
    assert rules is not None
    pools = objects.pools
    m = len(pools)
    key = info.key
    placed = np.array([actions.placed.get(key, {}).get(p.name, 0) for p in pools], dtype=np.int64)
    x = outcome.allocation[i]
    total = int(placed.sum())
    if total == 0 or x.sum() <= 0:
        return 0
    ideal = largest_remainder(spec.replicas * x, total)
    a = np.array([spec.throughput.get(p.name, 0.0) if info.pools[j] else 0.0 for j, p in enumerate(pools)])
    offered = outcome.throughput[i] > 0
    plans = {p.name: p for p in actions.pods.get(key, []) if p.exists and p.node is not None
             and p.action in ("keep", "resize") and not p.reason.startswith("deletion deferred")}
    movable: list[list[tuple[Pod, PodPlan]]] = []
    for j in range(m):
        pods = []
        for pod in sorted(observed.running[i][j], key=lambda p: p.name):
            pp = plans.get(pod.name)
            if pp is not None and pod.phase == "Running" and pod.started is not None and \
                    now - pod.started >= rules.min_run_seconds:
                pods.append((pod, pp))
        movable.append(pods)
    n_big = max(spec.replicas, 1)
    remaining = spec.remaining_work
    restart = restart_cost(spec) if remaining is not None else 0.0
    initial = float(a @ placed) / n_big  # rule (f) compares with the throughput before this plan's moves
    done = 0
    while done < limit:
        t = float(a @ placed) / n_big
        pairs = [(j, k) for j in range(m) if placed[j] > ideal[j] and movable[j]
                 for k in range(m) if k != j and placed[k] < ideal[k] and offered[k]]
        if not pairs:
            break
        after = np.array([t + (a[k] - a[j]) / n_big for j, k in pairs])
        values = utility_values([spec.utility] * (len(pairs) + 1), [1.0] * (len(pairs) + 1), np.append(after, t))
        before = float(values[-1])
        gains = [relative_gain(before, float(v)) for v in values[:-1]]
        if remaining is None:
            order = sorted(range(len(pairs)), key=lambda q: (-gains[q], pairs[q]))
        else:  # rule (f): the fastest result first
            order = sorted(range(len(pairs)), key=lambda q: (-float(after[q]), pairs[q]))
        step = None
        for q in order:
            if remaining is None:
                if gains[q] < rules.min_gain:
                    break
            elif not (after[q] > t and finishes_sooner(remaining, initial, float(after[q]), restart)):
                continue
            j, k = pairs[q]
            node = _room(ctx, i, k, outcome)
            if node is not None:
                step = (j, k, node, gains[q], float(values[q]), float(after[q]))
                break
        if step is None:
            break
        j, k, node, gain, value, faster = step
        pod, pp = movable[j].pop(0)
        note = "" if remaining is None else (
            f"; finishes {remaining / initial - restart - remaining / faster:.0f} s sooner with {remaining:g} work "
            f"left (restart {restart:g} s)" if initial > 0 else f"; {remaining:g} work left")
        _apply(ctx, i, _Move(pod, pp, j, k, node, gain, before, value, note), observed, outcome, (actions, events))
        placed[j] -= 1
        placed[k] += 1
        done += 1
    return done


def _room(ctx: PlanContext, i: int, k: int, outcome: Outcome) -> int | None:
    """The node of pool k that takes the job's replacement pod (rule e): the admitted usable node with room for the
    whole request vector and a slot, most free priced resource first (ties to the lower index); None when none."""
    info, template, admitted, table = ctx.objects.jobs[i], ctx.templates[i], ctx.admitted[i], outcome.table
    pool = ctx.objects.pools[k]
    nodes = pool.usable
    if nodes.size == 0:
        return None
    spec = info.spec
    vec = table.vector(pod_vector(template, spec, pool.spec.resource, spec.demand))
    ok = admitted[nodes] & table.fits_many(nodes, vec)
    if pool.spec.degree_limit is not None:
        ok &= outcome.walras_count[nodes] < pool.spec.degree_limit
    c = table.column.get(pool.spec.resource)
    if pool.spec.capacity is not None and c is not None and pool.members.size:
        if float(table.used[pool.members, c].sum()) + vec[c] > pool.spec.capacity + 1e-9:
            return None
    if not ok.any():
        return None
    free = table.free[nodes, c] if c is not None else np.zeros(nodes.size)
    candidates = np.flatnonzero(ok)
    best = candidates[np.lexsort((candidates, -free[candidates]))[0]]
    return int(nodes[best])


def _apply(ctx: PlanContext, i: int, move: _Move, observed: Observed, outcome: Outcome,
           out: tuple[Actions, list[PlanEvent]]) -> None:
    """Carry out ``move`` of job row i: the replacement reserved on its node, the moved pod's plan replaced by an
    ``evict`` (a new plan: the old one may be shared with the previous plan), a ``create`` for the replacement, the
    placed replicas moved and a ``Rebalanced`` event."""
    actions, events = out
    info, template, table = ctx.objects.jobs[i], ctx.templates[i], outcome.table
    spec = info.spec
    key = info.key
    pod, node = move.pod, move.node
    source, target = ctx.objects.pools[move.source], ctx.objects.pools[move.target]
    gain = move.gain
    how = (f"utility {move.before:.4g} -> {move.after:.4g} "
           f"({'+inf' if gain == float('inf') else f'+{100 * gain:.1f}%'}){move.note}")
    vec = table.vector(pod_vector(template, spec, target.spec.resource, spec.demand))
    table.add(node, vec)
    outcome.walras_count[node] += 1
    name, _ = new_pod_name(observed.taken(key), pod_base(spec.name, target.name))
    plans = actions.pods[key]
    at = next(q for q, p in enumerate(plans) if p is move.plan)
    plans[at] = replace(move.plan, action="evict", grace=None,
                        reason=f"rebalanced from pool {source.name!r} to {target.name!r} (replaced by {name}): {how}")
    requests = {**spec.resource_text, target.spec.resource: format_quantity(spec.demand)}
    plans.append(PodPlan(spec.namespace, name, spec.name, target.name, table.names[node], requests, dict(requests),
                         "create", False, f"replaces {pod.name} (rebalanced from pool {source.name!r})"))
    placed = actions.placed[key]
    placed[source.name] -= 1
    if placed[source.name] <= 0:
        del placed[source.name]
    placed[target.name] = placed.get(target.name, 0) + 1
    events.append(PlanEvent("FungibleJob", spec.namespace, spec.name, "Normal", "Rebalanced",
                            f"Pod {pod.name} moves from pool {source.name!r} to {target.name!r} "
                            f"(node {table.names[node]}): {how}."))
