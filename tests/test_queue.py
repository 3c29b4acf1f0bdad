"""The queue of waiting jobs (walras.planner.queue, docs/preemption.md): the order (PriorityClass priority, then
weight, then bid, then age) in each waiting job's status.queuePosition and in the metric walras_job_queue_position."""

from __future__ import annotations

from dataclasses import replace

from walras.kube.encode import job_status
from walras.metrics import WalrasMetrics
from walras.planner import Snapshot
from walras.planner.model import JobPlan, Plan

from tests.planning import build_plan
from tests.test_lifecycle_planner import pod
from tests.test_metrics import samples
from tests.test_preemption import job, node, pool


def test_waiting_jobs_are_queued_by_priority_then_bid_then_age_in_status() -> None:
    # one node of 1 GPU, held by a non-preemptible job: four jobs wait
    waiting = (job("late", 1, 1.0, created="2026-01-03T00:00:00Z"),
               job("early", 1, 1.0, created="2026-01-02T00:00:00Z"),
               job("rich", 1, 50.0, created="2026-01-04T00:00:00Z"),
               job("urgent", 1, 0.1, priority_class="high", created="2026-01-05T00:00:00Z"))
    snap = Snapshot(nodes=(node("n0", "1"),), pools=(pool("Never"),),
                    jobs=(job("holder", 1, preemptible=False), *waiting), pods=(pod("holder-0", "holder", "n0"),),
                    priorityclasses=({"kind": "PriorityClass", "metadata": {"name": "high"}, "value": 100},))
    plan = build_plan(snap)
    got = {jp.name: jp.queue_position for jp in plan.jobs.values()}
    assert got == {"holder": None, "urgent": 1, "rich": 2, "early": 3, "late": 4}
    assert job_status(plan.jobs[("ml", "urgent")])["queuePosition"] == 1
    assert "queuePosition" not in job_status(plan.jobs[("ml", "holder")])


def test_queue_position_metric_follows_the_plan() -> None:
    plan = Plan()
    plan.jobs[("ns", "a")] = JobPlan("ns", "a", "Pending", count=2, queue_position=1, waiting=2)
    plan.jobs[("ns", "b")] = JobPlan("ns", "b", "Pending", count=2, queue_position=2, waiting=2)
    plan.jobs[("ns", "c")] = JobPlan("ns", "c", "Running", {"a": 1.0}, {"a": 1}, count=1)
    m = WalrasMetrics()
    m.plan_succeeded(plan)
    s = samples(m)

    def at(name: str) -> float | None:
        return s.get(("walras_job_queue_position", (("fungiblejob", name), ("fungiblejob_namespace", "ns"))))

    assert (at("a"), at("b"), at("c")) == (1, 2, None)
    after = Plan()
    after.jobs[("ns", "b")] = replace(plan.jobs[("ns", "b")], queue_position=1, waiting=1)
    m.plan_succeeded(after)
    s = samples(m)
    assert (at("a"), at("b")) == (None, 1)
    limited = WalrasMetrics(job_metrics_limit=1)
    limited.plan_succeeded(plan)
    s = samples(limited)
    assert (at("a"), at("b")) == (1, None)
