"""Node fit on every resource in every policy, taints/tolerations, nodeSelector and node affinity, and rounding that
cannot overfill or overflow (hypothesis over all finite inputs)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from walras.kube.decode import cluster_from
from walras.planner import Snapshot
from walras.planner.invariants import check_plan
from walras.planner.replicas import largest_remainder, largest_remainder_rows

from tests.planning import build_plan

POLICIES = ["utility", "throughput", "fair", "colocation"]
PROFILE = {"kind": "ColocationProfile", "metadata": {"name": "prof"},
           "spec": {"types": ["a", "b"], "interference": [[0.1, 0.3], [0.2, 0.1]]}}


def node(name: str, cpu: str = "16", memory: str = "64Gi", gpu: str = "4", pods: str = "110",
         labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": {"pool": "t4", **(labels or {})}},
            "spec": {"taints": taints or []},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpu, "pods": pods},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pool(policy: str, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": {"pool": "t4"}, "resource": "nvidia.com/gpu", "policy": {"type": policy},
                            **extra}
    if policy == "colocation":
        spec["policy"]["colocation"] = {"profile": "prof"}
    return {"kind": "ResourcePool", "metadata": {"name": "t4"}, "spec": spec}


def job(name: str, count: int, cpu: str, memory: str, template_spec: dict[str, Any] | None = None,
        demand: float = 1) -> dict[str, Any]:
    return {"kind": "FungibleJob", "metadata": {"name": name, "namespace": "ml", "generation": 1},
            "spec": {"throughput": {"t4": 2.0}, "utility": {"type": "linear"}, "replicas": {"count": count},
                     "demand": demand, "resources": {"cpu": cpu, "memory": memory}, "colocation": {"type": "a"},
                     "template": {"spec": {"containers": [{"name": "c", "image": "x"}], **(template_spec or {})}}}}


def plan_for(policy: str, nodes: list[dict[str, Any]], jobs: list[dict[str, Any]],
             pods: tuple[dict[str, Any], ...] = ()) -> tuple[Snapshot, Any]:
    snap = Snapshot(nodes=tuple(nodes), pods=pods, pools=(pool(policy),), jobs=tuple(jobs), profiles=(PROFILE,))
    return snap, build_plan(snap)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_fits_cpu_and_memory_not_only_the_priced_gpus(policy: str) -> None:
    # the issue's T4 node: 16 cpu / 64 Gi / 4 GPUs. Pods of 6 cpu / 20 Gi / 1 GPU: 2 per node by cpu, not 4 by GPU
    nodes = [node(f"t4-{k}") for k in range(3)]
    snap, plan = plan_for(policy, nodes, [job("big", 12, "6", "20Gi")])
    assert check_plan(cluster_from(snap), plan) == []
    per_node: dict[str, int] = {}
    for p in plan.pods:
        if p.node is not None and p.action == "create":
            per_node[p.node] = per_node.get(p.node, 0) + 1
    assert per_node and max(per_node.values()) <= 2, per_node
    jp = plan.jobs[("ml", "big")]
    assert sum(jp.replicas.values()) == sum(per_node.values()) <= 6
    if sum(jp.wanted.values()) > sum(jp.replicas.values()):
        (scheduled,) = [c for c in jp.conditions if c.type == "Scheduled"]
        # every node keeps 2 GPUs free but only 16 - 2 * 6 = 4 cpu: the rule that keeps the rest out is the cpu fit
        # (issue 28: one reason per rule, the cpu shortfall named with its number), not the priced GPUs' capacity
        assert scheduled.status == "False" and scheduled.reason == "InsufficientCpu", scheduled
        (placeable,) = [c for c in jp.conditions if c.type == "ReplicasPlaceable"]
        assert placeable.reason == "InsufficientCpu" and "cpu short by 2" in placeable.message, placeable


@pytest.mark.parametrize("policy", ["throughput", "fair", "utility"])
def test_foreign_and_terminating_pods_count_on_their_node(policy: str) -> None:
    nodes = [node("t4-0", cpu="16")]
    foreign = {"kind": "Pod", "metadata": {"name": "other", "namespace": "x"},
               "spec": {"nodeName": "t4-0", "containers": [{"name": "c", "resources": {"requests": {"cpu": "10"}}}]},
               "status": {"phase": "Running"}}
    leaving = {"kind": "Pod", "metadata": {"name": "leaving", "namespace": "x",
                                           "deletionTimestamp": "2026-01-01T00:00:00Z"},
               "spec": {"nodeName": "t4-0", "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
               "status": {"phase": "Running"}}
    snap, plan = plan_for(policy, nodes, [job("j", 4, "1500m", "1Gi")], pods=(foreign, leaving))
    assert check_plan(cluster_from(snap), plan) == []
    assert sum(1 for p in plan.pods if p.action == "create" and p.node) == 2  # 16 - 10 - 2 = 4 cpu: two pods


def test_pod_count_limit_of_a_node_is_respected() -> None:
    snap, plan = plan_for("throughput", [node("t4-0", pods="3", cpu="64")], [job("j", 4, "1", "1Gi")])
    assert sum(1 for p in plan.pods if p.action == "create" and p.node) == 3
    assert check_plan(cluster_from(snap), plan) == []


def test_taints_need_a_toleration() -> None:
    taint = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]
    nodes = [node("t4-0", taints=taint), node("t4-1")]
    _, plan = plan_for("throughput", nodes, [job("plain", 2, "1", "1Gi")])
    assert {p.node for p in plan.pods if p.action == "create"} == {"t4-1"}
    tolerant = job("tolerant", 8, "1", "1Gi", {"tolerations": [{"key": "dedicated", "operator": "Equal",
                                                                  "value": "gpu", "effect": "NoSchedule"}]})
    _, plan = plan_for("throughput", nodes, [tolerant])
    assert {p.node for p in plan.pods if p.action == "create"} == {"t4-0", "t4-1"}


def test_node_selector_and_required_affinity_of_the_template() -> None:
    nodes = [node("t4-0", labels={"zone": "a"}), node("t4-1", labels={"zone": "b"}), node("t4-2")]
    selected = job("sel", 8, "1", "1Gi", {"nodeSelector": {"zone": "a"}})
    _, plan = plan_for("fair", nodes, [selected])
    assert {p.node for p in plan.pods if p.action == "create"} == {"t4-0"}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}]}}}
    _, plan = plan_for("throughput", nodes, [job("aff", 8, "1", "1Gi", {"affinity": affinity})])
    assert {p.node for p in plan.pods if p.action == "create"} == {"t4-1", "t4-2"}
    nowhere = job("nowhere", 2, "1", "1Gi", {"nodeSelector": {"zone": "mars"}})
    _, plan = plan_for("throughput", nodes, [nowhere])
    jp = plan.jobs[("ml", "nowhere")]
    assert jp.phase == "Unschedulable"
    assert [c.reason for c in jp.conditions if c.type == "Schedulable"] == ["NoEligibleNode"]


def test_unschedulable_and_not_ready_nodes_get_no_new_pod() -> None:
    cordoned = node("t4-0")
    cordoned["spec"]["unschedulable"] = True
    down = node("t4-1")
    down["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    _, plan = plan_for("throughput", [cordoned, down, node("t4-2")], [job("j", 8, "1", "1Gi")])
    assert {p.node for p in plan.pods if p.action == "create"} == {"t4-2"}


clusters = st.fixed_dictionaries({
    "policy": st.sampled_from(POLICIES),
    "nodes": st.lists(st.tuples(st.sampled_from(["4", "8", "16"]), st.sampled_from(["8Gi", "32Gi", "64Gi"]),
                                st.sampled_from(["1", "2", "4"]), st.sampled_from(["3", "110"])),
                      min_size=1, max_size=4),
    "jobs": st.lists(st.tuples(st.integers(1, 6), st.sampled_from(["500m", "1", "3", "6"]),
                               st.sampled_from(["1Gi", "8Gi", "24Gi"]), st.sampled_from([1, 2])),
                     min_size=1, max_size=4),
    "degree": st.one_of(st.none(), st.integers(1, 3)),
})


@given(clusters)
def test_no_plan_over_commits_any_node_on_any_resource(case: dict[str, Any]) -> None:
    nodes = [node(f"t4-{k}", cpu=c, memory=m, gpu=g, pods=p) for k, (c, m, g, p) in enumerate(case["nodes"])]
    jobs = [job(f"j{i}", n, c, m, demand=d) for i, (n, c, m, d) in enumerate(case["jobs"])]
    extra = {} if case["degree"] is None else {"degreeLimit": case["degree"]}
    snap = Snapshot(nodes=tuple(nodes), pools=({**pool(case["policy"]), "spec": {**pool(case["policy"])["spec"],
                                                                                 **extra}},),
                    jobs=tuple(jobs), profiles=(PROFILE,))
    plan = build_plan(snap)
    assert check_plan(cluster_from(snap), plan) == []
    for jp in plan.jobs.values():  # status counts what has a node
        assert sum(jp.replicas.values()) == sum(1 for p in jp.pods if p.node is not None and p.action != "delete")


finite = st.floats(min_value=0.0, max_value=1.7e308, allow_nan=False, allow_infinity=False, allow_subnormal=True)


@given(st.lists(finite, min_size=1, max_size=6), st.integers(0, 10**6),
       st.one_of(st.none(), st.lists(st.integers(0, 10**6), min_size=6, max_size=6)))
def test_largest_remainder_never_overfills_or_overflows(shares: list[float], total: int,
                                                         cap: list[int] | None) -> None:
    x = np.array(shares)
    limit = None if cap is None else np.array(cap[: x.size])
    expected = total if limit is None else min(total, int(limit.sum()))
    if expected > 0 and not np.any(x > 0):
        with pytest.raises(ValueError, match="all zero"):
            largest_remainder(x, total, limit)
        return
    out = largest_remainder(x, total, limit)
    assert out.dtype == np.int64 and np.all(out >= 0)
    assert int(out.sum()) == expected
    if limit is not None:
        assert np.all(out <= limit)
    else:
        assert np.all(out[x == 0] == 0) or not np.any(x > 0)


def test_the_issue_rounding_cases() -> None:
    assert largest_remainder_rows(np.array([[0.0, 0.0, 2.2e-308]]), np.array([4])).tolist() == [[0, 0, 4]]
    assert largest_remainder(np.array([1.7e308, 1.7e308, 5e-324]), 3).tolist() == [2, 1, 0]
    assert largest_remainder(np.array([1.5, 2.5, 0.0]), 4).tolist() == [2, 2, 0]  # within one of each share
    assert largest_remainder(np.array([3.0, 1.0]), 4, np.array([1, 5])).tolist() == [1, 3]
