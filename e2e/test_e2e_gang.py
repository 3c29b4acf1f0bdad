"""Gang jobs (docs/gangs.md) on the REAL control plane (kube-apiserver, kube-controller-manager; nodes played by the
kubelet stand-in), the operator running as the chart's ServiceAccount with the chart's RBAC and the real planner.

* a gang of 4 on 2 nodes x 2 GPUs runs 4 pods;
* one of its nodes NotReady past the node-loss grace: its pods are force-deleted, the other node has no room for
  replacements, so the gang is released whole (the remaining pods evicted through the Eviction API), never left
  with 2 of 4; the job says ``GangNotPlaceable``;
* a gang that cannot fit (5 on 2 x 2 GPUs) creates no pod and says why.

Every plan the operator makes is checked with :func:`walras.planner.invariants.check_plan` (``PartialGang`` among
them), and the live cluster with ``walras check``'s invariants where it has settled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from walras.operator import OperatorOptions
from walras.planner.cluster import Cluster
from walras.planner.invariants import check_plan
from walras.planner.model import Plan

from tests.lifecycle_support import OperatorThread, wait_for
from tests.test_lifecycle_e2e import NODE_LOSS_GRACE, Env, invariants, job_doc, live, setup_pool, status
from tests.test_lifecycle_e2e import env as env


class CheckedPlanner:
    """The real planner, every plan it makes checked against its cluster (``check_plan``); what breaks is kept."""

    def __init__(self) -> None:
        from walras.planner import build_plan

        self.build_plan = build_plan
        self.broken: list[str] = []
        self.plans = 0
        self.lock = threading.Lock()

    def __call__(self, cluster: Cluster, *args: Any, **kwargs: Any) -> Plan:
        plan = self.build_plan(cluster, *args, **kwargs)
        found = [f"{v.kind} {v.object}: {v.message}" for v in check_plan(cluster, plan)]
        with self.lock:
            self.plans += 1
            self.broken.extend(found)
        return plan


@pytest.fixture(scope="module")
def planner() -> CheckedPlanner:
    return CheckedPlanner()


@pytest.fixture(scope="module")
def walras(env: Env, planner: CheckedPlanner) -> Iterator[OperatorThread]:
    options = OperatorOptions(namespaces=(env.namespace,), debounce=0.1, plan_period=1.0, identity="gang-e2e",
                              node_loss_grace=NODE_LOSS_GRACE)
    operator = OperatorThread(env.operator_kubeconfig, planner, options).start()
    yield operator
    operator.stop()


def gang_doc(env: Env, name: str, pool_name: str, count: int) -> dict[str, Any]:
    doc = job_doc(env, name, {pool_name: 1.0}, count)
    doc["spec"]["replicas"] = {"count": count, "gang": True}
    return doc


def condition(env: Env, job: str, kind: str) -> dict[str, Any] | None:
    return next((c for c in status(env, job).get("conditions") or [] if c.get("type") == kind), None)


def test_gang_runs_whole_and_is_released_whole_when_a_node_is_lost(env: Env, walras: OperatorThread,
                                                                   planner: CheckedPlanner) -> None:
    pool_name, nodes = setup_pool(env, "gang", 2, gpus=2)
    env.apply(gang_doc(env, "g4", pool_name, 4))
    pods = wait_for(lambda: (lambda ok: ok if len(ok) == 4 else None)(live(env.pods("g4"))), 40,
                    "the gang's 4 pods Running")
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted([nodes[0], nodes[0], nodes[1], nodes[1]])
    time.sleep(2.0)  # settled: the plans of a running gang keep it whole
    assert invariants(env) == []
    lost = nodes[0]
    env.kubelet.lose_node(lost)
    counts: list[int] = []

    def released() -> bool:
        current = [p for p in env.pods("g4") if not p["metadata"].get("deletionTimestamp")
                   and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        counts.append(len(current))
        return not current

    wait_for(released, 60, "the gang released whole after its node was lost past the grace")
    gang = wait_for(lambda: condition(env, "g4", "GangPlaced"), 20, "the GangPlaced condition")
    assert gang["reason"] == "GangNotPlaceable" and "gang of 4 needs 4 replicas in one pool" in gang["message"], gang
    # it stays released: no partial gang is created on the one node left (2 GPUs)
    time.sleep(3.0)
    assert not live(env.pods("g4"))
    with planner.lock:
        assert planner.plans > 0 and planner.broken == [], planner.broken
    env.kubelet.remove_node(lost)
    env.kc("delete", "fungiblejob", "g4", "-n", env.namespace, "--wait=false")


def test_gang_that_cannot_fit_creates_no_pod(env: Env, walras: OperatorThread,
                                             planner: CheckedPlanner) -> None:
    pool_name, _ = setup_pool(env, "big", 2, gpus=2)
    env.apply(gang_doc(env, "g5", pool_name, 5))
    gang = wait_for(lambda: condition(env, "g5", "GangPlaced"), 30, "the GangPlaced condition of g5")
    assert gang["reason"] == "GangNotPlaceable" and "can place 4" in gang["message"], gang
    time.sleep(3.0)
    assert env.pods("g5") == []
    assert invariants(env) == []
    with planner.lock:
        assert planner.broken == [], planner.broken
