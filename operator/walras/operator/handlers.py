"""kopf wiring: indexes over nodes, pods and the three Walras kinds, event handlers that trigger a re-plan, a timer
for the plan period, login from the kubeconfig, and the operator entry point with peering.

kopf fills the indexes from its list + watch streams and starts the event handlers only once every index holds the
initial listing, so the first plan sees the whole cluster. With peering (``--peering NAME``) kopf pauses the watch
streams and timers of every operator that sees a peer of higher priority; since the plan loop only runs on triggers
from those streams and timers, only the highest-priority replica ever plans and writes (leader election). Replicas
get distinct priorities (``--priority``, default: random) so that exactly one leads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from walras.operator.controller import Controller
from walras.operator.kube import KubeConfig
from walras.operator.translate import snapshot_from
from walras.planner.model import GROUP, VERSION, Snapshot

logger = logging.getLogger("walras.operator")

INDEX_NAMES = ("walras_nodes", "walras_pods", "walras_pools", "walras_jobs", "walras_profiles")


class IndexSource:
    """Reads a :class:`Snapshot` out of the kopf indexes (captured from any handler's keyword arguments)."""

    def __init__(self, namespaces: tuple[str, ...] = ()) -> None:
        self.indices: dict[str, Any] = {}
        self.namespaces = namespaces

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
                             self._values("walras_jobs"), self._values("walras_profiles"), self.namespaces)


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    return {key: body[key] for key in body}


def build_registry(controller: Controller, source: IndexSource, kube: KubeConfig) -> kopf.OperatorRegistry:
    """A kopf registry with every Walras handler bound to ``controller``."""
    registry = kopf.OperatorRegistry()
    kinds = {
        "walras_nodes": (("v1", "nodes"), "Node"),
        "walras_pods": (("v1", "pods"), "Pod"),
        "walras_pools": ((GROUP, VERSION, "resourcepools"), "ResourcePool"),
        "walras_jobs": ((GROUP, VERSION, "fungiblejobs"), "FungibleJob"),
        "walras_profiles": ((GROUP, VERSION, "colocationprofiles"), "ColocationProfile"),
    }

    def make_index(index_name: str, selector: tuple[str, ...]) -> None:
        def index(namespace: str | None, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
            return {(namespace or "", name): _plain(body)}

        index.__name__ = index_name
        kopf.index(*selector, id=index_name, registry=registry)(index)

    def make_event(kind: str, selector: tuple[str, ...]) -> None:
        async def on_event(type: str | None, body: kopf.Body, **kwargs: Any) -> None:
            source.capture(kwargs)
            controller.observe(kind, type, _plain(body))

        on_event.__name__ = f"walras_{kind.lower()}_event"
        kopf.on.event(*selector, id=on_event.__name__, registry=registry)(on_event)

    for index_name, (selector, kind) in kinds.items():
        make_index(index_name, selector)
        make_event(kind, selector)

    @kopf.timer(GROUP, VERSION, "resourcepools", interval=controller.options.plan_period, id="walras_period",
                registry=registry)
    async def period(**kwargs: Any) -> None:
        source.capture(kwargs)
        controller.trigger("plan period")

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(
            server=kube.server, token=kube.token, ca_path=kube.ca_path, insecure=kube.insecure,
            certificate_path=kube.cert_path, private_key_path=kube.key_path, default_namespace=kube.namespace)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **kwargs: Any) -> None:
        settings.posting.level = logging.WARNING
        settings.persistence.finalizer = f"{GROUP}/kopf-finalizer"
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.networking.request_timeout = 60
        source.capture(kwargs)
        controller.start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await controller.stop()
        await controller.client.close()

    return registry


async def ensure_peering(controller: Controller, name: str) -> None:
    """Create the cluster-wide kopf peering object ``name`` if it does not exist (kopf does not create it)."""
    path = "/apis/kopf.dev/v1/clusterkopfpeerings"
    body = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}}
    result = await controller.client.request("POST", path, body, ok_conflict=True)
    if result.get("code") == 409:
        logger.debug("peering object %s exists", name)


async def run_operator(controller: Controller, source: IndexSource, kube: KubeConfig, *, peering: str | None,
                       priority: int, health_port: int | None, stop_flag: asyncio.Event | None = None,
                       ready_flag: asyncio.Event | None = None) -> None:
    """Run kopf (cluster-wide) with the Walras handlers until ``stop_flag`` is set."""
    registry = build_registry(controller, source, kube)
    if peering:
        await ensure_peering(controller, peering)
    liveness = f"http://0.0.0.0:{health_port}/healthz" if health_port else None
    await kopf.operator(
        registry=registry,
        clusterwide=True,
        standalone=peering is None,
        peering_name=peering,
        priority=priority,
        liveness_endpoint=liveness,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
        identity=controller.options.identity,  # type: ignore[arg-type]  # kopf's Identity is a NewType of str
    )
