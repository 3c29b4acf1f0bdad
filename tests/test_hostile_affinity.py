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


def _ready_node(cp: Any, name: str, labels: dict[str, str], cpu: str) -> None:
    cp.ready_node(name, labels, {"cpu": cpu, "memory": "64Gi", "pods": "20"})


def test_kube_scheduler_without_the_extender_cannot_bind_a_walras_pod_outside_its_pool(control_plane: Any,
                                                                                      namespace: str) -> None:
    """The managedResources mistake of issue 30 item 3, reduced to its core: a real kube-scheduler places Walras's
    pods without asking the extender. A pod that fits only a node outside its pool stays Pending (before, it was
    bound there, deleted by Walras as misplaced and re-created, in a loop); one that fits the pool goes to the pool's
    node although an emptier node outside would score higher. A pod without the affinity (the control) is bound
    outside the pool."""
    import json

    cp = control_plane
    label = {"walras.dev/hostile-pool": namespace}
    inside, outside = f"in-{namespace}", f"out-{namespace}"
    _ready_node(cp, inside, label, "4")
    _ready_node(cp, outside, {}, "64")
    template = parse_template(fjob({"containers": [{"name": "c", "image": "registry.invalid/none"}]}))

    def pod(name: str, cpu: str, pool: dict[str, str] | None) -> dict[str, Any]:
        plan = PodPlan(namespace, name, "j", "p", None, {"cpu": cpu}, {"cpu": cpu}, "create", False)
        body = build_pod(template, plan, "default-scheduler", pool)
        del body["metadata"]["ownerReferences"]  # no FungibleJob exists here: the garbage collector would take it
        return body

    scheduler = cp.start_scheduler()
    try:
        for body in (pod("too-big", "8", label), pod("fits", "1", label), pod("control", "8", None)):
            cp.kubectl("create", "-f", "-", stdin=json.dumps(body))
        cp.kubectl("wait", "-n", namespace, "pod/fits", f"--for=jsonpath={{.spec.nodeName}}={inside}",
                   "--timeout=60s")
        cp.kubectl("wait", "-n", namespace, "pod/control", "--for=jsonpath={.spec.nodeName}", "--timeout=60s")
        cp.kubectl("wait", "-n", namespace, "pod/too-big", "--for=condition=PodScheduled=False", "--timeout=60s")
        control = cp.get("pod", "control", "-n", namespace)
        assert control["spec"]["nodeName"] != inside
        big = cp.get("pod", "too-big", "-n", namespace)
        assert not big["spec"].get("nodeName")
        (scheduled,) = [c for c in big["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert scheduled["reason"] == "Unschedulable"
        print("too-big stays Pending:", scheduled["message"])
    finally:
        scheduler.stop()
        cp.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=false", check=False)
        cp.kubectl("delete", "node", inside, outside, "--wait=false", check=False)
