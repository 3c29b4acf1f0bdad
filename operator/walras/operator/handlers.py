"""kopf wiring: indexes over nodes, pods and the three Walras kinds, event handlers that trigger a re-plan, the plan
period, login from the kubeconfig, and the operator entry point with leader election.

kopf fills the indexes from its list + watch streams and starts the event handlers only once every index holds the
initial listing, so the first plan sees the whole cluster. kopf runs *standalone* in every replica (each keeps its
indexes warm); which replica plans, writes and binds is decided by a ``coordination.k8s.io`` Lease
(:class:`walras.operator.leader.LeaseElector`, ``--peering NAME`` names the Lease): the controller runs only while
its replica leads, and the extender of a standby answers "no opinion" and is not ready (``/readyz`` 503), so a
Service sends kube-scheduler to the leader only.

Why not kopf's own peering: its keep-alive PATCH runs as one of kopf's root tasks, so a single 409/4xx answer to it
ended the whole operator process; and a replica restarted under a new random priority paused until the dead
replica's peering entry expired (60 s). The Lease loop retries every API error and lets a restarted replica with the
same identity lead at once.

API outages of any length (issue 30 item 4): kopf's own requests retry without a limit, with a capped backoff
(:class:`CappedBackoff` as ``settings.networking.error_backoffs``: kopf counts attempts only of a sized sequence), so a
listing or watch that fails for minutes never escalates; and :func:`run_operator` supervises kopf: should kopf's
orchestration still end with an error, it is restarted after a capped backoff (its indexes dropped first, so nothing
is planned from what they held), instead of ending ``walras run``. :class:`ApiHealth` probes the API server every few
seconds (``GET /version``; a 5xx answer from a load balancer counts as down) and says so on ``/healthz`` of the metrics
port (``walras.cli.run.metrics_app``): 200 ``ok``, else 503 ``degraded: ...``. kopf's own liveness endpoint (the
chart's livenessProbe) stays up through an outage: restarting every replica while the API is away helps nothing.

No kopf handler here needs a finalizer: the plan period is a plain asyncio task, not a kopf timer (a kopf timer puts
a finalizer on every ResourcePool, and deleting a pool then hangs for ever once the operator is gone). Pools created
by an older Walras still carry that finalizer (``walras.dev/kopf-finalizer``); the leader removes it when it sees
them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import kopf

from walras.kube.client import KubeClient, KubeConfig
from walras.kube.errors import ApiError, Conflict
from walras.kube.snapshot import snapshot_from
from walras.operator.controller import Controller
from walras.operator.leader import LeaseElector
from walras.planner.model import GROUP, VERSION, Snapshot

logger = logging.getLogger("walras.operator")

INDEX_NAMES = ("walras_nodes", "walras_pods", "walras_pools", "walras_jobs", "walras_profiles", "walras_budgets",
               "walras_namespaces", "walras_priorityclasses", "walras_resourcequotas")

#: The finalizer an older Walras put on ResourcePools through its kopf timer; removed by the leader on sight.
LEGACY_FINALIZER = f"{GROUP}/kopf-finalizer"

#: Where a pod finds its own namespace (the Lease lives there).
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class CappedBackoff:
    """An endless, re-iterable sequence of delays in seconds: ``first``, doubling, then ``cap`` for ever. As kopf's
    ``settings.networking.error_backoffs`` it makes every kopf request retry without a limit (kopf gives up after
    the last delay of a sized sequence only), each retry at most ``cap`` seconds after the last."""

    def __init__(self, first: float = 1.0, cap: float = 15.0) -> None:
        if not 0 < first <= cap:
            raise ValueError(f"need 0 < first <= cap, got {first}, {cap}")
        self.first, self.cap = first, cap

    def __iter__(self) -> Iterator[float]:
        delay = self.first
        while True:
            yield delay
            delay = min(self.cap, 2 * delay)


@dataclass
class ApiHealth:
    """Whether the API server answered the last probe (:func:`watch_api`), since when, and how often kopf's
    orchestration was restarted (:func:`run_operator`). ``clock`` is monotonic seconds."""

    reachable: bool = True
    since: float = field(default_factory=time.monotonic)
    error: str = ""
    restarts: int = 0
    clock: Callable[[], float] = time.monotonic

    def observe(self, error: str | None) -> None:
        """Record a probe's outcome: None when the API server answered, else what went wrong."""
        ok = error is None
        if ok != self.reachable:
            self.reachable, self.since = ok, self.clock()
            if ok:
                logger.info("Kubernetes API reachable again")
            else:
                logger.warning("Kubernetes API unreachable: %s", error)
        self.error = error or ""

    def report(self) -> tuple[bool, str]:
        """``(healthy, text)`` for ``/healthz``."""
        restarts = f"; kopf restarted {self.restarts} time(s)" if self.restarts else ""
        if self.reachable:
            return True, f"ok{restarts}"
        return False, (f"degraded: the Kubernetes API has not answered for {self.clock() - self.since:.0f} s "
                       f"({self.error}); retrying{restarts}")


async def probe_api(client: KubeClient) -> str | None:
    """One ``GET /version`` and, when it answers, ``GET /livez`` and ``/readyz`` (:meth:`KubeClient.readiness`),
    without retries: None when the API server answers them, else why not (no answer, or a 5xx or 429: an API server
    that is down behind a load balancer answers 503; a kube-apiserver whose etcd is down still answers ``/version``
    but ``/livez`` says 500 ``[-]etcd failed``)."""
    try:
        await client.request("GET", "/version", attempts=1)
    except ApiError as exc:
        if exc.code >= 500 or exc.code == 429:
            return f"{exc.code} {exc.reason}: {exc.message}"[:300]
    return await client.readiness()


async def watch_api(client: KubeClient, health: ApiHealth, period: float = 5.0) -> None:
    """Probe the API server every ``period`` seconds into ``health`` (for ever)."""
    while True:
        health.observe(await probe_api(client))
        await asyncio.sleep(period)


class IndexSource:
    """Reads a :class:`Snapshot` out of the kopf indexes (captured from any handler's keyword arguments)."""

    def __init__(self, namespaces: tuple[str, ...] = ()) -> None:
        self.indices: dict[str, Any] = {}
        self.namespaces = namespaces

    @property
    def ready(self) -> bool:
        """Whether kopf has handed over its indexes (it does so only after every initial listing)."""
        return bool(self.indices)

    def capture(self, kwargs: Mapping[str, Any]) -> None:
        for name in INDEX_NAMES:
            if name in kwargs:
                self.indices[name] = kwargs[name]

    def _values(self, name: str) -> list[dict[str, Any]]:
        index = self.indices.get(name)
        if index is None:
            return []
        return [value for store in index.values() for value in store]

    def __call__(self) -> Snapshot:
        return snapshot_from(self._values("walras_nodes"), self._values("walras_pods"), self._values("walras_pools"),
                             self._values("walras_jobs"), self._values("walras_profiles"), self.namespaces,
                             budgets=self._values("walras_budgets"),  # docs/budgets.md
                             namespace_objects=self._values("walras_namespaces"),
                             priorityclasses=self._values("walras_priorityclasses"),  # docs/preemption.md
                             resourcequotas=self._values("walras_resourcequotas"))  # docs/refusals.md


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    return {key: body[key] for key in body}


class LeaderAware(Protocol):
    """What the operator sets on the extender: a callable that says whether this replica leads."""

    leader: Any


def build_registry(controller: Controller, source: IndexSource, kube: KubeConfig,
                   leads: Any = None, stopping: Callable[[], bool] | None = None) -> kopf.OperatorRegistry:
    """A kopf registry with every Walras handler bound to ``controller``.

    ``leads`` (a callable, or None when this replica always acts) gates the writes a handler itself makes (removing
    the legacy finalizer); the controller is started and stopped by the caller. kopf's cleanup stops the controller
    only when ``stopping()`` says the operator is stopping (None: always), not when kopf ends to be restarted.
    """
    registry = kopf.OperatorRegistry()
    kinds = {
        "walras_nodes": (("v1", "nodes"), "Node"),
        "walras_pods": (("v1", "pods"), "Pod"),
        "walras_pools": ((GROUP, VERSION, "resourcepools"), "ResourcePool"),
        "walras_jobs": ((GROUP, VERSION, "fungiblejobs"), "FungibleJob"),
        "walras_profiles": ((GROUP, VERSION, "colocationprofiles"), "ColocationProfile"),
        "walras_budgets": ((GROUP, VERSION, "budgets"), "Budget"),  # docs/budgets.md
        "walras_namespaces": (("v1", "namespaces"), "Namespace"),  # labels for the Budgets' selectors
        "walras_priorityclasses": (("scheduling.k8s.io", "v1", "priorityclasses"), "PriorityClass"),  # preemption.md
        "walras_resourcequotas": (("v1", "resourcequotas"), "ResourceQuota"),  # namespaces' limits (docs/refusals.md)
    }

    def make_index(index_name: str, selector: tuple[str, ...]) -> None:
        def index(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
            return {(namespace or "", name): _plain(body)}

        index.__name__ = index_name
        kopf.index(*selector, id=index_name, registry=registry)(index)

    def make_event(kind: str, selector: tuple[str, ...]) -> None:
        async def on_event(type: str | None, body: kopf.Body, **kwargs: Any) -> None:
            source.capture(kwargs)
            obj = _plain(body)
            controller.observe(kind, type, obj)
            if kind == "ResourcePool" and type != "DELETED" and (leads is None or leads()):
                await remove_legacy_finalizer(controller.client, obj)

        on_event.__name__ = f"walras_{kind.lower()}_event"
        kopf.on.event(*selector, id=on_event.__name__, registry=registry)(on_event)

    for index_name, (selector, kind) in kinds.items():
        make_index(index_name, selector)
        make_event(kind, selector)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(
            server=kube.server, token=kube.token, ca_path=kube.ca_path, insecure=kube.insecure,
            certificate_path=kube.cert_path, private_key_path=kube.key_path, default_namespace=kube.namespace)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.WARNING
        settings.persistence.finalizer = LEGACY_FINALIZER
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.networking.request_timeout = 60
        settings.networking.connect_timeout = 10
        settings.networking.error_backoffs = CappedBackoff()  # retry for ever, at most 15 s apart (issue 30 item 4)
        settings.watching.reconnect_backoff = 1.0  # a watch that cannot reconnect retries each second, not each 0.1 s
        # no source.capture here: the indexes handed to startup handlers are still empty; the event handlers capture
        # them once kopf has filled every index (a plan from the empty ones would plan an empty cluster)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        if stopping is None or stopping():
            await controller.stop()

    return registry


async def remove_legacy_finalizer(client: KubeClient, pool: Mapping[str, Any]) -> bool:
    """Remove :data:`LEGACY_FINALIZER` from a ResourcePool that carries it (a JSON patch that tests the list first,
    so a concurrent change of the finalizers is never overwritten); True if it was removed."""
    meta = pool.get("metadata") or {}
    finalizers = list(meta.get("finalizers") or [])
    if LEGACY_FINALIZER not in finalizers:
        return False
    i = finalizers.index(LEGACY_FINALIZER)
    patch = [{"op": "test", "path": f"/metadata/finalizers/{i}", "value": LEGACY_FINALIZER},
             {"op": "remove", "path": f"/metadata/finalizers/{i}"}]
    try:
        await client.request("PATCH", f"/apis/{GROUP}/{VERSION}/resourcepools/{meta.get('name')}", patch,
                             content_type="application/json-patch+json", attempts=3)
    except ApiError as exc:  # 404 gone, 409/422 changed meanwhile: the next event tries again
        logger.info("could not remove %s from ResourcePool %s: %s", LEGACY_FINALIZER, meta.get("name"), exc)
        return False
    logger.info("removed the legacy finalizer %s from ResourcePool %s", LEGACY_FINALIZER, meta.get("name"))
    return True


async def ensure_peering(controller: Controller, name: str) -> None:
    """Create the cluster-wide kopf peering object ``name`` if it does not exist.

    Only for deployments that still run kopf peering next to an older Walras; :func:`run_operator` elects its leader
    through a Lease and never calls it.
    """
    path = "/apis/kopf.dev/v1/clusterkopfpeerings"
    body = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}}
    try:
        await controller.client.request("POST", path, body)
    except Conflict:
        logger.debug("peering object %s exists", name)


def lease_namespace(kube: KubeConfig) -> str:
    """Where the leader Lease lives: ``$WALRAS_NAMESPACE`` or ``$POD_NAMESPACE``, else the pod's own namespace (in a
    cluster), else the kubeconfig context's namespace."""
    for var in ("WALRAS_NAMESPACE", "POD_NAMESPACE"):
        if os.environ.get(var):
            return os.environ[var]
    with contextlib.suppress(OSError):
        text = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
        if text:
            return text
    return kube.namespace or "default"


async def plan_period(controller: Controller, source: IndexSource, elector: LeaseElector | None) -> None:
    """Trigger a re-plan every ``plan_period`` seconds on the replica that leads (the kopf timer's job, without the
    finalizer a kopf timer needs)."""
    while True:
        await asyncio.sleep(controller.options.plan_period)
        if source.ready and (elector is None or elector.is_leader()):
            controller.trigger("plan period")


async def run_operator(controller: Controller, source: IndexSource, kube: KubeConfig, *, peering: str | None,
                       priority: int = 0, health_port: int | None, stop_flag: asyncio.Event | None = None,
                       ready_flag: asyncio.Event | None = None, extender: LeaderAware | None = None,
                       elector: LeaseElector | None = None, health: ApiHealth | None = None,
                       restart_backoff: CappedBackoff | None = None) -> None:
    """Run kopf (cluster-wide, standalone) with the Walras handlers until ``stop_flag`` is set.

    With ``peering`` (the Lease name) the controller runs only while this replica holds the Lease in
    :func:`lease_namespace`; ``extender.leader`` is set to the elector's check so a standby's extender has no opinion
    and is not ready. ``elector`` replaces the default :class:`LeaseElector` (tests use shorter periods).
    ``priority`` is not used by Lease election (the first live candidate wins); it is accepted for callers written
    for kopf peering. Without ``peering`` this replica always acts.

    kopf is supervised: should ``kopf.operator`` end with an error while ``stop_flag`` is not set, its indexes are
    dropped, ``health.restarts`` counts it and it is started again after the next delay of ``restart_backoff``
    (:class:`CappedBackoff`, default 1 s doubling to 30 s); the controller, the Lease and the HTTP servers stay up.
    ``health`` (an :class:`ApiHealth`) is probed every 5 s meanwhile.
    """
    del priority
    if peering and elector is None:
        elector = LeaseElector(KubeClient(kube), lease_namespace(kube), peering, controller.options.identity)
    if elector is not None:
        elector.on_started = _starter(controller, source)
        elector.on_stopped = controller.stop
        if extender is not None:
            extender.leader = elector.is_leader
    def stopping() -> bool:
        return stop_flag is None or stop_flag.is_set()

    registry = build_registry(controller, source, kube, None if elector is None else elector.is_leader, stopping)
    tasks = [asyncio.create_task(plan_period(controller, source, elector), name="walras-plan-period")]
    if health is not None:
        tasks.append(asyncio.create_task(watch_api(controller.client, health), name="walras-api-health"))
    if elector is None:
        controller.start()
    else:
        election = asyncio.create_task(elector.run(), name="walras-leader-election")
        tasks.append(election)
        if stop_flag is not None:
            tasks.append(asyncio.create_task(_step_down_on_stop(stop_flag, election), name="walras-step-down"))
    liveness = f"http://0.0.0.0:{health_port}/healthz" if health_port else None
    delays = iter(restart_backoff or CappedBackoff(1.0, 30.0))
    try:
        while True:
            try:
                await kopf.operator(
                    registry=registry,
                    clusterwide=True,
                    standalone=True,
                    liveness_endpoint=liveness,
                    stop_flag=stop_flag,
                    ready_flag=ready_flag,
                    identity=controller.options.identity,  # type: ignore[arg-type]  # kopf's Identity: NewType of str
                )
                break  # a stop (the flag, or a signal kopf handled)
            except Exception as exc:  # kopf's orchestration failed: restart it, never end the process for it
                if stop_flag is None or stop_flag.is_set():
                    raise
                delay = next(delays)
                if health is not None:
                    health.restarts += 1
                logger.error("kopf's orchestration ended (%s: %s); restarting it in %.0f s", type(exc).__name__,
                             " ".join(str(exc).split())[:300], delay)
                source.indices.clear()  # nothing is planned from the old indexes; the new ones come with events
                await _sleep_unless(stop_flag, delay)
                if stop_flag.is_set():
                    break
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await controller.stop()
        if elector is not None:
            await elector.client.close()
        await controller.client.close()


async def _sleep_unless(flag: asyncio.Event, delay: float) -> None:
    """Sleep ``delay`` seconds, or less when ``flag`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(flag.wait(), delay)


async def _step_down_on_stop(stop_flag: asyncio.Event, election: asyncio.Task[None]) -> None:
    """On shutdown, stop acting and release the Lease at once (the election loop's own ``finally``), so a standby
    takes over while kopf is still closing its watches."""
    await stop_flag.wait()
    election.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await election


def _starter(controller: Controller, source: IndexSource) -> Any:
    async def started() -> None:
        controller.start()
        if source.ready:
            controller.trigger("became leader")

    return started
