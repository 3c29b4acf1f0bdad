"""The pure planner: quantities, spec validation, rounding, policies, build_plan invariants and bad input."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from walras.kube.decode import cluster_from
from walras.kube.encode import plan_document
from walras.manifests import load_manifests
from walras.planner import Plan, Snapshot, invariants
from walras.planner import rounds as rounds_module
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL
from walras.planner.policies import (
    REGISTRY,
    PlacementRequest,
    PlacementResult,
    SpreadPolicy,
    check_result,
    curve_values,
    get_policy,
)
from walras.planner.quantity import format_quantity, parse_quantity
from walras.planner.replicas import largest_remainder
from walras.planner.spec import CurveSpec, JobSpec, PoolSpec, UtilitySpec, parse_job, parse_pool, parse_profile

from tests.planning import build_plan

ROOT = Path(__file__).resolve().parents[1]


# --- small cluster builders ------------------------------------------------------------------------------------------


def node(name: str, labels: dict[str, str], **alloc: str) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {"allocatable": dict(alloc), "conditions": [{"type": "Ready", "status": "True"}]},
    }


def pool(name: str, label: str, resource: str = "nvidia.com/gpu", policy: str = "utility", **extra: Any) -> dict:
    spec: dict[str, Any] = {"nodeSelector": {"gpu": label}, "resource": resource, "policy": {"type": policy}}
    for key in ("utility", "colocation", "throughput", "fair"):
        if key in extra:
            spec["policy"][key] = extra.pop(key)
    spec.update(extra)
    return {"kind": "ResourcePool", "metadata": {"name": name}, "spec": spec}


def job(name: str, throughput: dict[str, float], count: int = 2, ns: str = "ml", **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "throughput": throughput,
        "utility": {"type": "log"},
        "replicas": {"count": count},
        "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
    }
    spec.update(extra)
    return {"kind": "FungibleJob", "metadata": {"name": name, "namespace": ns, "generation": 3}, "spec": spec}


def small_cluster() -> Snapshot:
    nodes = [node(f"a{k}", {"gpu": "a"}, **{"nvidia.com/gpu": "4", "cpu": "16"}) for k in range(2)]
    nodes += [node(f"b{k}", {"gpu": "b"}, **{"nvidia.com/gpu": "4", "cpu": "16"}) for k in range(2)]
    pools = [pool("a", "a", degreeLimit=3), pool("b", "b")]
    jobs = [
        job("j1", {"a": 1.0, "b": 3.0}, count=3),
        job("j2", {"a": 2.0, "b": 2.5}, count=2),
        job("j3", {"a": 1.0, "b": 1.0}, count=2),
    ]
    return Snapshot(nodes=tuple(nodes), pools=tuple(pools), jobs=tuple(jobs))


def bind(plan: Plan, phase: str = "Running") -> list[dict[str, Any]]:
    """Pods as the operator would have created and bound them from ``plan``."""
    out = []
    for p in plan.pods:
        if p.action == "delete":
            continue
        spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": dict(p.requests)}}]}
        if p.node is not None and phase == "Running":
            spec["nodeName"] = p.node
        labels = {LABEL_JOB: p.job, LABEL_POOL: p.pool, LABEL_MANAGED: "true"}
        out.append(
            {
                "kind": "Pod",
                "metadata": {"name": p.name, "namespace": p.namespace, "labels": labels},
                "spec": spec,
                "status": {"phase": phase},
            }
        )
    return out


def check_plan(snapshot: Snapshot, plan: Plan) -> None:
    """Invariants of every plan: the shared checker (every resource of every node, no double binding, no duplicate
    or lost pod), plus degree limits, the pools' used capacity and the jobs' totals."""
    assert invariants.check_plan(cluster_from(snapshot), plan) == []
    alloc = {n["metadata"]["name"]: n["status"]["allocatable"] for n in snapshot.nodes}
    names = [(p.namespace, p.name) for p in plan.pods]
    assert len(names) == len(set(names))
    for pool_name, pp in plan.pools.items():
        if not pp.resource:
            continue
        degree = next(
            (p["spec"].get("degreeLimit") for p in snapshot.pools if p["metadata"]["name"] == pool_name), None
        )
        for n in pp.nodes:
            live = [p for p in plan.pods if p.node == n and p.action != "delete"]
            total = sum(parse_quantity(p.requests.get(pp.resource, "0")) for p in live)
            assert total <= parse_quantity(alloc[n].get(pp.resource, "0")) + 1e-6, (n, total)
            if degree is not None:
                assert len(live) <= degree
        assert pp.used <= pp.capacity + 1e-6
    for jp in plan.jobs.values():
        live = [p for p in jp.pods if p.action != "delete"]
        assert len(live) == sum(jp.replicas.values())
        for pool_name, count in jp.replicas.items():
            assert sum(1 for p in live if p.pool == pool_name) == count
        assert all(v >= -1e-9 for v in jp.allocation.values())
        assert sum(jp.allocation.values()) <= 1 + 1e-6


# --- quantities -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"), [("2", 2.0), ("500m", 0.5), ("16Gi", 16 * 2**30), ("1k", 1000.0), ("1.5", 1.5), (3, 3.0)]
)
def test_parse_quantity(text: Any, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value)


@pytest.mark.parametrize("bad", ["four", "1.2.3", "-1", True, None, "5Qi"])
def test_parse_quantity_rejects_with_field_name(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"spec\.x"):
        parse_quantity(bad, "spec.x")


def test_format_quantity() -> None:
    assert format_quantity(2.0) == "2"
    assert format_quantity(1.5) == "1500m"
    assert format_quantity(0.25) == "250m"
    assert format_quantity(2 * 1024**3) == "2Gi" and format_quantity(512 * 1024**2) == "512Mi"
    assert format_quantity(3 * 1024**4) == "3Ti" and format_quantity(1536 * 1024**2) == "1536Mi"
    assert format_quantity(1024) == "1024" and format_quantity(2048) == "2048"  # cores or devices: no suffix
    assert format_quantity(1_000_000) == "1000000"
    for value in (2 * 1024**3, 512 * 1024**2, 3 * 1024**4, 1536 * 1024**2, 1024, 0.25, 7.0):
        assert parse_quantity(format_quantity(value)) == value
    with pytest.raises(ValueError):
        format_quantity(-1)


# --- largest remainder ----------------------------------------------------------------------------------------------


def test_largest_remainder_of_a_subnormal_share_and_zeros() -> None:
    """Issue 27: the placement policies' own copy returned -9.2e18 here (a subnormal share scaled to the total
    overflows); they now use :func:`walras.planner.replicas.largest_remainder`, the only definition."""
    assert largest_remainder(np.array([5e-324, 0.0, 0.0]), 12).tolist() == [12, 0, 0]
    from walras.planner import policies

    assert policies.largest_remainder is largest_remainder


def test_largest_remainder_known_cases() -> None:
    assert largest_remainder(np.array([1.5, 1.5, 1.0]), 4).tolist() == [2, 1, 1]
    assert largest_remainder(np.array([0.3, 0.3, 0.4]), 1).tolist() == [0, 0, 1]
    assert largest_remainder(np.array([2.6, 0.2, 1.2]), 4).tolist() == [3, 0, 1]
    with pytest.raises(ValueError, match="all zero"):
        largest_remainder(np.zeros(3), 2)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 20, allow_nan=False), min_size=1, max_size=8))
def test_largest_remainder_preserves_total_and_stays_within_one(shares_list: list[float]) -> None:
    shares = np.array(shares_list)
    total = int(np.floor(shares.sum() + 0.5))
    if shares.sum() == 0:
        assert largest_remainder(shares, 0).tolist() == [0] * shares.size
        return
    out = largest_remainder(shares, total)
    assert out.sum() == total
    assert np.all(out >= 0)
    if np.floor(shares).sum() <= total <= np.ceil(shares).sum():
        assert np.all(np.abs(out - shares) < 1 + 1e-9)
        # Hamilton's method minimises the largest deviation among roundings that keep floors/ceilings.
        assert np.all((out == np.floor(shares)) | (out == np.ceil(shares)))


# --- spec validation --------------------------------------------------------------------------------------------------


def test_parse_pool_and_job_defaults() -> None:
    p = parse_pool(pool("a", "a", degreeLimit=2))
    assert (p.policy, p.degree_limit, p.aa_method, p.extra_degree) == ("utility", 2, "alg2", False)
    j = parse_job(job("x", {"a": 1.0}))
    assert (j.replicas, j.min_replicas, j.elastic, j.demand, j.weight) == (2, 2, False, 1.0, 1.0)
    assert j.utility == UtilitySpec(type="log")
    e = parse_job(job("x", {"a": 1.0}, replicas={"min": 1, "max": 5}))
    assert (e.replicas, e.min_replicas, e.elastic) == (5, 1, True)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"throughput": {"a": -1}}, "spec.throughput"),
        ({"throughput": {}}, "spec.throughput"),
        ({"utility": {"type": "cubic"}}, "spec.utility.type"),
        ({"utility": {"type": "target-priority"}}, "spec.utility.target"),
        ({"replicas": {"min": 3, "max": 2}}, "spec.replicas.min"),
        ({"replicas": {"count": 1, "min": 1}}, "spec.replicas"),
        ({"demand": 0}, "spec.demand"),
        ({"resources": {"cpu": "lots"}}, "spec.resources"),
        ({"utilityCurve": {"points": [{"amount": 2, "value": 1}, {"amount": 1, "value": 2}]}}, "utilityCurve.points"),
        ({"colocation": {"size": 1}}, "spec.colocation.type"),
    ],
)
def test_parse_job_names_the_bad_field(change: dict[str, Any], field: str) -> None:
    obj = job("x", {"a": 1.0})
    obj["spec"].update(change)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        parse_job(obj)


def test_parse_profile_checks_the_matrix() -> None:
    ok = {"metadata": {"name": "p"}, "spec": {"types": ["a", "b"], "interference": [[0, 1], [1, 0]]}}
    assert parse_profile(ok).types == ("a", "b")
    bad = copy.deepcopy(ok)
    bad["spec"]["interference"] = [[0, 1]]
    with pytest.raises(ValueError, match="one row per type"):
        parse_profile(bad)
    bad["spec"]["interference"] = [[0, 1], [1]]
    with pytest.raises(ValueError, match=r"spec\.interference\[1\]"):
        parse_profile(bad)


# --- policies ---------------------------------------------------------------------------------------------------------


def request(
    free: list[float], slots: list[int], demands: list[float], pods: list[int], policy: str = "utility", **pool_kw: Any
) -> PlacementRequest:
    jobs = [
        JobSpec(
            namespace="ns",
            name=f"j{i}",
            generation=None,
            throughput={"p": 1.0},
            utility=UtilitySpec(),
            demand=d,
            replicas=pods[i],
            min_replicas=pods[i],
            elastic=False,
            resources={},
            resource_text={},
            colocation_type=None,
            colocation_size=1.0,
            curve=None,
            throughput_demand=None,
            weight=1.0,
        )
        for i, d in enumerate(demands)
    ]
    spec = PoolSpec(name="p", node_selector={"x": "y"}, resource="nvidia.com/gpu", policy=policy, **pool_kw)
    pod_job = np.repeat(np.arange(len(demands)), pods)
    return PlacementRequest(
        pool=spec,
        node_names=[f"n{k}" for k in range(len(free))],
        free=np.array(free, dtype=float),
        slots=np.array(slots, dtype=np.int64),
        resource_names=["nvidia.com/gpu"],
        node_resources=np.array(free, dtype=float)[:, None],
        jobs=jobs,
        job_pods=np.array(pods, dtype=np.int64),
        job_throughput=np.ones(len(demands)),
        job_replicas_total=np.array(pods, dtype=float),
        pod_job=pod_job,
    )


def test_spread_places_most_free_first_and_respects_limits() -> None:
    req = request([4, 8, 2], [10, 10, 10], [2, 1], [3, 2])
    result = SpreadPolicy().place(req)
    check_result(req, result)
    # decreasing demand, most free node first (ties to the lower index): 2-GPU pods to n1 (8 free), n1 (6), then
    # n0 and n1 both have 4 -> n0; the 1-GPU pods to n1 (4 left... 2 after) and n0 (2) by the same rule.
    assert (result.node >= 0).all()
    assert result.amount.tolist() == [2, 2, 2, 1, 1]
    assert result.node.tolist()[:3] == [1, 1, 0]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 8), min_size=1, max_size=6),
    st.lists(st.integers(0, 4), min_size=1, max_size=6),
    st.lists(st.tuples(st.integers(1, 4), st.integers(0, 5)), min_size=1, max_size=5),
)
def test_spread_never_overfills(free: list[int], slots: list[int], jobs: list[tuple[int, int]]) -> None:
    k = min(len(free), len(slots))
    req = request([float(f) for f in free[:k]], slots[:k], [float(d) for d, _ in jobs], [c for _, c in jobs])
    result = SpreadPolicy().place(req)
    check_result(req, result)
    # A pod stays unplaced only when no node could take it at that point: at least its demand is missing everywhere.
    if (result.node < 0).any():
        demand = req.demand()
        smallest = demand[result.node < 0].min()
        load = np.bincount(result.node[result.node >= 0], weights=result.amount[result.node >= 0], minlength=k)
        count = np.bincount(result.node[result.node >= 0], minlength=k)
        room = (req.free - load >= smallest - 1e-9) & (count < req.slots)
        assert not room.any()


def test_check_result_rejects_overfill_and_degree() -> None:
    req = request([2, 2], [1, 1], [1], [2])
    with pytest.raises(ValueError, match="overfills"):
        check_result(req, PlacementResult(node=np.array([0, 0]), amount=np.array([2.0, 1.0])))
    with pytest.raises(ValueError, match="degree limit"):
        check_result(req, PlacementResult(node=np.array([0, 0]), amount=np.array([1.0, 1.0])))


def test_utility_policy_uses_aa_and_respects_capacity() -> None:
    req = request([4, 4], [3, 3], [1, 2], [3, 2])
    result = get_policy("utility").place(req)
    check_result(req, result)
    assert (result.node >= 0).all()
    assert result.amount.sum() <= 8


def test_utility_policy_gives_units_of_pods_evicted_by_the_degree_limit_to_the_pods_left() -> None:
    """AA puts four pods on one 8-unit node; the degree limit keeps two. Their curves (log(1 + a)) keep gaining, so
    the two get all 8 units between them (4 + 4, the optimal split), not the 2 + 2 they had next to the others."""
    from dataclasses import replace

    from walras.planner.spec import CurveSpec

    req = request([8.0], [2], [2.0], [4])
    job = replace(req.jobs[0], curve=CurveSpec(type="log"))
    req = replace(req, jobs=[job])
    result = get_policy("utility").place(req)
    check_result(req, result)
    placed = result.node >= 0
    assert int(placed.sum()) == 2
    assert sorted(result.amount[placed].tolist()) == [4.0, 4.0]
    assert (result.amount[~placed] == 0).all()


def test_throughput_policy_uses_seq_under_degree_limits() -> None:
    req = request([4, 4, 4], [2, 2, 2], [1, 1, 2], [3, 4, 2], policy="throughput", degree_limit=2)
    result = get_policy("throughput").place(req)
    check_result(req, result)
    placed = result.amount[result.node >= 0].sum()
    assert placed == 6  # 3 nodes x 2 slots: the degree limit, not the 12 GPUs, binds


@pytest.mark.parametrize("mechanism", ["ps-dsf", "pf-vds", "drfh", "tsf"])
def test_fair_policy_uses_the_fairness_mechanism(mechanism: str) -> None:
    alpha = 1.0 if mechanism == "pf-vds" else None
    req = request([4, 2, 3], [3, 3, 3], [1, 2, 1], [3, 2, 6], policy="fair", fair_mechanism=mechanism, fair_alpha=alpha)
    result = get_policy("fair").place(req)
    check_result(req, result)
    placed = result.node >= 0
    per_job = np.bincount(req.pod_job[placed], minlength=3)
    assert np.all(per_job <= req.job_pods)
    assert result.amount[placed].sum() <= 9
    assert per_job.sum() >= 5  # 9 GPUs and 9 slots: a fair mechanism leaves no job starved while capacity remains
    assert np.all(per_job >= 1)


def test_curve_values() -> None:
    assert curve_values(None, 2.0, 4).tolist() == [0, 1, 2, 2, 2]
    pts = CurveSpec(points=((0, 0), (2, 1.0), (4, 1.5)))
    assert curve_values(pts, 1.0, 5).tolist() == pytest.approx([0, 0.5, 1.0, 1.25, 1.5, 1.5])
    log = curve_values(CurveSpec(type="log", scale=2.0), 1.0, 2)
    assert log == pytest.approx(2 * np.log1p(np.arange(3)))


def test_registry_has_one_adapter_per_policy() -> None:
    assert set(REGISTRY) == {"utility", "colocation", "throughput", "fair", "spread"}
    with pytest.raises(ValueError, match="unknown placement policy"):
        get_policy("magic")


# --- build_plan -------------------------------------------------------------------------------------------------------


def test_plan_is_deterministic_and_respects_capacity() -> None:
    snap = small_cluster()
    one, two = build_plan(snap), build_plan(snap)
    a, b = plan_document(one), plan_document(two)
    for d in (a, b):
        d.pop("seconds")
        d["solver"].pop("seconds")
    assert a == b
    check_plan(snap, one)
    assert set(one.pools) == {"a", "b"}
    assert all(p.action == "create" for p in one.pods)
    assert {p.name for p in one.pods} >= {"j1-b-0"}


def test_running_pods_stay_and_job_is_running() -> None:
    snap = small_cluster()
    first = build_plan(snap)
    running = Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=snap.jobs, pods=tuple(bind(first)))
    second = build_plan(running, first)
    check_plan(running, second)
    before = {(p.name, p.node) for p in first.pods if p.node is not None}
    kept = {(p.name, p.node) for p in second.pods if p.action == "keep"}
    assert before <= kept | {(p.name, p.node) for p in second.pods if p.action == "delete"}
    for jp in second.jobs.values():
        if jp.replicas == first.jobs[jp.key].replicas and jp.replicas:
            assert jp.phase == "Running"
            assert all(p.action == "keep" for p in jp.pods)


def test_pending_pods_get_bound_and_surplus_deleted() -> None:
    snap = small_cluster()
    first = build_plan(snap)
    pending = bind(first, phase="Pending")
    extra = copy.deepcopy(pending[0])
    extra["metadata"]["name"] = "stray-pod"
    extra["metadata"]["labels"][LABEL_POOL] = "nowhere"
    snap2 = Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=snap.jobs, pods=(*pending, extra))
    second = build_plan(snap2, first)
    check_plan(snap2, second)
    actions = {p.name: p.action for p in second.pods}
    assert actions["stray-pod"] == "delete"
    assert all(actions[p["metadata"]["name"]] in ("bind", "keep") for p in pending)
    assert any(a == "bind" for a in actions.values())
    assert all(p.exists for p in second.pods if p.action == "bind")


def test_scaling_down_deletes_surplus_running_pods() -> None:
    snap = small_cluster()
    first = build_plan(snap)
    jobs = [copy.deepcopy(j) for j in snap.jobs]
    jobs[0]["spec"]["replicas"] = {"count": 0}
    snap2 = Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=tuple(jobs), pods=tuple(bind(first)))
    second = build_plan(snap2, first)
    j1 = [p for p in second.pods if p.job == "j1"]
    assert j1 and all(p.action == "evict" for p in j1)  # running pods go through the Eviction API
    assert second.jobs[("ml", "j1")].replicas == {}


def test_pods_of_a_job_made_invalid_are_kept() -> None:
    snap = small_cluster()
    first = build_plan(snap)
    jobs = [copy.deepcopy(j) for j in snap.jobs]
    jobs[0]["spec"]["utility"] = {"type": "quadratic"}
    snap2 = Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=tuple(jobs), pods=tuple(bind(first)))
    second = build_plan(snap2, first)
    j1 = [p for p in second.pods if p.job == "j1"]
    assert j1 and all(p.action == "keep" for p in j1)
    assert second.jobs[("ml", "j1")].phase == "Invalid"
    assert {p.name for p in second.jobs[("ml", "j1")].pods} == {p.name for p in j1}


def test_pods_of_deleted_jobs_are_deleted() -> None:
    snap = small_cluster()
    first = build_plan(snap)
    snap2 = Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=snap.jobs[1:], pods=tuple(bind(first)))
    second = build_plan(snap2, first)
    # running pods go through the Eviction API (PodDisruptionBudgets hold), never a plain DELETE
    assert [p.action for p in second.pods if p.job == "j1"] == ["evict"] * sum(1 for p in first.pods if p.job == "j1")


def test_foreign_pods_reduce_capacity() -> None:
    snap = small_cluster()
    hog = {
        "kind": "Pod",
        "metadata": {"name": "hog", "namespace": "other"},
        "spec": {"nodeName": "b0", "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "4"}}}]},
        "status": {"phase": "Running"},
    }
    plan = build_plan(Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=snap.jobs, pods=(hog,)))
    assert not [p for p in plan.pods if p.node == "b0"]
    assert plan.pools["b"].used >= 4


def test_warm_start_passes_previous_prices(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    real = rounds_module.solve_market

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(args[5])
        return real(*args, **kwargs)

    monkeypatch.setattr(rounds_module, "solve_market", spy)
    snap = small_cluster()
    first = build_plan(snap)
    pools = {**first.pools, "a": dataclasses.replace(first.pools["a"], price=0.25),
             "b": dataclasses.replace(first.pools["b"], price=0.75)}
    build_plan(snap, dataclasses.replace(first, pools=pools))
    assert seen[0] is None
    assert seen[1].tolist() == [0.25, 0.75]


def test_not_ready_and_cordoned_nodes_add_no_capacity() -> None:
    snap = small_cluster()
    nodes = [copy.deepcopy(n) for n in snap.nodes]
    nodes[0]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    nodes[1]["spec"]["unschedulable"] = True
    plan = build_plan(Snapshot(nodes=tuple(nodes), pools=snap.pools, jobs=snap.jobs))
    assert plan.pools["a"].node_count == 0
    assert plan.pools["a"].capacity == 0
    assert not [p for p in plan.pods if p.pool == "a"]
    assert any(e.reason == "NoNodes" for e in plan.events)


def test_capacity_override() -> None:
    snap = small_cluster()
    pools = [copy.deepcopy(p) for p in snap.pools]
    pools[1]["spec"]["capacity"] = 3
    plan = build_plan(Snapshot(nodes=snap.nodes, pools=tuple(pools), jobs=snap.jobs))
    assert plan.pools["b"].capacity == 3
    assert plan.pools["b"].used <= 3 + 1e-9


# --- bad input: conditions and Warning events, planning continues -----------------------------------------------------


def warnings(plan: Plan, reason: str) -> list[Any]:
    return [e for e in plan.events if e.type == "Warning" and e.reason == reason]


def test_unknown_pool_job_nowhere_and_infeasible_demand() -> None:
    snap = small_cluster()
    jobs = [
        *snap.jobs,
        job("typo", {"a": 1.0, "zzz": 5.0}),
        job("nowhere", {"zzz": 5.0}),
        job("huge", {"a": 1.0, "b": 1.0}, demand=16),
        {"kind": "FungibleJob", "metadata": {"name": "broken", "namespace": "ml"}, "spec": {"throughput": "x"}},
    ]
    plan = build_plan(Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=tuple(jobs)))
    typo = plan.jobs[("ml", "typo")]
    assert typo.phase != "Invalid"
    assert any(c.type == "PoolsValid" and c.status == "False" and "zzz" in c.message for c in typo.conditions)
    assert [e.name for e in warnings(plan, "PoolUnusable")].count("typo") == 1
    nowhere = plan.jobs[("ml", "nowhere")]
    assert nowhere.phase == "Unschedulable"
    assert warnings(plan, "NoUsablePool")
    huge = plan.jobs[("ml", "huge")]
    assert huge.phase == "Unschedulable"
    assert any(c.type == "Schedulable" and c.reason == "TooLarge" and "largest node" in c.message
               for c in huge.conditions)
    broken = plan.jobs[("ml", "broken")]
    assert broken.phase == "Invalid"
    assert "spec.throughput" in broken.conditions[0].message
    # the valid jobs are still planned
    assert plan.jobs[("ml", "j1")].replicas
    check_plan(snap, plan)


def test_invalid_pool_and_missing_profile() -> None:
    snap = small_cluster()
    bad = pool("c", "c", policy="colocation", colocation={"profile": "absent"})
    broken = pool("d", "d")
    broken["spec"]["policy"] = {"type": "auction"}
    plan = build_plan(Snapshot(nodes=snap.nodes, pools=(*snap.pools, bad, broken), jobs=snap.jobs))
    assert plan.pools["c"].conditions[0].reason == "ProfileNotFound"
    assert plan.pools["d"].conditions[0].reason == "InvalidSpec"
    assert "spec.policy.type" in plan.pools["d"].conditions[0].message
    assert warnings(plan, "ProfileNotFound") and warnings(plan, "InvalidSpec")
    assert plan.jobs[("ml", "j1")].replicas


def test_profile_missing_a_type() -> None:
    nodes = [node(f"c{k}", {"gpu": "cpu"}, cpu="16") for k in range(2)]
    profile = {
        "kind": "ColocationProfile",
        "metadata": {"name": "prof"},
        "spec": {"types": ["web"], "interference": [[0.1]]},
    }
    cpu_pool = pool("cpu", "cpu", resource="cpu", policy="colocation", colocation={"profile": "prof"})
    jobs = [
        job("web", {"cpu": 10.0}, demand=2, colocation={"type": "web", "size": 2}),
        job("db", {"cpu": 10.0}, demand=2, colocation={"type": "database", "size": 2}),
    ]
    plan = build_plan(Snapshot(nodes=tuple(nodes), pools=(cpu_pool,), jobs=tuple(jobs), profiles=(profile,)))
    conds = plan.profiles["prof"]
    assert any(c.type == "TypesComplete" and c.status == "False" and "database" in c.message for c in conds)
    assert warnings(plan, "MissingType")
    assert plan.jobs[("ml", "db")].phase == "Unschedulable"
    assert plan.jobs[("ml", "web")].phase != "Unschedulable"


def test_invalid_profile_gets_a_condition() -> None:
    profile = {"kind": "ColocationProfile", "metadata": {"name": "bad"}, "spec": {"types": ["a"], "interference": []}}
    plan = build_plan(Snapshot(profiles=(profile,)))
    assert plan.profiles["bad"][0].status == "False"
    assert warnings(plan, "InvalidSpec")


def test_failing_policy_falls_back_to_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        name = "utility"

        def place(self, request: PlacementRequest) -> PlacementResult:
            raise RuntimeError("solver exploded")

    monkeypatch.setitem(REGISTRY, "utility", Broken)
    snap = small_cluster()
    plan = build_plan(snap)
    check_plan(snap, plan)
    assert any(c.reason == "PolicyFallback" and "solver exploded" in c.message for c in plan.pools["a"].conditions)
    assert warnings(plan, "PolicyFallback")
    assert any(p.node is not None for p in plan.pods)


@pytest.mark.parametrize(
    ("policy", "params"),
    [
        ("utility", {}),
        ("throughput", {"throughput": {"method": "seq"}}),
        ("fair", {"fair": {"mechanism": "ps-dsf"}}),
        ("fair", {"fair": {"mechanism": "pf-vds", "alpha": 2.0}}),
    ],
)
def test_each_policy_plans_through_its_allocator_module(policy: str, params: dict[str, Any]) -> None:
    nodes = [node(f"g{k}", {"gpu": "g"}, **{"nvidia.com/gpu": str(2 + k), "cpu": "16"}) for k in range(3)]
    pools = [pool("g", "g", policy=policy, degreeLimit=2, **params)]
    jobs = [job(f"j{i}", {"g": 1.0 + i}, count=2, resources={"cpu": "2"}) for i in range(3)]
    snap = Snapshot(nodes=tuple(nodes), pools=tuple(pools), jobs=tuple(jobs))
    plan = build_plan(snap)
    check_plan(snap, plan)
    assert not warnings(plan, "PolicyFallback")
    assert plan.pools["g"].policy == policy
    assert sum(1 for p in plan.pods if p.node is not None) >= 1


def test_plan_pod_lookup_follows_the_pod_list() -> None:
    plan = build_plan(small_cluster())
    first = plan.pods[0]
    assert plan.pod(first.namespace, first.name) is first
    assert plan.pod("ml", "no-such-pod") is None
    extra = dataclasses.replace(first, name="added-later")
    grown = dataclasses.replace(plan, pods=[*plan.pods, extra])  # a plan is frozen: a changed one is a new plan
    assert grown.pod("ml", "added-later") is extra and grown.pods[-1] is extra
    assert plan.pod("ml", "added-later") is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.pods = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.action = "delete"  # type: ignore[misc]


def test_empty_snapshot() -> None:
    plan = build_plan(Snapshot())
    assert plan.pools == {} and plan.jobs == {} and plan.pods == ()


# --- the example cluster ----------------------------------------------------------------------------------------------


def test_examples_plan_respects_every_invariant() -> None:
    snap = load_manifests([ROOT / "examples", ROOT / "operator" / "walras" / "data" / "emulated-nodes.yaml"])
    plan = build_plan(snap)
    check_plan(snap, plan)
    assert sum(1 for p in plan.pods if p.action == "create" and p.node) > 0
    assert set(plan.pools) == {"k80", "p100", "v100", "cpu"}
    assert not [e for e in plan.events if e.type == "Warning" and e.reason in ("InvalidSpec", "PoolUnusable")]
    for jp in plan.jobs.values():
        assert jp.observed_generation is None or isinstance(jp.observed_generation, int)
        assert jp.cost >= 0


def test_pods_on_a_removed_node_are_replaced() -> None:
    snap = small_cluster()
    first = build_plan(snap)
    pods = bind(first)
    lost = next(p for p in pods if p["spec"].get("nodeName") == "b0")
    remaining = tuple(n for n in snap.nodes if n["metadata"]["name"] != "b0")
    snap2 = Snapshot(nodes=remaining, pools=snap.pools, jobs=snap.jobs, pods=tuple(pods))
    second = build_plan(snap2, first)
    check_plan(snap2, second)
    assert second.pod("ml", lost["metadata"]["name"]).action == "delete"
    assert all(p.node != "b0" for p in second.pods if p.action != "delete")


def test_node_selector_needs_every_label() -> None:
    nodes = [
        node("x", {"gpu": "a", "zone": "1"}, **{"nvidia.com/gpu": "4"}),
        node("y", {"gpu": "a", "zone": "2"}, **{"nvidia.com/gpu": "4"}),
        node("z", {"gpu": "b", "zone": "1"}, **{"nvidia.com/gpu": "4"}),
    ]
    two = pool("a1", "a")
    two["spec"]["nodeSelector"]["zone"] = "1"
    alone = build_plan(Snapshot(nodes=tuple(nodes), pools=(two,)))
    assert alone.pools["a1"].nodes == ("x",)
    # pools claim nodes in name order: "a" takes x and y, "a1" keeps none and reports the overlap
    plan = build_plan(Snapshot(nodes=tuple(nodes), pools=(two, pool("a", "a"))))
    assert plan.pools["a"].nodes == ("x", "y")
    assert plan.pools["a1"].nodes == ()
    assert any(c.type == "NodesOverlap" for c in plan.pools["a1"].conditions)
