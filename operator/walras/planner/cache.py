"""Assumed pods, as kube-scheduler's cache keeps them (``AssumePod`` / ``FinishBinding`` / expiry).

The operator plans from an informer cache that lags its own writes: a pod it just created, or bound to a node, is
not in the next snapshot yet, or is there still unbound. Planning from that snapshot would sell the same room twice.
So every pod the operator creates or binds is *assumed*: it counts on its node (and as existing) in every plan until
the watch shows it there, it is seen deleted, or its expiry passes (a write that never shows up, say a create that
failed after all). A binding that fails is forgotten at once, so the pod is re-planned, never lost.

This is a plain data structure with an explicit clock (``now`` arguments), so it is pure to test; the operator owns
the one instance and calls :meth:`AssumedPods.overlay` on each snapshot's typed cluster before planning.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from walras.planner.cluster import Cluster, Pod

#: Seconds an assumed pod counts without the watch confirming it (kube-scheduler's default binding TTL is 30 s
#: after the bind finished; ours also covers creation).
DEFAULT_TTL = 30.0


@dataclass
class _Entry:
    pod: Pod
    deadline: float


@dataclass
class AssumedPods:
    """Pods written by us and not yet confirmed by the watch, keyed by (namespace, name)."""

    ttl: float = DEFAULT_TTL
    _entries: dict[tuple[str, str], _Entry] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._entries)

    def assume(self, pod: Pod, now: float) -> None:
        """Count ``pod`` (created and/or bound to ``pod.node`` by us) until the watch confirms it."""
        self._entries[pod.key] = _Entry(replace(pod, assumed=True), now + self.ttl)

    def forget(self, namespace: str, name: str) -> None:
        """Stop counting a pod (its create or binding failed: the next plan places it again)."""
        self._entries.pop((namespace, name), None)

    def pods(self) -> list[Pod]:
        return [e.pod for e in self._entries.values()]

    def overlay(self, cluster: Cluster, now: float) -> Cluster:
        """``cluster`` with the assumed pods the watch has not confirmed added (or, for a pod seen still unbound,
        replaced by its assumed binding); confirmed, deleted-after-seen and expired entries are dropped."""
        seen = {pod.key: pod for pod in cluster.pods}
        extra: dict[tuple[str, str], Pod] = {}
        for key, entry in list(self._entries.items()):
            current = seen.get(key)
            if entry.deadline <= now:
                del self._entries[key]
                continue
            if current is not None and (current.node is not None or entry.pod.node is None):
                del self._entries[key]  # the watch shows it (bound, or we only created it): confirmed
                continue
            if current is not None and current.uid and entry.pod.uid and current.uid != entry.pod.uid:
                del self._entries[key]  # a different pod of the same name: ours is gone
                continue
            extra[key] = entry.pod
        if not extra:
            return cluster
        pods = [extra.pop(pod.key, pod) for pod in cluster.pods]
        pods.extend(extra.values())
        pods.sort(key=lambda p: (p.namespace, p.name))
        return replace(cluster, pods=tuple(pods))
