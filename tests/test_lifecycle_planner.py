"""The planner's lifecycle phase (walras.planner.lifecycle) with an explicit clock: complete jobs, failed pods with
backoff and a limit, node loss with a grace period, suspension; every plan checked with the shared invariants."""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from walras.kube.decode import cluster_from
from walras.kube.encode import job_status
from walras.manifests.schema import to_json_schema
from walras.planner import Plan, Snapshot
from walras.planner.invariants import check_plan
from walras.planner.lifecycle import backoff_delay
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL, rfc3339
from walras.planner.plan import PlanOptions

from tests.planning import build_plan
from tests.test_planner import ROOT

NOW = 1_800_000_000.0


def node(name: str, gpu: str = "a", ready: bool = True, since: float | None = None, gpus: str = "4") -> dict:
    condition: dict[str, Any] = {"type": "Ready", "status": "True" if ready else "False"}
    if since is not None:
        condition["lastTransitionTime"] = rfc3339(since)
    return {"kind": "Node", "metadata": {"name": name, "labels": {"gpu": gpu}}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": gpus, "cpu": "32"}, "conditions": [condition]}}


def pool(name: str) -> dict:
    return {"kind": "ResourcePool", "metadata": {"name": name},
            "spec": {"nodeSelector": {"gpu": name}, "resource": "nvidia.com/gpu", "policy": {"type": "utility"}}}


def job(name: str, throughput: dict[str, float], count: int = 2, status: dict | None = None, **extra: Any) -> dict:
    spec: dict[str, Any] = {"throughput": throughput, "utility": {"type": "linear"}, "replicas": {"count": count},
                            "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}, **extra}
    obj: dict[str, Any] = {"kind": "FungibleJob", "metadata": {"name": name, "namespace": "ml", "generation": 3},
                           "spec": spec}
    if status is not None:
        obj["status"] = {"observedGeneration": 3, **status}
    return obj


def pod(name: str, owner: str, node_name: str | None, phase: str = "Running", pool_name: str = "a",
        reason: str = "", terminating: bool = False, started: float | None = NOW - 3600) -> dict:
    meta: dict[str, Any] = {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                            "labels": {LABEL_JOB: owner, LABEL_POOL: pool_name, LABEL_MANAGED: "true"}}
    if terminating:
        meta["deletionTimestamp"] = rfc3339(NOW - 1)
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}
    if node_name is not None:
        spec["nodeName"] = node_name
    status: dict[str, Any] = {"phase": phase}
    if reason:
        status["reason"] = reason
    if started is not None and node_name is not None:
        status["startTime"] = rfc3339(started)
    return {"kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def plan_of(snapshot: Snapshot, previous: Plan | None = None, now: float | None = NOW, **options: Any) -> Plan:
    plan = build_plan(snapshot, previous, options=PlanOptions(now=now, **options))
    assert check_plan(cluster_from(snapshot), plan) == []
    return plan


def actions(plan: Plan, owner: str, action: str) -> list[str]:
    return sorted(p.name for p in plan.pods if p.job == owner and p.action == action)


def conditions(plan: Plan, owner: str) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in plan.jobs[("ml", owner)].conditions}


@functools.cache
def status_validator() -> jsonschema.Draft202012Validator:
    crd = yaml.safe_load((ROOT / "crds" / "fungiblejobs.walras.dev.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft202012Validator(to_json_schema(schema["properties"]["status"]))


# --- complete ------------------------------------------------------------------------------------------------------


def _two_jobs(x_pods: list[dict], x_status: dict | None = None) -> Snapshot:
    return Snapshot(nodes=(node("a0"),), pools=(pool("a"),),
                    jobs=(job("x", {"a": 2.0}, count=4, status=x_status), job("y", {"a": 1.0}, count=4)),
                    pods=tuple(x_pods))


def test_complete_job_frees_its_capacity_and_the_market_reprices_without_it() -> None:
    running = plan_of(_two_jobs([pod(f"x-{k}", "x", "a0") for k in range(4)]))
    assert actions(running, "x", "keep") == [f"x-{k}" for k in range(4)] and actions(running, "y", "create") == []
    done = plan_of(_two_jobs([pod(f"x-{k}", "x", "a0", phase="Succeeded") for k in range(4)]))
    x, y = done.jobs[("ml", "x")], done.jobs[("ml", "y")]
    assert x.phase == "Complete" and conditions(done, "x")["Complete"] == ("True", "PodSucceeded")
    assert x.allocation == {} and x.completion_time == NOW
    assert job_status(x)["completionTime"] == rfc3339(NOW)
    assert actions(done, "x", "create") == [] and not any(p.job == "x" for p in done.pods)  # Succeeded pods kept
    assert len(actions(done, "y", "create")) == 4  # the 4 GPUs x held are sold again
    assert y.allocation == {"a": 1.0}
    status_validator().validate(job_status(x))


def test_complete_is_sticky_for_the_generation_and_a_succeeded_pod_stops_new_pods() -> None:
    sticky = plan_of(_two_jobs([], {"phase": "Complete", "completionTime": rfc3339(NOW - 50)}))
    assert sticky.jobs[("ml", "x")].phase == "Complete" and actions(sticky, "x", "create") == []
    # a new generation is planned again when nothing succeeded
    snap = _two_jobs([], {"phase": "Complete"})
    snap.jobs[0]["metadata"]["generation"] = 4
    assert len(actions(plan_of(snap), "x", "create")) > 0
    # one pod succeeded, two run: the job creates nothing more and keeps the two
    mixed = plan_of(_two_jobs([pod("x-0", "x", "a0", phase="Succeeded"), pod("x-1", "x", "a0"),
                               pod("x-2", "x", "a0")]))
    assert actions(mixed, "x", "keep") == ["x-1", "x-2"] and actions(mixed, "x", "create") == []
    assert conditions(mixed, "x")["Complete"] == ("False", "PodsFinishing")
    assert mixed.jobs[("ml", "x")].throughput == 2 * 2.0 / 4  # two of four replicas on a pool of throughput 2


# --- failed pods ---------------------------------------------------------------------------------------------------


def _failing(extra_pods: list[dict] | None = None, status: dict | None = None, **spec: Any) -> Snapshot:
    pods = [pod("x-0", "x", "a0"), pod("x-1", "x", "a1", phase="Failed", reason="OutOfcpu")] + (extra_pods or [])
    return Snapshot(nodes=(node("a0"), node("a1")), pools=(pool("a"),),
                    jobs=(job("x", {"a": 1.0}, count=2, status=status, **spec),), pods=tuple(pods))


def test_failed_pod_is_deleted_and_replaced_only_after_the_backoff() -> None:
    snap = _failing()
    first = plan_of(snap, now=NOW)
    jp = first.jobs[("ml", "x")]
    assert actions(first, "x", "delete") == ["x-1"] and actions(first, "x", "create") == []
    assert jp.failures == 1 and jp.last_failure == NOW and conditions(first, "x")["Backoff"][1] == "FailedPodBackoff"
    assert job_status(jp)["failedPods"] == 1 and job_status(jp)["lastFailureTime"] == rfc3339(NOW)
    assert any(e.reason == "PodFailed" for e in first.events)
    early = plan_of(snap, first, now=NOW + backoff_delay(1) - 1)
    assert actions(early, "x", "create") == [] and early.jobs[("ml", "x")].failures == 1
    late = plan_of(snap, early, now=NOW + backoff_delay(1) + 1)
    assert len(actions(late, "x", "create")) == 1 and late.jobs[("ml", "x")].failures == 1
    assert actions(late, "x", "delete") == ["x-1"]  # still visible: deleted again, not counted again


def test_failure_count_is_idempotent_over_repeated_plans_of_the_same_cluster() -> None:
    snap = _failing()
    previous = None
    for step in range(5):
        previous = plan_of(snap, previous, now=NOW + step)
        assert previous.jobs[("ml", "x")].failures == 1
        assert previous.jobs[("ml", "x")].last_failure == NOW  # the first plan that counted it
    # the status caught up (failedPods 1) and the deletion is issued: a fresh planner (no previous plan) agrees
    gone = _failing(status={"failedPods": 1, "lastFailureTime": rfc3339(NOW)})
    gone.pods[1]["metadata"]["deletionTimestamp"] = rfc3339(NOW + 1)
    assert plan_of(gone, None, now=NOW + 2).jobs[("ml", "x")].failures == 1
    # a second failed pod is counted once more
    again = plan_of(_failing([pod("x-2", "x", "a0", phase="Failed")]), previous, now=NOW + 6)
    assert again.jobs[("ml", "x")].failures == 2 and again.jobs[("ml", "x")].last_failure == NOW + 6


def test_backoff_doubles_from_the_reported_last_failure_up_to_six_minutes() -> None:
    assert [backoff_delay(k) for k in (0, 1, 2, 3, 6, 7, 50)] == [0, 10, 20, 40, 320, 360, 360]
    status = {"failedPods": 3, "lastFailureTime": rfc3339(NOW - 30)}  # backoff of the 3rd failure: 40 s
    snap = Snapshot(nodes=(node("a0"),), pools=(pool("a"),), jobs=(job("x", {"a": 1.0}, 2, status),),
                    pods=(pod("x-0", "x", "a0"),))
    assert actions(plan_of(snap, now=NOW), "x", "create") == []
    assert len(actions(plan_of(snap, now=NOW + 11), "x", "create")) == 1
    assert len(actions(plan_of(snap, now=None), "x", "create")) == 1  # no clock: no backoff measured


def test_more_failures_than_the_backoff_limit_fail_the_job_and_release_its_share() -> None:
    snap = _failing(status={"failedPods": 1, "lastFailureTime": rfc3339(NOW - 1000)}, backoffLimit=1)
    plan = plan_of(snap)
    jp = plan.jobs[("ml", "x")]
    assert jp.phase == "Failed" and conditions(plan, "x")["Failed"] == ("True", "BackoffLimitExceeded")
    assert jp.failures == 2 and jp.allocation == {} and "Scheduled" not in conditions(plan, "x")
    # the failed pod is deleted, the running one evicted (PodDisruptionBudgets hold)
    assert actions(plan, "x", "delete") == ["x-1"] and actions(plan, "x", "evict") == ["x-0"]
    assert actions(plan, "x", "create") == []
    live = next(p for p in plan.pods if p.name == "x-0")
    assert live.reason.startswith("BackoffLimitExceeded") and live.grace is None
    assert any(e.reason == "BackoffLimitExceeded" for e in plan.events)
    status_validator().validate(job_status(jp))
    # at the limit (one failure of one allowed) the job is not Failed: it waits and retries
    within = plan_of(_failing(backoffLimit=1))
    assert within.jobs[("ml", "x")].phase != "Failed" and actions(within, "x", "keep") == ["x-0"]


# --- node loss -----------------------------------------------------------------------------------------------------


def _on_node(a0: dict) -> Snapshot:
    return Snapshot(nodes=(a0, node("a1")), pools=(pool("a"),), jobs=(job("x", {"a": 1.0}, count=2),),
                    pods=(pod("x-0", "x", "a0"), pod("x-1", "x", "a1")))


def test_pods_of_a_notready_node_are_kept_within_the_grace_and_replanned_after_it() -> None:
    snap = _on_node(node("a0", ready=False, since=NOW - 100))
    within = plan_of(snap, now=NOW)
    assert actions(within, "x", "keep") == ["x-0", "x-1"] and actions(within, "x", "create") == []
    assert within.jobs[("ml", "x")].replicas == {"a": 2}
    after = plan_of(snap, now=NOW + 201)  # NotReady for 301 s > 300 s
    lost = next(p for p in after.pods if p.name == "x-0")
    assert lost.action == "delete" and lost.grace == 0 and lost.reason.startswith("NodeLost")
    created = [p for p in after.pods if p.action == "create"]
    assert [p.node for p in created] == ["a1"] and after.jobs[("ml", "x")].replicas == {"a": 2}
    assert any(e.reason == "NodeLost" for e in after.events)
    # a shorter grace applies at once; no clock: nothing is lost by time
    assert next(p for p in plan_of(snap, node_loss_grace=60).pods if p.name == "x-0").grace == 0
    assert actions(plan_of(snap, now=None), "x", "keep") == ["x-0", "x-1"]


def test_pods_of_a_node_that_is_gone_are_force_deleted_and_replanned_in_the_same_plan() -> None:
    snap = Snapshot(nodes=(node("a1"),), pools=(pool("a"),), jobs=(job("x", {"a": 1.0}, count=2),),
                    pods=(pod("x-0", "x", "a0", terminating=True), pod("x-1", "x", "a1")))
    for now in (NOW, None):
        plan = plan_of(snap, now=now)
        lost = next(p for p in plan.pods if p.name == "x-0")
        assert (lost.action, lost.grace) == ("delete", 0)
        assert [(p.node, p.name) for p in plan.pods if p.action == "create"] == [("a1", "x-a-0")]
        assert actions(plan, "x", "keep") == ["x-1"]


# --- suspend -------------------------------------------------------------------------------------------------------


def test_suspend_deletes_the_pods_releases_the_share_and_resume_replans() -> None:
    def snap(suspend: bool, pods: tuple[dict, ...]) -> Snapshot:
        return Snapshot(nodes=(node("a0"),), pools=(pool("a"),),
                        jobs=(job("x", {"a": 2.0}, count=4, suspend=suspend), job("y", {"a": 1.0}, count=4)),
                        pods=pods)

    running = tuple(pod(f"x-{k}", "x", "a0") for k in range(4))
    suspended = plan_of(snap(True, running))
    jp = suspended.jobs[("ml", "x")]
    assert jp.phase == "Suspended" and conditions(suspended, "x")["Suspended"] == ("True", "JobSuspended")
    # running pods leave through the Eviction API (PodDisruptionBudgets hold)
    assert actions(suspended, "x", "evict") == [f"x-{k}" for k in range(4)] and jp.allocation == {}
    assert actions(suspended, "x", "delete") == []
    assert all(p.grace is None and p.reason.startswith("Suspended") for p in suspended.pods if p.job == "x")
    assert any(e.reason == "Suspended" for e in suspended.events)
    status_validator().validate(job_status(jp))
    # the GPUs are sold again once the pods are gone (a deletion frees room only when the pod is gone)
    gone = plan_of(snap(True, ()), suspended)
    assert gone.jobs[("ml", "y")].allocation == {"a": 1.0} and len(actions(gone, "y", "create")) == 4
    assert not any(e.reason == "Suspended" for e in gone.events)  # the event marks the transition only
    resumed = plan_of(snap(False, ()), gone)
    assert resumed.jobs[("ml", "x")].phase != "Suspended" and len(actions(resumed, "x", "create")) == 4
    assert any(e.reason == "Resumed" for e in resumed.events)


# --- property ------------------------------------------------------------------------------------------------------

PHASES = ["Running", "Pending", "Succeeded", "Failed"]


@st.composite
def lifecycle_clusters(draw: st.DrawFn) -> tuple[Snapshot, float | None]:
    nodes = []
    for k in range(draw(st.integers(1, 3))):
        ready = draw(st.booleans())
        since = None if ready else NOW - draw(st.sampled_from([10, 299, 301, 5000]))
        nodes.append(node(f"a{k}", ready=ready, since=since, gpus="8"))
    names = [n["metadata"]["name"] for n in nodes] + ["gone"]
    jobs, pods = [], []
    for j in range(draw(st.integers(1, 3))):
        owner = f"j{j}"
        status = draw(st.sampled_from([None, {"phase": "Complete"}, {"failedPods": 2,
                                                                       "lastFailureTime": rfc3339(NOW - 15)}]))
        jobs.append(job(owner, {"a": 1.0}, count=draw(st.integers(1, 3)), status=status,
                        suspend=draw(st.booleans()), backoffLimit=draw(st.integers(0, 3)),
                        utility={"type": draw(st.sampled_from(["linear", "log"]))}))
        for q in range(draw(st.integers(0, 3))):
            phase = draw(st.sampled_from(PHASES))
            where = draw(st.sampled_from(names)) if phase != "Pending" else None
            pods.append(pod(f"{owner}-a-{q}", owner, where, phase=phase, terminating=draw(st.booleans())))
    now = draw(st.sampled_from([None, NOW, NOW + 400]))
    return Snapshot(nodes=tuple(nodes), pools=(pool("a"),), jobs=tuple(jobs), pods=tuple(pods)), now


@settings(max_examples=25, deadline=None)
@given(lifecycle_clusters())
def test_random_lifecycle_states_never_break_an_invariant(case: tuple[Snapshot, float | None]) -> None:
    snap, now = case
    first = plan_of(snap, now=now)
    second = plan_of(snap, first, now=now)  # re-planning the same cluster changes no count
    for plan in (first, second):
        deleted = {p.name for p in plan.pods if p.action == "delete"}
        kept = {p.name for p in plan.pods if p.action in ("keep", "bind", "resize", "create")}
        assert not deleted & kept
        for jp in plan.jobs.values():
            if jp.phase in ("Complete", "Failed", "Suspended"):
                assert not [p for p in jp.pods if p.action in ("create", "bind")] and jp.allocation == {}
            status_validator().validate(job_status(jp))
            json.dumps(job_status(jp), allow_nan=False)  # the API server takes JSON: no infinite utility of nothing
    assert {k: j.failures for k, j in first.jobs.items()} == {k: j.failures for k, j in second.jobs.items()}
    # every pod on a gone node is force-deleted
    for p in cluster_from(snap).pods:
        if p.node == "gone" and not p.terminal:
            planned = first.pod(p.namespace, p.name)
            assert planned is not None and planned.grace == 0
