"""Issue 30, "a restart loses nothing": the operator's memory of refused pod creations (docs/refusals.md) and of
misplaced pods (:mod:`walras.planner.lifecycle`) is written to the job's status (``status.admissionRefusal``,
``status.misplacedPods``, ``status.lastMisplacementTime``) and read back by a restarted operator, which has no
previous plan: no creation is asked for before the backoff ends, and the backoff goes on doubling instead of
starting over. The operator side runs the real controller (planner, actuator, status writer) against a fake API
client that keeps what was written; the restart is a new controller fed the status as written and decoded."""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import pytest
from walras.kube.decode import cluster_from
from walras.kube.encode import job_status
from walras.kube.errors import Forbidden
from walras.operator.actuator import REFUSAL_BACKOFF
from walras.operator.controller import Controller, OperatorOptions
from walras.planner import Snapshot
from walras.planner.cluster import Refusal
from walras.planner.invariants import check_plan
from walras.planner.lifecycle import misplaced_delay
from walras.planner.model import rfc3339
from walras.planner.plan import PlanOptions
from walras.planner.plan import build_plan as planner

from tests.planning import build_plan
from tests.test_lifecycle_planner import NOW, job, node, pool
from tests.test_misplacement import _pod
from tests.test_refusals_operator import PSA, FakeClient
from tests.test_refusals_planner import _refusal_cluster

KEY = ("ml", "x")


class Api(FakeClient):
    """The refusing client of the operator tests, refusing only job x's pods, that also keeps the statuses written
    (merge patches applied) so that a restarted operator reads them."""

    def __init__(self) -> None:
        super().__init__(Forbidden(403, "Forbidden", PSA))
        self.statuses: dict[str, dict[str, Any]] = {}

    async def create_pod(self, namespace: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        if not body["metadata"]["name"].startswith("x-"):
            self.creates.append(body["metadata"]["name"])
            return {**body, "metadata": {**body["metadata"], "uid": "u-" + body["metadata"]["name"]}}, True
        return await super().create_pod(namespace, body)

    async def patch_status(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        name = path.rsplit("/", 1)[-1]
        status = self.statuses.setdefault(name, {})
        for key, value in patch["status"].items():
            if value is None:
                status.pop(key, None)
            else:
                status[key] = copy.deepcopy(value)
        return {"status": copy.deepcopy(status)}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _with_status(snap: Snapshot, statuses: dict[str, dict[str, Any]]) -> Snapshot:
    jobs = tuple({**j, "metadata": {**j["metadata"], "uid": f"uid-{j['metadata']['name']}"},
                  **({"status": copy.deepcopy(statuses[j["metadata"]["name"]])}
                     if j["metadata"]["name"] in statuses else {})} for j in snap.jobs)
    pods = tuple({**p, "metadata": {**p["metadata"], "ownerReferences": [
        {"kind": "FungibleJob", "name": p["metadata"]["labels"].get("walras.dev/job"), "controller": True}]}}
        for p in snap.pods)  # owned already: nothing to adopt
    return Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=jobs, pods=pods)


def _operator(api: Api, clock: Clock, snap: Snapshot) -> Controller:
    controller = Controller(api, lambda: _with_status(snap, api.statuses), planner,  # type: ignore[arg-type]
                            OperatorOptions(mode="extender", pause_gc=False, freeze_gc=False), clock=clock)
    controller.actuator.wall = clock
    return controller


def _x_creates(api: Api) -> int:
    return sum(1 for name in api.creates if name.startswith("x-"))


@pytest.mark.asyncio
async def test_a_restarted_operator_asks_nothing_before_the_refusals_backoff_ends_and_doubles_it() -> None:
    # x: 8 replicas wanted, 1 live pod; y: 8 replicas; 12 GPUs (so that x's retry finds room beside y's 8)
    snap = dataclasses.replace(_refusal_cluster(), nodes=(*_refusal_cluster().nodes, node("a2")))
    api, clock = Api(), Clock(NOW)
    first = _operator(api, clock, snap)
    assert await first.reconcile() is not None
    refused = _x_creates(api)
    assert refused > 0 and KEY in first.actuator.refusals
    record = api.statuses["x"]["admissionRefusal"]
    until = first.actuator.refusals[KEY].until
    assert until == NOW + REFUSAL_BACKOFF
    assert record == {"code": 403, "message": PSA, "pods": refused, "attempts": 1, "delaySeconds": REFUSAL_BACKOFF,
                      "retryTime": rfc3339(math.ceil(until)), "observedGeneration": 1}
    assert abs(cluster_from(_with_status(snap, api.statuses)).jobs[0].reported.refusal.until - until) < 1  # type: ignore[union-attr]

    # the restart, 3 s later: a new controller (no previous plan, no memory), the status as written
    clock.now = NOW + 3
    second = _operator(api, clock, snap)
    plan = await second.reconcile()
    assert plan is not None
    assert _x_creates(api) == refused  # nothing asked before the backoff ends
    assert [p.name for p in plan.pods if p.job == "x" and p.action == "create"] == []
    assert "AdmissionRefused" in {c.type for c in plan.jobs[KEY].conditions}
    assert second.actuator.refusals[KEY] == Refusal(PSA, refused, math.ceil(until), 403, 1)
    assert "admissionRefusal" in api.statuses["x"]  # written again, not cleared by the new operator
    # what the restart would do without the status: ask for x's pods at once
    bare = build_plan(cluster_from(snap), options=PlanOptions(now=NOW + 3))
    assert [p for p in bare.pods if p.job == "x" and p.action == "create"]

    # the backoff over: one pod asked again, refused again: the backoff doubles (attempt 2), it does not restart
    clock.now = math.ceil(until) + 1
    second.trigger()
    assert await second.reconcile() is not None
    assert _x_creates(api) == refused + 1
    again = second.actuator.refusals[KEY]
    assert again.attempts == 2 and again.until == clock.now + 2 * REFUSAL_BACKOFF
    assert api.statuses["x"]["admissionRefusal"]["attempts"] == 2


@pytest.mark.asyncio
async def test_a_refusal_that_ended_is_cleared_from_the_status_and_a_new_spec_ignores_it() -> None:
    snap = _refusal_cluster()
    api, clock = Api(), Clock(NOW)
    first = _operator(api, clock, snap)
    await first.reconcile()
    assert "admissionRefusal" in api.statuses["x"]
    # the namespace's policy was relaxed: the retry after the backoff is admitted, the record ends and is cleared
    api.refusal = None
    clock.now = NOW + REFUSAL_BACKOFF + 1
    await first.reconcile()
    assert KEY not in first.actuator.refusals
    await first.reconcile()
    assert "admissionRefusal" not in api.statuses["x"]
    # a record written for generation 1 means nothing to generation 2 (a new spec is asked for at once)
    status = {"admissionRefusal": {"code": 403, "message": PSA, "pods": 7, "attempts": 3, "delaySeconds": 40.0,
                                   "retryTime": "2100-01-01T00:00:00Z", "observedGeneration": 1}}
    edited = {**snap.jobs[0], "metadata": {**snap.jobs[0]["metadata"], "generation": 2}, "status": status}
    cluster = cluster_from(Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=(edited, snap.jobs[1]), pods=snap.pods))
    assert cluster.jobs[0].reported.refusal is None
    kept = cluster_from(Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=({**snap.jobs[0], "status": status},),
                                 pods=snap.pods))
    assert kept.jobs[0].reported.refusal == Refusal(PSA, 7, 4102444800.0, 403, 3)
    # malformed records are ignored, never a traceback
    for bad in ({"code": "x"}, {"retryTime": "soon"}, [], "text", {**status["admissionRefusal"], "attempts": 0}):
        broken = {**snap.jobs[0], "status": {"admissionRefusal": bad}}
        assert cluster_from(Snapshot(jobs=(broken,))).jobs[0].reported.refusal is None


def test_a_restarted_planner_reads_the_refusal_only_without_a_previous_plan() -> None:
    """The plan reads ``status.admissionRefusal`` when it has no previous plan (a restart); with one, the operator's
    record (``Cluster.refused``) is the truth, so a status not yet rewritten after a successful creation does not
    hold the job back."""
    status = {"admissionRefusal": {"code": 403, "message": PSA, "pods": 7, "attempts": 1, "delaySeconds": 10.0,
                                   "retryTime": "2100-01-01T00:00:00Z", "observedGeneration": 1}}
    snap = _refusal_cluster()
    held = Snapshot(nodes=snap.nodes, pools=snap.pools, jobs=({**snap.jobs[0], "status": status}, snap.jobs[1]),
                    pods=snap.pods)
    cluster = cluster_from(held)
    restarted = build_plan(cluster, options=PlanOptions(now=NOW))
    assert check_plan(cluster, restarted) == []
    assert [p for p in restarted.pods if p.job == "x" and p.action == "create"] == []
    assert "AdmissionRefused" in {c.type for c in restarted.jobs[KEY].conditions}
    going_on = build_plan(cluster, restarted, options=PlanOptions(now=NOW + 1))
    assert [p for p in going_on.pods if p.job == "x" and p.action == "create"]


def test_a_restarted_planner_keeps_the_misplacement_count_and_backoff() -> None:
    """A pod of j bound outside its pool is counted (``misplacedPods: 1``, ``lastMisplacementTime``) and removed;
    the restarted planner (no previous plan) fed the status as written creates no replacement until the backoff
    (10 s after the first misplacement) ends, and the next misplacement counts 2 (a 20 s backoff), not 1."""
    nodes = (node("a0", "a"), node("x0", "x", gpus="8"))
    pools = (pool("a"), pool("x"))
    jobs = (job("j", {"a": 1.0}, count=1),)
    astray = Snapshot(nodes=nodes, pools=pools, jobs=jobs, pods=(_pod("j-0", "j", "x0", "a", NOW),))
    first = build_plan(astray, options=PlanOptions(now=NOW))
    assert first.jobs[("ml", "j")].misplaced == 1
    assert [p.action for p in first.pods if p.name == "j-0"] in (["delete"], ["evict"])
    written = job_status(first.jobs[("ml", "j")])
    assert written["misplacedPods"] == 1 and written["lastMisplacementTime"]

    # the restart: the misplaced pod is gone, the status as written, no previous plan
    gone = Snapshot(nodes=nodes, pools=pools, jobs=({**jobs[0], "status": written},))
    during = build_plan(gone, options=PlanOptions(now=NOW + 5))
    assert check_plan(cluster_from(gone), during) == []
    assert [p for p in during.pods if p.job == "j" and p.action == "create"] == []
    assert "Misplaced" in {c.type for c in during.jobs[("ml", "j")].conditions}
    bare = build_plan(Snapshot(nodes=nodes, pools=pools, jobs=jobs), options=PlanOptions(now=NOW + 5))
    assert [p for p in bare.pods if p.job == "j" and p.action == "create"]  # without the status: at once
    after = build_plan(gone, options=PlanOptions(now=NOW + misplaced_delay(1) + 1))
    created = [p for p in after.pods if p.job == "j" and p.action == "create"]
    assert len(created) == 1
    # misplaced again after the restart: the count goes on (2), so the backoff doubles
    t = NOW + misplaced_delay(1) + 2
    again = Snapshot(nodes=nodes, pools=pools, jobs=({**jobs[0], "status": job_status(after.jobs[("ml", "j")])},),
                     pods=(_pod(created[0].name, "j", "x0", "a", t),))
    second = build_plan(again, options=PlanOptions(now=t))
    assert second.jobs[("ml", "j")].misplaced == 2
    gone_again = Snapshot(nodes=nodes, pools=pools,
                          jobs=({**jobs[0], "status": job_status(second.jobs[("ml", "j")])},))
    for dt, creates in ((misplaced_delay(2) - 1, 0), (misplaced_delay(2) + 1, 1)):
        plan = build_plan(gone_again, options=PlanOptions(now=t + dt))
        assert sum(1 for p in plan.pods if p.job == "j" and p.action == "create") == creates, dt

