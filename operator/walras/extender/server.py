"""The kube-scheduler extender (HTTP, extender API v1 JSON) answering from the current Walras plan.

Wire format (``k8s.io/kube-scheduler/extender/v1``):

* ``POST /scheduler/filter``: ``ExtenderArgs`` ``{"pod": Pod, "nodes": NodeList}`` or, when the extender is
  ``nodeCacheCapable``, ``{"pod": Pod, "nodenames": [...]}`` -> ``ExtenderFilterResult`` ``{"nodes" | "nodenames",
  "failedNodes": {node: reason}, "failedAndUnresolvableNodes": {...}, "error": ""}``.
* ``POST /scheduler/prioritize``: ``ExtenderArgs`` -> ``HostPriorityList`` ``[{"host": node, "score": 0..10}]``.
* ``POST /scheduler/bind``: ``ExtenderBindingArgs`` ``{"podName", "podNamespace", "podUID", "node"}`` ->
  ``ExtenderBindingResult`` ``{"error": ""}``.
* ``POST /scheduler/preempt``: ``ExtenderPreemptionArgs`` ``{"pod", "nodeToVictims", "nodeNameToMetaVictims"}``
  -> ``ExtenderPreemptionResult`` ``{"nodeNameToMetaVictims"}`` (pass-through: Walras does not veto victims).

Go decodes JSON field names case-insensitively; so do we (top-level keys). A pod Walras manages (in the plan, or
labelled ``walras.dev/managed=true``) passes only on its planned node and scores 10 there, 0 elsewhere; any other pod
passes through (every node passes, every score is 0). A malformed request gets HTTP 400 with the reason in
``error``.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from walras.metrics import WalrasMetrics
from walras.planner.model import LABEL_MANAGED, Plan, PodPlan

#: The highest score an extender may give (``MaxExtenderPriority`` in kube-scheduler).
MAX_EXTENDER_PRIORITY = 10

_encode_str: Callable[[str], str] = json.encoder.encode_basestring  # type: ignore[attr-defined]

PlanSource = Callable[[], Plan | None]
Binder = Callable[[str, str, str, str], Awaitable[None]]  # (namespace, name, uid, node)


class BadRequest(ValueError):
    """A request that does not follow the extender v1 JSON (answered with HTTP 400)."""


def _lower_keys(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, Mapping):
        raise BadRequest(f"{what}: the body must be a JSON object, got {type(body).__name__}")
    return {str(k).lower(): v for k, v in body.items()}


def _pod_key(pod: Any) -> tuple[str, str, Mapping[str, Any]]:
    if not isinstance(pod, Mapping):
        raise BadRequest("ExtenderArgs.pod must be a Pod object")
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("name"):
        raise BadRequest("ExtenderArgs.pod.metadata.name is missing")
    return str(meta.get("namespace") or "default"), str(meta["name"]), meta.get("labels") or {}


@dataclass
class PlanIndex:
    """``(namespace, pod name) -> PodPlan`` for one plan (built once per plan; ``Plan.pod`` is a linear scan)."""

    plan: Plan | None
    pods: dict[tuple[str, str], PodPlan] = field(default_factory=dict)

    @classmethod
    def build(cls, plan: Plan | None) -> PlanIndex:
        index = cls(plan)
        if plan is not None:
            for pod in plan.pods:
                if pod.action != "delete":
                    index.pods[(pod.namespace, pod.name)] = pod
        return index


class Extender:
    """Filter / prioritize / bind / preempt over the current plan; also serves them as an aiohttp app."""

    def __init__(self, plan_source: PlanSource, binder: Binder | None = None,
                 metrics: WalrasMetrics | None = None, freeze_gc: bool = True) -> None:
        self.plan_source = plan_source
        self.freeze_gc = freeze_gc
        self.binder = binder
        self.metrics = metrics
        self._index = PlanIndex.build(None)

    def index(self) -> PlanIndex:
        """The index of the current plan, rebuilt when the plan changes.

        A new plan's objects are then moved out of the cyclic garbage collector's reach (``gc.freeze``): a plan of
        20,000 pods otherwise makes every full collection that lands inside a request cost ~20 ms, which alone would
        break the 10 ms p99 target. Frozen objects are still freed by reference counting when the plan is replaced
        (plans hold no reference cycles).
        """
        plan = self.plan_source()
        if plan is not self._index.plan:
            self._index = PlanIndex.build(plan)
            if self.freeze_gc:
                gc.freeze()
        return self._index

    # ------------------------------------------------------------------ verbs (pure over the plan)

    def _decision(self, pod: Any) -> tuple[bool, str | None, str]:
        """(managed?, planned node or None, reason text for the nodes that fail)."""
        namespace, name, labels = _pod_key(pod)
        planned = self.index().pods.get((namespace, name))
        if planned is not None:
            if planned.node is None:
                return True, None, f"Walras: pod {namespace}/{name} has no node in the current plan"
            return True, planned.node, f"walras: planned on {planned.node}"
        if str(labels.get(LABEL_MANAGED, "")).lower() == "true":
            return True, None, f"Walras: pod {namespace}/{name} is not in the current plan yet"
        return False, None, ""

    def filter(self, body: Any) -> dict[str, Any]:
        """``ExtenderArgs`` -> ``ExtenderFilterResult`` (same node form as the request: nodes or nodenames)."""
        args = _lower_keys(body, "ExtenderArgs")
        managed, node, reason = self._decision(args.get("pod"))
        names = args.get("nodenames")
        nodes = args.get("nodes")
        if names is not None:
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise BadRequest("ExtenderArgs.nodenames must be a list of strings")
            if not managed:
                return {"nodenames": names, "failedNodes": {}, "error": ""}
            passed = [n for n in names if n == node]
            failed = {n: reason for n in names if n != node}
            return {"nodenames": passed, "failedNodes": failed, "error": ""}
        if nodes is not None:
            items = nodes.get("items") if isinstance(nodes, Mapping) else None
            if not isinstance(items, list):
                raise BadRequest("ExtenderArgs.nodes must be a NodeList with items")
            if not managed:
                return {"nodes": nodes, "failedNodes": {}, "error": ""}
            kept, failed = [], {}
            for i, item in enumerate(items):
                try:
                    item_name = item["metadata"]["name"]
                except (KeyError, TypeError) as exc:
                    raise BadRequest(f"ExtenderArgs.nodes.items[{i}] has no metadata.name") from exc
                if item_name == node:
                    kept.append(item)
                else:
                    failed[item_name] = reason
            return {"nodes": {**nodes, "items": kept}, "failedNodes": failed, "error": ""}
        raise BadRequest("ExtenderArgs needs either nodes or nodenames")

    def prioritize(self, body: Any) -> list[dict[str, Any]]:
        """``ExtenderArgs`` -> ``HostPriorityList``: the planned node scores 10, every other node 0."""
        node, names = self.prioritize_hosts(body)
        return [{"host": n, "score": MAX_EXTENDER_PRIORITY if n == node else 0} for n in names]

    def prioritize_hosts(self, body: Any) -> tuple[str | None, list[str]]:
        """(planned node or None, the node names of the request) for :meth:`prioritize`."""
        args = _lower_keys(body, "ExtenderArgs")
        _, node, _ = self._decision(args.get("pod"))
        names = args.get("nodenames")
        if names is None:
            nodes = args.get("nodes")
            items = nodes.get("items") if isinstance(nodes, Mapping) else None
            if not isinstance(items, list):
                raise BadRequest("ExtenderArgs needs either nodes or nodenames")
            try:
                names = [item["metadata"]["name"] for item in items]
            except (KeyError, TypeError) as exc:
                raise BadRequest("ExtenderArgs.nodes.items[*] needs metadata.name") from exc
        elif not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise BadRequest("ExtenderArgs.nodenames must be a list of strings")
        return node, names

    async def bind(self, body: Any) -> dict[str, Any]:
        """``ExtenderBindingArgs`` -> ``ExtenderBindingResult``; refuses a managed pod off its planned node."""
        args = _lower_keys(body, "ExtenderBindingArgs")
        missing = [k for k in ("podname", "podnamespace", "node") if not args.get(k)]
        if missing:
            raise BadRequest(f"ExtenderBindingArgs is missing {', '.join(missing)}")
        namespace, name, node = str(args["podnamespace"]), str(args["podname"]), str(args["node"])
        planned = self.index().pods.get((namespace, name))
        if planned is not None and planned.node not in (None, node):
            return {"error": f"Walras: pod {namespace}/{name} is planned on {planned.node}, not {node}"}
        if self.binder is None:
            return {"error": "Walras: this extender has no binder configured"}
        try:
            await self.binder(namespace, name, str(args.get("poduid") or ""), node)
        except Exception as exc:  # the scheduler needs the reason as text
            return {"error": f"Walras: binding {namespace}/{name} to {node} failed: {exc}"}
        return {"error": ""}

    def prioritize_json(self, body: Any) -> bytes:
        """:meth:`prioritize` encoded as JSON bytes without building one dict per node (the HTTP path)."""
        hosts = self.prioritize_hosts(body)
        node, names = hosts
        parts = [f'{{"host":{_encode_str(n)},"score":{MAX_EXTENDER_PRIORITY if n == node else 0}}}' for n in names]
        return ("[" + ",".join(parts) + "]").encode()

    def preempt(self, body: Any) -> dict[str, Any]:
        """``ExtenderPreemptionArgs`` -> ``ExtenderPreemptionResult``: the candidates pass through unchanged."""
        args = _lower_keys(body, "ExtenderPreemptionArgs")
        meta = args.get("nodenametometavictims")
        if meta is None:
            victims = args.get("nodetovictims") or {}
            if not isinstance(victims, Mapping):
                raise BadRequest("ExtenderPreemptionArgs.nodeToVictims must be an object")
            meta = {}
            for node, vict in victims.items():
                pods = (vict or {}).get("pods") or []
                meta[node] = {"pods": [{"uid": (p.get("metadata") or {}).get("uid", "")} for p in pods],
                              "numPDBViolations": int((vict or {}).get("numPDBViolations", 0))}
        elif not isinstance(meta, Mapping):
            raise BadRequest("ExtenderPreemptionArgs.nodeNameToMetaVictims must be an object")
        return {"nodeNameToMetaVictims": meta}

    # ------------------------------------------------------------------ HTTP

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/scheduler/filter", self._handler("filter"))
        app.router.add_post("/scheduler/prioritize", self._handler("prioritize"))
        app.router.add_post("/scheduler/bind", self._handler("bind"))
        app.router.add_post("/scheduler/preempt", self._handler("preempt"))
        app.router.add_get("/healthz", self._healthz)
        return app

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    def _handler(self, verb: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            started = time.perf_counter()
            code = 200
            try:
                raw = await request.read()
                try:
                    body = json.loads(raw)
                except ValueError as exc:
                    raise BadRequest(f"the body is not JSON: {exc}") from exc
                encoded: bytes | None = None
                if verb == "filter":
                    result: Any = self.filter(body)
                elif verb == "prioritize":
                    encoded = self.prioritize_json(body)
                elif verb == "bind":
                    result = await self.bind(body)
                else:
                    result = self.preempt(body)
            except BadRequest as exc:
                code = 400
                encoded = None
                result = {"error": f"Walras extender: malformed {verb} request: {exc}"}
            if encoded is None:
                encoded = json.dumps(result, separators=(",", ":")).encode()
            response = web.Response(body=encoded, status=code, content_type="application/json")
            if self.metrics is not None:
                self.metrics.extender_request(verb, code, time.perf_counter() - started)
            return response

        return handle
