"""What the lifecycle tests share (no pytest fixtures here): the operator on its own event loop in a background
thread, a scripted planner that hands the operator exactly the pod actions a test names, and object builders.

:class:`OperatorThread` runs :func:`walras.operator.run_operator` (kopf standalone, no Lease) with a
:class:`~walras.operator.Controller` around any planner; the test thread stays synchronous (kubectl, the kubelet
stand-in's blocking methods) while the operator's loop runs beside it, as a real operator process would.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from walras.kube.client import KubeClient, KubeConfig
from walras.metrics import WalrasMetrics
from walras.operator import Controller, IndexSource, OperatorOptions, run_operator
from walras.planner.model import JobPlan, Plan, PodPlan, Snapshot

from tests.test_ha_support import wait_until


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition",
             interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy; AssertionError naming ``what`` after ``timeout``
    (:func:`tests.test_ha_support.wait_until` with this module's defaults)."""
    return wait_until(predicate, timeout, what, interval)


class OperatorThread:
    """The Walras operator (``run_operator`` without a Lease) on an event loop in a daemon thread."""

    def __init__(self, kubeconfig: Path | str, planner: Callable[..., Plan], options: OperatorOptions) -> None:
        self.kube = KubeConfig.load(str(kubeconfig))
        self.planner = planner
        self.options = options
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="walras-operator", daemon=True)
        self.controller: Controller | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    def call(self, make: Callable[[], Any], timeout: float = 30.0) -> Any:
        async def wrapped() -> Any:
            return await make()

        future: Future[Any] = asyncio.run_coroutine_threadsafe(wrapped(), self.loop)
        return future.result(timeout)

    def make_client(self) -> KubeClient:
        """The controller's API client (a subclass may count or alter its requests)."""
        return KubeClient(self.kube)

    def start(self, timeout: float = 60.0) -> OperatorThread:
        self.thread.start()

        async def launch() -> Controller:
            source = IndexSource(self.options.namespaces)
            controller = Controller(self.make_client(), source, self.planner, self.options, WalrasMetrics())
            self._stop = asyncio.Event()
            self._ready = asyncio.Event()
            self._task = asyncio.create_task(run_operator(controller, source, self.kube, peering=None,
                                                          health_port=None, stop_flag=self._stop,
                                                          ready_flag=self._ready))
            return controller

        self.controller = self.call(launch)
        # kopf is ready once its watches run; the first plan follows the first object event (none in an empty
        # cluster, which has nothing to plan)
        wait_for(lambda: self._ready.is_set() or (self._task is not None and self._task.done()), timeout,
                 "the operator's watches")
        if self._task is not None and self._task.done():
            self._task.result()  # raises what ended the operator
        return self

    @property
    def plans(self) -> int:
        return self.controller.plans if self.controller is not None else 0

    def plan(self) -> Plan | None:
        return self.controller.plan if self.controller is not None else None

    def trigger(self) -> None:
        if self.controller is not None:
            self.loop.call_soon_threadsafe(self.controller.trigger, "test")

    def wait_plans(self, count: int = 2, timeout: float = 30.0) -> None:
        """Wait until ``count`` more plans have been made (each one acted upon)."""
        target = self.plans + count
        self.trigger()
        wait_for(lambda: self.plans >= target, timeout, f"{count} more plans")

    def assumed(self) -> set[tuple[str, str]]:
        """The (namespace, name) of the pods the operator's assumed-pods cache holds now."""
        async def read() -> set[tuple[str, str]]:
            assert self.controller is not None
            return {p.key for p in self.controller.assumed.pods()}

        result: set[tuple[str, str]] = self.call(read)
        return result

    def stop(self) -> None:
        if self._stop is not None and self._task is not None:
            stop, task = self._stop, self._task
            self.loop.call_soon_threadsafe(stop.set)

            async def finish() -> None:
                with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                    await asyncio.wait_for(task, 20)

            self.call(finish, 30)
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


class ScriptedPlanner:
    """A planner whose pod actions are set by the test (:attr:`pods`), for the operator's own mechanics: each plan
    returns a copy of the current script, with one :class:`JobPlan` per job named in it (no status body beyond what
    JobPlan writes). Thread-safe: the test thread sets the script, the operator's planning thread reads it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: list[PodPlan] = []
        self.snapshots = 0

    def set(self, *pods: PodPlan) -> None:
        with self._lock:
            self._pods = list(pods)

    def __call__(self, snapshot: Snapshot, previous: Plan | None, **_: Any) -> Plan:
        with self._lock:
            pods = [PodPlan(**p.to_dict()) for p in self._pods]
            self.snapshots += 1
        listed: dict[tuple[str, str], list[PodPlan]] = {}
        for pp in pods:
            listed.setdefault((pp.namespace, pp.job), []).append(pp)
        jobs = {key: JobPlan(key[0], key[1], "Running", pods=tuple(plans)) for key, plans in listed.items()}
        return Plan(jobs=jobs, pods=tuple(pods))


def fungible_job(name: str, namespace: str, pools: Mapping[str, float], count: int, *, grace: int | None = None,
                 stop_seconds: str | None = None, labels: Mapping[str, str] | None = None,
                 **spec: Any) -> dict[str, Any]:
    """A FungibleJob of ``count`` replicas with ``throughput`` per pool; ``grace`` sets the template's
    terminationGracePeriodSeconds, ``stop_seconds`` the stand-in's stop-time annotation (``inf``: a job that
    checkpoints until it is killed at the end of its grace period)."""
    template_spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.invalid/train:1"}]}
    if grace is not None:
        template_spec["terminationGracePeriodSeconds"] = grace
    meta: dict[str, Any] = {"labels": {"app": name, **(labels or {})}}
    if stop_seconds is not None:
        meta["annotations"] = {"kubelet.walras.dev/stop-seconds": stop_seconds}
    return {"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"throughput": dict(pools), "utility": {"type": "linear"}, "demand": 1,
                     "replicas": {"count": count}, "template": {"metadata": meta, "spec": template_spec}, **spec}}


def gpu_node(name: str, label: Mapping[str, str], gpus: int = 2) -> dict[str, Any]:
    """A Node manifest for the kubelet stand-in: ``gpus`` nvidia.com/gpu, 16 cpu, 64Gi."""
    capacity = {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": str(gpus), "pods": "20"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(label)},
            "status": {"capacity": capacity}}


def pool(name: str, selector: Mapping[str, str]) -> dict[str, Any]:
    return {"apiVersion": "walras.dev/v1alpha1", "kind": "ResourcePool", "metadata": {"name": name},
            "spec": {"nodeSelector": dict(selector), "resource": "nvidia.com/gpu", "policy": {"type": "utility"}}}
