"""End to end, direct binding mode: the real ``walras run`` process, driven by the real kubectl.

Scenarios run in file order against one cluster (see ``conftest.py``): apply jobs -> prices and placements; scale a
job; add and remove a node; delete a job; API faults on binding and status patches; kill the operator mid-cycle and
restart it; change a job's per-task resources (running pods resized in place through ``pods/resize``, or, where the
cluster does not serve it, a ``ResizePending`` condition until the next pod).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from e2e.conftest import GPU_STATUS, MANIFESTS, Cluster, Operator, check, wait_until
from e2e.invariants import violations

pytestmark = pytest.mark.e2e
NS = "e2e"


@pytest.fixture(scope="module")
def op(cluster: Cluster) -> Iterator[dict[str, Operator]]:
    holder = {"op": Operator(cluster, "direct").start()}
    yield holder
    holder["op"].stop()


def job_status(cluster: Cluster, name: str) -> dict[str, Any]:
    return dict(cluster.get("fungiblejob", name, "-n", NS).get("status") or {})


def settled(cluster: Cluster, job: str, replicas: int | None = None) -> list[dict[str, Any]] | None:
    """The job's pods if every pod in its status exists, bound to its planned node with the planned resources."""
    status = job_status(cluster, job)
    planned = status.get("pods") or []
    if not planned or (replicas is not None and len(planned) != replicas):
        return None
    pods = {p["metadata"]["name"]: p for p in cluster.pods(NS, f"walras.dev/job={job}")}
    if len(pods) != len(planned):
        return None
    for want in planned:
        pod = pods.get(want["name"])
        if pod is None or not want.get("node") or pod["spec"].get("nodeName") != want["node"]:
            return None
    return list(pods.values())


def metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_apply_publishes_prices_and_binds_pods_to_planned_nodes(cluster: Cluster, op: dict[str, Operator]) -> None:
    cluster.apply(MANIFESTS / "jobs.yaml")
    for job, replicas in (("resnet50", 2), ("transformer", 2), ("a3c", 1)):
        pods = wait_until(lambda j=job, r=replicas: settled(cluster, j, r), 60, f"{job} bound")
        planned = {p["name"]: p for p in job_status(cluster, job)["pods"]}
        for pod in pods:
            want = planned[pod["metadata"]["name"]]
            container = pod["spec"]["containers"][0]
            assert container["resources"].get("requests", {}) == {**container["resources"].get("requests", {}),
                                                                   **want["requests"]}
            assert container["resources"].get("limits", {}) == {**container["resources"].get("limits", {}),
                                                                 **want["limits"]}
            assert pod["metadata"]["annotations"]["walras.dev/planned-node"] == want["node"]
            assert pod["spec"]["schedulerName"] == "walras-scheduler"
            assert pod["metadata"]["ownerReferences"][0]["kind"] == "FungibleJob"
            assert pod["metadata"]["labels"]["walras.dev/pool"] == want["pool"]
    for pool in ("e2e-v100", "e2e-k80"):
        status = wait_until(lambda p=pool: cluster.get("resourcepool", p).get("status"), 30, f"{pool} status")
        assert status["nodeCount"] == 2
        assert float(status["capacity"]) == 8.0
        assert float(status["price"]) >= 0.0
        text = wait_until(lambda p=pool: check(op["op"].metrics(),
                                               lambda t, p=p: metric(t, "walras_pool_price", pool=p) is not None),
                          30, "price on /metrics")
        # the metric and the status come from the same plan once its status is written (a plan in between may move
        # the price while the pods settle): they agree within the wait
        def agree(p: str = pool) -> bool:
            scraped = metric(op["op"].metrics(), "walras_pool_price", pool=p, resource="nvidia.com/gpu")
            return scraped == pytest.approx(float(cluster.get("resourcepool", p)["status"]["price"]))

        assert text and wait_until(agree, 30, f"{pool}: walras_pool_price equal to status.price")
    text = op["op"].metrics()
    assert metric(text, "walras_pods_bound_total", pool="e2e-v100", mode="direct") is not None \
        or metric(text, "walras_pods_bound_total", pool="e2e-k80", mode="direct") is not None
    assert metric(text, "walras_plans_total", result="ok")
    assert requests.get(op["op"].url("health", "/healthz"), timeout=5).status_code == 200  # kopf liveness
    sound(cluster)


def sound(cluster: Cluster) -> None:
    """On the real control plane: every planned pod Running where planned, no node over-committed, none rejected."""
    if cluster.real:
        try:
            wait_until(lambda: not violations(cluster), 60, "every planned pod Running, no node over-committed")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {violations(cluster)}") from None


def test_scale_a_job(cluster: Cluster, op: dict[str, Operator]) -> None:
    cluster.kc("patch", "fungiblejob", "resnet50", "-n", NS, "--type=merge", "-p",
               json.dumps({"spec": {"replicas": {"count": 3}}}))
    wait_until(lambda: settled(cluster, "resnet50", 3), 60, "resnet50 scaled to 3")
    cluster.kc("patch", "fungiblejob", "resnet50", "-n", NS, "--type=merge", "-p",
               json.dumps({"spec": {"replicas": {"count": 1}}}))
    pods = wait_until(lambda: settled(cluster, "resnet50", 1), 60, "resnet50 scaled to 1")
    assert len(pods) == 1
    sound(cluster)


def test_add_and_remove_a_node(cluster: Cluster, op: dict[str, Operator]) -> None:
    cluster.add_nodes([{"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": "e2e-v100-2", "labels": {"walras.dev/e2e": "true", "e2e.walras.dev/gpu": "v100"}},
        "status": GPU_STATUS}])
    wait_until(lambda: cluster.get("resourcepool", "e2e-v100")["status"]["nodeCount"] == 3, 30, "3 v100 nodes")
    assert float(cluster.get("resourcepool", "e2e-v100")["status"]["capacity"]) == 12.0
    wait_until(lambda: metric(op["op"].metrics(), "walras_pool_capacity", pool="e2e-v100") == 12.0, 30,
               "capacity 12 on /metrics")
    cluster.remove_node("e2e-v100-2")
    wait_until(lambda: cluster.get("resourcepool", "e2e-v100")["status"]["nodeCount"] == 2, 30, "2 v100 nodes")
    assert float(cluster.get("resourcepool", "e2e-v100")["status"]["capacity"]) == 8.0
    for job in ("resnet50", "transformer", "a3c"):
        pods = job_status(cluster, job)["pods"]
        assert all(p["node"] != "e2e-v100-2" for p in pods)
    sound(cluster)


def test_delete_a_job_removes_its_pods(cluster: Cluster, op: dict[str, Operator]) -> None:
    cluster.kc("delete", "fungiblejob", "a3c", "-n", NS)
    wait_until(lambda: not cluster.pods(NS, "walras.dev/job=a3c"), 30, "a3c pods gone")
    assert settled(cluster, "transformer", 2)


def test_invalid_job_gets_a_condition_and_an_event(cluster: Cluster, op: dict[str, Operator]) -> None:
    job = (MANIFESTS / "jobs.yaml").read_text().split("---")[-1]
    cluster.apply_text(job.replace("name: a3c", "name: broken").replace(
        "throughput: {e2e-v100: 1.3, e2e-k80: 1.0}", "throughput: {no-such-pool: 2.0}"))

    def flagged() -> list[dict[str, Any]]:
        conditions = job_status(cluster, "broken").get("conditions") or []
        return [c for c in conditions if c["status"] == "False" and "no-such-pool" in c.get("message", "")]

    wait_until(flagged, 30, "a False condition naming the unknown pool")
    events = wait_until(lambda: [e for e in cluster.get("events", "-n", NS)["items"]
                                 if e["involvedObject"]["name"] == "broken" and e["type"] == "Warning"],
                        30, "a Warning Event on the broken job")
    assert any("no-such-pool" in e["message"] or "no pool" in e["message"] for e in events)
    assert not cluster.pods(NS, "walras.dev/job=broken")
    assert settled(cluster, "transformer", 2)  # planning went on for the rest
    cluster.kc("delete", "fungiblejob", "broken", "-n", NS)


def test_kill_mid_cycle_and_restart(cluster: Cluster, op: dict[str, Operator]) -> None:
    job = (MANIFESTS / "jobs.yaml").read_text().split("---")[-1]
    cluster.apply_text(job.replace("name: a3c", "name: gpt").replace("count: 1", "count: 3"))
    wait_until(lambda: cluster.pods(NS, "walras.dev/job=gpt"), 60, "the first gpt pod", interval=0.02)
    op["op"].kill()
    op["op"] = Operator(cluster, "direct").start()
    pods = wait_until(lambda: settled(cluster, "gpt", 3), 60, "gpt bound after the restart")
    names = [p["metadata"]["name"] for p in pods]
    assert len(names) == len(set(names)) == 3
    for job_name in ("resnet50", "transformer", "bert"):
        if cluster.emulated or job_name != "bert":  # bert exists only where faults could be injected
            wait_until(lambda j=job_name: settled(cluster, j), 30, f"{job_name} intact after the restart")
    sound(cluster)
    if cluster.emulated:  # a pod object (uid) is bound at most once; a re-created pod of the same name is another
        bound = [b["uid"] for b in cluster.bindings() if b["namespace"] == NS]
        assert len(bound) == len(set(bound)), f"a pod was bound twice: {cluster.bindings()}"
    assert re.search(r"walras run: mode=direct", op["op"].output())


def test_restart_keeps_running_pods_where_they_are(cluster: Cluster, op: dict[str, Operator]) -> None:
    """Issue 7: with every job settled, a killed and restarted operator (no previous plan) keeps every running pod:
    same pod objects (uids) on the same nodes, nothing deleted, created or re-bound."""
    jobs = [j["metadata"]["name"] for j in cluster.get("fungiblejobs", "-n", NS)["items"]]
    for job_name in jobs:
        if job_status(cluster, job_name).get("pods"):
            wait_until(lambda j=job_name: settled(cluster, j), 60, f"{job_name} settled before the restart")
    before = {p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"].get("nodeName")) for p in cluster.pods(NS)}
    assert before and all(node for _, node in before.values())
    op["op"].kill()
    op["op"] = Operator(cluster, "direct").start()
    wait_until(lambda: (metric(op["op"].metrics(), "walras_plans_total", result="ok") or 0) >= 2, 60,
               "two planning passes of the restarted operator")
    after = {p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"].get("nodeName")) for p in cluster.pods(NS)}
    assert after == before
    sound(cluster)


def container_cpu(pod: dict[str, Any]) -> tuple[str | None, str | None]:
    resources = pod["spec"]["containers"][0].get("resources") or {}
    return (resources.get("requests") or {}).get("cpu"), (resources.get("limits") or {}).get("cpu")


def test_changed_resources_resize_running_pods_in_place(cluster: Cluster, op: dict[str, Operator]) -> None:
    """Issue 7: resources of pods that already run change only through ``pods/resize``: same pod objects (uids) on
    the same nodes, new requests and limits, a ``Resized`` Event per pod. Without the sub-resource (emulated older
    cluster) nothing is patched and the job says the change waits for the next pod."""
    job = {"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob", "metadata": {"name": "tuned", "namespace": NS},
           "spec": {"throughput": {"e2e-v100": 2.0, "e2e-k80": 1.0}, "utility": {"type": "linear"}, "demand": 1,
                    "replicas": {"count": 2}, "resources": {"cpu": "1"},
                    "template": {"spec": {"containers": [{"name": "train", "image": "registry.invalid/tuned:1"}]}}}}
    cluster.apply_text(json.dumps(job))
    pods = wait_until(lambda: settled(cluster, "tuned", 2), 60, "tuned settled")
    assert all(container_cpu(p) == ("1", "1") for p in pods)
    before = {p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"]["nodeName"]) for p in pods}
    cluster.kc("patch", "fungiblejob", "tuned", "-n", NS, "--type=merge", "-p",
               json.dumps({"spec": {"resources": {"cpu": "2"}}}))

    def resized() -> list[dict[str, Any]] | None:
        now = cluster.pods(NS, "walras.dev/job=tuned")
        return now if now and all(container_cpu(p) == ("2", "2") for p in now) else None

    now = wait_until(resized, 60, "tuned pods resized to cpu 2")
    assert {p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"]["nodeName"]) for p in now} == before
    events = wait_until(lambda: [e for e in cluster.get("events", "-n", NS)["items"]
                                 if e["reason"] == "Resized" and e["involvedObject"]["name"] in before], 30,
                        "Resized Events on the tuned pods")
    assert {e["involvedObject"]["name"] for e in events} == set(before)
    if cluster.real:  # the node (kubelet stand-in) took the new requests: its container status shows them
        wait_until(lambda: all(p["status"]["containerStatuses"][0]["resources"]["requests"]["cpu"] == "2"
                               for p in cluster.pods(NS, "walras.dev/job=tuned")), 30, "the resize applied by the node")
        sound(cluster)
    if not cluster.emulated:
        return
    cluster.in_place_resize(False)
    try:
        cluster.kc("patch", "fungiblejob", "tuned", "-n", NS, "--type=merge", "-p",
                   json.dumps({"spec": {"resources": {"cpu": "3"}}}))

        def pending() -> dict[str, Any] | None:
            conditions = {c["type"]: c for c in job_status(cluster, "tuned").get("conditions") or []}
            return conditions.get("ResizePending")

        condition = wait_until(pending, 60, "a ResizePending condition on tuned")
        assert condition["status"] == "True" and condition["reason"] == "InPlaceResizeUnsupported"
        assert "cpu 2 -> 3" in condition["message"]
        now = cluster.pods(NS, "walras.dev/job=tuned")
        assert {p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"]["nodeName"]) for p in now} == before
        assert all(container_cpu(p) == ("2", "2") for p in now)
    finally:
        cluster.in_place_resize(True)  # the operator sees it again at its next discovery (KubeClient TTL)
    cluster.kc("delete", "fungiblejob", "tuned", "-n", NS)
