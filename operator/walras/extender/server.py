"""The kube-scheduler extender (HTTP, extender API v1) answering from the current Walras plan.

Requests are read as kube-scheduler sends them, with the Go field names of ``k8s.io/kube-scheduler/extender/v1``
(see :mod:`walras.extender.wire`). Answers use lower camel case keys, which Go decodes case-insensitively into the
same fields:

* ``POST /scheduler/filter``: ``ExtenderArgs`` -> ``{"nodenames" | "nodes", "failedNodes",
  "failedAndUnresolvableNodes", "error"}`` in the form of the request (``NodeNames`` -> ``nodenames``, ``Nodes`` ->
  ``nodes``, a ``NodeList`` holding the request's own node objects).
* ``POST /scheduler/prioritize``: ``ExtenderArgs`` -> ``[{"host", "score"}]`` (0..10).
* ``POST /scheduler/bind``: ``ExtenderBindingArgs`` -> ``{"error"}``.
* ``POST /scheduler/preempt``: ``ExtenderPreemptionArgs`` -> ``{"nodeNameToMetaVictims"}``.
* ``GET /readyz``: 200 on the replica that leads (the one whose plan is acted on), 503 on a standby; ``GET /healthz``.

Decisions. A pod Walras manages (in the current plan, or labelled ``walras.dev/managed=true``) passes only on its
planned node and scores 10 there. Nodes other than a planned node go to ``failedAndUnresolvableNodes``: preemption on
them cannot help, because Walras accepts no other node for the pod. A managed pod with no planned node yet fails
with a plain ``failedNodes`` reason (a later plan may place it). Preemption keeps only the planned node's
candidates; a managed pod without a planned node gets none. Any other pod passes through: every node passes, scores
are 0, preemption candidates are returned unchanged. ``bind`` binds a pod of the current plan only to its planned
node. A pod Walras does not manage is bound through ``foreign_binder`` where one is given (``walras run`` gives the
controller's, :meth:`walras.operator.controller.Controller.bind_foreign`, which binds only where the node still has
room): kube-scheduler sends an extender that is its binder (``bindVerb``) every pod it schedules, so in a set-up with
one kube-scheduler whose extender binds, a pod no one else would bind never runs otherwise (a foreign preemptor
stayed Pending for ever, docs/refusals.md). Everything else is refused with a reason in ``error``.

A standby replica (``leader()`` false) has no plan to act on: it answers "no opinion" as for an unmanaged pod,
refuses every ``bind``, and reports 503 on ``/readyz`` so that a Service routes to the leader only.

HTTP limits (:class:`Limits`): bodies above 4 MiB get 413, a body not complete within the read timeout gets 408 and
the connection is closed, JSON nested past the parser's limit and every other malformed request get 400 with the
reason in ``error``; nothing a client sends produces a 500.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from walras.extender.wire import (
    MAX_BODY_BYTES,
    BadRequest,
    BindArgs,
    BodyTimeout,
    BodyTooLarge,
    FilterArgs,
    PodRef,
    PreemptArgs,
    RequestError,
    decode,
    meta_victims,
)
from walras.metrics import WalrasMetrics
from walras.planner.model import LABEL_MANAGED, Plan, PodPlan

logger = logging.getLogger("walras.extender")

#: The highest score an extender may give (``MaxExtenderPriority`` in kube-scheduler).
MAX_EXTENDER_PRIORITY = 10

_encode_str: Callable[[str], str] = json.encoder.encode_basestring

PlanSource = Callable[[], Plan | None]
Binder = Callable[[str, str, str, str], Awaitable[None]]  # (namespace, name, uid, node)
LeaderCheck = Callable[[], bool]

VERBS = ("filter", "prioritize", "bind", "preempt")


@dataclass(frozen=True)
class Limits:
    """What one request may cost the extender: body size (-> 413) and the time to receive the body (-> 408)."""

    max_body_bytes: int = MAX_BODY_BYTES
    read_timeout: float = 10.0


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


@dataclass(frozen=True)
class Decision:
    """What Walras says about one pod: managed or not, its planned node, and the reason other nodes fail."""

    managed: bool
    node: str | None = None
    reason: str = ""


NO_OPINION = Decision(False)


class Extender:
    """Filter / prioritize / bind / preempt over the current plan; also serves them as an aiohttp app."""

    def __init__(self, plan_source: PlanSource, binder: Binder | None = None,
                 metrics: WalrasMetrics | None = None, freeze_gc: bool = True, leader: LeaderCheck | None = None,
                 limits: Limits | None = None, foreign_binder: Binder | None = None) -> None:
        self.plan_source = plan_source
        self.freeze_gc = freeze_gc
        self.binder = binder
        self.foreign_binder = foreign_binder
        self.metrics = metrics
        self.leader = leader
        self.limits = limits or Limits()
        self._index = PlanIndex.build(None)

    def leads(self) -> bool:
        """Whether this replica's plan is the one acted on (always, without leader election)."""
        return self.leader is None or bool(self.leader())

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

    def decide(self, pod: PodRef) -> Decision:
        """Whether Walras manages ``pod`` and where its plan puts it."""
        if not self.leads():
            return NO_OPINION
        planned = self.index().pods.get((pod.namespace, pod.name))
        where = f"{pod.namespace}/{pod.name}"
        if planned is not None:
            if planned.node is None:
                return Decision(True, None, f"Walras: pod {where} has no node in the current plan")
            return Decision(True, planned.node, f"Walras: pod {where} is planned on {planned.node}")
        if pod.labels.get(LABEL_MANAGED, "").lower() == "true":
            return Decision(True, None, f"Walras: pod {where} is not in the current plan yet")
        return NO_OPINION

    def filter(self, body: Any) -> dict[str, Any]:
        """``ExtenderArgs`` -> ``ExtenderFilterResult`` in the node form of the request."""
        args = FilterArgs.parse(_mapping(body, "ExtenderArgs"))
        decision = self.decide(args.pod)
        names = args.names
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        if decision.managed:
            rejected = failed if decision.node is None else unresolvable
            for name in names:
                if name != decision.node:
                    rejected[name] = decision.reason
        result: dict[str, Any]
        if args.node_names is not None:
            kept = names if not decision.managed else [n for n in names if n == decision.node]
            result = {"nodenames": kept}
        else:
            assert args.node_list is not None
            items = args.node_items if not decision.managed else [
                item for item in args.node_items if item["metadata"]["name"] == decision.node]
            result = {"nodes": {**args.node_list, "items": items}}
        result.update(failedNodes=failed, failedAndUnresolvableNodes=unresolvable, error="")
        return result

    def prioritize(self, body: Any) -> list[dict[str, Any]]:
        """``ExtenderArgs`` -> ``HostPriorityList``: the planned node scores 10, every other node 0."""
        node, names = self.prioritize_hosts(body)
        return [{"host": n, "score": MAX_EXTENDER_PRIORITY if n == node else 0} for n in names]

    def prioritize_hosts(self, body: Any) -> tuple[str | None, list[str]]:
        """(planned node or None, the node names of the request) for :meth:`prioritize`."""
        args = FilterArgs.parse(_mapping(body, "ExtenderArgs"))
        return self.decide(args.pod).node, args.names

    def prioritize_json(self, body: Any) -> bytes:
        """:meth:`prioritize` encoded as JSON bytes without building one dict per node (the HTTP path)."""
        node, names = self.prioritize_hosts(body)
        parts = [f'{{"host":{_encode_str(n)},"score":{MAX_EXTENDER_PRIORITY if n == node else 0}}}' for n in names]
        return ("[" + ",".join(parts) + "]").encode()

    def preempt(self, body: Any) -> dict[str, Any]:
        """``ExtenderPreemptionArgs`` -> ``ExtenderPreemptionResult``: a managed pod keeps only its planned node's
        candidates (none without a planned node); any other pod's candidates pass through unchanged."""
        args = PreemptArgs.parse(_mapping(body, "ExtenderPreemptionArgs"))
        decision = self.decide(args.pod)
        victims = args.victims
        if decision.managed:
            victims = {n: v for n, v in victims.items() if n == decision.node}
        return {"nodeNameToMetaVictims": meta_victims(victims)}

    async def bind(self, body: Any) -> dict[str, Any]:
        """``ExtenderBindingArgs`` -> ``ExtenderBindingResult``: binds a pod of the current plan to its planned node
        through ``binder``, a pod Walras does not manage through ``foreign_binder`` (where given); refuses every other
        pod and every other node."""
        args = BindArgs.parse(_mapping(body, "ExtenderBindingArgs"))
        where = f"{args.namespace}/{args.name}"
        if not self.leads():
            return {"error": f"Walras: this replica is a standby and binds nothing; pod {where} is not bound"}
        planned = self.index().pods.get((args.namespace, args.name))
        if planned is None and self.foreign_binder is not None:
            try:  # maybe a pod Walras does not manage: bound as the default binder would, where the node has room
                await self.foreign_binder(args.namespace, args.name, args.uid, args.node)
            except Exception as exc:
                return {"error": f"Walras: binding {where} to {args.node} failed: {exc}"}
            return {"error": ""}
        if planned is None:
            return {"error": f"Walras: pod {where} is not in the current plan; Walras binds only the pods it manages"}
        if planned.node is None:
            return {"error": f"Walras: pod {where} has no node in the current plan"}
        if planned.node != args.node:
            return {"error": f"Walras: pod {where} is planned on {planned.node}, not {args.node}"}
        if self.binder is None:
            return {"error": "Walras: this extender has no binder configured"}
        try:
            await self.binder(args.namespace, args.name, args.uid, args.node)
        except Exception as exc:  # the scheduler needs the reason as text
            return {"error": f"Walras: binding {where} to {args.node} failed: {exc}"}
        return {"error": ""}

    # ------------------------------------------------------------------ one request, bytes in, bytes out

    async def respond(self, verb: str, raw: bytes) -> tuple[int, bytes]:
        """(HTTP status, JSON body) for one request body of ``verb``; a malformed body gets 400 and the reason."""
        try:
            what = "ExtenderBindingArgs" if verb == "bind" else (
                "ExtenderPreemptionArgs" if verb == "preempt" else "ExtenderArgs")
            body = decode(raw, what)
            if verb == "filter":
                return 200, _dumps(self.filter(body))
            if verb == "prioritize":
                return 200, self.prioritize_json(body)
            if verb == "bind":
                return 200, _dumps(await self.bind(body))
            if verb == "preempt":
                return 200, _dumps(self.preempt(body))
            raise BadRequest(f"unknown verb {verb!r}")
        except RequestError as exc:
            return exc.status, _error(verb, exc)

    # ------------------------------------------------------------------ HTTP

    def app(self) -> web.Application:
        """The extender's aiohttp application (verbs, ``/readyz``, ``/healthz``)."""
        app = web.Application(client_max_size=self.limits.max_body_bytes)
        for verb in VERBS:
            app.router.add_post(f"/scheduler/{verb}", self._handler(verb))
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self.readyz)
        return app

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(self, request: web.Request) -> web.Response:
        """200 on the leading replica (or without leader election), 503 on a standby."""
        if self.leads():
            return web.Response(text="ok: leader")
        return web.Response(text="standby: another replica leads", status=503)

    async def read_body(self, request: web.Request) -> bytes:
        """The request body, refused past ``limits.max_body_bytes`` (413) or ``limits.read_timeout`` (408)."""
        limit = self.limits.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise BodyTooLarge(f"the body has {request.content_length} bytes; the limit is {limit}")
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.limits.read_timeout):
                while True:
                    chunk = await request.content.readany()
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > limit:
                        raise BodyTooLarge(f"the body exceeds the limit of {limit} bytes")
                    chunks.append(chunk)
        except TimeoutError as exc:
            raise BodyTimeout(f"the body was not received within {self.limits.read_timeout:g} s") from exc
        return b"".join(chunks)

    def _handler(self, verb: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            started = time.perf_counter()
            try:
                raw = await self.read_body(request)
            except RequestError as exc:
                code, encoded = exc.status, _error(verb, exc)
            else:
                try:
                    code, encoded = await self.respond(verb, raw)
                except Exception:  # a bug of ours, never the client's: logged, answered as JSON
                    logger.exception("extender %s failed on a %d-byte body", verb, len(raw))
                    code, encoded = 500, _dumps({"error": f"Walras extender: internal error in {verb}"})
            response = web.Response(body=encoded, status=code, content_type="application/json")
            if code in (408, 413):
                response.force_close()  # the rest of the body is never read
            if self.metrics is not None:
                self.metrics.extender_request(verb, code, time.perf_counter() - started)
            return response

        return handle


def _mapping(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest(f"{what}: the body must be a JSON object, got {type(body).__name__}")
    return body


def _dumps(result: Any) -> bytes:
    return json.dumps(result, separators=(",", ":")).encode()


def _error(verb: str, exc: Exception) -> bytes:
    return _dumps({"error": f"Walras extender: malformed {verb} request: {exc}"})


def server_tls(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """The extender's server-side TLS context (TLS >= 1.2) for a PEM certificate and key.

    With ``client_ca`` every client must present a certificate signed by that CA (mutual TLS): kube-scheduler does so
    with ``tlsConfig.certFile``/``keyFile`` (or ``certData``/``keyData``) in its extender configuration, which is the
    only client authentication the extender configuration supports (it has no bearer token).
    """
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.minimum_version = ssl.TLSVersion.TLSv1_2
    tls.load_cert_chain(cert, key)
    if client_ca:
        tls.load_verify_locations(cafile=client_ca)
        tls.verify_mode = ssl.CERT_REQUIRED
    return tls


#: Keyword arguments of :class:`aiohttp.web.AppRunner` for the extender: a connection that has not completed a
#: request within ``keepalive_timeout`` seconds (headers trickled byte by byte, or idle) is closed; no lingering
#: read of bodies the handler refused.
RUNNER_OPTIONS: dict[str, Any] = {"access_log": None, "shutdown_timeout": 1.0, "keepalive_timeout": 15.0,
                                  "lingering_time": 0.0}

#: Where the extender listens unless told otherwise: loopback only (see docs/security.md for exposing it).
DEFAULT_HOST = "127.0.0.1"


async def start_site(app: web.Application, host: str = DEFAULT_HOST, port: int = 8888,
                     tls: ssl.SSLContext | None = None,
                     options: dict[str, Any] | None = None) -> tuple[web.AppRunner, int]:
    """Serve ``app`` with :data:`RUNNER_OPTIONS` (updated by ``options``) on ``host:port`` (port 0: any free one);
    (runner, bound port)."""
    runner = web.AppRunner(app, **{**RUNNER_OPTIONS, **(options or {})})
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    server = site._server  # aiohttp exposes the bound port only through the asyncio server
    sockets = getattr(server, "sockets", None) or []
    bound = int(sockets[0].getsockname()[1]) if sockets else port
    return runner, bound
