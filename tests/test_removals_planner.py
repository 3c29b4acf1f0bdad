"""How the planner removes pods (walras.planner.reconcile.removal, walras.planner.lifecycle.disruption): every running
pod leaves through ``evict`` (the Eviction API: PodDisruptionBudgets hold), whatever asks for it; a plain ``delete``
only for a pod that never started, whose node is gone, or that its lost node holds past the grace (``grace=0``), or a
failed pod; a NotReady node's pods are never removed within the grace; a pool (or cluster) mostly NotReady removes
nothing and says so."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from walras.kube.decode import cluster_from
from walras.planner import Plan, Snapshot
from walras.planner.cluster import Pod
from walras.planner.lifecycle import UNHEALTHY_THRESHOLD, disrupted

from tests.test_lifecycle_planner import NOW, PHASES, actions, job, node, plan_of, pod, pool


def allowed_delete(p: Pod, nodes: set[str], plan_grace: int | None) -> bool:
    """The cases where a plain DELETE is allowed (the brief's list, written apart from the planner's rule)."""
    never_started = p.node is None or (p.phase == "Pending" and p.started is None)
    return never_started or p.node not in nodes or plan_grace == 0 or p.phase in ("Failed", "Succeeded")


def running_pods(owner: str, count: int, where: str = "a0") -> list[dict[str, Any]]:
    return [pod(f"{owner}-{k}", owner, where) for k in range(count)]


def removed(plan: Plan, owner: str) -> dict[str, str]:
    return {p.name: p.action for p in plan.pods if p.job == owner and p.action in ("delete", "evict")}


# --- what asks for a removal -----------------------------------------------------------------------------------------


def test_a_market_shrink_evicts_and_never_deletes_a_running_pod() -> None:
    snap = Snapshot(nodes=(node("a0"),), pools=(pool("a"),), jobs=(job("x", {"a": 1.0}, count=2),),
                    pods=tuple(running_pods("x", 4)))
    plan = plan_of(snap)
    assert removed(plan, "x") == {"x-2": "evict", "x-3": "evict"}
    assert all(p.reason.startswith("surplus") and p.grace is None for p in plan.pods if p.action == "evict")


def test_a_capacity_override_evicts_running_pods() -> None:
    capped = pool("a")
    capped["spec"]["capacity"] = 2
    snap = Snapshot(nodes=(node("a0"),), pools=(capped,), jobs=(job("x", {"a": 1.0}, count=4),),
                    pods=tuple(running_pods("x", 4)))
    plan = plan_of(snap)
    got = removed(plan, "x")
    assert len(got) == 2 and set(got.values()) == {"evict"}, got


def test_a_deleted_job_or_an_unusable_pool_evicts_its_running_pods_and_deletes_pending_ones() -> None:
    pods = (*running_pods("gone", 2), pod("gone-p", "gone", None, phase="Pending"),
            pod("x-0", "x", "a0"), pod("x-b", "x", "b0", pool_name="b"))
    snap = Snapshot(nodes=(node("a0"), node("b0", gpu="b")), pools=(pool("a"), pool("b")),
                    jobs=(job("x", {"a": 1.0}, count=2),), pods=pods)
    plan = plan_of(snap)
    assert removed(plan, "gone") == {"gone-0": "evict", "gone-1": "evict", "gone-p": "delete"}
    assert removed(plan, "x") == {"x-b": "evict"}  # its node is in a pool the job cannot use


def test_a_bound_pod_that_never_started_is_deleted_a_started_one_evicted() -> None:
    pods = (pod("x-0", "x", "a0"), pod("x-1", "x", "a0", phase="Pending", started=None),
            pod("x-2", "x", "a0", phase="Pending", started=NOW - 5))
    snap = Snapshot(nodes=(node("a0"),), pools=(pool("a"),), jobs=(job("x", {"a": 1.0}, count=0),), pods=pods)
    assert removed(plan_of(snap), "x") == {"x-0": "evict", "x-1": "delete", "x-2": "evict"}


def test_suspended_and_failed_jobs_evict_their_running_pods() -> None:
    for extra in ({"suspend": True}, {"backoffLimit": 0, "status": {"failedPods": 1}}):
        spec = dict(extra)
        status = spec.pop("status", None)
        snap = Snapshot(nodes=(node("a0"),), pools=(pool("a"),), jobs=(job("x", {"a": 1.0}, count=2, status=status,
                                                                           **spec),),
                        pods=tuple(running_pods("x", 2)))
        plan = plan_of(snap)
        assert removed(plan, "x") == {"x-0": "evict", "x-1": "evict"}, extra
        assert all(not p.reason.startswith("surplus") for p in plan.pods if p.action == "evict")


def test_a_blocked_shrink_is_planned_again_by_the_next_plan_and_no_other_pod_goes() -> None:
    snap = Snapshot(nodes=(node("a0"),), pools=(pool("a"),), jobs=(job("x", {"a": 1.0}, count=2),),
                    pods=tuple(running_pods("x", 4)))
    first = plan_of(snap)
    again = plan_of(snap, first)  # the budget refused: the pods are all still there
    assert removed(again, "x") == removed(first, "x") == {"x-2": "evict", "x-3": "evict"}
    assert actions(again, "x", "keep") == ["x-0", "x-1"] and actions(again, "x", "create") == []


def test_the_churn_budget_counts_evictions() -> None:
    snap = Snapshot(nodes=(node("a0"),), pools=(pool("a"),), jobs=(job("x", {"a": 1.0}, count=0),),
                    pods=tuple(running_pods("x", 3)))
    plan = plan_of(snap, max_deletes=1)
    assert list(removed(plan, "x").values()) == ["evict"]
    assert sum(1 for p in plan.pods if p.reason.startswith("deletion deferred")) == 2


# --- node loss -------------------------------------------------------------------------------------------------------


def _three(ready: list[bool], since: float = NOW - 100, count: int = 4) -> Snapshot:
    nodes = tuple(node(f"a{k}", ready=r, since=None if r else since) for k, r in enumerate(ready))
    pods = tuple(pod(f"x-{k}", "x", f"a{k % len(ready)}") for k in range(6))
    return Snapshot(nodes=nodes, pools=(pool("a"),), jobs=(job("x", {"a": 1.0}, count=count),), pods=pods)


def test_pods_of_a_notready_node_are_never_removed_within_the_grace_the_surplus_comes_from_ready_nodes() -> None:
    # 6 pods on a0, a1, a2 (x-0, x-3 on a0); a0 NotReady; the job wants 4: two of a1/a2's pods go, none of a0's
    snap = _three([False, True, True])
    plan = plan_of(snap)
    gone = removed(plan, "x")
    assert set(gone.values()) == {"evict"} and len(gone) == 2 and not {"x-0", "x-3"} & set(gone), gone
    # the job wants 1: still none of a0's pods goes, and they say why
    few = plan_of(_three([False, True, True], count=1))
    assert "x-0" not in removed(few, "x") and "x-3" not in removed(few, "x")
    held = {p.name: p for p in few.pods if p.name in ("x-0", "x-3")}
    assert all(p.action == "keep" for p in held.values()) and "NotReady" in held["x-3"].reason, held


def test_after_the_grace_only_the_pods_of_nodes_still_lost_are_replaced() -> None:
    snap = _three([False, True, True], since=NOW - 400, count=6)
    plan = plan_of(snap)
    assert removed(plan, "x") == {"x-0": "delete", "x-3": "delete"}
    assert all(p.grace == 0 for p in plan.pods if p.action == "delete")
    assert all(p.node != "a0" for p in plan.pods if p.action == "create") and actions(plan, "x", "create")


def test_a_mostly_notready_pool_removes_nothing_and_says_so() -> None:
    for since in (NOW - 100, NOW - 4000):  # within and past the grace
        snap = _three([False, False, True], since=since, count=2)
        plan = plan_of(snap)
        assert removed(plan, "x") == {}, since
        events = [e for e in plan.events if e.reason == "NodesDisrupted"]
        assert [(e.kind, e.name, e.type) for e in events] == [("ResourcePool", "a", "Warning")]
        assert "2 of the cluster's 3 nodes are NotReady" in events[0].message  # the pool is the whole cluster
    # a pool of a larger, mostly Ready cluster
    other = (node("b0", gpu="b"), node("b1", gpu="b"), node("b2", gpu="b"))
    snap = _three([False, False, True], count=2)
    plan = plan_of(Snapshot(nodes=snap.nodes + other, pools=(pool("a"), pool("b")), jobs=snap.jobs, pods=snap.pods))
    assert removed(plan, "x") == {}
    assert [e.message for e in plan.events if e.reason == "NodesDisrupted"] == [
        "2 of the pool's 3 nodes are NotReady (>= 55%): no pod of the pool is removed until most of its nodes are "
        "Ready again"]
    # the pool recovers to 1 of 3 NotReady past the grace: that node's pods are replaced
    plan = plan_of(_three([False, True, True], since=NOW - 4000, count=6))
    assert removed(plan, "x") == {"x-0": "delete", "x-3": "delete"}
    assert not [e for e in plan.events if e.reason == "NodesDisrupted"]


def test_a_mostly_notready_cluster_holds_every_pool() -> None:
    nodes = (node("a0", ready=False, since=NOW - 4000), node("a1", ready=False, since=NOW - 4000), node("a2"),
             node("b0", gpu="b", ready=False, since=NOW - 4000), node("b1", gpu="b"))
    pods = (pod("x-0", "x", "a0"), pod("x-1", "x", "a2"), pod("y-0", "y", "b0", pool_name="b"),
            pod("y-1", "y", "b1", pool_name="b"))
    snap = Snapshot(nodes=nodes, pools=(pool("a"), pool("b")),
                    jobs=(job("x", {"a": 1.0}, count=0), job("y", {"b": 1.0}, count=2)), pods=pods)
    plan = plan_of(snap)  # 3 of 5 NotReady: 60 %
    assert [p for p in plan.pods if p.action in ("delete", "evict")] == []
    assert sorted(e.name for e in plan.events if e.reason == "NodesDisrupted") == ["a", "b"]


def test_the_threshold_is_kube_controller_managers() -> None:
    assert UNHEALTHY_THRESHOLD == 0.55
    assert [disrupted(d, 20) for d in (10, 11, 12)] == [False, True, True]
    assert not disrupted(0, 0) and not disrupted(0, 5) and disrupted(1, 1)


# --- the rule over random clusters ----------------------------------------------------------------------------------


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Snapshot, float | None]:
    nodes = []
    for k in range(draw(st.integers(1, 4))):
        ready = draw(st.booleans())
        since = None if ready else NOW - draw(st.sampled_from([10, 301, 5000]))
        nodes.append(node(f"a{k}", ready=ready, since=since, gpus="8"))
    names = [n["metadata"]["name"] for n in nodes] + ["gone"]
    capped = pool("a")
    if draw(st.booleans()):
        capped["spec"]["capacity"] = draw(st.integers(0, 4))
    jobs, pods = [], []
    for j in range(draw(st.integers(1, 3))):
        owner = f"j{j}"
        if draw(st.integers(0, 4)) > 0:  # else the job is deleted and its pods are left over
            jobs.append(job(owner, {"a": 1.0}, count=draw(st.integers(0, 4)), suspend=draw(st.booleans()),
                            backoffLimit=draw(st.integers(0, 2))))
        for q in range(draw(st.integers(0, 5))):
            phase = draw(st.sampled_from(PHASES))
            where = draw(st.sampled_from([*names, None]))
            started = draw(st.sampled_from([None, NOW - 100]))
            pods.append(pod(f"{owner}-a-{q}", owner, where, phase=phase if where else "Pending", started=started))
    return (Snapshot(nodes=tuple(nodes), pools=(capped,), jobs=tuple(jobs), pods=tuple(pods)),
            draw(st.sampled_from([None, NOW])))


@settings(max_examples=60, deadline=None)
@given(clusters())
def test_no_running_pod_is_deleted_except_the_allowed_cases(case: tuple[Snapshot, float | None]) -> None:
    snap, now = case
    cluster = cluster_from(snap)
    nodes = {n.name for n in cluster.nodes}
    typed = {p.key: p for p in cluster.pods}
    first = plan_of(snap, now=now)
    second = plan_of(copy.deepcopy(snap), first, now=now)
    for plan in (first, second):
        for p in plan.pods:
            pod_ = typed.get((p.namespace, p.name))
            if p.action == "delete":
                assert pod_ is not None and allowed_delete(pod_, nodes, p.grace), (p, pod_)
            if p.action == "evict":
                assert pod_ is not None and pod_.node in nodes, p
            if p.action in ("delete", "evict") and pod_ is not None and pod_.node in nodes and p.grace != 0 \
                    and not pod_.terminal and (pod_.phase == "Running" or pod_.started is not None):
                down = next(n for n in cluster.nodes if n.name == pod_.node)
                assert down.ready, f"{p} removed from NotReady node {down.name} within the grace"


# --- quiet means quiet ---------------------------------------------------------------------------------------------


def _examples_after_a_cordon_and_a_capacity_change() -> list[Plan]:
    """Five periodic plans of the examples (the operator's caches, a clock moving 30 s a plan) after a cordon of
    gpu-p100-1 and ``spec.capacity: 2`` on the first pool have settled (evicted pods gone, the rest Running)."""
    from pathlib import Path

    from walras.kube.decode import TranslationCache
    from walras.manifests.loader import load_manifests
    from walras.planner import build_plan
    from walras.planner.plan import PlanOptions
    from walras.planner.reuse import PlanCache

    from tests.test_planner import bind

    root = Path(__file__).resolve().parents[1]
    snap = load_manifests([root / "examples", root / "operator" / "walras" / "data" / "emulated-nodes.yaml"])
    cache, translations, clock = PlanCache(), TranslationCache(), [NOW]

    def plan(s: Snapshot, previous: Plan | None) -> Plan:
        clock[0] += 30.0
        return build_plan(cluster_from(s, translations), previous, cache=cache, options=PlanOptions(now=clock[0]))

    nodes = [copy.deepcopy(n) for n in snap.nodes]
    pools = [copy.deepcopy(p) for p in snap.pools]
    for n in nodes:
        if n["metadata"]["name"] == "gpu-p100-1":
            n.setdefault("spec", {})["unschedulable"] = True
    pools[1]["spec"]["capacity"] = 2

    def applied(q: Plan) -> Snapshot:
        pods = [p for p in bind(q) if getattr(q.pod(p["metadata"]["namespace"], p["metadata"]["name"]), "action",
                                              "") != "evict"]
        for p in pods:
            p["metadata"].update(uid=f"uid-{p['metadata']['name']}", resourceVersion="1")
        return Snapshot(nodes=tuple(nodes), pods=tuple(pods), pools=tuple(pools), jobs=snap.jobs,
                        profiles=snap.profiles)

    previous = plan(snap, None)
    plans = []
    for _ in range(8):
        previous = plan(applied(previous), previous)
        plans.append(previous)
    return plans[3:]


def test_settled_examples_plan_the_same_prices_and_pods() -> None:
    plans = _examples_after_a_cordon_and_a_capacity_change()
    prices = [{n: p.price for n, p in plan.pools.items()} for plan in plans]
    assert all(p == prices[0] for p in prices), prices  # bit-identical
    assert all([(p.name, p.action) for p in plan.pods] == [(p.name, p.action) for p in plans[0].pods]
               for plan in plans)


def test_settled_examples_reuse_the_previous_solve() -> None:
    plans = _examples_after_a_cordon_and_a_capacity_change()
    assert all(plan.solver.reused for plan in plans), [(p.solver.reused, p.solver.rounds) for p in plans]
