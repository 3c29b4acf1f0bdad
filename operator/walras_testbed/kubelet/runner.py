"""The kubelet stand-in on its own event loop in a background thread, with blocking methods (tests, scripts)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from walras_testbed.kubelet.client import ApiClient, ApiConfig
from walras_testbed.kubelet.resources import Resources
from walras_testbed.kubelet.standin import KubeletStandIn

T = TypeVar("T")


class KubeletThread:
    """``KubeletThread(kubeconfig, nodes).start()`` registers the nodes and returns once the pods are listed;
    every method blocks until the stand-in has done it. ``stop()`` ends the thread."""

    def __init__(self, kubeconfig: Path | str, nodes: Iterable[Mapping[str, Any]], **options: Any) -> None:
        self.config = ApiConfig.from_kubeconfig(kubeconfig)
        self.node_docs = list(nodes)
        self.options = options
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kubelet-standin", daemon=True)
        self.kubelet: KubeletStandIn | None = None

    def _run(self, make: Callable[[], Awaitable[T]], timeout: float = 60.0) -> T:
        async def wrapped() -> T:
            return await make()

        future: Future[T] = asyncio.run_coroutine_threadsafe(wrapped(), self.loop)
        return future.result(timeout)

    def start(self) -> KubeletThread:
        self.thread.start()

        async def create() -> KubeletStandIn:
            kubelet = KubeletStandIn(ApiClient(self.config), self.node_docs, **self.options)
            await kubelet.start()
            return kubelet

        self.kubelet = self._run(create)
        return self

    @property
    def standin(self) -> KubeletStandIn:
        assert self.kubelet is not None, "start() first"
        return self.kubelet

    def stop(self, delete_nodes: bool = False) -> None:
        if self.kubelet is not None:
            self._run(lambda: self.standin.stop(delete_nodes))
            self.kubelet = None
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    def complete_pod(self, namespace: str, name: str) -> None:
        self._run(lambda: self.standin.complete_pod(namespace, name))

    def fail_pod(self, namespace: str, name: str, reason: str = "Error", message: str = "") -> None:
        self._run(lambda: self.standin.fail_pod(namespace, name, reason, message))

    def set_node_ready(self, name: str, ready: bool) -> None:
        self._run(lambda: self.standin.set_node_ready(name, ready))

    def stop_heartbeats(self, name: str) -> None:
        self._run(lambda: self.standin.stop_heartbeats(name))

    def lose_node(self, name: str) -> None:
        self._run(lambda: self.standin.lose_node(name))

    def add_node(self, doc: Mapping[str, Any]) -> None:
        self._run(lambda: self.standin.add_node(doc))

    def remove_node(self, name: str) -> None:
        self._run(lambda: self.standin.remove_node(name))

    def held(self, name: str) -> Resources:
        async def read() -> Resources:
            async with self.standin.lock:
                return self.standin.held(name)

        return self._run(read)

    def decisions(self) -> list[tuple[str, str, str, str]]:
        async def read() -> list[tuple[str, str, str, str]]:
            async with self.standin.lock:
                return list(self.standin.decisions)

        return self._run(read)
