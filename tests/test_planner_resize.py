"""The planner marks running pods whose planned requests/limits changed (in-place resize, issue 7): what changes,
what cannot change in place (non-cpu/memory resources), what does not fit on the node, and what is left alone."""

from __future__ import annotations

from typing import Any

from walras.kube.encode import job_status
from walras.planner import Plan, Snapshot
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL

from tests.planning import build_plan


def node(name: str, cpu: str = "16", gpu: str = "4") -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {"gpu": "a"}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": gpu, "cpu": cpu},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pool(policy: str = "throughput") -> dict[str, Any]:
    return {
        "kind": "ResourcePool",
        "metadata": {"name": "a"},
        "spec": {"nodeSelector": {"gpu": "a"}, "resource": "nvidia.com/gpu", "policy": {"type": policy}},
    }


def job(count: int, cpu: str, demand: float = 1, name: str = "j") -> dict[str, Any]:
    return {
        "kind": "FungibleJob",
        "metadata": {"name": name, "namespace": "ml", "generation": 2},
        "spec": {
            "throughput": {"a": 2.0},
            "utility": {"type": "linear"},
            "replicas": {"count": count},
            "demand": demand,
            "resources": {"cpu": cpu},
            "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
        },
    }


def running_pod(
    name: str, node_name: str, requests: dict[str, str], limits: dict[str, str] | None = None, job_name: str = "j"
) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": requests}
    if limits is not None:
        resources["limits"] = limits
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": {LABEL_JOB: job_name, LABEL_POOL: "a", LABEL_MANAGED: "true"},
        },
        "spec": {
            "nodeName": node_name,
            "containers": [
                {"name": "c", "resources": resources},
                {"name": "sidecar", "resources": {"requests": {"cpu": "100m"}}},
            ],
        },
        "status": {"phase": "Running"},
    }


def plan_of(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]], jobs: list[dict[str, Any]], policy: str = "throughput"
) -> Plan:
    return build_plan(Snapshot(nodes=tuple(nodes), pods=tuple(pods), pools=(pool(policy),), jobs=tuple(jobs)))


def conditions(plan: Plan, name: str = "j") -> dict[str, Any]:
    return {c.type: c for c in plan.jobs[("ml", name)].conditions}


def test_unchanged_running_pods_are_kept() -> None:
    gpu_cpu = {"nvidia.com/gpu": "1", "cpu": "2"}
    plan = plan_of([node("n1")], [running_pod("j-a-0", "n1", gpu_cpu, dict(gpu_cpu))], [job(1, "2")])
    (pod,) = plan.pods
    assert (pod.action, pod.reason) == ("keep", "")
    assert "ResourcesCurrent" not in conditions(plan)
    assert plan.jobs[("ml", "j")].phase == "Running"


def test_a_changed_cpu_request_is_a_resize_with_the_new_values_and_the_reason() -> None:
    gpu_cpu = {"nvidia.com/gpu": "1", "cpu": "2"}
    pods = [running_pod(f"j-a-{k}", "n1", gpu_cpu, dict(gpu_cpu)) for k in range(2)]
    plan = plan_of([node("n1")], pods, [job(2, "4")])  # spec.resources.cpu went from 2 to 4
    assert [p.action for p in plan.pods] == ["resize", "resize"]
    for p in plan.pods:
        assert p.node == "n1" and p.exists
        assert p.requests == {"cpu": "4", "nvidia.com/gpu": "1"}
        assert p.limits == {"cpu": "4", "nvidia.com/gpu": "1"}
        assert p.reason == "cpu 2 -> 4"
    cond = conditions(plan)["ResourcesCurrent"]
    assert (cond.status, cond.reason) == ("False", "ResizeNeeded") and cond.message.startswith("2 running pod(s)")
    assert plan.jobs[("ml", "j")].phase == "Running"
    # the pod's status entry shows the new values
    assert job_status(plan.jobs[("ml", "j")])["pods"][0]["requests"] == {"cpu": "4", "nvidia.com/gpu": "1"}


def test_a_limit_that_differs_alone_needs_a_resize_and_a_missing_limit_is_not_added() -> None:
    plan = plan_of(
        [node("n1")], [running_pod("j-a-0", "n1", {"nvidia.com/gpu": "1", "cpu": "2"}, {"cpu": "3"})], [job(1, "2")]
    )
    (pod,) = plan.pods
    assert pod.action == "resize" and pod.reason == "cpu 2 -> 2"
    assert pod.requests == {"cpu": "2", "nvidia.com/gpu": "1"}
    assert pod.limits == {"cpu": "2"}  # no GPU limit is added: that would change the pod's QoS class


def test_increases_must_fit_on_the_node() -> None:
    # node cpu 10: three pods of 3 cpu (plus a 100m sidecar each) leave 0.7 cpu; growing each to 3.5 fits once
    pods = [running_pod(f"j-a-{k}", "n1", {"nvidia.com/gpu": "1", "cpu": "3"}) for k in range(3)]
    plan = plan_of([node("n1", cpu="10")], pods, [job(3, "3500m")])
    assert [p.action for p in plan.pods] == ["resize", "keep", "keep"]
    assert plan.pods[0].requests["cpu"] == "3500m"
    blocked = conditions(plan)["ResizeBlocked"]
    assert blocked.reason == "NoRoomOnNode" and "j-a-1" in blocked.message and "j-a-2" in blocked.message
    assert "lacks cpu" in blocked.message
    assert any(e.reason == "ResizeBlocked" and e.type == "Warning" for e in plan.events)
    # shrinking always fits
    plan = plan_of([node("n1", cpu="10")], pods, [job(3, "1")])
    assert [p.action for p in plan.pods] == ["resize"] * 3


def test_a_resized_increase_leaves_less_room_for_new_pods() -> None:
    # one node with 4 GPUs and 8 cpu; one pod of 2 cpu (+100m sidecar) runs. The job grows to two replicas of 4 cpu:
    # the running pod's resize takes 2 of the 5.9 free cpu first, so the new replica (4 cpu) no longer fits (the fair
    # policy places on every resource); without the resize it would (5.9 >= 4)
    pods = [running_pod("j-a-0", "n1", {"nvidia.com/gpu": "1", "cpu": "2"})]
    before = plan_of([node("n1", cpu="8")], pods, [job(2, "2")], policy="fair")
    assert sorted((p.action, p.node) for p in before.pods) == [("create", "n1"), ("keep", "n1")]
    after = plan_of([node("n1", cpu="8")], pods, [job(2, "4")], policy="fair")
    assert [(p.name, p.action, p.node) for p in after.pods] == [("j-a-0", "resize", "n1")]
    assert conditions(after)["ReplicasPlaceable"].status == "False"


def test_a_gpu_change_cannot_happen_in_place_and_waits_for_the_next_pod() -> None:
    pods = [running_pod("j-a-0", "n1", {"nvidia.com/gpu": "1", "cpu": "2"})]
    plan = plan_of([node("n1")], pods, [job(1, "2", demand=2)])  # demand per replica 1 -> 2 GPUs
    (pod,) = plan.pods
    assert pod.action == "keep"
    deferred = conditions(plan)["ResizeDeferred"]
    assert deferred.reason == "NotResizableInPlace"
    assert "nvidia.com/gpu 1 -> 2" in deferred.message and "next pod" in deferred.message
    assert any(e.reason == "ResizeDeferred" for e in plan.events)
    # cpu and GPU change together: the cpu part is resized, the GPU part waits
    plan = plan_of([node("n1")], pods, [job(1, "3", demand=2)])
    (pod,) = plan.pods
    assert pod.action == "resize" and pod.reason == "cpu 2 -> 3"
    assert pod.requests == {"cpu": "3", "nvidia.com/gpu": "1"}
    assert "ResizeDeferred" in conditions(plan)


def test_the_utility_policy_keeps_the_amount_aa_gave_a_pod() -> None:
    # AA decides a pod's amount of the priced resource (here 3 GPUs for a demand of 1): no resize for it
    pods = [running_pod("j-a-0", "n1", {"nvidia.com/gpu": "3", "cpu": "2"})]
    plan = plan_of([node("n1")], pods, [job(1, "2")], policy="utility")
    (pod,) = plan.pods
    assert pod.action == "keep" and "ResizeDeferred" not in conditions(plan)


def test_a_resource_the_pod_does_not_request_is_not_added_in_place() -> None:
    pods = [running_pod("j-a-0", "n1", {"nvidia.com/gpu": "1"})]  # no cpu request on the first container
    plan = plan_of([node("n1")], pods, [job(1, "2")])
    (pod,) = plan.pods
    assert pod.action == "keep"
    # not silent: the job says the new resource waits for the next pod
    deferred = conditions(plan)["ResizeDeferred"]
    assert deferred.reason == "NotResizableInPlace" and "cpu not requested -> 2" in deferred.message


def test_resize_plans_are_deterministic() -> None:
    pods = [running_pod(f"j-a-{k}", "n1", {"nvidia.com/gpu": "1", "cpu": "3"}) for k in range(3)]
    first = plan_of([node("n1", cpu="10")], pods, [job(3, "3500m")])
    again = plan_of([node("n1", cpu="10")], pods, [job(3, "3500m")])
    assert [p.to_dict() for p in first.pods] == [p.to_dict() for p in again.pods]
