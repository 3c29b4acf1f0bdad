"""Safe removals and quiet plans on the REAL control plane (kube-apiserver with its Eviction API and disruption
controller, kube-controller-manager; nodes played by the kubelet stand-in), the operator in-process with the real
planner, as the chart's ServiceAccount with the chart's RBAC, its API client counting every request it sends:

* a PodDisruptionBudget that allows 0 disruptions blocks a shrink asked by lowering the pool's ``spec.capacity``:
  the pods stay, the job says why (``EvictionBlocked`` condition and Event with the API server's message), and no
  DELETE of a pod was sent (only evictions);
* ``spec.unschedulable`` (cordon) on a node running pods: nothing is deleted or evicted;
* a quiet cluster is quiet: after settling, a window of 20 s with a plan every second (the operator's default period
  is 30 s, the issue's window two minutes: the test shortens both, ~20 plans) sends 0 writes, and no pod, job, pool
  or Event object changes.

The scenarios run on the real control plane only (the emulator has no Eviction API nor disruption controller); with
``CI=true`` missing binaries fail the run (``tests.conftest.control_plane``).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from walras.kube.client import KubeClient
from walras.operator import OperatorOptions

from tests.controlplane import ControlPlane, install_chart_identity
from tests.lifecycle_support import OperatorThread, fungible_job, gpu_node, pool, wait_for
from tests.realtools import require

ROOT = Path(__file__).resolve().parents[1]
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class CountingClient(KubeClient):
    """A :class:`KubeClient` that records ``(method, path)`` of every request it sends (thread-safe)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    async def request(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        with self._lock:
            self.sent.append((method, path))
        return await super().request(method, path, body, **kwargs)

    def writes(self, since: int = 0) -> list[tuple[str, str]]:
        with self._lock:
            return [s for s in self.sent[since:] if s[0] in WRITES]

    def mark(self) -> int:
        with self._lock:
            return len(self.sent)


class CountingOperator(OperatorThread):
    """:class:`OperatorThread` whose controller's client is a :class:`CountingClient`."""

    client: CountingClient

    def make_client(self) -> CountingClient:
        self.client = CountingClient(self.kube)
        return self.client


class Env:
    """The module's namespace, stand-in nodes and the operator."""

    def __init__(self, cp: ControlPlane, tag: str, kubeconfig: Path) -> None:
        from walras_testbed.kubelet import KubeletThread

        self.cp, self.tag, self.namespace = cp, tag, f"safe-{tag}"
        self.kubelet = KubeletThread(cp.kubeconfig, [], lease_interval=1.0).start()
        self.kubeconfig = kubeconfig

    def get(self, path: str) -> Any:
        code, body = self.cp.request("GET", path)
        assert code == 200, (path, code, body)
        return body

    def apply(self, *docs: dict[str, Any], namespaced: bool = True) -> None:
        where = ["-n", self.namespace] if namespaced else []
        self.cp.kubectl("apply", *where, "-f", "-", stdin="\n---\n".join(json.dumps(d) for d in docs))

    def setup_pool(self, name: str, nodes: int, gpus: int) -> tuple[str, list[str]]:
        pool_name = f"{name}-{self.tag}"
        names = [f"{pool_name}-{i}" for i in range(nodes)]
        for n in names:
            self.kubelet.add_node(gpu_node(n, {"safety-test": self.tag, "safe-pool": pool_name}, gpus))
        doc = pool(pool_name, {"safe-pool": pool_name})
        doc["metadata"]["labels"] = {"safety-test": self.tag}
        self.apply(doc, namespaced=False)
        return pool_name, names

    def job(self, name: str, pools: dict[str, float], count: int) -> None:
        doc = fungible_job(name, self.namespace, pools, count)
        doc["metadata"]["labels"] = {"safety-test": self.tag}
        self.apply(doc)

    def disruption_budget(self, job: str, min_available: int, healthy: int, allowed: int) -> None:
        """A PodDisruptionBudget ``job`` (``minAvailable``) over the job's pods (label ``app: job``), then wait until
        the disruption controller has observed it with ``healthy`` pods and ``allowed`` disruptions."""
        self.apply({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": job},
                    "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": job}}}})

        def observed() -> bool:
            pdb = self.get(f"/apis/policy/v1/namespaces/{self.namespace}/poddisruptionbudgets/{job}")
            status = pdb.get("status") or {}
            return status.get("observedGeneration") == pdb["metadata"]["generation"] and \
                status.get("currentHealthy") == healthy and status.get("disruptionsAllowed") == allowed

        wait_for(observed, 30, f"the disruption controller to count {job}'s {healthy} healthy pods, {allowed} allowed")

    def pods(self, job: str) -> list[dict[str, Any]]:
        query = f"labelSelector=walras.dev%2Fjob%3D{job}"
        return list(self.get(f"/api/v1/namespaces/{self.namespace}/pods?{query}")["items"])

    def running(self, job: str, count: int) -> list[dict[str, Any]] | None:
        pods = [p for p in self.pods(job) if (p.get("status") or {}).get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")]
        return pods if len(pods) == count else None

    def status(self, job: str) -> dict[str, Any]:
        path = f"/apis/walras.dev/v1alpha1/namespaces/{self.namespace}/fungiblejobs/{job}"
        return dict(self.get(path).get("status") or {})

    def events(self, name: str) -> list[dict[str, Any]]:
        query = f"fieldSelector=involvedObject.name%3D{name}"
        return list(self.get(f"/api/v1/namespaces/{self.namespace}/events?{query}")["items"])

    def versions(self) -> dict[str, str]:
        """kind/name -> resourceVersion of every pod, Event and job of the namespace and every pool of the test."""
        out: dict[str, str] = {}
        for kind, path in (("pod", f"/api/v1/namespaces/{self.namespace}/pods"),
                           ("event", f"/api/v1/namespaces/{self.namespace}/events"),
                           ("job", f"/apis/walras.dev/v1alpha1/namespaces/{self.namespace}/fungiblejobs"),
                           ("pool", "/apis/walras.dev/v1alpha1/resourcepools?labelSelector=safety-test%3D"
                                    f"{self.tag}")):
            for item in self.get(path)["items"]:
                out[f"{kind}/{item['metadata']['name']}"] = item["metadata"]["resourceVersion"]
        return out


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane) -> Iterator[Env]:
    cp = control_plane
    tag = secrets.token_hex(3)
    cp.kubectl("apply", "-f", str(ROOT / "crds"))
    cp.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    kubeconfig, _ = install_chart_identity(cp, require("helm"), "walras-system")
    e = Env(cp, tag, kubeconfig)
    cp.kubectl("create", "namespace", e.namespace)
    try:
        yield e
    finally:
        for kind in ("fungiblejobs", "resourcepools"):
            cp.kubectl("delete", kind, "-l", f"safety-test={tag}", "-A", "--wait=false", check=False)
        cp.kubectl("delete", "pods,events,pdb", "--all", "-n", e.namespace, "--grace-period=0", "--force",
                   "--wait=false", check=False)
        e.kubelet.stop()
        cp.kubectl("delete", "nodes", "-l", f"safety-test={tag}", "--wait=false", check=False)
        cp.kubectl("delete", "namespace", e.namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def walras(env: Env) -> Iterator[CountingOperator]:
    from walras.planner import build_plan

    options = OperatorOptions(namespaces=(env.namespace,), debounce=0.1, plan_period=1.0, identity="safety-e2e")
    operator = CountingOperator(env.kubeconfig, build_plan, options).start()
    yield operator
    operator.stop()


def finish(env: Env, job: str) -> None:
    """Remove a scenario's job (and its budget) and wait until its pods are gone, so the next one starts quiet."""
    env.cp.kubectl("delete", "pdb", job, "-n", env.namespace, "--ignore-not-found", check=False)
    env.cp.kubectl("delete", "fungiblejob", job, "-n", env.namespace, "--wait=false")
    wait_for(lambda: not env.pods(job), 40, f"{job}'s pods to go")


def pod_writes(writes: list[tuple[str, str]], namespace: str) -> list[tuple[str, str]]:
    """The DELETEs of pods and the evictions among ``writes``."""
    prefix = f"/api/v1/namespaces/{namespace}/pods/"
    return [(m, p) for m, p in writes if p.startswith(prefix) and (m == "DELETE" or p.endswith("/eviction"))]


def test_a_quiet_cluster_sends_no_write(env: Env, walras: CountingOperator) -> None:
    pool_name, _ = env.setup_pool("quiet", 2, 4)
    env.job("calm", {pool_name: 1.0}, 3)
    env.job("still", {pool_name: 2.0}, 2)
    wait_for(lambda: env.running("calm", 3) and env.running("still", 2), 40, "5 pods Running")

    def settled() -> bool:  # two plans in a row write nothing
        mark = walras.client.mark()
        walras.wait_plans(2)
        return not walras.client.writes(mark)

    wait_for(settled, 40, "the operator to settle", interval=0.5)
    versions = env.versions()
    mark = walras.client.mark()
    plans = walras.plans
    time.sleep(20.0)
    assert walras.plans - plans >= 10, "the periodic plan ran (period 1 s)"
    assert walras.client.writes(mark) == [], "a quiet cluster gets no write"
    changed = {k: v for k, v in env.versions().items() if versions.get(k) != v}
    assert changed == {}, f"objects changed or appeared over the quiet window: {changed}"
    finish(env, "calm")
    finish(env, "still")


def test_a_disruption_budget_blocks_a_capacity_lowering_shrink(env: Env, walras: CountingOperator) -> None:
    pool_name, _ = env.setup_pool("pdb", 1, 4)
    env.job("guarded", {pool_name: 1.0}, 4)
    before = wait_for(lambda: env.running("guarded", 4), 40, "guarded's 4 pods Running")
    env.disruption_budget("guarded", 4, healthy=4, allowed=0)
    mark = walras.client.mark()
    env.cp.kubectl("patch", "resourcepool", pool_name, "--type=merge", "-p", '{"spec":{"capacity":2}}')

    def blocked() -> dict[str, Any] | None:
        conditions = {c["type"]: c for c in env.status("guarded").get("conditions") or []}
        return conditions.get("EvictionBlocked")

    condition = wait_for(blocked, 40, "the EvictionBlocked condition on guarded")
    assert "disruption budget" in condition["message"], condition
    events = [e for e in env.events("guarded") if e["reason"] == "EvictionBlocked"]
    assert events and "disruption budget" in events[0]["message"], events
    walras.wait_plans(3)
    after = env.running("guarded", 4)
    assert after is not None and {p["metadata"]["uid"] for p in after} == {p["metadata"]["uid"] for p in before}, \
        "the budget holds: the 4 pods keep running"
    sent = pod_writes(walras.client.writes(mark), env.namespace)
    assert sent and all(p.endswith("/eviction") for _, p in sent), f"only evictions, no DELETE: {sent}"
    # a refusal is asked again with backoff, not every plan: at most 1 + log2 of the seconds waited per pod
    assert len(sent) <= 2 * 6, sent
    finish(env, "guarded")


def test_a_cordon_removes_nothing(env: Env, walras: CountingOperator) -> None:
    pool_name, nodes = env.setup_pool("cordon", 2, 2)
    env.job("steady", {pool_name: 1.0}, 4)
    before = wait_for(lambda: env.running("steady", 4), 40, "steady's 4 pods Running")
    walras.wait_plans(2)
    mark = walras.client.mark()
    env.cp.kubectl("cordon", nodes[0])
    walras.wait_plans(5)
    time.sleep(2.0)
    walras.wait_plans(2)
    sent = pod_writes(walras.client.writes(mark), env.namespace)
    assert sent == [], f"a cordon deleted or evicted pods: {sent}"
    after = env.running("steady", 4)
    assert after is not None and {p["metadata"]["uid"] for p in after} == {p["metadata"]["uid"] for p in before}
    finish(env, "steady")
