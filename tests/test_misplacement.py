"""Issue 30 item 3: a scheduler configuration mistake must not become an endless loop. Every pod Walras creates
requires its pool's nodes (:func:`walras.kube.encode.build_pod`); a pod bound elsewhere anyway (a scheduler that
bypasses the extender, a binding made by hand) is reported once (one Warning Event per node and pool, and the
job's ``Misplaced`` condition naming the pod, the node and the pool) and its replacement is backed off
(:func:`walras.planner.lifecycle.misplaced_delay`: 10 s doubled per misplacement, at most 300 s), so the creations
over ``T`` seconds are bounded by about ``replicas x (log2(T / 10 s) + 2)`` instead of one round per plan.

The planner is driven as the operator drives it (one plan every 2 s of a simulated clock, each plan after the
previous one), with a "scheduler" that binds every pod the plan creates to a node outside the job's pool."""

from __future__ import annotations

import math
from typing import Any

from walras.kube.decode import cluster_from
from walras.planner import Plan, Snapshot
from walras.planner.invariants import check_plan
from walras.planner.lifecycle import MISPLACED_CAP, misplaced_delay
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL, rfc3339
from walras.planner.plan import PlanOptions

from tests.planning import build_plan
from tests.test_lifecycle_planner import NOW, job, node, pool

PERIOD = 2.0


def _pod(plan_name: str, owner: str, node_name: str, pool_name: str, started: float) -> dict[str, Any]:
    return {"kind": "Pod",
            "metadata": {"name": plan_name, "namespace": "ml", "uid": f"uid-{plan_name}",
                         "labels": {LABEL_JOB: owner, LABEL_POOL: pool_name, LABEL_MANAGED: "true"}},
            "spec": {"nodeName": node_name,
                     "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running", "startTime": rfc3339(started)}}


def _simulate(seconds: float, bind_to: Any, replicas: int = 3) -> dict[str, Any]:
    """Plan every :data:`PERIOD` s for ``seconds``; each pod a plan creates is bound where ``bind_to(pod_plan, t)``
    says (``t``: seconds since the start); deleted and evicted pods go at once. Returns the creations, the plans,
    the Misplaced events and the pods at the end."""
    nodes = [node("a0", "a"), node("a1", "a"), node("x0", "x", gpus="8")]
    pools = [pool("a"), pool("x")]
    jobs = [job("j", {"a": 1.0}, count=replicas), job("other", {"a": 1.0, "x": 1.0}, count=1)]
    pods: dict[str, dict[str, Any]] = {}
    previous: Plan | None = None
    creations = 0
    events: list[tuple[str, str]] = []
    plans: list[Plan] = []
    t = 0.0
    while t <= seconds:
        snapshot = Snapshot(nodes=tuple(nodes), pods=tuple(pods.values()), pools=tuple(pools), jobs=tuple(jobs))
        plan = build_plan(snapshot, previous, options=PlanOptions(now=NOW + t))
        assert check_plan(cluster_from(snapshot), plan) == []
        for p in plan.pods:
            if p.job != "j":
                if p.action == "create" and p.node is not None:
                    pods[p.name] = _pod(p.name, p.job, p.node, p.pool, NOW + t)
                continue
            if p.action == "create":
                creations += 1
                pods[p.name] = _pod(p.name, p.job, bind_to(p, t), p.pool, NOW + t)
            elif p.action in ("delete", "evict"):
                pods.pop(p.name, None)
        events += [(e.reason, e.message) for e in plan.events if e.reason == "Misplaced"]
        plans.append(plan)
        previous = plan
        t += PERIOD
    return {"creations": creations, "plans": plans, "events": events, "pods": pods}


def test_the_backoff_schedule_is_exponential_and_capped() -> None:
    assert [misplaced_delay(k) for k in range(0, 7)] == [0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0]
    assert misplaced_delay(50) == MISPLACED_CAP == 300.0


def test_a_scheduler_that_always_misplaces_makes_a_bounded_number_of_creations() -> None:
    """Over 60 s and 600 s of plans every 2 s, a scheduler binding every pod of a 3-replica job to a node outside its
    pool: the creations stay within ``3 x (log2(T / 10 s) + 2)`` (without the backoff: 3 per two plans, 90 and 900);
    one distinct Warning Event text (the operator posts it once), the condition names the pod, the node and the pool."""
    for seconds in (60.0, 600.0):
        run = _simulate(seconds, lambda p, t: "x0")
        bound = 3 * (math.log2(seconds / 10.0) + 2)
        assert 3 <= run["creations"] <= bound, (seconds, run["creations"], bound)
        assert {message for _, message in run["events"]} == {next(m for _, m in run["events"])}
        assert "node x0" in run["events"][0][1] and "pool 'a'" in run["events"][0][1]
        assert len(run["events"]) * 1 <= run["creations"]  # one per misplaced pod, never one per plan
        last = run["plans"][-1].jobs[("ml", "j")]
        assert last.misplaced == run["creations"] > 0
        held = [p for p in run["plans"] if any(c.type == "Misplaced" for c in p.jobs[("ml", "j")].conditions)]
        assert held, "no Misplaced condition"
        (condition,) = [c for c in held[0].jobs[("ml", "j")].conditions if c.type == "Misplaced"]
        assert condition.status == "True" and condition.reason == "Misplaced"
        assert "node x0" in condition.message and "pool 'a'" in condition.message and "uid" not in condition.message
        # the other job (which may use pool x) is planned throughout, untouched by j's misplacements
        assert all(p.jobs[("ml", "other")].phase != "Invalid" for p in run["plans"])


def test_a_correct_scheduler_after_misplacements_runs_the_job_and_clears_the_condition() -> None:
    """The misplacing scheduler for the first 30 s, then one that binds to the planned node: the job ends with its 3
    pods in pool a, no ``Misplaced`` condition, and each misplaced pod was counted once."""
    run = _simulate(400.0, lambda p, t: "x0" if t < 30 else p.node)
    last = run["plans"][-1]
    placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in run["pods"].values()
              if p["metadata"]["labels"][LABEL_JOB] == "j"}
    assert len(placed) == 3 and set(placed.values()) <= {"a0", "a1"}, placed
    assert "Misplaced" not in {c.type for c in last.jobs[("ml", "j")].conditions}
    assert last.jobs[("ml", "j")].misplaced == len(run["events"]) == run["creations"] - 3
    assert "node x0, outside pool 'a'" in last.jobs[("ml", "j")].misplaced_where


def test_replanning_the_same_misplaced_cluster_counts_each_pod_once() -> None:
    """The same cluster (one pod of j bound to x0) planned ten times in a row, each after the last: the count stays
    1, one Event, the condition stays; a pod on a node of another pool the job may use is not misplaced."""
    nodes = [node("a0", "a"), node("x0", "x", gpus="8")]
    pools = [pool("a"), pool("x")]
    jobs = [job("j", {"a": 1.0}, count=1), job("k", {"a": 1.0, "x": 1.0}, count=1)]
    pods = [_pod("j-0", "j", "x0", "a", NOW), _pod("k-0", "k", "x0", "a", NOW)]
    snapshot = Snapshot(nodes=tuple(nodes), pods=tuple(pods), pools=tuple(pools), jobs=tuple(jobs))
    previous: Plan | None = None
    events = 0
    for k in range(10):
        plan = build_plan(snapshot, previous, options=PlanOptions(now=NOW + k))
        events += sum(1 for e in plan.events if e.reason == "Misplaced")
        assert plan.jobs[("ml", "j")].misplaced == 1
        assert "Misplaced" in {c.type for c in plan.jobs[("ml", "j")].conditions}
        assert not [p for p in plan.pods if p.job == "j" and p.action == "create"]  # backed off
        assert [p.action for p in plan.pods if p.name == "j-0"] in (["evict"], ["delete"])
        # k may use pool x: its pod there is running, not misplaced, kept
        assert plan.jobs[("ml", "k")].misplaced == 0
        assert [p.action for p in plan.pods if p.name == "k-0"] == ["keep"]
        previous = plan
    assert events == 1
