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
