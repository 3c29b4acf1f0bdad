"""Issue 30 item 2 in a set-up with one kube-scheduler whose extender binds (``bindVerb``): kube-scheduler sends the
extender every pod it schedules, so Walras binds a pod it does not manage as the default binder would
(``pods/binding``), but only where the node still has room for it, counting the pods bound there and the operator's
assumed pods (:meth:`walras.operator.controller.Controller.bind_foreign`, :func:`walras.planner.capacity.room_for`):
never an over-commit, never a Walras pod outside its plan. The controller runs against a fake API client that
records the bindings."""

from __future__ import annotations

from typing import Any

import pytest
from walras.extender import Extender
from walras.kube.decode import cluster_from, pod_from
from walras.kube.errors import Conflict
from walras.operator.controller import Controller, OperatorOptions
from walras.planner import Snapshot
from walras.planner.capacity import node_table
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, Plan

from tests.planning import build_plan


class Api:
    """Records ``pods/binding`` calls; every binding succeeds."""

    def __init__(self) -> None:
        self.bound: list[tuple[str, str, str]] = []

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> bool:
        self.bound.append((namespace, name, node))
        return True


def node(name: str, gpus: str = "4") -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": {}}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": gpus, "cpu": "32", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, node_name: str | None, gpus: str = "1", job: str | None = None,
        namespace: str = "ml") -> dict[str, Any]:
    labels = {LABEL_JOB: job, LABEL_MANAGED: "true"} if job else {}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": gpus}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"kind": "Pod", "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                                        "labels": labels},
            "spec": spec, "status": {"phase": "Running" if node_name else "Pending"}}


def controller(pods: list[dict[str, Any]]) -> tuple[Controller, Api]:
    api = Api()
    snap = Snapshot(nodes=(node("n0"), node("n1")), pods=tuple(pods))
    return Controller(api, lambda: snap, build_plan, OperatorOptions(mode="extender")), api  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_foreign_pod_is_bound_only_where_the_node_has_room() -> None:
    running = [pod(f"w-{k}", "n0", job="w") for k in range(3)]  # 3 of n0's 4 GPUs held
    big = pod("high", None, gpus="4", namespace="e2e")
    small = pod("small", None, gpus="1", namespace="e2e")
    ctl, api = controller([*running, big, small])
    with pytest.raises(Conflict, match=r"has 1 nvidia\.com/gpu free, the pod requests 4"):
        await ctl.bind_foreign("e2e", "high", "uid-high", "n0")
    assert api.bound == []
    await ctl.bind_foreign("e2e", "high", "uid-high", "n1")  # an empty node: bound
    await ctl.bind_foreign("e2e", "small", "uid-small", "n0")  # the last GPU of n0
    assert api.bound == [("e2e", "high", "n1"), ("e2e", "small", "n0")]
    # the assumed binding counts until the watch shows it: n0 is full now, nothing more goes there
    other = pod("late", None, gpus="1", namespace="e2e")
    ctl.source = lambda: Snapshot(nodes=(node("n0"), node("n1")), pods=(*running, big, small, other))
    with pytest.raises(Conflict, match=r"has 0 nvidia\.com/gpu free"):
        await ctl.bind_foreign("e2e", "late", "uid-late", "n0")
    with pytest.raises(Conflict, match="the node does not exist"):
        await ctl.bind_foreign("e2e", "late", "uid-late", "gone")
    with pytest.raises(Conflict, match="cache"):
        await ctl.bind_foreign("e2e", "unknown", "u", "n1")
    # every binding leaves the cluster without an over-commit (the invariants' node table)
    after = [*running, {**big, "spec": {**big["spec"], "nodeName": "n1"}},
             {**small, "spec": {**small["spec"], "nodeName": "n0"}}]
    snap = Snapshot(nodes=(node("n0"), node("n1")), pods=tuple(after))
    assert node_table(cluster_from(snap)).over_committed() == []


@pytest.mark.asyncio
async def test_a_walras_pod_is_never_bound_as_a_foreign_one() -> None:
    stray = pod("w-9", None, job="w")
    ctl, api = controller([stray])
    with pytest.raises(Conflict, match="binds it only to its planned node"):
        await ctl.bind_foreign("ml", "w-9", "uid-w-9", "n0")
    assert api.bound == [] and pod_from(stray) is not None


@pytest.mark.asyncio
async def test_the_extender_sends_foreign_pods_to_the_foreign_binder_and_reports_a_refusal() -> None:
    calls: list[tuple[str, str, str, str]] = []

    async def foreign(namespace: str, name: str, uid: str, node_name: str) -> None:
        calls.append((namespace, name, uid, node_name))
        if node_name == "full":
            raise Conflict(409, "Conflict", "node full has 0 nvidia.com/gpu free")

    async def planned(*_: Any) -> None:
        raise AssertionError("a foreign pod never goes to the planned binder")

    ext = Extender(lambda: Plan(), binder=planned, foreign_binder=foreign)
    body = {"PodName": "high", "PodNamespace": "e2e", "PodUID": "u", "Node": "n1"}
    assert await ext.bind(body) == {"error": ""}
    refused = await ext.bind({**body, "Node": "full"})
    assert "0 nvidia.com/gpu free" in refused["error"] and refused["error"].startswith("Walras:")
    assert calls == [("e2e", "high", "u", "n1"), ("e2e", "high", "u", "full")]
    # without a foreign binder (the two-scheduler set-up) a foreign pod is refused, as before
    assert "binds only the pods it manages" in (await Extender(lambda: Plan(), binder=planned).bind(body))["error"]
