"""``walras_pod_creations_refused_total{fungiblejob_namespace, fungiblejob, reason}`` (docs/refusals.md): every pod
creation the API server refuses is counted by the actuator, under which admission refused it (Pod Security,
ResourceQuota, a webhook, validation, other), read from the API server's own messages; plans within the backoff add
nothing (no request is sent); a job's series go when it leaves the plan. Read back through prometheus-client's text
parser."""

from __future__ import annotations

import pytest
from walras.kube.errors import ApiError, Forbidden, UnprocessableEntity
from walras.metrics import REFUSAL_REASONS, WalrasMetrics, refusal_reason
from walras.planner.model import JobPlan, Plan

from tests.test_metrics import samples
from tests.test_refusals_operator import PSA, Clock, FakeClient, act, actuator_for, creates

NAME = "walras_pod_creations_refused_total"
#: The API server's messages, as kube-apiserver v1.36 words them (Pod Security, quota, webhook, validation).
QUOTA = ('pods "j-0" is forbidden: exceeded quota: q, requested: requests.nvidia.com/gpu=1, used: '
         'requests.nvidia.com/gpu=4, limited: requests.nvidia.com/gpu=4')
NEEDS = 'pods "j-0" is forbidden: failed quota: q: must specify limits.cpu for: c'
WEBHOOK = 'admission webhook "deny.example.com" denied the request: no'
INVALID = 'Pod "j-0" is invalid: spec.containers[0].image: Required value'


def refused(metrics: WalrasMetrics) -> dict[tuple[str, str, str], float]:
    out = {}
    for (name, labels), value in samples(metrics).items():
        if name == NAME:
            got = dict(labels)
            out[(got["fungiblejob_namespace"], got["fungiblejob"], got["reason"])] = value
    return out


@pytest.mark.parametrize(("code", "message", "reason"), [
    (403, PSA, "PodSecurity"), (403, QUOTA, "ResourceQuota"), (403, NEEDS, "ResourceQuota"),
    (400, WEBHOOK, "Webhook"), (403, WEBHOOK, "Webhook"), (422, INVALID, "Invalid"), (403, "forbidden", "Other"),
    (400, "", "Other")])
def test_the_reason_is_one_of_a_fixed_set_read_from_the_api_servers_message(code: int, message: str,
                                                                            reason: str) -> None:
    assert refusal_reason(code, message) == reason
    assert reason in REFUSAL_REASONS


@pytest.mark.asyncio
async def test_each_refused_creation_is_counted_once_and_the_backoff_sends_and_counts_nothing() -> None:
    client, clock = FakeClient(Forbidden(403, "Forbidden", PSA)), Clock()
    actuator = actuator_for(client, clock)
    await act(actuator, creates("j-0", "j-1", "j-2"))
    assert refused(actuator.metrics) == {("ns", "j", "PodSecurity"): 3.0}
    for _ in range(3):  # within the backoff: no request, no count
        clock.now += 1
        await act(actuator, creates("j-0", "j-1", "j-2"))
    assert refused(actuator.metrics) == {("ns", "j", "PodSecurity"): 3.0}
    clock.now = actuator.refusals[("ns", "j")].until
    client.refusal = Forbidden(403, "Forbidden", QUOTA)  # now the quota refuses it
    await act(actuator, creates("j-0"))
    assert refused(actuator.metrics) == {("ns", "j", "PodSecurity"): 3.0, ("ns", "j", "ResourceQuota"): 1.0}
    assert len(client.creates) == 4
    # errors that are no refusal are not counted
    clock.now = actuator.refusals[("ns", "j")].until
    client.refusal = ApiError(500, "InternalError", "etcd timeout")
    with pytest.raises(ApiError):
        await act(actuator, creates("j-0"))
    assert sum(refused(actuator.metrics).values()) == 4.0


@pytest.mark.asyncio
async def test_a_jobs_series_go_when_it_leaves_the_plan() -> None:
    client, clock = FakeClient(UnprocessableEntity(422, "Invalid", INVALID)), Clock()
    actuator = actuator_for(client, clock)
    await act(actuator, creates("j-0"))
    metrics = actuator.metrics
    metrics.update(Plan(jobs={("ns", "j"): JobPlan("ns", "j", "Pending")}))
    assert refused(metrics) == {("ns", "j", "Invalid"): 1.0}
    metrics.update(Plan())
    assert refused(metrics) == {}
