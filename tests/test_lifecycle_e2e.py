"""The job lifecycle on the REAL control plane (kube-apiserver, kube-controller-manager with its disruption and node
lifecycle controllers; nodes played by the kubelet stand-in), the operator running as the chart's ServiceAccount
with the chart's RBAC.

Two parts:

* the operator's own mechanics, driven by a scripted planner (:class:`tests.lifecycle_support.ScriptedPlanner`):
  ``evict`` goes through ``pods/eviction`` (a PodDisruptionBudget refuses it with 429 -> the pod stays, one
  ``EvictionBlocked`` Event; relaxed -> evicted with the planned grace period, the pod ``Terminating`` that long),
  ``delete`` with ``grace=0`` removes a pod its lost node never confirms;
* every lifecycle transition with the real planner (one operator shared by the transitions): pods ``Succeeded`` ->
  job ``Complete`` and its capacity to another job; a failed pod re-created, ``Failed`` at the backoff limit; a node
  NotReady past the grace -> its pods re-created elsewhere, nothing lost (:mod:`walras.planner.invariants`);
  ``spec.suspend`` and back; an opt-in job moved through the Eviction API past a blocking PodDisruptionBudget; a job
  that did not opt in never moved.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from walras.operator import OperatorOptions
from walras.planner.model import PodPlan
from walras_testbed.kubelet import KubeletThread

from tests.controlplane import ControlPlane, install_chart_identity
from tests.lifecycle_support import OperatorThread, ScriptedPlanner, fungible_job, gpu_node, pool, wait_for
from tests.realtools import require

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Env:
    """The module's namespace, the operator's kubeconfig (the chart's ServiceAccount) and the kubelet stand-in."""

    cp: ControlPlane
    namespace: str
    operator_kubeconfig: Path
    kubelet: KubeletThread
    tag: str

    def kc(self, *args: str, stdin: str | None = None, check: bool = True) -> Any:
        return self.cp.kubectl(*args, stdin=stdin, check=check)

    def apply(self, *docs: dict[str, Any]) -> None:
        self.kc("apply", "-n", self.namespace, "-f", "-", stdin="\n---\n".join(json.dumps(d) for d in docs))

    def pod(self, name: str) -> dict[str, Any] | None:
        status, body = self.cp.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/{name}")
        return body if status == 200 else None

    def get(self, path: str) -> Any:
        """GET ``path`` as admin (straight to the API server: polling through kubectl costs ~0.4 s a call)."""
        code, body = self.cp.request("GET", path)
        assert code == 200, (path, code, body)
        return body

    def pods(self, job: str) -> list[dict[str, Any]]:
        items = self.get(f"/api/v1/namespaces/{self.namespace}/pods?labelSelector=walras.dev%2Fjob%3D{job}")
        return list(items["items"])

    def all_events(self, name: str) -> list[dict[str, Any]]:
        query = f"fieldSelector=involvedObject.name%3D{name}"
        return list(self.get(f"/api/v1/namespaces/{self.namespace}/events?{query}")["items"])

    def events(self, reason: str, name: str) -> list[dict[str, Any]]:
        return [e for e in self.all_events(name) if e["reason"] == reason]

    def job(self, name: str) -> dict[str, Any]:
        return dict(self.get(f"/apis/walras.dev/v1alpha1/namespaces/{self.namespace}/fungiblejobs/{name}"))

    def pdb(self, name: str, min_available: int, selector: dict[str, str]) -> None:
        self.apply({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
                    "spec": {"minAvailable": min_available, "selector": {"matchLabels": selector}}})

        def observed() -> bool:
            pdb = self.get(f"/apis/policy/v1/namespaces/{self.namespace}/poddisruptionbudgets/{name}")
            status = pdb.get("status") or {}
            return bool(status.get("observedGeneration") == pdb["metadata"]["generation"])

        wait_for(observed, 20, f"the disruption controller to observe PodDisruptionBudget {name}")


@pytest.fixture(scope="module")
def env(control_plane: ControlPlane) -> Iterator[Env]:
    cp = control_plane
    tag = secrets.token_hex(3)
    namespace = f"lc-{tag}"
    cp.kubectl("create", "namespace", namespace)
    cp.kubectl("apply", "-f", str(ROOT / "crds"))
    cp.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    kubeconfig, _ = install_chart_identity(cp, require("helm"), "walras-system")
    kubelet = KubeletThread(cp.kubeconfig, [], lease_interval=1.0).start()
    e = Env(cp, namespace, kubeconfig, kubelet, tag)
    try:
        yield e
    finally:
        for kind in ("fungiblejobs", "resourcepools"):
            cp.kubectl("delete", kind, "-l", f"lifecycle-test={tag}", "-A", "--wait=false", check=False)
        cp.kubectl("delete", "pods,events,pdb", "--all", "-n", namespace, "--grace-period=0", "--force",
                   "--wait=false", check=False)
        kubelet.stop()
        cp.kubectl("delete", "nodes", "-l", f"lifecycle-test={tag}", "--wait=false", check=False)
        cp.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def is_terminating(pod: dict[str, Any] | None) -> bool:
    return pod is not None and bool(pod["metadata"].get("deletionTimestamp"))


def terminating(pod: dict[str, Any] | None) -> dict[str, Any] | None:
    return pod if is_terminating(pod) else None


def running(pod: dict[str, Any] | None) -> bool:
    return pod is not None and (pod.get("status") or {}).get("phase") == "Running" and not is_terminating(pod)


# ----------------------------------------------------------------------------------- the operator's mechanics


def test_evict_through_the_eviction_api_and_force_delete_on_a_lost_node(env: Env) -> None:
    ns, tag = env.namespace, env.tag
    first, second = f"lc-{tag}-ma", f"lc-{tag}-mb"
    for name in (first, second):
        env.kubelet.add_node(gpu_node(name, {"lifecycle-test": tag, "lc-role": "mechanics"}))
    job = fungible_job("m", ns, {"p": 1.0}, 2, grace=30, stop_seconds="inf")
    job["metadata"]["labels"] = {"lifecycle-test": tag}
    env.apply(job)
    planner = ScriptedPlanner()
    planner.set(PodPlan(ns, "m-0", "m", "p", first, {"cpu": "1"}), PodPlan(ns, "m-1", "m", "p", first, {"cpu": "1"}))
    operator = OperatorThread(env.operator_kubeconfig, planner,
                              OperatorOptions(namespaces=(ns,), debounce=0.05, plan_period=0.5,
                                              identity="lifecycle-mechanics")).start()
    try:
        wait_for(lambda: running(env.pod("m-0")) and running(env.pod("m-1")), 30, "m-0 and m-1 Running")
        env.pdb("m", 2, {"app": "m"})

        # blocked: the budget allows no disruption; the pod stays, one Warning Event, asked again every plan
        planner.set(PodPlan(ns, "m-0", "m", "p", first, action="evict", exists=True, grace=3, reason="rebalance"),
                    PodPlan(ns, "m-1", "m", "p", first, action="keep", exists=True))
        blocked = wait_for(lambda: env.events("EvictionBlocked", "m"), 20, "an EvictionBlocked Event on job m")
        assert blocked[0]["type"] == "Warning" and "disruption budget" in blocked[0]["message"], blocked[0]
        asked = planner.snapshots
        operator.wait_plans(3)
        assert planner.snapshots >= asked + 3
        assert running(env.pod("m-0")), "a blocked eviction must leave the pod running"
        assert len(env.events("EvictionBlocked", "m")) == 1, "the same refusal is recorded once"

        # relaxed: the next plan's eviction goes through with the planned grace period (3 s, not the pod's 30 s);
        # the pod's containers checkpoint until killed, so it stays Terminating for that long
        env.pdb("m", 1, {"app": "m"})
        pod = wait_for(lambda: terminating(env.pod("m-0")), 20, "m-0 to be evicted")
        evicted_at = time.monotonic()
        assert pod["metadata"]["deletionGracePeriodSeconds"] == 3
        wait_for(lambda: env.pod("m-0") is None, 20, "m-0 to finish terminating")
        held = time.monotonic() - evicted_at
        assert 1.5 <= held <= 15, f"m-0 was Terminating {held:.1f} s for a 3 s grace period"
        assert (ns, "m-0") not in operator.assumed()
        assert env.events("Evicted", "m") and running(env.pod("m-1"))

        # a lost node never confirms a graceful deletion; grace 0 removes the pod at once
        planner.set(PodPlan(ns, "m-2", "m", "p", second, {"cpu": "1"}),
                    PodPlan(ns, "m-1", "m", "p", first, action="keep", exists=True))
        wait_for(lambda: running(env.pod("m-2")), 30, "the replacement m-2 Running on the second node")
        env.kubelet.lose_node(first)
        planner.set(PodPlan(ns, "m-2", "m", "p", second, action="keep", exists=True),
                    PodPlan(ns, "m-1", "m", "p", None, action="delete", exists=True, reason="NodeLost"))
        wait_for(lambda: is_terminating(env.pod("m-1")), 20, "m-1 to be deleted gracefully")
        operator.wait_plans(3)
        assert is_terminating(env.pod("m-1")), "the silent node cannot have confirmed the deletion"
        planner.set(PodPlan(ns, "m-2", "m", "p", second, action="keep", exists=True),
                    PodPlan(ns, "m-1", "m", "p", None, action="delete", exists=True, grace=0, reason="NodeLost"))
        wait_for(lambda: env.pod("m-1") is None, 20, "m-1 force-deleted")
        assert any("Force-deleted pod m-1" in e["message"] for e in env.events("SuccessfulDelete", "m"))
        assert running(env.pod("m-2"))
    finally:
        operator.stop()
        env.kubelet.remove_node(first)
        env.kubelet.remove_node(second)


# ----------------------------------------------------------------------------------- with the real planner

#: The node-loss grace of the shared operator (``walras run --node-loss-grace``), seconds.
NODE_LOSS_GRACE = 4.0


@pytest.fixture(scope="module")
def walras(env: Env) -> Iterator[OperatorThread]:
    """One operator with the real planner for every transition of the module (its jobs in the module's namespace,
    each transition with its own pool and nodes)."""
    from walras.planner import build_plan

    options = OperatorOptions(namespaces=(env.namespace,), debounce=0.1, plan_period=1.0, identity="lifecycle-e2e",
                              node_loss_grace=NODE_LOSS_GRACE, max_migrations=10)
    operator = OperatorThread(env.operator_kubeconfig, build_plan, options).start()
    yield operator
    operator.stop()


def setup_pool(env: Env, name: str, nodes: int, gpus: int = 2) -> tuple[str, list[str]]:
    """A ResourcePool ``<name>-<tag>`` over ``nodes`` new stand-in nodes of ``gpus`` GPUs each."""
    pool_name = f"{name}-{env.tag}"
    label = {"lifecycle-test": env.tag, "lc-pool": pool_name}
    node_names = [f"{pool_name}-{i}" for i in range(nodes)]
    for node in node_names:
        env.kubelet.add_node(gpu_node(node, label, gpus))
    doc = pool(pool_name, {"lc-pool": pool_name})
    doc["metadata"]["labels"] = {"lifecycle-test": env.tag}
    env.kc("apply", "-f", "-", stdin=json.dumps(doc))
    return pool_name, node_names


def job_doc(env: Env, name: str, pools: dict[str, float], count: int, **kwargs: Any) -> dict[str, Any]:
    doc = fungible_job(name, env.namespace, pools, count, **kwargs)
    doc["metadata"]["labels"] = {"lifecycle-test": env.tag}
    return doc


def live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if running(p)]


def status(env: Env, job: str) -> dict[str, Any]:
    return dict(env.job(job).get("status") or {})


def job_events(env: Env, job: str) -> list[str]:
    """``reason: message`` of the Events on FungibleJob ``job``, oldest first (for failure messages)."""
    items = env.all_events(job)
    items.sort(key=lambda e: e.get("firstTimestamp") or e.get("eventTime") or "")
    return [f"{e['reason']}: {e['message']}" for e in items]


def live_pods(env: Env, job: str, count: int) -> list[dict[str, Any]] | None:
    """The job's running pods when there are ``count`` of them, else None."""
    pods = live(env.pods(job))
    return pods if len(pods) == count else None


def in_phase(env: Env, job: str, phase: str) -> dict[str, Any] | None:
    """The job's status when its phase is ``phase``, else None."""
    current = status(env, job)
    return current if current.get("phase") == phase else None


def invariants(env: Env) -> list[str]:
    """``walras check``'s invariants on the live cluster (every node, the module's namespace and pools), and on a
    fresh plan of it."""
    from walras.kube.decode import cluster_from
    from walras.planner import build_plan
    from walras.planner.invariants import check_cluster, check_plan
    from walras.planner.model import Snapshot
    from walras.planner.plan import PlanOptions

    snapshot = Snapshot(
        nodes=tuple(env.get("/api/v1/nodes")["items"]),
        pods=tuple(env.get(f"/api/v1/namespaces/{env.namespace}/pods")["items"]),
        pools=tuple(p for p in env.get("/apis/walras.dev/v1alpha1/resourcepools")["items"]
                    if (p["metadata"].get("labels") or {}).get("lifecycle-test") == env.tag),
        jobs=tuple(env.get(f"/apis/walras.dev/v1alpha1/namespaces/{env.namespace}/fungiblejobs")["items"]))
    cluster = cluster_from(snapshot)
    plan = build_plan(cluster, options=PlanOptions(now=time.time(), node_loss_grace=NODE_LOSS_GRACE))
    found = [*check_cluster(cluster), *check_plan(cluster, plan)]
    return [f"{v.kind} {v.object}: {v.message}" for v in found if v.kind != "StatusDisagrees"]


def test_succeeded_pods_complete_the_job_and_free_its_capacity(env: Env, walras: OperatorThread) -> None:
    pool_name, nodes = setup_pool(env, "done", 1)
    env.apply(job_doc(env, "first", {pool_name: 1.0}, 2))
    pods = wait_for(lambda: live_pods(env, "first", 2), 30, "first's 2 pods Running")
    for p in pods:
        env.kubelet.complete_pod(env.namespace, p["metadata"]["name"])
    done = wait_for(lambda: in_phase(env, "first", "Complete"), 30, "first to be Complete")
    assert done.get("completionTime"), done
    # the node is full of nothing now: a second job takes both GPUs; the first job's pods are never re-created
    env.apply(job_doc(env, "second", {pool_name: 1.0}, 2))
    placed = wait_for(lambda: live_pods(env, "second", 2), 30, "second's 2 pods Running on the freed node")
    assert {p["spec"]["nodeName"] for p in placed} == {nodes[0]}
    walras.wait_plans(2)
    first = env.pods("first")
    assert sorted(p["metadata"]["name"] for p in first) == sorted(p["metadata"]["name"] for p in pods)
    assert {p["status"]["phase"] for p in first} == {"Succeeded"}
    assert status(env, "first")["phase"] == "Complete"
    assert invariants(env) == []


def test_a_failed_pod_is_replaced_after_backoff_and_the_job_fails_at_its_limit(env: Env,
                                                                                 walras: OperatorThread) -> None:
    pool_name, _ = setup_pool(env, "flaky", 1)
    env.apply(job_doc(env, "flaky", {pool_name: 1.0}, 1, backoffLimit=1))
    first = wait_for(lambda: live_pods(env, "flaky", 1), 30, "flaky's pod Running")[0]
    env.kubelet.fail_pod(env.namespace, first["metadata"]["name"], reason="Error", message="exit 1")
    failed_at = time.monotonic()
    counted = wait_for(lambda: (s := status(env, "flaky")).get("failedPods") == 1 and s, 20,
                       "the failure to be counted")
    assert counted.get("lastFailureTime"), counted
    wait_for(lambda: env.pod(first["metadata"]["name"]) is None
             or env.pod(first["metadata"]["name"])["metadata"]["uid"] != first["metadata"]["uid"], 20,
             "the failed pod to be deleted")
    second = wait_for(lambda: live_pods(env, "flaky", 1), 40, "the replacement Running")[0]
    waited = time.monotonic() - failed_at
    assert waited >= 7, f"the replacement came {waited:.1f} s after the failure, before the 10 s backoff"
    env.kubelet.fail_pod(env.namespace, second["metadata"]["name"], reason="Error", message="exit 1")
    final = wait_for(lambda: in_phase(env, "flaky", "Failed"), 20, "flaky to be Failed at its backoff limit")
    assert final["failedPods"] == 2
    reasons = {c.get("reason") for c in final.get("conditions") or []}
    assert "BackoffLimitExceeded" in reasons, final
    walras.wait_plans(3)
    assert not [p for p in env.pods("flaky") if (p.get("status") or {}).get("phase") != "Failed"], \
        "a Failed job creates no pod"


def test_pods_of_a_node_lost_past_the_grace_are_replanned_elsewhere(env: Env, walras: OperatorThread) -> None:
    pool_name, nodes = setup_pool(env, "lost", 2)
    env.apply(job_doc(env, "survivor", {pool_name: 1.0}, 2))
    pods = wait_for(lambda: live_pods(env, "survivor", 2), 30, "survivor's 2 pods Running")
    lost = pods[0]["spec"]["nodeName"]
    other = next(n for n in nodes if n != lost)
    moved = {p["metadata"]["uid"] for p in pods if p["spec"]["nodeName"] == lost}
    env.kubelet.lose_node(lost)
    gone_at = time.monotonic()

    def replanned() -> list[dict[str, Any]] | None:
        current = env.pods("survivor")
        uids = {p["metadata"]["uid"] for p in current}
        ok = live(current)
        return ok if not (uids & moved) and len(ok) == 2 and {p["spec"]["nodeName"] for p in ok} == {other} \
            else None

    wait_for(replanned, 40, f"survivor's pods force-deleted from {lost} and re-created on {other}")
    assert time.monotonic() - gone_at >= NODE_LOSS_GRACE - 1, "the pods moved before the node-loss grace"
    events = env.events("SuccessfulDelete", "survivor")
    assert any("Force-deleted" in e["message"] for e in events), [e["message"] for e in events]
    assert invariants(env) == []
    env.kubelet.remove_node(lost)


def test_suspend_stops_the_pods_and_resume_brings_them_back(env: Env, walras: OperatorThread) -> None:
    pool_name, _ = setup_pool(env, "pause", 1)
    env.apply(job_doc(env, "pausable", {pool_name: 1.0}, 2))
    wait_for(lambda: len(live(env.pods("pausable"))) == 2, 30, "pausable's 2 pods Running")
    env.kc("patch", "fungiblejob", "pausable", "-n", env.namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: not env.pods("pausable"), 30, "the suspended job's pods to go")
    assert wait_for(lambda: status(env, "pausable").get("phase") == "Suspended", 20, "phase Suspended")
    wait_for(lambda: (env.get(f"/apis/walras.dev/v1alpha1/resourcepools/{pool_name}").get("status") or {})
             .get("used") == 0, 20,
             "the pool to be released")
    env.kc("patch", "fungiblejob", "pausable", "-n", env.namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: len(live(env.pods("pausable"))) == 2, 30, "pausable's 2 pods back")
    assert wait_for(lambda: status(env, "pausable").get("phase") == "Running", 20, "phase Running")


def test_an_opt_in_job_moves_through_the_eviction_api_and_a_plain_job_never_moves(env: Env,
                                                                                  walras: OperatorThread) -> None:
    fast, fast_nodes = setup_pool(env, "fast", 1)
    slow, slow_nodes = setup_pool(env, "slow", 1)
    hog = job_doc(env, "hog", {fast: 1.0}, 2)
    hog["spec"]["preemptible"] = False  # the test is of migration: the new jobs may not swap into fast by preemption
    env.apply(hog)
    wait_for(lambda: live_pods(env, "hog", 2), 30, "hog's 2 pods Running on the fast pool")
    rules = {"minGain": 0.05, "minRunSeconds": 0, "cooldownSeconds": 0, "maxPodsPerCycle": 1}
    env.apply(job_doc(env, "mover", {fast: 4.0, slow: 1.0}, 1, grace=3, stop_seconds="inf", migration=rules),
              job_doc(env, "stayer", {fast: 4.0, slow: 1.0}, 1))
    old = wait_for(lambda: live_pods(env, "mover", 1), 30, "mover Running on the slow pool")[0]
    stayer = wait_for(lambda: live_pods(env, "stayer", 1), 30, "stayer Running on the slow pool")[0]
    assert old["spec"]["nodeName"] == slow_nodes[0] and stayer["spec"]["nodeName"] == slow_nodes[0]
    env.pdb("mover", 2, {"app": "mover"})  # no disruption allowed while at most two mover pods are healthy

    # the fast pool frees up: the market now wants mover there; the eviction of its slow pod is refused
    for p in live(env.pods("hog")):
        env.kubelet.complete_pod(env.namespace, p["metadata"]["name"])
    blocked = wait_for(lambda: env.events("EvictionBlocked", "mover"), 40, "an EvictionBlocked Event on mover")
    assert "disruption budget" in blocked[0]["message"], blocked[0]
    walras.wait_plans(3)
    current = env.pod(old["metadata"]["name"])
    assert running(current) and current is not None and current["metadata"]["uid"] == old["metadata"]["uid"], \
        f"the budget holds: the old pod keeps running; job events: {job_events(env, 'mover')}"

    # relaxed: the next plan evicts it; it terminates within its 3 s grace period; mover ends on the fast pool
    env.pdb("mover", 1, {"app": "mover"})
    wait_for(lambda: terminating(env.pod(old["metadata"]["name"])), 30, "mover's slow pod evicted")
    pod = env.pod(old["metadata"]["name"])
    assert pod is None or pod["metadata"]["deletionGracePeriodSeconds"] == 3

    def moved() -> bool:
        pods = env.pods("mover")
        return len(pods) == 1 and running(pods[0]) and pods[0]["spec"]["nodeName"] == fast_nodes[0]

    wait_for(moved, 40, "mover's one pod Running on the fast pool")
    assert wait_for(lambda: status(env, "mover").get("migrations", 0) >= 1, 20, "status.migrations counted")
    assert status(env, "mover").get("lastMigrationTime")
    walras.wait_plans(2)
    after = env.pods("stayer")
    assert [(p["metadata"]["uid"], p["spec"]["nodeName"]) for p in after] == \
        [(stayer["metadata"]["uid"], slow_nodes[0])], "a job without spec.migration is never moved"
    assert not env.events("Evicted", "stayer") and not env.events("EvictionBlocked", "stayer")
    assert invariants(env) == []
