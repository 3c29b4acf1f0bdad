"""Tenants and caps in whole plans (docs/budgets.md): caps hold in the placed plan, overlapping Budgets, tenants
off changes nothing, the Budget decode refuses malformed specs with a clear error."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from walras.kube.decode import budget_from, cluster_from
from walras.planner import Snapshot, build_plan
from walras.planner.cluster import TenantOptions
from walras.planner.quantity import parse_quantity
from walras.planner.results import PlanOptions

from tests.budgets_reference import budget_doc, capped_cluster

HOLDING = {"create", "bind", "keep", "resize"}


def _snapshot(seed: int, caps: dict[str, float]) -> Snapshot:
    return capped_cluster(np.random.default_rng(seed), caps)


def _held(plan, namespace: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    out: dict[str, float] = {}
    for pod in plan.pods:
        if pod.namespace == namespace and pod.action in HOLDING and pod.node is not None:
            out[pod.pool] = out.get(pod.pool, 0.0) + parse_quantity(pod.requests["nvidia.com/gpu"])
    return out


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 8), st.integers(0, 8))
def test_caps_hold_in_the_placed_plan(seed: int, cap_a: int, cap_b: int) -> None:
    print(f"seed {seed}")
    caps = {"a": float(cap_a), "b": float(cap_b)}
    plan = build_plan(cluster_from(_snapshot(seed, caps)), options=PlanOptions(tenants=TenantOptions()))
    held = _held(plan, "alpha")
    for name, cap in caps.items():
        assert held.get(name, 0.0) <= cap, (held, caps)
    assert plan.tenants["alpha"].units == {k: v for k, v in sorted(held.items())}


def test_tenants_off_is_the_plan_of_today() -> None:
    snap = _snapshot(1, {"a": 1.0})
    off = build_plan(cluster_from(snap))
    again = build_plan(cluster_from(snap), options=PlanOptions())
    assert off.tenants == {} and [p.node for p in off.pods] == [p.node for p in again.pods]
    assert all(j.tenant == "" for j in off.jobs.values())


def test_a_namespace_two_budgets_select_is_planned_under_neither() -> None:
    snap = _snapshot(2, {})
    snap = Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=snap.jobs,
                    budgets=(*snap.budgets, budget_doc("gamma", 5.0, ["beta"])))
    plan = build_plan(cluster_from(snap), options=PlanOptions(tenants=TenantOptions(default_share=0.5)))
    assert plan.tenants["namespace/beta"].share == 0.5
    for name in ("beta", "gamma"):
        overlap = next(c for c in plan.tenants[name].conditions if c.type == "NamespacesOverlap")
        assert overlap.status == "True" and "beta" in overlap.message
    assert {j.tenant for k, j in plan.jobs.items() if k[0] == "beta"} == {"namespace/beta"}
    assert {j.tenant for k, j in plan.jobs.items() if k[0] == "alpha"} == {"alpha"}


@pytest.mark.parametrize(("spec", "error"), [
    ({"namespaces": ["a"]}, "spec.share must be a finite number"),
    ({"share": 0, "namespaces": ["a"]}, "spec.share must be > 0"),
    ({"share": 1}, "a Budget needs spec.namespaceSelector or spec.namespaces"),
    ({"share": 1, "namespaces": ["a"], "caps": [{"pool": "x", "maxUnits": -1}]}, "spec.caps[0].maxUnits must be >= 0"),
    ({"share": 1, "namespaceSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]}},
     "values are required with In and NotIn"),
])
def test_malformed_budgets_get_a_clear_error(spec: dict, error: str) -> None:
    decoded = budget_from({"kind": "Budget", "metadata": {"name": "b"}, "spec": spec})
    assert decoded.spec is None and decoded.error is not None and error in decoded.error


def test_a_selector_selects_namespaces_by_label() -> None:
    raw = {"kind": "Budget", "metadata": {"name": "b"},
           "spec": {"share": 2, "namespaceSelector": {"matchLabels": {"team": "ml"}}}}
    spec = budget_from(raw).spec
    assert spec is not None and spec.selects("x", {"team": "ml"}) and not spec.selects("x", {"team": "web"})


def test_an_unchanged_cluster_with_tenants_reuses_the_previous_solve(monkeypatch: pytest.MonkeyPatch) -> None:
    """With tenants on, a re-plan of an unchanged cluster takes the tenants step's jobs (the same objects), the
    market's result (no solve once its warm prices are a fixed point) and every kept pod from the previous plan,
    changes nothing and equals the plan built without reuse (a Budget with a cap: the running pods are an input)."""
    from dataclasses import replace

    from walras.kube.encode import plan_document
    from walras.planner import rounds
    from walras.planner.invariants import check_plan
    from walras.planner.rounds import MarketEntry
    from walras.planner.tenants import TenantsEntry

    from bench.planner import cluster as bench_cluster
    from bench.planner import running
    from tests.planning import build_plan as planned
    from tests.planning import entry

    solves: list[int] = []
    solve = rounds.solve_market
    monkeypatch.setattr(rounds, "solve_market", lambda *a, **k: (solves.append(1), solve(*a, **k))[1])
    budgets = (budget_doc("first", 2.0, ["team-0", "team-1"], {"p0": 6.0}),)
    options = PlanOptions(tenants=TenantOptions())
    snap = replace(bench_cluster(40, 4, 12, 3), budgets=budgets)
    first = planned(snap, options=options)
    steady = replace(running(snap, first), budgets=budgets)
    plans = [planned(steady, first, options=options)]
    for _ in range(3):
        plans.append(planned(steady, plans[-1], options=options))
    third, fourth = plans[-2:]
    assert [third.pools[k].price for k in sorted(third.pools)] == [fourth.pools[k].price for k in sorted(fourth.pools)]
    solves.clear()
    fifth = planned(steady, fourth, options=options)
    assert solves == [] and fifth.solver.reused
    assert entry(fifth, TenantsEntry).jobs is entry(fourth, TenantsEntry).jobs
    assert entry(fifth, MarketEntry).result.prices is entry(fourth, MarketEntry).result.prices
    assert {p.action for p in fifth.pods} == {"keep"} and fifth.tenants == fourth.tenants
    fresh = planned(steady, fourth, options=replace(options, reuse=False))
    body, other = plan_document(fifth), plan_document(fresh)
    for doc in (body, other):
        doc.pop("seconds")
        doc["solver"].pop("seconds")
        doc["solver"].pop("reused")
    assert body == other and fresh.tenants == fifth.tenants
    assert check_plan(cluster_from(steady), fifth) == []
    assert fifth.tenants["first"].units.get("p0", 0.0) <= 6.0
