"""Fixtures of the end-to-end tests: a cluster, kubectl, the `walras run` process.

Which cluster a test module gets (a route table; each route is exercised where it applies):

=====================================================  =====================================================
where                                                  cluster
=====================================================  =====================================================
``WALRAS_E2E_KUBECONFIG`` set                          that cluster (kind, k3d, ...), nodes as API objects
control-plane binaries found (``KUBEBUILDER_ASSETS``   the session's **real control plane** (etcd,
or ``.tools/k8s/bin``; ``make test`` unpacks them)     kube-apiserver, kube-controller-manager; see
                                                       ``tests/controlplane.py``), the module's nodes played
                                                       by the kubelet stand-in (:mod:`walras_testbed.kubelet`), the
                                                       operator running as the chart's ServiceAccount with the
                                                       chart's RBAC (``helm template helm/walras``)
binaries missing, ``CI=true``                          the run FAILS (CI must test on the real control plane)
binaries missing elsewhere                             a fresh **emulated** API per module
                                                       (``python -m walras_testbed.emulator``; NOT a real cluster)
=====================================================  =====================================================

On the real control plane the modules share one API server: each module's cluster fixture removes what it created
(jobs, pools, profiles, pods, Events, nodes) before the next module starts. Scenarios that need the emulator's
``/_emulator`` control paths (injected faults, the binding log, switching ``pods/resize`` off) skip elsewhere.
kubectl comes from ``.tools/bin`` (``scripts/install_k8s_tools.sh``) or ``PATH``; under ``CI=true`` a missing
kubectl FAILS the run instead of skipping.
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
import yaml

# the fixtures `control_plane` and `namespace`, shared with tests/ (registered under the names given in
# tests/conftest.py, whatever they are imported as here)
from tests.conftest import control_plane as control_plane
from tests.conftest import namespace as shared_namespace_fixture  # noqa: F401
from tests.controlplane import ControlPlane, KubectlError, assets_folder, install_chart_identity, missing_message
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
    """A cluster reached through kubectl: the emulated API (``url`` set), the session's real control plane
    (``control_plane`` set; nodes played by ``kubelet``) or an external one."""

    kubeconfig: Path
    kubectl: str
    workdir: Path
    url: str | None = None
    process: subprocess.Popen[str] | None = None
    control_plane: ControlPlane | None = None
    kubelet: Any = None  # walras_testbed.kubelet.KubeletThread on the real control plane
    operator_kubeconfig: Path | None = None  # the chart's ServiceAccount (real control plane), else ``kubeconfig``
    chart: list[dict[str, Any]] = field(default_factory=list)  # the rendered chart (real control plane)

    @property
    def emulated(self) -> bool:
        return self.url is not None

    @property
    def real(self) -> bool:
        """The real control plane of this test run (kubelet stand-in, chart identity)."""
        return self.control_plane is not None

    def add_nodes(self, nodes: list[dict[str, Any]]) -> None:
        """Create Nodes (manifests with ``status``): through the kubelet stand-in on the real control plane, else as
        API objects whose status is patched in."""
        if self.real:
            if self.kubelet is None:
                from walras_testbed.kubelet import KubeletThread

                self.kubelet = KubeletThread(self.kubeconfig, nodes, lease_interval=2.0).start()
            else:
                for node in nodes:
                    self.kubelet.add_node(node)
            return
        for node in nodes:
            self.apply_text(json.dumps({k: v for k, v in node.items() if k != "status"}))
            self.set_node_status(node["metadata"]["name"], node["status"])

    def remove_node(self, name: str) -> None:
        if self.kubelet is not None and name in self.kubelet.standin.nodes:
            self.kubelet.remove_node(name)
        else:
            self.kc("delete", "node", name)

    def kc(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "KUBECACHEDIR": str(self.workdir / "kcache")}
        proc = subprocess.run([self.kubectl, *args], input=stdin, capture_output=True, text=True, env=env,
                              timeout=60)
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, ["kubectl", *args], proc.stdout, proc.stderr)
        return proc

    def validate(self) -> str:
        """kubectl's client-side schema validation: off for the emulated API (no OpenAPI), strict elsewhere."""
        return "--validate=false" if self.emulated else "--validate=strict"

    def get(self, *args: str) -> Any:
        return json.loads(self.kc("get", *args, "-o", "json").stdout)

    def apply(self, path: Path | str) -> None:
        self.kc("apply", self.validate(), "-f", str(path))

    def apply_text(self, text: str) -> None:
        self.kc("apply", self.validate(), "-f", "-", stdin=text)

    def set_node_status(self, name: str, status: dict[str, Any]) -> None:
        self.kc("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": status}))

    def pods(self, namespace: str, selector: str = "walras.dev/managed=true") -> list[dict[str, Any]]:
        return list(self.get("pods", "-n", namespace, "-l", selector)["items"])

    def close(self) -> None:
        """Stop the emulated API (nothing to do for a real cluster)."""
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)

    def clear_jobs(self, namespace: str, timeout: float = 60.0) -> None:
        """Wait until ``namespace`` holds no FungibleJob: remove what an earlier module on the shared API server left
        there (the tests under ``tests/`` use the same namespace and job names). A job still terminating is the
        trap: ``kubectl apply`` of the same name then patches the dying object, and it vanishes mid-test once its
        last finalizer goes (seen when make test ran the real-control-plane tests back to back under xdist)."""
        deadline = time.monotonic() + timeout
        while True:
            items = self.get("fungiblejobs", "-n", namespace)["items"]
            if not items:
                return
            if time.monotonic() > deadline:
                names = [i["metadata"]["name"] for i in items]
                raise AssertionError(f"FungibleJobs {names} of namespace {namespace!r} not gone after {timeout:g} s")
            for item in items:
                name = item["metadata"]["name"]
                self.kc("patch", "fungiblejob", name, "-n", namespace, "--type=merge", "-p",
                        '{"metadata":{"finalizers":null}}', check=False)
                self.kc("delete", "fungiblejob", name, "-n", namespace, "--wait=false", check=False)
            time.sleep(0.5)

    def reset(self, namespaces: list[str]) -> None:
        """Remove what a module created on a shared API server: the Walras objects (their kopf finalizers first:
        the operator is gone), the pods (forced) and Events of ``namespaces`` (kept themselves: deleting and waiting
        for them took about 20 s per module), then the stand-in's nodes."""
        try:
            for kind in ("fungiblejobs", "colocationprofiles", "resourcepools"):
                for item in self.get(kind, "-A")["items"]:
                    meta = item["metadata"]
                    where = ["-n", meta["namespace"]] if meta.get("namespace") else []
                    self.kc("patch", kind, meta["name"], *where, "--type=merge", "-p",
                            '{"metadata":{"finalizers":null}}', check=False)
                    self.kc("delete", kind, meta["name"], *where, "--wait=false", check=False)
            for ns in namespaces:
                self.kc("delete", "pods,events", "--all", "-n", ns, "--grace-period=0", "--force", check=False)
        finally:
            if self.kubelet is not None:
                self.kubelet.stop(delete_nodes=True)
                self.kubelet = None

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
    proc = subprocess.Popen([sys.executable, "-m", "walras_testbed.emulator", "--port", "0", "--kubeconfig",
                             str(kubeconfig)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http://"):
        proc.kill()
        raise RuntimeError(f"the emulator did not start: {url}")
    return proc, url


def real_control_plane_available() -> bool:
    folder, missing = assets_folder()
    return folder is not None and not missing


def connect(workdir: Path, kubectl_bin: str, request: pytest.FixtureRequest | None = None) -> Cluster:
    """A test module's cluster, by the route table of this module's docstring (stop it with :meth:`Cluster.close`).

    On the real control plane the CRDs are applied and the chart's ServiceAccounts and RBAC (the leader Lease Role
    included) installed in ``walras-system``; :attr:`Cluster.operator_kubeconfig` authenticates as the operator's
    ServiceAccount."""
    if REAL_KUBECONFIG:
        return Cluster(Path(REAL_KUBECONFIG), kubectl_bin, workdir)
    if real_control_plane_available() and request is not None:
        cp: ControlPlane = request.getfixturevalue("control_plane")
        c = Cluster(cp.kubeconfig, kubectl_bin, workdir, control_plane=cp)
        c.kc("apply", "-f", str(ROOT / "crds"))
        c.kc("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        values = tuple(getattr(request.module, "CHART_VALUES", ()))  # e.g. the extender module's mode
        kubeconfig, chart = install_chart_identity(cp, require("helm"), "walras-system", *values)
        c.operator_kubeconfig, c.chart = kubeconfig, chart
        return c
    if os.environ.get("CI") == "true":
        pytest.fail(missing_message(assets_folder()[1]))
    proc, url = _start_emulator(workdir)
    return Cluster(workdir / "kubeconfig", kubectl_bin, workdir, url=url, process=proc)


def node_manifests(path: Path, status: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The Node documents of ``path``, each with ``status`` (default: its own)."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "Node"]
    return [{**d, "status": status or d.get("status") or {}} for d in docs]


@pytest.fixture(scope="module")
def cluster(kubectl_bin: str, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The module's cluster (see the route table above) with the CRDs, the e2e namespace, four GPU nodes and two
    pools applied."""
    with tempfile.TemporaryDirectory(prefix="walras-e2e-") as tmp:
        c = connect(Path(tmp), kubectl_bin, request)
        try:
            c.apply(ROOT / "crds")
            c.apply(MANIFESTS / "namespace.yaml")
            if c.real:
                c.clear_jobs("e2e")
            c.add_nodes(node_manifests(MANIFESTS / "nodes.yaml", GPU_STATUS))
            c.apply(MANIFESTS / "pools.yaml")
            yield c
        finally:
            if c.real:
                c.reset(["e2e"])
            elif REAL_KUBECONFIG:
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
                "--plan-period", "3", "--kubeconfig", str(self.kubeconfig), *self.extra]
        if "run" in COMMANDS:
            return [sys.executable, "-m", "walras", *args]
        return [sys.executable, "-c", LAUNCH, *args]

    @property
    def kubeconfig(self) -> Path:
        """The chart's ServiceAccount on the real control plane, else the cluster's kubeconfig."""
        return self.cluster.operator_kubeconfig or self.cluster.kubeconfig

    def start(self) -> Operator:
        self.log = self.cluster.workdir / f"operator-{self.mode}-{time.monotonic_ns()}.log"
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "WALRAS_LOG_LEVEL": "INFO"}
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
