"""The decode half of the Kubernetes boundary: raw API objects (dicts, as the API server or a manifest gives them) ->
the planner's typed, frozen :mod:`walras.planner.cluster` values.

This is the only module that reads a raw object for planning; the planner never imports it (callers decode first).
Malformed content never raises here: a node or pod field that cannot be read counts as absent (a quantity that does not
parse is 0, as the API server would have refused it), and a FungibleJob, ResourcePool or ColocationProfile that fails
validation becomes an object with ``spec=None`` and ``error`` saying why, so that one bad object never stops the others.

Pods, nodes and FungibleJobs are memoised by ``(metadata.uid, metadata.resourceVersion)`` in a
:class:`TranslationCache` the caller owns: the API server changes the resourceVersion on every write, so the same pair
means the same content, and the caller's next translation reuses it (the kube-scheduler snapshot's incremental update,
Kueue's cache/snapshot split). One mapping holds all three kinds, keyed by uid: a pod's key is its uid, a node's and a
job's carry the kind in front of it (``"Node/<uid>"``, ``"FungibleJob/<uid>"``), so no key of one kind can meet
another's; the value is a :class:`Translated` (resourceVersion, translation), used only when the resourceVersion is
the object's. A reused entry is recorded as the same object, so an unchanged object costs the next call no new one.
An object without a uid or a resourceVersion (a manifest file) is translated every time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from functools import lru_cache
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple, TypeVar, cast

from walras.planner.cluster import (
    DEFAULT_MAX_PODS,
    PODS,
    Budget,
    BudgetReported,
    BudgetSpec,
    Cluster,
    Constraints,
    Job,
    JobTemplate,
    LabelSelector,
    Node,
    Pod,
    Pool,
    Profile,
    Quota,
    Refusal,
    ReportedStatus,
    Requirement,
    Taint,
    Toleration,
)
from walras.planner.model import ANNOTATION_NODE, LABEL_JOB, LABEL_MANAGED, LABEL_POOL, MAX_PREEMPTION_TIMES, Snapshot
from walras.planner.quantity import parse_quantity
from walras.planner.spec import parse_job, parse_pool, parse_profile

T = TypeVar("T", Pod, Node, Job)

# The type checks below test for the plain dict first: decoded JSON is made of dicts, and an isinstance check
# against the Mapping ABC costs several times more (it ran ~15 times per pod).


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if type(meta) is dict or isinstance(meta, Mapping) else {}


def _map(value: Any) -> Mapping[str, Any]:
    if type(value) is dict:
        return value
    return value if value is not None and isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if type(value) is list or isinstance(value, list) else []


def timestamp(value: Any) -> float | None:
    """An RFC 3339 time as the API server writes it (``2026-11-25T15:00:00Z``, fractional seconds allowed) ->
    epoch seconds; None when absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _generation(obj: Mapping[str, Any]) -> int | None:
    value = _meta(obj).get("generation")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@lru_cache(maxsize=8192)
def _quantity(raw: Any) -> float:
    try:
        return parse_quantity(raw)
    except ValueError:
        return 0.0


def quantities(raw: Any) -> dict[str, float]:
    """A ``{name: quantity}`` mapping parsed to floats (unparseable values count as 0 and are dropped)."""
    out: dict[str, float] = {}
    for name, value in _map(raw).items():
        try:
            amount = _quantity(value) if isinstance(value, str | int | float) else 0.0
        except TypeError:
            amount = 0.0
        if amount > 0:
            out[str(name)] = amount
    return out


def container_requests(container: Any) -> dict[str, float]:
    """A container's requests, a limit standing in for a missing request (the API server's defaulting)."""
    resources = _map(_map(container).get("resources"))
    return {**quantities(resources.get("limits")), **quantities(resources.get("requests"))}


def _add(total: dict[str, float], part: Mapping[str, float]) -> None:
    for name, value in part.items():
        total[name] = total.get(name, 0.0) + value


def _max(total: dict[str, float], part: Mapping[str, float]) -> None:
    for name, value in part.items():
        if value > total.get(name, 0.0):
            total[name] = value


def pod_requests(spec: Mapping[str, Any]) -> dict[str, float]:
    """kube-scheduler's effective request of a pod spec: sum of containers, at least each init container, plus
    overhead, plus one ``pods`` slot."""
    total: dict[str, float] = {}
    for container in _list(spec.get("containers")):
        _add(total, container_requests(container))
    init: dict[str, float] = {}
    for container in _list(spec.get("initContainers")):
        _max(init, container_requests(container))
    _max(total, init)
    _add(total, quantities(spec.get("overhead")))
    total[PODS] = 1.0
    return total


def _first_resources(spec: Mapping[str, Any]) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    containers = _list(spec.get("containers"))
    if not containers:
        return ((), ())
    resources = _map(_map(containers[0]).get("resources"))

    def items(raw: Any) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((str(k), str(v)) for k, v in _map(raw).items()))

    return (items(resources.get("requests")), items(resources.get("limits")))


def node_from(obj: Mapping[str, Any]) -> Node | None:
    """A Node object -> :class:`Node` (None without a name). Ready when the ``Ready`` condition is ``True``."""
    meta = _meta(obj)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    status = _map(obj.get("status"))
    spec = _map(obj.get("spec"))
    condition = next((_map(c) for c in _list(status.get("conditions")) if _map(c).get("type") == "Ready"), {})
    ready = condition.get("status") == "True"
    since = None if ready else timestamp(condition.get("lastTransitionTime"))
    allocatable = quantities(status.get("allocatable"))
    allocatable.setdefault(PODS, DEFAULT_MAX_PODS if "pods" not in _map(status.get("allocatable")) else 0.0)
    taints = tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in (_map(x) for x in _list(spec.get("taints")))
    )
    labels = {str(k): str(v) for k, v in _map(meta.get("labels")).items()}
    return Node(name, labels, allocatable, taints, ready, bool(spec.get("unschedulable", False)), since)


#: What :func:`pod_from` reads of a pod spec's containers, as a hashable key (None where a part is not plain JSON).
_ResourcesKey = tuple[Any, ...]
#: A per-call cache for :func:`pod_from`: resources key -> (effective requests, first container's resources).
PodShapes = dict[Any, tuple[dict[str, float], tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]]]


def _resources_key(spec: Mapping[str, Any]) -> _ResourcesKey | None:
    """Everything :func:`pod_requests` and :func:`_first_resources` read, as a hashable key: per container and init
    container the pair (requests items, limits items), and ``("overhead", items)``; None when some part is not a
    plain dict (the pod is then parsed without the cache). Whether every name and quantity is a string is checked
    only before a key is stored (:func:`_plain`): a key found in the cache equals a stored, all-string one."""
    parts: list[Any] = []
    for field_name in ("containers", "initContainers"):
        containers = spec.get(field_name)
        if containers is None:
            parts.append(None)
            continue
        if type(containers) is not list:
            return None
        for container in containers:
            if type(container) is not dict:
                return None
            resources = container.get("resources")
            if resources is None:
                parts.append(())
                continue
            if type(resources) is not dict:
                return None
            requests, limits = resources.get("requests"), resources.get("limits")
            if (requests is not None and type(requests) is not dict) or (limits is not None and type(limits)
                                                                        is not dict):
                return None
            parts.append((tuple(requests.items()) if requests else (), tuple(limits.items()) if limits else ()))
        parts.append(field_name)
    overhead = spec.get("overhead")
    if overhead is not None:
        if type(overhead) is not dict:
            return None
        parts.append(("overhead", tuple(overhead.items())))
    return tuple(parts)


def _plain(key: _ResourcesKey) -> bool:
    """Whether every name and quantity in ``key`` is a string (as the API server writes them; ``1`` and ``1.0``
    would be equal keys with different texts, so only all-string keys are stored)."""
    for part in key:
        if type(part) is not tuple or not part:
            continue
        items = part[1:] if part[0] == "overhead" else part
        for group in items:
            if not all(type(k) is str and type(v) is str for k, v in group):
                return False
    return True


def pod_from(obj: Mapping[str, Any], shapes: PodShapes | None = None) -> Pod | None:
    """A Pod object -> :class:`Pod` (None without a name). With ``shapes`` (one dict per translation pass), pods whose
    containers' resources are written alike are parsed once and share one (read-only) requests mapping, so later
    phases handle each distinct request once."""
    meta = _meta(obj)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    spec = _map(obj.get("spec"))
    labels = _map(meta.get("labels"))
    job = labels.get(LABEL_JOB)
    managed = isinstance(job, str) and bool(job) and labels.get(LABEL_MANAGED) == "true"
    node = spec.get("nodeName")
    pool = labels.get(LABEL_POOL)
    status = _map(obj.get("status"))
    key = _resources_key(spec) if shapes is not None else None
    shape = shapes.get(key) if shapes is not None and key is not None else None
    if shape is None:
        shape = (pod_requests(spec), _first_resources(spec))
        if shapes is not None and key is not None and _plain(key):
            shapes[key] = shape
    requests, first = shape
    return Pod(
        namespace=str(meta.get("namespace") or "default"),
        name=name,
        node=node if isinstance(node, str) and node else None,
        requests=requests,
        phase=str(status.get("phase") or "Pending"),
        terminating=bool(meta.get("deletionTimestamp")),
        job=str(job) if managed else None,
        pool=str(pool) if managed and isinstance(pool, str) else None,
        first=first,
        uid=str(meta.get("uid") or ""),
        started=timestamp(status.get("startTime")),
        reason=str(status.get("reason") or ""),
        nominated=_nominated(status),
        priority=_priority(spec),
        planned=_planned(meta) if managed else None,
    )


def _planned(meta: Mapping[str, Any]) -> str | None:
    """The ``walras.dev/planned-node`` annotation (the node the creating plan chose), None when absent or not a name."""
    node = _map(meta.get("annotations")).get(ANNOTATION_NODE)
    return node if isinstance(node, str) and node else None


def _nominated(status: Mapping[str, Any]) -> str | None:
    """``status.nominatedNodeName`` (docs/refusals.md, "Nominations"), None when absent or not a name."""
    node = status.get("nominatedNodeName")
    return node if isinstance(node, str) and node else None


def _priority(spec: Mapping[str, Any]) -> int:
    """``spec.priority`` (an int32 the API server resolves from the pod's PriorityClass), 0 when absent or malformed."""
    value = spec.get("priority")
    return value if type(value) is int else 0


def constraints_from(pod_spec: Mapping[str, Any]) -> Constraints:
    """Placement constraints of a pod spec: nodeSelector, tolerations, required node affinity."""
    selector = tuple(sorted((str(k), str(v)) for k, v in _map(pod_spec.get("nodeSelector")).items()))
    tolerations = tuple(
        Toleration(
            str(t.get("key") or ""), str(t.get("operator") or "Equal"), str(t.get("value") or ""),
            str(t.get("effect") or ""),
        )
        for t in (_map(x) for x in _list(pod_spec.get("tolerations")))
    )
    required = _map(_map(_map(pod_spec.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ))
    terms = []
    for term in _list(required.get("nodeSelectorTerms")):
        reqs = tuple(
            Requirement(str(r.get("key") or ""), str(r.get("operator") or ""),
                        tuple(str(v) for v in _list(r.get("values"))))
            for r in (_map(x) for x in _list(_map(term).get("matchExpressions")))
        )
        terms.append(reqs)
    return Constraints(selector, tolerations, tuple(terms))


def template_from(template: Mapping[str, Any]) -> JobTemplate:
    """A job's ``spec.template`` -> :class:`JobTemplate`."""
    spec = _map(template.get("spec"))
    containers = _list(spec.get("containers"))
    first = container_requests(containers[0]) if containers else {}
    others: dict[str, float] = {}
    for container in containers[1:]:
        _add(others, container_requests(container))
    init: dict[str, float] = {}
    for container in _list(spec.get("initContainers")):
        _max(init, container_requests(container))
    return JobTemplate(constraints_from(spec), first, others, init, quantities(spec.get("overhead")))


def refusal_from(raw: Any, generation: Any) -> Refusal | None:
    """A job's ``status.admissionRefusal`` (the operator's record, :func:`walras.operator.statuses.refusal_status`)
    -> :class:`Refusal`; None when absent, malformed, or written for another ``metadata.generation`` than
    ``generation`` (a new spec ends a refusal, docs/refusals.md)."""
    record = _map(raw)
    until = timestamp(record.get("retryTime"))
    code, attempts = record.get("code"), record.get("attempts")
    if until is None or not math.isfinite(until) or not isinstance(code, int) or not isinstance(attempts, int) \
            or isinstance(attempts, bool) or attempts < 1 or record.get("observedGeneration") != generation:
        return None
    return Refusal(str(record.get("message") or ""), max(0, _int(record.get("pods"))), until, code, attempts)


def job_from(obj: Mapping[str, Any]) -> Job:
    meta = _meta(obj)
    namespace = str(meta.get("namespace") or "default")
    name = str(meta.get("name") or "<unnamed>")
    status = _map(obj.get("status"))
    observed = status.get("observedGeneration")
    reported = ReportedStatus(
        {str(k): int(v) for k, v in _map(status.get("replicas")).items() if isinstance(v, int)},
        str(status.get("phase") or ""),
        observed if isinstance(observed, int) and not isinstance(observed, bool) else None,
        _int(status.get("failedPods")),
        timestamp(status.get("lastFailureTime")),
        _int(status.get("migrations")),
        timestamp(status.get("lastMigrationTime")),
        timestamp(status.get("completionTime")),
        _int(status.get("misplacedPods")),
        timestamp(status.get("lastMisplacementTime")),
        refusal_from(status.get("admissionRefusal"), meta.get("generation")),
    )
    try:
        spec = parse_job(obj)
    except (ValueError, TypeError) as exc:
        return Job(namespace, name, _generation(obj), None, str(exc), reported=reported)
    template_spec = _map(_map(spec.template).get("spec"))
    raw_priority = template_spec.get("priority")
    explicit = raw_priority if isinstance(raw_priority, int) and not isinstance(raw_priority, bool) else None
    explicit_ok = explicit is not None
    return Job(namespace, name, spec.generation, spec, None, template_from(_map(spec.template)), reported,
               timestamp(meta.get("creationTimestamp")), explicit if explicit is not None else 0,
               _map(obj.get("spec")).get("preemptible") is not False,
               str(template_spec.get("priorityClassName") or ""), explicit_ok)


def _preemption_times(obj: Mapping[str, Any]) -> tuple[float, ...]:
    """``status.preemptionTimes`` of a ResourcePool (RFC 3339 strings) -> sorted epoch seconds; malformed ones left
    out, at most :data:`MAX_PREEMPTION_TIMES` (the latest)."""
    raw = _list(_map(obj.get("status")).get("preemptionTimes"))
    times = sorted(t for t in map(timestamp, raw) if t is not None and math.isfinite(t))
    return tuple(times[-MAX_PREEMPTION_TIMES:])


def pool_from(obj: Mapping[str, Any]) -> Pool:
    name = str(_meta(obj).get("name") or "<unnamed>")
    try:
        return Pool(name, _generation(obj), parse_pool(obj), preemptions=_preemption_times(obj))
    except (ValueError, TypeError) as exc:
        return Pool(name, _generation(obj), None, str(exc))


def profile_from(obj: Mapping[str, Any]) -> Profile:
    name = str(_meta(obj).get("name") or "<unnamed>")
    try:
        return Profile(name, _generation(obj), parse_profile(obj))
    except (ValueError, TypeError) as exc:
        return Profile(name, _generation(obj), None, str(exc))


class Translated(NamedTuple):
    """One object's translation: the ``resourceVersion`` it was read at and the typed item (a named tuple: one is
    made per object translated, 25,000 in a cold plan of the bench)."""

    version: str
    item: Any


@dataclass(frozen=True, slots=True)
class KindSequence:
    """The translations of one kind in one call: the objects' uids and resourceVersions in input order, their entries
    in that order, and the result (sorted)."""

    uids: list[str]
    versions: list[str]
    entries: list[Translated]
    items: tuple[Any, ...]


class TranslationCache:
    """The translations of the last :func:`cluster_from` call made with this cache, owned by the caller: per memo key
    (see the module docstring) the :class:`Translated` entry, and per kind the whole :class:`KindSequence`. Each call
    reads them and replaces them with its own (an object no longer listed is dropped); :meth:`fork` gives a second
    cache that starts from the same (frozen) entries."""

    __slots__ = ("objects", "sequences")

    def __init__(self, objects: Mapping[str, Translated] | None = None,
                 sequences: Mapping[str, KindSequence] | None = None) -> None:
        self.objects: Mapping[str, Translated] = objects if objects is not None else {}
        self.sequences: Mapping[str, KindSequence] = sequences if sequences is not None else {}

    def fork(self) -> TranslationCache:
        return TranslationCache(self.objects, self.sequences)


def _memoised(objs: Iterable[Mapping[str, Any]], kind: str, translate: Callable[[Mapping[str, Any]], T | None],
              expected: type[T], memo: Mapping[str, Translated], out: dict[str, Translated] | None,
              entries: list[Translated] | None = None) -> list[T]:
    """``translate`` over ``objs`` (None results dropped), reusing ``memo``'s translation of an object whose memo key
    and resourceVersion are there and recording this call's in ``out`` (a reused entry as the same object) and, in
    input order, in ``entries``."""
    result: list[T] = []
    append = result.append
    prefix = f"{kind}/" if kind else ""
    for obj in objs:
        meta = obj.get("metadata") if type(obj) is dict else None
        if type(meta) is not dict:
            meta = _meta(obj)
        uid, rv = meta.get("uid"), meta.get("resourceVersion")
        if not uid or not rv:
            item = translate(obj)
            if item is not None:
                append(item)
            continue
        key = prefix + uid if type(uid) is str else prefix + str(uid)
        rv = rv if type(rv) is str else str(rv)
        entry = memo.get(key)
        if entry is None or entry.version != rv or not isinstance(entry.item, expected):
            item = translate(obj)
            if item is None:
                continue
            entry = Translated(rv, item)
        if out is not None:
            out[key] = entry
        if entries is not None:
            entries.append(entry)
        append(entry.item)
    return result


_METADATA, _UID, _RESOURCE_VERSION = itemgetter("metadata"), itemgetter("uid"), itemgetter("resourceVersion")


def _identities(objs: list[Any] | tuple[Any, ...]) -> tuple[list[str], list[str]] | None:
    """Every object's ``metadata.uid`` and ``metadata.resourceVersion`` in input order, or None unless every object
    has both, as non-empty strings (the API server's objects always do; a manifest file's may not)."""
    try:
        metas = list(map(_METADATA, objs))
        uids = list(map(_UID, metas))
        rvs = list(map(_RESOURCE_VERSION, metas))
    except (KeyError, TypeError, IndexError):
        return None
    for values in (uids, rvs):  # C-level passes: every value a str, none empty
        if values and (set(map(type, values)) != {str} or not all(values)):
            return None
    return uids, rvs


@dataclass(frozen=True)
class _Kind:
    """How one kind is translated: its memo-key prefix, its translation, its type and its order."""

    name: str
    translate: Callable[[Mapping[str, Any]], Any]
    expected: type
    order: Callable[[Any], Any]


def _translated(objs: Iterable[Mapping[str, Any]], kind: _Kind, before: TranslationCache | None,
                after: TranslationCache | None) -> list[Any]:
    """The objects of one kind translated and sorted by ``kind.order``. Whole-sequence reuse first: when ``before``
    holds this kind's sequence with the same uids and resourceVersions in the same order, every object's translation
    is the cache's (same uid and resourceVersion, same content) and so is the sorted result, which is returned as it
    was, without a lookup per object or a sort; otherwise :func:`_memoised` per object. ``after`` receives this
    call's entries, and its sequence when every object had a uid and a resourceVersion and translated."""
    objs = objs if type(objs) is tuple or type(objs) is list else tuple(objs)
    ids = _identities(objs) if after is not None else None
    out = cast(dict[str, Translated], after.objects) if after is not None else None
    sequences = cast(dict[str, KindSequence], after.sequences) if after is not None else None
    if ids is not None and before is not None and out is not None and sequences is not None:
        hit = before.sequences.get(kind.name)
        if hit is not None and hit.uids == ids[0] and hit.versions == ids[1]:
            prefix = f"{kind.name}/" if kind.name else ""
            out.update(zip([prefix + uid for uid in ids[0]] if prefix else ids[0], hit.entries, strict=True))
            sequences[kind.name] = hit
            return list(hit.items)
    entries: list[Translated] | None = [] if ids is not None else None
    items = _memoised(objs, kind.name, kind.translate, kind.expected, before.objects if before is not None else {},
                      out, entries)
    items.sort(key=kind.order)
    if ids is not None and entries is not None and sequences is not None and len(entries) == len(objs):
        sequences[kind.name] = KindSequence(ids[0], ids[1], entries, tuple(items))
    return items


_BY_KEY = attrgetter("namespace", "name")


def pods_from(objs: Iterable[Mapping[str, Any]], before: TranslationCache | None = None,
              after: TranslationCache | None = None) -> list[Pod]:
    """Pods in (namespace, name) order, terminal ones included (phases count them out); reuses ``before``'s
    translations by (uid, resourceVersion) and records this call's in ``after`` (see :func:`_translated`)."""
    shapes: PodShapes = {}
    return _translated(objs, _Kind("", lambda obj: pod_from(obj, shapes), Pod, _BY_KEY), before, after)


def nodes_from(objs: Iterable[Mapping[str, Any]], before: TranslationCache | None = None,
               after: TranslationCache | None = None) -> list[Node]:
    """Nodes in name order; reuses ``before``'s translations by (uid, resourceVersion) and records this call's in
    ``after`` (see :func:`_translated`)."""
    return _translated(objs, _Kind("Node", node_from, Node, attrgetter("name")), before, after)


def jobs_from(objs: Iterable[Mapping[str, Any]], before: TranslationCache | None = None,
              after: TranslationCache | None = None) -> list[Job]:
    """FungibleJobs in (namespace, name) order; reuses ``before``'s translations by (uid, resourceVersion) and
    records this call's in ``after`` (see :func:`_translated`)."""
    return _translated(objs, _Kind("FungibleJob", job_from, Job, _BY_KEY), before, after)


# ------------------------------------------------------------------ Budgets (docs/budgets.md)

_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def _finite(value: Any, field_name: str, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not float(value) == float(value) or \
            float(value) in (float("inf"), float("-inf")):
        raise ValueError(f"{field_name} must be a finite number, got {value!r}")
    number = float(value)
    if number < 0 or (positive and number == 0):
        raise ValueError(f"{field_name} must be {'>' if positive else '>='} 0, got {value!r}")
    return number


def label_selector_from(raw: Any, field_name: str) -> LabelSelector:
    """A ``metav1.LabelSelector`` -> :class:`LabelSelector` (``ValueError`` naming the bad field)."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{field_name} must be a LabelSelector (an object)")
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(v, str) for v in labels.values()):
        raise ValueError(f"{field_name}.matchLabels must map label keys to strings")
    expressions = []
    for k, term in enumerate(_list(raw.get("matchExpressions"))):
        term = _map(term)
        operator, key = term.get("operator"), term.get("key")
        if operator not in _SELECTOR_OPERATORS or not isinstance(key, str) or not key:
            raise ValueError(f"{field_name}.matchExpressions[{k}] needs a key and an operator of "
                             f"{', '.join(_SELECTOR_OPERATORS)}")
        values = tuple(str(v) for v in _list(term.get("values")))
        if (operator in ("In", "NotIn")) != bool(values):
            raise ValueError(f"{field_name}.matchExpressions[{k}]: values are required with In and NotIn and "
                             "forbidden with Exists and DoesNotExist")
        expressions.append(Requirement(key, str(operator), values))
    return LabelSelector(tuple(sorted((str(k), v) for k, v in labels.items())), tuple(expressions))


def budget_spec_from(spec: Mapping[str, Any]) -> BudgetSpec:
    """A Budget's ``spec`` -> :class:`BudgetSpec` (``ValueError`` naming the bad field); the CRD's schema and CEL
    rules say the same, for manifests that never met the API server."""
    share = _finite(spec.get("share"), "spec.share", positive=True)
    namespaces = spec.get("namespaces") or []
    if not isinstance(namespaces, list) or not all(isinstance(n, str) and n for n in namespaces):
        raise ValueError("spec.namespaces must be a list of namespace names")
    selector = None
    if spec.get("namespaceSelector") is not None:
        selector = label_selector_from(spec["namespaceSelector"], "spec.namespaceSelector")
    if not namespaces and selector is None:
        raise ValueError("a Budget needs spec.namespaceSelector or spec.namespaces")
    caps = []
    for k, cap in enumerate(_list(spec.get("caps"))):
        cap = _map(cap)
        pool = cap.get("pool")
        if not isinstance(pool, str) or not pool:
            raise ValueError(f"spec.caps[{k}].pool must name a ResourcePool")
        caps.append((pool, _finite(cap.get("maxUnits"), f"spec.caps[{k}].maxUnits", positive=False)))
    if len({pool for pool, _ in caps}) != len(caps):
        raise ValueError("spec.caps names a pool twice")
    return BudgetSpec(share, tuple(sorted(set(namespaces))), selector, tuple(sorted(caps)))


def _credits(value: Any) -> float:
    """A status's amount of credits (``spent``, ``spendRate``): a finite number >= 0, else 0."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return float(value) if ok else 0.0


def budget_from(obj: Mapping[str, Any]) -> Budget:
    """A Budget object -> :class:`Budget`: an invalid spec gives ``spec=None`` and the error; the status's spend
    (``status.spent``, ``status.spentUpdated``, ``status.spendRate``) is read back so that the accumulated spend
    survives a restart (walras.operator.budgets, (T5))."""
    meta = _meta(obj)
    name = str(meta.get("name") or "<unnamed>")
    status = _map(obj.get("status"))
    reported = BudgetReported(_credits(status.get("spent")), timestamp(status.get("spentUpdated")),
                              _credits(status.get("spendRate")))
    created = timestamp(meta.get("creationTimestamp"))
    try:
        spec = budget_spec_from(_map(obj.get("spec")))
    except (ValueError, TypeError) as exc:
        return Budget(name, _generation(obj), None, str(exc), created, reported)
    return Budget(name, _generation(obj), spec, None, created, reported)


def namespace_labels(objs: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Namespace objects -> their labels by name (for the Budgets' namespace selectors)."""
    out: dict[str, dict[str, str]] = {}
    for obj in objs:
        meta = _meta(obj)
        if meta.get("name"):
            out[str(meta["name"])] = {str(k): str(v) for k, v in _map(meta.get("labels")).items()}
    return dict(sorted(out.items()))


# ------------------------------------------------------------------ PriorityClasses (docs/preemption.md)

#: The largest value of a user PriorityClass (scheduling.k8s.io/v1: larger ones are reserved for system classes).
MAX_PRIORITY = 1_000_000_000


def priority_classes(objs: Iterable[Mapping[str, Any]]) -> tuple[dict[str, int], int]:
    """PriorityClass objects (scheduling.k8s.io/v1) -> (name -> value, the globalDefault class's value or 0). An
    object without an integer ``value`` is left out (the API server refuses one); of several globalDefault classes
    (the API server admits one) the lowest value counts, as kube-scheduler's admission takes the lowest."""
    classes: dict[str, int] = {}
    defaults: list[int] = []
    for obj in objs:
        name = _meta(obj).get("name")
        value = obj.get("value")
        if not isinstance(name, str) or not name or isinstance(value, bool) or not isinstance(value, int):
            continue
        classes[name] = int(value)
        if obj.get("globalDefault") is True:
            defaults.append(int(value))
    return dict(sorted(classes.items())), min(defaults) if defaults else 0


def job_priority(job: Job, classes: Mapping[str, int], default: int) -> int:
    """A job's priority as the Priority admission plugin resolves a pod's: the template's ``priority`` when set, else
    its ``priorityClassName``'s value, else the globalDefault class's value (0 without one); an unknown class name
    counts as the default (the API server would refuse the pod; the planner serves the job at the default)."""
    if job.priority_explicit:
        return job.priority
    if job.priority_class:
        return classes.get(job.priority_class, default)
    return default


def with_priorities(jobs: tuple[Job, ...], classes: Mapping[str, int], default: int,
                    before: TranslationCache | None, after: TranslationCache | None) -> tuple[Job, ...]:
    """``jobs`` with :func:`job_priority` resolved into ``Job.priority``. With the caches, the same input tuple (the
    translation cache's) and the same classes give the same resolved tuple object as the last call (so reuse by
    identity downstream still holds); the result is recorded in ``after``."""
    key = repr((sorted(classes.items()), default))
    last = before.sequences.get("PriorityClass") if before is not None else None
    if last is not None and last.items[0] is jobs and last.versions == [key]:
        resolved: tuple[Job, ...] = last.items[1]
    else:
        resolved = tuple(job if job.priority == (p := job_priority(job, classes, default)) else replace(job, priority=p)
                         for job in jobs)
    if after is not None:
        cast(dict[str, KindSequence], after.sequences)["PriorityClass"] = KindSequence([], [key], [], (jobs, resolved))
    return resolved
# ------------------------------------------------------------------ ResourceQuotas (docs/refusals.md)

#: A ResourceQuota's ``spec.hard`` keys the planner models -> the resource of a pod's request they limit.
QUOTA_KEYS = {"requests.cpu": "cpu", "cpu": "cpu", "requests.memory": "memory", "memory": "memory",
              "pods": PODS, "count/pods": PODS}


def _quota_resource(key: str) -> str | None:
    """The request resource a ``spec.hard`` key limits (``requests.nvidia.com/gpu`` -> ``nvidia.com/gpu``), None for
    limits, storage and object counts the planner does not model."""
    if key in QUOTA_KEYS:
        return QUOTA_KEYS[key]
    if key.startswith("requests.") and "/" in key:  # an extended resource: only requests.* is allowed for those
        return key[len("requests."):]
    return None


def quota_from(obj: Mapping[str, Any]) -> Quota | None:
    """A ResourceQuota -> :class:`Quota` of the request limits it sets (the smaller where two keys name one
    resource, ``cpu`` and ``requests.cpu``); None for a quota with ``scopes`` or a ``scopeSelector`` (it limits only
    some pods: not modelled), one without a name, or one that limits nothing the planner models. A malformed
    quantity counts as 0, as elsewhere in this module (the API server validates them)."""
    meta = _meta(obj)
    name = meta.get("name")
    spec = _map(obj.get("spec"))
    if not isinstance(name, str) or not name or spec.get("scopes") or spec.get("scopeSelector"):
        return None
    hard: dict[str, float] = {}
    for key, raw in _map(spec.get("hard")).items():
        resource = _quota_resource(str(key))
        if resource is None:
            continue
        value = _quantity(raw if isinstance(raw, str | int | float) else "")
        if math.isfinite(value):
            hard[resource] = min(value, hard.get(resource, math.inf))
    if not hard:
        return None
    return Quota(str(meta.get("namespace") or "default"), name, dict(sorted(hard.items())))


def quotas_from(objs: Iterable[Mapping[str, Any]]) -> tuple[Quota, ...]:
    """The :class:`Quota` of each ResourceQuota that sets a limit the planner models, in (namespace, name) order."""
    quotas = [q for q in map(quota_from, objs) if q is not None]
    return tuple(sorted(quotas, key=lambda q: (q.namespace, q.name)))


def cluster_from(snapshot: Snapshot, cache: TranslationCache | None = None) -> Cluster:
    """The typed :class:`Cluster` of a :class:`Snapshot` of raw objects (see the module docstring). With ``cache``
    (the caller's, from its previous call): pods, nodes and jobs whose uid and resourceVersion are unchanged reuse
    its translations, a kind whose uids and resourceVersions are the same in the same order reuses the whole sorted
    result, and the cache is then replaced by this call's translations."""
    after = TranslationCache({}, {}) if cache is not None else None
    out = Cluster(
        nodes=tuple(nodes_from(snapshot.nodes, cache, after)),
        pods=tuple(pods_from(snapshot.pods, cache, after)),
        pools=tuple(sorted(map(pool_from, snapshot.pools), key=lambda p: p.name)),
        jobs=tuple(jobs_from(snapshot.jobs, cache, after)),
        profiles=tuple(sorted(map(profile_from, snapshot.profiles), key=lambda p: p.name)),
        budgets=tuple(sorted(map(budget_from, snapshot.budgets), key=lambda b: b.name)),
        namespaces=namespace_labels(snapshot.namespaces),
        quotas=quotas_from(snapshot.resourcequotas),  # docs/refusals.md
    )
    if snapshot.priorityclasses:  # docs/preemption.md
        classes, default = priority_classes(snapshot.priorityclasses)
        out = replace(out, jobs=with_priorities(out.jobs, classes, default, cache, after), priority_classes=classes)
    if cache is not None and after is not None:
        cache.objects, cache.sequences = after.objects, after.sequences
    return out


# ---------------------------------------------------------------------------- a label selector as kubectl writes it
# (``walras run --pool-selector``, docs/tasks/two-releases.md)

#: A label key: an optional DNS-subdomain prefix and ``/``, then a name of <= 63 characters; a label value.
_LABEL_KEY = r"(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?"


def label_selector_text(text: str) -> LabelSelector:
    """A label selector in kubectl's string syntax (``-l``: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``,
    ``k notin (a,b)``, ``k``, ``!k``, requirements separated by commas and ANDed; the grammar of
    ``k8s.io/apimachinery/pkg/labels.Parse``) -> :class:`LabelSelector`; ``k!=v`` is ``NotIn (v)`` (it matches an
    object without ``k``, as in Kubernetes). The empty text selects everything. ``ValueError`` names the bad part."""
    import re

    key, value = _LABEL_KEY, _LABEL_VALUE
    term = re.compile(rf"\s*(?:(?P<not>!)\s*(?P<nkey>{key})|(?P<key>{key})(?:\s*(?P<op>==|=|!=)\s*(?P<value>{value})"
                      rf"|\s+(?P<set>in|notin)\s*\((?P<values>[^()]*)\))?)\s*(?:,|$)")
    labels: dict[str, str] = {}
    expressions: list[Requirement] = []
    pos, text = 0, text.strip()
    while pos < len(text):
        m = term.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot parse the label selector {text!r} at {text[pos:]!r} (expected k=v, k!=v, "
                             "k in (a,b), k notin (a,b), k or !k, separated by commas)")
        pos = m.end()
        if m["not"]:
            expressions.append(Requirement(m["nkey"], "DoesNotExist"))
        elif m["op"] in ("=", "=="):
            if labels.get(m["key"], m["value"]) != m["value"]:
                raise ValueError(f"the label selector {text!r} asks for two values of {m['key']!r}")
            labels[m["key"]] = m["value"]
        elif m["op"] == "!=":
            expressions.append(Requirement(m["key"], "NotIn", (m["value"],)))
        elif m["set"]:
            values = tuple(v.strip() for v in m["values"].split(","))
            if not all(re.fullmatch(value, v) for v in values) or (m["set"] == "in" and values == ("",)):
                raise ValueError(f"the label selector {text!r}: bad values in {m.group(0).strip(' ,')!r}")
            expressions.append(Requirement(m["key"], "In" if m["set"] == "in" else "NotIn", tuple(sorted(set(values)))))
        else:
            expressions.append(Requirement(m["key"], "Exists"))
        if text[pos - 1:pos] == "," and pos == len(text):
            raise ValueError(f"the label selector {text!r} ends with a comma")
    return LabelSelector(tuple(sorted(labels.items())), tuple(expressions))
