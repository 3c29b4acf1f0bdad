"""Issue 30 item 7: the plan isolates a job whose numbers still make a solver fail. Values the schema and the
decoder admit can overflow a utility (a ``power`` utility with exponent -100 at a throughput of 1e-9); such a job
gets ``Valid=False`` reason ``SolverFailed`` and every other job is planned as if the failing job were not there
(:func:`walras.planner.plan.build_plan`'s isolation). A hypothesis property feeds extreme values next to a healthy
cluster: no traceback, the shared invariants hold, and wherever the hostile job is isolated the healthy jobs' plan
is the plan of the healthy cluster alone."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from walras.kube.decode import cluster_from
from walras.planner import Plan, Snapshot
from walras.planner.invariants import check_plan
from walras.planner.plan import PlanOptions, build_plan, plan_phases
from walras.planner.spec import MAX_ALPHA, MAX_THROUGHPUT, MAX_WEIGHT, MIN_EXPONENT, MIN_THROUGHPUT, MIN_WEIGHT

from tests.test_lifecycle_planner import NOW, job, node, pool

HEALTHY = (job("h1", {"a": 1.0, "b": 2.0}, count=2), job("h2", {"a": 3.0}, count=1),
           job("h3", {"b": 1.0}, count=2, utility={"type": "log"}))
NODES = (node("a0", "a"), node("a1", "a"), node("b0", "b"))
POOLS = (pool("a"), pool("b"))
#: A job the schema admits whose utility overflows a float in the market's solver.
OVERFLOWING = job("hostile", {"a": MIN_THROUGHPUT, "b": MIN_THROUGHPUT}, count=3,
                  utility={"type": "power", "exponent": MIN_EXPONENT, "weight": MIN_WEIGHT})


def _plan(*extra: dict[str, Any]) -> Plan:
    snapshot = Snapshot(nodes=NODES, pools=POOLS, jobs=(*HEALTHY, *extra))
    plan = build_plan(cluster_from(snapshot), options=PlanOptions(now=NOW))
    assert check_plan(cluster_from(snapshot), plan) == []
    return plan


def _healthy_view(plan: Plan) -> dict[str, Any]:
    """What the plan gives the healthy jobs: allocation, replicas, pods (name, action, node), phase; and prices."""
    out: dict[str, Any] = {}
    for j in HEALTHY:
        jp = plan.jobs[("ml", j["metadata"]["name"])]
        out[jp.name] = (jp.phase, jp.allocation, jp.replicas, tuple((p.name, p.action, p.node) for p in jp.pods))
    out["prices"] = {name: pp.price for name, pp in plan.pools.items()}
    return out


def test_the_overflowing_job_really_makes_the_plan_raise_without_isolation() -> None:
    snapshot = Snapshot(nodes=NODES, pools=POOLS, jobs=(*HEALTHY, OVERFLOWING))
    with pytest.raises(ArithmeticError):
        plan_phases(cluster_from(snapshot), options=PlanOptions(now=NOW))


def test_a_job_that_makes_the_solver_raise_is_isolated_and_the_rest_planned() -> None:
    alone = _plan()
    plan = _plan(OVERFLOWING)
    conditions = {c.type: c for c in plan.jobs[("ml", "hostile")].conditions}
    assert conditions["Valid"].status == "False" and conditions["Valid"].reason == "SolverFailed"
    assert "OverflowError" in conditions["Valid"].message
    assert plan.jobs[("ml", "hostile")].phase == "Invalid"
    assert not [p for p in plan.pods if p.job == "hostile"]
    assert [e.reason for e in plan.events if e.name == "hostile"] == ["SolverFailed"]
    assert _healthy_view(plan) == _healthy_view(alone)
    # two failing jobs are both isolated
    second = job("hostile2", {"b": MIN_THROUGHPUT}, count=1, utility={"type": "power", "exponent": MIN_EXPONENT})
    both = _plan(OVERFLOWING, second)
    assert {k[1] for k, jp in both.jobs.items() if any(c.reason == "SolverFailed" for c in jp.conditions)} == {
        "hostile", "hostile2"}
    assert _healthy_view(both) == _healthy_view(alone)


EXTREME = st.sampled_from([MIN_THROUGHPUT, 1e-6, 1.0, 1e6, MAX_THROUGHPUT])
UTILITY = st.one_of(
    st.just({"type": "linear"}), st.just({"type": "log"}),
    st.builds(lambda e: {"type": "power", "exponent": e},
              st.sampled_from([MIN_EXPONENT, -10.0, -1.0, 0.001, 1.0])),
    st.builds(lambda a: {"type": "alpha-fair", "alpha": a}, st.sampled_from([0.0, 1.0, 2.0, 50.0, MAX_ALPHA])),
    st.builds(lambda t: {"type": "target-priority", "target": t}, st.sampled_from([MIN_THROUGHPUT, 1.0, 1e12])),
)


@settings(max_examples=40, deadline=None)
@given(utility=UTILITY, weight=st.sampled_from([MIN_WEIGHT, 1.0, MAX_WEIGHT]), a=EXTREME, b=EXTREME,
       priority=st.sampled_from([MIN_WEIGHT, 1.0, MAX_WEIGHT]), count=st.sampled_from([1, 3, 10_000]))
def test_extreme_values_next_to_a_healthy_cluster(utility: dict[str, Any], weight: float, a: float, b: float,
                                                 priority: float, count: int) -> None:
    hostile = job("hostile", {"a": a, "b": b}, count=count, utility={**utility, "weight": weight}, weight=priority)
    plan = _plan(hostile)  # no traceback, invariants hold
    for j in HEALTHY:
        assert plan.jobs[("ml", j["metadata"]["name"])].phase != "Invalid"
    if any(c.reason == "SolverFailed" for c in plan.jobs[("ml", "hostile")].conditions):
        assert _healthy_view(plan) == _healthy_view(_plan())
