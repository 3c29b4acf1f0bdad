"""The incremental snapshot: a plan built with ``PlanOptions(reuse=True)`` (the previous plan's translations and the
``keep`` plans of pods that did not change) equals the plan built with ``reuse=False`` from the same inputs and the
same previous plan: the bench's scenarios at small size, and chains of small changes (jobs added, deleted, scaled;
pods deleted, failed; nodes cordoned, added) applied as the operator would apply each plan. Every plan passes
:func:`walras.planner.invariants.check_plan`, and building a plan never changes the previous one."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from walras.planner import Plan, Snapshot, build_plan
from walras.planner.invariants import check_plan
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL
from walras.planner.plan import PlanOptions
from walras.planner.translate import cluster_from

from bench.planner import cluster, grow_one_job, running

REUSE = PlanOptions(reuse=True)
FRESH = PlanOptions(reuse=False)


def comparable(plan: Plan) -> dict[str, Any]:
    """Everything a plan says (statuses, pods, events, prices), less the timings."""
    body = plan.to_dict()
    body.pop("seconds")
    body["solver"].pop("seconds")
    body["job_pods"] = {key: [p.to_dict() for p in job.pods] for key, job in plan.jobs.items()}
    return body


def both(snapshot: Snapshot, previous: Plan | None, options: PlanOptions = REUSE) -> Plan:
    """The plan with reuse, after checking it equals the plan without reuse, that it passes the invariants, and that
    neither build changed ``previous``."""
    before = comparable(previous) if previous is not None else None
    reused = build_plan(snapshot, previous, options=replace(options, reuse=True))
    fresh = build_plan(snapshot, previous, options=replace(options, reuse=False))
    assert comparable(reused) == comparable(fresh)
    assert check_plan(cluster_from(snapshot), reused) == []
    if previous is not None:
        assert comparable(previous) == before
    return reused


def test_bench_scenarios_plan_alike_with_and_without_reuse() -> None:
    snap = cluster(60, 4, 24, 4)
    first = both(snap, None)
    steady = running(snap, first)
    steady_plan = both(steady, first)
    again = both(steady, steady_plan)  # an unchanged cluster: a fixed point, its kept pods' plans reused
    assert all(p.action == "keep" for p in again.pods)
    shared = {id(p) for p in steady_plan.pods}
    assert sum(id(p) in shared for p in again.pods) == len(again.pods)
    # the status phase took every job's pods' name order and counts from the steady plan (the same tuple object)
    assert again._statuses and all(again._statuses[key][1] is steady_plan._statuses[key][1]
                                   for key in again._statuses)
    warm = both(grow_one_job(steady), again)
    assert sum(id(p) in {id(q) for q in again.pods} for p in warm.pods) > len(warm.pods) // 2
    assert warm.jobs[("team-0", "job-0000")].observed_generation == 2


_counter = iter(range(10**9))


def _rv() -> str:
    return str(10**6 + next(_counter))


def applied(snapshot: Snapshot, plan: Plan) -> Snapshot:
    """The cluster after the operator carried out ``plan``: deleted and evicted pods gone, created pods there (bound
    and Running, a fresh uid and resourceVersion each), bound pods on their node (a new resourceVersion)."""
    pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in snapshot.pods}
    for pp in plan.pods:
        key = (pp.namespace, pp.name)
        if pp.action in ("delete", "evict"):
            pods.pop(key, None)
        elif pp.action == "create" and pp.node is not None:
            pods[key] = {
                "kind": "Pod",
                "metadata": {"name": pp.name, "namespace": pp.namespace, "uid": f"uid-{_rv()}",
                             "resourceVersion": _rv(),
                             "labels": {LABEL_JOB: pp.job, LABEL_POOL: pp.pool, LABEL_MANAGED: "true"}},
                "spec": {"nodeName": pp.node, "containers": [{"name": "c", "resources": {"requests": pp.requests}}]},
                "status": {"phase": "Running"},
            }
        elif pp.action == "bind" and pp.node is not None and key in pods:
            pod = copy.deepcopy(pods[key])
            pod["spec"]["nodeName"] = pp.node
            pod["metadata"]["resourceVersion"] = _rv()
            pods[key] = pod
    return Snapshot(snapshot.nodes, tuple(pods.values()), snapshot.pools, snapshot.jobs, snapshot.profiles)


def _written(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` as the API server returns it after a write (a new resourceVersion)."""
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = _rv()
    return out


def changed(snapshot: Snapshot, change: tuple[str, int, int]) -> Snapshot:
    """``snapshot`` after one small change (kind, which object, how much)."""
    kind, which, amount = change
    nodes, pods, jobs = list(snapshot.nodes), list(snapshot.pods), list(snapshot.jobs)
    if kind == "scale" and jobs:
        job = _written(jobs[which % len(jobs)])
        job["spec"]["replicas"] = {"count": amount}
        job["metadata"]["generation"] += 1
        jobs[which % len(jobs)] = job
    elif kind == "delete-job" and jobs:
        del jobs[which % len(jobs)]
    elif kind == "add-job" and jobs:
        job = _written(jobs[which % len(jobs)])
        job["metadata"].update(name=f"new-{_rv()}", uid=f"uid-{_rv()}")
        job["spec"]["replicas"] = {"count": amount}
        jobs.append(job)
    elif kind == "delete-pod" and pods:
        del pods[which % len(pods)]
    elif kind == "fail-pod" and pods:
        pod = _written(pods[which % len(pods)])
        pod["status"] = {"phase": "Failed", "reason": "Error"}
        pods[which % len(pods)] = pod
    elif kind == "cordon":
        node = _written(nodes[which % len(nodes)])
        node["spec"] = {"unschedulable": True}
        nodes[which % len(nodes)] = node
    elif kind == "add-node":
        node = _written(nodes[which % len(nodes)])
        node["metadata"].update(name=f"node-new-{_rv()}", uid=f"uid-{_rv()}")
        nodes.append(node)
    return Snapshot(tuple(nodes), tuple(pods), snapshot.pools, tuple(jobs), snapshot.profiles)


CHANGES = st.tuples(st.sampled_from(["scale", "delete-job", "add-job", "delete-pod", "fail-pod", "cordon", "add-node"]),
                    st.integers(0, 200), st.integers(0, 6))


@settings(max_examples=8, deadline=None)
@given(steps=st.lists(st.lists(CHANGES, min_size=1, max_size=3), min_size=1, max_size=3),
       clock=st.sampled_from([None, 1_000_000.0]))
def test_chains_of_small_changes_plan_alike_with_and_without_reuse(steps: list[list[tuple[str, int, int]]],
                                                                    clock: float | None) -> None:
    snap = cluster(40, 4, 12, 3)
    options = PlanOptions(now=clock)
    previous = build_plan(snap, options=options)
    snapshot = applied(snap, previous)
    previous = build_plan(snapshot, previous, options=options)  # the steady state
    for t, step in enumerate(steps):
        for change in step:
            snapshot = changed(snapshot, change)
        now = None if clock is None else clock + 60.0 * (t + 1)
        previous = both(snapshot, previous, replace(options, now=now))
        snapshot = applied(snapshot, previous)


def test_pods_created_then_pending_then_bound_plan_alike_with_and_without_reuse() -> None:
    """Each job keeps its number of pod plans from one plan to the next while their actions change (create, then
    bind of the pending pods, then keep of the bound ones): the status phase's reuse must go by the pod plans
    themselves, not their count, or the job's phase and conditions would be the previous plan's."""
    snap = cluster(40, 4, 12, 3)
    first = both(snap, None)
    pending = []
    for pp in first.pods:
        if pp.action == "create" and pp.node is not None:
            pending.append({
                "kind": "Pod",
                "metadata": {"name": pp.name, "namespace": pp.namespace, "uid": f"uid-{_rv()}",
                             "resourceVersion": _rv(),
                             "labels": {LABEL_JOB: pp.job, LABEL_POOL: pp.pool, LABEL_MANAGED: "true"}},
                "spec": {"containers": [{"name": "c", "resources": {"requests": pp.requests}}]},
                "status": {"phase": "Pending"},
            })
    created = Snapshot(snap.nodes, tuple(pending), snap.pools, snap.jobs, snap.profiles)
    second = both(created, first)
    assert {p.action for p in second.pods} == {"bind"}
    assert any(len(second.jobs[key].pods) == len(first.jobs[key].pods) for key in second.jobs)
    bound = applied(created, second)
    third = both(bound, second)
    assert {p.action for p in third.pods} == {"keep"}
    assert any(job.phase == "Running" for job in third.jobs.values())
