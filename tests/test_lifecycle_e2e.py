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
from walras.kubelet import KubeletThread
from walras.operator import OperatorOptions
from walras.planner.model import PodPlan

from tests.controlplane import ControlPlane, install_chart_identity
from tests.lifecycle_support import OperatorThread, ScriptedPlanner, fungible_job, gpu_node, wait_for
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

    def pods(self, job: str) -> list[dict[str, Any]]:
        items = self.cp.get("pods", "-n", self.namespace, "-l", f"walras.dev/job={job}")["items"]
        return list(items)

    def events(self, reason: str, name: str) -> list[dict[str, Any]]:
        items = self.cp.get("events", "-n", self.namespace, "--field-selector", f"reason={reason}")["items"]
        return [e for e in items if e["involvedObject"]["name"] == name]

    def job(self, name: str) -> dict[str, Any]:
        return dict(self.cp.get("fungiblejob", name, "-n", self.namespace))

    def pdb(self, name: str, min_available: int, selector: dict[str, str]) -> None:
        self.apply({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
                    "spec": {"minAvailable": min_available, "selector": {"matchLabels": selector}}})

        def observed() -> bool:
            pdb = self.cp.get("pdb", name, "-n", self.namespace)
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
        cp.kubectl("delete", "pods,events,pdb", "--all", "-n", namespace, "--grace-period=0", "--force", check=False)
        kubelet.stop(delete_nodes=True)
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
