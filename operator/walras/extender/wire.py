"""The kube-scheduler extender wire format (``k8s.io/kube-scheduler/extender/v1``), read strictly.

The v1 extender types carry **no JSON tags**, so kube-scheduler marshals them with their Go field names:

* ``ExtenderArgs``: ``{"Pod": Pod, "Nodes": NodeList | null, "NodeNames": [string] | null}``; a ``nodeCacheCapable``
  extender gets ``NodeNames`` (and ``"Nodes": null``), any other gets ``Nodes`` (and ``"NodeNames": null``).
* ``ExtenderPreemptionArgs``: ``{"Pod": Pod, "NodeNameToVictims": {node: {"Pods": [Pod], "NumPDBViolations": n}} |
  null, "NodeNameToMetaVictims": {node: {"Pods": [{"UID": uid}], "NumPDBViolations": n}} | null}`` (the first when
  the extender is not ``nodeCacheCapable``, the second when it is).
* ``ExtenderBindingArgs``: ``{"PodName", "PodNamespace", "PodUID", "Node"}``.

``Pod`` and ``NodeList`` are core API objects and keep their own JSON tags (``metadata``, ``items``, ``labels`` ...).
Go's ``encoding/json`` matches object keys to fields preferring the exact name and accepting a case-insensitive one,
so :func:`field` does the same (kube-scheduler itself only ever sends the exact names).

Everything an answer depends on is type-checked here; a request that does not have the shape above raises
:class:`BadRequest` (HTTP 400) naming the path of the offending value, so no malformed request reaches the verbs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Bodies above this many bytes are refused with HTTP 413 (a 5,000-node ``NodeList`` is about 2.5 MiB).
MAX_BODY_BYTES = 4 * 1024 * 1024


class RequestError(Exception):
    """A request the extender refuses; ``status`` is the HTTP status of the answer."""

    status = 400


class BadRequest(RequestError, ValueError):
    """A request that does not follow the extender v1 JSON (HTTP 400)."""

    status = 400


class BodyTooLarge(RequestError):
    """A body above the size limit (HTTP 413)."""

    status = 413


class BodyTimeout(RequestError):
    """A body not received within the read timeout (HTTP 408)."""

    status = 408


_MISSING = object()


def field(obj: Mapping[str, Any], go_name: str) -> Any:
    """``obj[go_name]`` as Go's ``encoding/json`` resolves it: the exact key, else a case-insensitive match, else
    ``None`` (an absent field and ``null`` decode alike)."""
    value = obj.get(go_name, _MISSING)
    if value is not _MISSING:
        return value
    lowered = go_name.lower()
    for key, val in obj.items():
        if key.lower() == lowered:
            return val
    return None


def decode(raw: bytes, what: str) -> dict[str, Any]:
    """Parse a request body into a JSON object; not JSON, nested past the parser's recursion limit, or not an
    object -> :class:`BadRequest`."""
    try:
        body = json.loads(raw)
    except RecursionError as exc:
        raise BadRequest("the body is nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer with too many digits
        raise BadRequest(f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest(f"{what}: the body must be a JSON object, got {_type(body)}")
    return body


def _type(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
            float: "number"}.get(type(value), type(value).__name__)


def _object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{path} must be an object, got {_type(value)}")
    return value


def _string(value: Any, path: str, *, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"{path} must be a string, got {_type(value)}")
    if required and not value:
        raise BadRequest(f"{path} must not be empty")
    return value


def _string_map(value: Any, path: str) -> dict[str, str]:
    if value is None:
        return {}
    labels = _object(value, path)
    for key, val in labels.items():
        if not isinstance(val, str):
            raise BadRequest(f"{path}[{key!r}] must be a string, got {_type(val)}")
    return labels


def _int(value: Any, path: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{path} must be an integer, got {_type(value)}")
    return value


@dataclass(frozen=True)
class PodRef:
    """What the extender reads of a ``v1.Pod``: its key, uid and labels."""

    namespace: str
    name: str
    uid: str
    labels: dict[str, str]

    @classmethod
    def parse(cls, value: Any, path: str) -> PodRef:
        pod = _object(value, path)
        meta = _object(pod.get("metadata"), f"{path}.metadata")
        name = _string(meta.get("name"), f"{path}.metadata.name")
        namespace = _string(meta.get("namespace"), f"{path}.metadata.namespace", required=False) or "default"
        uid = _string(meta.get("uid"), f"{path}.metadata.uid", required=False)
        return cls(namespace, name, uid, _string_map(meta.get("labels"), f"{path}.metadata.labels"))


@dataclass(frozen=True)
class FilterArgs:
    """``ExtenderArgs``: the pod and its candidate nodes, as names (``NodeNames``) or as a ``NodeList`` (``Nodes``,
    kept whole so that a filter answer can return the same objects)."""

    pod: PodRef
    node_names: list[str] | None
    node_list: dict[str, Any] | None
    node_items: list[dict[str, Any]]

    @property
    def names(self) -> list[str]:
        if self.node_names is not None:
            return self.node_names
        return [item["metadata"]["name"] for item in self.node_items]

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> FilterArgs:
        pod = PodRef.parse(field(body, "Pod"), "ExtenderArgs.Pod")
        names = field(body, "NodeNames")
        if names is not None:
            if not isinstance(names, list):
                raise BadRequest(f"ExtenderArgs.NodeNames must be an array of strings, got {_type(names)}")
            if not set(map(type, names)) <= {str}:  # one pass in C; the index only on failure
                i, name = next((i, n) for i, n in enumerate(names) if type(n) is not str)
                raise BadRequest(f"ExtenderArgs.NodeNames[{i}] must be a string, got {_type(name)}")
            return cls(pod, names, None, [])
        nodes = field(body, "Nodes")
        if nodes is None:
            raise BadRequest("ExtenderArgs needs either Nodes or NodeNames")
        node_list = _object(nodes, "ExtenderArgs.Nodes")
        items = node_list.get("items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise BadRequest(f"ExtenderArgs.Nodes.items must be an array, got {_type(items)}")
        for i, item in enumerate(items):
            node = _object(item, f"ExtenderArgs.Nodes.items[{i}]")
            meta = _object(node.get("metadata"), f"ExtenderArgs.Nodes.items[{i}].metadata")
            _string(meta.get("name"), f"ExtenderArgs.Nodes.items[{i}].metadata.name")
        return cls(pod, None, node_list, items)


@dataclass(frozen=True)
class Victims:
    """One node's preemption candidates: the victims' uids and the PDB violations evicting them would cause."""

    uids: list[str]
    num_pdb_violations: int


@dataclass(frozen=True)
class PreemptArgs:
    """``ExtenderPreemptionArgs``: the preemptor and, per node, its victims (full pods or uids only)."""

    pod: PodRef
    victims: dict[str, Victims]

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> PreemptArgs:
        pod = PodRef.parse(field(body, "Pod"), "ExtenderPreemptionArgs.Pod")
        meta = field(body, "NodeNameToMetaVictims")
        full = field(body, "NodeNameToVictims")
        victims: dict[str, Victims] = {}
        if meta is not None:
            where = "ExtenderPreemptionArgs.NodeNameToMetaVictims"
            for node, value in _object(meta, where).items():
                entry = _object(value, f"{where}[{node!r}]")
                pods = field(entry, "Pods")
                if pods is None:
                    pods = []
                if not isinstance(pods, list):
                    raise BadRequest(f"{where}[{node!r}].Pods must be an array, got {_type(pods)}")
                uids = [_string(field(_object(p, f"{where}[{node!r}].Pods[{i}]"), "UID"),
                                f"{where}[{node!r}].Pods[{i}].UID") for i, p in enumerate(pods)]
                victims[node] = Victims(uids, _int(field(entry, "NumPDBViolations"),
                                                   f"{where}[{node!r}].NumPDBViolations"))
        elif full is not None:
            where = "ExtenderPreemptionArgs.NodeNameToVictims"
            for node, value in _object(full, where).items():
                entry = _object(value, f"{where}[{node!r}]")
                pods = field(entry, "Pods")
                if pods is None:
                    pods = []
                if not isinstance(pods, list):
                    raise BadRequest(f"{where}[{node!r}].Pods must be an array, got {_type(pods)}")
                uids = [PodRef.parse(p, f"{where}[{node!r}].Pods[{i}]").uid for i, p in enumerate(pods)]
                victims[node] = Victims(uids, _int(field(entry, "NumPDBViolations"),
                                                   f"{where}[{node!r}].NumPDBViolations"))
        else:
            raise BadRequest("ExtenderPreemptionArgs needs NodeNameToVictims or NodeNameToMetaVictims")
        return cls(pod, victims)


@dataclass(frozen=True)
class BindArgs:
    """``ExtenderBindingArgs``."""

    namespace: str
    name: str
    uid: str
    node: str

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> BindArgs:
        where = "ExtenderBindingArgs"
        return cls(namespace=_string(field(body, "PodNamespace"), f"{where}.PodNamespace"),
                   name=_string(field(body, "PodName"), f"{where}.PodName"),
                   uid=_string(field(body, "PodUID"), f"{where}.PodUID", required=False),
                   node=_string(field(body, "Node"), f"{where}.Node"))


def meta_victims(victims: Mapping[str, Victims]) -> dict[str, Any]:
    """``ExtenderPreemptionResult.NodeNameToMetaVictims`` for ``victims`` (lower camel case keys, which Go decodes
    case-insensitively into ``MetaVictims.Pods[].UID`` and ``NumPDBViolations``)."""
    return {node: {"pods": [{"uid": uid} for uid in v.uids], "numPDBViolations": v.num_pdb_violations}
            for node, v in victims.items()}
