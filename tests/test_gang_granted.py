"""No phase grants a job more replicas than ``spec.replicas.count`` (issue 28: a gang once read "granted 5 of 4").

The status phase reports as granted what the plan's rounds left: per job and pool the replica target plus what
rounding dropped (:mod:`walras.planner.status`). A gang (``spec.replicas.gang``) whose pool's policy placed only some
of its N new pods has them withdrawn (rule 2 of :mod:`walras.planner.gang`); they used to stay in the target while
the integral fill (:mod:`walras.planner.integral`) counted the gang's replicas left again from what was placed, and
added the gang again (placed whole, or as still waiting): the row then held more than N. These tests read the
granted replicas from the plan itself (``JobPlan.wanted``, the ``ReplicasGranted`` message) and from the rounds'
:class:`~walras.planner.results.Outcome`, against the count each job declared (the independent reference: the
spec), on a prepared cluster that showed it and on random clusters (hypothesis) with gangs, fixed and elastic
jobs, degree limits, cpu-short nodes, tenants on and off, and pods evicted between plans."""

from __future__ import annotations

import random
import re
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_gang import _applied, _job, _node
from walras.planner import plan as plan_module
from walras.planner.cluster import Cluster, Pool, TenantOptions
from walras.planner.model import Plan
from walras.planner.results import PlanOptions
from walras.planner.spec import PoolSpec

from tests.planning import build_plan

GPU = "nvidia.com/gpu"
GRANTED = re.compile(r"^granted (\d+) of (?:up to )?(\d+) replica\(s\)")


def _pool(name: str, policy: str = "utility", degree_limit: int | None = None) -> Pool:
    return Pool(name, 1, PoolSpec(name=name, node_selector={"pool": name}, resource=GPU, policy=policy,
                                  degree_limit=degree_limit))


def _granted_at_most_count(cluster: Cluster, plan: Plan) -> None:
    """Every valid job's granted replicas (``wanted``, and the number its ``ReplicasGranted`` condition says) are
    at most the count its spec declares; a gang's are 0 or N, in one pool."""
    declared = {job.key: job.spec for job in cluster.jobs if job.spec is not None}
    for key, jp in plan.jobs.items():
        spec = declared[key]
        granted = sum(jp.wanted.values())
        assert granted <= spec.replicas, (key, jp.wanted, spec.replicas)
        cond = next((c for c in jp.conditions if c.type == "ReplicasGranted"), None)
        if cond is not None:
            said = GRANTED.match(cond.message)
            assert said is not None, cond.message
            assert int(said.group(1)) == granted and granted <= int(said.group(2)), cond.message
        placed = sum(jp.replicas.values())
        assert placed <= spec.replicas, (key, jp.replicas, spec.replicas)
        if spec.gang:
            assert placed in (0, spec.replicas) and len(jp.replicas) <= 1, (key, jp.replicas)


def test_a_gang_half_placed_by_its_pool_is_granted_at_most_its_count() -> None:
    """A gang of 2 (1 GPU and 3 cpu a pod) on a pool of two 1-GPU nodes, one with only 2 cpu: the pool's policy
    places one pod and finds no node for the other, so the gang's new pod is withdrawn (all or none). Before the fix
    the withdrawn replica stayed in the target and the fill added the waiting one again: "granted 3 of 2". Now the
    gang is granted 2 (both waiting, with why: the cpu-short node) and none is placed."""
    cluster = Cluster(nodes=(_node("a0", "a", 1.0, cpu=16.0), _node("a1", "a", 1.0, cpu=2.0)), pods=(),
                      pools=(_pool("a"),), jobs=(_job("g", 2, cpu=3.0),))
    plan = build_plan(cluster, options=PlanOptions(now=1e5))
    _granted_at_most_count(cluster, plan)
    jp = plan.jobs[("ns", "g")]
    assert jp.replicas == {} and jp.wanted == {"a": 2}
    cond = {c.type: c for c in jp.conditions}
    assert cond["ReplicasGranted"].message.startswith("granted 2 of 2 replica(s)"), cond["ReplicasGranted"].message
    assert cond["GangPlaced"].reason == "GangNotPlaceable"


def test_the_rounds_outcome_holds_no_row_above_its_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same cluster beside a second gang and a fixed job on three 2-GPU nodes (one with 4 cpu) of a spread
    pool (the case the search found: the second gang was "granted 3 of 2"): the rounds' target plus what rounding
    dropped, per row, is at most ``spec.replicas``, read from the :class:`Outcome` the status phase is given."""
    seen: list[Any] = []
    statuses = plan_module.job_statuses

    def spy(ctx: Any, outcome: Any, *args: Any) -> Any:
        seen.append((ctx, outcome))
        return statuses(ctx, outcome, *args)

    monkeypatch.setattr(plan_module, "job_statuses", spy)
    nodes = (_node("a0", "a", 2.0, cpu=16.0), _node("a1", "a", 2.0, cpu=4.0), _node("a2", "a", 2.0, cpu=16.0))
    jobs = (_job("g0", 4, throughput={"a": 0.74}, cpu=3.0), _job("g1", 2, throughput={"a": 0.6}, utility="linear",
                                                                  cpu=2.0),
            _job("g2", 2, throughput={"a": 1.0}, utility="linear", cpu=3.0),
            _job("g3", 2, gang=False, throughput={"a": 0.8}, utility="linear", cpu=3.0))
    cluster = Cluster(nodes=nodes, pods=(), pools=(_pool("a", "spread"),), jobs=jobs)
    plan = build_plan(cluster, options=PlanOptions(now=1e5))
    _granted_at_most_count(cluster, plan)
    ctx, outcome = seen[-1]
    wanted = (outcome.target + outcome.dropped).sum(axis=1)
    assert all(int(wanted[i]) <= info.spec.replicas for i, info in enumerate(ctx.objects.jobs)), wanted


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_no_plan_grants_a_job_more_than_its_count(seed: int) -> None:
    """Random clusters of 1-3 pools (each policy, degree limits 1-3 or none; nodes of 1-4 GPUs and 4-16 cpu), 1-4
    jobs (half gangs, some elastic), tenants on or off, three plans in a row with the previous plan applied and a
    random pod evicted between them: every plan grants every job at most its count."""
    rng = random.Random(seed)
    names = ("a", "b", "c")[:rng.randint(1, 3)]
    nodes = tuple(_node(f"{p}{k}", p, float(rng.randint(1, 4)), cpu=float(rng.choice([4, 8, 16])))
                  for p in names for k in range(rng.randint(1, 3)))
    pools = tuple(_pool(p, rng.choice(["utility", "throughput", "spread", "fair"]), rng.choice([None, None, 1, 2, 3]))
                  for p in names)
    jobs = []
    for q in range(rng.randint(1, 4)):
        one = _job(f"j{q}", rng.randint(1, 5), gang=rng.random() < 0.5, utility=rng.choice(["log", "linear"]),
                   throughput={p: round(rng.uniform(0.5, 2.0), 2) for p in names if rng.random() < 0.8} or {"a": 1.0},
                   cpu=float(rng.choice([1, 2, 3])))
        if not one.spec.gang and rng.random() < 0.3:
            one = replace(one, spec=replace(one.spec, elastic=True, min_replicas=rng.randint(1, one.spec.replicas)))
        jobs.append(one)
    tenants = TenantOptions() if rng.random() < 0.5 else None
    cluster = Cluster(nodes=nodes, pods=(), pools=pools, jobs=tuple(jobs))
    plan: Plan | None = None
    for step in range(3):
        plan = build_plan(cluster, plan, options=PlanOptions(now=1e5 + 60.0 * step, tenants=tenants))
        _granted_at_most_count(cluster, plan)
        cluster = _applied(cluster, plan)
        if cluster.pods and rng.random() < 0.5:
            pods = list(cluster.pods)
            k = rng.randrange(len(pods))
            pods[k] = replace(pods[k], phase="Failed", reason="Evicted")
            cluster = replace(cluster, pods=tuple(pods))
