"""The operator's side of safe removals and quiet plans: Events aggregated the Kubernetes way (a repeat raises the
count of the same Event object, :class:`walras.operator.recorder.Recorder`), a refused eviction backed off and
reported on the job (:class:`walras.operator.actuator.Actuator`,
:func:`walras.operator.statuses.with_eviction_blocked`), with a fake API client that records every request."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from walras.kube.client import Eviction
from walras.kube.errors import NotFound
from walras.metrics import WalrasMetrics
from walras.operator.actuator import EVICTION_BACKOFF, EVICTION_BACKOFF_CAP, Actuator
from walras.operator.assumed import AssumedPods
from walras.operator.recorder import Recorder
from walras.operator.statuses import with_eviction_blocked
from walras.operator.watch import SnapshotIndex
from walras.planner.model import Plan, PodPlan, Snapshot

JOB = {"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob",
       "metadata": {"name": "j", "namespace": "ns", "uid": "job-uid"}, "spec": {}}
POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "j-0", "namespace": "ns", "uid": "pod-uid", "labels": {"walras.dev/job": "j"},
                    "ownerReferences": [{"controller": True, "uid": "job-uid"}]},
       "spec": {"nodeName": "n0", "containers": [{"name": "c"}]}, "status": {"phase": "Running"}}
REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."


class FakeClient:
    """Records each request as (verb, what, detail); evictions answer from ``answers``."""

    def __init__(self, answers: list[str] | None = None, expired: bool = False) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.answers = answers or []
        self.expired = expired
        self.events = 0

    async def post_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
        self.events += 1
        self.calls.append(("POST", "event", event["reason"]))
        return {**event, "metadata": {"name": f"ev-{self.events}", "namespace": namespace}}

    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if self.expired:
            raise NotFound(404, "NotFound", "events not found")
        self.calls.append(("PATCH", name, patch["count"]))
        return {}

    async def evict_pod(self, namespace: str, name: str, grace: int | None = None,
                        uid: str | None = None) -> Eviction:
        self.calls.append(("POST", "eviction", name))
        outcome = self.answers.pop(0)
        return Eviction(outcome, REFUSED if outcome == "blocked" else "")  # type: ignore[arg-type]

    async def delete_pod(self, namespace: str, name: str, grace: int | None = None, uid: str | None = None) -> bool:
        self.calls.append(("DELETE", "pod", name))
        return True


@pytest.mark.asyncio
async def test_a_repeated_event_raises_the_count_of_one_event_object() -> None:
    client = FakeClient()
    recorder = Recorder(client, "me")  # type: ignore[arg-type]
    for _ in range(3):
        await recorder.event(JOB, "Warning", "EvictionBlocked", "refused")
    await recorder.event(JOB, "Warning", "EvictionBlocked", "refused for another reason")
    assert client.calls == [("POST", "event", "EvictionBlocked"), ("PATCH", "ev-1", 2), ("PATCH", "ev-1", 3),
                            ("POST", "event", "EvictionBlocked")]


@pytest.mark.asyncio
async def test_an_expired_event_is_created_again() -> None:
    client = FakeClient(expired=True)
    recorder = Recorder(client, "me")  # type: ignore[arg-type]
    await recorder.event(JOB, "Normal", "Priced", "p")
    await recorder.event(JOB, "Normal", "Priced", "p")
    assert client.calls == [("POST", "event", "Priced"), ("POST", "event", "Priced")]


def _actuator(client: FakeClient, clock: list[float]) -> Actuator:
    actuator = Actuator(client, Recorder(client, "me"), WalrasMetrics(), AssumedPods(),  # type: ignore[arg-type]
                        mode="extender")
    actuator.clock = lambda: clock[0]
    return actuator


async def _act(actuator: Actuator, plan: Plan, index: SnapshotIndex) -> None:
    for call in actuator.calls(plan, index):
        await call


@pytest.mark.asyncio
async def test_a_refused_eviction_is_retried_with_capped_exponential_backoff_and_never_deleted() -> None:
    client = FakeClient(["blocked"] * 12 + ["evicted"])
    clock = [0.0]
    actuator = _actuator(client, clock)
    plan = Plan(pods=(PodPlan("ns", "j-0", "j", "p", "n0", action="evict", exists=True, reason="surplus: x"),))
    index = SnapshotIndex.of(Snapshot(pods=(POD,), jobs=(JOB,)))
    asked: list[float] = []
    while clock[0] < 2000.0 and client.answers:
        before = len([c for c in client.calls if c[1] == "eviction"])
        await _act(actuator, plan, index)
        if len([c for c in client.calls if c[1] == "eviction"]) > before:
            asked.append(clock[0])
        clock[0] += 0.5  # a plan every half second
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    expected = [min(EVICTION_BACKOFF * 2 ** k, EVICTION_BACKOFF_CAP) for k in range(len(gaps))]
    assert all(abs(g - e) <= 0.5 for g, e in zip(gaps, expected, strict=True)), (gaps, expected)
    assert max(gaps) <= EVICTION_BACKOFF_CAP + 0.5 and len(asked) == 13
    assert not [c for c in client.calls if c[0] == "DELETE"], "a refused eviction never becomes a DELETE"
    # one EvictionBlocked Event object, its count raised; the job's report is cleared once the eviction went through
    assert [c for c in client.calls if c[:2] == ("POST", "event")] == [("POST", "event", "EvictionBlocked"),
                                                                        ("POST", "event", "Evicted")]
    assert actuator.eviction_blocked == {}


@pytest.mark.asyncio
async def test_a_refused_eviction_is_reported_on_the_job_with_the_api_servers_message() -> None:
    client = FakeClient(["blocked"])
    actuator = _actuator(client, [0.0])
    plan = Plan(pods=(PodPlan("ns", "j-0", "j", "p", "n0", action="evict", exists=True),))
    await _act(actuator, plan, SnapshotIndex.of(Snapshot(pods=(POD,), jobs=(JOB,))))
    message = actuator.eviction_blocked[("ns", "j")]
    assert message == f"pod j-0: {REFUSED}"
    status = with_eviction_blocked({"phase": "Running", "conditions": [{"type": "Valid", "status": "True"}]}, message)
    assert status["conditions"][-1] == {"type": "EvictionBlocked", "status": "True", "reason": "DisruptionBudget",
                                        "message": message}
    assert with_eviction_blocked({"conditions": []}, None) == {"conditions": []}
    # the plan no longer evicts the pod (the market wants it again): the report goes
    keep = Plan(pods=(PodPlan("ns", "j-0", "j", "p", "n0", action="keep", exists=True),))
    await _act(actuator, keep, SnapshotIndex.of(Snapshot(pods=(POD,), jobs=(JOB,))))
    assert actuator.eviction_blocked == {}
