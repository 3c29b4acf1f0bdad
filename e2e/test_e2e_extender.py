"""End to end, extender mode: ``walras run --mode extender`` creates pods and leaves binding to kube-scheduler; the
test plays kube-scheduler's extender client (filter -> prioritize -> bind over HTTP with v1 JSON), and sends the
recorded kube-scheduler-shaped requests of ``fixtures/extender``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from e2e.conftest import MANIFESTS, Cluster, Operator, check, wait_until

pytestmark = pytest.mark.e2e
NS = "e2e"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "extender"
NODES = ["e2e-v100-0", "e2e-v100-1", "e2e-k80-0", "e2e-k80-1"]


@pytest.fixture(scope="module")
def op(cluster: Cluster) -> Iterator[Operator]:
    operator = Operator(cluster, "extender").start()
    yield operator
    operator.stop()


def post(op: Operator, verb: str, body: Any) -> requests.Response:
    return requests.post(op.url("extender", f"/scheduler/{verb}"), data=json.dumps(body),
                         headers={"Content-Type": "application/json"}, timeout=10)


def planned(cluster: Cluster, job: str) -> dict[str, str]:
    status = cluster.get("fungiblejob", job, "-n", NS).get("status") or {}
    return {p["name"]: p["node"] for p in status.get("pods") or [] if p.get("node")}


def schedule(op: Operator, pod: dict[str, Any], nodes: list[str]) -> str:
    """One kube-scheduler cycle through the extender: filter, prioritize, bind; returns the chosen node."""
    filtered = post(op, "filter", {"pod": pod, "nodenames": nodes})
    assert filtered.status_code == 200
    result = filtered.json()
    assert result["error"] == ""
    assert len(result["nodenames"]) == 1, result
    assert set(result["failedNodes"]) == set(nodes) - set(result["nodenames"])
    scores = post(op, "prioritize", {"pod": pod, "nodenames": result["nodenames"]}).json()
    assert scores == [{"host": result["nodenames"][0], "score": 10}]
    node = str(result["nodenames"][0])
    binding = post(op, "bind", {"podName": pod["metadata"]["name"], "podNamespace": NS,
                                "podUID": pod["metadata"]["uid"], "node": node})
    assert binding.json() == {"error": ""}
    return node


def test_pods_wait_for_the_scheduler_then_bind_through_the_extender(cluster: Cluster, op: Operator) -> None:
    cluster.apply(MANIFESTS / "jobs.yaml")
    want = wait_until(lambda: check(planned(cluster, "transformer"), lambda p: len(p) == 2), 60, "a plan")
    pods = wait_until(lambda: check(cluster.pods(NS, "walras.dev/job=transformer"), lambda p: len(p) == 2), 60,
                      "transformer pods created")
    assert all(not p["spec"].get("nodeName") for p in pods), "extender mode: the operator does not bind"
    assert all(p["spec"]["schedulerName"] == "walras-scheduler" for p in pods)
    # node removal while pending: the pods are re-planned elsewhere
    doomed = sorted(set(want.values()))[0]
    cluster.kc("delete", "node", doomed)
    nodes = [n for n in NODES if n != doomed]
    want = wait_until(lambda: check(planned(cluster, "transformer"),
                                    lambda p: len(p) == 2 and doomed not in p.values()),
                      60, f"pods re-planned off {doomed}")
    for pod in pods:
        node = schedule(op, pod, nodes)
        assert node == want[pod["metadata"]["name"]]
    bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in cluster.pods(NS, "walras.dev/job=transformer")}
    assert bound == want
    # a second bind of a bound pod is refused, never applied twice
    pod = pods[0]
    again = post(op, "bind", {"podName": pod["metadata"]["name"], "podNamespace": NS,
                              "podUID": pod["metadata"]["uid"], "node": want[pod["metadata"]["name"]]})
    assert again.status_code == 200
    if cluster.emulated:
        uids = [b["uid"] for b in cluster.bindings() if b["namespace"] == NS]
        assert len(uids) == len(set(uids))
    text = op.metrics()
    assert 'walras_pods_bound_total{mode="extender"' in text
    assert 'walras_extender_requests_total{code="200",verb="filter"}' in text


def test_recorded_scheduler_requests(cluster: Cluster, op: Operator) -> None:
    unmanaged = json.loads((FIXTURES / "filter_unmanaged.json").read_text())
    result = post(op, "filter", unmanaged).json()
    assert result["nodenames"] == unmanaged["nodenames"] and result["failedNodes"] == {}
    full = json.loads((FIXTURES / "filter_nodes.json").read_text())
    result = post(op, "filter", full).json()  # ml/resnet-0 is labelled managed but not in this cluster's plan
    assert result["nodes"]["items"] == [] and set(result["failedNodes"]) == {n["metadata"]["name"]
                                                                           for n in full["nodes"]["items"]}
    preempt = json.loads((FIXTURES / "preempt.json").read_text())
    assert post(op, "preempt", preempt).json() == {"nodeNameToMetaVictims": preempt["nodeNameToMetaVictims"]}
    bad = requests.post(op.url("extender", "/scheduler/prioritize"), data=b"[1,2", timeout=5)
    assert bad.status_code == 400 and "malformed prioritize request" in bad.json()["error"]
    missing = post(op, "filter", {"pod": unmanaged["pod"]})
    assert missing.status_code == 400 and "nodes or nodenames" in missing.json()["error"]
