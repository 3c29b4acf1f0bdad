"""The object store behind the emulated Kubernetes API (for the demo and the tests; never a real cluster).

It keeps objects per resource type, stamps the metadata an API server stamps (``uid``, ``resourceVersion``,
``creationTimestamp``, ``generation``), applies merge / JSON / strategic-merge patches, emulates the status,
binding and resize sub-resources, finalizers and ``deletionTimestamp``, garbage collection through owner
references, and records a history of watch events so that a watch can resume from a ``resourceVersion``.

Everything here is synchronous and single-threaded: the HTTP layer (:mod:`walras_testbed.emulator.server`) calls it from
one asyncio loop. Errors are raised as :class:`ApiError` carrying the HTTP code and the Kubernetes ``reason``.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import dataclasses
import datetime as dt
import math
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from walras_testbed.emulator.selectors import FieldSelector, LabelSelector

JSON = dict[str, Any]


class ApiError(Exception):
    """A Kubernetes API error: HTTP ``code``, ``reason`` (NotFound, AlreadyExists, Conflict, ...) and message."""

    def __init__(self, code: int, reason: str, message: str, *, kind: str = "", name: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.kind = kind
        self.name = name
        self.causes: list[JSON] = []  # details.causes (the eviction's DisruptionBudget cause)

    def status(self) -> JSON:
        """The ``Status`` object the API server returns for this error."""
        details: JSON = {"name": self.name, "kind": self.kind}
        if self.causes:
            details["causes"] = list(self.causes)
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": details,
            "code": self.code,
        }


@dataclass(frozen=True)
class ResourceType:
    """One served resource: ``group``/``version``/``plural`` with its kind, scope, short names and sub-resources."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()  # "status", "binding", "resize"
    singular: str = ""
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
    #: a finished DELETE answers a success ``Status`` (as kube-apiserver does for PodDisruptionBudgets), not the
    #: deleted object (pods, custom resources)
    delete_answers_status: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.group, self.version, self.plural)

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def discovery(self) -> list[JSON]:
        """The APIResource entries of this type (the resource and each sub-resource) for ``/api(s)/.../{version}``."""
        main: JSON = {
            "name": self.plural,
            "singularName": self.singular or self.kind.lower(),
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(self.verbs),
        }
        if self.short_names:
            main["shortNames"] = list(self.short_names)
        if self.categories:
            main["categories"] = list(self.categories)
        out = [main]
        for sub in self.subresources:
            if sub == "binding":
                out.append({"name": f"{self.plural}/binding", "singularName": "", "namespaced": self.namespaced,
                            "group": "", "version": "v1", "kind": "Binding", "verbs": ["create"]})
            elif sub == "eviction":
                out.append({"name": f"{self.plural}/eviction", "singularName": "", "namespaced": self.namespaced,
                            "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]})
            else:
                out.append({"name": f"{self.plural}/{sub}", "singularName": "", "namespaced": self.namespaced,
                            "kind": self.kind, "verbs": ["get", "patch", "update"]})
        return out


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: The built-in resources the emulator serves from the start (core, coordination, CRDs, kopf peering).
BUILTIN_TYPES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "namespaces", "Namespace", False, ("ns",), ("status",)),
    ResourceType("", "v1", "nodes", "Node", False, ("no",), ("status",)),
    ResourceType("", "v1", "pods", "Pod", True, ("po",), ("status", "binding", "eviction", "resize"),
                 categories=("all",)),
    ResourceType("", "v1", "events", "Event", True, ("ev",)),
    ResourceType("", "v1", "configmaps", "ConfigMap", True, ("cm",)),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",)),
    ResourceType("", "v1", "resourcequotas", "ResourceQuota", True, ("quota",), ("status",)),  # watched by the operator
    ResourceType("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, ("pc",)),  # watched too
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True),
    ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), ("status",),
                 delete_answers_status=True),
    ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False,
                 ("crd", "crds"), ("status",)),
    ResourceType("kopf.dev", "v1", "clusterkopfpeerings", "ClusterKopfPeering", False, (), ("status",)),
    ResourceType("kopf.dev", "v1", "kopfpeerings", "KopfPeering", True, (), ("status",)),
)

_STATUS_KEPT_ON_CREATE = {"Node", "Namespace", "Event"}


def _success(code: int) -> JSON:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code}


def _ready(pod: Mapping[str, Any]) -> bool:
    """A pod the disruption controller counts as healthy: not terminating, condition ``Ready`` True."""
    if pod["metadata"].get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _selects(budget: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether ``budget``'s ``spec.selector`` (a LabelSelector; empty selects every pod, as in policy/v1) matches."""
    selector = (budget.get("spec") or {}).get("selector") or {}
    labels = pod["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _scaled(value: Any, total: int) -> int:
    """An IntOrString of a budget against ``total`` pods: an integer as is, ``"N%"`` rounded up (as
    ``intstr.GetScaledValueFromIntOrPercent(..., roundUp=true)`` in the disruption controller)."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def disruptions_allowed(budget: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> tuple[int, int, int]:
    """``(disruptionsAllowed, desiredHealthy, currentHealthy)`` of a PodDisruptionBudget over the pods its selector
    matches: ``minAvailable`` (integer or percent of the expected pods) or ``maxUnavailable`` (same; desired healthy
    = expected - maxUnavailable). Healthy pods are the Ready ones that are not terminating and not in
    ``status.disruptedPods``. The real disruption controller takes the expected count of a percent or
    ``maxUnavailable`` from the pods' controllers' scale; the emulator, which has no controllers, counts the matching
    pods plus those evicted through this budget (``status.disruptedPods``, which a controller would replace)."""
    pods = [p for p in pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    spec = budget.get("spec") or {}
    disrupted = set((budget.get("status") or {}).get("disruptedPods") or {})
    names = {p["metadata"]["name"] for p in pods}
    expected = len(pods) + len(disrupted - names)
    healthy = sum(_ready(p) and p["metadata"]["name"] not in disrupted for p in pods)
    if spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
    else:
        desired = _scaled(spec.get("minAvailable", 1), expected)
    return max(0, healthy - desired), desired, healthy


# --------------------------------------------------------------------------------------------------- patches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, ``null`` deletes a key, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: JSON = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Strategic merge treated as a merge patch, after dropping the ``$``-directives kubectl adds.

    Lists are replaced as a whole (a real API server merges some lists by key; for the objects Walras and its tests
    apply, replacing gives the same result).
    """
    return merge_patch(target, _strip_directives(patch))


def _strip_directives(value: Any) -> Any:
    if isinstance(value, Mapping):
        if value.get("$patch") == "delete":
            return None
        return {k: _strip_directives(v) for k, v in value.items() if not str(k).startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"JSON pointer {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str], path: str) -> Any:
    for part in parts:
        if isinstance(doc, list):
            try:
                doc = doc[int(part)]
            except (ValueError, IndexError) as exc:
                raise ApiError(422, "Invalid", f"JSON patch path {path!r}: no index {part!r}") from exc
        elif isinstance(doc, dict):
            if part not in doc:
                raise ApiError(422, "Invalid", f"JSON patch path {path!r}: no key {part!r}")
            doc = doc[part]
        else:
            raise ApiError(422, "Invalid", f"JSON patch path {path!r} goes through a scalar")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test) on a deep copy of ``target``."""
    if not isinstance(operations, list):
        raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for index, op in enumerate(operations):
        if not isinstance(op, Mapping) or "op" not in op or "path" not in op:
            raise ApiError(400, "BadRequest", f"JSON patch operation {index} needs 'op' and 'path'")
        kind, path = op["op"], op["path"]
        parts = _pointer(path)
        if kind in ("move", "copy"):
            value = copy.deepcopy(_walk(doc, _pointer(op["from"]), op["from"]))
            if kind == "move":
                doc = json_patch(doc, [{"op": "remove", "path": op["from"]}])
            doc = json_patch(doc, [{"op": "add", "path": path, "value": value}])
            continue
        if kind == "test":
            if _walk(doc, parts, path) != op.get("value"):
                raise ApiError(422, "Invalid", f"JSON patch test failed at {path!r}")
            continue
        if not parts:
            if kind in ("add", "replace"):
                doc = copy.deepcopy(op["value"])
                continue
            raise ApiError(422, "Invalid", "cannot remove the whole document")
        parent = _walk(doc, parts[:-1], path)
        last = parts[-1]
        if kind == "add":
            if isinstance(parent, list):
                if last == "-":
                    parent.append(copy.deepcopy(op["value"]))
                else:
                    parent.insert(int(last), copy.deepcopy(op["value"]))
            else:
                parent[last] = copy.deepcopy(op["value"])
        elif kind in ("remove", "replace"):
            if isinstance(parent, list):
                idx = int(last)
                if idx >= len(parent):
                    raise ApiError(422, "Invalid", f"JSON patch path {path!r}: no index {last}")
                if kind == "remove":
                    parent.pop(idx)
                else:
                    parent[idx] = copy.deepcopy(op["value"])
            else:
                if last not in parent:
                    raise ApiError(422, "Invalid", f"JSON patch path {path!r}: no key {last!r}")
                if kind == "remove":
                    del parent[last]
                else:
                    parent[last] = copy.deepcopy(op["value"])
        else:
            raise ApiError(400, "BadRequest", f"JSON patch operation {index}: unknown op {kind!r}")
    return doc


def apply_defaults(obj: Any, schema: Mapping[str, Any] | None) -> Any:
    """Fill the ``default`` values of a structural OpenAPI v3 schema into ``obj`` (as the API server defaults)."""
    if not schema or not isinstance(obj, dict):
        return obj
    props = schema.get("properties") or {}
    for name, sub in props.items():
        if name not in obj and "default" in sub:
            obj[name] = copy.deepcopy(sub["default"])
        if name in obj:
            value = obj[name]
            if isinstance(value, dict):
                apply_defaults(value, sub)
            elif isinstance(value, list) and isinstance(sub.get("items"), Mapping):
                for item in value:
                    apply_defaults(item, sub["items"])
    extra = schema.get("additionalProperties")
    if isinstance(extra, Mapping) and not props:
        for value in obj.values():
            apply_defaults(value, extra)
    return obj


# --------------------------------------------------------------------------------------------------- store


@dataclass
class WatchEvent:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    obj: JSON


@dataclass
class Fault:
    """An injected failure: the next ``count`` requests matching ``verb``/``resource``/``subresource`` get ``code``."""

    verb: str
    resource: str
    code: int
    count: int = 1
    subresource: str = ""
    name: str = ""

    def matches(self, verb: str, resource: str, subresource: str, name: str) -> bool:
        return (
            self.count > 0
            and self.verb in (verb, "*")
            and self.resource in (resource, "*")
            and self.subresource == subresource
            and (not self.name or self.name == name)
        )


@dataclass
class Store:
    """All objects, keyed by resource type then by (namespace, name), with a watch history per type."""

    history_limit: int = 20000
    types: dict[tuple[str, str, str], ResourceType] = field(default_factory=dict)
    objects: dict[tuple[str, str, str], dict[tuple[str, str], JSON]] = field(default_factory=dict)
    history: dict[tuple[str, str, str], deque[WatchEvent]] = field(default_factory=dict)
    watchers: dict[tuple[str, str, str], list[asyncio.Queue[WatchEvent | None]]] = field(default_factory=dict)
    schemas: dict[tuple[str, str, str], Mapping[str, Any]] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    bindings: list[JSON] = field(default_factory=list)  # every accepted binding (namespace, pod, node, rv)
    kubelet: bool = True  # a bound pod becomes Running, as a kubelet would report
    rv: int = 0
    on_change: list[Callable[[], None]] = field(default_factory=list)
    #: Serve ``pods/resize`` (in-place pod resize, Kubernetes >= 1.33); False emulates a cluster without it: the
    #: sub-resource is absent from discovery and ``PATCH pods/{name}/resize`` answers 404 NotFound.
    in_place_resize: bool = True

    def __post_init__(self) -> None:
        for rtype in BUILTIN_TYPES:
            self.register(rtype)
        self.set_in_place_resize(self.in_place_resize)
        for ns in ("default", "kube-system", "kube-public"):
            self.create(self.types[("", "v1", "namespaces")], "", {"metadata": {"name": ns}})

    # ---------------------------------------------------------------- types

    def register(self, rtype: ResourceType, schema: Mapping[str, Any] | None = None) -> None:
        self.types[rtype.key] = rtype
        self.objects.setdefault(rtype.key, {})
        self.history.setdefault(rtype.key, deque(maxlen=self.history_limit))
        self.watchers.setdefault(rtype.key, [])
        if schema is not None:
            self.schemas[rtype.key] = schema

    def set_in_place_resize(self, enabled: bool) -> None:
        """Turn the ``pods/resize`` sub-resource on or off (discovery and the path follow at once)."""
        self.in_place_resize = enabled
        pods = self.types[("", "v1", "pods")]
        subresources = tuple(s for s in pods.subresources if s != "resize")
        if enabled:
            subresources += ("resize",)
        self.types[pods.key] = dataclasses.replace(pods, subresources=subresources)

    def unregister(self, key: tuple[str, str, str]) -> None:
        for queue in self.watchers.get(key, []):
            queue.put_nowait(None)
        for table in (self.types, self.objects, self.history, self.watchers, self.schemas):
            table.pop(key, None)

    def find(self, group: str, version: str, plural: str) -> ResourceType:
        rtype = self.types.get((group, version, plural))
        if rtype is None:
            where = f"{group}/{version}" if group else version
            raise ApiError(404, "NotFound", f"the server could not find the requested resource {plural} in {where}")
        return rtype

    def groups(self) -> dict[str, list[str]]:
        """API group -> versions served (the core group is ``""``)."""
        out: dict[str, list[str]] = {}
        for group, version, _ in self.types:
            versions = out.setdefault(group, [])
            if version not in versions:
                versions.append(version)
        return out

    def by_kind(self, api_version: str, kind: str) -> ResourceType:
        for rtype in self.types.values():
            if rtype.api_version == api_version and rtype.kind == kind:
                return rtype
        raise ApiError(404, "NotFound", f"no resource for kind {kind} in {api_version}")

    # ---------------------------------------------------------------- faults

    def check_fault(self, verb: str, resource: str, subresource: str, name: str) -> None:
        for fault in self.faults:
            if fault.matches(verb, resource, subresource, name):
                fault.count -= 1
                reason = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}
                raise ApiError(fault.code, reason.get(fault.code, "InternalError"),
                               f"injected fault: {verb} {resource}{'/' + subresource if subresource else ''}")
        self.faults = [f for f in self.faults if f.count > 0]

    # ---------------------------------------------------------------- reads

    def get(self, rtype: ResourceType, namespace: str, name: str) -> JSON:
        obj = self.objects[rtype.key].get((namespace if rtype.namespaced else "", name))
        if obj is None:
            raise ApiError(404, "NotFound", f'{rtype.plural} "{name}" not found', kind=rtype.plural, name=name)
        return obj

    def list(self, rtype: ResourceType, namespace: str | None, labels: LabelSelector | None = None,
             fields: FieldSelector | None = None) -> list[JSON]:
        out = []
        for (ns, _), obj in self.objects[rtype.key].items():
            if namespace and rtype.namespaced and ns != namespace:
                continue
            if labels is not None and not labels.matches(obj):
                continue
            if fields is not None and not fields.matches(obj):
                continue
            out.append(obj)
        out.sort(key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return out

    def history_since(self, rtype: ResourceType, rv: int) -> builtins.list[WatchEvent]:
        events = self.history[rtype.key]
        if events and rv < events[0].rv - 1 and rv < self.rv:
            oldest = events[0].rv
            if len(events) == events.maxlen:
                raise ApiError(410, "Expired", f"too old resource version: {rv} ({oldest})")
        return [e for e in events if e.rv > rv]

    # ---------------------------------------------------------------- writes

    def _bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _emit(self, rtype: ResourceType, kind: str, obj: JSON) -> None:
        event = WatchEvent(int(obj["metadata"]["resourceVersion"]), kind, copy.deepcopy(obj))
        self.history[rtype.key].append(event)
        for queue in list(self.watchers[rtype.key]):
            queue.put_nowait(event)
        for callback in self.on_change:
            callback()

    def create(self, rtype: ResourceType, namespace: str, body: Mapping[str, Any]) -> JSON:
        if not isinstance(body, Mapping) or not isinstance(body.get("metadata"), Mapping):
            raise ApiError(400, "BadRequest", "the object has no metadata")
        obj = copy.deepcopy(dict(body))
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        name = meta.get("name")
        if not name:
            raise ApiError(422, "Invalid", f"{rtype.kind}: metadata.name is required", kind=rtype.kind)
        ns = (meta.get("namespace") or namespace or "default") if rtype.namespaced else ""
        if rtype.namespaced and namespace and meta.get("namespace") and meta["namespace"] != namespace:
            raise ApiError(400, "BadRequest", "the namespace of the object does not match the namespace of the URL")
        if (ns, name) in self.objects[rtype.key]:
            raise ApiError(409, "AlreadyExists", f'{rtype.plural} "{name}" already exists', kind=rtype.plural,
                           name=name)
        obj["apiVersion"] = rtype.api_version
        obj["kind"] = rtype.kind
        if rtype.namespaced:
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1
        meta.pop("deletionTimestamp", None)
        if "status" in rtype.subresources and rtype.kind not in _STATUS_KEPT_ON_CREATE:
            obj.pop("status", None)
        if rtype.kind == "Pod":
            obj["status"] = {"phase": "Pending", "conditions": []}
            if obj.get("spec", {}).get("nodeName"):
                self._run_pod(obj, obj["spec"]["nodeName"])
        schema = self.schemas.get(rtype.key)
        if schema is not None:
            apply_defaults(obj, schema)
        if rtype.kind == "CustomResourceDefinition":
            self._crd_changed(obj)
        meta["resourceVersion"] = self._bump()
        self.objects[rtype.key][(ns, name)] = obj
        self._emit(rtype, "ADDED", obj)
        return obj

    def replace(self, rtype: ResourceType, namespace: str, name: str, body: Mapping[str, Any],
                subresource: str = "") -> JSON:
        """PUT: replace the object (or only its status with ``subresource='status'``), checking resourceVersion."""
        old = self.get(rtype, namespace, name)
        given = (body.get("metadata") or {}).get("resourceVersion")
        if given and given != old["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {rtype.plural} "{name}": the object '
                           "has been modified; please apply your changes to the latest version and try again",
                           kind=rtype.plural, name=name)
        return self._write(rtype, old, copy.deepcopy(dict(body)), subresource)

    def patch(self, rtype: ResourceType, namespace: str, name: str, patch: Any, content_type: str,
              subresource: str = "") -> JSON:
        old = self.get(rtype, namespace, name)
        if "json-patch" in content_type:
            new = json_patch(old, patch)
        elif "strategic-merge-patch" in content_type:
            new = strategic_merge_patch(old, patch)
        elif "merge-patch" in content_type or "apply-patch" in content_type:
            new = merge_patch(old, patch)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"unsupported patch content type {content_type!r}")
        given = (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, Mapping) else None
        if given and given != old["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {rtype.plural} "{name}": the object '
                           "has been modified", kind=rtype.plural, name=name)
        return self._write(rtype, old, new, subresource)

    def _write(self, rtype: ResourceType, old: JSON, new: JSON, subresource: str) -> JSON:
        meta_old = old["metadata"]
        if subresource == "status":
            merged = copy.deepcopy(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            new = merged
        elif subresource == "resize":
            merged = copy.deepcopy(old)
            old_containers = {c.get("name"): c for c in merged.get("spec", {}).get("containers", [])}
            for container in new.get("spec", {}).get("containers", []):
                target = old_containers.get(container.get("name"))
                if target is None:
                    raise ApiError(422, "Invalid", f"pods/resize: no container {container.get('name')!r}")
                target["resources"] = copy.deepcopy(container.get("resources", {}))
            merged.setdefault("status", {})["resize"] = "InProgress"
            new = merged
        else:
            if "status" in rtype.subresources:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
        meta = new.setdefault("metadata", {})
        for key in ("uid", "creationTimestamp", "namespace", "name"):
            if key in meta_old:
                meta[key] = meta_old[key]
            else:
                meta.pop(key, None)
        if "deletionTimestamp" in meta_old:
            meta["deletionTimestamp"] = meta_old["deletionTimestamp"]
        new["apiVersion"] = rtype.api_version
        new["kind"] = rtype.kind
        spec_old = {k: v for k, v in old.items() if k not in ("metadata", "status")}
        spec_new = {k: v for k, v in new.items() if k not in ("metadata", "status")}
        meta["generation"] = meta_old.get("generation", 1) + (1 if spec_old != spec_new else 0)
        if rtype.kind == "Pod" and subresource == "":
            node_old = old.get("spec", {}).get("nodeName")
            node_new = new.get("spec", {}).get("nodeName")
            if node_old and node_new != node_old:
                raise ApiError(422, "Invalid", "Pod spec.nodeName is immutable once set")
        schema = self.schemas.get(rtype.key)
        if schema is not None:
            apply_defaults(new, schema)
        if new == old:
            return old  # a no-op write keeps the resourceVersion, as the API server does
        meta["resourceVersion"] = self._bump()
        stored = (meta.get("namespace", ""), meta["name"])
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self.objects[rtype.key][stored]
            self._emit(rtype, "DELETED", new)
            self._collect_garbage(meta["uid"])
            if rtype.kind == "CustomResourceDefinition":
                self._crd_removed(new)
            return new
        if rtype.kind == "CustomResourceDefinition" and subresource != "status":
            self._crd_changed(new)
        self.objects[rtype.key][stored] = new
        self._emit(rtype, "MODIFIED", new)
        return new

    def delete(self, rtype: ResourceType, namespace: str, name: str) -> JSON:
        obj = self.get(rtype, namespace, name)
        meta = obj["metadata"]
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                new = copy.deepcopy(obj)
                new["metadata"]["deletionTimestamp"] = _now()
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                new["metadata"]["resourceVersion"] = self._bump()
                self.objects[rtype.key][(meta.get("namespace", ""), name)] = new
                self._emit(rtype, "MODIFIED", new)
                return new
            return obj
        del self.objects[rtype.key][(meta.get("namespace", ""), name)]
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = self._bump()
        self._emit(rtype, "DELETED", gone)
        self._collect_garbage(meta["uid"])
        if rtype.kind == "CustomResourceDefinition":
            self._crd_removed(obj)
        if rtype.kind == "Namespace":
            for other in list(self.types.values()):
                if other.namespaced:
                    for (ns, n) in list(self.objects[other.key]):
                        if ns == name:
                            self.delete(other, ns, n)
        return gone

    def _collect_garbage(self, owner_uid: str) -> None:
        """Delete every object whose ownerReferences name ``owner_uid`` (background cascading deletion)."""
        for rtype in list(self.types.values()):
            for (ns, name), obj in list(self.objects.get(rtype.key, {}).items()):
                refs = obj["metadata"].get("ownerReferences") or []
                if any(ref.get("uid") == owner_uid for ref in refs) and (ns, name) in self.objects[rtype.key]:
                    self.delete(rtype, ns, name)

    # ---------------------------------------------------------------- pods

    def bind(self, namespace: str, name: str, body: Mapping[str, Any]) -> JSON:
        """``POST pods/{name}/binding``: set ``spec.nodeName`` once; a second binding is a 409 Conflict."""
        rtype = self.types[("", "v1", "pods")]
        pod = self.get(rtype, namespace, name)
        target = (body.get("target") or {}) if isinstance(body, Mapping) else {}
        node = target.get("name")
        if not node:
            raise ApiError(400, "BadRequest", "a Binding needs target.name (the node)")
        uid = (body.get("metadata") or {}).get("uid")
        if uid and uid != pod["metadata"]["uid"]:
            raise ApiError(409, "Conflict", f"Binding: pod {namespace}/{name} has another uid")
        if pod.get("spec", {}).get("nodeName"):
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is '
                           f"already assigned to node \"{pod['spec']['nodeName']}\"", kind="pods", name=name)
        if pod["metadata"].get("deletionTimestamp"):
            raise ApiError(409, "Conflict", f"pod {namespace}/{name} is being deleted")
        new = copy.deepcopy(pod)
        new.setdefault("spec", {})["nodeName"] = node
        self._run_pod(new, node)
        new["metadata"]["resourceVersion"] = self._bump()
        self.objects[rtype.key][(namespace, name)] = new
        self._emit(rtype, "MODIFIED", new)
        self.bindings.append({"namespace": namespace, "pod": name, "node": node, "uid": pod["metadata"]["uid"]})
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def evict(self, namespace: str, name: str, body: Any) -> JSON:
        """``POST pods/{name}/eviction`` (a policy/v1 Eviction), as kube-apiserver's eviction REST does it: a pod
        that is Pending, Succeeded, Failed or already terminating is deleted without looking at budgets; otherwise the
        one PodDisruptionBudget of the namespace whose selector matches the pod must allow a disruption (more than
        one is a 500, as the real server answers), else 429 TooManyRequests with a ``DisruptionBudget`` cause. An
        allowed eviction deletes the pod as :meth:`delete` does and answers 201 with a success Status.

        The real server reads ``status.disruptionsAllowed`` that the disruption controller keeps; the emulator has no
        controller and computes it at the eviction from the pods (see :func:`disruptions_allowed`)."""
        pods = self.types[("", "v1", "pods")]
        if not isinstance(body, Mapping) or body.get("kind") not in (None, "Eviction"):
            raise ApiError(400, "BadRequest", "the request body must be a policy/v1 Eviction")
        named = (body.get("metadata") or {}).get("name")
        if named and named != name:
            raise ApiError(400, "BadRequest", "name in URL does not match name in Eviction object",
                           kind="Eviction", name=str(named))
        pod = self.get(pods, namespace, name)
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if phase in ("Pending", "Succeeded", "Failed") or pod["metadata"].get("deletionTimestamp"):
            self.delete(pods, namespace, name)
            return _success(201)
        pdb_type = self.types[("policy", "v1", "poddisruptionbudgets")]
        budgets = [b for b in self.list(pdb_type, namespace) if _selects(b, pod)]
        if len(budgets) > 1:
            raise ApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the eviction "
                           "subresource does not support.")
        if budgets:
            budget = budgets[0]
            members = [p for p in self.list(pods, namespace) if _selects(budget, p)]
            allowed, desired, healthy = disruptions_allowed(budget, members)
            if allowed > 0:  # recorded as the real server does; evicted pods keep counting as expected
                disrupted = dict((budget.get("status") or {}).get("disruptedPods") or {})
                disrupted[name] = _now()
                self.patch(pdb_type, namespace, budget["metadata"]["name"], {"status": {"disruptedPods": disrupted}},
                           "application/merge-patch+json", subresource="status")
            else:
                error = ApiError(429, "TooManyRequests",
                                 "Cannot evict pod as it would violate the pod's disruption budget.")
                error.causes = [{"reason": "DisruptionBudget",
                                 "message": f"The disruption budget {budget['metadata']['name']} needs {desired} "
                                            f"healthy pods and has {healthy} currently"}]
                raise error
        self.delete(pods, namespace, name)
        return _success(201)

    def _run_pod(self, pod: JSON, node: str) -> None:
        status = pod.setdefault("status", {})
        conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}]
        if self.kubelet:
            status["phase"] = "Running"
            status["startTime"] = _now()
            conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": _now()})
        status["conditions"] = conditions
        status["hostIP"] = "127.0.0.1"

    # ---------------------------------------------------------------- CRDs

    def _crd_types(self, crd: Mapping[str, Any]) -> builtins.list[tuple[ResourceType, Mapping[str, Any] | None]]:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        if not spec.get("group") or not names.get("plural") or not names.get("kind"):
            raise ApiError(422, "Invalid", "CustomResourceDefinition needs spec.group, spec.names.plural and kind")
        out = []
        for version in spec.get("versions") or []:
            if not version.get("served", True):
                continue
            subs = tuple(s for s in ("status", "scale") if s in (version.get("subresources") or {}))
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            out.append((ResourceType(
                spec["group"], version["name"], names["plural"], names["kind"], spec.get("scope") == "Namespaced",
                tuple(names.get("shortNames") or ()), subs, names.get("singular", ""),
                tuple(names.get("categories") or ()),
            ), schema))
        return out

    def _crd_changed(self, crd: JSON) -> None:
        group = crd["spec"]["group"]
        plural = crd["spec"]["names"]["plural"]
        wanted = self._crd_types(crd)
        for key in [k for k in self.types if k[0] == group and k[2] == plural]:
            if key not in {t.key for t, _ in wanted}:
                self.unregister(key)
        for rtype, schema in wanted:
            self.register(rtype, schema)
        names = crd["spec"]["names"]
        status = {
            "acceptedNames": dict(names),
            "storedVersions": [v["name"] for v in crd["spec"].get("versions", []) if v.get("storage")],
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "lastTransitionTime": _now()},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "lastTransitionTime": _now()},
            ],
        }
        crd["status"] = status  # established the moment it is stored

    def _crd_removed(self, crd: Mapping[str, Any]) -> None:
        group = crd["spec"]["group"]
        plural = crd["spec"]["names"]["plural"]
        for key in [k for k in self.types if k[0] == group and k[2] == plural]:
            self.unregister(key)

    # ---------------------------------------------------------------- helpers for in-process callers

    def apply_manifests(self, documents: Iterable[Mapping[str, Any]]) -> builtins.list[JSON]:
        """Create (or replace) each manifest in order, as ``kubectl apply`` would; CRDs first is the caller's job."""
        created = []
        for doc in documents:
            rtype = self.by_kind(doc["apiVersion"], doc["kind"])
            ns = (doc.get("metadata") or {}).get("namespace", "default") if rtype.namespaced else ""
            try:
                created.append(self.create(rtype, ns, doc))
            except ApiError as exc:
                if exc.reason != "AlreadyExists":
                    raise
                created.append(self.replace(rtype, ns, doc["metadata"]["name"], doc))
        return created
