"""The operator's assumed pods, as kube-scheduler's cache keeps them (``AssumePod`` / ``FinishBinding`` / expiry).

The operator plans from an informer cache that lags its own writes: a pod it just created, or bound to a node, is
not in the next snapshot yet, or is there still unbound, or the cache still shows an older pod of the same name.
Planning from that snapshot would sell the same room twice. So every pod the operator creates or binds is *assumed*:
it counts on its node (and as existing) in every plan until the watch shows it there, its node is gone, or its
expiry passes (a write that never shows up). A binding that fails leaves the pod assumed as it is (created, unbound),
so it is placed again, never lost; a pod the operator deleted (or found gone) is forgotten.

:class:`AssumedPods` is the operator's store, with an explicit clock (``now`` arguments) so it is pure to test; the
pure step that adds its pods to a typed cluster is the planner's :func:`walras.planner.assume.overlay`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from walras.planner.assume import confirmed, overlay
from walras.planner.cluster import Cluster, Pod

__all__ = ["DEFAULT_TTL", "AssumedPods", "Seen"]

#: Seconds an assumed pod counts without the watch confirming it (kube-scheduler's default binding TTL is 30 s
#: after the bind finished; ours also covers creation).
DEFAULT_TTL = 30.0

#: What the watch shows of a pod: (uid, nodeName or None).
Seen = Mapping[tuple[str, str], tuple[str, str | None]]


@dataclass
class _Entry:
    pod: Pod
    deadline: float


@dataclass
class AssumedPods:
    """The operator's pods written and not yet confirmed by the watch, keyed by (namespace, name)."""

    ttl: float = DEFAULT_TTL
    _entries: dict[tuple[str, str], _Entry] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._entries)

    def assume(self, pod: Pod, now: float) -> None:
        """Count ``pod`` (created and/or bound to ``pod.node`` by us) until the watch confirms it."""
        self._entries[pod.key] = _Entry(replace(pod, assumed=True), now + self.ttl)

    def forget(self, namespace: str, name: str) -> None:
        """Stop counting a pod (we deleted it, or it is gone)."""
        self._entries.pop((namespace, name), None)

    def prune(self, seen: Seen, nodes: Iterable[str], now: float) -> None:
        """Drop the entries the watch confirms, whose node is gone, or whose expiry passed."""
        names = set(nodes)
        for key, entry in list(self._entries.items()):
            node = entry.pod.node
            if entry.deadline <= now or (node is not None and node not in names) or confirmed(entry.pod,
                                                                                          seen.get(key)):
                del self._entries[key]

    def pods(self) -> tuple[Pod, ...]:
        return tuple(e.pod for e in self._entries.values())

    def overlay(self, cluster: Cluster, now: float) -> Cluster:
        """Prune against ``cluster`` and return it with the remaining assumed pods (:func:`overlay`)."""
        self.prune({p.key: (p.uid, p.node) for p in cluster.pods}, (n.name for n in cluster.nodes), now)
        return overlay(cluster, self.pods())
