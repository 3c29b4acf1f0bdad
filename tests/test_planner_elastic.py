"""Elastic jobs (spec.replicas min/max) under the fair policy: the fair allocation (paper 002, PS-DSF) decides the
replica count between min and max instead of the market's rounded replicas capping it."""

from __future__ import annotations

from typing import Any

from walras.planner import Plan, Snapshot
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL

from tests.planning import build_plan


def nodes(count: int, gpus: str = "4") -> list[dict[str, Any]]:
    return [{"kind": "Node", "metadata": {"name": f"n{k}", "labels": {"gpu": "a"}}, "spec": {},
             "status": {"allocatable": {"nvidia.com/gpu": gpus, "cpu": "64"},
                        "conditions": [{"type": "Ready", "status": "True"}]}} for k in range(count)]


def pool(policy: str) -> dict[str, Any]:
    return {"kind": "ResourcePool", "metadata": {"name": "a"},
            "spec": {"nodeSelector": {"gpu": "a"}, "resource": "nvidia.com/gpu", "policy": {"type": policy}}}


def job(name: str, replicas: dict[str, int], utility: dict[str, Any], weight: float = 1.0) -> dict[str, Any]:
    return {"kind": "FungibleJob", "metadata": {"name": name, "namespace": "ml", "generation": 1},
            "spec": {"throughput": {"a": 8.0}, "utility": utility, "replicas": replicas, "demand": 1,
                     "weight": weight, "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}


def plan_of(policy: str, jobs: list[dict[str, Any]], n_nodes: int = 2, pods: tuple[dict[str, Any], ...] = (),
            previous: Plan | None = None) -> Plan:
    snap = Snapshot(nodes=tuple(nodes(n_nodes)), pods=pods, pools=(pool(policy),), jobs=tuple(jobs))
    return build_plan(snap, previous)


def created(plan: Plan, name: str) -> int:
    return sum(1 for p in plan.pods if p.job == name and p.action == "create" and p.node is not None)


def running(plan: Plan) -> tuple[dict[str, Any], ...]:
    return tuple(
        {"kind": "Pod", "metadata": {"name": p.name, "namespace": p.namespace,
                                     "labels": {LABEL_JOB: p.job, LABEL_POOL: p.pool, LABEL_MANAGED: "true"}},
         "spec": {"nodeName": p.node, "containers": [{"name": "c", "resources": {"requests": p.requests}}]},
         "status": {"phase": "Running"}}
        for p in plan.pods if p.action != "delete" and p.node is not None)


# A target-priority utility saturates at its target: the market pays for 2 of the elastic job's 8 replicas
# (throughput 8 at x = 1, target 2 -> x = 0.25 -> 8 * 0.25 = 2 replicas), however much room the pool has.
SATURATING = {"type": "target-priority", "target": 2.0}


def test_the_market_alone_caps_an_elastic_job_outside_fair_pools() -> None:
    plan = plan_of("throughput", [job("e", {"min": 1, "max": 8}, SATURATING)])
    assert plan.jobs[("ml", "e")].allocation == {"a": 0.25}
    assert created(plan, "e") == 2


def test_the_fair_allocation_decides_an_elastic_job_up_to_its_max() -> None:
    # same job in a fair pool of 8 GPUs: nobody else wants them, so its fair share is its maximum, 8
    plan = plan_of("fair", [job("e", {"min": 1, "max": 8}, SATURATING)])
    assert created(plan, "e") == 8
    assert plan.jobs[("ml", "e")].replicas == {"a": 8}
    assert plan.jobs[("ml", "e")].phase == "Pending"
    assert not [c for c in plan.jobs[("ml", "e")].conditions if c.status == "False" and c.type != "PoolsValid"]
    # with a smaller maximum it gets that maximum, no more
    plan = plan_of("fair", [job("e", {"min": 1, "max": 5}, SATURATING)])
    assert created(plan, "e") == 5


def test_weighted_fair_shares_decide_two_elastic_jobs() -> None:
    # one resource, 8 GPUs, weights 1 and 3: weighted PS-DSF (= weighted DRF on one resource) gives 2 and 6,
    # whatever the market's replicas were; neither job is reported unplaceable for the pods it was not granted
    jobs = [job("light", {"min": 1, "max": 8}, {"type": "linear"}, weight=1.0),
            job("heavy", {"min": 1, "max": 8}, {"type": "linear"}, weight=3.0)]
    plan = plan_of("fair", jobs)
    assert (created(plan, "light"), created(plan, "heavy")) == (2, 6)
    for name in ("light", "heavy"):
        assert "ReplicasPlaceable" not in {c.type for c in plan.jobs[("ml", name)].conditions}
        assert not [e for e in plan.events if e.name == name and e.reason == "Unplaceable"]


def test_a_fixed_size_job_next_to_an_elastic_one_keeps_its_count() -> None:
    jobs = [job("fixed", {"count": 3}, {"type": "log"}), job("e", {"min": 1, "max": 8}, SATURATING)]
    plan = plan_of("fair", jobs)
    assert created(plan, "fixed") == 3
    assert created(plan, "e") == 5  # the rest of the 8 GPUs


def test_an_elastic_job_below_its_minimum_gets_no_new_pod() -> None:
    # 4 GPUs in the pool, min 5: the fair share (4) is below the minimum, so nothing is created
    plan = plan_of("fair", [job("e", {"min": 5, "max": 8}, {"type": "linear"})], n_nodes=1)
    assert created(plan, "e") == 0
    cond = {c.type: c for c in plan.jobs[("ml", "e")].conditions}["MinimumReplicas"]
    assert cond.reason == "BelowMinimum" and "fewer than spec.replicas.min 5" in cond.message
    assert plan.pools["a"].pods_planned == 0 and plan.pools["a"].used == 0.0
    # at the minimum it runs
    plan = plan_of("fair", [job("e", {"min": 4, "max": 8}, {"type": "linear"})], n_nodes=1)
    assert created(plan, "e") == 4


def test_running_elastic_pods_stay_and_the_plan_is_stable() -> None:
    jobs = [job("e", {"min": 1, "max": 8}, SATURATING)]
    first = plan_of("fair", jobs)
    pods = running(first)
    again = plan_of("fair", jobs, pods=pods, previous=first)
    assert sorted(p.action for p in again.pods) == ["keep"] * 8  # nothing deleted although the market pays for 2
    assert again.jobs[("ml", "e")].phase == "Running"
    # lowering the maximum shrinks it to the new maximum
    smaller = [job("e", {"min": 1, "max": 6}, SATURATING)]
    shrunk = plan_of("fair", smaller, pods=pods, previous=again)
    assert sorted(p.action for p in shrunk.pods) == ["evict"] * 2 + ["keep"] * 6  # running: the Eviction API


def test_an_elastic_job_whose_market_share_falls_to_zero_keeps_its_pods_and_stops_nothing() -> None:
    """Issue 16, point 7: an elastic job in a fair pool whose pods run while the market gives it no share made the
    rounding raise (``cannot distribute a total of 4 over shares that are all zero``) and the controller dropped the
    whole plan. Now the plan is made: the fair mechanism decides the elastic job's pods (they stay), and the other
    job, which arrived later and takes the market's whole pool, is planned too."""
    elastic = job("e", {"min": 1, "max": 4}, {"type": "linear"})
    first = plan_of("fair", [elastic], n_nodes=2)
    pods = running(first)
    assert created(first, "e") == 4
    elastic["spec"]["throughput"] = {"a": 1e-6}  # linear and almost worthless next to the other job: no share
    rich = job("f", {"count": 2}, {"type": "linear"})
    again = plan_of("fair", [elastic, rich], n_nodes=2, pods=pods, previous=first)
    assert again.jobs[("ml", "e")].allocation == {}  # the market gives it nothing
    assert sorted(p.action for p in again.pods if p.job == "e") == ["keep"] * 4
    assert created(again, "f") == 2
