"""The status writer: a plan's statuses of pools, jobs and profiles as merge patches, and its Events, once each."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from walras.kube.client import KubeClient
from walras.kube.encode import (
    job_status,
    pool_status,
    profile_status,
    stamp_conditions,
    status_patch,
    with_resize_pending,
)
from walras.kube.errors import NotFound
from walras.operator.actuator import refusal_delay
from walras.operator.recorder import Recorder
from walras.operator.watch import ObjectKey, RawObject, SnapshotIndex
from walras.planner.cluster import Refusal
from walras.planner.model import API_VERSION, Plan, rfc3339

#: How many posted Events are remembered (a repeat Event is harmless; the memory stays bounded).
POSTED_LIMIT = 50_000


#: The condition a job gets while some of its pods' evictions are refused (by a PodDisruptionBudget).
EVICTION_BLOCKED = "EvictionBlocked"


def with_eviction_blocked(status: Mapping[str, Any], message: str | None) -> dict[str, Any]:
    """A job's ``status`` with the ``EvictionBlocked`` condition (reason ``DisruptionBudget``) added when
    ``message`` says which pods' evictions the API server refuses, and why (truncated to the condition's 32 KiB)."""
    if not message:
        return dict(status)
    condition = {"type": EVICTION_BLOCKED, "status": "True", "reason": "DisruptionBudget", "message": message[:32000]}
    return {**status, "conditions": [*(status.get("conditions") or []), condition]}


def with_refusal(status: Mapping[str, Any], refusal: Refusal | None, generation: Any) -> dict[str, Any]:
    """A job's ``status`` with ``admissionRefusal`` (the actuator's record of the API server's refusal of its pod
    creations, docs/refusals.md) when there is one, for ``metadata.generation`` ``generation``: what a restarted
    operator reads back (:func:`walras.kube.decode.refusal_from`). Without one the key is absent, so the status
    patch clears a record that has ended. ``retryTime`` is rounded up to the second (a restart never asks early)."""
    if refusal is None or refusal.until is None:
        return dict(status)
    record = {"code": refusal.code, "message": refusal.message[:32000], "pods": refusal.pods,
              "attempts": refusal.attempts, "delaySeconds": refusal_delay(refusal.attempts),
              "retryTime": rfc3339(math.ceil(refusal.until))}
    if isinstance(generation, int) and not isinstance(generation, bool):
        record["observedGeneration"] = generation
    return {**status, "admissionRefusal": record}


def without_refused_pods(status: Mapping[str, Any], namespace: str, refusal: Refusal | None,
                         pods: Mapping[ObjectKey, Any]) -> dict[str, Any]:
    """A job's ``status`` whose ``pods`` list keeps only the pods that exist (``pods``: the snapshot's, by key)
    while the API server refuses the job's creations (``refusal`` with a retry time): the status says what runs,
    not what the plan hoped to create (the pods of a retry that the API server refused again)."""
    if refusal is None or refusal.until is None or not isinstance(status.get("pods"), list):
        return dict(status)
    kept = [p for p in status["pods"] if not isinstance(p, Mapping) or (namespace, p.get("name")) in pods]
    return {**status, "pods": kept}


@dataclass
class StatusWriter:
    """Writes each status that differs from what the object (or our last write to it) shows, and posts each plan
    Event once."""

    client: KubeClient
    recorder: Recorder
    #: (kind, namespace, name) -> (the object's resourceVersion when we wrote, the status we wrote)
    _written: dict[tuple[str, str, str], tuple[Any, Any]] = field(default_factory=dict)
    _posted: set[tuple[str, str, str, str, str]] = field(default_factory=set)

    def status_calls(self, plan: Plan, index: SnapshotIndex, resize_pending: Mapping[ObjectKey, str],
                     eviction_blocked: Mapping[ObjectKey, str] | None = None,
                     refusals: Mapping[ObjectKey, Refusal] | None = None) -> Iterable[Awaitable[None]]:
        """The status writes of ``plan``: every pool, job and profile of ``index`` it has a status for (a job with
        ``resize_pending`` pods gets the ``ResizePending`` condition, one whose evictions a PodDisruptionBudget
        refuses the ``EvictionBlocked`` condition with the API server's message, :func:`with_eviction_blocked`,
        one whose pod creations the API server refuses its ``admissionRefusal`` record, :func:`with_refusal`)."""
        blocked = eviction_blocked or {}
        refused = refusals or {}
        base = f"/apis/{API_VERSION}"
        for name, pool_plan in plan.pools.items():
            obj = index.pools.get(("", name))
            if obj is not None:
                yield self._write(("ResourcePool", "", name), f"{base}/resourcepools/{name}", obj,
                                  pool_status(pool_plan))
        for key, job_plan in plan.jobs.items():
            obj = index.jobs.get(key)
            if obj is not None:
                status = with_eviction_blocked(with_resize_pending(job_status(job_plan), resize_pending.get(key)),
                                               blocked.get(key))
                status = with_refusal(status, refused.get(key), (obj.get("metadata") or {}).get("generation"))
                status = without_refused_pods(status, key[0], refused.get(key), index.pods)
                yield self._write(("FungibleJob", *key), f"{base}/namespaces/{key[0]}/fungiblejobs/{key[1]}", obj,
                                  status)
        for name, conditions in plan.profiles.items():
            obj = index.profiles.get(("", name))
            if obj is not None:
                desired = profile_status(conditions, (obj.get("metadata") or {}).get("generation"))
                yield self._write(("ColocationProfile", "", name), f"{base}/colocationprofiles/{name}", obj, desired)

    async def _write(self, key: tuple[str, str, str], path: str, obj: RawObject, desired: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        current = obj.get("status")
        written = self._written.get(key)
        if written is not None and written[0] == meta.get("resourceVersion"):
            current = written[1]  # our last write is newer than the cached object
        desired = stamp_conditions(current, desired, meta.get("generation"))
        patch = status_patch(current, desired)
        if patch is None:
            return
        try:
            result = await self.client.patch_status(path, patch)
        except NotFound:
            return
        self._written[key] = (meta.get("resourceVersion"), result.get("status"))

    def event_calls(self, plan: Plan, index: SnapshotIndex) -> Iterable[Awaitable[None]]:
        """The Events of ``plan`` not posted before, about objects of ``index``."""
        for ev in plan.events:
            ident = (ev.kind, ev.namespace, ev.name, ev.reason, ev.message)
            if ident in self._posted:
                continue
            involved = index.involved(ev.kind, ev.namespace, ev.name)
            if involved is None:
                continue
            if len(self._posted) > POSTED_LIMIT:
                self._posted.clear()
            self._posted.add(ident)
            yield self.recorder.event(involved, ev.type, ev.reason, ev.message)
