"""Gang jobs in the planner (docs/gangs.md): a gang of N runs all N pods in one pool or none, in every plan.

Unit tests per rule (targets, placement, release, status) and a hypothesis property over random sequences of
cluster changes (node loss past the grace, cordon, a pod evicted or failed, capacity lowered, a restart from an
empty cache) that no plan ever has a partial gang (``walras.planner.invariants``' ``PartialGang``) and the other
plan invariants hold.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from walras.planner.cluster import PODS, Cluster, Job, Node, Pod, Pool
from walras.planner.invariants import check_cluster, check_plan, partial_gangs
from walras.planner.model import REASONS, Plan
from walras.planner.quantity import parse_quantity
from walras.planner.results import PlanOptions
from walras.planner.spec import JobSpec, PoolSpec, UtilitySpec, parse_job

from tests.planning import build_plan

GPU = "nvidia.com/gpu"


def _job(name: str, replicas: int, *, gang: bool = True, throughput: dict[str, float] | None = None,
         utility: str = "log", cpu: float = 1.0) -> Job:
    spec = JobSpec(namespace="ns", name=name, generation=1, throughput=throughput or {"a": 1.0},
                   utility=UtilitySpec(type=utility), demand=1.0, replicas=replicas, min_replicas=replicas,
                   elastic=False, resources={"cpu": cpu}, resource_text={"cpu": f"{cpu:g}"}, colocation_type=None,
                   colocation_size=1.0, curve=None, throughput_demand=None, weight=1.0, gang=gang)
    return Job("ns", name, 1, spec)


def _node(name: str, pool: str = "a", gpus: float = 2.0, cpu: float = 16.0) -> Node:
    return Node(name, {"pool": pool}, {GPU: gpus, "cpu": cpu, "memory": 64 * 2**30, PODS: 110.0})


def _pool(name: str = "a") -> Pool:
    return Pool(name, 1, PoolSpec(name=name, node_selector={"pool": name}, resource=GPU, policy="utility"))


def _applied(cluster: Cluster, plan: Plan) -> Cluster:
    """The cluster after ``plan``: created, bound, kept, resized pods Running on their node; removed ones gone."""
    pods = []
    for p in plan.pods:
        if p.action in ("delete", "evict") or p.node is None:
            continue
        requests = {k: parse_quantity(v) for k, v in p.requests.items()}
        requests[PODS] = 1.0
        pods.append(Pod(p.namespace, p.name, p.node, requests, phase="Running", job=p.job, pool=p.pool,
                        uid=f"uid-{p.name}", started=1.0))
    return replace(cluster, pods=tuple(sorted(pods, key=lambda x: x.key)))


def _live(plan: Plan, job: str) -> list[str]:
    return sorted(p.node or "-" for p in plan.pods if p.job == job and p.action in ("keep", "resize", "bind", "create"))


def _checked(cluster: Cluster, plan: Plan) -> Plan:
    bad = check_plan(cluster, plan)
    assert not bad, [str(v) for v in bad]
    return plan


# --- the spec ----------------------------------------------------------------------------------------------------


def _raw(replicas: object) -> dict[str, object]:
    return {"metadata": {"name": "g", "namespace": "ns"},
            "spec": {"throughput": {"a": 1.0}, "replicas": replicas}}


def test_spec_decodes_gang_with_count_and_refuses_it_with_a_range() -> None:
    assert parse_job(_raw({"count": 4, "gang": True})).gang
    assert not parse_job(_raw({"count": 4})).gang
    for bad in ({"min": 1, "max": 4, "gang": True}, {"gang": True}, {"count": 0, "gang": True}):
        with pytest.raises(ValueError, match="gang"):
            parse_job(_raw(bad))
    with pytest.raises(ValueError, match="true or false"):
        parse_job(_raw({"count": 2, "gang": "yes"}))
    assert "GangNotPlaceable" in REASONS


# --- one rule at a time ------------------------------------------------------------------------------------------


def test_gang_of_four_on_two_nodes_of_two_gpus_runs_four_pods() -> None:
    cluster = Cluster(nodes=(_node("n0"), _node("n1")), pods=(), pools=(_pool(),), jobs=(_job("g", 4),))
    plan = _checked(cluster, build_plan(cluster))
    assert _live(plan, "g") == ["n0", "n0", "n1", "n1"]
    again = build_plan(_applied(cluster, plan), plan)
    assert [p.action for p in again.pods] == ["keep"] * 4  # a fixed point


def test_gang_that_cannot_fit_creates_nothing_and_says_why_with_numbers() -> None:
    cluster = Cluster(nodes=(_node("n0"), _node("n1")), pods=(), pools=(_pool(),), jobs=(_job("g", 5),))
    plan = _checked(cluster, build_plan(cluster))
    assert _live(plan, "g") == []
    gang = {c.type: c for c in plan.jobs[("ns", "g")].conditions}["GangPlaced"]
    assert gang.reason == "GangNotPlaceable"
    # docs/gangs.md shows this message: 4 of 2 x 2 GPUs fit, the fifth pod finds none left
    assert gang.message == ("gang of 5 needs 5 replicas in one pool; best pool 'a' can place 4 now "
                            "(InsufficientCapacity: needs 5 nvidia.com/gpu, 4 free on 2 admitted node(s); "
                            "0 nvidia.com/gpu left free, a pod needs 1)")
    assert [(b.reason, b.replicas) for b in plan.jobs[("ns", "g")].blockers] == [("GangNotPlaceable", 5)]
    assert plan.jobs[("ns", "g")].reason == "GangNotPlaceable"
    plain = replace(cluster, jobs=(_job("g", 5, gang=False),))
    assert len(_live(build_plan(plain), "g")) == 4  # without the gang rule, 4 of 5 run


def test_gang_goes_to_one_pool_never_split() -> None:
    """Two pools of 2 GPUs each: a gang of 4 would fit only split over both pools, so it gets nothing; a gang of
    2 goes whole to one pool."""
    nodes = (_node("a0", "a"), _node("b0", "b"))
    pools = (_pool("a"), _pool("b"))
    four = _job("g", 4, throughput={"a": 1.0, "b": 1.0})
    plan = _checked(Cluster(nodes=nodes, pods=(), pools=pools, jobs=(four,)),
                    build_plan(Cluster(nodes=nodes, pods=(), pools=pools, jobs=(four,))))
    assert _live(plan, "g") == []
    two = _job("g", 2, throughput={"a": 1.0, "b": 2.0})
    cluster = Cluster(nodes=nodes, pods=(), pools=pools, jobs=(two,))
    plan = _checked(cluster, build_plan(cluster))
    assert _live(plan, "g") == ["b0", "b0"]


def test_gang_beside_other_jobs_is_whole_or_absent() -> None:
    cluster = Cluster(nodes=(_node("n0"), _node("n1")), pods=(), pools=(_pool(),),
                      jobs=(_job("g", 3), _job("h", 2, gang=False), _job("k", 2, gang=False)))
    plan = _checked(cluster, build_plan(cluster))
    assert len(_live(plan, "g")) in (0, 3)
    assert sum(1 for p in plan.pods if p.action == "create") <= 4


def test_running_gang_that_loses_a_node_is_restored_whole_where_room_exists() -> None:
    nodes = (_node("n0"), _node("n1"), _node("n2"))
    cluster = Cluster(nodes=nodes, pods=(), pools=(_pool(),), jobs=(_job("g", 4),))
    plan = build_plan(cluster)
    running = _applied(cluster, plan)
    lost_node = next(p.node for p in plan.pods if p.job == "g")
    gone = replace(running, nodes=tuple(n for n in nodes if n.name != lost_node),
                   pods=tuple(p for p in running.pods if p.node != lost_node))
    after = _checked(gone, build_plan(gone, plan))
    assert len(_live(after, "g")) == 4  # two kept, two replacements created on the third node
    assert {p.action for p in after.pods} <= {"keep", "create"}


def test_running_gang_that_loses_a_node_is_released_whole_without_room() -> None:
    nodes = (_node("n0"), _node("n1"))
    cluster = Cluster(nodes=nodes, pods=(), pools=(_pool(),), jobs=(_job("g", 4),))
    plan = build_plan(cluster)
    running = _applied(cluster, plan)
    gone = replace(running, nodes=(nodes[0],), pods=tuple(p for p in running.pods if p.node == "n0"))
    after = _checked(gone, build_plan(gone, plan))
    assert _live(after, "g") == []
    assert sorted(p.action for p in after.pods if p.job == "g") == ["evict", "evict"]  # the Eviction API
    gang = {c.type: c for c in after.jobs[("ns", "g")].conditions}["GangPlaced"]
    assert "released whole" in gang.message


def test_evicted_pod_of_a_gang_is_replaced_in_the_same_plan() -> None:
    nodes = (_node("n0"), _node("n1"))
    cluster = Cluster(nodes=nodes, pods=(), pools=(_pool(),), jobs=(_job("g", 4),))
    plan = build_plan(cluster)
    running = _applied(cluster, plan)
    failed = replace(running, pods=(replace(running.pods[0], phase="Failed", reason="Evicted"), *running.pods[1:]))
    after = _checked(failed, build_plan(failed, plan))
    assert len(_live(after, "g")) == 4


def test_cordon_removes_no_pod_of_a_running_gang() -> None:
    nodes = (_node("n0"), _node("n1"))
    cluster = Cluster(nodes=nodes, pods=(), pools=(_pool(),), jobs=(_job("g", 4),))
    plan = build_plan(cluster)
    running = _applied(cluster, plan)
    cordoned = replace(running, nodes=(replace(nodes[0], unschedulable=True), nodes[1]))
    after = _checked(cordoned, build_plan(cordoned, plan))
    assert [p.action for p in after.pods] == ["keep"] * 4


def test_invariant_flags_a_partial_gang_plan_and_a_partial_running_gang() -> None:
    nodes = (_node("n0"), _node("n1"))
    cluster = Cluster(nodes=nodes, pods=(), pools=(_pool(),), jobs=(_job("g", 4),))
    plan = build_plan(cluster)
    cut = replace(plan, pods=plan.pods[:3])
    assert [v.kind for v in partial_gangs(cluster, cut)] == ["PartialGang"]
    running = _applied(cluster, plan)
    assert not [v for v in check_cluster(running) if v.kind == "PartialGang"]
    three = replace(running, pods=running.pods[:3])
    assert [v.kind for v in check_cluster(three) if v.kind == "PartialGang"] == ["PartialGang"]


# --- property: no plan ever has a partial gang -------------------------------------------------------------------


def _step(rng: random.Random, cluster: Cluster, plan: Plan, now: float) -> tuple[Cluster, bool]:
    """One random change to the cluster after ``plan`` was applied; returns it and whether to restart (plan from no
    previous plan and an empty cache)."""
    applied = _applied(cluster, plan)
    kind = rng.choice(["none", "lose", "notready", "cordon", "uncordon", "evict", "capacity", "add", "restart"])
    nodes = list(applied.nodes)
    pods = list(applied.pods)
    if kind == "lose" and len(nodes) > 1:
        gone = rng.choice(nodes).name
        nodes = [n for n in nodes if n.name != gone]
        pods = [p for p in pods if p.node != gone]
    elif kind == "notready" and nodes:
        k = rng.randrange(len(nodes))
        nodes[k] = replace(nodes[k], ready=False, not_ready_since=now - rng.choice([10.0, 10_000.0]))
    elif kind == "cordon" and nodes:
        k = rng.randrange(len(nodes))
        nodes[k] = replace(nodes[k], unschedulable=True)
    elif kind == "uncordon":
        nodes = [replace(n, unschedulable=False, ready=True, not_ready_since=None) for n in nodes]
    elif kind == "evict" and pods:
        k = rng.randrange(len(pods))
        pods[k] = replace(pods[k], phase="Failed", reason="Evicted")
    elif kind == "capacity" and nodes:
        k = rng.randrange(len(nodes))
        nodes[k] = replace(nodes[k], allocatable={**nodes[k].allocatable, GPU: float(rng.randint(1, 4))})
    elif kind == "add":
        pool = rng.choice(["a", "b"])
        nodes.append(_node(f"{pool}{len(nodes) + rng.randint(10, 99)}", pool, float(rng.randint(1, 4))))
    return replace(applied, nodes=tuple(sorted(nodes, key=lambda n: n.name)),
                   pods=tuple(sorted(pods, key=lambda p: p.key))), kind == "restart"


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_no_plan_ever_has_a_partial_gang(seed: int) -> None:
    print("seed", seed)
    rng = random.Random(seed)
    nodes = tuple(_node(f"{p}{k}", p, float(rng.randint(1, 4))) for p in ("a", "b") for k in range(rng.randint(1, 3)))
    jobs = tuple(_job(f"g{q}", rng.randint(1, 5), gang=rng.random() < 0.7,
                      throughput={p: round(rng.uniform(0.5, 2.0), 2) for p in ("a", "b") if rng.random() < 0.8}
                      or {"a": 1.0}, utility=rng.choice(["log", "linear"]))
                 for q in range(rng.randint(1, 4)))
    cluster = Cluster(nodes=nodes, pods=(), pools=(_pool("a"), _pool("b")), jobs=jobs)
    plan: Plan | None = None
    now = 100_000.0
    for _ in range(8):
        now += 60.0
        options = PlanOptions(now=now, node_loss_grace=300.0)
        plan = build_plan(cluster, plan, options=options)
        bad = check_plan(cluster, plan)
        assert not bad, [str(v) for v in bad]
        gangs = [v for v in check_cluster(_applied(cluster, plan)) if v.kind == "PartialGang"]
        assert not gangs, [str(v) for v in gangs]  # what the plan leaves running
        cluster, restart = _step(rng, cluster, plan, now)
        if restart:
            plan = None


def test_crd_schema_takes_gang_with_count_and_its_cel_rule_refuses_a_range() -> None:
    """``walras.manifests.schema`` checks a manifest against the CRD as the API server does (structural schema and
    CEL, cel-python): ``gang`` with ``count`` is valid; with ``min``/``max``, or with no count, it is refused."""
    from walras.manifests.schema import validate

    def job(replicas: dict[str, object]) -> dict[str, object]:
        return {"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob",
                "metadata": {"name": "g", "namespace": "ns"},
                "spec": {"throughput": {"a": 1.0}, "replicas": replicas,
                         "template": {"spec": {"containers": [{"name": "main", "image": "registry.invalid/x:1"}]}}}}

    assert validate(job({"count": 4, "gang": True})) == []
    assert validate(job({"count": 4, "gang": False})) == []
    assert any("replicas.gang needs replicas.count" in e for e in validate(job({"min": 1, "max": 4, "gang": True})))
    assert any("replicas.gang needs replicas.count" in e for e in validate(job({"count": 0, "gang": True})))
    assert validate(job({"gang": True}))  # no count: refused (count, or min and max)
    assert validate(job({"count": 2, "gang": "yes"}))


def test_explain_shows_the_gang_size_and_why_it_waits() -> None:
    from walras.cli.explain import explain_document, render

    job = _job("g", 5)
    cluster = Cluster(nodes=(_node("n0"), _node("n1")), pods=(), pools=(_pool(),), jobs=(job,))
    plan = build_plan(cluster)
    doc = explain_document(plan, job, ("ns", "g"))
    assert doc["asked"]["gang"] == 5 and doc["reason"] == "GangNotPlaceable"
    text = render(doc)
    assert "a gang of 5: all in one pool or none" in text and "GangNotPlaceable" in text
