"""The planner on the example cluster: the market converges, running pods survive a restart, unplaceable replicas
are not created, and the colocation pool goes through ``allocator.colocation`` (issue 7)."""

from __future__ import annotations

from typing import Any

import cvxpy as cp
import numpy as np
import pytest
from test_planner import bind, check_plan, job, node, pool
from walras.manifests import examples
from walras.planner import Snapshot
from walras.planner import market as market_module
from walras.planner import replicas as replicas_module
from walras.planner import rounds as rounds_module
from walras.planner.spec import UtilitySpec, parse_profile

from allocator import colocation
from tests.planning import build_plan


def _cvxpy_optimum(a: np.ndarray, r: np.ndarray, d: np.ndarray, specs: list[UtilitySpec]) -> float:
    """``max sum_i u_i(a_i^T x_i)`` over the polytope of (4) with CVXPY + Clarabel, for the mixed families."""
    n, m = a.shape
    x = cp.Variable((n, m), nonneg=True)
    t = cp.sum(cp.multiply(a, x), axis=1)
    terms = []
    for i, s in enumerate(specs):
        if s.type == "log":
            terms.append(s.weight * cp.log(t[i]))
        elif s.type == "linear":
            terms.append(s.weight * t[i])
        elif s.type == "power":
            assert s.exponent is not None and 0 < s.exponent < 1
            terms.append(s.weight * cp.power(t[i], s.exponent))
        elif s.type == "alpha-fair":
            assert s.alpha == 2.0
            terms.append(-s.weight * cp.inv_pos(t[i]))
        else:
            assert s.type == "target-priority" and s.target is not None
            terms.append(s.weight * cp.minimum(t[i] - s.target, 0))
    constraints = [cp.sum(x, axis=1) <= 1, cp.sum(cp.multiply(d, x), axis=0) <= r, x[a <= 0] == 0]
    problem = cp.Problem(cp.Maximize(sum(terms)), constraints)
    problem.solve(solver="CLARABEL")
    return float(problem.value)


def test_example_market_converges_within_eps(monkeypatch: pytest.MonkeyPatch) -> None:
    """``walras demo`` printed ``60 iterations, duality gap 3.81, converged=False``: the solver's prices were optimal
    but its allocation was not; the plan now reaches a gap within the allocator's eps (1e-3 n) of the exact optimum."""
    seen: list[tuple[Any, ...]] = []
    real = rounds_module.solve_market

    def spy(*args: Any, **kwargs: Any) -> market_module.MarketResult:
        seen.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(rounds_module, "solve_market", spy)
    plan = build_plan(examples.snapshot())
    assert len(seen) == plan.solver.rounds  # one market solve per market -> placement round
    (a, r, specs, _, d, _, _) = seen[-1]  # the last argument: the MarketSettings
    eps = 1e-3 * a.shape[0]
    assert plan.solver.converged
    assert 0 <= plan.solver.gap <= eps
    optimum = _cvxpy_optimum(a, r, d, list(specs))
    assert plan.solver.dual >= optimum - 1e-6
    assert plan.solver.primal == pytest.approx(optimum, abs=eps)
    # the reported primal is the utility of the priced allocation the jobs' statuses show
    priced = [(jp, next(s for s in specs if s.target == jp.target) if jp.target is not None else None)
              for jp in plan.jobs.values() if jp.allocation]
    assert len(priced) == a.shape[0]
    utilities = market_module.utility_values(list(specs), [1.0] * len(specs),
                                             np.array([jp.priced_throughput for jp in plan.jobs.values()
                                                       if jp.allocation]))
    assert float(utilities.sum()) == pytest.approx(plan.solver.primal, abs=1e-6)


def test_polish_never_lowers_utility_and_stays_feasible() -> None:
    rng = np.random.default_rng(3)
    a = rng.uniform(0.5, 4.0, (6, 3))
    d = np.repeat(rng.integers(1, 3, 6)[:, None].astype(float), 3, axis=1)
    r = np.array([3.0, 4.0, 2.0])
    specs = [UtilitySpec("linear"), UtilitySpec("log"), UtilitySpec("linear", weight=2.0)] * 2
    start = market_module.feasible(np.full((6, 3), 1 / 3), d, r)[0]
    utility = market_module.build_utility(specs, [1.0] * 6)
    out = market_module.polish_allocation(a, r, utility, d, start)
    assert out is not None
    assert np.all(out >= 0) and np.all(out.sum(axis=1) <= 1 + 1e-9)
    assert np.all((d * out).sum(axis=0) <= r + 1e-6)
    values = market_module.utility_values(specs, [1.0] * 6, np.einsum("ij,ij->i", a, out)).sum()
    before = market_module.utility_values(specs, [1.0] * 6, np.einsum("ij,ij->i", a, start)).sum()
    assert values >= before
    assert values == pytest.approx(_cvxpy_optimum(a, r, d, specs), abs=1e-3)


def _two_pools() -> Snapshot:
    nodes = [node("a0", {"gpu": "a"}, **{"nvidia.com/gpu": "4"}), node("b0", {"gpu": "b"}, **{"nvidia.com/gpu": "4"})]
    return Snapshot(nodes=tuple(nodes), pools=(pool("a", "a"), pool("b", "b")), jobs=(job("j", {"a": 1.0, "b": 2.0}),))


def test_running_pods_survive_a_restart_without_previous_plan() -> None:
    """Issue 7: after an operator restart (no previous plan) the market prefers pool b, but the job's two pods run in
    pool a; with the total unchanged they stay (keep), nothing is deleted or created."""
    snap = _two_pools()
    cold = build_plan(snap)
    assert cold.jobs[("ml", "j")].replicas == {"b": 2}
    pods = [
        {
            "kind": "Pod",
            "metadata": {
                "name": f"j-a-{k}",
                "namespace": "ml",
                "labels": {"walras.dev/job": "j", "walras.dev/pool": "a", "walras.dev/managed": "true"},
            },
            "spec": {
                "nodeName": "a0",
                "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
            },
            "status": {"phase": "Running"},
        }
        for k in range(2)
    ]
    restarted = build_plan(Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=snap.jobs, pods=tuple(pods)), None)
    assert [(p.name, p.action, p.node) for p in restarted.pods] == [("j-a-0", "keep", "a0"), ("j-a-1", "keep", "a0")]
    jp = restarted.jobs[("ml", "j")]
    assert jp.replicas == {"a": 2}
    assert jp.phase == "Running"


def test_restart_keeps_every_running_example_pod() -> None:
    snap = examples.snapshot()
    first = build_plan(snap)
    running = Snapshot(
        nodes=snap.nodes, pools=snap.pools, jobs=snap.jobs, profiles=snap.profiles, pods=tuple(bind(first))
    )
    again = build_plan(running, None)
    check_plan(running, again)
    before = {(p.namespace, p.name, p.node) for p in first.pods if p.action != "delete"}
    assert {(p.namespace, p.name, p.node) for p in again.pods if p.action == "keep"} == before
    assert all(p.action == "keep" for p in again.pods)


def test_a_shrinking_job_deletes_only_its_surplus() -> None:
    snap = _two_pools()
    pods = [
        {
            "kind": "Pod",
            "metadata": {
                "name": f"j-{p}-{k}",
                "namespace": "ml",
                "labels": {"walras.dev/job": "j", "walras.dev/pool": p, "walras.dev/managed": "true"},
            },
            "spec": {
                "nodeName": f"{p}0",
                "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
            },
            "status": {"phase": "Running"},
        }
        for p, k in (("a", 0), ("a", 1), ("b", 0))
    ]
    plan = build_plan(Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=snap.jobs, pods=tuple(pods)), None)
    actions = {p.name: p.action for p in plan.pods}
    # 3 run, 2 wanted, all in b by the market: one pod of pool a (the pool furthest above its share) goes
    assert sorted(actions.values()) == ["evict", "keep", "keep"]  # a running pod: through the Eviction API
    assert actions["j-b-0"] == "keep"
    assert plan.jobs[("ml", "j")].replicas == {"a": 1, "b": 1}


@pytest.mark.parametrize(
    ("target", "running", "expected"),
    [([2, 0], [0, 2], [0, 2]), ([1, 1, 2], [0, 3, 0], [0, 3, 1]), ([0, 2], [2, 1], [1, 1]), ([3, 0], [0, 0], [3, 0])],
)
def test_split_replicas(target: list[int], running: list[int], expected: list[int]) -> None:
    out = replicas_module.split_replicas(np.array(target), np.array(running))
    assert out.tolist() == expected
    assert out.sum() == sum(target)


def test_example_plan_creates_no_pod_without_a_node() -> None:
    """The k80 pool's throughput policy and the p100 fair policy place fewer pods than the market's replica count:
    those replicas are not created; the job says so (condition + event) and counts only the placed replicas."""
    plan = build_plan(examples.snapshot())
    assert all(p.node is not None for p in plan.pods if p.action == "create")
    unplaceable = [(key, c) for key, jp in plan.jobs.items() for c in jp.conditions if c.reason == "Unplaceable"]
    for key, condition in unplaceable:
        assert condition.status == "False" and "not created" in condition.message
        assert any(e.name == key[1] and e.reason == "Unplaceable" for e in plan.events)
    for jp in plan.jobs.values():
        placed = [p for p in jp.pods if p.action != "delete" and p.node is not None]
        assert sum(jp.replicas.values()) == len(placed)


def test_unplaceable_replicas_are_reported_not_created() -> None:
    nodes = [node("a0", {"gpu": "a"}, **{"nvidia.com/gpu": "8"})]
    snap = Snapshot(nodes=tuple(nodes), pools=(pool("a", "a", degreeLimit=2),), jobs=(job("j", {"a": 1.0}, count=4),))
    plan = build_plan(snap)
    created = [p for p in plan.pods if p.action == "create"]
    assert len(created) == 2 and all(p.node == "a0" for p in created)
    jp = plan.jobs[("ml", "j")]
    assert jp.replicas == {"a": 2} and jp.wanted == {"a": 4}
    (cond,) = [c for c in jp.conditions if c.type == "ReplicasPlaceable"]
    assert cond.reason == "DegreeLimited" and "2 wanted replica(s) have no node" in cond.message
    assert "'a'" in cond.message and "degree limit" in cond.message
    (scheduled,) = [c for c in jp.conditions if c.type == "Scheduled"]
    assert scheduled.status == "False" and scheduled.reason == "DegreeLimited"
    assert "2 of 4 wanted replica(s) placed" in scheduled.message
    assert any(e.reason == "Unplaceable" and e.type == "Warning" for e in plan.events)


def _cpu_cost(snap: Snapshot, plan: Any) -> float:
    """The modelled cost (001 eq. 1 with the profile's convex cost) of the plan's cpu pods on the cpu nodes."""
    (profile_obj,) = snap.profiles
    profile = parse_profile(profile_obj)
    jobs = {j["metadata"]["name"]: j["spec"] for j in snap.jobs}
    pods = [p for p in plan.pods if p.pool == "cpu" and p.action == "create"]
    assert pods and all(p.node is not None for p in pods)
    sizes = np.array([float(jobs[p.job]["colocation"].get("size", 1.0)) for p in pods])
    types = np.array([profile.types.index(jobs[p.job]["colocation"]["type"]) for p in pods])
    names = sorted(plan.pools["cpu"].nodes)
    assignment = np.array([names.index(p.node) for p in pods])
    assert profile.cost == "convex"
    cost = colocation.cost_function(f"power:{profile.exponent:g}")
    return colocation.total_cost(
        sizes, types, np.array(profile.interference), assignment, cost=cost, n_machines=len(names)
    )


def test_colocation_pool_goes_through_allocator_colocation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example cpu pool is placed by allocator.colocation (no PolicyFallback), and its modelled cost is no worse
    than that of the spread fallback on the same pods."""
    snap = examples.snapshot()
    calls: list[str] = []
    real = colocation.partition

    def spy(*args: Any, **kwargs: Any) -> np.ndarray:
        calls.append(kwargs.get("method", ""))
        return real(*args, **kwargs)

    monkeypatch.setattr(colocation, "partition", spy)
    plan = build_plan(snap)
    assert calls == ["auto"]  # later rounds reuse the proposal of an unchanged request
    assert not [c for c in plan.pools["cpu"].conditions if c.reason == "PolicyFallback"]
    assert not [e for e in plan.events if e.reason == "PolicyFallback"]
    planned = _cpu_cost(snap, plan)

    def broken(*args: Any, **kwargs: Any) -> np.ndarray:
        raise ValueError("forced failure")

    monkeypatch.setattr(colocation, "partition", broken)
    fallback_plan = build_plan(snap)
    assert [c for c in fallback_plan.pools["cpu"].conditions if c.reason == "PolicyFallback"]
    assert planned <= _cpu_cost(snap, fallback_plan) + 1e-9
