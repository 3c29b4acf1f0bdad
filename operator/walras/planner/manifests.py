"""Read Kubernetes YAML manifests (files or directories, multi-document) into a :class:`Snapshot`.

YAML is decoded by libyaml (``yaml.CSafeLoader``, 7x faster than the pure-Python loader on 20,000 pods) where PyYAML
was built with it. Walras objects are validated against the CRDs in ``crds/`` (:mod:`walras.planner.schema`: the
structural schema with unknown fields refused, and the CEL rules), as ``kubectl apply --validate=strict`` would; a
file with an invalid object is an error naming the file, the object and the field path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from walras.planner.model import Snapshot

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

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


def load_manifests(paths: str | Path | Iterable[str | Path], *, validate: bool = True) -> Snapshot:
    """Load every ``*.yaml``/``*.yml`` file under ``paths`` (files or directories, searched recursively in name
    order) and return the Nodes, Pods, ResourcePools, FungibleJobs and ColocationProfiles they hold.

    Raises ``ValueError`` naming the file for a missing path, malformed YAML, an object that breaks its CRD's schema
    or rules (``validate``), or paths that hold no manifest at all.
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    documents: list[Any] = []
    files = _files(paths)
    if not files:
        raise ValueError(f"no *.yaml or *.yml file under {', '.join(str(p) for p in paths)}")
    for path in files:
        try:
            with path.open("rb") as handle:
                loaded = list(yaml.load_all(handle, Loader=_Loader))
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: invalid YAML: {exc}") from None
        snap = parse_documents(loaded, str(path))
        for field in KINDS.values():
            documents.extend(getattr(snap, field))
        if validate:
            _validate(path, [*snap.pools, *snap.jobs, *snap.profiles])
    if not documents:
        raise ValueError(f"no Node, Pod, ResourcePool, FungibleJob or ColocationProfile in {len(files)} file(s) "
                         f"under {', '.join(str(p) for p in paths)}")
    return parse_documents(documents)


def _validate(path: Path, objects: Iterable[Mapping[str, Any]]) -> None:
    from walras.planner.schema import validate

    for obj in objects:
        errors = validate(obj)
        if errors:
            meta = obj.get("metadata") or {}
            namespace = meta.get("namespace")
            name = f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))
            raise ValueError(f"{path}: {obj.get('kind')} {name}: {'; '.join(errors)}")
