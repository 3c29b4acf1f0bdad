"""The admission phase (walras.planner.quota, docs/refusals.md): ResourceQuotas cap a namespace's Walras replicas so
their requests stay within the quota (the job told why, ``QuotaLimited``), and a job whose pods the API server
refused holds no capacity for its unplaced replicas until the operator's backoff ends (``AdmissionRefused``); the
capacity goes to other namespaces' jobs. Every plan is checked with the shared invariants."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from walras.kube.decode import cluster_from, quota_from
from walras.planner import Snapshot
from walras.planner.cluster import Quota, Refusal
from walras.planner.invariants import check_plan
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL, REASONS, Plan
from walras.planner.plan import PlanOptions
from walras.planner.quota import quota_room

from tests.planning import build_plan
from tests.test_lifecycle_planner import NOW, node, pool


def job(name: str, namespace: str, count: int, weight: float = 1.0) -> dict[str, Any]:
    return {"kind": "FungibleJob", "metadata": {"name": name, "namespace": namespace, "generation": 1},
            "spec": {"throughput": {"a": 1.0}, "utility": {"type": "linear", "weight": weight},
                     "replicas": {"count": count}, "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}


def pod(name: str, owner: str | None, namespace: str, node_name: str | None, gpus: str = "1") -> dict[str, Any]:
    labels = {LABEL_JOB: owner, LABEL_POOL: "a", LABEL_MANAGED: "true"} if owner else {}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": gpus}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"kind": "Pod", "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels},
            "spec": spec, "status": {"phase": "Running" if node_name else "Pending"}}


def quota(namespace: str, hard: dict[str, str], name: str = "q", **extra: Any) -> dict[str, Any]:
    return {"kind": "ResourceQuota", "metadata": {"name": name, "namespace": namespace},
            "spec": {"hard": hard, **extra}, "status": {"hard": hard, "used": {}}}


def planned(plan: Plan, namespace: str, name: str) -> int:
    """Pods of the job the plan keeps or creates (on a node)."""
    return sum(1 for p in plan.pods if (p.namespace, p.job) == (namespace, name) and p.action in ("create", "keep")
               and p.node)


def plan_of(snap: Snapshot, **refused: Refusal) -> tuple[Plan, Any]:
    cluster = cluster_from(snap)
    if refused:
        cluster = dataclasses.replace(cluster, refused={("ml", k): v for k, v in refused.items()})
    plan = build_plan(cluster, options=PlanOptions(now=NOW))
    assert check_plan(cluster, plan) == []
    return plan, cluster


# --- decode ---------------------------------------------------------------------------------------------------------


def test_quota_decode_maps_request_keys_and_leaves_out_scoped_quotas_and_limits() -> None:
    got = quota_from(quota("ml", {"requests.nvidia.com/gpu": "4", "requests.cpu": "8", "cpu": "6",
                                  "requests.memory": "1Gi", "count/pods": "10", "pods": "12", "limits.cpu": "2",
                                  "services": "3"}))
    assert got == Quota("ml", "q", {"cpu": 6.0, "memory": 2.0 ** 30, "nvidia.com/gpu": 4.0, "pods": 10.0})
    assert quota_from(quota("ml", {"pods": "1"}, scopes=["BestEffort"])) is None
    assert quota_from(quota("ml", {"limits.memory": "1Gi"})) is None  # nothing the planner models
    assert quota_from({"kind": "ResourceQuota", "metadata": {}}) is None


def test_quota_room_is_hard_less_the_other_pods_of_the_namespace() -> None:
    snap = Snapshot(nodes=(node("a0"),), pools=(pool("a"),), jobs=(job("w", "ml", 2),),
                    pods=(pod("other", None, "ml", "a0", gpus="1"), pod("w-0", "w", "ml", "a0"),
                          pod("elsewhere", None, "prod", "a0", gpus="2")),
                    resourcequotas=(quota("ml", {"requests.nvidia.com/gpu": "4"}),
                                    quota("ml", {"requests.nvidia.com/gpu": "3"}, name="tight")))
    room = quota_room(cluster_from(snap))
    assert room == {"ml": ({"nvidia.com/gpu": 2.0}, {"nvidia.com/gpu": "tight"})}  # min(4, 3) - 1 (w-0 is a replica)


# --- the scenario: a 4-GPU quota must not leave 20 of 64 GPUs idle -------------------------------------------


def _sixty_four(quotas: tuple[dict[str, Any], ...]) -> Snapshot:
    nodes = tuple(node(f"a{k:02d}") for k in range(16))  # 16 x 4 = 64 GPUs
    return Snapshot(nodes=nodes, pools=(pool("a"),), jobs=(job("small", "team-a", 24, weight=3.0),
                                                           job("big", "team-b", 64)), resourcequotas=quotas)


def test_a_four_gpu_quota_leaves_no_gpu_idle_while_another_namespace_wants_them() -> None:
    plan, _ = plan_of(_sixty_four((quota("team-a", {"requests.nvidia.com/gpu": "4"}),)))
    # the quota admits 4 pods of small; big gets the other 60 GPUs (computed: 64 - 4)
    assert planned(plan, "team-a", "small") == 4
    assert planned(plan, "team-b", "big") == 60
    small = plan.jobs[("team-a", "small")]
    assert small.reason == "QuotaLimited" and small.count == 24
    condition = {c.type: c for c in small.conditions}["QuotaLimited"]
    assert condition.status == "True" and "team-a/q" in condition.message and "4 of 24" in condition.message
    assert small.blockers[0].replicas == 20
    assert "QuotaLimited" in REASONS and "AdmissionRefused" in REASONS
    # without the quota the market gives small more than the quota would admit: the cap is what changes it
    free, _ = plan_of(_sixty_four(()))
    assert planned(free, "team-a", "small") > 4


def test_a_quota_never_removes_a_live_pod_and_counts_it() -> None:
    pods = tuple(pod(f"small-{k}", "small", "team-a", f"a{k:02d}") for k in range(6))
    snap = dataclasses.replace(_sixty_four((quota("team-a", {"requests.nvidia.com/gpu": "4"}),)), pods=pods)
    plan, _ = plan_of(snap)
    small = [p for p in plan.pods if p.job == "small"]
    assert sorted(p.action for p in small) == ["keep"] * 6  # over the quota (lowered after they ran): kept
    assert planned(plan, "team-b", "big") == 58


def test_a_pods_quota_and_jobs_sharing_one_namespace_in_name_order() -> None:
    snap = Snapshot(nodes=tuple(node(f"a{k}") for k in range(4)), pools=(pool("a"),),
                    jobs=(job("j1", "ml", 3), job("j2", "ml", 3)),
                    pods=(pod("foreign", None, "ml", None, gpus="0"),),
                    resourcequotas=(quota("ml", {"count/pods": "5"}),))
    plan, _ = plan_of(snap)
    assert (planned(plan, "ml", "j1"), planned(plan, "ml", "j2")) == (3, 1)  # 5 - 1 foreign = 4: j1 first
    assert plan.jobs[("ml", "j2")].reason == "QuotaLimited"
    assert "QuotaLimited" not in {c.type for c in plan.jobs[("ml", "j1")].conditions}


# --- refusals --------------------------------------------------------------------------------------------------------


def _refusal_cluster() -> Snapshot:
    nodes = (node("a0"), node("a1"))  # 8 GPUs
    return Snapshot(nodes=nodes, pools=(pool("a"),), jobs=(job("x", "ml", 8, weight=5.0), job("y", "ml", 8)),
                    pods=(pod("x-0", "x", "ml", "a0"),))


def test_a_refused_job_holds_no_capacity_until_its_backoff_ends() -> None:
    refused = Refusal('pods "x-1" is forbidden: violates PodSecurity "restricted:latest"', pods=7, until=NOW + 10)
    plan, _ = plan_of(_refusal_cluster(), x=refused)
    assert planned(plan, "ml", "x") == 1  # its live pod only
    assert [p.name for p in plan.pods if p.job == "x" and p.action == "create"] == []
    assert planned(plan, "ml", "y") == 7  # the capacity x held goes to y
    x = plan.jobs[("ml", "x")]
    condition = {c.type: c for c in x.conditions}["AdmissionRefused"]
    assert condition.status == "True" and "refused 7 pod(s)" in condition.message and "PodSecurity" in condition.message
    assert x.reason == "AdmissionRefused" and x.blockers[0].replicas == 7
    # the backoff over: one more pod of x is asked for (slow start), where a node has free room for it
    later = dataclasses.replace(refused, until=NOW - 1)
    again, _ = plan_of(_refusal_cluster(), x=later)
    assert planned(again, "ml", "x") == 2
    assert "one pod asked again now" in {c.type: c for c in again.jobs[("ml", "x")].conditions}[
        "AdmissionRefused"].message
    # no refusal: x gets its whole share, and no condition
    clean, _ = plan_of(_refusal_cluster())
    assert planned(clean, "ml", "x") == 8
    assert "AdmissionRefused" not in {c.type for c in clean.jobs[("ml", "x")].conditions}


def test_a_retry_never_displaces_a_running_pod_of_another_job() -> None:
    # y took the room x's refused pods would have had: after the backoff, no node has room for x's next pod, so x
    # waits (nothing of y is evicted for a pod the API server may refuse again)
    full = dataclasses.replace(_refusal_cluster(), pods=(pod("x-0", "x", "ml", "a0"),
                                                         *(pod(f"y-{k}", "y", "ml", "a0" if k < 3 else "a1")
                                                           for k in range(7))))
    plan, _ = plan_of(full, x=Refusal("denied", pods=7, until=NOW - 1))
    assert [p.action for p in plan.pods if p.job == "y"] == ["keep"] * 7
    assert planned(plan, "ml", "x") == 1
    message = {c.type: c for c in plan.jobs[("ml", "x")].conditions}["AdmissionRefused"].message
    assert "once a node has room" in message


def test_a_refusal_of_a_job_that_is_gone_or_invalid_is_ignored() -> None:
    plan, _ = plan_of(_refusal_cluster(), gone=Refusal("no", until=NOW + 10))
    assert ("ml", "gone") not in plan.jobs and planned(plan, "ml", "x") > 1


def test_an_unchanged_cluster_with_a_refusal_plans_the_same_twice() -> None:
    refused = Refusal("exceeded quota", pods=2, until=NOW + 30)
    cluster = dataclasses.replace(cluster_from(_refusal_cluster()), refused={("ml", "x"): refused})
    first = build_plan(cluster, options=PlanOptions(now=NOW))
    second = build_plan(cluster, first, options=PlanOptions(now=NOW))
    assert [(p.name, p.action, p.node) for p in first.pods] == [(p.name, p.action, p.node) for p in second.pods]
    assert first.jobs[("ml", "x")].conditions == second.jobs[("ml", "x")].conditions


def test_walras_plan_reads_a_resourcequota_from_manifests(tmp_path: Any) -> None:
    """``walras plan -f`` (the manifests loader) puts ResourceQuotas into the snapshot: the offline plan caps the
    namespace as the operator's does."""
    import json

    from walras.manifests import load_manifests

    docs = [node("a0"), node("a1"), pool("a"), job("small", "team-a", 6), job("big", "team-b", 8),
            quota("team-a", {"requests.nvidia.com/gpu": "2"})]
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    snap = load_manifests(path, validate=False)
    assert [q["metadata"]["name"] for q in snap.resourcequotas] == ["q"]
    plan, _ = plan_of(snap)
    assert (planned(plan, "team-a", "small"), planned(plan, "team-b", "big")) == (2, 6)


# --- a property: new pods never take a namespace over its quota -------------------------------------------------------


@st.composite
def quota_clusters(draw: st.DrawFn) -> Snapshot:
    nodes = tuple(node(f"a{k}") for k in range(draw(st.integers(1, 3))))  # 4 GPUs each
    names = [f"ns{k}" for k in range(draw(st.integers(1, 3)))]
    jobs, pods, quotas = [], [], []
    slots = iter([f"a{k % len(nodes)}" for k in range(4 * len(nodes))])  # bound pods never over-commit a node
    for ns in names:
        if draw(st.booleans()):
            key = draw(st.sampled_from(["requests.nvidia.com/gpu", "count/pods", "pods"]))
            quotas.append(quota(ns, {key: str(draw(st.integers(0, 6)))}))
        for j in range(draw(st.integers(1, 2))):
            name = f"j{j}"
            jobs.append(job(name, ns, draw(st.integers(1, 6)), weight=draw(st.sampled_from([1.0, 3.0]))))
            for k in range(draw(st.integers(0, 2))):
                where = next(slots, None)
                if where is not None:
                    pods.append(pod(f"{name}-{ns}-{k}", name, ns, where))
        for k in range(draw(st.integers(0, 1))):
            where = next(slots, None)
            if where is not None:
                pods.append(pod(f"other-{ns}-{k}", None, ns, where))
    return Snapshot(nodes=nodes, pools=(pool("a"),), jobs=tuple(jobs), pods=tuple(pods),
                    resourcequotas=tuple(quotas))


@settings(max_examples=40, deadline=None)
@given(quota_clusters())
def test_new_pods_never_take_a_namespace_over_its_quota(snap: Snapshot) -> None:
    plan, cluster = plan_of(snap)
    for q in cluster.quotas:
        ((resource, hard),) = q.hard.items()
        used = sum(p.requests.get(resource, 0.0) for p in cluster.pods if p.namespace == q.namespace)
        new = [p for p in plan.pods if p.namespace == q.namespace and p.action == "create"]
        per_pod = 1.0  # every pod here requests one GPU and one pod slot
        if new:
            assert used + per_pod * len(new) <= hard + 1e-9, (q, used, [p.name for p in new])
