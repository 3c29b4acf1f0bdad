"""Issue 32's remark: a quiet cluster's Budget statuses were rewritten every 300 s. A plan of an unchanged cluster
writes nothing (the brief's scheduler duty), so the Budget writer writes only when something but the spend's
bookkeeping changes; the writes are counted at the client over an hour of plans of an unchanged cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from walras.kube.client import KubeClient

from tests.test_budgets_operator import T0, Clock, _budget, _controller, _setup, _status


def _counting(client: KubeClient) -> list[str]:
    """Wrap ``client.patch_status`` so that every Budget status write is recorded (its path)."""
    paths: list[str] = []
    inner = client.patch_status

    async def patch_status(path: str, body: Any, *args: Any, **kwargs: Any) -> Any:
        if "/budgets/" in path:
            paths.append(path)
        return await inner(path, body, *args, **kwargs)

    client.patch_status = patch_status  # type: ignore[method-assign]
    return paths


@pytest.mark.asyncio
async def test_an_unchanged_cluster_writes_no_budget_status_over_an_hour(tmp_path: Path) -> None:
    emulator, client = await _setup(tmp_path, [_budget("team-a", 3.0, ["alpha"]), _budget("team-b", 1.0, ["beta"])])
    store, clock = emulator.store, Clock()
    try:
        controller = _controller(client, store, clock)
        writes = _counting(controller.client)
        for _ in range(3):  # the first plans create and bind the pods: the units change, each Budget is written
            await controller.reconcile()
        assert {p.rsplit("/", 1)[-1] for p in writes} == {"team-a", "team-b"}
        spent = _status(store, "team-a")["spent"]
        writes.clear()
        for k in range(1, 13):  # every 300 s for an hour, nothing changes
            clock.now = T0 + 300 * k
            await controller.reconcile()
        assert writes == [], f"{len(writes)} Budget status write(s) on an unchanged cluster: {writes}"
        assert _status(store, "team-a")["spent"] == spent
        # a change is written at once, and only for the Budget it concerns
        rtype = store.by_kind("walras.dev/v1alpha1", "Budget")
        store.patch(rtype, "", "team-b", {"spec": {"share": 2.0}}, "application/merge-patch+json")
        await controller.reconcile()
        assert writes and {p.rsplit("/", 1)[-1] for p in writes} <= {"team-a", "team-b"}
    finally:
        await emulator.stop()


def test_the_tenants_market_of_an_unchanged_cluster_reaches_its_fixed_point() -> None:
    """With tenants (``walras run``'s default) the plans of the examples, their pods Running, reach a fixed point:
    from the second plan after the pods run, prices, allocations and every job's status are the last plan's, and
    two plans later the market's solve is reused (so the operator writes nothing: the e2e quiet test). Before the
    market weights were warm-started (``Plan.market_weights``), each plan restarted the budget fixed point from the
    budgets and its prices moved within the tolerance on every plan, rewriting every job's cost."""
    from pathlib import Path as _Path

    from walras.kube.decode import cluster_from
    from walras.kube.encode import plan_document
    from walras.manifests import load_manifests
    from walras.planner import build_plan
    from walras.planner.cluster import TenantOptions
    from walras.planner.plan import PlanOptions
    from walras.planner.reuse import PlanCache

    from bench.planner import running

    root = _Path(__file__).resolve().parents[1]
    snapshot = load_manifests([root / "examples", root / "operator/walras/data/emulated-nodes.yaml"], validate=False)
    cache = PlanCache()

    def plan(snap: Any, previous: Any, k: int) -> Any:
        return build_plan(cluster_from(snap), previous, cache=cache,
                          options=PlanOptions(tenants=TenantOptions(), now=1000.0 + 30 * k))

    first = plan(snapshot, None, 0)
    steady = running(snapshot, first)
    plans = [first]
    for k in range(1, 6):
        plans.append(plan(steady, plans[-1], k))
    assert all(p.market_weights for p in plans)  # the tenants' market ran and recorded its weights

    def said(p: Any) -> Any:
        body = plan_document(p)
        return body["pools"], body["jobs"]

    assert said(plans[2]) == said(plans[3]) == said(plans[4]) == said(plans[5])
    assert [p.solver.reused for p in plans[4:]] == [True, True]
    assert all(pp.action == "keep" for p in plans[2:] for pp in p.pods)
