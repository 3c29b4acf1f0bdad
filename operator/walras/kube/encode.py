"""Typed plan -> API objects: pod manifests, resize patches, status bodies and patches, Events (no I/O).

* :class:`PodTemplate` is a FungibleJob's ``spec.template`` parsed once (:func:`parse_template`), a frozen value
  whose JSON parts are read-only (:class:`FrozenDict`, :class:`FrozenList`); :class:`TemplateCache` keeps one per
  job by ``(uid, resourceVersion)``. :func:`build_pod` builds the Pod of a :class:`~walras.planner.model.PodPlan`
  from it: labels, the planned-node annotation, an owner reference to the job, ``schedulerName`` and the planned
  requests/limits on the first container. The manifest copies only what it changes (metadata, the pod spec's top
  level, the first container and its resources) and shares the rest, read-only, with the template; the quantities
  are the plan's texts (formatted once, by the planner), never parsed here. :func:`pod_manifest` is both steps for
  one pod, as plain JSON (:func:`thaw`).
* :func:`resize_containers` is the ``pods/resize`` patch that takes a running pod to its planned requests/limits.
* :func:`pool_status`, :func:`job_status` and :func:`profile_status` are the ``status`` bodies of a pool, a job and
  a profile; :func:`stamp_conditions` gives their conditions the ``metav1.Condition`` times and generations and
  :func:`status_patch` turns a desired status into a merge patch that also removes stale keys.
* :func:`event_body` builds a core/v1 Event for an object; :func:`plan_document` is the JSON view of a whole plan
  (``walras plan --json``).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, NoReturn

from walras.planner.model import (
    ANNOTATION_NODE,
    API_VERSION,
    LABEL_JOB,
    LABEL_MANAGED,
    LABEL_POOL,
    MAX_PREEMPTION_TIMES,
    Condition,
    JobPlan,
    Plan,
    PodPlan,
    PoolPlan,
    rfc3339,
)

JSON = dict[str, Any]

#: Status keys written by kopf itself; never removed by the operator's status patches.
KOPF_STATUS_KEYS = frozenset({"kopf"})


# ---------------------------------------------------------------------------------------------- read-only JSON


def _read_only(*_: Any, **__: Any) -> NoReturn:
    raise TypeError("a parsed template is read-only")


class FrozenDict(dict[str, Any]):
    """A JSON object that refuses every change (a ``dict`` still, so ``json.dumps`` and ``==`` treat it as one);
    ``copy.copy`` and ``copy.deepcopy`` give plain, writable dicts."""

    __setitem__ = __delitem__ = _read_only
    clear = pop = popitem = setdefault = update = __ior__ = _read_only

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return {key: copy.deepcopy(value, memo) for key, value in self.items()}

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))


class FrozenList(list[Any]):
    """A JSON array that refuses every change (a ``list`` still); copies are plain lists."""

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only
    append = extend = insert = pop = remove = clear = sort = reverse = _read_only

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return [copy.deepcopy(value, memo) for value in self]

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))


def freeze(value: Any) -> Any:
    """``value`` with every dict and list in it replaced by a :class:`FrozenDict` / :class:`FrozenList` copy."""
    if isinstance(value, Mapping):
        return FrozenDict({str(key): freeze(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return FrozenList(freeze(item) for item in value)
    return value


def thaw(value: Any) -> Any:
    """A plain, writable copy of JSON ``value`` (dicts and lists, the read-only ones included), for a consumer
    that only takes exact dicts and lists (a YAML safe dumper) or that changes the object."""
    if isinstance(value, dict):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, list):
        return [thaw(item) for item in value]
    return value


# ---------------------------------------------------------------------------------------------- pods


@dataclass(frozen=True)
class PodTemplate:
    """A FungibleJob's ``spec.template`` as the pods are built from it.

    ``labels`` and ``annotations`` are the template's own; ``spec`` the pod spec without ``nodeName`` (read-only
    JSON); ``first`` its first container (read-only; ``resources`` is replaced per pod). ``owner_uid`` is the job's
    ``metadata.uid``. ``problem`` says why no pod can be built (no uid, no containers), None when pods can."""

    owner_uid: str
    labels: FrozenDict
    annotations: FrozenDict
    spec: FrozenDict
    first: FrozenDict
    problem: str | None = None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def parse_template(job: Mapping[str, Any]) -> PodTemplate:
    """The :class:`PodTemplate` of a FungibleJob object (its ``spec.template`` and ``metadata.uid``)."""
    template = _mapping(_mapping(job.get("spec")).get("template"))
    meta = _mapping(template.get("metadata"))
    spec = {key: value for key, value in _mapping(template.get("spec")).items() if key != "nodeName"}
    containers = spec.get("containers") or []
    uid = str(_mapping(job.get("metadata")).get("uid") or "")
    problem = None
    if not uid:
        problem = "uid"
    elif not isinstance(containers, list) or not containers:
        problem = "containers"
    elif not isinstance(containers[0], Mapping):
        problem = "container"
    frozen = freeze(spec)
    first = frozen["containers"][0] if problem is None else FrozenDict()
    return PodTemplate(uid, freeze(_mapping(meta.get("labels"))), freeze(_mapping(meta.get("annotations"))), frozen,
                       first, problem)


def pool_node_selector(pool: Mapping[str, Any] | None) -> dict[str, str] | None:
    """A ResourcePool object's ``spec.nodeSelector`` as ``{label: value}`` (None without a pool or a selector)."""
    selector = _mapping(_mapping(_mapping(pool).get("spec")).get("nodeSelector"))
    return {str(k): str(v) for k, v in selector.items()} or None


def pool_affinity(spec: Mapping[str, Any], pool_nodes: Mapping[str, str]) -> JSON:
    """The pod spec's ``affinity`` with a required node affinity to the pool's nodes (issue 30 item 3): every label
    of ``pool_nodes`` (the pool's nodeSelector) as an ``In`` expression, added to each of the template's own required
    ``nodeSelectorTerms`` (terms are ORed, expressions inside a term ANDed, so the pod's node must match the pool
    *and* one of the template's terms) or as the only term. No scheduler path (kube-scheduler with a
    ``managedResources`` that skips the extender, a foreign scheduler, a kubelet admission of a misbound pod) can then
    run the pod outside its pool.

    Why the pool and not the planned node: a pod's affinity cannot change after creation, and a pending pod may be
    re-planned onto another node of its pool (``reconcile``'s ``bind`` of a held pod); inside the pool the extender's
    filter and the operator's own binding put it on the planned node."""
    expressions = [{"key": key, "operator": "In", "values": [value]} for key, value in sorted(pool_nodes.items())]
    affinity = dict(_mapping(spec.get("affinity")))
    node_affinity = dict(_mapping(affinity.get("nodeAffinity")))
    required = dict(_mapping(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")))
    terms = [t for t in required.get("nodeSelectorTerms") or [] if isinstance(t, Mapping)]
    if terms:
        new_terms = [{**term, "matchExpressions": [*(_mapping_list(term.get("matchExpressions"))), *expressions]}
                     for term in terms]
    else:
        new_terms = [{"matchExpressions": expressions}]
    required["nodeSelectorTerms"] = new_terms
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    affinity["nodeAffinity"] = node_affinity
    return affinity


def _mapping_list(value: Any) -> list[Any]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def build_pod(template: PodTemplate, pod: PodPlan, scheduler_name: str,
              pool_nodes: Mapping[str, str] | None = None) -> JSON:
    """The Pod to create for ``pod`` from its job's parsed ``template`` (owner reference, labels, resources, and
    with ``pool_nodes``, the pool's nodeSelector, a required node affinity to the pool's nodes: :func:`pool_affinity`);
    ``ValueError`` when the template cannot make one (the job has no uid, or no containers)."""
    if template.problem == "uid":
        raise ValueError(f"FungibleJob {pod.namespace}/{pod.job} has no metadata.uid; cannot own pod {pod.name}")
    if template.problem == "containers":
        raise ValueError(f"FungibleJob {pod.namespace}/{pod.job}: spec.template.spec.containers is empty")
    if template.problem is not None:
        raise ValueError(f"FungibleJob {pod.namespace}/{pod.job}: spec.template.spec.containers[0] is not an object")
    labels = {**template.labels, LABEL_JOB: pod.job, LABEL_POOL: pod.pool, LABEL_MANAGED: "true"}
    annotations = dict(template.annotations)
    if pod.node:
        annotations[ANNOTATION_NODE] = pod.node
    first = template.first
    resources = dict(_mapping(first.get("resources")))
    if pod.requests:
        resources["requests"] = {**_mapping(resources.get("requests")), **pod.requests}
    if pod.limits:
        resources["limits"] = {**_mapping(resources.get("limits")), **pod.limits}
    containers = [{**first, "resources": resources}, *template.spec["containers"][1:]]
    spec = {**template.spec, "containers": containers, "schedulerName": scheduler_name}
    if pool_nodes:
        spec["affinity"] = pool_affinity(template.spec, pool_nodes)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": pod.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [{
                "apiVersion": API_VERSION, "kind": "FungibleJob", "name": pod.job, "uid": template.owner_uid,
                "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": spec,
    }


def pod_manifest(job: Mapping[str, Any], pod: PodPlan, scheduler_name: str,
                 pool_nodes: Mapping[str, str] | None = None) -> JSON:
    """The Pod to create for ``pod`` from ``job``'s ``spec.template``, as plain, writable JSON: :func:`build_pod` of
    :func:`parse_template`, thawed (for one pod, offline: ``walras plan --emit-pods``, the simulations; the operator
    keeps each job's parsed template in a :class:`TemplateCache` and sends :func:`build_pod`'s manifest as it is)."""
    manifest: JSON = thaw(build_pod(parse_template(job), pod, scheduler_name, pool_nodes))
    return manifest


class TemplateCache:
    """Each FungibleJob's :class:`PodTemplate`, parsed once per ``(metadata.uid, metadata.resourceVersion)`` (the
    API server changes the resourceVersion on every write, so the same pair is the same template); at most
    ``size`` jobs, the least recently used dropped first. A job without both is parsed on every call. Owned by its
    caller (the operator's actuator)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._parsed: OrderedDict[tuple[str, str], PodTemplate] = OrderedDict()
        self.parses = 0  # how many templates were parsed (for tests)

    def template(self, job: Mapping[str, Any]) -> PodTemplate:
        """``job``'s parsed template, from the cache where its uid and resourceVersion are there."""
        meta = _mapping(job.get("metadata"))
        key = (str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))
        found = self._parsed.get(key) if all(key) else None
        if found is not None:
            self._parsed.move_to_end(key)
            return found
        self.parses += 1
        parsed = parse_template(job)
        if all(key):
            self._parsed[key] = parsed
            while len(self._parsed) > self.size:
                self._parsed.popitem(last=False)
        return parsed


def resize_containers(current: Mapping[str, Any], pod: PodPlan) -> list[JSON] | None:
    """The ``containers`` of a resize patch taking the first container to the planned requests/limits, or None if
    it already has them."""
    containers = (current.get("spec") or {}).get("containers") or []
    if not containers:
        return None
    first = containers[0]
    resources = first.get("resources") or {}
    want_req = {**(resources.get("requests") or {}), **pod.requests}
    want_lim = {**(resources.get("limits") or {}), **pod.limits}
    if want_req == (resources.get("requests") or {}) and want_lim == (resources.get("limits") or {}):
        return None
    return [{"name": first.get("name"), "resources": {"requests": want_req, "limits": want_lim}}]


# ---------------------------------------------------------------------------------------------- statuses


def conditions_body(conditions: Iterable[Condition]) -> list[dict[str, str]]:
    """Conditions as the status lists them (``type``, ``status``, ``reason``, ``message``)."""
    return [c.to_dict() for c in conditions]


def pool_status(pool: PoolPlan) -> JSON:
    """The ``status`` body written to a ResourcePool."""
    return {
        "nodeCount": pool.node_count,
        "capacity": pool.capacity,
        "used": pool.used,
        "price": pool.price,
        "priceText": f"{pool.price:.4g}",
        "utilisation": pool.utilisation,
        "utilisationText": f"{100 * pool.utilisation:.0f}%",
        "podsPlanned": pool.pods_planned,
        "podsBound": pool.pods_bound,
        "conditions": conditions_body(pool.conditions),
        **({} if pool.observed_generation is None else {"observedGeneration": pool.observed_generation}),
        # the last hour's preemptions (docs/preemption.md: maxPerHour holds across a restart); once written, times
        # older than an hour are ignored where they are read, so an empty list need not clear the field
        **({"preemptionTimes": [rfc3339(t) for t in pool.preemptions[-MAX_PREEMPTION_TIMES:]]}
           if pool.preemptions else {}),
    }


def _throughput_text(value: float, unit: str) -> str:
    """``4.39 iterations/s``; a unit that starts with ``/`` is joined without a space (``4.39/s``)."""
    return f"{value:.3g}{unit}" if unit.startswith("/") else f"{value:.3g} {unit}"


def job_status(job: JobPlan) -> JSON:
    """The ``status`` body written to a FungibleJob (the pods listed are those that stay: not deleted or evicted;
    a utility that is not finite, the log of nothing, is left out: JSON has no infinity). ``replicasText`` is
    ``running/count`` and ``costText`` the cost to three digits (the printer columns); ``queuePosition`` and
    ``waitingReason`` are there while the job waits for replicas (docs/troubleshooting.md)."""
    body: JSON = {
        "phase": job.phase,
        "allocation": dict(job.allocation),
        "allocationText": job.allocation_text or "-",
        **({"tenant": job.tenant} if job.tenant else {}),
        "replicas": dict(job.replicas),
        "placedReplicas": sum(job.replicas.values()),
        "runningReplicas": job.running,
        "replicasText": f"{job.running}/{job.count}",
        "wantedReplicas": dict(job.wanted),
        "grantedReplicas": sum(job.wanted.values()),
        "throughput": job.throughput,
        "throughputText": _throughput_text(job.throughput, job.throughput_unit),
        "pricedThroughput": job.priced_throughput,
        **({"utility": job.utility} if math.isfinite(job.utility) else {}),
        "cost": job.cost,
        "costText": f"{job.cost:.3g}",
        "pricedCost": job.priced_cost,
        "pods": [
            {"name": p.name, "pool": p.pool, "node": p.node, "requests": p.requests, "limits": p.limits}
            for p in job.pods
            if p.action not in ("delete", "evict")
        ],
        "conditions": conditions_body(job.conditions),
        "failedPods": job.failures,
        "migrations": job.migrations,
    }
    if job.queue_position is not None:
        body["queuePosition"] = job.queue_position
    if job.reason:
        body["waitingReason"] = job.reason
    if job.observed_generation is not None:
        body["observedGeneration"] = job.observed_generation
    if job.misplaced:  # read back after a restart, so the replacement's backoff goes on (docs/refusals.md)
        body["misplacedPods"] = job.misplaced
    for name, value in (("lastFailureTime", job.last_failure), ("completionTime", job.completion_time),
                        ("lastMigrationTime", job.last_migration), ("lastMisplacementTime", job.last_misplaced)):
        if value is not None:
            body[name] = rfc3339(value)
    return body


def profile_status(conditions: Iterable[Condition], generation: Any) -> JSON:
    """The ``status`` body written to a ColocationProfile: its conditions and the generation they judged."""
    return {"conditions": conditions_body(conditions), "observedGeneration": generation}


#: The ``ResizePending`` condition's reason (a job whose pods wait for a resize the cluster cannot do in place).
RESIZE_PENDING_REASON = "InPlaceResizeUnsupported"


def with_resize_pending(status: JSON, message: str | None) -> JSON:
    """A job's ``status`` with the ``ResizePending`` condition added when ``message`` says which pods wait."""
    if not message:
        return status
    return {**status, "conditions": [*status["conditions"], {
        "type": "ResizePending", "status": "True", "reason": RESIZE_PENDING_REASON, "message": message}]}


#: The longest condition message written (metav1.Condition's ``message`` has maxLength 32768 in the CRDs).
MAX_MESSAGE = 32768
#: The longest text field otherwise written into a status (``allocationText`` of a job in many pools).
MAX_TEXT = 4096


def _cut(text: str, most: int) -> str:
    """``text`` cut to at most ``most`` characters, ending with how many were cut."""
    if len(text) <= most:
        return text
    keep = max(0, most - len(f" ... ({len(text)} characters cut)"))  # the count has at most len(text)'s digits
    return text[:keep] + f" ... ({len(text) - keep} characters cut)"


def _clean(value: Any, key: str = "") -> bool:
    """Whether :func:`sanitised` would leave ``value`` as it is (a read-only walk: the common case costs no copy)."""
    kind = type(value)
    if kind is float:
        return value - value == 0.0  # False for NaN and the infinities
    if kind is str:
        return len(value) <= (MAX_MESSAGE if key == "message" else MAX_TEXT)
    if kind is dict:
        return all(_clean(item, k) for k, item in value.items())
    if kind is list:
        return all(_clean(item, key) for item in value)
    return kind is int or kind is bool or value is None


def sanitised(value: Any, key: str = "") -> Any:
    """JSON ``value`` that the API server accepts in a status (issue 30 item 7): a number that is not finite (JSON has
    no NaN or Infinity; the API server refuses the whole patch) is left out of its object or list, a condition
    ``message`` is cut to :data:`MAX_MESSAGE` characters and any other string to :data:`MAX_TEXT`, each saying how
    many characters were cut. :func:`status_patch` applies it to every status it writes (``value`` itself when
    nothing needs changing)."""
    if _clean(value, key):
        return value
    return _sanitised(value, key)


def _sanitised(value: Any, key: str) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return _cut(value, MAX_MESSAGE if key == "message" else MAX_TEXT)
    if isinstance(value, Mapping):
        out: JSON = {}
        for k, item in value.items():
            clean = _sanitised(item, str(k))
            if clean is not None or item is None:
                out[k] = clean
        return out
    if isinstance(value, list | tuple):
        return [clean for clean, item in ((_sanitised(item, key), item) for item in value)
                if clean is not None or item is None]
    return value


#: The largest status written, in bytes of JSON: well under etcd's 1.5 MiB object limit (the object's spec and
#: metadata share it) and the API server's 3 MiB request limit.
MAX_STATUS_BYTES = 1 << 20


def bounded(status: JSON, most: int = MAX_STATUS_BYTES) -> JSON:
    """``status`` with its ``pods`` list cut so that its JSON fits in ``most`` bytes, and then a ``StatusTruncated``
    condition saying how many pods were left out (a job of 10,000 pods would otherwise be refused its status on
    every plan); unchanged when it fits."""
    pods = status.get("pods")
    if not isinstance(pods, list) or len(pods) < 256:  # small enough whatever they hold (messages are cut, maps
        return status                                    # bounded): skip the measurement on every plan
    size = len(json.dumps(status, separators=(",", ":")))
    if size <= most:
        return status
    per_pod = max(1, len(json.dumps(pods, separators=(",", ":"))) // len(pods))
    keep = max(0, len(pods) - (size - most) // per_pod - 1)
    while True:
        note = {"type": "StatusTruncated", "status": "True", "reason": "TooLarge",
                "message": f"status.pods lists {keep} of {len(pods)} pods ({len(pods) - keep} left out: the status "
                           f"would exceed {most} bytes)"}
        out = {**status, "pods": pods[:keep], "conditions": [*status.get("conditions", []), note]}
        if keep == 0 or len(json.dumps(out, separators=(",", ":"))) <= most:
            return out
        keep = max(0, keep - max(1, keep // 10))


def status_patch(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> JSON | None:
    """A merge patch ``{"status": ...}`` that makes ``current`` status equal ``desired`` (stale keys set to null),
    or None when nothing changes. kopf's own keys are left alone. ``desired`` is :func:`sanitised` and
    :func:`bounded` first, so no patch carries a non-finite number, an over-long message or more than
    :data:`MAX_STATUS_BYTES`."""
    desired = bounded(sanitised(desired))
    current = dict(current or {})
    for key in KOPF_STATUS_KEYS:
        current.pop(key, None)
    if _same(current, desired):
        return None
    return {"status": _replace(current, desired)}


def stamp_conditions(current: Mapping[str, Any] | None, desired: Mapping[str, Any], generation: Any,
                     now: str | None = None) -> JSON:
    """``desired`` with its conditions in ``metav1.Condition`` shape: ``lastTransitionTime`` kept from the current
    condition of the same type while its status is unchanged (else ``now``), and ``observedGeneration``."""
    previous = {c.get("type"): c for c in (current or {}).get("conditions") or [] if isinstance(c, Mapping)}
    stamp = now or _now()
    out = dict(desired)
    conditions = []
    for condition in desired.get("conditions") or []:
        old = previous.get(condition.get("type"))
        unchanged = old is not None and old.get("status") == condition.get("status")
        kept = old.get("lastTransitionTime") if old is not None and unchanged else None
        entry = {**condition, "lastTransitionTime": kept or stamp}
        if isinstance(generation, int):
            entry["observedGeneration"] = generation
        conditions.append(entry)
    out["conditions"] = conditions
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
        return float(a) == float(b)
    return bool(a == b)


def _replace(old: Any, new: Any) -> Any:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: JSON = {k: None for k in old if k not in new}
        for key, value in new.items():
            out[key] = _replace(old.get(key), value)
        return out
    return copy.deepcopy(new)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------- events and views


def event_body(involved: Mapping[str, Any], type_: str, reason: str, message: str, instance: str) -> JSON:
    """A core/v1 Event about ``involved`` (an object with apiVersion, kind, metadata)."""
    meta = involved.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    now = _now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name', 'walras')}.", "namespace": namespace},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion"), "kind": involved.get("kind"), "name": meta.get("name"),
            "namespace": meta.get("namespace", ""), "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason[:128],
        "message": message[:1024],
        "type": type_,
        "source": {"component": "walras"},
        "reportingComponent": "walras.dev/operator",
        "reportingInstance": instance[:128],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def plan_document(plan: Plan) -> JSON:
    """A JSON-ready view of a plan (``walras plan --json``): each pool's and job's status body, the pod plans,
    the profiles' conditions, the Events, the solver's statistics and the planning time."""
    return {
        "pools": {name: {"resource": p.resource, "policy": p.policy, **pool_status(p)}
                  for name, p in plan.pools.items()},
        "jobs": [{"namespace": j.namespace, "name": j.name, **job_status(j)} for j in plan.jobs.values()],
        "pods": [p.to_dict() for p in plan.pods],
        "profiles": {name: conditions_body(conds) for name, conds in plan.profiles.items()},
        "events": [asdict(e) for e in plan.events],
        "solver": asdict(plan.solver),
        "seconds": plan.seconds,
    }
