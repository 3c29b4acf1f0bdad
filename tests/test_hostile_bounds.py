"""Issue 30 item 7: no object can stop the others.

Every number a user writes is bounded where it enters (the CRDs and :mod:`walras.planner.spec`, the same numbers),
a fractional amount of a whole-unit resource is refused, a pool whose nodes lack a resource the job's pods request is
unusable for it (direct mode would otherwise bind a pod the kubelet refuses), status patches never carry a
non-finite number or an over-long message, and a property test feeds generated hostile objects to ``walras plan``
next to the example cluster: the healthy jobs' plan is unchanged and no traceback appears.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from walras.cli import main
from walras.kube.decode import cluster_from, job_from
from walras.kube.encode import MAX_MESSAGE, sanitised, status_patch
from walras.manifests import examples
from walras.planner import build_plan
from walras.planner.model import Snapshot
from walras.planner.spec import (
    MAX_DEMAND,
    MAX_POOLS_PER_JOB,
    MAX_REPLICAS,
    MAX_RESOURCES,
    MAX_THROUGHPUT,
    MAX_WEIGHT,
    MIN_DEMAND,
    MIN_WEIGHT,
    integral_resource,
    parse_job,
)

ROOT = Path(__file__).resolve().parents[1]
CONTAINER = {"name": "c", "image": "busybox"}


def crd_spec(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "crds" / f"{name}.walras.dev.yaml").read_text())
    spec: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def job(**spec: Any) -> dict[str, Any]:
    body = {"throughput": {"v100": 1.0}, "template": {"spec": {"containers": [CONTAINER]}}, **spec}
    return {"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob",
            "metadata": {"name": "j", "namespace": "evil", "uid": "u-j", "resourceVersion": "1"}, "spec": body}


# --- the CRDs and the decoder carry the same bounds -----------------------------------------------------------------


def test_the_crd_bounds_are_the_decoders() -> None:
    props = crd_spec("fungiblejobs")["properties"]
    assert props["weight"]["maximum"] == MAX_WEIGHT
    assert props["utility"]["properties"]["weight"]["maximum"] == MAX_WEIGHT
    assert props["weight"]["x-kubernetes-validations"][0]["rule"] == f"self >= {MIN_WEIGHT:.6f}"
    assert props["demand"]["maximum"] == MAX_DEMAND
    assert props["demand"]["x-kubernetes-validations"][0]["rule"] == f"self >= {MIN_DEMAND}"
    assert props["throughput"]["maxProperties"] == MAX_POOLS_PER_JOB
    assert props["throughput"]["additionalProperties"]["maximum"] == MAX_THROUGHPUT
    assert props["resources"]["maxProperties"] == MAX_RESOURCES
    for key in ("count", "min", "max"):
        assert props["replicas"]["properties"][key]["maximum"] == MAX_REPLICAS
    assert props["backoffLimit"]["maximum"] == MAX_REPLICAS


@pytest.mark.parametrize(("spec", "error"), [
    ({"weight": 1e308}, "spec.weight must be at most 1e+06"),
    ({"weight": float("nan")}, "spec.weight must be a finite number"),
    ({"weight": 0}, "spec.weight must be >= 1e-06"),
    ({"utility": {"type": "log", "weight": 1e308}}, "spec.utility.weight must be at most"),
    ({"throughput": {"v100": 1e308}}, "spec.throughput['v100'] must be at most 1e+09"),
    ({"throughput": {"v100": float("inf")}}, "spec.throughput['v100'] must be a finite number"),
    ({"throughput": {"v100": 10**400}}, "spec.throughput['v100'] must be a finite number, got an integer of 401"),
    ({"throughput": {"v100": 1e-300}}, "spec.throughput['v100'] must be 0 or at least 1e-09"),
    ({"throughput": {f"p{k}": 1.0 for k in range(10_000)}}, "spec.throughput has 10000 entries; at most 64"),
    ({"demand": 1e308}, "spec.demand must be at most 1e+06"),
    ({"demand": float("nan")}, "spec.demand must be a finite number"),
    ({"replicas": {"count": 10**30}}, "spec.replicas.count must be at most 10000"),
    ({"replicas": {"min": 1, "max": 10**5}}, "spec.replicas.max must be at most 10000"),
    ({"resources": {"nvidia.com/gpu": "0.5"}}, "spec.resources['nvidia.com/gpu'] is '0.5', but nvidia.com/gpu is an "
                                               "extended resource"),
    ({"resources": {"memory": "1e30"}}, "spec.resources['memory'] must be at most 1Ei"),
    ({"resources": {f"r{k}": "1" for k in range(40)}}, "spec.resources has 40 entries; at most 32"),
    ({"throughputUnit": "x" * 100}, "spec.throughputUnit must be a string of at most 32 characters"),
    ({"backoffLimit": 10**12}, "spec.backoffLimit must be at most 10000"),
    ({"migration": {"cooldownSeconds": 10**12}}, "spec.migration.cooldownSeconds must be at most 31536000"),
    ({"utilityCurve": {"points": [{"amount": k, "value": k} for k in range(100)]}}, "at most 64 are allowed"),
])
def test_out_of_bound_numbers_make_the_job_invalid_naming_the_field(spec: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_job(job(**spec))
    assert error in str(refused.value)
    decoded = job_from(job(**spec))  # objects created before the CRD bounds: an invalid job, no exception
    assert decoded.spec is None and decoded.error is not None and error in decoded.error
    assert len(decoded.error) < 400  # a 10,000-entry map is not echoed back


def test_in_bound_extremes_are_accepted() -> None:
    spec = parse_job(job(weight=MAX_WEIGHT, demand=MAX_DEMAND, throughput={"v100": MAX_THROUGHPUT, "k80": 0},
                         resources={"nvidia.com/gpu": 2, "example.com/fpga": "1k", "cpu": "0.5"},
                         replicas={"count": MAX_REPLICAS}))
    assert spec.weight == MAX_WEIGHT and spec.replicas == MAX_REPLICAS
    assert spec.resources["example.com/fpga"] == 1000.0


@pytest.mark.parametrize(("name", "integral"), [
    ("nvidia.com/gpu", True), ("example.com/fpga", True), ("cpu", False), ("memory", False),
    ("ephemeral-storage", False), ("hugepages-2Mi", False), ("kubernetes.io/batch-cpu", False),
    ("requests.nvidia.com/gpu", False),
])
def test_integral_resources_are_kubernetes_extended_resources(name: str, integral: bool) -> None:
    assert integral_resource(name) is integral


# --- the objects phase: pools a job can never use -------------------------------------------------------------------


def example_snapshot(*extra: dict[str, Any]) -> Snapshot:
    from walras.kube.snapshot import snapshot_from

    docs = [*examples.documents(), *extra]
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    return snapshot_from(by_kind.get("Node", []), by_kind.get("Pod", []), by_kind.get("ResourcePool", []),
                         by_kind.get("FungibleJob", []), by_kind.get("ColocationProfile", []))


def planned(*extra: dict[str, Any]) -> Any:
    return build_plan(cluster_from(example_snapshot(*extra)))


def conditions(plan: Any, key: tuple[str, str]) -> dict[str, Any]:
    return {c.type: c for c in plan.jobs[key].conditions}


def test_a_fractional_demand_of_a_gpu_pool_is_refused_with_a_clear_condition() -> None:
    plan = planned(job(demand=0.5, throughput={"v100": 1.0, "k80": 1.0}))
    found = conditions(plan, ("evil", "j"))
    assert found["PoolsValid"].status == "False"
    assert "spec.demand 0.5 is not a whole number, but nvidia.com/gpu is an extended resource" in \
        found["PoolsValid"].message
    assert plan.jobs[("evil", "j")].phase == "Unschedulable"
    assert not [p for p in plan.pods if p.job == "j" and p.namespace == "evil"]


def test_a_pod_requesting_a_resource_no_node_has_is_never_placed() -> None:
    plan = planned(job(resources={"example.com/unobtainium": "1"}))
    found = conditions(plan, ("evil", "j"))
    assert "no node of the pool offers example.com/unobtainium" in found["PoolsValid"].message
    assert found["Schedulable"].status == "False"
    assert not [p for p in plan.pods if p.job == "j" and p.namespace == "evil"]


# --- status patches -------------------------------------------------------------------------------------------------


def test_status_patches_carry_no_non_finite_number_and_cut_long_messages() -> None:
    desired = {"throughput": float("inf"), "cost": float("nan"), "pricedCost": 2.5, "allocation": {"a": float("-inf"),
                                                                                                   "b": 0.5},
               "conditions": [{"type": "PoolsValid", "status": "False", "reason": "PoolUnusable",
                               "message": "x" * 500_000}], "node": None}
    patch = status_patch({}, desired)
    assert patch is not None
    text = json.dumps(patch, allow_nan=False)  # raises on NaN or Infinity
    body = patch["status"]
    assert "throughput" not in body and "cost" not in body and body["pricedCost"] == 2.5
    assert body["allocation"] == {"b": 0.5} and body["node"] is None
    message = body["conditions"][0]["message"]
    assert len(message) <= MAX_MESSAGE
    cut = 500_000 - message.index(" ... (")
    assert message.endswith(f" ... ({cut} characters cut)")
    assert len(text) < 40_000
    assert sanitised("short") == "short"


# --- the property: hostile objects next to a healthy cluster --------------------------------------------------------

NASTY_NUMBERS = [float("inf"), float("-inf"), float("nan"), 1e308, -1.0, 1e-300, 10**400, 1e10, 0]


def hostile_job(index: int, parts: list[tuple[str, Any]]) -> dict[str, Any]:
    """A FungibleJob in namespace ``evil`` that no pool may run: every part alone makes it invalid or unusable."""
    body = job()
    body["metadata"] = {"name": f"hostile-{index}", "namespace": "evil"}
    spec = body["spec"]
    spec["throughput"] = {"v100": 1.0, "k80": 2.0}
    for kind, value in parts:
        if kind == "throughput":
            spec["throughput"]["v100"] = value
        elif kind == "weight":
            spec["weight"] = value
        elif kind == "utility-weight":
            spec["utility"] = {"type": "log", "weight": value}
        elif kind == "demand":
            spec["demand"] = value
        elif kind == "fraction":  # a fractional GPU demand; every listed pool prices nvidia.com/gpu
            spec["demand"] = value
        elif kind == "replicas":
            spec["replicas"] = {"count": value}
        elif kind == "pools":
            spec["throughput"] = {f"pool-{k}": 1.0 for k in range(value)}
        elif kind == "unknown":
            spec["resources"] = {value: "1"}
        elif kind == "host":
            spec["template"] = {"spec": {**value, "containers": [CONTAINER]}}
    return body


PART = st.one_of(
    st.tuples(st.just("throughput"), st.sampled_from([v for v in NASTY_NUMBERS if v != 0])),
    st.tuples(st.just("weight"), st.sampled_from(NASTY_NUMBERS)),
    st.tuples(st.just("utility-weight"), st.sampled_from(NASTY_NUMBERS)),
    st.tuples(st.just("demand"), st.sampled_from(NASTY_NUMBERS)),
    st.tuples(st.just("fraction"), st.sampled_from([0.5, 1.5, 2.25])),
    st.tuples(st.just("replicas"), st.sampled_from([10**30, -1, 10**5])),
    st.tuples(st.just("pools"), st.integers(65, 3000)),
    st.tuples(st.just("unknown"), st.sampled_from(["example.com/unobtainium", "vendor.io/quantum", "nvidia.com/mig"])),
    st.tuples(st.just("host"), st.sampled_from([{"hostPID": True}, {"hostNetwork": True},
                                                {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}])),
)


def hostile_pool(value: Any) -> dict[str, Any]:
    return {"apiVersion": "walras.dev/v1alpha1", "kind": "ResourcePool", "metadata": {"name": "zz-hostile"},
            "spec": {"nodeSelector": {"hostile": "none"}, "resource": "nvidia.com/gpu", "capacity": value,
                     "policy": {"type": "throughput"}}}


def healthy_view(document: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """The example jobs' entries and pods of a ``walras plan -o json`` document."""
    jobs = sorted((j for j in document["jobs"] if j["namespace"] != "evil"), key=lambda j: (j["namespace"], j["name"]))
    pods = sorted((p for p in document["pods"] if p["namespace"] != "evil"), key=lambda p: (p["namespace"], p["name"]))
    return jobs, pods


def run_plan(*args: str) -> tuple[int, str, str]:
    """``walras plan ARGS`` in this process: its exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", *args])
    return code, out.getvalue(), err.getvalue()


#: The example cluster's file and its healthy plan (the example jobs' entries and pods), computed once.
BASELINE: dict[str, Any] = {}


@settings(max_examples=25)
@given(jobs=st.lists(st.lists(PART, min_size=1, max_size=3), min_size=1, max_size=3),
       pool=st.one_of(st.none(), st.sampled_from([float("inf"), 1e308, -5.0])))
def test_hostile_objects_leave_the_healthy_plan_unchanged(jobs: list[list[tuple[str, Any]]], pool: Any,
                                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = tmp_path_factory.mktemp("hostile")
    if not BASELINE:
        BASELINE["cluster"] = cluster = tmp_path_factory.mktemp("healthy") / "cluster.yaml"
        cluster.write_text(yaml.safe_dump_all(examples.documents()))
        code, out, err = run_plan("-f", str(cluster), "-o", "json")
        assert code == 0, err
        BASELINE["plan"] = healthy_view(json.loads(out))
    cluster, expected = BASELINE["cluster"], BASELINE["plan"]
    objects = [hostile_job(k, parts) for k, parts in enumerate(jobs)]
    if pool is not None:
        objects.append(hostile_pool(pool))
    bad = folder / "hostile.yaml"
    bad.write_text(yaml.safe_dump_all(copy.deepcopy(objects)))
    # objects created before the bounds (or with --no-validate): planned next to the others, each flagged
    code, out, err = run_plan("-f", str(cluster), "-f", str(bad), "-o", "json", "--no-validate")
    assert code == 0, err
    assert "Traceback" not in out + err
    document = json.loads(out)
    assert healthy_view(document) == expected
    flagged = {j["name"]: j for j in document["jobs"] if j["namespace"] == "evil"}
    assert set(flagged) == {o["metadata"]["name"] for o in objects if o["kind"] == "FungibleJob"}
    for entry in flagged.values():
        assert entry["phase"] in ("Invalid", "Unschedulable"), entry
        assert entry["placedReplicas"] == 0
        assert any(c["status"] == "False" for c in entry["conditions"])
    json.dumps(document, allow_nan=False)
    # the same objects validated as the API server would: refused with one clear line, or planned the same way
    code, out, err = run_plan("-f", str(cluster), "-f", str(bad), "-o", "json")
    assert "Traceback" not in out + err
    if code == 0:
        assert healthy_view(json.loads(out)) == expected
    else:
        assert code == 2 and err.startswith("walras plan: error: ") and len(err.splitlines()) == 1
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in _numbers(document))


def _numbers(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [n for item in value.values() for n in _numbers(item)]
    if isinstance(value, list):
        return [n for item in value for n in _numbers(item)]
    return [value]


# --- the pod policy: host access only where the platform team allows it ---------------------------------------------


@pytest.mark.parametrize(("template", "asked"), [
    ({"hostPID": True}, "hostPID"),
    ({"hostNetwork": True, "hostIPC": True}, "hostIPC, hostNetwork"),
    ({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, "hostPath"),
    ({"containers": [{"name": "c", "securityContext": {"privileged": True}}]}, "privileged"),
    ({"initContainers": [{"name": "i", "ports": [{"containerPort": 80, "hostPort": 80}]}]}, "hostPort"),
    ({"serviceAccountName": "cluster-admin-sa"}, "serviceAccountName"),
])
def test_a_template_asking_for_host_access_is_refused_unless_the_pool_allows_its_namespace(
        template: dict[str, Any], asked: str) -> None:
    body = job(throughput={"v100": 1.0})
    body["spec"]["template"] = {"spec": {"containers": [CONTAINER], **template}}
    plan = planned(body)
    found = conditions(plan, ("evil", "j"))
    assert found["PoolsValid"].status == "False"
    assert f"the pod template asks for {asked}, which the pod policy refuses" in found["PoolsValid"].message
    assert "spec.podPolicy.allowHostAccess" in found["PoolsValid"].message
    assert found["Schedulable"].status == "False"
    assert not [p for p in plan.pods if p.namespace == "evil"]
    # the platform team allows it for namespace evil in pool v100: the job is planned there
    pools = [d for d in examples.documents() if d["kind"] == "ResourcePool"]
    v100 = copy.deepcopy(next(d for d in pools if d["metadata"]["name"] == "v100"))
    v100["spec"]["podPolicy"] = {"allowHostAccess": ["evil"]}
    docs = [d for d in examples.documents() if not (d["kind"] == "ResourcePool" and d["metadata"]["name"] == "v100")]
    from walras.kube.snapshot import snapshot_from

    kinds = {k: [d for d in [*docs, v100, body] if d["kind"] == k] for k in
             ("Node", "Pod", "ResourcePool", "FungibleJob", "ColocationProfile")}
    allowed = build_plan(cluster_from(snapshot_from(kinds["Node"], kinds["Pod"], kinds["ResourcePool"],
                                                    kinds["FungibleJob"], kinds["ColocationProfile"])))
    assert conditions(allowed, ("evil", "j"))["PoolsValid"].status == "True"
    assert [p for p in allowed.pods if p.namespace == "evil"]


def test_a_plain_template_is_not_host_access() -> None:
    from walras.planner.spec import host_access

    assert host_access({"spec": {"containers": [{"name": "c", "securityContext": {"privileged": False}}],
                                 "serviceAccountName": "default", "hostNetwork": False}}) == ()


def test_a_status_too_large_for_the_api_server_is_cut_with_a_count() -> None:
    from walras.kube.encode import MAX_STATUS_BYTES

    pods = [{"name": f"job-pool-{k}", "pool": "pool", "node": f"node-{k % 500}", "requests": {"cpu": "1"},
             "limits": {"cpu": "1"}} for k in range(20_000)]
    desired = {"phase": "Running", "pods": pods, "conditions": [{"type": "Valid", "status": "True"}]}
    patch = status_patch({}, desired)
    assert patch is not None
    body = patch["status"]
    assert len(json.dumps(body, separators=(",", ":"))) <= MAX_STATUS_BYTES
    kept = len(body["pods"])
    assert 0 < kept < 20_000 and body["pods"] == pods[:kept]
    note = body["conditions"][-1]
    assert note["type"] == "StatusTruncated"
    assert note["message"].startswith(f"status.pods lists {kept} of 20000 pods ({20_000 - kept} left out")
    small = {"phase": "Running", "pods": pods[:10], "conditions": []}
    assert status_patch({}, small) == {"status": small}
