"""The controller's view of the watch: which events matter to the plan (:class:`Watcher`) and the objects of the
snapshot a plan was built from, by key (:class:`SnapshotIndex`, built once per plan and read by the actuator and
the status writer)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from walras.kube.snapshot import fingerprint, object_key
from walras.planner.model import Snapshot

RawObject = Mapping[str, Any]
ObjectKey = tuple[str, str]


@dataclass
class Watcher:
    """The fingerprint (:func:`walras.kube.snapshot.fingerprint`) of every object seen, by (kind, namespace, name):
    an event matters when it deletes an object or changes its fingerprint."""

    _fingerprints: dict[tuple[str, str, str], Any] = field(default_factory=dict)

    def changed(self, kind: str, event_type: str | None, obj: RawObject) -> str | None:
        """Record an event; why it matters to the plan (``"Pod ns/name changed"``), or None when it does not."""
        key = (kind, *object_key(obj))
        if event_type == "DELETED":
            self._fingerprints.pop(key, None)
            return f"{kind} {key[1]}/{key[2]} deleted"
        fp = fingerprint(kind, obj)
        if self._fingerprints.get(key) == fp:
            return None
        self._fingerprints[key] = fp
        return f"{kind} {key[1]}/{key[2]} changed"


@dataclass(frozen=True)
class SnapshotIndex:
    """The raw objects of one snapshot by (namespace, name), per kind (pools and profiles under the empty
    namespace): what the actuator acts on and what statuses and Events are written to."""

    pods: Mapping[ObjectKey, RawObject]
    jobs: Mapping[ObjectKey, RawObject]
    pools: Mapping[ObjectKey, RawObject]
    profiles: Mapping[ObjectKey, RawObject]

    @classmethod
    def of(cls, snapshot: Snapshot) -> SnapshotIndex:
        def by_key(objs: tuple[RawObject, ...]) -> dict[ObjectKey, RawObject]:
            return {object_key(obj): obj for obj in objs}

        return cls(by_key(snapshot.pods), by_key(snapshot.jobs), by_key(snapshot.pools), by_key(snapshot.profiles))

    def involved(self, kind: str, namespace: str, name: str) -> RawObject | None:
        """The object a plan Event is about (``kind`` one of Pod, FungibleJob, ResourcePool, ColocationProfile)."""
        kinds = {"Pod": self.pods, "FungibleJob": self.jobs, "ResourcePool": self.pools,
                 "ColocationProfile": self.profiles}
        objects = kinds.get(kind)
        return None if objects is None else objects.get((namespace, name))
