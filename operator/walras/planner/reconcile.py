"""Phase *reconcile*: desired replicas vs observed pods -> one :class:`PodPlan` per pod with its action.

* running pods: the first ``target`` of each pool (by name) are kept (``keep``, or ``resize`` when the resize phase
  changed them); the rest are removed (below);
* pending pods: ``bind`` to the node placement chose, ``keep`` (no node yet, with why) when none had room or the
  pool's ``spec.capacity`` is sold out, ``delete`` when no batch holds them (the pool wants fewer);
* new replicas that placement placed: ``create`` (a deterministic name, so a re-create after a restart is idempotent);
  new replicas that found no node are not created (the job's status says why);
* pods of deleted jobs, of pools the job cannot use, on nodes that are gone: removed; pods of a job whose spec is
  invalid: ``keep``.

**How a pod is removed** (:func:`removal`), whatever asks for it (the market's shrink, a pool's ``spec.capacity``, a
suspended, failed or deleted job, a pool the job can no longer use): a pod that has started (phase ``Running``, or a
``status.startTime``) on a node that exists is ``evict``-ed, through the Eviction API, so PodDisruptionBudgets hold;
only a pod that never started (no node, or bound and still ``Pending`` without a start time) or whose node is gone is
``delete``-d (a lost node's pods are force-deleted by the lifecycle phase, after the grace). A running pod on a
NotReady node (within the node-loss grace: past it the lifecycle phase has taken it out) and every running pod of a
pool where most nodes are NotReady (:func:`walras.planner.lifecycle.disruption`) is never removed: it is kept, with
why, and the surplus is taken from the job's other pods in that pool where there are any.

A plan of an unchanged cluster is a fixed point: it keeps what runs, binds pending pods where it bound them before,
and creates nothing (the replica and placement phases keep what exists when it is a valid answer). Removing running
pods is disruptive, so at most ``max_deletes`` per plan (the rest wait for the next plan, said on the job).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter
from typing import cast

import numpy as np

from walras.planner.capacity import NodeTable
from walras.planner.cluster import PODS, Pod
from walras.planner.lifecycle import Disruption, disruption
from walras.planner.model import PodAction, PodPlan
from walras.planner.quantity import format_quantity
from walras.planner.results import Actions, Objects, Observed, Outcome, PlanContext, Resizes
from walras.planner.reuse import Inputs, Same

__all__ = ["Actions", "KeptEntry", "pod_base", "reconcile", "removal"]

_NAME_SAFE = re.compile(r"[^a-z0-9-]+")
_name = attrgetter("name")


def pod_base(job: str, pool: str) -> str:
    """The name stem of a job's pods in a pool (DNS-1123: lower-case, digits, dashes; room left for a counter)."""
    return _NAME_SAFE.sub("-", f"{job}-{pool}".lower()).strip("-")[:240]


def new_pod_name(taken: set[str], base: str, start: int = 0) -> tuple[str, int]:
    """The first free name ``base-N`` (N from ``start``) of a job's new pod, added to ``taken`` (the job's names);
    returns the name and its N."""
    n = start
    while f"{base}-{n}" in taken:
        n += 1
    name = f"{base}-{n}"
    taken.add(name)
    return name, n


def _text(requests: Mapping[str, float]) -> dict[str, str]:
    """Requests as quantity strings, ``pods`` left out (one cached rendering per distinct request vector)."""
    return dict(_text_items(tuple(requests.items())))


@lru_cache(maxsize=4096)
def _text_items(items: tuple[tuple[str, float], ...]) -> tuple[tuple[str, str], ...]:
    return tuple((name, format_quantity(value)) for name, value in sorted(items) if name != PODS)


def removal(pod: Pod, table: NodeTable) -> PodAction:
    """How a pod is removed: ``evict`` (the Eviction API: PodDisruptionBudgets hold) once it has started on a node
    that exists, ``delete`` when it never started (no node; bound but ``Pending`` without a start time) or its node
    is gone."""
    if pod.node is None or pod.node not in table.index:
        return "delete"
    return "evict" if pod.phase == "Running" or pod.started is not None else "delete"


def _held(pod: Pod, pool: str, table: NodeTable, disrupted: Disruption) -> str:
    """Why a running pod may not be removed now (empty when it may): its node is NotReady (within the node-loss
    grace), or most of its pool, or of the cluster, is NotReady."""
    if pod.node is None:
        return ""
    k = table.index.get(pod.node)
    if k is None:
        return ""
    if pod.node in disrupted.held:
        return disrupted.message(pool) or disrupted.message("")
    if not table.nodes[k].ready:
        return f"node {pod.node} is NotReady: its pods are kept within the node-loss grace"
    return ""


@dataclass(frozen=True)
class KeptEntry:
    """The reconcile phase's record of one (job key, pool name) whose running pods were all kept (:mod:`.reuse`):
    ``inputs`` is ``(Same(pods),)``, the pods in name order; ``plans`` their ``keep`` plans in that order;
    ``running`` the observe phase's list of those pods (when the next plan's is the same list object, its name order
    is this one)."""

    inputs: Inputs
    plans: tuple[PodPlan, ...]
    running: list[Pod]

    @property
    def pods(self) -> Sequence[Pod]:
        return cast(Same, self.inputs[0]).items


def reconcile(ctx: PlanContext, observed: Observed, outcome: Outcome, resizes: Resizes) -> Actions:
    """One :class:`PodPlan` per pod (see the module docstring), at most ``ctx.options.max_deletes`` running pods
    deleted. With the context's reuse (:mod:`.reuse`), a pool's running pods that are all kept reuse the recorded
    ``keep`` plans when they are the same pod objects (the translation cache gives an unchanged pod the same object,
    so identity means same content) of the same job and pool: the plans are shared with the previous plan, not
    rebuilt (they are frozen). Jobs with ``spec.migration`` are left out (the migration phase replaces their
    ``keep`` plans by evictions)."""
    objects, reuse = ctx.objects, ctx.reuse
    max_deletes = ctx.options.max_deletes
    out = Actions()
    deletes = 0
    table = ctx.table
    disrupted = disruption(ctx.cluster)

    def delete(pod: Pod, pool: str, reason: str, running: bool) -> None:
        """Remove ``pod`` (:func:`removal`), unless it is held (:func:`_held`) or the churn budget is spent."""
        nonlocal deletes
        key = (pod.namespace, pod.job or "")
        action = removal(pod, table) if running else "delete"
        held = _held(pod, pool, table, disrupted) if action == "evict" else ""
        if held:
            out.pods[key].append(PodPlan(pod.namespace, pod.name, pod.job or "", pool, pod.node, _text(pod.requests),
                                         _text(pod.requests), "keep", True, f"kept ({held}); {reason}"))
            return
        if running and max_deletes is not None and deletes >= max_deletes:
            out.pods[key].append(PodPlan(pod.namespace, pod.name, pod.job or "", pool, pod.node, _text(pod.requests),
                                         _text(pod.requests), "keep", True, f"deletion deferred: {reason}"))
            out.deferred[key] += 1
            return
        if running:
            deletes += 1
        out.pods[key].append(PodPlan(pod.namespace, pod.name, pod.job or "", pool, pod.node, {}, {}, action, True,
                                     reason))

    pools = objects.pools
    targets = outcome.target.tolist()
    done = resizes.done
    texts: dict[int, dict[str, str]] = {}  # id(pod.requests) -> its text (the pods are alive for the whole call)
    # the pending pods the batches hold (each gets its bind/keep plan there)
    batched = {id(pod) for _, _, held in outcome.batches for pod in held if pod is not None}

    def keep(pod: Pod, job_name: str, pool: str) -> PodPlan:
        """The ``keep`` plan of a running pod, its requests written as text once per distinct requests mapping."""
        text = texts.get(id(pod.requests))
        if text is None:
            text = texts[id(pod.requests)] = _text(pod.requests)
        return PodPlan.kept(pod.namespace, pod.name, job_name, pool, pod.node, text)

    for row, info in enumerate(objects.jobs):
        key = info.key
        job_name = info.spec.name
        plans = out.pods[key]
        placed_here = out.placed[key]
        for j, pool in enumerate(pools):
            running = observed.running[row][j]
            pending = observed.pending[row][j]
            if not running and not pending:
                continue
            group = (key, pool.name)
            previous = reuse.recorded(KeptEntry, group)
            # the same running list as the previous plan's (the observe phase reused it): its name order too
            kept: Sequence[Pod] = previous.pods if previous is not None and previous.running is running else sorted(
                running, key=_name)
            want = int(targets[row][j])
            if (kept and len(kept) <= want and info.spec.migration is None
                    and not (done and any((pod.namespace, pod.name) in done for pod in kept))):
                # every running pod kept as it is: the recorded keep plans when they are the same pods
                inputs = (Same(tuple(kept)),)
                hit = reuse.lookup(KeptEntry, inputs, group) if previous is not None else None
                reused = hit.plans if hit is not None else tuple(keep(pod, job_name, pool.name) for pod in kept)
                reuse.store(KeptEntry(inputs, reused, running), group)
                plans.extend(reused)
            else:
                leaving = _leaving(kept, want, pool.name, table, disrupted)
                for pod in kept:
                    if id(pod) in leaving:
                        delete(pod, pool.name, f"surplus: the job wants {want} replica(s) in pool {pool.name!r}",
                               True)
                        continue
                    target = done.get((pod.namespace, pod.name)) if done else None
                    if target is None:
                        plans.append(keep(pod, job_name, pool.name))
                    else:
                        plans.append(PodPlan(pod.namespace, pod.name, job_name, pool.name, pod.node,
                                             dict(target.requests), dict(target.limits), "resize", True,
                                             target.reason))
            if min(len(kept), want) > 0:
                placed_here[pool.name] += min(len(kept), want)
            # a pending pod that no batch of this plan holds (the pool wants fewer, or sells no more: spec.capacity)
            # is deleted (it never started); every other one gets its plan from its batch (_placed): none is lost
            for pod in sorted(pending, key=_name):
                if id(pod) not in batched:
                    delete(pod, pool.name, f"surplus: the job wants {want} replica(s) in pool {pool.name!r}", False)
        if not plans:
            del out.pods[key]
        if not placed_here:
            del out.placed[key]
    _placed(objects, observed, outcome, out)
    _leftovers(objects, observed, outcome, delete, out)
    return out


def _leaving(kept: Sequence[Pod], want: int, pool: str, table: NodeTable, disrupted: Disruption) -> set[int]:
    """The ids of the running pods a pool's surplus removes: the last ``len(kept) - want`` in name order, passing
    over the held ones (:func:`_held`), which stay; when too few pods may go, every held one is still kept (and
    said so by :func:`reconcile`'s ``delete``)."""
    surplus = len(kept) - want
    if surplus <= 0:
        return set()
    if not disrupted.held and all(table.nodes[table.index[p.node]].ready for p in kept if p.node in table.index):
        return {id(p) for p in kept[want:]}
    free = [p for p in kept if not (removal(p, table) == "evict" and _held(p, pool, table, disrupted))]
    chosen = free[len(free) - min(surplus, len(free)):]
    held = [p for p in kept if not any(p is c for c in free)]
    # the held pods beyond the market's count still go through delete(), which keeps them with why
    extra = max(surplus - len(chosen), 0)
    return {id(p) for p in chosen} | {id(p) for p in held[len(held) - min(extra, len(held)):]}


def _placed(objects: Objects, observed: Observed, outcome: Outcome, out: Actions) -> None:
    """The plans of the batches' pods: ``bind`` (or ``keep`` without a node) for a pending pod, ``create`` for a
    new one placed; a wanted pod that found no node counted as unplaced, with why."""
    pools = objects.pools
    table = outcome.table
    rendered: dict[tuple[int, str, float], dict[str, str]] = {}  # (row, priced resource, amount) -> requests text
    for batch, placed, existing in outcome.batches:
        pool = pools[batch.pool]
        priced = pool.spec.resource
        counter: dict[int, int] = defaultdict(int)
        stems: dict[int, str] = {}
        last = -1  # the row the per-row values below are for (a batch lists each row's pods together)
        for q, (row, k, got) in enumerate(zip(batch.rows, placed.node.tolist(), placed.amount.tolist(),
                                              strict=True)):
            if row != last:
                last = row
                info = objects.jobs[row]
                spec = info.spec
                key = info.key
            node = table.names[k] if k >= 0 else None
            held = existing[q]
            amount = float(got) if k >= 0 else spec.demand
            text = rendered.get((row, priced, amount))
            if text is None:
                text = rendered[(row, priced, amount)] = {**spec.resource_text, priced: format_quantity(amount)}
            if held is not None:
                verb: PodAction = "bind" if node is not None else "keep"
                why = "" if node is not None else f"pending: no node takes it ({placed.why[q] or 'no room'})"
                out.pods[key].append(PodPlan(spec.namespace, held.name, spec.name, pool.name, node, dict(text),
                                             dict(text), verb, True, why))
            elif node is not None:
                base = stems.get(row) or stems.setdefault(row, pod_base(spec.name, pool.name))
                name, counter[row] = new_pod_name(observed.taken(key), base, counter[row])
                out.pods[key].append(PodPlan(spec.namespace, name, spec.name, pool.name, node, dict(text),
                                             dict(text), "create", False))
            if node is not None:
                out.placed[key][pool.name] += 1
            elif not batch.optional[q]:
                count, why = out.unplaced[key].get(pool.name, (0, ""))
                out.unplaced[key][pool.name] = (count + 1, why or placed.why[q])


def _leftovers(objects: Objects, observed: Observed, outcome: Outcome, delete: Callable[[Pod, str, str, bool], None],
               out: Actions) -> None:
    """What rounding dropped (unplaced), the surplus pods (deleted) and the pods of invalid jobs (kept)."""
    pools = objects.pools
    table = outcome.table
    for i, j in zip(*np.nonzero(outcome.dropped), strict=True):  # wanted, but the pool has no room for them now
        key = objects.jobs[int(i)].key
        name = pools[int(j)].name
        count, why = out.unplaced[key].get(name, (0, ""))
        out.unplaced[key][name] = (count + int(outcome.dropped[i, j]), why or "InsufficientCapacity")
    for pod, reason in observed.surplus:
        j = int(objects.pool_of_node[table.index[pod.node]]) if pod.node in table.index else -1
        delete(pod, pools[j].name if j >= 0 else (pod.pool or ""), reason, pod.node is not None)
    for pod in observed.frozen:
        out.pods[(pod.namespace, pod.job or "")].append(PodPlan(
            pod.namespace, pod.name, pod.job or "", pod.pool or "", pod.node, _text(pod.requests),
            _text(pod.requests), "keep", True, "the job's spec is invalid: kept as it is"))
