"""The extender against the real kube-scheduler v1.36: what it sends (recorded into
``e2e/fixtures/extender/recorded/``) and what it does with Walras' answers.

Live (needs the control-plane binaries, ``tests/controlplane.py``): a kube-scheduler configured with the extender
(``filter``/``prioritize``/``bind``/``preempt``, ``nodeCacheCapable`` false and true) schedules

1. a Walras-managed pod planned on ``node-b`` of three nodes: the scheduler calls filter, prioritize and bind, and
   the pod ends up bound to ``node-b`` by the extender's binder;
2. a plain pod (not Walras'): filter and prioritize have no opinion, and the extender refuses to bind it;
3. a high-priority managed pod planned on ``node-b``, which a low-priority pod under a PodDisruptionBudget fills: the
   scheduler calls ``preempt`` with the victims (``NodeNameToVictims`` with full pods, or ``NodeNameToMetaVictims``
   with uids), Walras keeps ``node-b``'s candidates, the scheduler evicts the victim, and the PDB is counted.

Every request body is checked against the Go field names and written to ``recorded/`` when
``WALRAS_RECORD_EXTENDER=1``. Offline, the recorded bodies are replayed through the extender (no control plane).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from walras.extender import Extender, start_site
from walras.kube.client import KubeClient, KubeConfig
from walras.planner.model import Plan, PodPlan
from walras_testbed.kubelet.client import ApiClient, ApiConfig
from walras_testbed.kubelet.standin import KubeletStandIn

RECORDED = Path(__file__).resolve().parents[1] / "e2e" / "fixtures" / "extender" / "recorded"
GO_KEYS = {
    "filter": {"Pod", "Nodes", "NodeNames"},
    "prioritize": {"Pod", "Nodes", "NodeNames"},
    "bind": {"PodName", "PodNamespace", "PodUID", "Node"},
    "preempt": {"Pod", "NodeNameToVictims", "NodeNameToMetaVictims"},
}
NODES = ("node-a", "node-b", "node-c")


def _form(node_cache: bool) -> str:
    return "nodenames" if node_cache else "nodes"


def _node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"walras.dev/test": "golden"}},
            "status": {"capacity": {"cpu": "2", "memory": "8Gi", "pods": "20"}}}


def _pod(namespace: str, name: str, cpu: str, *, managed: bool, priority_class: str | None = None,
         node: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    meta_labels = {**(labels or {}), **({"walras.dev/managed": "true", "walras.dev/job": "golden"} if managed else {})}
    spec: dict[str, Any] = {"schedulerName": "walras-scheduler", "terminationGracePeriodSeconds": 0,
                            "containers": [{"name": "c", "image": "registry.invalid/c:1",
                                            "resources": {"requests": {"cpu": cpu}}}]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                            "labels": meta_labels}, "spec": spec}


class RecordingExtender(Extender):
    """The extender, keeping every request body the scheduler sends, by verb."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bodies: dict[str, list[dict[str, Any]]] = {verb: [] for verb in GO_KEYS}

    async def respond(self, verb: str, raw: bytes) -> tuple[int, bytes]:
        self.bodies[verb].append(json.loads(raw))
        return await super().respond(verb, raw)


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


@pytest.mark.parametrize("node_cache", [False, True], ids=["nodes", "nodenames"])
def test_real_scheduler_filters_binds_and_preempts_through_the_extender(control_plane: Any, namespace: str,
                                                                          tmp_path: Path, node_cache: bool) -> None:
    cp = control_plane
    ns = namespace
    form = _form(node_cache)
    nodes = [f"{n}-{form}" for n in NODES]  # a fresh set per run: the last run's pods may still hold the old ones
    planned = f"node-b-{form}"
    current = {"plan": Plan()}
    kube = KubeConfig.load(str(cp.kubeconfig))
    for pc, value in (("golden-high", 1000), ("golden-low", 10)):
        cp.apply_objects([{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": pc},
                           "value": value}])
    loop = asyncio.new_event_loop()
    binder_client = KubeClient(kube)

    async def binder(namespace: str, name: str, uid: str, node: str) -> None:
        await binder_client.bind(namespace, name, uid, node)

    recorder = extender = RecordingExtender(lambda: current["plan"], binder=binder)
    runner, port = loop.run_until_complete(start_site(extender.app(), "127.0.0.1", 0))
    kubelet = KubeletStandIn(ApiClient(ApiConfig.from_kubeconfig(cp.kubeconfig)), [_node(n) for n in nodes],
                             lease_interval=5.0, status_interval=10.0)
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def on_loop(coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    on_loop(kubelet.start())
    config = tmp_path / "scheduler.yaml"
    config.write_text(yaml.safe_dump({
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "profiles": [{"schedulerName": "walras-scheduler"}],
        "extenders": [{"urlPrefix": f"http://127.0.0.1:{port}/scheduler", "filterVerb": "filter",
                       "prioritizeVerb": "prioritize", "bindVerb": "bind", "preemptVerb": "preempt", "weight": 1,
                       "enableHTTPS": False, "nodeCacheCapable": node_cache, "httpTimeout": "10s",
                       "ignorable": False}]}))
    scheduler = cp.start_scheduler(config)
    try:
        # 1. a managed pod planned on node-b
        current["plan"] = Plan(pods=[PodPlan(ns, "ml-0", "golden", "p", planned, action="create"),
                                     PodPlan(ns, "ml-hi", "golden", "p", planned, action="create")])
        cp.apply_objects([_pod(ns, "ml-0", "100m", managed=True)])
        _wait(lambda: cp.get("pod", "ml-0", "-n", ns)["spec"].get("nodeName"), 60, "ml-0 bound")
        assert cp.get("pod", "ml-0", "-n", ns)["spec"]["nodeName"] == planned

        # 2. a plain pod: no opinion on nodes, but Walras does not bind it
        cp.apply_objects([_pod(ns, "plain", "100m", managed=False)])
        _wait(lambda: any(b.get("PodName") == "plain" for b in recorder.bodies["bind"]), 60, "bind of plain")
        time.sleep(1.0)
        assert not cp.get("pod", "plain", "-n", ns)["spec"].get("nodeName"), "the extender bound a plain pod"

        # 3. preemption: a low-priority victim under a PDB fills node-b; a high-priority managed pod is planned there
        cp.apply_objects([{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                           "metadata": {"name": "victims", "namespace": ns},
                           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "victim"}}}},
                          _pod(ns, "victim", "1800m", managed=False, priority_class="golden-low", node=planned,
                               labels={"app": "victim"})])
        _wait(lambda: cp.get("pod", "victim", "-n", ns).get("status", {}).get("phase") == "Running", 60,
              "the victim running")
        _wait(lambda: cp.get("pdb", "victims", "-n", ns).get("status", {}).get("currentHealthy") == 1, 60,
              "the PDB to count the victim")
        cp.apply_objects([_pod(ns, "ml-hi", "1", managed=True, priority_class="golden-high")])
        _wait(lambda: recorder.bodies["preempt"], 90, "a preempt call")
        _wait(lambda: cp.kubectl("get", "pod", "victim", "-n", ns, check=False).returncode != 0
              or cp.get("pod", "victim", "-n", ns)["metadata"].get("deletionTimestamp"), 60, "the victim evicted")
        _wait(lambda: cp.get("pod", "ml-hi", "-n", ns)["spec"].get("nodeName"), 90, "ml-hi bound after preemption")
        assert cp.get("pod", "ml-hi", "-n", ns)["spec"]["nodeName"] == planned
    except AssertionError:
        print("extender requests:", {verb: len(b) for verb, b in recorder.bodies.items()})
        for verb, bodies in recorder.bodies.items():
            if bodies:
                answer = on_loop(extender.respond(verb, json.dumps(bodies[-1]).encode()))
                print(verb, json.dumps(bodies[-1])[:3000], "->", answer)
        print(cp.kubectl("get", "pods,nodes", "-A", "-o", "wide", check=False).stdout)
        print(cp.kubectl("get", "events", "-n", ns, check=False).stdout)
        print(scheduler.tail())
        raise
    finally:
        scheduler.stop()
        on_loop(kubelet.stop(delete_nodes=True))
        on_loop(runner.cleanup())
        on_loop(binder_client.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    # what the scheduler sent: exactly the Go field names, in the node form of its configuration
    for verb, bodies in recorder.bodies.items():
        assert bodies, f"no {verb} request"
        for body in bodies:
            assert set(body) == GO_KEYS[verb], (verb, sorted(body))
    filt = next(b for b in recorder.bodies["filter"] if b["Pod"]["metadata"]["name"] == "ml-0")
    assert (filt["NodeNames"] is not None) == node_cache and (filt["Nodes"] is not None) == (not node_cache)
    preempt = recorder.bodies["preempt"][0]
    victims = preempt["NodeNameToMetaVictims" if node_cache else "NodeNameToVictims"]
    assert preempt["NodeNameToVictims" if node_cache else "NodeNameToMetaVictims"] is None
    assert set(victims) == {planned} and victims[planned]["NumPDBViolations"] == 1
    if os.environ.get("WALRAS_RECORD_EXTENDER") == "1":
        RECORDED.mkdir(parents=True, exist_ok=True)
        # one feasible node skips prioritize, so its recorded body is the plain pod's (three feasible nodes)
        picks = {"filter": filt, "prioritize": recorder.bodies["prioritize"][0],
                 "bind": next(b for b in recorder.bodies["bind"] if b["PodName"] == "ml-0"),
                 "preempt": preempt}
        for verb, body in picks.items():
            (RECORDED / f"{verb}_{form}.json").write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")


def _recorded() -> list[Path]:
    return sorted(RECORDED.glob("*.json")) if RECORDED.is_dir() else []


@pytest.mark.skipif(not _recorded(), reason="no recorded bodies yet (WALRAS_RECORD_EXTENDER=1 with the control plane)")
@pytest.mark.parametrize("path", _recorded(), ids=lambda p: p.stem)
def test_recorded_scheduler_requests_are_read_as_the_live_ones(path: Path) -> None:
    """Each recorded body, replayed: the managed pod (planned on node-b) keeps node-b only; its preemption keeps
    node-b's victims with the PDB violation; its bind goes to the binder."""
    body = json.loads(path.read_text())
    verb, form = path.stem.split("_", 1)
    planned = f"node-b-{form}"
    assert set(body) == GO_KEYS[verb]
    pod = body.get("Pod", {}).get("metadata", {})
    namespace = pod.get("namespace") or body.get("PodNamespace")
    name = pod.get("name") or body.get("PodName")
    plan = Plan(pods=[PodPlan(namespace, name, "golden", "p", planned, action="create")])
    calls: list[tuple[str, str, str, str]] = []

    async def binder(*args: str) -> None:
        calls.append(args)  # type: ignore[arg-type]

    ext = Extender(lambda: plan, binder=binder)
    status, payload = asyncio.run(ext.respond(verb, path.read_bytes()))
    assert status == 200
    answer = json.loads(payload)
    if verb == "filter":
        kept = answer.get("nodenames") or [n["metadata"]["name"] for n in answer["nodes"]["items"]]
        assert kept == [planned] and planned not in answer["failedAndUnresolvableNodes"]
        assert set(answer["failedAndUnresolvableNodes"]) == {f"{n}-{form}" for n in NODES} - {planned}
    elif verb == "prioritize":
        assert {h["host"]: h["score"] for h in answer}[planned] == 10
    elif verb == "bind":
        assert answer == {"error": ""} and calls == [(namespace, name, body["PodUID"], planned)]
    else:
        assert answer["nodeNameToMetaVictims"][planned]["numPDBViolations"] == 1
        assert len(answer["nodeNameToMetaVictims"][planned]["pods"]) == 1
