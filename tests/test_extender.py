"""walras.extender: kube-scheduler extender v1 JSON over HTTP, answered from a hand-built plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from walras.extender import MAX_EXTENDER_PRIORITY, BadRequest, Extender
from walras.metrics import WalrasMetrics
from walras.planner.model import Plan, PodPlan

FIXTURES = Path(__file__).resolve().parents[1] / "e2e" / "fixtures" / "extender"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def plan_with(node: str | None = "gpu-v100-1") -> Plan:
    return Plan(pods=[PodPlan("ml", "resnet-0", "resnet", "v100", node, action="create"),
                      PodPlan("ml", "resnet-9", "resnet", "v100", "gpu-v100-0", action="delete")])


class Recorder:
    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[str, str, str, str]] = []
        self.fail = fail

    async def __call__(self, namespace: str, name: str, uid: str, node: str) -> None:
        self.calls.append((namespace, name, uid, node))
        if self.fail is not None:
            raise self.fail


def test_filter_nodenames_keeps_only_the_planned_node() -> None:
    ext = Extender(lambda: plan_with())
    result = ext.filter(fixture("filter_nodenames.json"))
    assert result["nodenames"] == ["gpu-v100-1"]
    assert set(result["failedNodes"]) == {"gpu-v100-0", "gpu-k80-0"}
    assert "planned on gpu-v100-1" in result["failedNodes"]["gpu-k80-0"]
    assert result["error"] == ""


def test_filter_full_nodes_returns_a_nodelist() -> None:
    result = Extender(lambda: plan_with()).filter(fixture("filter_nodes.json"))
    assert [n["metadata"]["name"] for n in result["nodes"]["items"]] == ["gpu-v100-1"]
    assert result["nodes"]["kind"] == "NodeList"
    assert set(result["failedNodes"]) == {"gpu-v100-0", "gpu-k80-0"}


def test_unmanaged_pod_passes_through() -> None:
    ext = Extender(lambda: plan_with())
    body = fixture("filter_unmanaged.json")
    assert ext.filter(body) == {"nodenames": body["nodenames"], "failedNodes": {}, "error": ""}
    assert all(h["score"] == 0 for h in ext.prioritize(body))


def test_managed_pod_without_plan_fails_everywhere() -> None:
    result = Extender(lambda: None).filter(fixture("filter_nodenames.json"))
    assert result["nodenames"] == []
    assert "not in the current plan" in result["failedNodes"]["gpu-v100-1"]
    unplaced = Extender(lambda: plan_with(None)).filter(fixture("filter_nodenames.json"))
    assert unplaced["nodenames"] == [] and "no node" in unplaced["failedNodes"]["gpu-v100-0"]


def test_prioritize_scores_the_planned_node_highest() -> None:
    result = Extender(lambda: plan_with()).prioritize(fixture("prioritize_nodenames.json"))
    assert result == [{"host": "gpu-v100-0", "score": 0}, {"host": "gpu-v100-1", "score": MAX_EXTENDER_PRIORITY},
                      {"host": "gpu-k80-0", "score": 0}]


def test_go_style_field_names_are_accepted() -> None:
    body = fixture("filter_nodenames.json")
    go_style = {"Pod": body["pod"], "NodeNames": body["nodenames"]}
    assert Extender(lambda: plan_with()).filter(go_style)["nodenames"] == ["gpu-v100-1"]


def test_plan_index_follows_the_current_plan() -> None:
    current = {"plan": plan_with("gpu-v100-1")}
    ext = Extender(lambda: current["plan"])
    assert ext.filter(fixture("filter_nodenames.json"))["nodenames"] == ["gpu-v100-1"]
    current["plan"] = plan_with("gpu-v100-0")
    assert ext.filter(fixture("filter_nodenames.json"))["nodenames"] == ["gpu-v100-0"]


@pytest.mark.parametrize("body, message", [
    ([], "must be a JSON object"),
    ({"pod": {"metadata": {}}, "nodenames": []}, "metadata.name"),
    ({"pod": {"metadata": {"name": "x"}}}, "either nodes or nodenames"),
    ({"pod": {"metadata": {"name": "x"}}, "nodenames": [1, 2]}, "list of strings"),
    ({"pod": {"metadata": {"name": "x", "labels": {"walras.dev/managed": "true"}}}, "nodes": {"items": [{}]}},
     "items[0]"),
])
def test_malformed_filter_requests(body: Any, message: str) -> None:
    ext = Extender(lambda: plan_with())
    with pytest.raises(BadRequest, match=message.replace("[", r"\[").replace("]", r"\]")):
        ext.filter(body)


@pytest.mark.asyncio
async def test_http_endpoints_bind_and_metrics() -> None:
    metrics = WalrasMetrics()
    binder = Recorder()
    ext = Extender(lambda: plan_with(), binder=binder, metrics=metrics)
    async with TestClient(TestServer(ext.app())) as client:
        resp = await client.post("/scheduler/filter", json=fixture("filter_nodenames.json"))
        assert resp.status == 200 and (await resp.json())["nodenames"] == ["gpu-v100-1"]
        resp = await client.post("/scheduler/prioritize", json=fixture("prioritize_nodenames.json"))
        assert [h["score"] for h in await resp.json()] == [0, 10, 0]
        resp = await client.post("/scheduler/bind", json=fixture("bind.json"))
        assert await resp.json() == {"error": ""}
        assert binder.calls == [("ml", "resnet-0", "6f2b1c1e-0000-4000-8000-000000000001", "gpu-v100-1")]
        wrong = {**fixture("bind.json"), "node": "gpu-k80-0"}
        resp = await client.post("/scheduler/bind", json=wrong)
        assert "planned on gpu-v100-1" in (await resp.json())["error"]
        assert len(binder.calls) == 1
        resp = await client.post("/scheduler/preempt", json=fixture("preempt.json"))
        assert await resp.json() == {"nodeNameToMetaVictims": fixture("preempt.json")["nodeNameToMetaVictims"]}
        resp = await client.post("/scheduler/filter", data=b"{not json")
        assert resp.status == 400 and "malformed filter request" in (await resp.json())["error"]
    text = metrics.exposition().decode()
    assert 'walras_extender_requests_total{code="400",verb="filter"} 1.0' in text
    assert 'walras_extender_requests_total{code="200",verb="bind"} 2.0' in text


@pytest.mark.asyncio
async def test_bind_reports_binder_errors() -> None:
    ext = Extender(lambda: plan_with(), binder=Recorder(RuntimeError("409 Conflict: already bound")))
    result = await ext.bind(fixture("bind.json"))
    assert "already bound" in result["error"]
    assert "no binder" in (await Extender(lambda: plan_with()).bind(fixture("bind.json")))["error"]
    with pytest.raises(BadRequest, match=r"podName|podname"):
        await ext.bind({"node": "x"})


def test_preempt_converts_full_victims() -> None:
    body = {"pod": {"metadata": {"name": "p"}},
            "nodeToVictims": {"n1": {"pods": [{"metadata": {"uid": "u1"}}], "numPDBViolations": 2}}}
    assert Extender(lambda: None).preempt(body) == {
        "nodeNameToMetaVictims": {"n1": {"pods": [{"uid": "u1"}], "numPDBViolations": 2}}}


def test_prioritize_json_matches_the_plain_encoding() -> None:
    ext = Extender(lambda: plan_with())
    body = fixture("prioritize_nodenames.json")
    body["nodenames"].append('odd "name"\\')
    assert json.loads(ext.prioritize_json(body)) == ext.prioritize(body)
