"""The operator's side of refused pod creations (docs/refusals.md, :class:`walras.operator.actuator.Actuator`): a
create the API server refuses (Pod Security 403, ResourceQuota 403, a webhook's 400) becomes a Warning Event on the
job (aggregated), a :class:`walras.planner.cluster.Refusal` the next plans read (``Cluster.refused``), and is asked
again only after a backoff that doubles per refused attempt up to a cap; a creation that succeeds ends it. With a fake
API client that records every request and a clock the test moves."""

from __future__ import annotations

from typing import Any

import pytest
from walras.kube.errors import ApiError, Forbidden, NotFound
from walras.metrics import WalrasMetrics
from walras.operator.actuator import REFUSAL_BACKOFF, REFUSAL_BACKOFF_CAP, Actuator
from walras.operator.assumed import AssumedPods
from walras.operator.recorder import Recorder
from walras.operator.watch import SnapshotIndex
from walras.planner.cluster import Refusal
from walras.planner.model import Plan, PodPlan, Snapshot

JOB = {"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob",
       "metadata": {"name": "j", "namespace": "ns", "uid": "job-uid", "resourceVersion": "1", "generation": 1},
       "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}
PSA = ('pods "j-0" is forbidden: violates PodSecurity "restricted:latest": privileged (container "c" must not '
       'set securityContext.privileged=true)')


class FakeClient:
    """Records pod creations and Events; a creation raises ``refusal`` while ``refuse`` is set."""

    def __init__(self, refusal: ApiError | None) -> None:
        self.refusal = refusal
        self.creates: list[str] = []
        self.events: list[tuple[str, str, int]] = []  # (reason, message, count)
        self._names: dict[str, int] = {}

    async def create_pod(self, namespace: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        self.creates.append(body["metadata"]["name"])
        if self.refusal is not None:
            raise self.refusal
        return {**body, "metadata": {**body["metadata"], "uid": "u-" + body["metadata"]["name"]}}, True

    async def post_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
        name = f"ev-{len(self.events)}"
        self.events.append((event["reason"], event["message"], 1))
        self._names[name] = len(self.events) - 1
        return {**event, "metadata": {"name": name, "namespace": namespace}, "count": 1}

    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if name not in self._names:
            raise NotFound(404, "NotFound", "gone")
        i = self._names[name]
        reason, message, _ = self.events[i]
        self.events[i] = (reason, message, patch["count"])
        return {}


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def creates(*names: str) -> Plan:
    return Plan(pods=tuple(PodPlan("ns", name, "j", "p", None) for name in names))


async def act(actuator: Actuator, plan: Plan, jobs: tuple[dict[str, Any], ...] = (JOB,)) -> None:
    for call in actuator.calls(plan, SnapshotIndex.of(Snapshot(jobs=jobs))):
        await call


def actuator_for(client: FakeClient, clock: Clock) -> Actuator:
    return Actuator(client, Recorder(client, "me"), WalrasMetrics(), AssumedPods(), mode="extender",  # type: ignore[arg-type]
                    wall=clock)


@pytest.mark.asyncio
async def test_a_refused_create_is_recorded_reported_and_backed_off_doubling_to_the_cap() -> None:
    client, clock = FakeClient(Forbidden(403, "Forbidden", PSA)), Clock()
    actuator = actuator_for(client, clock)
    plan = creates("j-0", "j-1", "j-2")
    await act(actuator, plan)
    assert client.creates == ["j-0", "j-1", "j-2"]  # one attempt: the plan's three creates
    got = actuator.refusals[("ns", "j")]
    assert got == Refusal(PSA, pods=3, until=clock.now + REFUSAL_BACKOFF, code=403, attempts=1)
    assert [e[0] for e in client.events] == ["AdmissionRefused"] * 3 and PSA in client.events[0][1]
    # plans within the backoff send nothing
    for _ in range(5):
        clock.now += 1
        await act(actuator, plan)
    assert len(client.creates) == 3
    # each refused attempt doubles the delay, up to the cap
    delays = []
    for _ in range(8):
        clock.now = actuator.refusals[("ns", "j")].until
        before = clock.now
        await act(actuator, plan)
        delays.append(actuator.refusals[("ns", "j")].until - before)
    expected = [min(REFUSAL_BACKOFF * 2 ** k, REFUSAL_BACKOFF_CAP) for k in range(1, 9)]
    assert delays == expected, delays
    assert actuator.refusals[("ns", "j")].attempts == 9 and len(client.creates) == 3 * 9
    # the Events are aggregated: the same three Event objects, their counts raised
    assert len(client.events) == 3 and all(count == 9 for _, _, count in client.events)


@pytest.mark.asyncio
async def test_a_creation_that_succeeds_ends_the_refusal() -> None:
    client, clock = FakeClient(Forbidden(403, "Forbidden", 'pods "j-0" is forbidden: exceeded quota: q')), Clock()
    actuator = actuator_for(client, clock)
    await act(actuator, creates("j-0"))
    assert ("ns", "j") in actuator.refusals
    client.refusal = None  # the quota was raised
    clock.now += REFUSAL_BACKOFF
    await act(actuator, creates("j-0"))
    assert actuator.refusals == {} and client.creates == ["j-0", "j-0"]


@pytest.mark.asyncio
async def test_a_refusal_ends_when_its_job_is_gone_or_its_spec_changes() -> None:
    client, clock = FakeClient(ApiError(400, "BadRequest", 'admission webhook "deny.example" denied the request')),\
        Clock()
    actuator = actuator_for(client, clock)
    await act(actuator, creates("j-0"))
    assert actuator.refusals[("ns", "j")].code == 400
    await act(actuator, Plan(), jobs=())  # the job was deleted
    assert actuator.refusals == {}
    await act(actuator, creates("j-0"))
    clock.now += REFUSAL_BACKOFF + 1
    await act(actuator, Plan())  # past the backoff, nothing asked (no room for a retry): the record stays
    assert ("ns", "j") in actuator.refusals
    edited = {**JOB, "metadata": {**JOB["metadata"], "generation": 2}}
    await act(actuator, Plan(), jobs=(edited,))  # the template was fixed: its pods are asked for at once
    assert actuator.refusals == {}


@pytest.mark.asyncio
async def test_other_errors_are_not_refusals() -> None:
    client, clock = FakeClient(ApiError(500, "InternalError", "etcd timeout")), Clock()
    actuator = actuator_for(client, clock)
    with pytest.raises(ApiError):
        await act(actuator, creates("j-0"))
    assert actuator.refusals == {}


@pytest.mark.asyncio
async def test_the_controller_hands_the_refusals_to_the_next_plan() -> None:
    from walras.operator.controller import Controller

    client, clock = FakeClient(Forbidden(403, "Forbidden", PSA)), Clock()
    seen: list[Any] = []

    def planner(cluster: Any, previous: Any, **_: Any) -> Plan:
        seen.append(cluster)
        return Plan()

    controller = Controller(client, lambda: Snapshot(jobs=(JOB,)), planner)  # type: ignore[arg-type]
    controller.actuator.wall = clock
    controller.planned_from(Snapshot(jobs=(JOB,)), None)
    assert seen[-1].refused == {}
    await act(controller.actuator, creates("j-0"))
    controller.planned_from(Snapshot(jobs=(JOB,)), None)
    assert seen[-1].refused == {("ns", "j"): Refusal(PSA, 1, clock.now + REFUSAL_BACKOFF, 403, 1)}
