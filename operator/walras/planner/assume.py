"""Assumed pods, as kube-scheduler's cache keeps them (``AssumePod`` / ``FinishBinding`` / expiry).

The operator plans from an informer cache that lags its own writes: a pod it just created, or bound to a node, is
not in the next snapshot yet, or is there still unbound, or the cache still shows an older pod of the same name.
Planning from that snapshot would sell the same room twice. So every pod the operator creates or binds is *assumed*:
it counts on its node (and as existing) in every plan until the watch shows it there, its node is gone, or its
expiry passes (a write that never shows up). A binding that fails leaves the pod assumed as it is (created, unbound),
so it is placed again, never lost; a pod the operator deleted (or found gone) is forgotten.

This module is the pure step the planner applies to a typed cluster (:func:`overlay`, ``build_plan(assumed=...)``)
and the test both sides share (:func:`confirmed`); the operator's store of assumed pods, with its expiry, is
:class:`walras.operator.assumed.AssumedPods`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from walras.planner.cluster import Cluster, Pod

__all__ = ["confirmed", "overlay"]


def confirmed(assumed: Pod, seen: tuple[str, str | None] | None) -> bool:
    """Whether the watch shows ``assumed`` as written: the same pod (uid, where both are known), bound when we bound
    it (a pod we only created is confirmed once it shows up at all)."""
    if seen is None:
        return False
    uid, node = seen
    if uid and assumed.uid and uid != assumed.uid:
        return False  # the cache still shows an older pod of that name
    return node is not None or assumed.node is None


def overlay(cluster: Cluster, assumed: Sequence[Pod]) -> Cluster:
    """``cluster`` with each assumed pod that the cluster does not confirm added, or put in place of the cached pod
    of its name; assumed pods on nodes the cluster does not have are left out (the pod went with its node)."""
    if not assumed:
        return cluster
    seen = {pod.key: pod for pod in cluster.pods}
    nodes = {node.name for node in cluster.nodes}
    extra: dict[tuple[str, str], Pod] = {}
    for pod in assumed:
        current = seen.get(pod.key)
        if confirmed(pod, (current.uid, current.node) if current is not None else None):
            continue
        if pod.node is not None and pod.node not in nodes:
            continue
        extra[pod.key] = replace(pod, assumed=True)
    if not extra:
        return cluster
    pods = [extra.pop(pod.key, pod) for pod in cluster.pods]
    pods.extend(extra.values())
    pods.sort(key=lambda p: (p.namespace, p.name))
    return replace(cluster, pods=tuple(pods))
