"""Phase *gang*: a gang job (``spec.replicas.gang``) runs all of its N replicas, in one pool, or none (docs/gangs.md).

The market (004, Alg. 2) sells time fractions; a gang is worth something only whole: its share is an indivisible
bundle of N replicas (004 Sec. 2.1: ``x_ij = 1`` for ``N d_i`` of pool j, the demand vector of Sec. 7.1 taken N
times) or nothing. The rule is applied at three depths, each all-or-none:

1. **Replica targets** (:func:`.integral.gang_targets`, numerics in :func:`.replicas.whole_gangs`): a gang's
   target is N in the pool where it runs, else in the pool with the best surplus ``u_i(a_ij) - p_j N d_i - u_i(0)``
   at the market's prices among the pools whose nodes can host all N, when that surplus is at least 0; else 0.
2. **Placement** (:func:`.integral.withdraw_gangs`): after a pool's policy placed a round's pods, a gang with fewer
   than N replicas running or placed gets none of its new pods (they are unplaced again and their room given back),
   so the market re-prices without it; the integral fill (:mod:`.integral`, ``allocator.integral``'s gang rows) may
   then place the whole gang, or restore a running gang whole, in one pool.
3. **The plan** (:func:`enforce`, after reconcile and migration): a gang job whose plan keeps, binds or creates
   ``0 < k < N`` pods (a pod lost with its node, evicted, failed, and no replacement placed in this plan) is
   released whole: its new pods are not created, its pending pods are deleted and its running pods removed through
   the reconcile phase's removal path (:func:`.reconcile.removal`: the Eviction API once started), whatever the churn
   budget. A gang waiting says why, with numbers (reason ``GangNotPlaceable``).

:func:`walras.planner.invariants.check_plan` checks the result (``PartialGang``).

Rules 1 and 2 live in :mod:`.integral` (the integral stage the rounds phase imports: this module imports the
reconcile phase's removal path, which the rounds do not).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from walras.planner.capacity import NodeTable
from walras.planner.cluster import Cluster, Pod, pod_vector
from walras.planner.model import PodPlan
from walras.planner.reconcile import removal
from walras.planner.results import Actions, Outcome, PlanContext

__all__ = ["LIVE", "Gangs", "enforce", "gang_sizes", "next_pod_rule"]

#: Pod actions after which the pod exists (counted in a gang's k).
LIVE = ("keep", "resize", "bind", "create")


@dataclass(frozen=True)
class Gangs:
    """What the gang phase returns: the actions with every partial gang released whole (:func:`enforce`), the jobs
    released in this plan, and per waiting gang job the message of its ``GangNotPlaceable`` condition."""

    actions: Actions
    released: tuple[tuple[str, str], ...] = ()
    waiting: Mapping[tuple[str, str], str] = field(default_factory=dict)


def gang_sizes(cluster: Cluster) -> dict[tuple[str, str], int]:
    """Per gang job of ``cluster`` as declared (before the lifecycle's backoff or a tenant's cap lower the replicas
    the market may plan), its size N: ``spec.replicas.count`` less its pods that Succeeded (a finished replica is
    done, not lost; a Failed one is lost)."""
    done: dict[tuple[str, str], int] = defaultdict(int)
    for pod in cluster.pods:
        if pod.job is not None and pod.phase == "Succeeded":
            done[(pod.namespace, pod.job)] += 1
    return {job.key: max(job.spec.replicas - done.get(job.key, 0), 0) for job in cluster.jobs
            if job.spec is not None and job.spec.gang}


def enforce(ctx: PlanContext, outcome: Outcome, actions: Actions, sizes: Mapping[tuple[str, str], int]) -> Gangs:
    """Rule 3 of the module docstring over the plan's pod actions: every gang job ends with 0 or N live pods
    (:data:`LIVE`), N its declared size (:func:`gang_sizes`: a gang whose failed pod waits out its backoff, or that
    a tenant's budget caps below N, is released too). Returns a :class:`Gangs` whose ``actions`` share every job's
    plans that did not change (the released jobs' lists are new)."""
    objects = ctx.objects
    rows = [i for i, info in enumerate(objects.jobs) if info.key in sizes]
    if not rows:
        return Gangs(actions)
    pods = {pod.key: pod for pod in ctx.cluster.pods}
    new_pods = dict(actions.pods)
    placed = dict(actions.placed)
    released: list[tuple[str, str]] = []
    waiting: dict[tuple[str, str], str] = {}
    for i in rows:
        info = objects.jobs[i]
        key, big_n = info.key, sizes[info.key]
        plans = actions.pods.get(key, [])
        live = [p for p in plans if p.action in LIVE]
        if 0 < len(live) < big_n:
            new_pods[key] = _released(plans, pods, ctx, big_n, len(live))
            placed[key] = defaultdict(int)
            released.append(key)
        if big_n > 0 and (not live or key in released):
            waiting[key] = _why_waiting(ctx, outcome, i, big_n, len(live) if key in released else 0)
    out = Actions(defaultdict(list, new_pods), actions.deferred, defaultdict(lambda: defaultdict(int), placed),
                  actions.unplaced, dict(waiting))
    return Gangs(out, tuple(released), waiting)


def _released(plans: list[PodPlan], pods: Mapping[tuple[str, str], Pod], ctx: PlanContext, big_n: int,
              k: int) -> list[PodPlan]:
    """A partial gang's plans, released whole: creates dropped, every other live pod removed (a pending one
    deleted, a started one evicted: :func:`.reconcile.removal`)."""
    reason = f"gang of {big_n}: only {k} replica(s) could be kept or placed in one pool; released whole"
    out: list[PodPlan] = []
    for p in plans:
        if p.action == "create":
            continue
        if p.action in LIVE:
            pod = pods.get((p.namespace, p.name))
            action = removal(pod, ctx.table) if pod is not None else "delete"
            out.append(replace(p, requests={}, limits={}, action=action, reason=reason))
        else:
            out.append(p)
    return out


def _amount(resource: str, value: float) -> str:
    """A quantity for a person: bytes of memory and storage in Gi, others as a short number."""
    if resource == "memory" or resource.endswith("storage"):
        return f"{value / 2 ** 30:.3g}Gi"
    return f"{value:.3g}"


def next_pod_rule(table: NodeTable, nodes: np.ndarray, count: np.ndarray, degree_limit: int | None,
                  vec: np.ndarray, priced: str) -> tuple[int, str, str]:
    """How many pods of request ``vec`` the admitted ``nodes`` of a pool take now (per node the fewest of what its
    free vector holds, its free pod slots and its slots under ``degree_limit``, ``count`` the Walras pods per node),
    and the rule that stops the next one once those are placed, with its numbers: ``(can, reason, text)``, the
    reasons of :data:`walras.planner.model.REASONS` in their order (``NoEligibleNode``, ``TooLarge``,
    ``DegreeLimited``, ``InsufficientCpu``/``Memory``/``Resource``, ``Fragmented``, ``InsufficientCapacity``)."""
    if nodes.size == 0:
        return 0, "NoEligibleNode", "no Ready node of the pool admits the pod (taints, nodeSelector, node affinity)"
    alloc = table.alloc[nodes]
    tol = 1e-9 * np.maximum(1.0, alloc)
    big = np.all(alloc + tol >= vec, axis=1)
    if not big.any():
        most = alloc.max(axis=0)
        over = ", ".join(f"{table.resources[r]} {_amount(table.resources[r], float(vec[r]))} > "
                         f"{_amount(table.resources[r], float(most[r]))}" for r in np.flatnonzero(vec > most + 1e-9))
        return 0, "TooLarge", f"the pod requests more than the largest admitted node may allocate: {over}"
    fit = table.fit_count(vec, nodes)
    slots = np.full(nodes.size, 1 << 30, dtype=np.int64) if degree_limit is None else (
        np.maximum(degree_limit - count[nodes], 0).astype(np.int64))
    k = np.minimum(fit, slots)
    can = int(k.sum())
    free = np.maximum(table.free[nodes], 0.0) - k[:, None] * vec  # after the pods that fit are placed
    more = np.all(free + tol >= vec, axis=1)
    c = table.column[priced]
    if (more & (k >= slots)).any():
        return can, "DegreeLimited", (f"{int((more & (k >= slots)).sum())} node(s) have room for another pod but no "
                                      f"slot under the pool's degree limit of {degree_limit} Walras pod(s) per node")
    with_priced = (free[:, c] + tol[:, c] >= vec[c]) & (k < slots)
    if with_priced.any():
        lack = np.maximum(vec - free, 0.0)[with_priced]
        lack[:, c] = 0.0
        best = int(np.argmin((lack / np.maximum(vec, 1e-12)).sum(axis=1)))
        shorts = [(table.resources[r], float(lack[best, r])) for r in np.flatnonzero(lack[best] > 1e-9)]
        names = {r for r, _ in shorts}
        kind = "InsufficientCpu" if "cpu" in names else "InsufficientMemory" if "memory" in names else (
            "InsufficientResource")
        short = ", ".join(f"{r} short by {_amount(r, v)}" for r, v in shorts)
        return can, kind, (f"{int(with_priced.sum())} node(s) have the {vec[c]:g} {priced} a pod needs but not its "
                           f"other requests; on the best node {table.names[int(nodes[with_priced][best])]}: {short}")
    total, largest = float(free[:, c].sum()), float(free[:, c].max())
    if total + 1e-9 >= vec[c] > 0:
        return can, "Fragmented", (f"{total:g} {priced} left free in total but no node has the {vec[c]:g} a pod "
                                   f"needs (at most {largest:g} on one node)")
    return can, "InsufficientCapacity", f"{total:g} {priced} left free, a pod needs {vec[c]:g}"


def _why_waiting(ctx: PlanContext, outcome: Outcome, i: int, big_n: int, released: int) -> str:
    """The ``GangNotPlaceable`` message of waiting gang row i: how many of its pods its best pool could place now
    (after this plan's reservations) and the rule that stops the next one (:func:`next_pod_rule`), with numbers."""
    objects, table, count = ctx.objects, outcome.table, outcome.walras_count
    info = objects.jobs[i]
    spec = info.spec
    best: tuple[int, float, int, str] | None = None
    for j in np.flatnonzero(outcome.offered[i]).tolist() if outcome.offered.shape[0] > i else []:
        pool = objects.pools[j]
        res = pool.spec.resource
        if pool.usable.size == 0:
            here = (0, spec.throughput.get(pool.name, 0.0), -j, "NoReadyNode: the pool matches no Ready node")
        else:
            nodes = pool.usable[ctx.admitted[i][pool.usable]]
            vec = table.vector(pod_vector(ctx.templates[i], spec, res, spec.demand))
            can, reason, text = next_pod_rule(table, nodes, count, pool.spec.degree_limit, vec, res)
            c = table.column[res]
            free = float(np.maximum(table.free[nodes, c], 0.0).sum()) if nodes.size else 0.0
            why = (f"{reason}: needs {big_n * spec.demand:g} {res}, {free:g} free on {nodes.size} admitted node(s); "
                   f"{text}") if can < big_n else (
                f"price {float(outcome.market.prices[j]) if outcome.market.prices.size > j else 0.0:.4g} per {res}: "
                "the bundle's surplus is below 0")
            here = (min(can, big_n), spec.throughput.get(pool.name, 0.0), -j, why)
        if best is None or here[:3] > best[:3]:
            best = here
    head = f"gang of {big_n} needs {big_n} replicas in one pool"
    if released:
        head += f"; it had {released}, so it is released whole"
    if spec.replicas < big_n:
        return f"{head}; {spec.replicas} may run now (failed pods in their backoff, or a tenant's budget cap)"
    if best is None:
        return f"{head}; no pool can run a pod of it"
    can, _, j, why = best
    return f"{head}; best pool {objects.pools[-j].name!r} can place {can} now ({why})"
