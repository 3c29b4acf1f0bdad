"""The preemption phase (walras.planner.preemption, docs/preemption.md): each rule of spec.preemption (Never,
LowerPriority, Market), spec.preemptible, the churn budgets, PriorityClass resolution, the claim that keeps the freed
node for the waiting job, and the Market rule's formula against an independent brute force of the objective."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
from walras.kube.decode import cluster_from, job_priority, priority_classes
from walras.planner import Plan, Snapshot
from walras.planner.invariants import check_plan
from walras.planner.plan import PlanOptions
from walras.planner.preemption import budgets
from walras.planner.queue import claimed_nodes, market_gain, queue_key
from walras.planner.spec import PreemptionSpec, parse_pool

from tests.planning import build_plan
from tests.test_lifecycle_planner import NOW, pod

HOUR = 3600.0


def node(name: str, gpus: str = "4") -> dict:
    return {"kind": "Node", "metadata": {"name": name, "labels": {"gpu": "a"}}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": gpus, "cpu": "32"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pool(rule: str | None = None, **budget: int) -> dict:
    spec: dict[str, Any] = {"nodeSelector": {"gpu": "a"}, "resource": "nvidia.com/gpu", "policy": {"type": "utility"}}
    if rule is not None or budget:
        spec["preemption"] = {**({"rule": rule} if rule else {}), **budget}
    return {"kind": "ResourcePool", "metadata": {"name": "a"}, "spec": spec}


def job(name: str, count: int, throughput: float = 1.0, utility: str = "linear", priority: int | None = None,
        priority_class: str | None = None, preemptible: bool | None = None, grace: int | None = None,
        created: str = "2026-01-01T00:00:00Z") -> dict:
    template: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if priority is not None:
        template["priority"] = priority
    if priority_class is not None:
        template["priorityClassName"] = priority_class
    if grace is not None:
        template["terminationGracePeriodSeconds"] = grace
    spec: dict[str, Any] = {"throughput": {"a": throughput}, "utility": {"type": utility},
                            "replicas": {"count": count}, "template": {"spec": template}}
    if preemptible is not None:
        spec["preemptible"] = preemptible
    return {"kind": "FungibleJob", "metadata": {"name": name, "namespace": "ml", "generation": 3,
                                                "creationTimestamp": created}, "spec": spec}


def full(low: dict, high: dict, the_pool: dict, nodes: int = 1, per_node: int = 4, **extra: Any) -> Snapshot:
    """``nodes`` nodes of ``per_node`` GPUs, all running pods of ``low``; ``high`` waits."""
    pods = [pod(f"low-{k}-{q}", "low", f"n{k}", started=NOW - HOUR + 60 * q) for k in range(nodes)
            for q in range(per_node)]
    return Snapshot(nodes=tuple(node(f"n{k}", str(per_node)) for k in range(nodes)), pools=(the_pool,),
                    jobs=(low, high), pods=tuple(pods), **extra)


def plan_of(snap: Snapshot, previous: Plan | None = None, now: float | None = NOW) -> Plan:
    plan = build_plan(snap, previous, options=PlanOptions(now=now))
    assert check_plan(cluster_from(snap), plan) == []
    for p in plan.pods:  # a running pod leaves only through the Eviction API
        if p.action == "delete":
            assert not p.exists or p.node is None, p
    return plan


def preempted(plan: Plan) -> list[str]:
    return sorted(p.name for p in plan.pods if p.action == "evict" and p.reason.startswith("preempted"))


def claims(plan: Plan) -> list[tuple[str, str | None]]:
    return sorted((p.name, p.node) for p in plan.pods if p.action == "create" and p.job == "high")


def test_never_never_preempts() -> None:
    for high in (job("high", 1, priority=1000), job("high", 1, 4.0, "log")):
        plan = plan_of(full(job("low", 4), high, pool("Never")))
        assert preempted(plan) == [] and claims(plan) == []
        assert all(p.action == "keep" for p in plan.pods)


def test_lower_priority_preempts_only_lower_priority_whatever_they_bid() -> None:
    # a high-priority job with a tiny bid takes a replica from a low-priority one
    plan = plan_of(full(job("low", 4, 4.0), job("high", 1, 0.01, priority=100), pool("LowerPriority")))
    assert preempted(plan) == ["low-0-3"]  # the most recently started pod
    assert claims(plan) == [("high-a-0", None)]  # created without a node: it waits for the victim
    victim = next(p for p in plan.pods if p.name == "low-0-3")
    assert "priority 0 < 100" in victim.reason and victim.exists
    # equal priority: a huge bid does not preempt under LowerPriority
    plan = plan_of(full(job("low", 4, 0.01), job("high", 1, 100.0, "log"), pool("LowerPriority")))
    assert preempted(plan) == [] and claims(plan) == []
    # a lower-priority job never preempts a higher one, under any rule
    for rule in ("LowerPriority", "Market"):
        plan = plan_of(full(job("low", 4, 0.01, priority=5), job("high", 1, 100.0, "log"), pool(rule)))
        assert preempted(plan) == []


def test_market_preempts_only_when_the_gain_beats_the_restart_cost() -> None:
    # linear utilities: the victim (4 replicas of throughput 1, N=4) loses l = 0.25 per s for the 600 s horizon and
    # repeats 600 s (its termination grace) of work: (600 + 600) * 0.25 = 300; the waiting job gains its throughput a
    # per s after its own 30 s restart: 570 * a
    low = job("low", 4, 1.0, grace=600)
    small = plan_of(full(low, job("high", 1, 0.5), pool("Market")))  # 570 * 0.5 = 285 < 300
    assert preempted(small) == []
    big = plan_of(full(low, job("high", 1, 4.0), pool("Market")))  # 570 * 4 = 2280 > 300
    assert preempted(big) == ["low-0-3"] and claims(big) == [("high-a-0", None)]
    assert "market: objective +3.75 per s over 600 s beats restart 600 s of low" in next(
        p.reason for p in big.pods if p.name == "low-0-3")
    # the default rule is Market
    assert preempted(plan_of(full(low, job("high", 1, 4.0), pool()))) == ["low-0-3"]
    # a log job's last replica never yields by the market (its utility is unbounded below without it)
    lone = Snapshot(nodes=(node("n0", "1"),), pools=(pool("Market"),),
                    jobs=(job("low", 1, 1.0, "log"), job("high", 1, 100.0, "log")),
                    pods=(pod("low-0", "low", "n0"),))
    assert preempted(plan_of(lone)) == []


def test_the_hourly_budget_holds_across_an_operator_restart() -> None:
    """A restarted operator has no previous plan: the pool's ``status.preemptionTimes`` (what the operator wrote,
    walras.kube.encode.pool_status) carries the hour's preemptions, so ``maxPerHour`` still caps them."""
    import copy

    from walras.kube.encode import pool_status

    low, high = job("low", 16, 0.01), job("high", 8, 100.0, priority=100)
    snap = full(low, high, pool("LowerPriority", maxPerPlan=3, maxPerHour=4), nodes=4)
    first = plan_of(snap)
    assert len(preempted(first)) == 3
    written = pool_status(first.pools["a"])
    assert len(written["preemptionTimes"]) == 3
    # the restart: the same cluster with the pool's status as written, the claims pending, no previous plan
    waiting = tuple(pod(name, "high", None, phase="Pending") for name, _ in claims(first))
    pools = tuple({**copy.deepcopy(p), "status": written} if p["metadata"]["name"] == "a" else p for p in snap.pools)
    restarted = Snapshot(nodes=snap.nodes, pools=pools, jobs=snap.jobs, pods=snap.pods + waiting)
    after = plan_of(restarted, None, now=NOW + 60)
    assert len(after.pools["a"].preemptions) == 4  # 3 read back + 1 more: the hour's budget of 4
    fresh = plan_of(Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=snap.jobs, pods=snap.pods + waiting), None,
                    now=NOW + 60)
    assert len(fresh.pools["a"].preemptions) == 3  # without the status: the budget would restart from 0
    # an hour later the written times no longer count
    later = plan_of(restarted, None, now=NOW + 3601)
    assert all(t >= NOW + 3601 - 3600 for t in later.pools["a"].preemptions)


def test_a_running_gang_never_yields_and_a_gang_never_preempts() -> None:
    """A gang (``spec.replicas.gang``, docs/gangs.md) runs whole or not at all: taking one of its pods would release it
    whole, so under every rule it never yields; a waiting gang does not claim single pods of others either. (Before,
    only elastic jobs with ``min >= 2`` counted as gangs here: a live run evicted a whole running gang of 4 when a new
    gang of 3 arrived, tests/test_gang_faults.py.)"""
    low = job("low", 4, 0.01)
    low["spec"]["replicas"] = {"count": 4, "gang": True}
    for rule in ("LowerPriority", "Market"):
        plan = plan_of(full(low, job("high", 1, 100.0, "log", priority=100), pool(rule)))
        assert preempted(plan) == [] and claims(plan) == [], rule
        assert sorted(p.name for p in plan.pods if p.job == "low" and p.action == "keep") == \
            [f"low-0-{q}" for q in range(4)]
    high = job("high", 2, 100.0, "log", priority=100)
    high["spec"]["replicas"] = {"count": 2, "gang": True}
    plan = plan_of(full(job("low", 4, 0.01), high, pool("LowerPriority")))
    assert preempted(plan) == [] and claims(plan) == []


def test_non_preemptible_jobs_are_never_preempted() -> None:
    for rule in ("LowerPriority", "Market"):
        plan = plan_of(full(job("low", 4, preemptible=False), job("high", 1, 4.0, "log", priority=100), pool(rule)))
        assert preempted(plan) == [] and claims(plan) == []


def test_churn_budgets_cap_the_preemptions_per_plan_and_per_hour() -> None:
    low, high = job("low", 16, 0.01), job("high", 8, 100.0, priority=100)
    # 4 nodes x 4 pods: the default per plan is 10 % of 16 running pods = 1
    assert len(preempted(plan_of(full(low, high, pool("LowerPriority"), nodes=4)))) == 1
    snap = full(low, high, pool("LowerPriority", maxPerPlan=3, maxPerHour=4), nodes=4)
    first = plan_of(snap)
    assert len(preempted(first)) == 3 and len(claims(first)) == 3
    assert first.pools["a"].preemptions == (NOW,) * 3
    # the claim pods exist, the evictions are not done yet: the next plan asks again for the same 3 evictions (not
    # counted again) and makes one more, the hour's budget being 4
    waiting = tuple(pod(name, "high", None, phase="Pending") for name, _ in claims(first))
    pending = Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=snap.jobs, pods=snap.pods + waiting)
    second = plan_of(pending, first, now=NOW + 60)
    assert set(preempted(first)) < set(preempted(second)) and len(preempted(second)) == 4
    assert second.pools["a"].preemptions == (NOW,) * 3 + (NOW + 60,)
    # an hour later the budget is back
    third = plan_of(pending, second, now=NOW + HOUR + 1)
    assert len(third.pools["a"].preemptions) <= 3 + 1 and third.pools["a"].preemptions[0] == NOW + 60
    assert budgets(parse_pool(pool()), 16) == (1, 3) and budgets(parse_pool(pool()), 45) == (4, 12)
    assert budgets(parse_pool(pool(maxPerPlan=2, maxPerHour=5)), 16) == (2, 5)


def test_the_claim_keeps_the_freed_node_and_nothing_oscillates() -> None:
    low, high = job("low", 4, 1.0), job("high", 1, 4.0)
    snap = full(low, high, pool("Market"))
    first = plan_of(snap)
    assert preempted(first) == ["low-0-3"]
    assert claimed_nodes(first) == {("ml", "high-a-0"): ("n0", ("low-0-3",))}
    # the victim has left; the claim pod exists, pending without a node: it is bound to the freed node, and the
    # victim's job does not take the room back
    pods = [pod(f"low-0-{q}", "low", "n0") for q in range(3)] + [pod("high-a-0", "high", None, phase="Pending")]
    after = Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=snap.jobs, pods=tuple(pods))
    second = plan_of(after, first, now=NOW + 30)
    assert {p.name: (p.action, p.node) for p in second.pods} == {
        "low-0-0": ("keep", "n0"), "low-0-1": ("keep", "n0"), "low-0-2": ("keep", "n0"), "high-a-0": ("bind", "n0")}
    # once it runs, the plan of the unchanged cluster moves nothing
    pods[-1] = pod("high-a-0", "high", "n0")
    settled = Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=snap.jobs, pods=tuple(pods))
    third = plan_of(settled, second, now=NOW + 60)
    assert all(p.action == "keep" for p in third.pods) and len(third.pods) == 4


def test_a_refused_eviction_is_asked_again_and_the_claim_carried() -> None:
    snap = full(job("low", 4, 1.0), job("high", 1, 4.0), pool("Market"))
    first = plan_of(snap)
    # the PodDisruptionBudget refused: the victim still runs; the claim pod exists, pending
    pods = [*snap.pods, pod("high-a-0", "high", None, phase="Pending")]
    refused = Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=snap.jobs, pods=tuple(pods))
    second = plan_of(refused, first, now=NOW + 30)
    assert preempted(second) == ["low-0-3"] and claims(second) == []
    assert claimed_nodes(second) == {("ml", "high-a-0"): ("n0", ("low-0-3",))}
    assert sum(p.action == "evict" for p in second.pods) == 1


def test_priority_class_resolution() -> None:
    classes = [{"kind": "PriorityClass", "metadata": {"name": "high"}, "value": 1000},
               {"kind": "PriorityClass", "metadata": {"name": "base"}, "value": 10, "globalDefault": True},
               {"kind": "PriorityClass", "metadata": {"name": "bad"}, "value": "x"}]
    assert priority_classes(classes) == ({"base": 10, "high": 1000}, 10)
    snap = Snapshot(nodes=(node("n0"),), pools=(pool(),), priorityclasses=tuple(classes), jobs=(
        job("a", 1, priority_class="high"), job("b", 1), job("c", 1, priority=7, priority_class="high"),
        job("d", 1, priority_class="missing"), job("e", 1, preemptible=False)))
    cluster = cluster_from(snap)
    got = {j.name: (j.priority, j.preemptible) for j in cluster.jobs}
    assert got == {"a": (1000, True), "b": (10, True), "c": (7, True), "d": (10, True), "e": (10, False)}
    assert cluster.priority_classes == {"base": 10, "high": 1000}
    assert [job_priority(j, {}, 0) for j in cluster_from(Snapshot(jobs=snap.jobs)).jobs] == [0, 0, 7, 0, 0]
    # served first: the higher PriorityClass takes the preemption under LowerPriority
    plan = plan_of(Snapshot(nodes=(node("n0", "1"),), pools=(pool("LowerPriority"),), priorityclasses=tuple(classes),
                            jobs=(job("low", 1, priority=0), job("high", 1, priority_class="high")),
                            pods=(pod("low-0", "low", "n0"),)))
    assert preempted(plan) == ["low-0"]


def test_pool_spec_preemption_is_decoded_and_checked() -> None:
    assert parse_pool(pool()).preemption == PreemptionSpec("Market", None, None, 600.0)
    spec = parse_pool(pool("Never", maxPerPlan=2, maxPerHour=3, horizonSeconds=60)).preemption
    assert spec == PreemptionSpec("Never", 2, 3, 60.0)
    for bad, why in (({"rule": "Always"}, "spec.preemption.rule"), ({"maxPerPlan": -1}, "maxPerPlan"),
                     ({"maxPerPlan": 5, "maxPerHour": 2}, "must not exceed")):
        obj = pool()
        obj["spec"]["preemption"] = bad
        with pytest.raises(ValueError, match=why):
            parse_pool(obj)


def test_queue_order() -> None:
    keys = {
        "old-low": queue_key(0, 1.0, [5.0], 1.0, "ml", "old-low"),
        "new-low": queue_key(0, 1.0, [5.0], 2.0, "ml", "new-low"),
        "rich": queue_key(0, 1.0, [9.0], 3.0, "ml", "rich"),
        "unbounded": queue_key(0, 1.0, [None], 4.0, "ml", "unbounded"),
        "heavy": queue_key(0, 2.0, [0.1], 5.0, "ml", "heavy"),
        "priority": queue_key(100, 0.5, [0.0], 6.0, "ml", "priority"),
    }
    assert sorted(keys, key=keys.__getitem__) == ["priority", "heavy", "unbounded", "rich", "old-low", "new-low"]


def _phi(utility: str, t: float) -> float:
    """The utility of one job, written here independently of the planner: linear t, log ln t."""
    if utility == "linear":
        return t
    return math.log(t) if t > 0 else -math.inf


@pytest.mark.parametrize("a_w,a_v,n_w,n_v,placed_w,placed_v,utility", list(itertools.product(
    (0.3, 1.0, 4.0), (0.5, 2.0), (1, 2), (2, 4), (0, 1), (1, 2), ("linear", "log"))))
def test_market_rule_equals_a_brute_force_of_the_objective_over_the_horizon(
        a_w: float, a_v: float, n_w: int, n_v: int, placed_w: int, placed_v: int, utility: str) -> None:
    """The Market rule's decision equals the brute force: simulate the objective second by second over the
    horizon for both choices (keep, or preempt: the victim restarts its replica's work lost, the preemptor gains
    only after its restart) and compare the integrals."""
    if placed_w >= n_w:
        return
    horizon, r_w, r_v = 600, 30, 120
    t_w, t_v = a_w * placed_w / n_w, a_v * placed_v / n_v
    u = [_phi(utility, t) for t in (t_w, t_w + a_w / n_w, t_v, t_v - a_v / n_v)]
    if not math.isfinite(u[3]):
        brute = False  # the victim would fall to -inf: never
    elif not math.isfinite(u[0]):
        brute = math.isfinite(u[1])  # any finite value beats -inf
    else:
        keep = sum(u[0] + u[2] for _ in range(horizon))
        moved = sum((u[1] if s >= r_w else u[0]) + u[3] for s in range(horizon))
        brute = moved - r_v * (u[2] - u[3]) > keep + 1e-9  # the victim repeats its last r_v seconds of work
    ok, _ = market_gain((u[0], u[1]), (u[2], u[3]), (r_w, r_v), horizon)
    assert ok == brute


def test_the_spill_cluster_under_the_default_rule_prices_the_full_pool_and_runs_the_job_now() -> None:
    """tests/test_planner_spill.py's cluster (pool fast full of old's 2 pods; new gains 3x there) with the default
    rule: new bids in fast, so fast's price says what it would pay (1.0, against 0.25 when fast is withdrawn from its
    market); its new pods start on slow, and one of them is weighed against a claim on fast: old (1.0 on either
    pool) loses nothing by restarting on slow while new gains 3x, so old's pod yields and restarts on slow at once
    and new waits for fast for that one replica (fast's maxPerPlan default: 1 victim); its other pod runs now on
    slow."""
    from tests import test_planner_spill as spill

    snap = spill.snapshot(3.0)
    market = Snapshot(nodes=snap.nodes, pods=snap.pods, jobs=snap.jobs,
                      pools=tuple(spill.pool(p["metadata"]["name"], "Market") for p in snap.pools))
    plan, never = plan_of(market), plan_of(snap)
    assert plan.jobs[("ml", "new")].allocation.get("fast", 0.0) > 0.99
    assert plan.pools["fast"].price == pytest.approx(1.0, rel=1e-3) and never.pools["fast"].price < 0.3
    assert plan.jobs[("ml", "new")].replicas == {"slow": 1} and preempted(plan) == ["old-fast-0"]
    assert sorted((p.name, p.action, p.node) for p in plan.pods if p.job == "new") == [
        ("new-fast-0", "create", None), ("new-slow-1", "create", "slow-0")]
    assert plan.jobs[("ml", "old")].replicas == {"fast": 1, "slow": 1}  # old's replacement starts on slow now
    assert "it restarts in pool 'slow'" in next(p.reason for p in plan.pods if p.name == "old-fast-0")
    # the same job unable to use slow waits, and takes one of old's pods in fast
    alone = Snapshot(nodes=snap.nodes, pods=snap.pods, pools=market.pools,
                     jobs=(snap.jobs[0], spill.job("new", {"fast": 3.0}, 2)))
    assert preempted(plan_of(alone)) == ["old-fast-0"]  # no start times: by name
