"""Read Kubernetes manifests (YAML or JSON files, or directories of them) into a :class:`Snapshot`.

YAML is decoded by :func:`walras.manifests.reader.load_yaml` with ``yaml.SafeLoader``'s semantics (YAML 1.1 implicit
types, anchors and aliases, merge keys), JSON by ``json.loads``. Walras objects are validated against the CRDs in
``crds/`` (:mod:`walras.manifests.schema`: the structural schema with unknown fields refused, and the CEL rules), as
``kubectl apply --validate=strict`` would; a file with an invalid object is an error naming the file, the object and
the field path.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from walras.manifests.reader import load_yaml
from walras.planner.model import Snapshot

__all__ = [
    "GROUP",
    "KINDS",
    "PIECE_BYTES",
    "SUFFIXES",
    "WORKLOADS",
    "decode",
    "join_snapshots",
    "load_manifests",
    "load_piece",
    "load_yaml",
    "parse_documents",
    "read_file",
    "split_manifests",
    "unknown_kind",
]

#: File suffixes a directory is searched for (:func:`read_file` decodes each).
SUFFIXES = (".yaml", ".yml", ".json")

#: Kinds a snapshot holds, and the Snapshot field each goes to.
KINDS = {
    "Node": "nodes",
    "Pod": "pods",
    "ResourcePool": "pools",
    "FungibleJob": "jobs",
    "ColocationProfile": "profiles",
    "Budget": "budgets",
    "Namespace": "namespaces",
    "ResourceQuota": "resourcequotas",  # a namespace's limits in the plan (docs/refusals.md)
}


#: Kubernetes workload kinds that Walras does not plan: a manifest of one is an error telling how to describe it.
WORKLOADS = ("Job", "CronJob", "Deployment", "StatefulSet", "ReplicaSet", "DaemonSet", "ReplicationController",
             "PyTorchJob", "TFJob", "MPIJob", "RayJob", "JobSet")

#: The API group of the Walras kinds (``walras.dev/v1alpha1``): an object of this group of a kind not in
#: :data:`KINDS` is an error, never skipped.
GROUP = "walras.dev"


def unknown_kind(doc: Mapping[str, Any], where: str) -> str | None:
    """The error for a manifest whose kind ``walras plan`` would otherwise skip silently (issue 29), with the fix, or
    ``None`` for an object to read or to pass over:

    ======================================================  ==========================================================
    object                                                  result
    ======================================================  ==========================================================
    a kind of :data:`KINDS`                                 ``None`` (read)
    a kind close to one of :data:`KINDS` (``FungibleJobs``,  error: "did you mean FungibleJob?" (``difflib``, cutoff
    ``Resourcepool``), or any other kind of the             0.75, case-insensitive)
    ``walras.dev`` group
    a workload of :data:`WORKLOADS` (a ``batch/v1`` Job)    error: Walras plans FungibleJobs; how to write one
    a missing or non-string kind                            error
    any other kind (Namespace, ConfigMap, Service, ...)     ``None`` (passed over: nothing the planner reads)
    ======================================================  ==========================================================
    """
    kind = doc.get("kind")
    api = str(doc.get("apiVersion") or "")
    if kind in KINDS:
        return None
    if not isinstance(kind, str) or not kind:
        return f"{where}: an object without a kind (expected one of {', '.join(KINDS)})"
    named = f"{where}: kind {kind!r}" + (f" ({api})" if api else "")
    lowered = {k.lower(): k for k in KINDS}
    close = difflib.get_close_matches(kind.lower(), list(lowered), n=1, cutoff=0.75)
    if close:
        return f"{named} is not a kind walras reads: did you mean {lowered[close[0]]}?"
    if api.split("/")[0] == GROUP:
        ours = ", ".join(k for k in KINDS if k not in ("Node", "Pod"))
        return f"{named} is not a Walras kind: the {GROUP} kinds are {ours}"
    if kind in WORKLOADS:
        return (f"{named} is not planned by walras: describe the workload as a FungibleJob (apiVersion "
                f"{GROUP}/v1alpha1; spec.template its pod template, spec.throughput its work rate on each pool, "
                "spec.demand its accelerators per replica; see examples/jobs/), or leave it to the default scheduler")
    return None


def _manifest_files(paths: str | Path | Iterable[str | Path]) -> tuple[list[str | Path], list[Path]]:
    """``paths`` as a list, and the manifest files under them (:func:`_files`); ``ValueError`` where there is
    none."""
    named: list[str | Path] = [paths] if isinstance(paths, str | Path) else list(paths)
    files = _files(named)
    if not files:
        raise ValueError(f"no *.yaml, *.yml or *.json file under {', '.join(str(p) for p in named)}")
    return named, files


def _files(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out.extend(sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file()))
        elif path.is_file():
            out.append(path)
        else:
            raise ValueError(f"no such file or directory: {path}")
    return out


def parse_documents(documents: Iterable[Any], source: str = "<input>") -> Snapshot:
    """Sort already-decoded objects (``List`` kinds expanded) into a :class:`Snapshot`. A misspelt kind, an unknown
    Walras kind or a workload Walras does not plan is a ``ValueError`` with the fix (:func:`unknown_kind`); other
    Kubernetes kinds (Namespace, ConfigMap, ...) are passed over."""
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
            return
        error = unknown_kind(doc, where)
        if error is not None:
            raise ValueError(error)

    for k, doc in enumerate(documents):
        add(doc, f"{source} document {k}")
    return Snapshot(**{field: tuple(objs) for field, objs in buckets.items()})


def read_file(path: Path) -> list[Any]:
    """The documents of one manifest file, decoded by its suffix (route table):

    ==================  ==========================================================================================
    suffix              decoder
    ==================  ==========================================================================================
    ``.yaml``, ``.yml``  :func:`load_yaml` (a multi-document YAML stream)
    ``.json``           ``json.loads`` (one object, e.g. ``kubectl get pods -o json``'s ``List``, or an array of
                        objects); 10-20x faster than YAML for the same objects, as ``kubectl`` reads JSON as JSON
    ==================  ==========================================================================================

    ``ValueError`` naming the file for malformed input. A path given by name is decoded by its suffix too; any other
    suffix is read as YAML (which also accepts most JSON)."""
    return decode(path, path.read_bytes())


def decode(path: Path, data: bytes) -> list[Any]:
    """The documents in ``data``, the contents (or a piece, :func:`split_manifests`) of the file ``path``, decoded by
    its suffix as :func:`read_file` says."""
    if path.suffix == ".json":
        try:
            loaded = json.loads(data)
        except ValueError as exc:  # json.JSONDecodeError, or bytes that are not UTF-8
            raise ValueError(f"{path}: invalid JSON: {exc}") from None
        return loaded if isinstance(loaded, list) else [loaded]
    try:
        return load_yaml(data)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: invalid YAML: {exc}") from None


def load_manifests(paths: str | Path | Iterable[str | Path], *, validate: bool = True) -> Snapshot:
    """Load every ``*.yaml``/``*.yml``/``*.json`` file under ``paths`` (files or directories, searched recursively in
    name order; :func:`read_file`) and return the Nodes, Pods, ResourcePools, FungibleJobs and ColocationProfiles
    they hold.

    Raises ``ValueError`` naming the file for a missing path, malformed YAML or JSON, an object that breaks its CRD's
    schema or rules (``validate``), or paths that hold no manifest at all.
    """
    paths, files = _manifest_files(paths)
    return join_snapshots((load_piece(path, path.read_bytes(), validate=validate) for path in files), paths,
                          len(files))


def join_snapshots(parts: Iterable[Snapshot], paths: Iterable[str | Path], n_files: int) -> Snapshot:
    """The snapshot of ``parts`` in their order (what :func:`load_manifests` returns for the ``n_files`` files under
    ``paths`` they came from); ``ValueError`` when they hold no object at all."""
    fields: dict[str, list[Mapping[str, Any]]] = {field: [] for field in KINDS.values()}
    for part in parts:
        for field, objs in fields.items():
            objs.extend(getattr(part, field))
    if not any(fields.values()):
        raise ValueError(f"no Node, Pod, ResourcePool, FungibleJob or ColocationProfile in {n_files} file(s) "
                         f"under {', '.join(str(p) for p in paths)}")
    return Snapshot(**{field: tuple(objs) for field, objs in fields.items()})


#: The size of the pieces :func:`split_manifests` cuts YAML files into (a piece ends at a document boundary).
PIECE_BYTES = 256 * 1024

#: A line that starts a YAML document (``---`` alone or followed by a space), where a stream can be cut.
_DOCUMENT_START = re.compile(rb"^---(?=[ \t\r\n]|$)", re.MULTILINE)


def split_manifests(paths: str | Path | Iterable[str | Path]) -> tuple[list[Path], list[tuple[int, bytes]]]:
    """The files under ``paths`` (as :func:`load_manifests` finds them) and their contents cut into pieces of about
    :data:`PIECE_BYTES`, each ``(file index, bytes)``, in stream order; :func:`load_piece` decodes one.

    A YAML file is cut only before a line that starts a document (``---``), which YAML forbids inside any scalar
    (block or quoted: a ``---`` line at column 0 ends it), so every piece is a whole YAML stream of whole documents
    and the pieces' documents, in order, are the file's. A file with a directive (a line starting ``%``, which
    belongs to the document after it), a byte-order mark, or JSON is one piece. Decoding the pieces one by one gives
    the same objects as :func:`read_file`; only error messages may differ (a line number counts from the piece's
    start), so a caller that meets an error reads the files again with :func:`load_manifests` for the message."""
    _, files = _manifest_files(paths)
    pieces: list[tuple[int, bytes]] = []
    for k, path in enumerate(files):
        data = path.read_bytes()
        if path.suffix == ".json" or len(data) <= PIECE_BYTES or data.startswith(b"\xef\xbb\xbf") or (
                data.startswith(b"%") or b"\n%" in data):
            pieces.append((k, data))
            continue
        start = 0
        while len(data) - start > PIECE_BYTES:
            cut = _DOCUMENT_START.search(data, start + PIECE_BYTES)
            if cut is None:
                break
            pieces.append((k, data[start:cut.start()]))
            start = cut.start()
        pieces.append((k, data[start:]))
    return files, pieces


def load_piece(path: Path, data: bytes, *, validate: bool = True) -> Snapshot:
    """The objects of one piece of :func:`split_manifests` (``path``: its file, which decides the decoder and names
    errors), validated as :func:`load_manifests` validates a file's."""
    snap = parse_documents(decode(path, data), str(path))
    if validate:
        _validate(path, [*snap.pools, *snap.jobs, *snap.profiles, *snap.budgets])
    return snap


def _validate(path: Path, objects: Iterable[Mapping[str, Any]]) -> None:
    from walras.manifests.schema import validate

    for obj in objects:
        errors = validate(obj)
        if errors:
            meta = obj.get("metadata") or {}
            namespace = meta.get("namespace")
            name = f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))
            raise ValueError(f"{path}: {obj.get('kind')} {name}: {'; '.join(errors)}")
