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
from e2e.invariants import overcommitted, rejected
from tests.controlplane import scheduler_config_from_chart

pytestmark = pytest.mark.e2e
NS = "e2e"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "extender"
NODES = ["e2e-v100-0", "e2e-v100-1", "e2e-k80-0", "e2e-k80-1"]
#: helm values of the chart installed on the real control plane: its second scheduler and the operator's mode; the
#: chart demands mutual TLS for an extender beyond loopback (the names below only let it render: the test's
#: extender listens on 127.0.0.1 over plain HTTP, see tests.controlplane.scheduler_config_from_chart)
CHART_VALUES = ("operator.mode=extender", "scheduler.enabled=true", "extender.tls.enabled=true",
                "extender.tls.secretName=walras-extender-tls", "extender.tls.clientCA=unused",
                "scheduler.extender.clientCertSecretName=walras-scheduler-client")


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
    filtered = post(op, "filter", {"Pod": pod, "NodeNames": nodes})  # Go field names, as kube-scheduler sends
    assert filtered.status_code == 200
    result = filtered.json()
    assert result["error"] == ""
    assert len(result["nodenames"]) == 1, result
    # nodes other than the planned one: failedAndUnresolvableNodes (preemption cannot help), else failedNodes
    refused = set(result["failedNodes"]) | set(result.get("failedAndUnresolvableNodes") or {})
    assert refused == set(nodes) - set(result["nodenames"])
    scores = post(op, "prioritize", {"Pod": pod, "NodeNames": result["nodenames"]}).json()
    assert scores == [{"host": result["nodenames"][0], "score": 10}]
    node = str(result["nodenames"][0])
    binding = post(op, "bind", {"PodName": pod["metadata"]["name"], "PodNamespace": NS,
                                "PodUID": pod["metadata"]["uid"], "Node": node})
    assert binding.json() == {"error": ""}
    return node


def test_pods_wait_for_the_scheduler_then_bind_through_the_extender(cluster: Cluster, op: Operator) -> None:
    cluster.apply(MANIFESTS / "jobs.yaml")
    want = wait_until(lambda: check(planned(cluster, "transformer"), lambda p: len(p) == 2), 60, "a plan")
    pods = wait_until(lambda: check(cluster.pods(NS, "walras.dev/job=transformer"), lambda p: len(p) == 2), 60,
                      "transformer pods created")
    assert all(not p["spec"].get("nodeName") for p in pods), "extender mode: the operator does not bind"
    assert all(p["spec"]["schedulerName"] == "walras-scheduler" for p in pods)
    if cluster.real:
        real_scheduler_binds(cluster, op, ["resnet50", "transformer", "a3c"])
    else:
        for pod in pods:
            assert schedule(op, pod, NODES) == want[pod["metadata"]["name"]]
    bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in cluster.pods(NS, "walras.dev/job=transformer")}
    assert bound == planned(cluster, "transformer")
    # a second bind of a bound pod is refused, never applied twice
    pod = pods[0]
    again = post(op, "bind", {"PodName": pod["metadata"]["name"], "PodNamespace": NS,
                              "PodUID": pod["metadata"]["uid"], "Node": want[pod["metadata"]["name"]]})
    assert again.status_code == 200
    if cluster.emulated:
        uids = [b["uid"] for b in cluster.bindings() if b["namespace"] == NS]
        assert len(uids) == len(set(uids))
    text = op.metrics()
    assert 'walras_pods_bound_total{mode="extender"' in text
    assert 'walras_extender_requests_total{code="200",verb="filter"}' in text


def test_node_removal_replans_pending_pods(cluster: Cluster, op: Operator) -> None:
    """A node removed while a job's pods wait for the scheduler: they are re-planned elsewhere, then bound there."""
    job = (MANIFESTS / "jobs.yaml").read_text().split("---")[-1]
    cluster.apply_text(job.replace("name: a3c", "name: bert").replace("count: 1", "count: 2"))
    want = wait_until(lambda: check(planned(cluster, "bert"), lambda p: len(p) == 2), 60, "a plan for bert")
    wait_until(lambda: check(cluster.pods(NS, "walras.dev/job=bert"), lambda p: len(p) == 2), 60, "bert pods")
    doomed = sorted(set(want.values()))[0]
    cluster.remove_node(doomed)
    try:
        want = wait_until(lambda: check(planned(cluster, "bert"), lambda p: len(p) == 2 and doomed not in p.values()),
                          60, f"bert re-planned off {doomed}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {cluster.get('fungiblejob', 'bert', '-n', NS).get('status')}\n"
                             f"{op.output()[-3000:]}") from None
    if cluster.real:
        real_scheduler_binds(cluster, op, ["bert"])
    else:
        for pod in cluster.pods(NS, "walras.dev/job=bert"):
            assert schedule(op, pod, [n for n in NODES if n != doomed]) == want[pod["metadata"]["name"]]
    bound = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in cluster.pods(NS, "walras.dev/job=bert")}
    assert bound == want


def real_scheduler_binds(cluster: Cluster, op: Operator, jobs: list[str]) -> None:
    """The real kube-scheduler, configured with the chart's KubeSchedulerConfiguration (its profile
    ``walras-scheduler`` and the Walras extender, pointed at this operator's port), running as the chart's
    scheduler ServiceAccount with the chart's RBAC (leader election included), schedules the ``jobs``' planned pods
    through the extender: each ends up bound to its planned node and Running (kubelet stand-in); no node
    over-committed, no pod rejected by a node."""
    assert cluster.control_plane is not None
    cp = cluster.control_plane
    kubeconfig = cp.service_account_kubeconfig("walras-system", "walras-scheduler")
    config = scheduler_config_from_chart(cluster.chart, op.url("extender", "/scheduler"), kubeconfig,
                                         cluster.workdir / "walras-scheduler.yaml", leader_election=True)
    scheduler = cp.start_scheduler(config)
    problems: list[str] = []
    try:
        def all_bound() -> bool:
            pods = cluster.get("pods", "-A")["items"]
            problems[:] = [*overcommitted(cluster.get("nodes")["items"], pods), *rejected(pods)]
            want = {(p["name"], p.get("node")) for j in jobs for p in
                    (cluster.get("fungiblejob", j, "-n", NS).get("status") or {}).get("pods") or []}
            have = {(p["metadata"]["name"], p["spec"].get("nodeName")) for j in jobs
                    for p in cluster.pods(NS, f"walras.dev/job={j}") if p["status"].get("phase") == "Running"}
            return bool(want) and want == have and not problems

        try:
            wait_until(all_bound, 90, "kube-scheduler to bind every planned pod through the extender, Running")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {problems}\n{scheduler.tail(40)}\n{op.output()[-3000:]}") from None
    finally:
        scheduler.stop()
    text = op.metrics()
    for verb in ("filter", "bind"):  # prioritize: asked only when more than one node passes the filter
        assert f'walras_extender_requests_total{{code="200",verb="{verb}"}}' in text, text
    events = cluster.get("events", "-n", NS)["items"]
    assert any(e["reason"] == "Scheduled" and e.get("reportingComponent") == "walras-scheduler" for e in events), \
        [(e["reason"], e.get("reportingComponent")) for e in events]


def test_recorded_scheduler_requests(cluster: Cluster, op: Operator) -> None:
    unmanaged = json.loads((FIXTURES / "filter_unmanaged.json").read_text())
    result = post(op, "filter", unmanaged).json()
    assert result["nodenames"] == unmanaged["NodeNames"] and result["failedNodes"] == {}
    full = json.loads((FIXTURES / "filter_nodes.json").read_text())
    result = post(op, "filter", full).json()  # ml/resnet-0 is labelled managed but not in this cluster's plan
    assert result["nodes"]["items"] == []
    assert set(result["failedNodes"]) | set(result.get("failedAndUnresolvableNodes") or {}) == {
        n["metadata"]["name"] for n in full["Nodes"]["items"]}
    preempt = json.loads((FIXTURES / "preempt.json").read_text())
    answer = post(op, "preempt", preempt)
    assert answer.status_code == 200 and set(answer.json()) == {"nodeNameToMetaVictims"}
    bad = requests.post(op.url("extender", "/scheduler/prioritize"), data=b"[1,2", timeout=5)
    assert bad.status_code == 400 and "malformed prioritize request" in bad.json()["error"]
    missing = post(op, "filter", {"Pod": unmanaged["Pod"]})
    assert missing.status_code == 400 and missing.json()["error"]
