"""Read Kubernetes YAML manifests (files or directories, multi-document) into a :class:`Snapshot`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from walras.planner.model import Snapshot

#: Kinds a snapshot holds, and the Snapshot field each goes to.
KINDS = {
    "Node": "nodes",
    "Pod": "pods",
    "ResourcePool": "pools",
    "FungibleJob": "jobs",
    "ColocationProfile": "profiles",
}


def _files(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out.extend(sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()))
        elif path.is_file():
            out.append(path)
        else:
            raise ValueError(f"no such file or directory: {path}")
    return out


def parse_documents(documents: Iterable[Any], source: str = "<input>") -> Snapshot:
    """Sort already-decoded objects (``List`` kinds expanded) into a :class:`Snapshot`; other kinds are ignored."""
    buckets: dict[str, list[Mapping[str, Any]]] = {field: [] for field in KINDS.values()}

    def add(doc: Any, where: str) -> None:
        if doc is None:
            return
        if not isinstance(doc, Mapping):
            raise ValueError(f"{where}: expected a Kubernetes object (a mapping), got {type(doc).__name__}")
        kind = doc.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
            for k, item in enumerate(doc["items"]):
                add(item, f"{where} items[{k}]")
            return
        if kind in KINDS:
            buckets[KINDS[kind]].append(doc)

    for k, doc in enumerate(documents):
        add(doc, f"{source} document {k}")
    return Snapshot(**{field: tuple(objs) for field, objs in buckets.items()})


def load_manifests(paths: str | Path | Iterable[str | Path]) -> Snapshot:
    """Load every ``*.yaml``/``*.yml`` file under ``paths`` (files or directories, searched recursively in name
    order) and return the Nodes, Pods, ResourcePools, FungibleJobs and ColocationProfiles they hold.

    Raises ``ValueError`` naming the file for a missing path or malformed YAML.
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    documents: list[Any] = []
    for path in _files(paths):
        try:
            loaded = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: invalid YAML: {exc}") from None
        snap = parse_documents(loaded, str(path))
        for field in KINDS.values():
            documents.extend(getattr(snap, field))
    return parse_documents(documents)
