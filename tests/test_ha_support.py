"""Support for the HA and fault tests (this module holds no tests): an emulated cluster with the e2e scenario, and
an operator replica as a real process.

``python tests/test_ha_support.py replica ARGS...`` runs one operator replica: ``walras run``'s own pieces
(:func:`walras.cli.run.build`, the extender app, :func:`walras.operator.run_operator`) with the extender wired to the
leader election, which is what ``walras run`` does once it passes ``extender=`` to ``run_operator`` (see the report
of this change), plus short election periods (``--lease-duration``) so that the tests wait seconds, not the
production 15 s. The extender serves on ``--extender-port`` (loopback) with ``/readyz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "e2e" / "manifests"
NAMESPACE = "e2e"
NODES = ("e2e-v100-0", "e2e-v100-1", "e2e-k80-0", "e2e-k80-1")
GPU_STATUS = {"allocatable": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "4", "pods": "110"},
              "capacity": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "4", "pods": "110"},
              "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                              "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                              "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
ORDER = {"CustomResourceDefinition": 0, "Namespace": 1, "Node": 2, "ResourcePool": 4, "FungibleJob": 5}
POD = ("", "v1", "pods")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scenario_documents(jobs: bool = True) -> list[dict[str, Any]]:
    """CRDs, the e2e namespace, four GPU nodes, two pools and (optionally) three FungibleJobs (5 pods)."""
    files = [*sorted((ROOT / "crds").glob("*.yaml")), MANIFESTS / "namespace.yaml", MANIFESTS / "nodes.yaml",
             MANIFESTS / "pools.yaml", *([MANIFESTS / "jobs.yaml"] if jobs else [])]
    docs = [d for f in files for d in yaml.safe_load_all(f.read_text()) if isinstance(d, dict) and d.get("kind")]
    docs.sort(key=lambda d: ORDER.get(d["kind"], 9))
    return docs


def load_scenario(store: Any, jobs: bool = True) -> None:
    """Apply :func:`scenario_documents` to an emulator store and give the nodes GPU capacity and Ready."""
    store.apply_manifests(scenario_documents(jobs))
    nodes = store.types[("", "v1", "nodes")]
    for node in NODES:
        store.patch(nodes, "", node, {"status": GPU_STATUS}, "application/merge-patch+json", subresource="status")


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class Replica:
    """One operator replica process (this file's ``replica`` entry point)."""

    def __init__(self, kubeconfig: Path, workdir: Path, identity: str, mode: str = "extender",
                 lease_duration: float = 3.0, extender_port: int | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.identity = identity
        self.mode = mode
        self.lease_duration = lease_duration
        self.extender_port = extender_port or free_port()
        self.log = workdir / f"replica-{identity}-{time.monotonic_ns()}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Replica:
        self.log = self.log.with_name(f"replica-{self.identity}-{time.monotonic_ns()}.log")
        cmd = [sys.executable, str(Path(__file__).resolve()), "replica", "--identity", self.identity,
               "--lease-duration", str(self.lease_duration), "run", "--mode", self.mode, "--kubeconfig",
               str(self.kubeconfig), "--extender-port", str(self.extender_port), "--debounce", "0.1",
               "--plan-period", "2", "--peering", "walras-test"]
        env = {**os.environ, "WALRAS_NAMESPACE": "default", "WALRAS_LOG_LEVEL": "INFO"}
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        return self

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.extender_port}{path}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no cleanup, no Lease release, as a crashed or evicted operator."""
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


# ---------------------------------------------------------------------------- the replica process


def _replica(argv: list[str]) -> int:
    import argparse

    from walras.cli.run import add_parser, build, setup_logging
    from walras.extender import start_site
    from walras.kube.client import KubeClient, KubeConfig
    from walras.operator import run_operator
    from walras.operator.leader import LeaseElector

    outer = argparse.ArgumentParser()
    outer.add_argument("--identity", required=True)
    outer.add_argument("--lease-duration", type=float, default=3.0)
    sub = outer.add_subparsers(dest="command")
    add_parser(sub)
    args = outer.parse_args(argv)
    setup_logging()

    async def serve() -> None:
        kube = KubeConfig.load(args.kubeconfig)
        controller, source, extender, _ = build(args, kube)
        controller.options.identity = args.identity
        duration = args.lease_duration
        elector = LeaseElector(KubeClient(kube), os.environ.get("WALRAS_NAMESPACE", "default"), args.peering,
                               args.identity, lease_duration=duration, renew_deadline=duration * 2 / 3,
                               renew_period=duration / 6, retry_period=duration / 6)
        runner, _port = await start_site(extender.app(), "127.0.0.1", args.extender_port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        try:
            await run_operator(controller, source, kube, peering=args.peering, health_port=None, stop_flag=stop,
                               extender=extender, elector=elector)
        finally:
            await runner.cleanup()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["replica"]:
        sys.exit("usage: test_ha_support.py replica --identity ID [--lease-duration S] run [walras run options]")
    sys.exit(_replica(sys.argv[2:]))
