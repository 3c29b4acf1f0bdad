"""The preemption phase weighs a new pod in a slower pool against a claim on a full faster one (walras.planner.
preemption, docs/preemption.md "Weighed against a free slower pool"): a running victim that has free room in another
pool restarts there at once, so its loss is the difference of its utility between the pools, not its whole replica.
Expected values are the Market formula evaluated by hand (math.log) here, not by the code under test."""

from __future__ import annotations

import math
from typing import Any

from walras.planner import Snapshot

from tests.test_lifecycle_planner import NOW, pod
from tests.test_preemption import plan_of, preempted


def node(name: str, label: str, gpus: str = "2") -> dict:
    return {"kind": "Node", "metadata": {"name": name, "labels": {"gpu": label}}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": gpus, "cpu": "32"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pool(name: str, **preemption: Any) -> dict:
    spec: dict[str, Any] = {"nodeSelector": {"gpu": name}, "resource": "nvidia.com/gpu", "policy": {"type": "utility"}}
    if preemption:
        spec["preemption"] = preemption
    return {"kind": "ResourcePool", "metadata": {"name": name}, "spec": spec}


def job(name: str, fast: float, slow: float = 1.0, count: int = 1, remaining: float | None = None,
        gang: bool = False) -> dict:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "generation": 3,
                            "creationTimestamp": "2026-01-01T00:00:00Z"}
    if remaining is not None:
        meta["annotations"] = {"walras.dev/remaining-work": str(remaining)}
    replicas: dict[str, Any] = {"count": count, **({"gang": True} if gang else {})}
    return {"kind": "FungibleJob", "metadata": meta,
            "spec": {"throughput": {"fast": fast, "slow": slow}, "utility": {"type": "log"}, "replicas": replicas,
                     "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}


def cluster(w: dict, *, fast_pool: dict | None = None, victims: tuple[dict, ...] | None = None,
            slow_gpus: str = "2") -> Snapshot:
    """Pool fast (one node, 2 GPUs) full: v1 (1.1 on fast, 1.0 on slow; started an hour ago) and v2 (1.2; half an
    hour ago), one pod each; pool slow (one node) free; ``w`` arrives."""
    jobs = victims if victims is not None else (job("v1", 1.1), job("v2", 1.2))
    pods = tuple(pod(f"{j['metadata']['name']}-fast-{q}", j["metadata"]["name"], "f0", pool_name="fast",
                     started=NOW - 3600 + 1800 * k)
                 for k, j in enumerate(jobs) for q in range(j["spec"]["replicas"]["count"]))
    return Snapshot(nodes=(node("f0", "fast"), node("s0", "slow", slow_gpus)),
                    pools=(fast_pool or pool("fast"), pool("slow")), jobs=(*jobs, w), pods=pods)


def pods_of(plan: Any, owner: str) -> list[tuple[str, str, str | None]]:
    return sorted((p.name, p.action, p.node) for p in plan.pods if p.job == owner)


def test_a_new_job_wins_the_fast_pool_when_its_gain_beats_the_restart_cost() -> None:
    plan = plan_of(cluster(job("w", 4.0)))
    # v1 loses least by moving to slow: log 1.1 - log 1.0 per s; w gains log 4 - log 1; over the 600 s horizon
    # (600 - 30) * 1.386 - 600 * 0.0953 = 733 > 30 * 0.0953: v1's pod is evicted and restarts on slow at once
    assert preempted(plan) == ["v1-fast-0"]
    assert pods_of(plan, "w") == [("w-fast-0", "create", None)]  # a claim: it waits for v1's pod on f0
    assert pods_of(plan, "v1") == [("v1-fast-0", "evict", "f0"), ("v1-slow-0", "create", "s0")]
    assert pods_of(plan, "v2") == [("v2-fast-0", "keep", "f0")]
    delta = (math.log(4.0) - math.log(1.0)) - (math.log(1.1) - math.log(1.0))
    reason = next(p.reason for p in plan.pods if p.name == "v1-fast-0")
    assert f"objective +{delta:.4g} per s" in reason and "it restarts in pool 'slow'" in reason


def test_no_swap_when_the_gain_does_not_beat_the_loss_or_the_restart() -> None:
    # w gains log 1.05 < v1's log 1.1: w starts on slow, nothing moves
    plan = plan_of(cluster(job("w", 1.05)))
    assert preempted(plan) == [] and pods_of(plan, "w") == [("w-slow-0", "create", "s0")]
    # w gains 4x but has 100 units of work left: 25 s on fast, shorter than its own 30 s restart
    plan = plan_of(cluster(job("w", 4.0, remaining=100.0)))
    assert preempted(plan) == [] and pods_of(plan, "w") == [("w-slow-0", "create", "s0")]
    # with an hour's work left on fast the same job claims fast
    plan = plan_of(cluster(job("w", 4.0, remaining=4.0 * 3600)))
    assert preempted(plan) == ["v1-fast-0"]


def test_a_victim_without_free_room_elsewhere_keeps_its_last_replica() -> None:
    # slow has 1 GPU, taken by w's new pod: w gives it up for fast, so v1 lands in the room w leaves
    plan = plan_of(cluster(job("w", 4.0), slow_gpus="1"))
    assert preempted(plan) == ["v1-fast-0"] and pods_of(plan, "v1")[1] == ("v1-slow-0", "create", "s0")
    # a victim that runs only on fast (no alternative): a log job's last replica never yields by the market
    only_fast = [job("v1", 1.1), job("v2", 1.2)]
    for j in only_fast:
        del j["spec"]["throughput"]["slow"]
    plan = plan_of(cluster(job("w", 4.0), victims=tuple(only_fast)))
    assert preempted(plan) == [] and pods_of(plan, "w") == [("w-slow-0", "create", "s0")]


def test_budgets_hold_for_swaps() -> None:
    # two new jobs gain 4x; the per-plan budget of fast (1) lets one swap happen
    snap = cluster(job("w", 4.0), fast_pool=pool("fast", maxPerPlan=1))
    snap = Snapshot(nodes=snap.nodes, pools=snap.pools, pods=snap.pods, jobs=(*snap.jobs, job("x", 4.0)))
    plan = plan_of(snap)
    assert len(preempted(plan)) == 1
    # a budget of 0 per hour: nothing moves, both new jobs start on slow
    snap0 = cluster(job("w", 4.0), fast_pool=pool("fast", maxPerPlan=0, maxPerHour=0))
    plan = plan_of(snap0)
    assert preempted(plan) == [] and pods_of(plan, "w") == [("w-slow-0", "create", "s0")]
    # rule Never on fast: nothing moves
    plan = plan_of(cluster(job("w", 4.0), fast_pool=pool("fast", rule="Never")))
    assert preempted(plan) == []


def test_gangs_neither_swap_in_nor_yield() -> None:
    # a gang of 1 that would gain 4x does not claim fast
    plan = plan_of(cluster(job("w", 4.0, gang=True)))
    assert preempted(plan) == [] and pods_of(plan, "w") == [("w-slow-0", "create", "s0")]
    # a gang running on fast does not yield to a new job that gains 4x
    plan = plan_of(cluster(job("w", 4.0), victims=(job("g", 1.0, count=2, gang=True),)))
    assert preempted(plan) == [] and pods_of(plan, "w") == [("w-slow-0", "create", "s0")]
