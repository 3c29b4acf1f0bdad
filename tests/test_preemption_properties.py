"""Properties of preemption (walras.planner.preemption) over random clusters, every plan applied to the model of the
API server (tests/simcluster.py): jobs of random priorities, utilities and preemptibility arrive in bursts into pools
of random rules; then

* no node is over-committed (the shared invariants, and no kubelet OutOf<resource> rejection);
* a pod that runs is never removed but through the Eviction API (``evict``), never by a plain ``delete``;
* the budgets hold (at most ``maxPerPlan`` preemptions per pool per plan);
* nothing oscillates: a job that preempted another is never preempted by it, and after the last arrival the plans
  reach a fixed point (a plan of the unchanged cluster that removes and creates nothing) within a few plans.
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.simcluster import SimCluster, job, node, pool

_FOR = re.compile(r"preempted for ml/(\S+) \(")


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    pools = []
    for name in ("a", "b")[:draw(st.integers(1, 2))]:
        rule = draw(st.sampled_from(["Never", "LowerPriority", "Market"]))
        budget = draw(st.sampled_from([{}, {"maxPerPlan": 1}, {"maxPerPlan": 2, "maxPerHour": 4}]))
        pools.append((name, rule, budget, draw(st.integers(1, 2)), draw(st.sampled_from(["2", "4"]))))
    jobs = []
    for k in range(draw(st.integers(2, 5))):
        throughput = {name: draw(st.sampled_from([0.5, 1.0, 3.0])) for name, *_ in pools}
        jobs.append({"name": f"j{k}", "throughput": throughput, "count": draw(st.integers(2, 8)),
                     "utility": draw(st.sampled_from(["linear", "log"])), "priority": draw(st.sampled_from([0, 0, 10])),
                     "preemptible": draw(st.booleans()), "cut": draw(st.booleans())})
    return {"pools": pools, "jobs": jobs}


def _build(case: dict[str, Any]) -> tuple[SimCluster, list[dict[str, Any]]]:
    sim = SimCluster()
    for name, rule, budget, count, gpus in case["pools"]:
        sim.pools[name] = pool(name, {"gpu": name}, "utility", preemption={"rule": rule, **budget})
        for k in range(count):
            n = node(f"{name}{k}", {"gpu": name}, gpu=gpus)
            sim.nodes[n["metadata"]["name"]] = n
    objs = []
    for spec in case["jobs"]:
        obj = job(spec["name"], spec["throughput"], {"count": spec["count"]}, utility={"type": spec["utility"]})
        obj["spec"]["preemptible"] = spec["preemptible"]
        obj["spec"]["template"]["spec"]["priority"] = spec["priority"]
        objs.append(obj)
    return sim, objs


@settings(max_examples=30, deadline=None)
@given(scenarios())
def test_preemption_never_over_commits_never_deletes_a_running_pod_and_never_oscillates(case: dict[str, Any]) -> None:
    sim, objs = _build(case)
    rules = {name: (rule, budget) for name, rule, budget, *_ in case["pools"]}
    specs = {spec["name"]: spec for spec in case["jobs"]}
    pairs: set[tuple[str, str]] = set()  # (preemptor, victim)
    plans = []

    def step() -> None:
        before = {key: (obj.get("status") or {}).get("phase") for key, obj in sim.pods.items()}
        plan = sim.step()
        plans.append(plan)
        per_pool: dict[str, int] = {}
        for p in plan.pods:
            if p.action == "delete":
                assert before.get((p.namespace, p.name)) != "Running", p  # running pods leave only by eviction
            match = _FOR.search(p.reason) if p.action == "evict" else None
            if match is not None and p.reason.startswith("preempted"):
                winner, victim = match.group(1), p.job
                rule = rules[p.pool][0]
                assert rule != "Never"
                assert specs[victim]["preemptible"]
                assert specs[victim]["priority"] <= specs[winner]["priority"]
                if rule == "LowerPriority":
                    assert specs[victim]["priority"] < specs[winner]["priority"]
                assert (victim, winner) not in pairs, f"{victim} preempted {winner} and back"
                pairs.add((winner, victim))
                per_pool[p.pool] = per_pool.get(p.pool, 0) + 1 if "asked again" not in p.reason else per_pool.get(
                    p.pool, 0)
        for name, count in per_pool.items():
            if "maxPerPlan" in rules[name][1]:
                assert count <= rules[name][1]["maxPerPlan"]

    for k, obj in enumerate(objs):
        sim.jobs[("ml", obj["metadata"]["name"])] = obj
        if k == len(objs) - 1 or case["jobs"][k]["cut"]:
            step()
    quiet = 0
    for _ in range(12):
        step()
        changed = [p for p in plans[-1].pods if p.action in ("create", "delete", "evict")]
        quiet = quiet + 1 if not changed else 0
        if quiet >= 2:
            break
    assert quiet >= 2, [(p.name, p.action, p.reason) for p in plans[-1].pods if p.action != "keep"]
    assert sim.violations == [] and sim.rejected == []
