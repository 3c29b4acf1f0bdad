"""End to end, foreign preemption (issue 30 item 2, docs/refusals.md "Nominations"): extender mode on the real
control plane (kubelet stand-in). A pool of 2 x 4 GPUs is full of a low-priority Walras job (8 replicas, a
PodDisruptionBudget ``minAvailable: 7``; its pods take 3 s to exit), then a 4-GPU pod of PriorityClass ``high`` for
the default scheduler arrives.

* **The real preemption**, with two real kube-schedulers: the chart's (profile ``walras-scheduler``, the Walras
  extender) and the cluster's default one. kube-scheduler preempts the 4 Walras pods of one node and nominates it;
  the foreign pod binds and runs, the preemption happens once (4 victims), re-creations stay bounded (<= 4), and
  Walras itself evicts or deletes none of the job's running pods. In this harness the default scheduler binds the
  pod within milliseconds of its victims' exit, before a plan could refill the room, so this test passes with and
  without the reservation (measured: 0 re-creations either way).
* **The nomination as kube-scheduler writes it** (no default scheduler running, so nothing races the plan): the
  foreign pod's ``status.nominatedNodeName`` patched through the status sub-resource and its 4 victims deleted, as
  kube-scheduler's preemption does. The plan reserves the pod's requests on the nominated node: no Walras pod is
  re-created onto it while the nomination stands (without the reservation the same test sees the 4 pods re-created
  there: docs/refusals.md), and once the default scheduler starts, the foreign pod binds there and runs.
* **One scheduler whose extender binds** (the chart's only, the pod naming it): kube-scheduler preempts and sends
  the foreign pod's binding to the extender, which binds it where the node has room (before: refused, Pending).

The shared invariants (no over-commit, no pod rejected by a node) hold at the end of each."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from e2e.conftest import Cluster, Operator, check, wait_until
from e2e.invariants import overcommitted, rejected
from tests.controlplane import scheduler_config_from_chart

pytestmark = pytest.mark.e2e
NS = "e2e"
#: the chart's second scheduler and the operator's extender mode (as e2e/test_e2e_extender.py)
CHART_VALUES = ("operator.mode=extender", "scheduler.enabled=true", "extender.tls.enabled=true",
                "extender.tls.secretName=walras-extender-tls", "extender.tls.clientCA=unused",
                "scheduler.extender.clientCertSecretName=walras-scheduler-client")
JOB = {"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob", "metadata": {"name": "low", "namespace": NS},
       "spec": {"throughput": {"e2e-v100": 1.0}, "utility": {"type": "linear"}, "demand": 1, "replicas": {"count": 8},
                "template": {"metadata": {"annotations": {"kubelet.walras.dev/stop-seconds": "3"}},  # exits in 3 s
                             "spec": {"containers": [{"name": "c", "image": "registry.invalid/x:1"}]}}}}
PDB = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "low", "namespace": NS},
       "spec": {"minAvailable": 7, "selector": {"matchLabels": {"walras.dev/job": "low"}}}}
HIGH = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "high"},
        "value": 1000000, "description": "e2e: preempts the Walras job"}
FOREIGN = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "foreign", "namespace": NS},
           "spec": {"schedulerName": "default-scheduler", "priorityClassName": "high",
                    "nodeSelector": {"e2e.walras.dev/gpu": "v100"},
                    "containers": [{"name": "c", "image": "registry.invalid/big:1",
                                    "resources": {"requests": {"nvidia.com/gpu": "4"},
                                                  "limits": {"nvidia.com/gpu": "4"}}}]}}


@pytest.fixture(scope="module")
def setup(cluster: Cluster) -> Iterator[Cluster]:
    if not cluster.real:
        pytest.skip("kube-scheduler's preemption needs the real control plane")
    cluster.apply_text("\n---\n".join(json.dumps(o) for o in (HIGH, PDB)))
    try:
        yield cluster
    finally:
        cluster.kc("delete", "pod", "foreign", "-n", NS, "--grace-period=0", "--force", check=False)
        cluster.kc("delete", "pdb", "low", "-n", NS, check=False)
        cluster.kc("delete", "priorityclass", "high", check=False)


def _low(cluster: Cluster) -> list[dict[str, Any]]:
    return cluster.pods(NS, "walras.dev/job=low")


def _running(cluster: Cluster) -> list[dict[str, Any]]:
    return [p for p in _low(cluster) if p["status"].get("phase") == "Running"]


@contextmanager
def _walras(cluster: Cluster) -> Iterator[tuple[Operator, Any]]:
    """The operator in extender mode and the chart's kube-scheduler (profile walras-scheduler, the extender), with
    the job's 8 pods Running."""
    assert cluster.control_plane is not None
    cp = cluster.control_plane
    op = Operator(cluster, "extender").start()
    kubeconfig = cp.service_account_kubeconfig("walras-system", "walras-scheduler")
    config = scheduler_config_from_chart(cluster.chart, op.url("extender", "/scheduler"), kubeconfig,
                                         cluster.workdir / "walras-scheduler.yaml")
    scheduler = cp.start_scheduler(config)
    try:
        cluster.apply_text(json.dumps(JOB))
        try:
            wait_until(lambda: check(len(_running(cluster)), lambda n: n == 8), 120, "the 8 pods of low Running")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{scheduler.tail(30)}\n{op.output()[-3000:]}") from None
        yield op, scheduler
    finally:
        scheduler.stop()
        op.stop()


def _walras_removals(cluster: Cluster) -> list[dict[str, Any]]:
    return [e for e in cluster.get("events", "-n", NS)["items"] if e["involvedObject"]["kind"] == "FungibleJob"
            and e["involvedObject"]["name"] == "low" and e["reason"] in ("Evicted", "SuccessfulDelete")]


def _sound(cluster: Cluster) -> None:
    pods = cluster.get("pods", "-A")["items"]
    assert overcommitted(cluster.get("nodes")["items"], pods) == [] and rejected(pods) == []


def _apply_and_watch(cluster: Cluster, pod: dict[str, Any], limit: float, stay: float
                     ) -> tuple[dict[str, Any], float, float | None, int]:
    """Apply the foreign ``pod`` and watch it for at most ``limit`` s, until it has been Running for ``stay`` s:
    ``(the pod as last read, when it was applied, when it was first seen Running or None, Walras pods of low
    re-created meanwhile)``."""
    original = {p["metadata"]["uid"] for p in _low(cluster)}
    seen = set(original)
    name = pod["metadata"]["name"]
    cluster.apply_text(json.dumps(pod))
    started = time.monotonic()
    bound_at: float | None = None
    current: dict[str, Any] = {}
    while time.monotonic() - started < limit:
        seen |= {p["metadata"]["uid"] for p in _low(cluster)}
        current = cluster.get("pod", name, "-n", NS)
        if bound_at is None and current["status"].get("phase") == "Running":
            bound_at = time.monotonic()
        if bound_at is not None and time.monotonic() - bound_at > stay:  # and it stays so
            break
        time.sleep(0.5)
    return current, started, bound_at, len(seen - original)


def test_a_foreign_preemption_ends_with_the_pod_running_and_no_livelock(setup: Cluster) -> None:
    cluster = setup
    assert cluster.control_plane is not None
    with _walras(cluster) as (op, _):
        default_scheduler = cluster.control_plane.start_scheduler()  # the default profile, preemption on
        try:
            foreign, started, bound_at, recreated = _apply_and_watch(cluster, FOREIGN, 90, 15)
            events = cluster.get("events", "-n", NS)["items"]
            preempted = sum(int(e.get("count") or 1) for e in events if e["reason"] == "Preempted")
            removals = _walras_removals(cluster)
            running = _running(cluster)
            print(f"live: foreign {foreign['status'].get('phase')} on {foreign['spec'].get('nodeName')} after "
                  f"{(bound_at or time.monotonic()) - started:.1f} s; Preempted events {preempted}, re-created "
                  f"{recreated}, low Running {len(running)}, Walras removals {len(removals)}")
            assert bound_at is not None, (f"the foreign pod is {foreign['status']}\n{default_scheduler.tail(30)}\n"
                                          f"{op.output()[-3000:]}")
            assert foreign["spec"]["nodeName"].startswith("e2e-v100-")
            assert preempted <= 4, preempted  # one preemption, 4 victims
            assert recreated <= 4, recreated
            assert removals == [], removals
            assert len(running) == 4  # the other node's 4 pods, untouched
            _sound(cluster)
            assert "Traceback" not in op.output()
        finally:
            default_scheduler.stop()
            cluster.kc("delete", "pod", "foreign", "-n", NS, "--grace-period=0", "--force", check=False)
            cluster.kc("delete", "fungiblejob", "low", "-n", NS, "--wait=false", check=False)
            cluster.kc("delete", "pods", "-n", NS, "-l", "walras.dev/job=low", "--grace-period=0", "--force",
                       check=False)


def test_no_pod_is_recreated_onto_a_nominated_node(setup: Cluster) -> None:
    cluster = setup
    assert cluster.control_plane is not None
    cluster.clear_jobs(NS)
    with _walras(cluster) as (op, _):
        cluster.apply_text(json.dumps(FOREIGN))  # no default scheduler yet: it stays Pending
        target = "e2e-v100-1"
        victims = [p for p in _running(cluster) if p["spec"]["nodeName"] == target]
        assert len(victims) == 4
        # what kube-scheduler's preemption writes: the nomination, then the victims' deletion
        cluster.kc("patch", "pod", "foreign", "-n", NS, "--subresource=status", "--type=merge", "-p",
                   json.dumps({"status": {"nominatedNodeName": target}}))
        for victim in victims:
            cluster.kc("delete", "pod", victim["metadata"]["name"], "-n", NS, "--wait=false")
        original = {p["metadata"]["uid"] for p in victims}
        wait_until(lambda: not ({p["metadata"]["uid"] for p in _low(cluster)} & original), 60, "the victims gone")
        onto: set[str] = set()
        deadline = time.monotonic() + 20  # > 6 plan periods of 3 s
        while time.monotonic() < deadline:
            onto |= {p["metadata"]["uid"] for p in _low(cluster) if p["spec"].get("nodeName") == target}
            time.sleep(0.5)
        planned = [p for p in (cluster.get("fungiblejob", "low", "-n", NS).get("status") or {}).get("pods") or []
                   if p.get("node") == target]
        print(f"live: Walras pods bound to the nominated {target} within 20 s: {len(onto)}; planned there "
              f"{len(planned)}; low Running {len(_running(cluster))}")
        assert onto == set() and planned == [], (onto, planned, op.output()[-3000:])
        assert _walras_removals(cluster) == []
        default_scheduler = cluster.control_plane.start_scheduler()
        try:
            foreign = wait_until(lambda: check(cluster.get("pod", "foreign", "-n", NS),
                                               lambda p: p["status"].get("phase") == "Running"), 60,
                                 "the foreign pod Running")
        finally:
            default_scheduler.stop()
        assert foreign["spec"]["nodeName"] == target
        _sound(cluster)
        assert "Traceback" not in op.output()


def test_one_scheduler_whose_extender_binds_runs_the_foreign_preemptor(setup: Cluster) -> None:
    """The issue's livelock scenario with a single kube-scheduler (the chart's, its extender the binder:
    ``bindVerb``) and no default scheduler: the high-priority pod names that scheduler. kube-scheduler preempts 4
    Walras pods of one node and nominates it, then asks the extender to bind the pod; Walras, the binder of every
    pod sent to it, binds the foreign pod as the default binder would once the node has room
    (``Controller.bind_foreign``). Before: the bind was refused ("Walras binds only the pods it manages") and the pod
    stayed Pending. The pod ends Running, one preemption (4 victims), Walras removes no pod of the job itself (the
    PodDisruptionBudget is never bypassed by Walras), nothing over-committed."""
    cluster = setup
    assert cluster.control_plane is not None
    cluster.kc("delete", "pod", "foreign", "-n", NS, "--grace-period=0", "--force", check=False)
    cluster.clear_jobs(NS)
    one = {**FOREIGN, "metadata": {"name": "foreign-one", "namespace": NS},
           "spec": {**FOREIGN["spec"], "schedulerName": "walras-scheduler"}}
    with _walras(cluster) as (op, scheduler):
        try:
            mine = {p["metadata"]["uid"] for p in _low(cluster)}  # the earlier tests' Events name other pods
            pod, started, bound_at, recreated = _apply_and_watch(cluster, one, 30, 3)
            events = cluster.get("events", "-n", NS)["items"]
            preempted = sum(int(e.get("count") or 1) for e in events if e["reason"] == "Preempted"
                            and e["involvedObject"].get("uid") in mine)
            refused = sum(int(e.get("count") or 1) for e in events if e["involvedObject"]["name"] == "foreign-one"
                          and "binds only the pods it manages" in (e.get("message") or ""))
            running = _running(cluster)
            print(f"live (one scheduler, extender binds): foreign-one {pod['status'].get('phase')} on "
                  f"{pod['spec'].get('nodeName')} after {(bound_at or time.monotonic()) - started:.1f} s; Preempted "
                  f"events {preempted}, refused bindings {refused}, re-created {recreated}, low Running "
                  f"{len(running)}, Walras removals {len(_walras_removals(cluster))}")
            assert bound_at is not None, (f"foreign-one is {pod['status']}\n{scheduler.tail(30)}\n"
                                          f"{op.output()[-3000:]}")
            assert pod["spec"]["nodeName"].startswith("e2e-v100-")
            assert preempted <= 4, preempted
            assert recreated <= 4
            assert _walras_removals(cluster) == []
            assert len(running) == 4  # the other node's 4 pods, untouched
            _sound(cluster)
            assert "Traceback" not in op.output()
        finally:
            cluster.kc("delete", "pod", "foreign-one", "-n", NS, "--grace-period=0", "--force", check=False)
            cluster.kc("delete", "fungiblejob", "low", "-n", NS, "--wait=false", check=False)
            cluster.kc("delete", "pods", "-n", NS, "-l", "walras.dev/job=low", "--grace-period=0", "--force",
                       check=False)
