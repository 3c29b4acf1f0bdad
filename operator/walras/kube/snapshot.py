"""What the watch delivers, as the planner reads it: the :class:`~walras.planner.model.Snapshot` of the operator's
caches (:func:`snapshot_from`) and the part of one object that matters to a plan (:func:`fingerprint`).

:func:`fingerprint` is the decode itself (:mod:`walras.kube.decode`, the one parse of an API object into the
planner's typed values), so an event triggers a re-plan exactly when it changes something the planner reads, and a
field the planner starts reading needs no second list here. One part is left out: a FungibleJob's reported status
(:class:`~walras.planner.cluster.ReportedStatus`), which the operator itself writes from the plan, so that its own
status writes never trigger the next plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from walras.kube.decode import (
    budget_from,
    job_from,
    namespace_labels,
    node_from,
    pod_from,
    pool_from,
    priority_classes,
    profile_from,
    quota_from,
)
from walras.planner.cluster import BudgetReported, ReportedStatus
from walras.planner.model import LABEL_MANAGED, Snapshot

#: The decode of each watched kind (kind -> raw object -> typed value).
DECODERS: Mapping[str, Any] = {
    "Node": node_from,
    "Pod": pod_from,
    "FungibleJob": job_from,
    "ResourcePool": pool_from,
    "ColocationProfile": profile_from,
    "Budget": budget_from,  # docs/budgets.md; its reported spend left out, as a job's status
    "Namespace": lambda obj: namespace_labels((obj,)),  # its labels, for the Budgets' selectors
    "PriorityClass": lambda obj: priority_classes((obj,)),  # its value and globalDefault (docs/preemption.md)
    "ResourceQuota": quota_from,  # a namespace's limits (docs/refusals.md); its status.used is left out
}

_UNREPORTED = ReportedStatus()


def fingerprint(kind: str, obj: Mapping[str, Any]) -> Any:
    """What of ``obj`` (a ``kind`` object) matters to the plan: its decode (:data:`DECODERS`), less a job's
    reported status; two objects with equal fingerprints plan alike. A change of anything else (heartbeats, our own
    status writes, resource versions, labels the planner does not read) does not trigger a re-plan."""
    decoded = DECODERS[kind](obj)
    if kind == "FungibleJob":
        return replace(decoded, reported=_UNREPORTED)
    if kind == "Budget":
        return replace(decoded, reported=BudgetReported())
    if kind == "ResourcePool":  # its preemption times are the operator's own status writes
        return replace(decoded, preemptions=())
    return decoded


def object_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """``(namespace, name)`` of a raw object (the empty namespace for a cluster-scoped one)."""
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def snapshot_from(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                  pools: Iterable[Mapping[str, Any]], jobs: Iterable[Mapping[str, Any]],
                  profiles: Iterable[Mapping[str, Any]], namespaces: Iterable[str] = (), *,
                  budgets: Iterable[Mapping[str, Any]] = (), namespace_objects: Iterable[Mapping[str, Any]] = (),
                  priorityclasses: Iterable[Mapping[str, Any]] = (),
                  resourcequotas: Iterable[Mapping[str, Any]] = ()) -> Snapshot:
    """A planner snapshot, each kind in (namespace, name) order; with ``namespaces`` only the FungibleJobs (and
    their pods) of those namespaces count, while every pod still counts for node usage."""
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
        nodes=tuple(sorted(nodes, key=object_key)),
        pods=tuple(sorted(kept_pods, key=object_key)),
        pools=tuple(sorted(pools, key=object_key)),
        jobs=tuple(sorted((j for j in jobs if in_scope(j)), key=object_key)),
        profiles=tuple(sorted(profiles, key=object_key)),
        budgets=tuple(sorted(budgets, key=object_key)),
        namespaces=tuple(sorted(namespace_objects, key=object_key)),
        priorityclasses=tuple(sorted(priorityclasses, key=object_key)),
        resourcequotas=tuple(sorted(resourcequotas, key=object_key)),
    )
