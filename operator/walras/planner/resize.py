"""Phase *resize*: running pods whose planned requests/limits changed (in-place resize, KEP-1287).

A running pod of a job in a pool is planned the job's per-task ``spec.resources`` and, for the pool's priced
resource, the job's demand per replica (under the ``utility`` policy the amount AA gave the pod stays: AA decides it
per pod). They are compared with the pod's first container (the one Walras writes): a request that differs, or a
limit that exists and differs, needs a resize. Only cpu and memory change in place; a change of any other resource
(a GPU count) waits for the next pod (``later``). A resource the container does not request at all is not added in
place (that would change the pod's QoS class, which in-place resize does not allow). An increase must fit what its
node has left on every resource; where it does not, the pod keeps its resources (``blocked``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from walras.planner.capacity import NodeTable
from walras.planner.cluster import Pod
from walras.planner.quantity import format_quantity, parse_quantity
from walras.planner.results import Objects, Observed, PlanContext, Resizes, ResizeTarget
from walras.planner.reuse import Inputs, Same
from walras.planner.spec import JobSpec, PoolSpec

__all__ = ["RESIZABLE", "ResizeEntry", "ResizeTarget", "Resizes", "plan_resizes", "resize_target"]

#: The resources Kubernetes can change in a running pod (in-place resize, KEP-1287: cpu and memory only).
RESIZABLE = frozenset({"cpu", "memory"})

_Items = tuple[tuple[str, str], ...]


@lru_cache(maxsize=4096)
def _parse_items(items: _Items) -> tuple[tuple[str, float], ...]:
    out = []
    for name, raw in items:
        try:
            out.append((name, parse_quantity(raw)))
        except ValueError:
            continue
    return tuple(out)


def _differs(a: float, b: float) -> bool:
    return abs(a - b) > 1e-9 * max(1.0, abs(a), abs(b))


def _target(job: JobSpec, pool: PoolSpec, first: tuple[_Items, _Items]) -> ResizeTarget | None:
    requests_raw, limits_raw = first
    merged = {**dict(limits_raw), **dict(requests_raw)}
    current = dict(_parse_items(tuple(sorted(merged.items()))))
    limits = dict(_parse_items(limits_raw))
    wanted = dict(job.resources)
    wanted_text = dict(job.resource_text)
    priced = pool.resource
    wanted[priced] = current[priced] if pool.policy == "utility" and current.get(priced, 0.0) > 0 else job.demand
    wanted_text[priced] = format_quantity(wanted[priced])
    changes, added = [], []
    for name in sorted(wanted):
        have = current.get(name)
        if have is None:
            if wanted[name] > 0:
                added.append(name)
            continue
        limit = limits.get(name)
        if _differs(have, wanted[name]) or (limit is not None and _differs(limit, wanted[name])):
            changes.append((name, have, wanted[name]))
    if not changes and not added:
        return None
    now = [c for c in changes if c[0] in RESIZABLE]
    later = [c for c in changes if c[0] not in RESIZABLE]
    requests = {name: format_quantity(value) for name, value in current.items()}
    requests.update(dict(requests_raw))
    limits_text = dict(limits_raw)
    for name, _, _ in now:
        requests[name] = wanted_text[name]
        if name in limits:
            limits_text[name] = wanted_text[name]
    reason = ", ".join(f"{name} {format_quantity(have)} -> {wanted_text[name]}" for name, have, _ in now)
    waits = ", ".join(
        [f"{name} {format_quantity(have)} -> {wanted_text[name]}" for name, have, _ in later]
        + [f"{name} not requested -> {wanted_text[name]}" for name in added]
    )
    delta = tuple((name, want - have) for name, have, want in now if _differs(have, want))
    return ResizeTarget(requests, limits_text, delta, reason, waits)


def resize_target(job: JobSpec, pool: PoolSpec, pod: Pod) -> ResizeTarget | None:
    """What running ``pod`` of ``job`` in ``pool`` must be resized to, or None when it already has it."""
    return _target(job, pool, pod.first)


def _inputs(objects: Objects) -> tuple[list[tuple[Any, ...]], list[tuple[str, str]]]:
    """What :func:`resize_target` reads of the jobs (per row) and pools."""
    return ([(info.spec.resources, info.spec.resource_text, info.spec.demand) for info in objects.jobs],
            [(pool.spec.resource, pool.spec.policy) for pool in objects.pools])


@dataclass(frozen=True)
class ResizeEntry:
    """The resize phase's record (:mod:`.reuse`), kept only when it resized, blocked and deferred nothing: the
    running pod lists and what :func:`resize_target` reads of the jobs and pools, in ``inputs``
    (``(Same((running,)), jobs and pools)``)."""

    inputs: Inputs


def plan_resizes(ctx: PlanContext, observed: Observed) -> Resizes:
    """Decide every running pod's resize; the result's ``table`` is the context's node table with the increases
    reserved (a copy; the context's own table is not written), which the later phases read (before placement, so
    new pods see the resized amounts). With the context's reuse (:mod:`.reuse`): when the recorded plan resized
    nothing, blocked nothing and deferred nothing, and this plan's running pods are the same lists (the observe phase
    reused them, so the same pods in the same job rows and pools) and each row's job asks the same resources and
    demand of the same pool resources and policies, nothing is resized now either (no pod's target changed, and the
    node room is read only for a resize); this plan's is recorded when it is empty."""
    reuse = ctx.reuse
    inputs = (Same((observed.running,)), _inputs(ctx.objects))
    hit = reuse.lookup(ResizeEntry, inputs)
    if hit is not None:
        reuse.store(hit)
        return Resizes(table=ctx.table)
    out = _plan_resizes(ctx.objects, observed, ctx.table)
    if not (out.done or out.blocked or out.later):
        reuse.store(ResizeEntry(inputs))
    return out


def _plan_resizes(objects: Objects, observed: Observed, given: NodeTable) -> Resizes:
    table = given.copy()
    out = Resizes(table=table)
    memo: dict[tuple[int, int, tuple[_Items, _Items]], ResizeTarget | None] = {}
    for row, info in enumerate(objects.jobs):
        for j, pods in enumerate(observed.running[row]):
            last: tuple[_Items, _Items] | None = None  # pods of a group mostly share one ``first`` (translate)
            target: ResizeTarget | None = None
            for pod in pods:
                if pod.first is not last:
                    last = pod.first
                    key = (row, j, last)
                    if key not in memo:
                        memo[key] = resize_target(info.spec, objects.pools[j].spec, pod)
                    target = memo[key]
                if target is None:
                    continue
                if target.later:
                    out.later.setdefault(info.key, []).append(f"{pod.name} ({target.later})")
                if not target.reason:
                    continue
                k = table.index[pod.node] if pod.node is not None else -1
                change = table.vector(dict(target.delta))
                short = [table.resources[r] for r in np.flatnonzero(change > 0)
                         if table.used[k, r] + change[r] > table.alloc[k, r] + 1e-9]
                if short:
                    out.blocked.setdefault(info.key, []).append(
                        f"{pod.name} ({target.reason}): node {pod.node} lacks {', '.join(short)}")
                    continue
                table.add(k, change)
                out.done[pod.key] = target
    return out
