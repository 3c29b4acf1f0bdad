"""Fixtures of the end-to-end tests: a cluster (the emulated API, or a real one), kubectl, the `walras run` process.

* Without ``WALRAS_E2E_KUBECONFIG`` each test module gets a fresh emulated Kubernetes API
  (``python -m walras.emulator``, loopback, a subprocess; NOT a real cluster).
* With ``WALRAS_E2E_KUBECONFIG=/path/to/kubeconfig`` the same scenarios run against that cluster (kind, k3d, ...);
  the fault-injection scenarios need the emulator's ``/_emulator`` control paths and are skipped there.
* kubectl comes from ``.tools/bin`` (``scripts/install_k8s_tools.sh``) or ``PATH``. When ``CI=true`` and kubectl is
  missing, the tests FAIL instead of skipping.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.realtools import require

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = Path(__file__).resolve().parent / "manifests"
REAL_KUBECONFIG = os.environ.get("WALRAS_E2E_KUBECONFIG")
GPU_STATUS = {"allocatable": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "4", "pods": "110"},
              "capacity": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "4", "pods": "110"},
              "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                              "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                              "lastTransitionTime": "2026-01-01T00:00:00Z"}]}

#: How ``walras run`` is started: the registered sub-command when present, else the module directly.
LAUNCH = (
    "import argparse, sys\n"
    "from walras.cli import run as r\n"
    "p = argparse.ArgumentParser(prog='walras')\n"
    "s = p.add_subparsers(dest='command', required=True)\n"
    "r.add_parser(s)\n"
    "sys.exit(r.run(p.parse_args(sys.argv[1:])))\n"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition",
               interval: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except (AssertionError, KeyError, IndexError, subprocess.CalledProcessError, requests.RequestException):
            last = None
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def check(value: Any, predicate: Callable[[Any], bool]) -> Any:
    """``value`` if ``predicate(value)`` holds, else None (for :func:`wait_until`)."""
    return value if predicate(value) else None


@dataclass
class Cluster:
    """A cluster reached through kubectl: the emulated API (``url`` set) or a real one."""

    kubeconfig: Path
    kubectl: str
    workdir: Path
    url: str | None = None
    process: subprocess.Popen[str] | None = None

    @property
    def emulated(self) -> bool:
        return self.url is not None

    def kc(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "KUBECACHEDIR": str(self.workdir / "kcache")}
        proc = subprocess.run([self.kubectl, *args], input=stdin, capture_output=True, text=True, env=env,
                              timeout=60)
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, ["kubectl", *args], proc.stdout, proc.stderr)
        return proc

    def get(self, *args: str) -> Any:
        return json.loads(self.kc("get", *args, "-o", "json").stdout)

    def apply(self, path: Path | str) -> None:
        self.kc("apply", "--validate=false", "-f", str(path))

    def apply_text(self, text: str) -> None:
        self.kc("apply", "--validate=false", "-f", "-", stdin=text)

    def set_node_status(self, name: str, status: dict[str, Any]) -> None:
        self.kc("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}))

    def pods(self, namespace: str, selector: str = "walras.dev/managed=true") -> list[dict[str, Any]]:
        return list(self.get("pods", "-n", namespace, "-l", selector)["items"])

    def close(self) -> None:
        """Stop the emulated API (nothing to do for a real cluster)."""
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)

    # emulator-only controls
    def faults(self, *faults: dict[str, Any]) -> None:
        assert self.url is not None
        requests.post(f"{self.url}/_emulator/faults", json=list(faults), timeout=5).raise_for_status()

    def pending_faults(self) -> list[dict[str, Any]]:
        assert self.url is not None
        return list(requests.get(f"{self.url}/_emulator/faults", timeout=5).json()["faults"])

    def bindings(self) -> list[dict[str, Any]]:
        assert self.url is not None
        return list(requests.get(f"{self.url}/_emulator/bindings", timeout=5).json()["bindings"])

    def in_place_resize(self, enabled: bool) -> None:
        """Serve ``pods/resize`` (a Kubernetes >= 1.33 cluster) or not (an older one)."""
        assert self.url is not None
        requests.post(f"{self.url}/_emulator/resize", json={"enabled": enabled}, timeout=5).raise_for_status()


@pytest.fixture(scope="session")
def kubectl_bin() -> str:
    """The real kubectl (``.tools/bin``, then ``PATH``): fails under ``CI=true`` when missing, skips elsewhere."""
    return require("kubectl")


def _start_emulator(workdir: Path) -> tuple[subprocess.Popen[str], str]:
    kubeconfig = workdir / "kubeconfig"
    proc = subprocess.Popen([sys.executable, "-m", "walras.emulator", "--port", "0", "--kubeconfig", str(kubeconfig)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http://"):
        proc.kill()
        raise RuntimeError(f"the emulator did not start: {url}")
    return proc, url


def connect(workdir: Path, kubectl_bin: str) -> Cluster:
    """A test module's cluster: the real one of ``WALRAS_E2E_KUBECONFIG``, else a fresh emulated API (stop it with
    :meth:`Cluster.close`)."""
    if REAL_KUBECONFIG:
        return Cluster(Path(REAL_KUBECONFIG), kubectl_bin, workdir)
    proc, url = _start_emulator(workdir)
    return Cluster(workdir / "kubeconfig", kubectl_bin, workdir, url=url, process=proc)


@pytest.fixture(scope="module")
def cluster(kubectl_bin: str) -> Iterator[Cluster]:
    """A fresh emulated API per module (or the real cluster of ``WALRAS_E2E_KUBECONFIG``), with the CRDs, the e2e
    namespace, four GPU nodes and two pools applied."""
    with tempfile.TemporaryDirectory(prefix="walras-e2e-") as tmp:
        c = connect(Path(tmp), kubectl_bin)
        try:
            c.apply(ROOT / "crds")
            c.apply(MANIFESTS / "namespace.yaml")
            c.apply(MANIFESTS / "nodes.yaml")
            for node in ("e2e-v100-0", "e2e-v100-1", "e2e-k80-0", "e2e-k80-1"):
                c.set_node_status(node, GPU_STATUS)
            c.apply(MANIFESTS / "pools.yaml")
            yield c
        finally:
            if REAL_KUBECONFIG:
                c.kc("delete", "namespace", "e2e", "--wait=false", check=False)
                for pool in ("e2e-v100", "e2e-k80"):  # the operator's kopf finalizer: nobody left to remove it
                    c.kc("patch", "resourcepool", pool, "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                         check=False)
                c.kc("delete", "-f", str(MANIFESTS / "pools.yaml"), "--wait=false", check=False)
                c.kc("delete", "nodes", "-l", "walras.dev/e2e=true", "--wait=false", check=False)
            c.close()


@dataclass
class Operator:
    """A ``walras run`` subprocess against the cluster."""

    cluster: Cluster
    mode: str = "direct"
    extra: tuple[str, ...] = ()
    metrics_port: int = field(default_factory=free_port)
    extender_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    process: subprocess.Popen[str] | None = None
    log: Path | None = None

    def command(self) -> list[str]:
        from walras.cli import COMMANDS

        args = ["run", "--mode", self.mode, "--metrics-port", str(self.metrics_port), "--extender-port",
                str(self.extender_port), "--health-port", str(self.health_port), "--debounce", "0.2",
                "--plan-period", "3", "--kubeconfig", str(self.cluster.kubeconfig), *self.extra]
        if "run" in COMMANDS:
            return [sys.executable, "-m", "walras", *args]
        return [sys.executable, "-c", LAUNCH, *args]

    def start(self) -> Operator:
        self.log = self.cluster.workdir / f"operator-{self.mode}-{time.monotonic_ns()}.log"
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig), "WALRAS_LOG_LEVEL": "INFO"}
        self.process = subprocess.Popen(self.command(), stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                        text=True, env=env, cwd=ROOT)
        wait_until(self.ready, 60, "walras run to serve /metrics")
        return self

    def ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"walras run exited with {self.process.returncode}:\n{self.output()}")
        return requests.get(self.url("metrics", "/metrics"), timeout=2).status_code == 200

    def url(self, which: str, path: str) -> str:
        port = {"metrics": self.metrics_port, "extender": self.extender_port, "health": self.health_port}[which]
        return f"http://127.0.0.1:{port}{path}"

    def metrics(self) -> str:
        return requests.get(self.url("metrics", "/metrics"), timeout=5).text

    def output(self) -> str:
        return self.log.read_text() if self.log is not None and self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no cleanup, as a crashed or evicted operator."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
