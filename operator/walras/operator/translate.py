"""Translations between cluster objects and the planner's data model (no I/O).

* :func:`snapshot_from` builds a :class:`~walras.planner.model.Snapshot` from the operator's caches.
* :func:`pod_manifest` builds the Pod of a :class:`~walras.planner.model.PodPlan` from its FungibleJob's template:
  labels, the planned-node annotation, an owner reference to the job, ``schedulerName`` and the planned
  requests/limits on the first container.
* :func:`status_patch` turns a desired ``status`` into a merge patch that also removes stale keys.
* :func:`event_body` builds a core/v1 Event for an object.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from walras.planner.model import (
    ANNOTATION_NODE,
    API_VERSION,
    LABEL_JOB,
    LABEL_MANAGED,
    LABEL_POOL,
    PodPlan,
    Snapshot,
)

JSON = dict[str, Any]

#: Status keys written by kopf itself; never removed by the operator's status patches.
KOPF_STATUS_KEYS = frozenset({"kopf"})


def snapshot_from(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                  pools: Iterable[Mapping[str, Any]], jobs: Iterable[Mapping[str, Any]],
                  profiles: Iterable[Mapping[str, Any]], namespaces: Iterable[str] = ()) -> Snapshot:
    """A planner snapshot; with ``namespaces`` only the FungibleJobs (and their pods) of those namespaces count,
    while every pod still counts for node usage."""
    allowed = set(namespaces)

    def in_scope(obj: Mapping[str, Any]) -> bool:
        return not allowed or (obj.get("metadata") or {}).get("namespace") in allowed

    kept_pods = []
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(LABEL_MANAGED) == "true" and not in_scope(pod):
            continue
        kept_pods.append(pod)
    return Snapshot(
        nodes=tuple(sorted(nodes, key=_sort_key)),
        pods=tuple(sorted(kept_pods, key=_sort_key)),
        pools=tuple(sorted(pools, key=_sort_key)),
        jobs=tuple(sorted((j for j in jobs if in_scope(j)), key=_sort_key)),
        profiles=tuple(sorted(profiles, key=_sort_key)),
    )


def _sort_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def pod_manifest(job: Mapping[str, Any], pod: PodPlan, scheduler_name: str) -> JSON:
    """The Pod to create for ``pod`` from ``job``'s ``spec.template`` (owner reference, labels, resources)."""
    template = copy.deepcopy((job.get("spec") or {}).get("template") or {})
    job_meta = job.get("metadata") or {}
    if not job_meta.get("uid"):
        raise ValueError(f"FungibleJob {pod.namespace}/{pod.job} has no metadata.uid; cannot own pod {pod.name}")
    meta = template.get("metadata") or {}
    spec = template.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        raise ValueError(f"FungibleJob {pod.namespace}/{pod.job}: spec.template.spec.containers is empty")
    labels = dict(meta.get("labels") or {})
    labels.update({LABEL_JOB: pod.job, LABEL_POOL: pod.pool, LABEL_MANAGED: "true"})
    annotations = dict(meta.get("annotations") or {})
    if pod.node:
        annotations[ANNOTATION_NODE] = pod.node
    resources = dict(containers[0].get("resources") or {})
    if pod.requests:
        resources["requests"] = {**(resources.get("requests") or {}), **pod.requests}
    if pod.limits:
        resources["limits"] = {**(resources.get("limits") or {}), **pod.limits}
    containers[0]["resources"] = resources
    spec["containers"] = containers
    spec["schedulerName"] = scheduler_name
    spec.pop("nodeName", None)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": pod.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [{
                "apiVersion": API_VERSION, "kind": "FungibleJob", "name": pod.job, "uid": job_meta["uid"],
                "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": spec,
    }


def resize_containers(current: Mapping[str, Any], pod: PodPlan) -> list[JSON] | None:
    """The ``containers`` of a resize patch taking the first container to the planned requests/limits, or None if
    it already has them."""
    containers = (current.get("spec") or {}).get("containers") or []
    if not containers:
        return None
    first = containers[0]
    resources = first.get("resources") or {}
    want_req = {**(resources.get("requests") or {}), **pod.requests}
    want_lim = {**(resources.get("limits") or {}), **pod.limits}
    if want_req == (resources.get("requests") or {}) and want_lim == (resources.get("limits") or {}):
        return None
    return [{"name": first.get("name"), "resources": {"requests": want_req, "limits": want_lim}}]


def status_patch(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> JSON | None:
    """A merge patch ``{"status": ...}`` that makes ``current`` status equal ``desired`` (stale keys set to null),
    or None when nothing changes. kopf's own keys are left alone."""
    current = dict(current or {})
    for key in KOPF_STATUS_KEYS:
        current.pop(key, None)
    if _same(current, desired):
        return None
    return {"status": _replace(current, desired)}


def stamp_conditions(current: Mapping[str, Any] | None, desired: Mapping[str, Any], generation: Any,
                     now: str | None = None) -> JSON:
    """``desired`` with its conditions in ``metav1.Condition`` shape: ``lastTransitionTime`` kept from the current
    condition of the same type while its status is unchanged (else ``now``), and ``observedGeneration``."""
    previous = {c.get("type"): c for c in (current or {}).get("conditions") or [] if isinstance(c, Mapping)}
    stamp = now or _now()
    out = dict(desired)
    conditions = []
    for condition in desired.get("conditions") or []:
        old = previous.get(condition.get("type"))
        unchanged = old is not None and old.get("status") == condition.get("status")
        kept = old.get("lastTransitionTime") if old is not None and unchanged else None
        entry = {**condition, "lastTransitionTime": kept or stamp}
        if isinstance(generation, int):
            entry["observedGeneration"] = generation
        conditions.append(entry)
    out["conditions"] = conditions
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
        return float(a) == float(b)
    return bool(a == b)


def _replace(old: Any, new: Any) -> Any:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: JSON = {k: None for k in old if k not in new}
        for key, value in new.items():
            out[key] = _replace(old.get(key), value)
        return out
    return copy.deepcopy(new)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(involved: Mapping[str, Any], type_: str, reason: str, message: str, instance: str) -> JSON:
    """A core/v1 Event about ``involved`` (an object with apiVersion, kind, metadata)."""
    meta = involved.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    now = _now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name', 'walras')}.", "namespace": namespace},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion"), "kind": involved.get("kind"), "name": meta.get("name"),
            "namespace": meta.get("namespace", ""), "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason[:128],
        "message": message[:1024],
        "type": type_,
        "source": {"component": "walras"},
        "reportingComponent": "walras.dev/operator",
        "reportingInstance": instance[:128],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
