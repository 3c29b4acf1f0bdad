"""The job lifecycle against the emulated API (:mod:`walras_testbed.emulator`, for machines without the control-plane
binaries): the real planner and the real operator in one event loop, the operator's clock
(:attr:`walras.operator.Controller.clock`) moved forward by the test instead of waiting for the backoff and the
node-loss grace. The emulator runs a bound pod at once (no kubelet); the test sets pod phases and node conditions
itself.

Transitions: pods ``Succeeded`` -> job ``Complete`` and its capacity to another job; a failed pod re-created only
after its backoff, the job ``Failed`` at its limit; a node NotReady past the grace -> its pods force-deleted and
re-created on another node (nothing lost: :mod:`walras.planner.invariants`); ``spec.suspend`` and back; an opt-in job
moved through the Eviction API, blocked by a PodDisruptionBudget first (the emulator's ``pods/eviction``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import glob
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from walras.kube.client import KubeClient, KubeConfig, RetryPolicy
from walras.kube.decode import cluster_from
from walras.metrics import WalrasMetrics
from walras.operator import Controller, IndexSource, OperatorOptions, run_operator
from walras.planner import build_plan
from walras.planner.invariants import check_cluster, check_plan
from walras.planner.model import Snapshot
from walras.planner.plan import PlanOptions
from walras_testbed.emulator import Emulator
from walras_testbed.emulator.store import Store

from tests.lifecycle_support import fungible_job, gpu_node, pool

ROOT = Path(__file__).resolve().parents[1]
NS = "lc"
POD = ("", "v1", "pods")
NODE = ("", "v1", "nodes")
JOB = ("walras.dev", "v1alpha1", "fungiblejobs")
EVENT = ("", "v1", "events")
GRACE = 60.0  # the operator's node-loss grace; the test moves the clock past it


def stamp(epoch: float) -> str:
    return dt.datetime.fromtimestamp(int(epoch), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Clock:
    """The operator's clock: the wall clock plus what the test skipped."""

    offset: float = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@dataclass
class Env:
    emulator: Emulator
    controller: Controller
    clock: Clock

    @property
    def store(self) -> Store:
        return self.emulator.store

    def apply(self, *docs: dict[str, Any]) -> None:
        self.store.apply_manifests(list(docs))

    def pods(self, job: str) -> list[dict[str, Any]]:
        return [p for p in self.store.list(self.store.types[POD], NS)
                if (p["metadata"].get("labels") or {}).get("walras.dev/job") == job]

    def job(self, name: str) -> dict[str, Any]:
        return self.store.get(self.store.types[JOB], NS, name)

    def phase(self, name: str) -> str | None:
        return (self.job(name).get("status") or {}).get("phase")

    def patch_job(self, name: str, patch: dict[str, Any]) -> None:
        self.store.patch(self.store.types[JOB], NS, name, patch, "application/merge-patch+json")

    def set_pod_phase(self, name: str, phase: str) -> None:
        self.store.patch(self.store.types[POD], NS, name, {"status": {"phase": phase}},
                         "application/merge-patch+json", subresource="status")

    def set_ready(self, node: str, ready: bool, since: float) -> None:
        cond = {"type": "Ready", "status": "True" if ready else "False",
                "reason": "KubeletReady" if ready else "KubeletNotReady", "lastTransitionTime": stamp(since),
                "lastHeartbeatTime": stamp(since)}
        self.store.patch(self.store.types[NODE], "", node, {"status": {"conditions": [cond]}},
                         "application/merge-patch+json", subresource="status")

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.store.list(self.store.types[EVENT], NS) if e["reason"] == reason]

    async def until(self, predicate: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if loop.time() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
            await asyncio.sleep(0.05)

    async def plans(self, count: int = 2) -> None:
        target = self.controller.plans + count
        self.controller.trigger("test")
        await self.until(lambda: self.controller.plans >= target, f"{count} more plans")

    def invariants(self) -> list[str]:
        store = self.store
        snapshot = Snapshot(nodes=tuple(store.list(store.types[NODE], None)),
                            pods=tuple(store.list(store.types[POD], NS)),
                            pools=tuple(store.list(store.find("walras.dev", "v1alpha1", "resourcepools"), None)),
                            jobs=tuple(store.list(store.types[JOB], NS)))
        cluster = cluster_from(snapshot)
        plan = build_plan(cluster, options=PlanOptions(now=self.clock(), node_loss_grace=GRACE))
        return [f"{v.kind} {v.object}: {v.message}" for v in [*check_cluster(cluster), *check_plan(cluster, plan)]
                if v.kind != "StatusDisagrees"]


def ready_node(name: str, gpus: int = 2) -> dict[str, Any]:
    doc = gpu_node(name, {"lc": "emu"}, gpus)
    capacity = doc["status"]["capacity"]
    doc["status"] = {"capacity": capacity, "allocatable": capacity, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastTransitionTime": stamp(time.time() - 60),
         "lastHeartbeatTime": stamp(time.time())}]}
    return doc


@contextlib.asynccontextmanager
async def operator_on_emulator(tmp_path: Path) -> AsyncIterator[Env]:
    """The emulator with the CRDs, two ready nodes of 2 GPUs and pool ``emu``, and the operator with the real planner
    and a movable clock. A context manager in the test's own task, not an async fixture: kopf cancels, when it stops,
    the tasks created after it started (the fixture's teardown would be one)."""
    emulator = Emulator(Store())
    await emulator.start()
    store = emulator.store
    store.apply_manifests(d for f in sorted(glob.glob(str(ROOT / "crds" / "*.yaml")))
                          for d in yaml.safe_load_all(Path(f).read_text()) if d)
    store.apply_manifests([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
                           ready_node("emu-a"), ready_node("emu-b"), pool("emu", {"lc": "emu"})])
    kube = KubeConfig.load(str(emulator.write_kubeconfig(tmp_path / "kubeconfig")))
    client = KubeClient(kube, RetryPolicy(attempts=4, base=0.01, cap=0.05))
    clock = Clock()
    options = OperatorOptions(namespaces=(NS,), debounce=0.05, plan_period=0.3, identity="lifecycle-emulated",
                              node_loss_grace=GRACE)
    source = IndexSource(options.namespaces)
    controller = Controller(client, source, build_plan, options, WalrasMetrics(), clock=clock)
    stop = asyncio.Event()
    task = asyncio.create_task(run_operator(controller, source, kube, peering=None, health_port=None,
                                            stop_flag=stop))
    try:
        yield Env(emulator, controller, clock)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
        await emulator.stop()


def running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")]


@pytest.mark.asyncio
async def test_completion_frees_capacity_and_suspend_round_trips(tmp_path: Path) -> None:
    async with operator_on_emulator(tmp_path) as env:
        env.apply(fungible_job("first", NS, {"emu": 1.0}, 4))
        pods = await env.until(lambda: len(p := running(env.pods("first"))) == 4 and p, "first's 4 pods Running")
        for p in pods:
            env.set_pod_phase(p["metadata"]["name"], "Succeeded")
        await env.until(lambda: env.phase("first") == "Complete", "first Complete")
        assert env.job("first")["status"].get("completionTime")
        env.apply(fungible_job("second", NS, {"emu": 1.0}, 4))
        await env.until(lambda: len(running(env.pods("second"))) == 4, "second's 4 pods Running in the freed room")
        await env.plans(2)
        assert sorted(p["metadata"]["name"] for p in env.pods("first")) == sorted(p["metadata"]["name"] for p in pods)
        assert env.invariants() == []

        env.patch_job("second", {"spec": {"suspend": True}})
        await env.until(lambda: not env.pods("second"), "the suspended job's pods to go")
        await env.until(lambda: env.phase("second") == "Suspended", "second Suspended")
        env.patch_job("second", {"spec": {"suspend": False}})
        await env.until(lambda: len(running(env.pods("second"))) == 4, "second's pods back after resume")
        await env.until(lambda: env.phase("second") == "Running", "second Running again")


@pytest.mark.asyncio
async def test_failed_pods_back_off_then_fail_the_job(tmp_path: Path) -> None:
    async with operator_on_emulator(tmp_path) as env:
        env.apply(fungible_job("flaky", NS, {"emu": 1.0}, 1, backoffLimit=1))
        first = (await env.until(lambda: running(env.pods("flaky")), "flaky Running"))[0]
        env.set_pod_phase(first["metadata"]["name"], "Failed")
        await env.until(lambda: (env.job("flaky").get("status") or {}).get("failedPods") == 1, "the failure counted")
        await env.until(lambda: not env.pods("flaky"), "the failed pod deleted")
        await env.plans(3)
        assert not env.pods("flaky"), "no replacement before the 10 s backoff"
        env.clock.offset += 11
        second = (await env.until(lambda: running(env.pods("flaky")), "the replacement after the backoff"))[0]
        env.set_pod_phase(second["metadata"]["name"], "Failed")
        await env.until(lambda: env.phase("flaky") == "Failed", "flaky Failed at its backoff limit")
        status = env.job("flaky")["status"]
        assert status["failedPods"] == 2
        assert "BackoffLimitExceeded" in {c.get("reason") for c in status.get("conditions") or []}
        env.clock.offset += 400
        await env.plans(3)
        assert not [p for p in env.pods("flaky") if (p.get("status") or {}).get("phase") != "Failed"]


@pytest.mark.asyncio
async def test_pods_of_a_lost_node_are_replanned_after_the_grace(tmp_path: Path) -> None:
    async with operator_on_emulator(tmp_path) as env:
        env.apply(fungible_job("survivor", NS, {"emu": 1.0}, 2))
        pods = await env.until(lambda: len(p := running(env.pods("survivor"))) == 2 and p, "survivor Running")
        lost = pods[0]["spec"]["nodeName"]
        other = "emu-b" if lost == "emu-a" else "emu-a"
        moved = {p["metadata"]["uid"] for p in pods if p["spec"]["nodeName"] == lost}
        env.set_ready(lost, False, env.clock())
        await env.plans(3)
        assert {p["metadata"]["uid"] for p in env.pods("survivor")} >= moved, "nothing moves before the grace"
        env.clock.offset += GRACE + 1

        def replanned() -> bool:
            current = env.pods("survivor")
            ok = running(current)
            return not ({p["metadata"]["uid"] for p in current} & moved) and len(ok) == 2 and \
                {p["spec"]["nodeName"] for p in ok} == {other}

        await env.until(replanned, f"survivor's pods re-created on {other}")
        assert any("Force-deleted" in e["message"] for e in env.events("SuccessfulDelete"))
        assert env.invariants() == []


@pytest.mark.asyncio
async def test_an_opt_in_job_moves_through_the_eviction_api(tmp_path: Path) -> None:
    async with operator_on_emulator(tmp_path) as env:
        env.apply(ready_node("fast-a"), pool("fast", {"lc": "fast"}))
        env.store.patch(env.store.types[NODE], "", "fast-a", {"metadata": {"labels": {"lc": "fast"}}},
                        "application/merge-patch+json")
        hog = fungible_job("hog", NS, {"fast": 1.0}, 2)
        hog["spec"]["preemptible"] = False  # a test of migration: mover may not swap into fast by preemption
        env.apply(hog)
        await env.until(lambda: len(running(env.pods("hog"))) == 2, "hog fills the fast pool")
        rules = {"minGain": 0.05, "minRunSeconds": 0, "cooldownSeconds": 0, "maxPodsPerCycle": 1}
        env.apply(fungible_job("mover", NS, {"fast": 4.0, "emu": 1.0}, 1, migration=rules),
                  fungible_job("stayer", NS, {"fast": 4.0, "emu": 1.0}, 1))
        old = (await env.until(lambda: running(env.pods("mover")), "mover Running in the slow pool"))[0]
        stayer = (await env.until(lambda: running(env.pods("stayer")), "stayer Running"))[0]
        env.apply({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                   "metadata": {"name": "mover", "namespace": NS},
                   "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "mover"}}}})
        for p in running(env.pods("hog")):
            env.set_pod_phase(p["metadata"]["name"], "Succeeded")
        await env.until(lambda: env.events("EvictionBlocked"), "an EvictionBlocked Event")
        await env.plans(3)
        names = {p["metadata"]["name"]: p for p in env.pods("mover")}
        assert old["metadata"]["name"] in names and not names[old["metadata"]["name"]]["metadata"].get(
            "deletionTimestamp"), "the budget holds"
        env.store.patch(env.store.find("policy", "v1", "poddisruptionbudgets"), NS, "mover",
                        {"spec": {"minAvailable": 1}}, "application/merge-patch+json")

        def moved() -> bool:
            pods = env.pods("mover")
            return len(pods) == 1 and pods[0]["spec"].get("nodeName") == "fast-a" and bool(running(pods))

        await env.until(moved, "mover on the fast pool")
        after = env.pods("stayer")
        assert [p["metadata"]["uid"] for p in after] == [stayer["metadata"]["uid"]], "stayer never moves"


# ------------------------------------------------------------------------ the API client's eviction and deletion


@pytest.mark.asyncio
async def test_eviction_429_is_an_answer_and_deletes_carry_grace_and_uid(tmp_path: Path) -> None:
    """``evict_pod`` against a scripted API server: a 429 is ``blocked`` at once (no retry: it is a
    PodDisruptionBudget's answer), a 500 is retried, 404 is ``gone``; the Eviction body carries
    ``deleteOptions.gracePeriodSeconds`` and the UID precondition; ``delete_pod`` sends the grace period (0 = at once)
    and treats a failed UID precondition (409) as gone, not as a conflict to retry."""
    from aiohttp import web

    seen: list[tuple[str, str, Any]] = []
    answers: list[tuple[int, dict[str, Any]]] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        seen.append((request.method, request.path, body))
        code, payload = answers.pop(0)
        return web.json_response(payload, status=code)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client = KubeClient(KubeConfig(server=f"http://127.0.0.1:{port}"), RetryPolicy(attempts=4, base=0.01, cap=0.02))
    refused = {"kind": "Status", "code": 429, "reason": "TooManyRequests",
               "message": "Cannot evict pod as it would violate the pod's disruption budget."}
    try:
        answers.append((429, refused))
        result = await client.evict_pod("ns", "p", grace=7, uid="u1")
        assert (result.outcome, client.retries) == ("blocked", 0)
        assert "disruption budget" in result.message
        method, path, body = seen[-1]
        assert (method, path) == ("POST", "/api/v1/namespaces/ns/pods/p/eviction")
        assert body == {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p", "namespace": "ns"},
                        "deleteOptions": {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 7,
                                          "preconditions": {"uid": "u1"}}}
        answers.extend([(500, {"message": "etcd"}), (201, {"kind": "Status", "status": "Success"})])
        assert (await client.evict_pod("ns", "p")).outcome == "evicted"
        assert client.retries == 1 and "deleteOptions" not in seen[-1][2]
        answers.append((404, {"reason": "NotFound", "message": "pods \"p\" not found"}))
        assert (await client.evict_pod("ns", "p")).outcome == "gone"

        answers.append((200, {"kind": "Pod"}))
        assert await client.delete_pod("ns", "p", grace=0, uid="u2") is True
        assert seen[-1][0] == "DELETE" and seen[-1][2] == {
            "apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "preconditions": {"uid": "u2"}}
        answers.append((409, {"reason": "Conflict", "message": "Precondition failed: UID in precondition: u2"}))
        assert await client.delete_pod("ns", "p", uid="u2") is False
        answers.append((200, {"kind": "Pod"}))
        assert await client.delete_pod("ns", "p") is True and seen[-1][2] is None  # the pod's own grace period
        assert not answers
    finally:
        await client.close()
        await runner.cleanup()


@pytest.mark.asyncio
async def test_controller_evicts_forgets_and_records_a_refusal_once() -> None:
    """``Controller.act`` on ``evict``: a refusal (429) keeps the pod and records one ``EvictionBlocked`` per pod and
    message however often the plan repeats it, never a delete; an eviction that goes through forgets the pod in the
    assumed-pods cache (as a deletion does) and records ``Evicted``; a replacement ``create`` is assumed. ``delete``
    passes the planned grace period and the pod's uid."""
    from walras.kube.client import Eviction
    from walras.kube.decode import pod_from
    from walras.planner.model import Plan, PodPlan

    calls: list[tuple[Any, ...]] = []
    answers = ["blocked", "blocked", "evicted"]

    class FakeClient:
        async def evict_pod(self, namespace: str, name: str, grace: int | None = None,
                            uid: str | None = None) -> Eviction:
            calls.append(("evict", name, grace, uid))
            outcome = answers.pop(0)
            return Eviction(outcome, "Cannot evict pod as it would violate the pod's disruption budget."  # type: ignore[arg-type]
                            if outcome == "blocked" else "")

        async def delete_pod(self, namespace: str, name: str, grace: int | None = None,
                             uid: str | None = None) -> bool:
            calls.append(("delete", name, grace, uid))
            return True

        async def create_pod(self, namespace: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
            calls.append(("create", body["metadata"]["name"]))
            return {**body, "metadata": {**body["metadata"], "uid": "new-uid"}}, True

        async def post_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
            calls.append(("event", event["reason"], event["message"]))
            return {**event, "metadata": {**event["metadata"], "name": f"ev-{len(calls)}"}}

        async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
            calls.append(("event-count", name, patch["count"]))
            return {}

        async def patch_status(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
            return {}

    job = fungible_job("m", NS, {"p": 1.0}, 1)
    job["metadata"].update(uid="job-uid", generation=1)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "m-0", "namespace": NS, "uid": "old-uid", "labels": {"walras.dev/job": "m"},
                        "ownerReferences": [{"controller": True, "uid": "job-uid"}]},
           "spec": {"nodeName": "n1", "containers": [{"name": "main"}]}, "status": {"phase": "Running"}}
    snapshot = Snapshot(pods=(pod,), jobs=(job,))
    controller = Controller(FakeClient(), lambda: snapshot, build_plan,  # type: ignore[arg-type]
                            OperatorOptions(mode="extender"))
    clock = [100.0]
    controller.actuator.clock = lambda: clock[0]
    typed = pod_from(pod)
    assert typed is not None
    controller.assumed.assume(typed, time.monotonic())
    plan = Plan(pods=(PodPlan(NS, "m-0", "m", "p", "n1", action="evict", exists=True, grace=5),
                      PodPlan(NS, "m-1", "m", "p", "n2", {"cpu": "1"})))
    await controller.act(plan, snapshot)
    await controller.act(plan, snapshot)  # within the backoff (2 s): not asked again
    assert [c for c in calls if c[0] == "evict"] == [("evict", "m-0", 5, "old-uid")]
    clock[0] += 2.5
    await controller.act(plan, Snapshot(pods=(pod, {**pod, "metadata": {**pod["metadata"], "name": "m-1"}}),
                                        jobs=(job,)))
    blocked = [c for c in calls if c[0] == "event" and c[1] == "EvictionBlocked"]
    assert len(blocked) == 1 and "disruption budget" in blocked[0][2]
    # the repeat raises the count of the same Event object (aggregated the Kubernetes way)
    assert [c for c in calls if c[0] == "event-count" and c[1] == "ev-2"] == [("event-count", "ev-2", 2)], calls
    assert [c for c in calls if c[0] == "evict"] == [("evict", "m-0", 5, "old-uid")] * 2
    assert "disruption budget" in controller.actuator.eviction_blocked[(NS, "m")]
    clock[0] += 3.0  # the backoff doubled to 4 s: still waiting
    await controller.act(plan, Snapshot(pods=(pod,), jobs=(job,)))
    assert [c for c in calls if c[0] == "evict"] == [("evict", "m-0", 5, "old-uid")] * 2
    clock[0] += 1.5
    assert not [c for c in calls if c[0] == "delete"], "a refused eviction is never turned into a delete"
    assert (NS, "m-0") in {p.key for p in controller.assumed.pods()}
    assert (NS, "m-1") in {p.key for p in controller.assumed.pods()}, "the replacement is assumed"
    await controller.act(plan, Snapshot(pods=(pod,), jobs=(job,)))
    assert [c for c in calls if c[0] == "evict"] == [("evict", "m-0", 5, "old-uid")] * 3
    assert (NS, "m-0") not in {p.key for p in controller.assumed.pods()}, "an evicted pod is forgotten"
    assert controller.actuator.eviction_blocked == {}
    assert any(c[0] == "event" and c[1] == "Evicted" for c in calls)
    plan = Plan(pods=(PodPlan(NS, "m-0", "m", "p", None, action="delete", exists=True, grace=0, reason="NodeLost"),))
    await controller.act(plan, snapshot)
    assert calls[-2] == ("delete", "m-0", 0, "old-uid")
    assert calls[-1][:2] == ("event", "SuccessfulDelete") and calls[-1][2].startswith("Force-deleted pod m-0")
