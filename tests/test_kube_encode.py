"""walras.kube.encode: pods built from a job's template parsed once equal the manifests the operator built before
(a deep copy of the raw template re-read per pod, kept below as the reference) for every FungibleJob of
``examples/`` and for plans of the planner; the parsed template is read-only and cached by uid and
resourceVersion; the status bodies and the plan document."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from walras.kube.encode import (
    FrozenDict,
    TemplateCache,
    build_pod,
    job_status,
    parse_template,
    plan_document,
    pod_manifest,
    pool_status,
    thaw,
    with_resize_pending,
)
from walras.planner import Snapshot
from walras.planner.model import ANNOTATION_NODE, API_VERSION, LABEL_JOB, LABEL_MANAGED, LABEL_POOL, PodPlan

from tests.planning import build_plan

ROOT = Path(__file__).resolve().parents[1]
NODES = ROOT / "operator" / "walras" / "data" / "emulated-nodes.yaml"


def reference_manifest(job: Mapping[str, Any], pod: PodPlan, scheduler_name: str) -> dict[str, Any]:
    """The operator's pod manifest as built before the template was parsed once (a deep copy per pod)."""
    template = copy.deepcopy((job.get("spec") or {}).get("template") or {})
    job_meta = job.get("metadata") or {}
    if not job_meta.get("uid"):
        raise ValueError(f"FungibleJob {pod.namespace}/{pod.job} has no metadata.uid; cannot own pod {pod.name}")
    meta = template.get("metadata") or {}
    spec = template.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        raise ValueError(f"FungibleJob {pod.namespace}/{pod.job}: spec.template.spec.containers is empty")
    labels = dict(meta.get("labels") or {})
    labels.update({LABEL_JOB: pod.job, LABEL_POOL: pod.pool, LABEL_MANAGED: "true"})
    annotations = dict(meta.get("annotations") or {})
    if pod.node:
        annotations[ANNOTATION_NODE] = pod.node
    resources = dict(containers[0].get("resources") or {})
    if pod.requests:
        resources["requests"] = {**(resources.get("requests") or {}), **pod.requests}
    if pod.limits:
        resources["limits"] = {**(resources.get("limits") or {}), **pod.limits}
    containers[0]["resources"] = resources
    spec["containers"] = containers
    spec["schedulerName"] = scheduler_name
    spec.pop("nodeName", None)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "labels": labels, "annotations": annotations,
                     "ownerReferences": [{"apiVersion": API_VERSION, "kind": "FungibleJob", "name": pod.job,
                                          "uid": job_meta["uid"], "controller": True, "blockOwnerDeletion": True}]},
        "spec": spec,
    }


def example_documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    return docs


def example_jobs() -> list[dict[str, Any]]:
    jobs = []
    for i, doc in enumerate(d for d in example_documents() if d.get("kind") == "FungibleJob"):
        doc["metadata"].setdefault("namespace", "default")
        doc["metadata"].update(uid=f"job-uid-{i}", resourceVersion="1")
        jobs.append(doc)
    return jobs


def variants(job: Mapping[str, Any]) -> list[PodPlan]:
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    text = {str(k): str(v) for k, v in (job["spec"].get("resources") or {}).items()}
    return [
        PodPlan(ns, f"{name}-0", name, "a100", "node-1", text, text),
        PodPlan(ns, f"{name}-1", name, "v100", None),
        PodPlan(ns, f"{name}-2", name, "cpu", "node-2", {"cpu": "2", "memory": "4Gi"}, {}),
        PodPlan(ns, f"{name}-3", name, "cpu", "node-3", {}, {"memory": "8Gi"}),
    ]


def test_the_examples_have_jobs_with_templates() -> None:
    jobs = example_jobs()
    assert len(jobs) >= 5
    assert all(job["spec"]["template"]["spec"]["containers"] for job in jobs)


@pytest.mark.parametrize("job", example_jobs(), ids=lambda j: j["metadata"]["name"])
def test_a_pod_built_from_the_parsed_template_is_the_manifest_built_before(job: dict[str, Any]) -> None:
    before = copy.deepcopy(job)
    template = parse_template(job)
    for pp in variants(job):
        want = reference_manifest(job, pp, "walras-scheduler")
        got = build_pod(template, pp, "walras-scheduler")
        assert got == want
        assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
        assert pod_manifest(job, pp, "walras-scheduler") == want
    assert job == before, "building pods never changes the job"


def test_pods_of_a_plan_of_the_examples_are_the_manifests_built_before() -> None:
    docs = example_documents() + [d for d in yaml.safe_load_all(NODES.read_text()) if isinstance(d, dict)]
    jobs = example_jobs()
    snapshot = Snapshot(nodes=tuple(d for d in docs if d.get("kind") == "Node"),
                        pools=tuple(d for d in docs if d.get("kind") == "ResourcePool"), jobs=tuple(jobs))
    plan = build_plan(snapshot)
    by_key = {(j["metadata"]["namespace"], j["metadata"]["name"]): j for j in jobs}
    cache = TemplateCache()
    created = [pp for pp in plan.pods if pp.action == "create"]
    assert len(created) >= 5 and any(pp.requests for pp in created)
    for pp in created:
        job = by_key[(pp.namespace, pp.job)]
        assert build_pod(cache.template(job), pp, "s") == reference_manifest(job, pp, "s")
    assert cache.parses == len({(pp.namespace, pp.job) for pp in created}), "one parse per job"


def test_the_errors_of_a_template_that_cannot_make_a_pod_are_the_ones_before() -> None:
    pp = PodPlan("ns", "j-0", "j", "p", None)
    no_uid = {"metadata": {"name": "j"}, "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}
    empty = {"metadata": {"name": "j", "uid": "u"}, "spec": {"template": {"spec": {"containers": []}}}}
    for job in (no_uid, empty):
        with pytest.raises(ValueError) as want:
            reference_manifest(job, pp, "s")
        with pytest.raises(ValueError) as got:
            build_pod(parse_template(job), pp, "s")
        assert str(got.value) == str(want.value)
    garbage = {"metadata": {"name": "j", "uid": "u"}, "spec": {"template": {"spec": {"containers": ["main"]}}}}
    with pytest.raises(ValueError, match=r"containers\[0\] is not an object"):
        build_pod(parse_template(garbage), pp, "s")


def test_the_parsed_template_is_read_only_and_shared_only_where_unchanged() -> None:
    job = example_jobs()[0]
    job["spec"]["template"]["spec"]["containers"].append({"name": "sidecar", "image": "x", "env": [{"name": "A"}]})
    job["spec"]["template"]["spec"]["nodeName"] = "pinned"
    template = parse_template(job)
    with pytest.raises(TypeError):
        template.spec["hostNetwork"] = True  # type: ignore[index]
    with pytest.raises(TypeError):
        template.spec["containers"].append({})
    with pytest.raises(TypeError):
        template.first.update(image="other")
    a = build_pod(template, PodPlan("default", "a", "j", "p", "n1", {"cpu": "1"}), "s")
    b = build_pod(template, PodPlan("default", "b", "j", "p", "n2", {"cpu": "2"}), "s")
    assert "nodeName" not in a["spec"]
    assert a["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"
    assert b["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2"
    a["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "9"  # what the manifest changes is its own
    a["metadata"]["labels"]["x"] = "y"
    assert b["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2" and "x" not in b["metadata"]["labels"]
    assert a["spec"]["containers"][1] is b["spec"]["containers"][1], "an unchanged container is shared"
    with pytest.raises(TypeError):
        a["spec"]["containers"][1]["image"] = "changed"
    plain = thaw(a)
    assert plain == a and type(plain["spec"]["containers"][1]) is dict
    assert type(copy.deepcopy(a)["spec"]["containers"][1]) is dict
    assert pickle.loads(pickle.dumps(a)) == a
    assert isinstance(a["spec"]["containers"][1], FrozenDict)
    yaml.safe_dump(pod_manifest(job, PodPlan("default", "c", "j", "p", None), "s"))  # plain JSON: any dumper


def test_the_template_cache_parses_once_per_uid_and_resource_version() -> None:
    job = example_jobs()[0]
    cache = TemplateCache(size=2)
    first = cache.template(job)
    assert cache.template(job) is first and cache.parses == 1
    job["metadata"]["resourceVersion"] = "2"
    assert cache.template(job) is not first and cache.parses == 2
    unversioned = {**job, "metadata": {"name": "x", "uid": "u"}}
    cache.template(unversioned)
    cache.template(unversioned)
    assert cache.parses == 4, "an object without a resourceVersion is parsed every time"
    for rv in ("3", "4", "5"):
        job["metadata"]["resourceVersion"] = rv
        cache.template(job)
    assert len(cache._parsed) == 2


def test_status_bodies_and_the_plan_document() -> None:
    docs = example_documents() + [d for d in yaml.safe_load_all(NODES.read_text()) if isinstance(d, dict)]
    jobs = example_jobs()
    snapshot = Snapshot(nodes=tuple(d for d in docs if d.get("kind") == "Node"),
                        pools=tuple(d for d in docs if d.get("kind") == "ResourcePool"), jobs=tuple(jobs))
    plan = build_plan(snapshot)
    document = plan_document(plan)
    assert set(document) == {"pools", "jobs", "pods", "profiles", "events", "solver", "seconds"}
    for name, pool in plan.pools.items():
        assert document["pools"][name] == {"resource": pool.resource, "policy": pool.policy, **pool_status(pool)}
        assert pool_status(pool)["priceText"] == f"{pool.price:.4g}"
    for job, body in zip(plan.jobs.values(), document["jobs"], strict=True):
        status = job_status(job)
        assert body == {"namespace": job.namespace, "name": job.name, **status}
        assert [p["name"] for p in status["pods"]] == [p.name for p in job.pods if p.action not in ("delete", "evict")]
        assert status["placedReplicas"] == sum(job.replicas.values())
        json.dumps(status, allow_nan=False)
        pending = with_resize_pending(status, "pod x waits")
        assert pending["conditions"][-1] == {"type": "ResizePending", "status": "True",
                                             "reason": "InPlaceResizeUnsupported", "message": "pod x waits"}
        assert with_resize_pending(status, None) is status and len(status["conditions"]) + 1 == len(
            pending["conditions"])
