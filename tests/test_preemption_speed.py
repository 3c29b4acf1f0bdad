"""The preemption phase's shortcuts (issue 33's planner targets) change no plan.

The phase judges each pool's holders on arrays (:func:`walras.planner.queue.market_mask`), rules out claims by a bound
on the pool's cheapest holders (:meth:`walras.planner.preemption._HolderTable.floor`, ``_may_gain``) and keeps its
memos per job row and pool (``_Work._mark``). The references here are the rule itself, holder by holder
(:func:`walras.planner.queue.market_gain`, :func:`walras.planner.queue.yields`), and the phase with every shortcut
replaced by the per-holder loop it had before (every holder weighed, every landing and room computed afresh): plans
must be equal, pod for pod and event for event.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from walras.kube.decode import cluster_from
from walras.planner import Snapshot, build_plan
from walras.planner import preemption as phase
from walras.planner.model import Plan
from walras.planner.queue import MECHANISM_POLICIES, HolderSide, market_gain, market_mask
from walras.planner.results import PlanOptions
from walras.planner.reuse import PlanCache

from bench import planner as bench

values = st.one_of(st.floats(-50.0, 50.0, allow_nan=False), st.sampled_from([-math.inf, 0.0, 1e-12, 7.0]))
costs = st.floats(0.0, 900.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(w=st.tuples(values, values), horizon=st.floats(1.0, 3600.0), r_w=costs,
       holders=st.lists(st.tuples(values, values, values, costs, st.booleans(), st.booleans()), min_size=1,
                        max_size=8))
def test_the_arrays_and_the_bound_refuse_only_what_the_rule_refuses(
        w: tuple[float, float], horizon: float, r_w: float,
        holders: list[tuple[float, float, float, float, bool, bool]]) -> None:
    v0, v1p, v1l, r_v, planned, runs = (np.array(column) for column in zip(*holders, strict=True))
    side = HolderSide(v0.astype(float), v1p.astype(float), v1l.astype(float), r_v.astype(float), planned.astype(bool),
                      runs.astype(bool))
    waiting = (w[0], w[1], horizon, r_w)
    mask = market_mask(waiting, side)
    rows = np.arange(len(holders), dtype=np.int64)
    table = phase._HolderTable(0, rows, np.zeros(len(holders), dtype=np.int64), side)
    for q, (a0, ap, al, rv, has_planned, has_runs) in enumerate(holders):
        by_plan = has_planned and market_gain(w, (a0, ap), (0.0, 0.0), horizon)[0]
        by_run = has_runs and market_gain(w, (a0, al), (r_w, rv), horizon)[0]
        if by_plan or by_run:
            assert mask[q], (q, holders[q])
            assert phase._may_gain(waiting, table.floor(horizon, 0, -1))
            others = [p for p in range(len(holders)) if p != q]
            if not others:
                continue
            # the bound with another row left out still admits this holder
            assert phase._may_gain(waiting, table.floor(horizon, 0, others[0]))


def _reference_candidates(self: Any, i: int, j: int, step: float, bonus: Any) -> list[int]:
    """The holders the phase weighed one by one before issue 33's shortcuts: every holder of the pool but job i,
    a lower priority always, an equal one under the Market rule outside the mechanism pools."""
    jobs, pool = self.ctx.objects.jobs, self.ctx.objects.pools[j]
    market = pool.spec.preemption.rule == "Market" and pool.spec.policy not in MECHANISM_POLICIES
    w = jobs[i].job.priority
    return [v for v in self._holders(j) if v != i and not (jobs[v].job.priority > w or (
        jobs[v].job.priority == w and not market))]


def _fresh_lands(self: Any, v: int, j: int, bonus: Any) -> Any:
    landing = self._landing(v, j, bonus)
    if landing is None:
        return None
    return (self.ctx.objects.pools[landing[0]].name,
            float(self.a[v, landing[0]]) / max(self.ctx.objects.jobs[v].spec.replicas, 1))


def _fresh_room(self: Any, j: int, key: Any, args: Any) -> Any:
    return self._room(j, *args)


def _fresh_holders(self: Any, j: int) -> list[int]:
    jobs = self.ctx.objects.jobs
    return [v for v in np.flatnonzero(self.placed[:, j] > 0).tolist()
            if jobs[v].key not in self.held and phase.may_yield(jobs[v])]


def _fresh_loss_planned(self: Any, v: int, j: int) -> Any:
    self._memo.pop(("loss", v, j), None)
    return _ORIGINAL_LOSS(self, v, j)


def _fresh_slower(self: Any, i: int, j: int) -> Any:
    return self._slower(i, j)


_ORIGINAL_LOSS = phase._Work._loss_planned


def _with_jobs(base: Snapshot, count: int, prefix: str, replicas: int, **spec: Any) -> Snapshot:
    """``base`` with ``count`` more jobs, copies of its first ones, ``spec`` overriding their spec (a template
    ``priority``: ``priority=``)."""
    jobs = list(base.jobs)
    for q in range(count):
        job = copy.deepcopy(base.jobs[q % len(base.jobs)])
        job["metadata"].update(name=f"{prefix}-{q:03d}", uid=f"uid-{prefix}-{q}", resourceVersion=str(5_000_000 + q))
        job["spec"]["replicas"] = {"count": replicas}
        if "utility" in spec:
            job["spec"]["utility"] = spec["utility"]
        if "priority" in spec:
            job["spec"]["template"]["spec"]["priority"] = spec["priority"]
        jobs.append(job)
    return Snapshot(base.nodes, base.pods, base.pools, tuple(jobs), base.profiles)


def _plans() -> dict[str, Plan]:
    """The bench's scenarios at its quick size, and ones where claims succeed (higher-priority jobs arrive; log jobs
    with nothing placed arrive, with and without a clock)."""
    snap = bench.cluster(500, 10, 100, 20)
    out: dict[str, Plan] = {}
    cache = PlanCache()
    out["empty"] = first = build_plan(cluster_from(snap), cache=PlanCache())
    steady = bench.running(snap, first)
    out["steady"] = steady_plan = build_plan(cluster_from(steady), cache=cache)
    grown = bench.grow_one_job(steady)
    out["warm"] = build_plan(cluster_from(grown), steady_plan, cache=cache.fork())
    out["warm, no reuse"] = build_plan(cluster_from(grown), steady_plan, options=PlanOptions(reuse=False))
    high = _with_jobs(steady, 40, "hi", 6, priority=10)
    out["priority"] = build_plan(cluster_from(high), steady_plan, cache=cache.fork())
    starved = _with_jobs(steady, 30, "lg", 4, utility={"type": "log"})
    out["starved"] = build_plan(cluster_from(starved), steady_plan, cache=cache.fork())
    out["starved, clock"] = build_plan(cluster_from(starved), steady_plan, options=PlanOptions(now=1.0e9))
    return out


def _same(plan: Plan) -> tuple[Any, ...]:
    return plan.pools, plan.jobs, plan.pods, plan.events, plan.nominations


def test_the_phase_plans_as_the_per_holder_loop_on_the_bench_clusters(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _plans()
    assert sum(p.action == "evict" for p in fast["priority"].pods) > 20  # the scenarios preempt
    assert sum(p.action == "evict" for p in fast["starved"].pods) > 20
    monkeypatch.setattr(phase._Work, "_candidates", _reference_candidates)
    monkeypatch.setattr(phase._Work, "_lands", _fresh_lands)
    monkeypatch.setattr(phase._Work, "_room_of", _fresh_room)
    monkeypatch.setattr(phase._Work, "_holders", _fresh_holders)
    monkeypatch.setattr(phase._Work, "_loss_planned", _fresh_loss_planned)
    monkeypatch.setattr(phase._Work, "slower", _fresh_slower)
    reference = _plans()
    for name, plan in fast.items():
        assert _same(plan) == _same(reference[name]), name
