"""Nominations (issue 30 item 2, docs/refusals.md): a pod of another controller that kube-scheduler nominated to a
node (``status.nominatedNodeName``, no node yet) at a priority above the Walras pods there has its requests reserved
on that node in the plan: Walras's replacements are never placed into the room its preemption freed, so the
preempt / re-create livelock cannot start. Every plan is checked with the shared invariants (which include
``NominationTaken``)."""

from __future__ import annotations

from typing import Any

from walras.kube.decode import cluster_from, pod_from
from walras.planner import Snapshot
from walras.planner.capacity import node_table, nominations
from walras.planner.invariants import check_plan
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL
from walras.planner.plan import PlanOptions

from tests.planning import build_plan
from tests.test_lifecycle_planner import NOW, job, node, pool


def walras_pod(name: str, node_name: str | None, *, priority: int = 0, terminating: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                            "labels": {LABEL_JOB: "x", LABEL_POOL: "a", LABEL_MANAGED: "true"}}
    if terminating:
        meta["deletionTimestamp"] = "2027-01-15T08:00:00Z"
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
                            "priority": priority}
    if node_name:
        spec["nodeName"] = node_name
    return {"kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": "Running", "startTime": "2027-01-15T07:00:00Z"} if node_name else {"phase": "Pending"}}


def foreign(name: str = "big", *, nominated: str | None = "a0", gpus: str = "4", priority: int = 1000,
            node_name: str | None = None, phase: str = "Pending") -> dict[str, Any]:
    """A default-scheduler pod (no Walras labels) kube-scheduler nominated to ``nominated``."""
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": gpus}}}],
                            "priority": priority, "priorityClassName": "high"}
    if node_name:
        spec["nodeName"] = node_name
    status: dict[str, Any] = {"phase": phase}
    if nominated:
        status["nominatedNodeName"] = nominated
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "other", "uid": f"uid-{name}"}, "spec": spec,
            "status": status}


def creates_on(plan: Any, node_name: str) -> list[str]:
    return sorted(p.name for p in plan.pods if p.action == "create" and p.node == node_name)


def test_decode_reads_the_nomination_and_the_priority() -> None:
    got = pod_from(foreign())
    assert got is not None and got.nominated == "a0" and got.priority == 1000 and got.node is None
    plain = pod_from(walras_pod("x-0", "a0"))
    assert plain is not None and plain.nominated is None and plain.priority == 0
    odd = foreign()
    odd["spec"]["priority"] = "high"  # malformed: ignored, as every malformed field of the decode
    odd["status"]["nominatedNodeName"] = 7
    bad = pod_from(odd)
    assert bad is not None and bad.priority == 0 and bad.nominated is None


def test_the_preempted_node_is_reserved_and_no_replacement_is_placed_there() -> None:
    # 2 x 4 GPUs full of job x (8 replicas); kube-scheduler preempted x-4..x-7 on a1 for a 4-GPU pod of class high
    # and nominated a1: the victims are gone, the nomination stands
    pods = [walras_pod(f"x-{k}", "a0") for k in range(4)]
    snap = Snapshot(nodes=(node("a0"), node("a1")), pools=(pool("a"),), jobs=(job("x", {"a": 1.0}, count=8),),
                    pods=(*pods, foreign(nominated="a1")))
    plan = build_plan(snap, options=PlanOptions(now=NOW))
    assert check_plan(cluster_from(snap), plan) == []
    assert creates_on(plan, "a1") == []  # the 4 GPUs of a1 are held for the nominated pod
    assert [p.action for p in plan.pods if p.job == "x"].count("keep") == 4
    # without the nomination the same cluster re-creates the 4 replicas on a1 (the livelock of issue 30 item 2)
    plain = Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=snap.jobs, pods=(*pods, foreign(nominated=None)))
    assert len(creates_on(build_plan(plain, options=PlanOptions(now=NOW)), "a1")) == 4


def test_while_the_victims_terminate_the_node_stays_full_and_nothing_is_created() -> None:
    pods = [walras_pod(f"x-{k}", "a0") for k in range(4)]
    pods += [walras_pod(f"x-{k}", "a1", terminating=True) for k in range(4, 8)]
    snap = Snapshot(nodes=(node("a0"), node("a1")), pools=(pool("a"),), jobs=(job("x", {"a": 1.0}, count=8),),
                    pods=(*pods, foreign(nominated="a1")))
    plan = build_plan(snap, options=PlanOptions(now=NOW))
    assert check_plan(cluster_from(snap), plan) == []
    assert [p for p in plan.pods if p.action == "create"] == []
    cluster = cluster_from(snap)
    table = node_table(cluster, nominated=nominations(cluster))
    gpu = table.column["nvidia.com/gpu"]
    assert table.used[table.index["a1"], gpu] == 4.0  # the 4 terminating victims free the room the nomination takes
    assert table.used[table.index["a0"], gpu] == 4.0
    assert node_table(cluster_from(snap)).used[table.index["a1"], gpu] == 4.0  # the invariants' table: bound only


def test_a_nomination_of_no_higher_priority_than_the_walras_pods_there_reserves_nothing() -> None:
    pods = [walras_pod(f"x-{k}", "a1", priority=1000) for k in range(2)]
    snap = Snapshot(nodes=(node("a0"), node("a1")), pools=(pool("a"),), jobs=(job("x", {"a": 1.0}, count=8),),
                    pods=(*pods, foreign(nominated="a1", gpus="2", priority=1000)))
    assert nominations(cluster_from(snap)) == {}
    higher = Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=snap.jobs,
                      pods=(*pods, foreign(nominated="a1", gpus="2", priority=1001)))
    assert nominations(cluster_from(higher)) == {("other", "big"): ("a1", None)}
    plan = build_plan(higher, options=PlanOptions(now=NOW))
    assert check_plan(cluster_from(higher), plan) == []
    assert creates_on(plan, "a1") == []  # 2 Walras + 2 held: a1 is full


def test_bound_terminal_terminating_and_walras_nominated_pods_reserve_nothing() -> None:
    bound = foreign("bound", node_name="a1", phase="Running")
    done = foreign("done", phase="Succeeded")
    going = foreign("going")
    going["metadata"]["deletionTimestamp"] = "2027-01-15T08:00:00Z"
    gone_node = foreign("elsewhere", nominated="no-such-node")
    own = walras_pod("x-9", None, priority=5000)
    own["status"]["nominatedNodeName"] = "a1"
    snap = Snapshot(nodes=(node("a0"), node("a1")), pools=(pool("a"),), jobs=(job("x", {"a": 1.0}, count=8),),
                    pods=(bound, done, going, gone_node, own))
    assert nominations(cluster_from(snap)) == {}


def test_a_plan_that_fills_a_nominated_node_breaks_the_nomination_invariant() -> None:
    """The invariant can fail: the plan of the cluster without the nomination, checked against the cluster with
    it, puts replacements into the held room."""
    pods = [walras_pod(f"x-{k}", "a0") for k in range(4)]
    held = Snapshot(nodes=(node("a0"), node("a1")), pools=(pool("a"),), jobs=(job("x", {"a": 1.0}, count=8),),
                    pods=(*pods, foreign(nominated="a1")))
    plain = Snapshot(nodes=held.nodes, pools=held.pools, jobs=held.jobs, pods=(*pods, foreign(nominated=None)))
    found = check_plan(cluster_from(held), build_plan(plain, options=PlanOptions(now=NOW)))
    assert {v.kind for v in found} == {"NominationTaken"} and all(v.object == "Node/a1" for v in found)


def test_a_nomination_the_victims_still_hold_is_not_counted_twice_and_the_job_is_not_shrunk() -> None:
    # while the victims terminate, the room is theirs and then the nominated pod's: counted once, so the market
    # does not shrink the job's 4 pods on a0 to make room it thinks is sold twice
    pods = [walras_pod(f"x-{k}", "a0") for k in range(4)]
    pods += [walras_pod(f"x-{k}", "a1", terminating=True) for k in range(4, 8)]
    snap = Snapshot(nodes=(node("a0"), node("a1")), pools=(pool("a"),), jobs=(job("x", {"a": 1.0}, count=8),),
                    pods=(*pods, foreign(nominated="a1")))
    plan = build_plan(snap, options=PlanOptions(now=NOW))
    assert sorted(p.action for p in plan.pods if p.job == "x" and p.node == "a0") == ["keep"] * 4


def test_a_cleared_nomination_is_held_for_a_while_then_released() -> None:
    """kube-scheduler clears a nomination for a moment when an attempt fails while the victims leave: the plan after
    keeps the room for the still-unbound pod for NOMINATION_HOLD seconds, then offers it again."""
    from walras.planner.capacity import NOMINATION_HOLD

    pods = [walras_pod(f"x-{k}", "a0") for k in range(4)]
    base = dict(nodes=(node("a0"), node("a1")), pools=(pool("a"),), jobs=(job("x", {"a": 1.0}, count=8),))
    nominated = Snapshot(**base, pods=(*pods, foreign(nominated="a1")))  # type: ignore[arg-type]
    cleared = Snapshot(**base, pods=(*pods, foreign(nominated=None)))  # type: ignore[arg-type]
    first = build_plan(nominated, options=PlanOptions(now=NOW))
    assert first.nominations == {("other", "big"): ("a1", NOW)}
    soon = build_plan(cleared, first, options=PlanOptions(now=NOW + 5))
    assert creates_on(soon, "a1") == [] and soon.nominations == {("other", "big"): ("a1", NOW)}
    late = build_plan(cleared, soon, options=PlanOptions(now=NOW + NOMINATION_HOLD))
    assert len(creates_on(late, "a1")) == 4 and late.nominations == {}
    # bound meanwhile: counted as a bound pod, no longer held
    bound = Snapshot(**base, pods=(*pods, foreign(nominated=None, node_name="a1", phase="Running")))  # type: ignore[arg-type]
    after = build_plan(bound, soon, options=PlanOptions(now=NOW + 6))
    assert after.nominations == {} and creates_on(after, "a1") == []
