"""walras.extender: kube-scheduler extender v1 requests (Go field names, no JSON tags) over HTTP, answered from a
hand-built plan; what is bound, what a standby answers, and the HTTP limits (body size, read timeout, depth)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from walras.extender import MAX_EXTENDER_PRIORITY, BadRequest, Extender, Limits, start_site
from walras.metrics import WalrasMetrics
from walras.planner.model import Plan, PodPlan

FIXTURES = Path(__file__).resolve().parents[1] / "e2e" / "fixtures" / "extender"
UID = "6f2b1c1e-0000-4000-8000-000000000001"


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


def test_fixtures_use_the_go_field_names() -> None:
    assert set(fixture("filter_nodenames.json")) == {"Pod", "Nodes", "NodeNames"}
    assert set(fixture("filter_nodes.json")) == {"Pod", "Nodes", "NodeNames"}
    assert set(fixture("bind.json")) == {"PodName", "PodNamespace", "PodUID", "Node"}
    assert set(fixture("preempt.json")) == {"Pod", "NodeNameToVictims", "NodeNameToMetaVictims"}
    victims = fixture("preempt_victims.json")["NodeNameToVictims"]
    assert all(set(v) == {"Pods", "NumPDBViolations"} for v in victims.values())


def test_filter_nodenames_keeps_only_the_planned_node_and_marks_the_rest_unresolvable() -> None:
    result = Extender(lambda: plan_with()).filter(fixture("filter_nodenames.json"))
    assert result["nodenames"] == ["gpu-v100-1"]
    assert result["failedNodes"] == {}
    assert set(result["failedAndUnresolvableNodes"]) == {"gpu-v100-0", "gpu-k80-0"}
    assert "planned on gpu-v100-1" in result["failedAndUnresolvableNodes"]["gpu-k80-0"]
    assert result["error"] == ""


def test_filter_full_nodes_returns_the_request_nodelist() -> None:
    body = fixture("filter_nodes.json")
    result = Extender(lambda: plan_with()).filter(body)
    assert result["nodes"]["items"] == [body["Nodes"]["items"][1]]
    assert result["nodes"]["kind"] == "NodeList" and "nodenames" not in result
    assert set(result["failedAndUnresolvableNodes"]) == {"gpu-v100-0", "gpu-k80-0"}


def test_unmanaged_pod_passes_through() -> None:
    ext = Extender(lambda: plan_with())
    body = fixture("filter_unmanaged.json")
    assert ext.filter(body) == {"nodenames": body["NodeNames"], "failedNodes": {}, "failedAndUnresolvableNodes": {},
                                "error": ""}
    assert all(h["score"] == 0 for h in ext.prioritize(body))


def test_managed_pod_without_a_planned_node_fails_resolvably_everywhere() -> None:
    result = Extender(lambda: None).filter(fixture("filter_nodenames.json"))
    assert result["nodenames"] == [] and result["failedAndUnresolvableNodes"] == {}
    assert "not in the current plan" in result["failedNodes"]["gpu-v100-1"]
    unplaced = Extender(lambda: plan_with(None)).filter(fixture("filter_nodenames.json"))
    assert unplaced["nodenames"] == [] and "no node" in unplaced["failedNodes"]["gpu-v100-0"]


def test_prioritize_scores_the_planned_node_highest() -> None:
    result = Extender(lambda: plan_with()).prioritize(fixture("prioritize_nodenames.json"))
    assert result == [{"host": "gpu-v100-0", "score": 0}, {"host": "gpu-v100-1", "score": MAX_EXTENDER_PRIORITY},
                      {"host": "gpu-k80-0", "score": 0}]


def test_keys_match_as_go_decodes_them() -> None:
    """Exact Go names first, then a case-insensitive match; a null field is absent."""
    body = fixture("filter_nodenames.json")
    lower = {"pod": body["Pod"], "nodenames": body["NodeNames"]}
    assert Extender(lambda: plan_with()).filter(lower)["nodenames"] == ["gpu-v100-1"]
    both = {"Pod": body["Pod"], "NodeNames": ["gpu-v100-1"], "nodenames": ["gpu-k80-0"], "Nodes": None}
    assert Extender(lambda: plan_with()).filter(both)["nodenames"] == ["gpu-v100-1"]


def test_plan_index_follows_the_current_plan() -> None:
    current = {"plan": plan_with("gpu-v100-1")}
    ext = Extender(lambda: current["plan"])
    assert ext.filter(fixture("filter_nodenames.json"))["nodenames"] == ["gpu-v100-1"]
    current["plan"] = plan_with("gpu-v100-0")
    assert ext.filter(fixture("filter_nodenames.json"))["nodenames"] == ["gpu-v100-0"]


def test_preempt_reads_full_victims_as_a_non_node_cache_capable_scheduler_sends_them() -> None:
    """Regression: ``NodeNameToVictims`` with ``Pods``/``NumPDBViolations`` was read as ``nodeToVictims``/``pods``,
    so every candidate was dropped (every preemption vetoed)."""
    body = fixture("preempt_victims.json")
    managed = Extender(lambda: plan_with()).preempt(body)  # ml/resnet-0 is planned on gpu-v100-1
    assert managed == {"nodeNameToMetaVictims": {"gpu-v100-1": {
        "pods": [{"uid": "6f2b1c1e-0000-4000-8000-000000000003"}], "numPDBViolations": 1}}}
    unmanaged = Extender(lambda: Plan()).preempt({**body, "Pod": fixture("filter_unmanaged.json")["Pod"]})
    assert unmanaged["nodeNameToMetaVictims"] == {
        "gpu-v100-1": {"pods": [{"uid": "6f2b1c1e-0000-4000-8000-000000000003"}], "numPDBViolations": 1},
        "gpu-k80-0": {"pods": [{"uid": "6f2b1c1e-0000-4000-8000-000000000004"}], "numPDBViolations": 0}}
    assert Extender(lambda: plan_with(None)).preempt(body) == {"nodeNameToMetaVictims": {}}


def test_preempt_meta_victims_pass_through_for_an_unmanaged_pod() -> None:
    body = fixture("preempt.json")
    assert Extender(lambda: plan_with()).preempt(body) == {"nodeNameToMetaVictims": {
        "gpu-k80-0": {"pods": [{"uid": UID}], "numPDBViolations": 0}}}


@pytest.mark.asyncio
async def test_bind_only_planned_pods_and_only_to_their_planned_node() -> None:
    binder = Recorder()
    ext = Extender(lambda: plan_with(), binder=binder)
    assert await ext.bind(fixture("bind.json")) == {"error": ""}
    assert binder.calls == [("ml", "resnet-0", UID, "gpu-v100-1")]
    refusals = {
        "other node": {**fixture("bind.json"), "Node": "gpu-k80-0"},
        "unmanaged pod": {"PodName": "web-1", "PodNamespace": "default", "PodUID": "u", "Node": "gpu-k80-0"},
        "surplus pod being deleted": {"PodName": "resnet-9", "PodNamespace": "ml", "PodUID": "u",
                                      "Node": "gpu-v100-0"},
    }
    for case, body in refusals.items():
        error = (await ext.bind(body))["error"]
        assert error.startswith("Walras:"), case
    assert len(binder.calls) == 1
    unplaced = Extender(lambda: plan_with(None), binder=binder)
    assert "no node" in (await unplaced.bind(fixture("bind.json")))["error"]
    assert "not in the current plan" in (await Extender(lambda: None, binder=binder).bind(fixture("bind.json")))[
        "error"]
    assert len(binder.calls) == 1


@pytest.mark.asyncio
async def test_bind_reports_binder_errors() -> None:
    ext = Extender(lambda: plan_with(), binder=Recorder(RuntimeError("409 Conflict: already bound")))
    assert "already bound" in (await ext.bind(fixture("bind.json")))["error"]
    assert "no binder" in (await Extender(lambda: plan_with()).bind(fixture("bind.json")))["error"]
    with pytest.raises(BadRequest, match="PodName"):
        await ext.bind({"Node": "x", "PodNamespace": "ml"})


@pytest.mark.asyncio
async def test_a_standby_has_no_opinion_binds_nothing_and_is_not_ready() -> None:
    leading = {"now": False}
    binder = Recorder()
    ext = Extender(lambda: plan_with(), binder=binder, leader=lambda: leading["now"])
    body = fixture("filter_nodenames.json")
    assert ext.filter(body)["nodenames"] == body["NodeNames"]
    assert ext.filter(body)["failedAndUnresolvableNodes"] == {}
    assert {h["score"] for h in ext.prioritize(body)} == {0}
    assert set(ext.preempt(fixture("preempt_victims.json"))["nodeNameToMetaVictims"]) == {"gpu-v100-1", "gpu-k80-0"}
    assert "standby" in (await ext.bind(fixture("bind.json")))["error"] and binder.calls == []
    async with TestClient(TestServer(ext.app())) as client:
        assert (await client.get("/readyz")).status == 503
        leading["now"] = True
        assert (await client.get("/readyz")).status == 200
    assert ext.filter(body)["nodenames"] == ["gpu-v100-1"]


DEEP = b"[" * 100_000 + b"]" * 100_000

MALFORMED: list[tuple[str, Any, str]] = [
    ("filter", [], "must be a JSON object"),
    ("filter", {"Pod": {"metadata": {}}, "NodeNames": []}, "Pod.metadata.name"),
    ("filter", {"Pod": {"metadata": {"name": "x"}}}, "either Nodes or NodeNames"),
    ("filter", {"Pod": {"metadata": {"name": "x"}}, "NodeNames": [1, 2]}, "NodeNames[0]"),
    ("filter", {"Pod": {"metadata": {"name": "x"}}, "NodeNames": "n1"}, "NodeNames must be an array"),
    ("filter", {"Pod": {"metadata": {"name": "x", "labels": ["walras.dev/managed"]}}, "NodeNames": []},
     "labels must be an object"),
    ("filter", {"Pod": {"metadata": {"name": "x", "labels": {"walras.dev/managed": True}}}, "NodeNames": []},
     "must be a string"),
    ("filter", {"Pod": {"metadata": {"name": ["x"]}}, "NodeNames": []}, "name must be a string"),
    ("filter", {"Pod": {"metadata": {"name": "x"}}, "Nodes": {"items": [{}]}}, "items[0].metadata"),
    ("filter", {"Pod": {"metadata": {"name": "x"}}, "Nodes": {"items": [{"metadata": {"name": ["n"]}}]}},
     "items[0].metadata.name"),
    ("filter", {"Pod": {"metadata": {"name": "x"}}, "Nodes": {"items": {"a": 1}}}, "items must be an array"),
    ("prioritize", {"Pod": "x", "NodeNames": []}, "Pod must be an object"),
    ("preempt", {"Pod": {"metadata": {"name": "x"}}, "NodeNameToVictims": {"n1": ["pod"]}}, "must be an object"),
    ("preempt", {"Pod": {"metadata": {"name": "x"}}, "NodeNameToVictims": {"n1": {"Pods": [{"metadata": 3}]}}},
     "Pods[0].metadata"),
    ("preempt", {"Pod": {"metadata": {"name": "x"}}, "NodeNameToVictims": {"n1": {"Pods": {}}}}, "Pods must be"),
    ("preempt", {"Pod": {"metadata": {"name": "x"}}, "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": 7}]}}},
     "UID must be a string"),
    ("preempt", {"Pod": {"metadata": {"name": "x"}}, "NodeNameToMetaVictims": {"n1": {"NumPDBViolations": "2"}}},
     "NumPDBViolations must be an integer"),
    ("preempt", {"Pod": {"metadata": {"name": "x"}}, "NodeNameToMetaVictims": []}, "must be an object"),
    ("preempt", {"Pod": {"metadata": {"name": "x"}}}, "NodeNameToVictims or NodeNameToMetaVictims"),
    ("bind", {"PodName": "p", "PodNamespace": "ns", "Node": ["n1"]}, "Node must be a string"),
    ("bind", {"PodName": "p", "PodNamespace": {}, "Node": "n1"}, "PodNamespace must be a string"),
    ("bind", "text", "must be a JSON object"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize("verb, body, message", MALFORMED)
async def test_malformed_requests_are_400_with_the_path(verb: str, body: Any, message: str) -> None:
    status, payload = await Extender(lambda: plan_with(), binder=Recorder()).respond(verb, json.dumps(body).encode())
    assert status == 400, payload
    error = json.loads(payload)["error"]
    assert error.startswith(f"Walras extender: malformed {verb} request") and message in error


@pytest.mark.asyncio
@pytest.mark.parametrize("raw, message", [(DEEP, "nested too deeply"), (b"{not json", "not JSON"),
                                          (b"\xff\xfe\x00", "not JSON"), (b"1" * 5000, "not JSON"), (b"", "not JSON")])
async def test_undecodable_bodies_are_400(raw: bytes, message: str) -> None:
    for verb in ("filter", "prioritize", "bind", "preempt"):
        status, payload = await Extender(lambda: plan_with()).respond(verb, raw)
        assert status == 400 and message in json.loads(payload)["error"]


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
        resp = await client.post("/scheduler/bind", json={**fixture("bind.json"), "Node": "gpu-k80-0"})
        assert "planned on gpu-v100-1" in (await resp.json())["error"]
        assert len(binder.calls) == 1
        resp = await client.post("/scheduler/preempt", json=fixture("preempt_victims.json"))
        assert list((await resp.json())["nodeNameToMetaVictims"]) == ["gpu-v100-1"]
        resp = await client.post("/scheduler/filter", data=b"{not json")
        assert resp.status == 400 and "malformed filter request" in (await resp.json())["error"]
        resp = await client.post("/scheduler/filter", data=DEEP)
        assert resp.status == 400 and "nested too deeply" in (await resp.json())["error"]
    text = metrics.exposition().decode()
    assert 'walras_extender_requests_total{code="400",verb="filter"} 2.0' in text
    assert 'walras_extender_requests_total{code="200",verb="bind"} 2.0' in text


@pytest.mark.asyncio
async def test_a_body_over_the_limit_is_413_without_reading_it() -> None:
    ext = Extender(lambda: plan_with(), limits=Limits(max_body_bytes=4 * 1024 * 1024))
    async with TestClient(TestServer(ext.app())) as client:
        big = b'{"Pod": "' + b"x" * (5 * 1024 * 1024) + b'"}'
        resp = await client.post("/scheduler/filter", data=big)
        assert resp.status == 413 and "limit" in (await resp.json())["error"]

        async def chunked() -> Any:  # no Content-Length: the limit applies while reading
            for _ in range(80):
                yield b" " * 65536

        resp = await client.post("/scheduler/filter", data=chunked())
        assert resp.status == 413 and "exceeds the limit" in (await resp.json())["error"]
        resp = await client.post("/scheduler/filter", json=fixture("filter_nodenames.json"))
        assert resp.status == 200


def _open_half_sent(port: int, count: int, headers_only: bool) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        if headers_only:
            sock.sendall(b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Le")
        else:
            sock.sendall(b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"Pod\": ")
        sock.setblocking(False)
        socks.append(sock)
    return socks


def _closed(sock: socket.socket) -> bool:
    try:
        data = sock.recv(65536)
    except BlockingIOError:
        return False
    except OSError:
        return True
    if data == b"":
        return True
    while True:  # an answer (408) followed by the close
        try:
            more = sock.recv(65536)
        except BlockingIOError:
            return False
        except OSError:
            return True
        if more == b"":
            return True


@pytest.mark.parametrize("headers_only", [False, True], ids=["half-sent bodies", "half-sent headers"])
def test_slow_clients_are_disconnected(headers_only: bool) -> None:
    """200 connections that never finish their request are all closed (408 for a half-sent body, by the
    keep-alive timer for half-sent headers) while a well-formed request is still answered."""

    async def scenario() -> None:
        ext = Extender(lambda: plan_with(), limits=Limits(read_timeout=0.5))
        runner, port = await start_site(ext.app(), "127.0.0.1", 0, options={"keepalive_timeout": 0.5})
        try:
            socks = await asyncio.to_thread(_open_half_sent, port, 200, headers_only)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = json.dumps(fixture("filter_nodenames.json")).encode()
            writer.write(b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            answer = await asyncio.wait_for(reader.read(), 5)
            assert answer.startswith(b"HTTP/1.1 200")
            writer.close()
            deadline = time.monotonic() + 10
            open_socks = socks
            while open_socks and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                open_socks = [s for s in open_socks if not _closed(s)]
            assert not open_socks, f"{len(open_socks)} of 200 slow connections still open after 10 s"
            for s in socks:
                s.close()
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


def test_prioritize_json_matches_the_plain_encoding() -> None:
    ext = Extender(lambda: plan_with())
    body = fixture("prioritize_nodenames.json")
    body["NodeNames"].append('odd "name"\\')
    assert json.loads(ext.prioritize_json(body)) == ext.prioritize(body)
