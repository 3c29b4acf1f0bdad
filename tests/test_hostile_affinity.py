"""Issue 30 item 3: pods can only land where the plan allows. Every pod Walras creates carries a required node
affinity to its pool's nodes (``walras.kube.encode.build_pod`` with the pool's nodeSelector), ANDed into the template's
own required terms, so no scheduler path (kube-scheduler with ``managedResources`` that skips the extender, another
scheduler) can bind it outside its pool."""

from __future__ import annotations

from typing import Any

from walras.kube.encode import build_pod, parse_template, pool_node_selector
from walras.planner.cluster import Node, Requirement
from walras.planner.model import PodPlan

POOL = {"apiVersion": "walras.dev/v1alpha1", "kind": "ResourcePool", "metadata": {"name": "cpu"},
        "spec": {"nodeSelector": {"walras.dev/pool": "cpu", "zone": "a"}, "resource": "cpu",
                 "policy": {"type": "throughput"}}}


def fjob(template_spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u1", "resourceVersion": "3"},
            "spec": {"throughput": {"cpu": 1.0}, "template": {"spec": template_spec}}}


def plan_of(node: str | None) -> PodPlan:
    return PodPlan("ns", "j-cpu-0", "j", "cpu", node, {"cpu": "1"}, {"cpu": "1"}, "create", False)


def required_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    terms: list[dict[str, Any]] = (pod["spec"]["affinity"]["nodeAffinity"]
                                   ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"])
    return terms


def matches(terms: list[dict[str, Any]], labels: dict[str, str]) -> bool:
    """Whether a node with ``labels`` satisfies the required terms, as kube-scheduler's NodeAffinity reads them
    (terms ORed; each term's In expressions ANDed), written here independently of the encoder."""
    return any(all(labels.get(e["key"]) in e["values"] for e in term.get("matchExpressions", [])
                   if e["operator"] == "In")
               and all(e["key"] not in labels or labels[e["key"]] not in e["values"]
                       for e in term.get("matchExpressions", []) if e["operator"] == "NotIn")
               for term in terms)


def test_every_pod_is_bound_to_its_pools_nodes_bound_or_not() -> None:
    template = parse_template(fjob({"containers": [{"name": "c", "image": "x"}]}))
    for node in ("cpu-1", None):
        pod = build_pod(template, plan_of(node), "walras-scheduler", pool_node_selector(POOL))
        terms = required_terms(pod)
        assert terms == [{"matchExpressions": [{"key": "walras.dev/pool", "operator": "In", "values": ["cpu"]},
                                               {"key": "zone", "operator": "In", "values": ["a"]}]}]
        assert matches(terms, {"walras.dev/pool": "cpu", "zone": "a", "kubernetes.io/hostname": "cpu-1"})
        assert not matches(terms, {"walras.dev/accelerator": "v100", "zone": "a"})  # a GPU node outside the pool
        assert not matches(terms, {"walras.dev/pool": "cpu", "zone": "b"})


def test_the_templates_own_terms_are_kept_and_each_also_requires_the_pool() -> None:
    own = {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]},
        {"matchExpressions": [{"key": "arch", "operator": "NotIn", "values": ["arm64"]}]},
    ]}
    spec = {"containers": [{"name": "c"}], "affinity": {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": own,
                         "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {}}]},
        "podAntiAffinity": {"x": 1}}}
    job = fjob(spec)
    pod = build_pod(parse_template(job), plan_of("cpu-1"), "walras-scheduler", pool_node_selector(POOL))
    terms = required_terms(pod)
    assert len(terms) == 2
    pool = {"walras.dev/pool": "cpu", "zone": "a"}
    assert matches(terms, {**pool, "disk": "ssd"}) and matches(terms, {**pool, "arch": "amd64"})
    assert not matches(terms, {"disk": "ssd"})  # the template's term alone no longer suffices
    assert not matches(terms, {**pool, "arch": "arm64"})
    affinity = pod["spec"]["affinity"]
    assert affinity["podAntiAffinity"] == {"x": 1}
    assert affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {"weight": 1, "preference": {}}]
    # the job's template itself is untouched
    assert job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"] == own


def test_the_planner_reads_the_pods_affinity_as_the_pool() -> None:
    """The affinity written is one the planner's own admission (walras.planner.capacity) reads as the pool's nodes:
    a pod fed back (``walras check``) is admitted on pool nodes only."""
    from walras.kube.decode import constraints_from

    template = parse_template(fjob({"containers": [{"name": "c"}]}))
    pod = build_pod(template, plan_of(None), "walras-scheduler", pool_node_selector(POOL))
    constraints = constraints_from(pod["spec"])
    assert constraints.affinity == ((Requirement("walras.dev/pool", "In", ("cpu",)),
                                     Requirement("zone", "In", ("a",))),)
    inside = Node("cpu-1", {"walras.dev/pool": "cpu", "zone": "a"}, {"cpu": 4.0})
    outside = Node("gpu-1", {"walras.dev/accelerator": "v100"}, {"cpu": 4.0})
    assert constraints.admits(inside) and not constraints.admits(outside)


def test_without_a_pool_selector_the_pod_is_as_before() -> None:
    template = parse_template(fjob({"containers": [{"name": "c"}]}))
    pod = build_pod(template, plan_of("n"), "walras-scheduler")
    assert "affinity" not in pod["spec"]
    assert pool_node_selector(None) is None and pool_node_selector({"spec": {}}) is None
