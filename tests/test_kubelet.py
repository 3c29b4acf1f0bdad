"""The kubelet stand-in against the real control plane: registration and leases, admission (Running or
``OutOf<resource>``), completion, failure, deletion, NotReady, in-place resize."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

import pytest
from walras_testbed.kubelet import KubeletThread
from walras_testbed.kubelet.resources import pod_requests, quantity

from tests.controlplane import ControlPlane


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def node_doc(name: str, **capacity: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubelet-test": "true"}},
            "spec": {"taints": [{"key": "kubelet-test", "value": "x", "effect": "NoSchedule"}]},
            "status": {"capacity": capacity}}


def pod(name: str, node: str, grace: int | None = None, **requests: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node, "containers": [
        {"name": "main", "image": "registry.invalid/none", "resources": {"requests": requests, "limits": requests}}]}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def node_name(namespace: str) -> str:
    return f"kl-{namespace}"


@pytest.fixture
def kubelet(control_plane: ControlPlane, node_name: str) -> Iterator[KubeletThread]:
    # a second, idle node: with every node NotReady the node lifecycle controller enters full disruption mode
    # and stops tainting (test_node_not_ready_and_back needs one node that stays Ready)
    k = KubeletThread(control_plane.kubeconfig, [node_doc(node_name, cpu="4", memory="8Gi", pods="4",
                                                          **{"nvidia.com/gpu": "2"}),
                                                 node_doc(f"{node_name}-spare", cpu="1")], lease_interval=0.5).start()
    yield k
    k.stop(delete_nodes=True)


def create(cp: ControlPlane, namespace: str, doc: dict[str, Any]) -> None:
    cp.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(doc))


def phase(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    return dict(cp.get("pod", name, "-n", namespace)["status"])


def settled(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    status = phase(cp, namespace, name)
    return status if status.get("phase") in ("Running", "Failed") else None


def test_quantities_are_exact_and_requests_follow_the_kubelet() -> None:
    assert quantity("100m") * 10 == quantity("1") == Fraction(1)
    assert quantity("1Gi") == 2**30 and quantity("1e3") == 1000 and quantity("0.5") == Fraction(1, 2)
    with pytest.raises(ValueError):
        quantity("1 cpu")
    doc = {"spec": {
        "containers": [{"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                       {"name": "b", "resources": {"requests": {"cpu": "500m"}}}],
        "initContainers": [{"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "250m"}}},
                           {"name": "init", "resources": {"requests": {"cpu": "3", "memory": "512Mi"}}}],
        "overhead": {"cpu": "100m"}}}
    req = pod_requests(doc)
    # app 1.5 + sidecar 0.25 = 1.75 < init 3 + sidecar 0.25 = 3.25; plus overhead 0.1
    assert req["cpu"] == Fraction(335, 100)
    assert req["memory"] == 2**30


def test_registration_heartbeat_and_lease(control_plane: ControlPlane, kubelet: KubeletThread,
                                          node_name: str) -> None:
    node = control_plane.get("node", node_name)
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    assert node["status"]["capacity"]["cpu"] == "4"
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["reason"] == "KubeletReady"
    assert {"key": "kubelet-test", "value": "x", "effect": "NoSchedule"} in node["spec"]["taints"]
    lease = control_plane.get("lease", node_name, "-n", "kube-node-lease")
    assert lease["spec"]["holderIdentity"] == node_name
    assert lease["metadata"]["ownerReferences"][0]["uid"] == node["metadata"]["uid"]
    first = lease["spec"]["renewTime"]
    wait_for(lambda: control_plane.get("lease", node_name, "-n", "kube-node-lease")["spec"]["renewTime"] != first,
             10, "a lease renewal")
    # the node lifecycle controller lifts the not-ready taint the API server put on the new node
    wait_for(lambda: not any(t["key"] == "node.kubernetes.io/not-ready"
                             for t in control_plane.get("node", node_name)["spec"].get("taints", [])),
             60, "the not-ready taint to go")


def test_admission_runs_what_fits_and_rejects_the_rest(control_plane: ControlPlane, kubelet: KubeletThread,
                                                        namespace: str, node_name: str) -> None:
    cp = control_plane
    create(cp, namespace, pod("a", node_name, cpu="1500m", memory="1Gi"))
    create(cp, namespace, pod("b", node_name, cpu="1500m", memory="1Gi"))
    for name in ("a", "b"):
        status = wait_for(lambda n=name: settled(cp, namespace, n), 20, f"pod {name}")
        assert status["phase"] == "Running", status
        assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
        assert status["podIP"] and status["containerStatuses"][0]["state"]["running"]
    create(cp, namespace, pod("c", node_name, cpu="1500m"))
    status = wait_for(lambda: settled(cp, namespace, "c"), 20, "pod c")
    assert status["phase"] == "Failed" and status["reason"] == "OutOfcpu", status
    assert status["message"] == ("Pod was rejected: Node didn't have enough resource: cpu, requested: 1500, "
                                 "used: 3000, capacity: 4000")
    create(cp, namespace, pod("d", node_name, cpu="100m", memory="7Gi"))
    status = wait_for(lambda: settled(cp, namespace, "d"), 20, "pod d")
    assert status["reason"] == "OutOfmemory", status
    create(cp, namespace, pod("e", node_name, cpu="100m", **{"nvidia.com/gpu": "3"}))
    status = wait_for(lambda: settled(cp, namespace, "e"), 20, "pod e")
    assert status["reason"] == "OutOfnvidia.com/gpu", status
    create(cp, namespace, pod("f", node_name, cpu="100m", **{"nvidia.com/gpu": "2"}))
    assert wait_for(lambda: settled(cp, namespace, "f"), 20, "pod f")["phase"] == "Running"
    create(cp, namespace, pod("g", node_name, cpu="100m"))
    assert wait_for(lambda: settled(cp, namespace, "g"), 20, "pod g")["phase"] == "Running"
    create(cp, namespace, pod("h", node_name, cpu="100m"))  # a fifth pod on a node with pods: 4
    assert wait_for(lambda: settled(cp, namespace, "h"), 20, "pod h")["reason"] == "OutOfpods"
    assert kubelet.held(node_name) == {"cpu": Fraction(32, 10), "memory": 2 * 2**30, "nvidia.com/gpu": 2}


def test_complete_fail_and_delete_free_the_node(control_plane: ControlPlane, kubelet: KubeletThread,
                                                 namespace: str, node_name: str) -> None:
    cp = control_plane
    create(cp, namespace, pod("a", node_name, grace=30, cpu="3"))
    create(cp, namespace, pod("b", node_name, cpu="1"))
    for name in ("a", "b"):
        assert wait_for(lambda n=name: settled(cp, namespace, n), 20, name)["phase"] == "Running"
    kubelet.complete_pod(namespace, "b")
    status = phase(cp, namespace, "b")
    assert status["phase"] == "Succeeded"
    assert status["containerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    create(cp, namespace, pod("c", node_name, cpu="1"))
    assert wait_for(lambda: settled(cp, namespace, "c"), 20, "c")["phase"] == "Running"
    kubelet.fail_pod(namespace, "c", reason="Error", message="exit 3")
    status = phase(cp, namespace, "c")
    assert status["phase"] == "Failed" and status["reason"] == "Error"
    # a graceful delete (30 s grace) of a running pod finishes as soon as its containers have stopped
    started = time.monotonic()
    cp.kubectl("delete", "pod", "a", "-n", namespace, "--wait=true", "--timeout=20s")
    assert time.monotonic() - started < 20
    create(cp, namespace, pod("d", node_name, cpu="4"))
    assert wait_for(lambda: settled(cp, namespace, "d"), 20, "d")["phase"] == "Running"


def test_node_not_ready_and_back(control_plane: ControlPlane, kubelet: KubeletThread, node_name: str) -> None:
    cp = control_plane

    def ready() -> str:
        node = cp.get("node", node_name)
        return str(next(c for c in node["status"]["conditions"] if c["type"] == "Ready")["status"])

    def taints() -> set[tuple[str, str]]:
        return {(t["key"], t["effect"]) for t in cp.get("node", node_name)["spec"].get("taints", [])}

    kubelet.set_node_ready(node_name, False)
    assert ready() == "False"
    wait_for(lambda: ("node.kubernetes.io/not-ready", "NoExecute") in taints(), 30, "the not-ready NoExecute taint")
    kubelet.set_node_ready(node_name, True)
    assert ready() == "True"
    wait_for(lambda: not any(k == "node.kubernetes.io/not-ready" for k, _ in taints()), 30, "the taint to go")


def test_in_place_resize_is_admitted_or_pending(control_plane: ControlPlane, kubelet: KubeletThread,
                                               namespace: str, node_name: str) -> None:
    cp = control_plane
    create(cp, namespace, pod("a", node_name, cpu="1", memory="1Gi"))
    create(cp, namespace, pod("b", node_name, cpu="1"))
    for name in ("a", "b"):
        assert wait_for(lambda n=name: settled(cp, namespace, n), 20, name)["phase"] == "Running"

    def resize(cpu: str) -> None:
        cp.kubectl("patch", "pod", "a", "-n", namespace, "--subresource=resize", "--type=strategic", "-p", json.dumps(
            {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": cpu},
                                                                    "limits": {"cpu": cpu}}}]}}))

    def container_cpu() -> str:
        return str(phase(cp, namespace, "a")["containerStatuses"][0]["resources"]["requests"]["cpu"])

    resize("3")
    wait_for(lambda: container_cpu() == "3", 20, "the resize to 3 cpu to be applied")
    assert kubelet.held(node_name)["cpu"] == 4
    resize("3500m")  # 3.5 + 1 > 4: would fit the node alone, not now

    def pending() -> dict[str, Any] | None:
        return next((c for c in phase(cp, namespace, "a").get("conditions", []) if c["type"] == "PodResizePending"),
                    None)

    assert wait_for(pending, 20, "PodResizePending")["reason"] == "Deferred"
    # more than the node's allocatable: the API server itself refuses it (v1.36 admission), before any kubelet
    refused = cp.kubectl("patch", "pod", "a", "-n", namespace, "--subresource=resize", "--type=strategic", "-p",
                         json.dumps({"spec": {"containers": [{"name": "main", "resources": {
                             "requests": {"cpu": "5"}, "limits": {"cpu": "5"}}}]}}), check=False)
    assert refused.returncode != 0 and "didn't have enough allocatable resources" in refused.stderr
    assert container_cpu() == "3"
    assert kubelet.held(node_name)["cpu"] == 4


def test_a_deleted_pod_terminates_within_its_grace_period_unless_forced(control_plane: ControlPlane,
                                                                        kubelet: KubeletThread, namespace: str,
                                                                        node_name: str) -> None:
    cp = control_plane
    checkpointing = {"kubelet.walras.dev/stop-seconds": "inf"}  # containers exit only when killed at the grace end
    for name, grace in (("slow", 3), ("long", 600)):
        doc = pod(name, node_name, grace=grace, cpu="1")
        doc["metadata"]["annotations"] = checkpointing
        create(cp, namespace, doc)
    create(cp, namespace, pod("quick", node_name, grace=600, cpu="1"))  # exits at once on SIGTERM
    for name in ("slow", "long", "quick"):
        assert wait_for(lambda n=name: settled(cp, namespace, n), 20, name)["phase"] == "Running"

    def gone(name: str) -> bool:
        return cp.request("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")[0] == 404

    started = time.monotonic()
    cp.kubectl("delete", "pod", "slow", "quick", "-n", namespace, "--wait=false")
    wait_for(lambda: gone("quick"), 10, "the quick pod to go")
    assert not gone("slow"), "a checkpointing pod stays Terminating for its grace period"
    wait_for(lambda: gone("slow"), 15, "the slow pod to go at the end of its 3 s grace period")
    assert 2.0 <= time.monotonic() - started <= 15
    cp.kubectl("delete", "pod", "long", "-n", namespace, "--wait=false")
    time.sleep(1.0)
    assert not gone("long")
    cp.kubectl("delete", "pod", "long", "-n", namespace, "--grace-period=0", "--force", "--wait=false")
    wait_for(lambda: gone("long"), 5, "the force-deleted pod to go at once")
    assert kubelet.held(node_name) == {}


def test_a_lost_node_admits_nothing_and_confirms_no_deletion(control_plane: ControlPlane, kubelet: KubeletThread,
                                                             namespace: str, node_name: str) -> None:
    cp = control_plane
    create(cp, namespace, pod("a", node_name, grace=30, cpu="1"))
    assert wait_for(lambda: settled(cp, namespace, "a"), 20, "a")["phase"] == "Running"
    kubelet.lose_node(node_name)
    node = cp.get("node", node_name)
    assert next(c for c in node["status"]["conditions"] if c["type"] == "Ready")["status"] == "False"
    create(cp, namespace, pod("b", node_name, cpu="1"))
    cp.kubectl("delete", "pod", "a", "-n", namespace, "--wait=false")
    time.sleep(1.5)
    assert phase(cp, namespace, "b").get("phase") == "Pending", "a lost node admits nothing"
    assert cp.get("pod", "a", "-n", namespace)["metadata"]["deletionTimestamp"], "nor confirms a deletion"
    cp.kubectl("delete", "pod", "a", "-n", namespace, "--grace-period=0", "--force", "--wait=false")
    wait_for(lambda: cp.request("GET", f"/api/v1/namespaces/{namespace}/pods/a")[0] == 404, 5, "a force-deleted")


def test_termination_time_is_stop_seconds_within_the_grace_and_the_cap() -> None:
    from walras_testbed.kubelet import ApiClient, ApiConfig, KubeletStandIn

    def deleting(grace: int, stop: str | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": "p", "namespace": "n", "deletionGracePeriodSeconds": grace}
        if stop is not None:
            meta["annotations"] = {"kubelet.walras.dev/stop-seconds": stop}
        return {"metadata": meta}

    plain = KubeletStandIn(ApiClient(ApiConfig("http://127.0.0.1:1")), [])
    assert plain.termination_seconds(deleting(30)) == 0  # containers exit at once on SIGTERM
    assert plain.termination_seconds(deleting(30, "inf")) == 30  # checkpoints until killed at the grace end
    assert plain.termination_seconds(deleting(30, "4.5")) == 4.5
    assert plain.termination_seconds(deleting(0, "inf")) == 0  # a force deletion
    assert plain.termination_seconds(deleting(30, "soon")) == 0  # not a number: the stand-in's default
    capped = KubeletStandIn(ApiClient(ApiConfig("http://127.0.0.1:1")), [], stop_seconds=100, grace_cap=2)
    assert capped.termination_seconds(deleting(30)) == 2 and capped.termination_seconds(deleting(1)) == 1
