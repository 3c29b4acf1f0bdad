"""Running pods stay where they are (issue 7), so a pool can be full of pods the market would have put elsewhere. The
market is not offered what placement cannot realise: a new job is priced only where its pods can run, and says so.
These pools never preempt (``spec.preemption.rule: Never``); under the default rule, ``Market``, a waiting job also
bids where running pods may yield to it (docs/preemption.md; tests/test_preemption.py has the same cluster so)."""

from __future__ import annotations

from typing import Any

import pytest
from walras.planner import Plan, Snapshot
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL

from tests.planning import build_plan


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


def pool(name: str, rule: str = "Never") -> dict[str, Any]:
    return {
        "kind": "ResourcePool",
        "metadata": {"name": name},
        "spec": {"nodeSelector": {"gpu": name}, "resource": "nvidia.com/gpu", "policy": {"type": "throughput"},
                 "preemption": {"rule": rule}},
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


def test_a_pool_full_of_running_pods_is_not_sold_to_a_new_job() -> None:
    snap = snapshot(3.0)
    plan = build_plan(snap)
    # the new job would gain 3x on the fast pool, but old's running pods fill it: the market does not sell it
    new = plan.jobs[("ml", "new")]
    assert "fast" not in new.allocation and new.allocation["slow"] > 0.99
    new_pods = [p for p in new.pods if p.action == "create"]
    assert [(p.pool, p.node) for p in new_pods] == [("slow", "slow-0"), ("slow", "slow-0")]
    assert all(p.name.startswith("new-slow-") for p in new_pods)
    # the running pods stayed
    assert sorted((p.name, p.action, p.node) for p in plan.jobs[("ml", "old")].pods) == [
        ("old-fast-0", "keep", "fast-0"),
        ("old-fast-1", "keep", "fast-0"),
    ]
    cond = conditions(plan, "new")
    # a healthy job (2 of 2 granted and placed) carries no False condition (issue 28): the pool withdrawn from its
    # market is no longer reported as PlacedAsPriced=False
    assert "PlacedAsPriced" not in cond and not [c for c in cond.values() if c.status == "False"]
    assert cond["ReplicasGranted"].status == "True" and cond["ReplicasGranted"].reason == "AllGranted"
    assert "granted 2 of 2" in cond["ReplicasGranted"].message
    assert "ReplicasPlaceable" not in cond
    assert cond["Scheduled"].status == "True"
    # status: what was priced is what was placed
    assert new.wanted == new.replicas == {"slow": 2}
    assert new.throughput == pytest.approx(new.priced_throughput, rel=1e-6)
    assert plan.pools["slow"].pods_planned == 2
    assert build_plan(snap).jobs[("ml", "new")].pods == new.pods  # deterministic


def test_without_another_usable_pool_the_job_waits_and_says_why() -> None:
    plan = build_plan(snapshot(3.0, slow=False))
    new = plan.jobs[("ml", "new")]
    cond = conditions(plan, "new")
    assert cond["Scheduled"].status == "False" and cond["Scheduled"].reason == "InsufficientCapacity"
    assert "'fast'" in cond["Scheduled"].message
    assert new.phase == "Pending" and not new.allocation and not new.replicas
    assert not [p for p in new.pods if p.action == "create"]


def test_a_pool_the_job_cannot_use_is_never_a_target() -> None:
    snap = snapshot(3.0)
    new = job("new", {"fast": 3.0}, 2)  # lists no throughput on slow
    plan = build_plan(Snapshot(nodes=snap.nodes, pods=snap.pods, pools=snap.pools, jobs=(snap.jobs[0], new)))
    assert not [p for p in plan.jobs[("ml", "new")].pods if p.action == "create"]
    assert conditions(plan, "new")["Scheduled"].reason == "InsufficientCapacity"
