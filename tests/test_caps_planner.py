"""Caps hold in placed plans: a pool never sells beyond ``spec.capacity`` (a pending pod included), no pending pod
is lost when a pool sells nothing, and a tenant's Budget cap holds under assign-and-allocate's variable amounts
(``utility`` pools, paper 000). The checks are :mod:`walras.planner.invariants`' (``PoolOverCapacity``,
``LostPod``, ``BudgetCapExceeded`` on a plan), each shown to fire on a plan that breaks it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from walras.kube.decode import cluster_from
from walras.manifests.loader import load_manifests, parse_documents
from walras.planner import Snapshot, build_plan
from walras.planner.invariants import check_plan
from walras.planner.model import Plan
from walras.planner.plan import PlanOptions
from walras.planner.tenants import TenantOptions

ROOT = Path(__file__).resolve().parents[1]


def _node(name: str) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": {"gpu": "a"}}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "32"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _pod(name: str, node: str | None = None, phase: str = "Running", job: str = "j0") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}
    if node:
        spec["nodeName"] = node
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "ml", "uid": "uid-" + name,
                                        "labels": {"walras.dev/job": job, "walras.dev/pool": "a",
                                                   "walras.dev/managed": "true"}},
            "spec": spec, "status": {"phase": phase}}


def _pool(capacity: int | None, policy: str = "utility") -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": {"gpu": "a"}, "resource": "nvidia.com/gpu", "policy": {"type": policy}}
    if capacity is not None:
        spec["capacity"] = capacity
    return {"kind": "ResourcePool", "metadata": {"name": "a"}, "spec": spec}


def _job(name: str = "j0", count: int = 3) -> dict[str, Any]:
    return {"kind": "FungibleJob", "metadata": {"name": name, "namespace": "ml", "generation": 3},
            "spec": {"throughput": {"a": 1.0}, "utility": {"type": "linear"}, "replicas": {"count": count},
                     "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}, "suspend": False,
                     "backoffLimit": 0}}


def _repro(capacity: int) -> Snapshot:
    """The issue's cluster: two 8-GPU nodes, j0 (3 replicas) runs j0-a-0 on a0, j0-a-1 is Pending and unbound."""
    return Snapshot(nodes=(_node("a0"), _node("a1")), pods=(_pod("j0-a-0", "a0"), _pod("j0-a-1", None, "Pending")),
                    pools=(_pool(capacity),), jobs=(_job(),))


def _plan(snap: Snapshot) -> Plan:
    return build_plan(cluster_from(snap), None, options=PlanOptions(now=None))


def _actions(plan: Plan) -> dict[str, tuple[str, str | None]]:
    return {p.name: (p.action, p.node) for p in plan.pods}


def test_a_pool_of_capacity_0_loses_no_pending_pod_and_grants_nothing() -> None:
    snap = _repro(0)
    plan = _plan(snap)
    assert check_plan(cluster_from(snap), plan) == []
    # the pending pod never started: deleted; the running one: its pool's kept replicas (1) exceed what it sells
    # (0), so it goes through the Eviction API (rounds.py: an oversold pool's jobs shrink to the market's rounding)
    assert _actions(plan) == {"j0-a-0": ("evict", "a0"), "j0-a-1": ("delete", None)}
    conditions = {c.type: c for c in plan.jobs[("ml", "j0")].conditions}
    assert "granted 0 of 3" in conditions["ReplicasGranted"].message
    assert conditions["ReplicasGranted"].reason == "PoolCapacity"
    assert not any(c.type == "CapacityIdle" for c in plan.pools["a"].conditions)


def test_a_pending_pod_is_not_bound_beyond_spec_capacity() -> None:
    snap = _repro(1)
    plan = _plan(snap)
    cluster = cluster_from(snap)
    assert check_plan(cluster, plan) == []
    assert _actions(plan) == {"j0-a-0": ("keep", "a0"), "j0-a-1": ("keep", None)}
    pending = next(p for p in plan.pods if p.name == "j0-a-1")
    assert "PoolCapacity" in pending.reason
    # the checker fires on the plan the planner used to make (j0-a-1 bound to a1: 2 GPUs against capacity 1)
    bound = dataclasses.replace(plan, pods=tuple(dataclasses.replace(p, action="bind", node="a1")
                                                 if p.name == "j0-a-1" else p for p in plan.pods))
    kinds = [v.kind for v in check_plan(cluster, bound)]
    assert kinds == ["PoolOverCapacity"]
    # ... and not when the plan evicts the running pod it would replace
    swapped = dataclasses.replace(bound, pods=tuple(dataclasses.replace(p, action="evict")
                                                    if p.name == "j0-a-0" else p for p in bound.pods))
    assert check_plan(cluster, swapped) == []


def test_the_plan_of_the_capped_plan_is_a_fixed_point() -> None:
    snap = _repro(1)
    first = _plan(snap)
    second = build_plan(cluster_from(snap), first, options=PlanOptions(now=None))
    assert _actions(second) == _actions(first)


BUDGET = """
apiVersion: walras.dev/v1alpha1
kind: Budget
metadata: {name: ml}
spec:
  share: 2
  namespaces: [ml]
  caps: [{pool: v100, maxUnits: 4}]
"""


def test_a_budget_cap_holds_in_a_utility_pool_under_assign_and_allocate() -> None:
    snap = load_manifests([ROOT / "examples", ROOT / "operator" / "walras" / "data" / "emulated-nodes.yaml"])
    budget = parse_documents([__import__("yaml").safe_load(BUDGET)])
    snap = dataclasses.replace(snap, budgets=snap.budgets + budget.budgets)
    cluster = cluster_from(snap)
    plan = build_plan(cluster, options=PlanOptions(tenants=TenantOptions()))
    assert next(p for p in cluster.pools if p.name == "v100").spec.policy == "utility"
    held = sum(float(p.requests["nvidia.com/gpu"]) for p in plan.pods
               if p.namespace == "ml" and p.pool == "v100" and p.node is not None
               and p.action in ("create", "bind", "keep", "resize"))
    assert 0 < held <= 4
    assert plan.tenants["ml"].units["v100"] == held
    assert check_plan(cluster, plan) == []
    # the checker fires on AA's amounts beyond the cap (the plan the planner used to make: 2 GPUs per pod)
    doubled = dataclasses.replace(plan, pods=tuple(
        dataclasses.replace(p, requests={**p.requests, "nvidia.com/gpu": "2"})
        if p.namespace == "ml" and p.pool == "v100" else p for p in plan.pods))
    assert "BudgetCapExceeded" in [v.kind for v in check_plan(cluster, doubled)]


@st.composite
def _capped(draw: st.DrawFn) -> Snapshot:
    """One pool of 1-3 nodes of 1-3 GPUs, a spec.capacity in 0..5 (or none), 1-3 jobs with running (bound) and
    pending (unbound) pods."""
    nodes = []
    for k in range(draw(st.integers(1, 3))):
        n = _node(f"a{k}")
        n["status"]["allocatable"]["nvidia.com/gpu"] = str(draw(st.integers(1, 3)))
        nodes.append(n)
    capacity = draw(st.one_of(st.none(), st.integers(0, 5)))
    jobs, pods = [], []
    used = {f"a{k}": 0 for k in range(len(nodes))}
    for j in range(draw(st.integers(1, 3))):
        name = f"j{j}"
        jobs.append(_job(name, draw(st.integers(0, 4))))
        for q in range(draw(st.integers(0, 4))):
            where = draw(st.sampled_from([*used, None]))
            if where is not None and used[where] >= int(nodes[int(where[1:])]["status"]["allocatable"][
                    "nvidia.com/gpu"]):
                where = None  # the cluster itself is never over-committed
            if where is not None:
                used[where] += 1
            pods.append(_pod(f"{name}-a-{q}", where, "Running" if where else "Pending", job=name))
    policy = draw(st.sampled_from(["utility", "throughput", "spread"]))
    return Snapshot(nodes=tuple(nodes), pods=tuple(pods), pools=(_pool(capacity, policy),), jobs=tuple(jobs))


@settings(max_examples=150, deadline=None)
@given(_capped())
def test_no_plan_sells_beyond_spec_capacity_or_loses_a_pending_pod(snap: Snapshot) -> None:
    cluster = cluster_from(snap)
    first = _plan(snap)
    assert check_plan(cluster, first) == []
    second = build_plan(cluster, first, options=PlanOptions(now=None))
    assert check_plan(cluster, second) == []
    names = {p.name for p in second.pods}
    assert all(p.name in names for p in cluster.pods if p.job is not None)
