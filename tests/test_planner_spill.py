"""Spill-over (issue 7: running pods stay where they are): a new replica whose market pool is full of running pods
goes to the job's next usable pool instead of being reported unplaceable, and the job says so."""

from __future__ import annotations

from typing import Any

from walras.planner import Plan, Snapshot, build_plan
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL


def node(name: str, kind: str) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {"gpu": kind}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": "2", "cpu": "16"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pool(name: str) -> dict[str, Any]:
    return {
        "kind": "ResourcePool",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"gpu": name}, "resource": "nvidia.com/gpu", "policy": {"type": "throughput"}},
    }


def job(name: str, throughput: dict[str, float], count: int) -> dict[str, Any]:
    return {
        "kind": "FungibleJob",
        "metadata": {"name": name, "namespace": "ml", "generation": 1},
        "spec": {
            "throughput": throughput,
            "utility": {"type": "linear"},
            "replicas": {"count": count},
            "demand": 1,
            "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
        },
    }


def running(name: str, job_name: str, pool_name: str, node_name: str) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": {LABEL_JOB: job_name, LABEL_POOL: pool_name, LABEL_MANAGED: "true"},
        },
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Running"},
    }


def snapshot(fast_throughput_of_new_job: float, slow: bool = True) -> Snapshot:
    """Pool ``fast`` (one node, 2 GPUs) is full of job ``old``'s two running pods; ``old`` runs as well on ``slow``,
    so the market prices ``fast`` for the new job ``new``, which gains more there."""
    nodes = [node("fast-0", "fast")] + ([node("slow-0", "slow")] if slow else [])
    pools = [pool("fast")] + ([pool("slow")] if slow else [])
    old = job("old", {"fast": 1.0, "slow": 1.0} if slow else {"fast": 1.0}, 2)
    new = job("new", {"fast": fast_throughput_of_new_job, "slow": 1.0} if slow else {"fast": 3.0}, 2)
    pods = [running("old-fast-0", "old", "fast", "fast-0"), running("old-fast-1", "old", "fast", "fast-0")]
    return Snapshot(nodes=tuple(nodes), pods=tuple(pods), pools=tuple(pools), jobs=(old, new))


def conditions(plan: Plan, name: str) -> dict[str, Any]:
    return {c.type: c for c in plan.jobs[("ml", name)].conditions}


def test_replicas_of_a_full_market_pool_spill_over_to_the_next_pool() -> None:
    snap = snapshot(3.0)
    plan = build_plan(snap)
    # the market gives the new job the fast pool (it gains 3x there, the running job only 1x)
    assert plan.jobs[("ml", "new")].allocation["fast"] > 0.5
    new_pods = [p for p in plan.jobs[("ml", "new")].pods if p.action == "create"]
    assert [(p.pool, p.node) for p in new_pods] == [("slow", "slow-0"), ("slow", "slow-0")]
    assert all(p.name.startswith("new-slow-") for p in new_pods)
    # the running pods stayed
    assert sorted((p.name, p.action, p.node) for p in plan.jobs[("ml", "old")].pods) == [
        ("old-fast-0", "keep", "fast-0"),
        ("old-fast-1", "keep", "fast-0"),
    ]
    cond = conditions(plan, "new")
    assert cond["PlacedAsPriced"].status == "False" and cond["PlacedAsPriced"].reason == "SpilledOver"
    assert "2 in pool 'slow' instead of 'fast'" in cond["PlacedAsPriced"].message
    assert "ReplicasPlaceable" not in cond
    assert [e for e in plan.events if e.reason == "SpilledOver" and e.name == "new"]
    assert plan.pools["slow"].pods_planned == 2
    assert build_plan(snap).jobs[("ml", "new")].pods == plan.jobs[("ml", "new")].pods  # deterministic


def test_without_another_usable_pool_the_replicas_are_unplaceable() -> None:
    plan = build_plan(snapshot(3.0, slow=False))
    cond = conditions(plan, "new")
    assert cond["ReplicasPlaceable"].reason == "Unplaceable"
    assert "2 in pool 'fast'" in cond["ReplicasPlaceable"].message
    assert "PlacedAsPriced" not in cond
    assert not [p for p in plan.jobs[("ml", "new")].pods if p.action == "create"]


def test_a_pool_the_job_cannot_use_is_not_a_spill_target() -> None:
    snap = snapshot(3.0)
    new = job("new", {"fast": 3.0}, 2)  # lists no throughput on slow
    plan = build_plan(Snapshot(nodes=snap.nodes, pods=snap.pods, pools=snap.pools, jobs=(snap.jobs[0], new)))
    assert not [p for p in plan.jobs[("ml", "new")].pods if p.action == "create"]
    assert conditions(plan, "new")["ReplicasPlaceable"].reason == "Unplaceable"
