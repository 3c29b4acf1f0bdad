"""Differential test: the same request sequence against the emulated API (:mod:`walras_testbed.emulator`) and the real
kube-apiserver (the session's control plane), comparing status codes, body shapes (``kind``, ``reason`` and a few
step-specific facts) and watch events.

Every step whose observations differ must be listed in ``docs/emulator.md`` (table "Differences") as a known
limitation, and every step listed there must still differ: the test fails when the emulator drifts further from the
real server, and also when a listed difference disappears without the document being updated.
"""

from __future__ import annotations

import json
import re
import secrets
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
import yaml
from walras_testbed.emulator.server import EmulatorThread

from tests.controlplane import ROOT, ControlPlane

DOC = ROOT / "docs" / "emulator.md"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io, application/json"


@dataclass
class Server:
    """One API server reached over HTTP (bearer token and CA for the real one)."""

    url: str
    session: requests.Session
    real: bool = False  # kube-apiserver (with kube-controller-manager's disruption controller), not the emulator

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
             accept: str = "application/json", params: dict[str, str] | None = None) -> tuple[int, Any]:
        resp = self.session.request(method, self.url + path, data=None if body is None else json.dumps(body),
                                    headers={"Content-Type": content_type, "Accept": accept}, params=params,
                                    timeout=15)
        try:
            return resp.status_code, resp.json()
        except ValueError:
            return resp.status_code, resp.text

    def watch(self, path: str, rv: str) -> list[tuple[str, str]]:
        """``(type, name)`` of the events since ``rv`` (a 2 s watch; bookmarks left out)."""
        resp = self.session.get(self.url + path, params={"watch": "true", "resourceVersion": rv,
                                                         "timeoutSeconds": "2"}, stream=True, timeout=15)
        events = []
        for line in resp.iter_lines():
            if line:
                event = json.loads(line)
                if event["type"] != "BOOKMARK":
                    events.append((event["type"], event["object"].get("metadata", {}).get("name", "")))
        return events


def shape(status: int, body: Any, *extra: Any) -> tuple[Any, ...]:
    """What is compared: the code, the body's kind and reason, and step-specific facts."""
    if isinstance(body, dict):
        return (status, body.get("kind"), body.get("reason"), *extra)
    return (status, type(body).__name__, None, *extra)


def pod(name: str, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "registry.invalid/x"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "diff"}}, "spec": spec}


def sequence(server: Server, ns: str, pool_crd: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    """Run the request sequence; one observation per named step."""
    out: dict[str, tuple[Any, ...]] = {}
    pods = f"/api/v1/namespaces/{ns}/pods"

    def step(name: str, fn: Callable[[], tuple[Any, ...]]) -> None:
        out[name] = fn()

    step("namespace create", lambda: shape(*server.call("POST", "/api/v1/namespaces", {
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})))
    status, body = server.call("GET", pods)
    out["list empty"] = shape(status, body, len(body.get("items", [])), "resourceVersion" in body.get("metadata", {}))
    status, created = server.call("POST", pods, pod("p1"))
    rv = created["metadata"]["resourceVersion"]
    stamps = sorted(k for k in ("uid", "resourceVersion", "creationTimestamp") if k in created["metadata"])
    out["create"] = shape(status, created, created.get("status", {}).get("phase"), stamps)
    step("create again", lambda: shape(*server.call("POST", pods, pod("p1"))))
    step("get missing", lambda: shape(*server.call("GET", f"{pods}/nope")))
    status, body = server.call("PATCH", f"{pods}/p1", {"metadata": {"labels": {"tier": "a"}}},
                               "application/merge-patch+json")
    out["merge patch"] = shape(status, body, body.get("metadata", {}).get("labels"))
    status, body = server.call("PATCH", f"{pods}/p1", [{"op": "add", "path": "/metadata/annotations",
                                                        "value": {"k": "v"}}], "application/json-patch+json")
    out["json patch"] = shape(status, body, body.get("metadata", {}).get("annotations"))
    image = {"spec": {"containers": [{"name": "c", "image": "registry.invalid/y"}]}}
    status, body = server.call("PATCH", f"{pods}/p1", image, "application/strategic-merge-patch+json")
    out["strategic patch"] = shape(status, body, [c["image"] for c in body.get("spec", {}).get("containers", [])])
    stale = {**created, "metadata": {**created["metadata"], "labels": {"x": "y"}}}
    step("update with a stale resourceVersion", lambda: shape(*server.call("PUT", f"{pods}/p1", stale)))
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p1"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
    step("bind", lambda: shape(*server.call("POST", f"{pods}/p1/binding", binding)))
    step("bind again", lambda: shape(*server.call("POST", f"{pods}/p1/binding", binding)))
    status, body = server.call("PATCH", f"{pods}/p1/status", {"status": {"phase": "Running"}},
                               "application/merge-patch+json")
    out["status patch"] = shape(status, body, body.get("status", {}).get("phase"))
    status, body = server.call("GET", pods, params={"labelSelector": "tier=a"})
    out["label selector"] = shape(status, body, [p["metadata"]["name"] for p in body.get("items", [])])
    status, body = server.call("GET", pods, params={"fieldSelector": "spec.nodeName=n1"})
    out["field selector"] = shape(status, body, [p["metadata"]["name"] for p in body.get("items", [])])
    status, body = server.call("GET", pods, accept=TABLE)
    out["server-side table"] = shape(status, body, [c.get("name") for c in body.get("columnDefinitions", [])][:3]
                                     if isinstance(body, dict) else None)
    step("pod in a missing namespace", lambda: shape(*server.call(
        "POST", f"/api/v1/namespaces/missing-{ns}/pods", pod("p9"))))
    server.call("POST", pods, pod("p2"))
    status, body = server.call("DELETE", f"{pods}/p2")
    out["delete unbound"] = shape(status, body, server.call("GET", f"{pods}/p2")[0])
    status, body = server.call("DELETE", f"{pods}/p1")
    out["delete bound (no kubelet)"] = shape(status, body, "deletionTimestamp" in body.get("metadata", {}),
                                             server.call("GET", f"{pods}/p1")[0])
    out["watch since create"] = ("events", tuple(server.watch(pods, rv)))
    out.update(evictions(server, ns))
    # custom resources: the ResourcePool CRD
    server.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", pool_crd)
    _wait_established(server, pool_crd["metadata"]["name"])
    pools = "/apis/walras.dev/v1alpha1/resourcepools"
    base = {"apiVersion": "walras.dev/v1alpha1", "kind": "ResourcePool",
            "spec": {"nodeSelector": {"x": "y"}, "resource": "nvidia.com/gpu", "policy": {"type": "utility"}}}
    status, body = server.call("POST", pools, {**base, "metadata": {"name": f"{ns}-ok"},
                                               "spec": {**base["spec"], "unknownField": 1}})
    out["custom resource: pruning and defaults"] = shape(status, body, "unknownField" in body.get("spec", {}),
                                                         body.get("spec", {}).get("degreeLimit", "absent"))
    step("custom resource: CEL rule", lambda: shape(*server.call("POST", pools, {
        **base, "metadata": {"name": f"{ns}-cel"}, "spec": {**base["spec"], "policy": {"type": "colocation"}}})))
    step("custom resource: schema type", lambda: shape(*server.call("POST", pools, {
        **base, "metadata": {"name": f"{ns}-type"}, "spec": {**base["spec"], "resource": 5}})))
    return out


def evictions(server: Server, ns: str) -> dict[str, tuple[Any, ...]]:
    """The Eviction API under a PodDisruptionBudget (minAvailable 1 over two Ready pods): the first eviction is
    allowed (201, the pod deleted), the second would violate the budget (429 TooManyRequests with a
    ``DisruptionBudget`` cause, the pod kept)."""
    out: dict[str, tuple[Any, ...]] = {}
    pods = f"/api/v1/namespaces/{ns}/pods"
    budgets = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
    status, body = server.call("POST", budgets, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep-one"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "evict"}}}})
    out["pdb create"] = shape(status, body, body.get("spec", {}).get("minAvailable"))
    for name in ("e1", "e2"):
        manifest = pod(name)
        manifest["metadata"]["labels"] = {"app": "evict"}
        server.call("POST", pods, manifest)
        server.call("PATCH", f"{pods}/{name}/status", {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"}]}}, "application/merge-patch+json")
    status, body = server.call("GET", budgets)
    out["pdb list"] = shape(status, body, [b["metadata"]["name"] for b in body.get("items", [])])
    if server.real:  # the disruption controller has to count the two Ready pods first
        _wait_budget(server, f"{budgets}/keep-one", healthy=2)

    def evict(name: str) -> tuple[int, Any]:
        return server.call("POST", f"{pods}/{name}/eviction", {
            "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns},
            "deleteOptions": {"gracePeriodSeconds": 30}})

    status, body = evict("e1")
    out["eviction allowed by the pdb"] = shape(status, body, body.get("status"), server.call("GET", f"{pods}/e1")[0])
    status, body = evict("e2")
    causes = [c.get("reason") for c in (body.get("details") or {}).get("causes") or []]
    out["eviction refused by the pdb"] = shape(status, body, body.get("message"), causes,
                                               server.call("GET", f"{pods}/e2")[0])
    step_status, body = evict("missing")
    out["eviction of a missing pod"] = shape(step_status, body)
    status, body = server.call("DELETE", f"{budgets}/keep-one")
    out["pdb delete"] = shape(status, body, server.call("GET", f"{budgets}/keep-one")[0])
    return out


def _wait_budget(server: Server, path: str, healthy: int) -> None:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, body = server.call("GET", path)
        st = body.get("status") or {} if status == 200 else {}
        if st.get("observedGeneration") == body["metadata"].get("generation") and st.get("currentHealthy") == healthy:
            return
        time.sleep(0.2)
    raise AssertionError(f"the disruption controller did not count {healthy} healthy pods for {path}")


def _wait_established(server: Server, name: str) -> None:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, body = server.call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conditions = (body.get("status") or {}).get("conditions") or [] if status == 200 else []
        # the emulator registers a CRD at once and writes no conditions; the real server reports Established
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions) or (
                status == 200 and not conditions):
            status, _ = server.call("GET", "/apis/walras.dev/v1alpha1/resourcepools")
            if status == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"CRD {name} not established")


class _ContextAdapter(requests.adapters.HTTPAdapter):
    """requests with the control plane's own SSL context (its CA file holds the serving chain)."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["ssl_context"] = self.context
        super().init_poolmanager(*args, **kwargs)


def documented() -> dict[str, str]:
    """Rows of the "Differences" table of docs/emulator.md: step -> status (known limitation / fixed)."""
    rows = {}
    for line in DOC.read_text().splitlines():
        match = re.match(r"^\|\s*`([^`]+)`\s*\|.*\|\s*(known limitation|fixed)\s*\|\s*$", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


@pytest.fixture
def emulator() -> Iterator[Server]:
    with EmulatorThread() as emu:
        yield Server(str(emu.url), requests.Session())


def test_emulator_and_kube_apiserver_answer_alike(control_plane: ControlPlane, emulator: Server) -> None:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {control_plane.token}"
    session.mount("https://", _ContextAdapter(control_plane.plane.ssl_context()))
    real = Server(control_plane.server, session, real=True)
    pool_crd = yaml.safe_load((ROOT / "crds" / "resourcepools.walras.dev.yaml").read_text())
    # where an e2e module applied the CRD already, its POST answers 409 on the real server: the same CRD serves
    ns = f"diff-{secrets.token_hex(3)}"
    seen_real = sequence(real, ns, pool_crd)
    seen_emulated = sequence(emulator, ns, pool_crd)
    for step in [s for s in seen_real if "evict" in s or "pdb" in s]:
        print(f"{step}: kube-apiserver {seen_real[step]} / emulator {seen_emulated[step]}")
    assert list(seen_real) == list(seen_emulated)
    differences = {step: (seen_emulated[step], seen_real[step]) for step in seen_real
                   if seen_real[step] != seen_emulated[step]}
    report = "\n".join(f"  {step}: emulator {e} / kube-apiserver {r}" for step, (e, r) in differences.items())
    known = {step for step, status in documented().items() if status == "known limitation"}
    fixed = {step for step, status in documented().items() if status == "fixed"}
    assert set(documented()) <= set(seen_real), f"docs/emulator.md names steps this test does not run: " \
                                               f"{set(documented()) - set(seen_real)}"
    assert not (set(differences) - known), f"undocumented differences:\n{report}"
    assert not (known - set(differences)), f"documented differences that no longer differ: {known - set(differences)}"
    assert not (fixed & set(differences)), f"differences marked fixed that differ again:\n{report}"
    control_plane.request("DELETE", f"/api/v1/namespaces/{ns}")
