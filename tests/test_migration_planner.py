"""The planner's migration phase (walras.planner.migration): running pods of jobs that opted in move to the pool the
market now gives them only when every rule holds (gain, minimum run time, cooldown, budgets, room), never for other
jobs and never without a clock; every plan checked with the shared invariants."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from walras.kube.decode import cluster_from
from walras.kube.encode import job_status
from walras.planner import Plan, Snapshot
from walras.planner.invariants import check_plan
from walras.planner.migration import relative_gain
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL, rfc3339
from walras.planner.plan import PlanOptions
from walras.planner.spec import parse_job, restart_cost

from tests.planning import build_plan
from tests.test_lifecycle_planner import NOW, pod, pool, status_validator

HOUR = 3600.0


def node(name: str, pool_name: str, gpus: str = "4", cpu: str = "32") -> dict:
    return {"kind": "Node", "metadata": {"name": name, "labels": {"gpu": pool_name}}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": gpus, "cpu": cpu},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def job(name: str, migration: dict | None = None, count: int = 2, status: dict | None = None,
        utility: str = "linear", cpu: str | None = None) -> dict:
    spec: dict[str, Any] = {"throughput": {"a": 4.0, "b": 1.0}, "utility": {"type": utility},
                            "replicas": {"count": count},
                            "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}
    if migration is not None:
        spec["migration"] = migration
    if cpu is not None:
        spec["resources"] = {"cpu": cpu}
    obj: dict[str, Any] = {"kind": "FungibleJob", "metadata": {"name": name, "namespace": "ml", "generation": 1},
                           "spec": spec}
    if status is not None:
        obj["status"] = {"observedGeneration": 1, **status}
    return obj


def on_b(owner: str, count: int = 2, started: float | None = NOW - HOUR, cpu: str | None = None) -> list[dict]:
    pods = [pod(f"{owner}-b-{k}", owner, "b0", pool_name="b", started=started) for k in range(count)]
    if cpu is not None:
        for p in pods:
            p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
    return pods


def snapshot(jobs: list[dict], pods: list[dict], a_cpu: str = "32") -> Snapshot:
    """Pool a (throughput 4) is free; every job's pods run on pool b (throughput 1), where they were placed while
    a was full."""
    return Snapshot(nodes=(node("a0", "a", cpu=a_cpu), node("b0", "b", gpus="8")), pools=(pool("a"), pool("b")),
                    jobs=tuple(jobs), pods=tuple(pods))


def plan_of(snap: Snapshot, previous: Plan | None = None, now: float | None = NOW, **options: Any) -> Plan:
    plan = build_plan(snap, previous, options=PlanOptions(now=now, **options))
    assert check_plan(cluster_from(snap), plan) == []
    deleted = {p.name for p in plan.pods if p.action in ("delete", "evict")}
    kept = {p.name for p in plan.pods if p.action in ("keep", "bind", "resize", "create")}
    assert not deleted & kept
    return plan


def moves(plan: Plan, owner: str | None = None) -> tuple[list[str], list[tuple[str, str | None]]]:
    evicted = sorted(p.name for p in plan.pods if p.action == "evict" and owner in (None, p.job))
    created = sorted((p.pool, p.node) for p in plan.pods if p.action == "create" and owner in (None, p.job))
    return evicted, created


OPT_IN = {"minGain": 0.05, "minRunSeconds": 600, "maxPodsPerCycle": 1, "cooldownSeconds": 600}


def test_a_pod_moves_to_the_faster_pool_when_every_rule_holds() -> None:
    plan = plan_of(snapshot([job("x", OPT_IN)], on_b("x")))
    assert moves(plan) == (["x-b-0"], [("a", "a0")])
    evicted = next(p for p in plan.pods if p.action == "evict")
    assert "from pool 'b' to 'a'" in evicted.reason and "+150.0%" in evicted.reason  # t: 1 -> 2.5
    assert evicted.grace is None  # the pod's own termination grace period
    jp = plan.jobs[("ml", "x")]
    assert jp.replicas == {"a": 1, "b": 1} and jp.throughput == (4.0 + 1.0) / 2
    assert jp.migrations == 1 and jp.last_migration == NOW
    assert job_status(jp)["lastMigrationTime"] == rfc3339(NOW) and [p["name"] for p in job_status(jp)["pods"]] == [
        "x-a-0", "x-b-1"]
    assert [e.reason for e in plan.events if e.reason == "Rebalanced"] == ["Rebalanced"]
    status_validator().validate(job_status(jp))


def test_after_the_move_the_cooldown_holds_and_the_count_is_not_repeated() -> None:
    first = plan_of(snapshot([job("x", OPT_IN)], on_b("x")))
    # the operator evicted x-b-0 (terminating) and created the replacement, which runs now
    pods = on_b("x")
    pods[0]["metadata"]["deletionTimestamp"] = rfc3339(NOW + 1)
    pods.append(pod("x-a-0", "x", "a0", started=NOW + 5))
    after = snapshot([job("x", OPT_IN)], pods)
    second = plan_of(after, first, now=NOW + 60)
    assert moves(second) == ([], []) and second.jobs[("ml", "x")].migrations == 1
    # the status carries the count when there is no previous plan; after the cooldown the next pod moves
    status = {"migrations": 1, "lastMigrationTime": rfc3339(NOW)}
    later = plan_of(snapshot([job("x", OPT_IN, status=status)], pods), now=NOW + 601)
    assert moves(later) == (["x-b-1"], [("a", "a0")]) and later.jobs[("ml", "x")].migrations == 2


def test_no_move_below_the_minimum_gain() -> None:
    assert relative_gain(1.0, 2.5) == 1.5 and relative_gain(0.0, 1.0) == float("inf")
    assert moves(plan_of(snapshot([job("x", {**OPT_IN, "minGain": 1.6})], on_b("x")))) == ([], [])
    assert moves(plan_of(snapshot([job("x", {**OPT_IN, "minGain": 1.4})], on_b("x"))))[0] == ["x-b-0"]


def test_no_move_before_the_minimum_run_time_or_without_a_start_time() -> None:
    assert moves(plan_of(snapshot([job("x", OPT_IN)], on_b("x", started=NOW - 599)))) == ([], [])
    assert moves(plan_of(snapshot([job("x", OPT_IN)], on_b("x", started=None)))) == ([], [])
    assert moves(plan_of(snapshot([job("x", OPT_IN)], on_b("x", started=NOW - 600))))[0] == ["x-b-0"]


def test_no_move_within_the_cooldown_of_the_previous_move() -> None:
    recent = {"migrations": 3, "lastMigrationTime": rfc3339(NOW - 599)}
    plan = plan_of(snapshot([job("x", OPT_IN, status=recent)], on_b("x")))
    assert moves(plan) == ([], []) and plan.jobs[("ml", "x")].migrations == 3
    old = {"migrations": 3, "lastMigrationTime": rfc3339(NOW - 601)}
    assert plan_of(snapshot([job("x", OPT_IN, status=old)], on_b("x"))).jobs[("ml", "x")].migrations == 4


def test_per_job_and_per_plan_budgets() -> None:
    both = plan_of(snapshot([job("x", {**OPT_IN, "maxPodsPerCycle": 2})], on_b("x")))
    assert moves(both) == (["x-b-0", "x-b-1"], [("a", "a0"), ("a", "a0")])
    assert len(moves(plan_of(snapshot([job("x", {**OPT_IN, "maxPodsPerCycle": 2})], on_b("x")),
                             max_migrations=1))[0]) == 1
    # two jobs of one pod each: the plan's budget of one moves one of them
    two = snapshot([job("x", OPT_IN, count=1), job("y", OPT_IN, count=1)], on_b("x", 1) + on_b("y", 1))
    assert len(moves(plan_of(two))[0]) == 2
    assert len(moves(plan_of(two, max_migrations=1))[0]) == 1
    assert moves(plan_of(two, max_migrations=0)) == ([], [])


def test_no_move_without_room_for_the_whole_request_vector() -> None:
    """Both jobs are priced into pool a, whose node has GPUs for both but cpu for one replacement only: the first
    move reserves it, the second finds no room (and nothing is over-committed)."""
    def two(a_cpu: str) -> Snapshot:
        jobs = [job(n, OPT_IN, utility="log", cpu="2") for n in ("x", "y")]
        return snapshot(jobs, on_b("x", cpu="2") + on_b("y", cpu="2"), a_cpu=a_cpu)

    roomy = plan_of(two("4"))
    assert moves(roomy) == (["x-b-0", "y-b-0"], [("a", "a0"), ("a", "a0")])
    tight = plan_of(two("3"))
    assert moves(tight) == (["x-b-0"], [("a", "a0")])
    assert tight.jobs[("ml", "y")].migrations == 0


def test_jobs_without_spec_migration_are_never_moved_and_nothing_moves_without_a_clock() -> None:
    plan = plan_of(snapshot([job("x"), job("y", OPT_IN)], on_b("x") + on_b("y")), max_migrations=10)
    assert moves(plan, "x") == ([], []) and moves(plan, "y")[0] == ["y-b-0"]
    assert all(p.action == "keep" for p in plan.pods if p.job == "x")
    assert moves(plan_of(snapshot([job("y", OPT_IN)], on_b("y")), now=None)) == ([], [])


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Snapshot, float | None, int]:
    nodes = [node(f"{p}{k}", p, gpus=draw(st.sampled_from(["2", "4"])), cpu=draw(st.sampled_from(["4", "32"])))
             for p in ("a", "b") for k in range(draw(st.integers(1, 2)))]
    jobs, pods = [], []
    for j in range(draw(st.integers(1, 3))):
        owner = f"j{j}"
        migration = draw(st.sampled_from([None, OPT_IN, {**OPT_IN, "maxPodsPerCycle": 3, "minGain": 0.0}]))
        status = draw(st.sampled_from([None, {"lastMigrationTime": rfc3339(NOW - 100)}]))
        jobs.append(job(owner, migration, count=draw(st.integers(1, 3)), status=status,
                        utility=draw(st.sampled_from(["linear", "log"])), cpu=draw(st.sampled_from([None, "2"]))))
        for q in range(draw(st.integers(0, 3))):
            where = draw(st.sampled_from([n["metadata"]["name"] for n in nodes]))
            p = pod(f"{owner}-x-{q}", owner, where, pool_name=where[0],
                    started=draw(st.sampled_from([None, NOW - 100, NOW - HOUR])))
            p["metadata"]["labels"] = {LABEL_JOB: owner, LABEL_POOL: where[0], LABEL_MANAGED: "true"}
            pods.append(p)
    return (Snapshot(nodes=tuple(nodes), pools=(pool("a"), pool("b")), jobs=tuple(jobs), pods=tuple(pods)),
            draw(st.sampled_from([None, NOW])), draw(st.integers(0, 3)))


@settings(max_examples=25, deadline=None)
@given(clusters())
def test_random_clusters_never_over_commit_and_respect_the_budgets(case: tuple[Snapshot, float | None, int]) -> None:
    snap, now, budget = case
    plan = plan_of(snap, now=now, max_migrations=budget)  # check_plan and no pod both kept and removed
    # moves are the evictions that say "rebalanced"; a shrink's surplus pods are evicted too (never deleted)
    evicted = [p for p in plan.pods if p.action == "evict" and p.reason.startswith("rebalanced")]
    assert all(p.reason.startswith(("rebalanced", "surplus")) for p in plan.pods if p.action == "evict")
    assert len(evicted) <= budget and (now is not None or not evicted)
    specs = {(j["metadata"]["namespace"], j["metadata"]["name"]): j["spec"] for j in snap.jobs}
    for jp in plan.jobs.values():
        mine = [p for p in evicted if p.job == jp.name]
        rules = specs[jp.key].get("migration")
        assert not mine or rules is not None
        assert len(mine) <= (rules or {}).get("maxPodsPerCycle", 0)
        assert jp.migrations == len(mine)


def test_a_job_the_lifecycle_holds_is_not_moved() -> None:
    """In backoff after a failed pod the job is held below its spec: rebalancing waits (it would move otherwise)."""
    backoff = {"failedPods": 1, "lastFailureTime": rfc3339(NOW - 5)}
    assert moves(plan_of(snapshot([job("x", OPT_IN, count=3, status=backoff)], on_b("x")))) == ([], [])
    after = {"failedPods": 1, "lastFailureTime": rfc3339(NOW - 11)}
    assert moves(plan_of(snapshot([job("x", OPT_IN, count=3, status=after)], on_b("x"))))[0] == ["x-b-0"]


def test_an_eviction_a_disruption_budget_refused_is_retried_and_no_other_pod_is_deleted() -> None:
    first = plan_of(snapshot([job("x", OPT_IN)], on_b("x")))
    # the Eviction API refused (PodDisruptionBudget): x-b-0 still runs next to its replacement, which runs now
    pods = [*on_b("x"), pod("x-a-0", "x", "a0", started=NOW + 5)]
    refused = snapshot([job("x", OPT_IN, status={"migrations": 1, "lastMigrationTime": rfc3339(NOW)})], pods)
    previous = first
    for step in (30, 60):
        plan = plan_of(refused, previous, now=NOW + step)
        assert {p.name: p.action for p in plan.pods} == {"x-b-0": "evict", "x-b-1": "keep", "x-a-0": "keep"}
        assert plan.jobs[("ml", "x")].migrations == 1 and plan.jobs[("ml", "x")].replicas == {"a": 1, "b": 1}
        previous = plan
    # allowed at last: the pod terminates and is left alone
    pods[0]["metadata"]["deletionTimestamp"] = rfc3339(NOW + 61)
    gone = plan_of(snapshot([job("x", OPT_IN)], pods), previous, now=NOW + 90)
    assert {p.name: p.action for p in gone.pods} == {"x-b-1": "keep", "x-a-0": "keep"}


def with_work(obj: dict, remaining: str, grace: int | None = None) -> dict:
    """``obj`` reporting its remaining work (annotation walras.dev/remaining-work) and, optionally, a template
    termination grace period."""
    obj["metadata"]["annotations"] = {"walras.dev/remaining-work": remaining}
    if grace is not None:
        obj["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = grace
    return obj


def test_remaining_work_a_job_near_its_end_is_not_moved_a_long_one_is() -> None:
    """Job x (2 pods, throughput 4 on a, 1 on b) runs both pods on b: t = 1. Moving one pod to a gives t' = (4 + 1) / 2
    = 2.5 (the utility gain is 150 %, far above minGain). With W work left and the default restart of 30 s (the
    Kubernetes termination grace), the move pays iff 30 + W / 2.5 < W / 1, i.e. W > 50: W = 10 (10 s left) stays,
    W = 36,000 (10 hours left) moves, and W = 50 exactly does not (30 + 20 = 50, not < 50)."""
    assert moves(plan_of(snapshot([with_work(job("x", OPT_IN), "10")], on_b("x")))) == ([], [])
    assert moves(plan_of(snapshot([with_work(job("x", OPT_IN), "50")], on_b("x")))) == ([], [])
    long = plan_of(snapshot([with_work(job("x", OPT_IN), "36000")], on_b("x")))
    assert moves(long) == (["x-b-0"], [("a", "a0")])
    # 36000 / 1 - (30 + 36000 / 2.5) = 21570 s sooner
    assert "finishes 21570 s sooner with 36000 work left (restart 30 s)" in next(
        p.reason for p in long.pods if p.action == "evict")
    assert long.jobs[("ml", "x")].migrations == 1


def test_remaining_work_weighs_the_restart_cost() -> None:
    """W = 100, t = 1 -> t' = 2.5: 100 s left against r + 40 s. spec.migration.restartSeconds 59 moves, 60 does not;
    without restartSeconds the template's terminationGracePeriodSeconds is the cost (70: no move, 10: move)."""
    def plan_with(migration: dict, grace: int | None = None) -> Plan:
        return plan_of(snapshot([with_work(job("x", migration), "100", grace)], on_b("x")))

    assert moves(plan_with({**OPT_IN, "restartSeconds": 59}))[0] == ["x-b-0"]
    assert moves(plan_with({**OPT_IN, "restartSeconds": 60})) == ([], [])
    assert moves(plan_with(OPT_IN, grace=70)) == ([], [])
    assert moves(plan_with(OPT_IN, grace=10))[0] == ["x-b-0"]
    assert moves(plan_with({**OPT_IN, "restartSeconds": 0}, grace=70))[0] == ["x-b-0"]  # explicit wins


def test_remaining_work_replaces_the_gain_threshold_and_without_it_the_old_rule_holds() -> None:
    """minGain 1.6 blocks the +150 % move of a job without the annotation (today's rule, also for a malformed or
    negative annotation); with 36,000 work left the finish-sooner rule decides instead and the pod moves. The other
    rules still hold: before minRunSeconds nothing moves, however much work is left."""
    strict = {**OPT_IN, "minGain": 1.6}
    assert moves(plan_of(snapshot([job("x", strict)], on_b("x")))) == ([], [])
    assert moves(plan_of(snapshot([with_work(job("x", strict), "soon")], on_b("x")))) == ([], [])
    assert moves(plan_of(snapshot([with_work(job("x", strict), "-5")], on_b("x")))) == ([], [])
    assert moves(plan_of(snapshot([with_work(job("x", strict), "36000")], on_b("x"))))[0] == ["x-b-0"]
    assert moves(plan_of(snapshot([with_work(job("x", OPT_IN), "36000")], on_b("x", started=NOW - 599)))) == ([], [])
    assert moves(plan_of(snapshot([with_work(job("x"), "36000")], on_b("x")))) == ([], [])  # no spec.migration


def test_remaining_work_with_two_pods_per_cycle_pays_the_restart_once() -> None:
    """maxPodsPerCycle 2, W = 100, t = 1 before the plan. Each step must pay on its own against the throughput before
    the plan's moves, with one restart for the whole plan (the moved pods restart together): r = 50 moves both pods
    (50 + 100 / 2.5 = 90 < 100, then 50 + 100 / 4 = 75 < 100); r = 70 moves none (the first step, 70 + 40 = 110, does
    not pay, and the steps are greedy)."""
    def plan_with(restart: int) -> Plan:
        rules = {**OPT_IN, "maxPodsPerCycle": 2, "restartSeconds": restart}
        return plan_of(snapshot([with_work(job("x", rules), "100")], on_b("x")))

    both = plan_with(50)
    assert moves(both)[0] == ["x-b-0", "x-b-1"]
    assert "finishes 25 s sooner" in next(p.reason for p in both.pods if p.name == "x-b-1")  # 100 - (50 + 25)
    assert moves(plan_with(70)) == ([], [])


def test_restart_seconds_and_the_annotation_are_parsed() -> None:
    spec = parse_job(with_work(job("x", {**OPT_IN, "restartSeconds": 45}), " 12.5 "))
    assert spec.remaining_work == 12.5 and restart_cost(spec) == 45.0
    assert parse_job(job("x", OPT_IN)).remaining_work is None and restart_cost(parse_job(job("x", OPT_IN))) == 30.0
    assert parse_job(with_work(job("x", OPT_IN), "inf")).remaining_work is None
    with pytest.raises(ValueError, match=r"spec\.migration\.restartSeconds must be >= 0"):
        parse_job(job("x", {**OPT_IN, "restartSeconds": -1}))
