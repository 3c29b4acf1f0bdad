"""The controller's parts: the watcher triggers on what the planner's decode reads (walras.kube.snapshot.fingerprint),
the snapshot index, and the status writer (one patch per change, a job that is gone is not an error)."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import replace
from typing import Any

from walras.kube.errors import ApiError
from walras.kube.snapshot import fingerprint
from walras.operator.recorder import Recorder
from walras.operator.statuses import StatusWriter
from walras.operator.watch import SnapshotIndex, Watcher
from walras.planner.model import Condition, Plan, PlanEvent, PoolPlan, Snapshot

NODE = {"metadata": {"name": "n1", "uid": "n", "resourceVersion": "1", "labels": {"zone": "a"}},
        "status": {"allocatable": {"cpu": "8", "pods": "110"}, "capacity": {"cpu": "8"},
                   "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "t0"}]}}
POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "1",
                    "labels": {"walras.dev/job": "j", "walras.dev/managed": "true", "other": "x"}},
       "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
       "status": {"phase": "Running"}}
JOB = {"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob",
       "metadata": {"name": "j", "namespace": "ns", "uid": "ju", "generation": 1, "resourceVersion": "1"},
       "spec": {"throughput": {"p": 1.0}, "template": {"spec": {"containers": [{"name": "c"}]}}}}


def changed(obj: dict[str, Any], edit: Any, kind: str) -> bool:
    other = copy.deepcopy(obj)
    edit(other)
    return bool(fingerprint(kind, obj) != fingerprint(kind, other))


def test_the_fingerprint_follows_what_the_decode_reads() -> None:
    # nodes: allocatable, labels, readiness, taints count; heartbeats, capacity and resource versions do not
    assert changed(NODE, lambda n: n["status"]["allocatable"].update(cpu="16"), "Node")
    assert changed(NODE, lambda n: n["metadata"]["labels"].update(zone="b"), "Node")
    assert changed(NODE, lambda n: n["status"]["conditions"][0].update(status="False"), "Node")
    assert changed(NODE, lambda n: n.setdefault("spec", {}).update(unschedulable=True), "Node")
    assert not changed(NODE, lambda n: n["status"]["conditions"][0].update(lastHeartbeatTime="t1"), "Node")
    assert not changed(NODE, lambda n: n["status"]["capacity"].update(cpu="9"), "Node")
    assert not changed(NODE, lambda n: n["metadata"].update(resourceVersion="2"), "Node")
    # pods: node, phase, requests, termination, the start time; other labels do not
    assert changed(POD, lambda p: p["spec"].update(nodeName="n2"), "Pod")
    assert changed(POD, lambda p: p["status"].update(phase="Failed"), "Pod")
    assert changed(POD, lambda p: p["spec"]["containers"][0]["resources"]["requests"].update(cpu="2"), "Pod")
    assert changed(POD, lambda p: p["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"), "Pod")
    assert changed(POD, lambda p: p["status"].update(startTime="2026-01-01T00:00:00Z"), "Pod")
    assert not changed(POD, lambda p: p["metadata"]["labels"].update(other="y"), "Pod")
    # jobs: the spec counts; the status the operator writes does not
    assert changed(JOB, lambda j: j["spec"]["throughput"].update(p=2.0), "FungibleJob")
    assert not changed(JOB, lambda j: j.update(status={"phase": "Running", "failedPods": 3}), "FungibleJob")
    assert not changed(JOB, lambda j: j["metadata"].update(resourceVersion="7"), "FungibleJob")


def test_the_watcher_triggers_on_changes_and_deletions_only() -> None:
    watcher = Watcher()
    assert watcher.changed("Pod", "ADDED", POD) == "Pod ns/p changed"
    assert watcher.changed("Pod", "MODIFIED", {**POD, "metadata": {**POD["metadata"], "resourceVersion": "2"}}) is None
    assert watcher.changed("Pod", "DELETED", POD) == "Pod ns/p deleted"
    assert watcher.changed("Pod", "ADDED", POD) == "Pod ns/p changed", "a deleted object is forgotten"


def test_the_snapshot_index() -> None:
    pool = {"metadata": {"name": "p"}}
    index = SnapshotIndex.of(Snapshot(nodes=(NODE,), pods=(POD,), pools=(pool,), jobs=(JOB,)))
    assert index.pods[("ns", "p")] is POD and index.jobs[("ns", "j")] is JOB and index.pools[("", "p")] is pool
    assert index.involved("FungibleJob", "ns", "j") is JOB and index.involved("ResourcePool", "", "p") is pool
    assert index.involved("Node", "", "n1") is None and index.involved("Pod", "ns", "q") is None


class FakeClient:
    def __init__(self) -> None:
        self.patches: list[tuple[str, Any]] = []
        self.events: list[str] = []
        self.gone: set[str] = set()

    async def patch_status(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        if path in self.gone:
            raise ApiError(404, "NotFound", path)
        self.patches.append((path, patch))
        return {"status": patch["status"]}

    async def post_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
        self.events.append(event["reason"])
        return event


def test_the_status_writer_patches_once_per_change_and_posts_each_event_once() -> None:
    client = FakeClient()
    writer = StatusWriter(client, Recorder(client, "me"))  # type: ignore[arg-type]
    pool_obj = {"apiVersion": "walras.dev/v1alpha1", "kind": "ResourcePool",
                "metadata": {"name": "p", "resourceVersion": "1", "generation": 2}}
    pool = PoolPlan("p", "gpu", "spread", 1, ("n1",), 4.0, 1.0, 0.5, 0.25,
                    conditions=(Condition("Ready", "True", "Priced"),), observed_generation=2)
    event = PlanEvent("ResourcePool", "", "p", "Normal", "Priced", "priced")
    plan = Plan(pools={"p": pool}, events=[event])
    index = SnapshotIndex.of(Snapshot(pools=(pool_obj,)))

    async def run(times: int, plan: Plan) -> None:
        for _ in range(times):
            for call in [*writer.status_calls(plan, index, {}), *writer.event_calls(plan, index)]:
                await call

    asyncio.run(run(3, plan))
    assert len(client.patches) == 1, "the same status is not written again while the cached object is unchanged"
    status = client.patches[0][1]["status"]
    assert status["price"] == 0.5 and status["conditions"][0]["observedGeneration"] == 2
    assert client.events == ["Priced"]
    client.gone.add("/apis/walras.dev/v1alpha1/resourcepools/p")
    asyncio.run(run(1, Plan(pools={"p": replace(pool, price=0.75)})))  # a pool deleted meanwhile: no error
    assert len(client.patches) == 1
