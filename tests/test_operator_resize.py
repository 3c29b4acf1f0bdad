"""In-place resize end to end in one process: the real planner and the operator's reconcile pass against the emulated
Kubernetes API (not a real cluster), once with ``pods/resize`` served and once on a cluster without it."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import pytest
import yaml
from walras.kube.client import KubeClient, KubeConfig, RetryPolicy
from walras.metrics import WalrasMetrics
from walras.operator import Controller, OperatorOptions
from walras.planner import Snapshot, build_plan
from walras_testbed.emulator import Emulator
from walras_testbed.emulator.store import Store

ROOT = Path(__file__).resolve().parents[1]
POD = ("", "v1", "pods")
NODE = ("", "v1", "nodes")
JOB = ("walras.dev", "v1alpha1", "fungiblejobs")
POOL = ("walras.dev", "v1alpha1", "resourcepools")
EVENT = ("", "v1", "events")


def manifests() -> list[dict[str, Any]]:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-1", "labels": {"gpu": "a"}},
            "status": {"allocatable": {"nvidia.com/gpu": "4", "cpu": "16"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}
    pool = {"apiVersion": "walras.dev/v1alpha1", "kind": "ResourcePool", "metadata": {"name": "a"},
            "spec": {"nodeSelector": {"gpu": "a"}, "resource": "nvidia.com/gpu", "policy": {"type": "throughput"}}}
    job = {"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob",
           "metadata": {"name": "train", "namespace": "default"},
           "spec": {"throughput": {"a": 2.0}, "utility": {"type": "linear"}, "replicas": {"count": 2}, "demand": 1,
                    "resources": {"cpu": "2"},
                    "template": {"spec": {"containers": [{"name": "main", "image": "trainer"}]}}}}
    return [node, pool, job]


class Harness:
    """The emulator, a client and a controller whose snapshot is read straight from the emulator's store."""

    def __init__(self, store: Store, client: KubeClient) -> None:
        self.store = store
        self.client = client
        options = OperatorOptions(debounce=0.0, identity="test-resize")
        self.controller = Controller(client, self.snapshot, build_plan, options, WalrasMetrics())

    def snapshot(self) -> Snapshot:
        s = self.store
        return Snapshot(nodes=tuple(s.list(s.types[NODE], None)), pods=tuple(s.list(s.types[POD], None)),
                        pools=tuple(s.list(s.types[POOL], None)), jobs=tuple(s.list(s.types[JOB], None)))

    def pods(self) -> list[dict[str, Any]]:
        return sorted(self.store.list(self.store.types[POD], "default"), key=lambda p: p["metadata"]["name"])

    def cpu(self) -> list[tuple[str, str]]:
        out = []
        for pod in self.pods():
            resources = pod["spec"]["containers"][0]["resources"]
            out.append((resources["requests"]["cpu"], resources["limits"]["cpu"]))
        return out

    def set_cpu(self, cpu: str) -> None:
        self.store.patch(self.store.types[JOB], "default", "train", {"spec": {"resources": {"cpu": cpu}}},
                         "application/merge-patch+json")

    def job_status(self) -> dict[str, Any]:
        return self.store.get(self.store.types[JOB], "default", "train").get("status", {})

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.store.list(self.store.types[EVENT], "default") if e["reason"] == reason]


async def harness(tmp_path: Path, *, in_place_resize: bool) -> tuple[Emulator, Harness]:
    emulator = Emulator(Store(in_place_resize=in_place_resize))
    await emulator.start()
    emulator.store.apply_manifests(
        d for f in sorted(glob.glob(str(ROOT / "crds" / "*.yaml"))) for d in yaml.safe_load_all(open(f)) if d)
    emulator.store.apply_manifests(manifests())
    kube = KubeConfig.load(str(emulator.write_kubeconfig(tmp_path / "kubeconfig")))
    return emulator, Harness(emulator.store, KubeClient(kube, RetryPolicy(attempts=4, base=0.01, cap=0.05)))


@pytest.mark.asyncio
async def test_running_pods_are_resized_through_pods_resize_where_served(tmp_path: Path) -> None:
    emulator, h = await harness(tmp_path, in_place_resize=True)
    try:
        await h.controller.reconcile()  # creates and binds the two pods
        assert [p["spec"].get("nodeName") for p in h.pods()] == ["gpu-1", "gpu-1"]
        uids = [p["metadata"]["uid"] for p in h.pods()]
        assert h.cpu() == [("2", "2"), ("2", "2")]
        assert await h.client.supports_pod_resize()
        h.set_cpu("3")
        plan = await h.controller.reconcile()
        assert plan is not None and [p.action for p in plan.pods] == ["resize", "resize"]
        # resized in place: same pods (uids), new requests and limits, an Event on each pod
        assert [p["metadata"]["uid"] for p in h.pods()] == uids
        assert h.cpu() == [("3", "3"), ("3", "3")]
        assert [p["status"].get("resize") for p in h.pods()] == ["InProgress", "InProgress"]
        resized = h.events("Resized")
        assert sorted(e["involvedObject"]["name"] for e in resized) == [p["metadata"]["name"] for p in h.pods()]
        assert "cpu 2 -> 3" in resized[0]["message"]
        conditions = {c["type"]: c for c in h.job_status()["conditions"]}
        assert "ResizePending" not in conditions
        # the next plan sees the new resources: nothing left to resize
        plan = await h.controller.reconcile()
        assert plan is not None and [p.action for p in plan.pods] == ["keep", "keep"]
        assert "ResourcesCurrent" not in {c["type"] for c in h.job_status()["conditions"]}
        assert len(h.store.bindings) == 2
    finally:
        await h.client.close()
        await emulator.stop()


@pytest.mark.asyncio
async def test_without_pods_resize_the_change_waits_for_the_next_pod(tmp_path: Path) -> None:
    emulator, h = await harness(tmp_path, in_place_resize=False)
    try:
        await h.controller.reconcile()
        uids = [p["metadata"]["uid"] for p in h.pods()]
        assert not await h.client.supports_pod_resize()  # discovery does not list pods/resize
        h.set_cpu("3")
        plan = await h.controller.reconcile()
        assert plan is not None and [p.action for p in plan.pods] == ["resize", "resize"]
        # nothing was patched: same pods, old resources
        assert [p["metadata"]["uid"] for p in h.pods()] == uids
        assert h.cpu() == [("2", "2"), ("2", "2")]
        await h.controller.reconcile()  # the status written in the first pass is refreshed with the condition
        conditions = {c["type"]: c for c in h.job_status()["conditions"]}
        pending = conditions["ResizePending"]
        assert pending["status"] == "True" and pending["reason"] == "InPlaceResizeUnsupported"
        assert "next pod" in pending["message"] and "cpu 2 -> 3" in pending["message"]
        assert conditions["ResourcesCurrent"]["reason"] == "ResizeNeeded"
        deferred = h.events("ResizeDeferred")
        assert deferred and all(e["involvedObject"]["kind"] == "FungibleJob" for e in deferred)
        assert len(deferred) <= 2  # one per pod message, not one per pass
        assert not h.events("Resized")
        # a new replica is created with the new resources
        h.store.patch(h.store.types[JOB], "default", "train", {"spec": {"replicas": {"count": 3}}},
                      "application/merge-patch+json")
        await h.controller.reconcile()
        assert h.cpu() == [("2", "2"), ("2", "2"), ("3", "3")]
        # the cluster gains in-place resize (an upgrade): after the discovery cache expires the pods are resized
        h.store.set_in_place_resize(True)
        h.client._resize_checked = None
        await h.controller.reconcile()
        assert h.cpu() == [("3", "3"), ("3", "3"), ("3", "3")]
        await h.controller.reconcile()
        assert "ResizePending" not in {c["type"] for c in h.job_status()["conditions"]}
    finally:
        await h.client.close()
        await emulator.stop()


@pytest.mark.asyncio
async def test_emulator_switch_controls_discovery_and_the_path(tmp_path: Path) -> None:
    emulator, h = await harness(tmp_path, in_place_resize=True)
    try:
        listing = await h.client.request("GET", "/api/v1")
        assert any(r["name"] == "pods/resize" for r in listing["resources"])
        h.store.set_in_place_resize(False)
        listing = await h.client.request("GET", "/api/v1")
        assert not any(r["name"] == "pods/resize" for r in listing["resources"])
        assert any(r["name"] == "pods/binding" for r in listing["resources"])
        await h.controller.reconcile()
        name = h.pods()[0]["metadata"]["name"]
        assert await h.client.resize_pod("default", name, [{"name": "main", "resources": {}}]) is False
        # control surface: turn it back on over HTTP
        answer = await h.client.request("POST", "/_emulator/resize", {"enabled": True})
        assert answer == {"inPlaceResize": True}
        h.client._resize_checked = None
        assert await h.client.supports_pod_resize()
    finally:
        await h.client.close()
        await emulator.stop()
