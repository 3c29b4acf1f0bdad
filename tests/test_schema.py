"""walras.manifests.schema: manifests checked against the CRDs (structural schema with strict fields, CEL rules).

The cases: every example manifest is valid; misspelled fields at several depths are errors naming their path; each
schema constraint and each CEL rule rejects a broken object with its path and message. The reference is a real
kube-apiserver (``tests/conftest.py``'s control plane, CRDs applied): every case is also sent as a server-side
dry-run create with ``fieldValidation=Strict``, and the server must accept exactly the objects ``validate`` accepts.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from walras.manifests import schema
from walras.manifests.schema import validate

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("ResourcePool", "FungibleJob", "ColocationProfile")

#: A Budget (crds/budgets.walras.dev.yaml) for the cases of that kind: the examples have none (docs/budgets.md).
BUDGET: dict[str, Any] = {
    "apiVersion": "walras.dev/v1alpha1", "kind": "Budget", "metadata": {"name": "team-ml"},
    "spec": {"share": 2, "namespaces": ["ml"], "caps": [{"pool": "v100", "maxUnits": 4}],
             "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["ml"]}]}},
}


def example_documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict))
    return docs


def example(kind: str, name: str) -> dict[str, Any]:
    for doc in example_documents():
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return copy.deepcopy(doc)
    if kind == "Budget" and name == BUDGET["metadata"]["name"]:
        return copy.deepcopy(BUDGET)
    raise LookupError((kind, name))


_DELETE = object()


def with_value(kind: str, name: str, path: str, value: Any) -> dict[str, Any]:
    obj = example(kind, name)
    node = obj
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    if value is _DELETE:
        node.pop(keys[-1])
    else:
        node[keys[-1]] = value
    return obj


#: (kind, example name, field path, value, the error's path): one per schema constraint kind.
STRUCTURAL = [
    ("ResourcePool", "cpu", "spec.resource", _DELETE, "spec.resource: Required value"),
    ("ResourcePool", "cpu", "spec.nodeSelector", {}, "spec.nodeSelector: Invalid value"),
    ("ResourcePool", "cpu", "spec.policy.type", "random", "spec.policy.type: Invalid value"),
    ("ResourcePool", "cpu", "spec.degreeLimit", 0, "spec.degreeLimit: Invalid value"),
    ("ResourcePool", "cpu", "spec.capacity", -1, "spec.capacity: Invalid value"),
    ("ResourcePool", "cpu", "spec.resource", "Not A Resource!", "spec.resource: Invalid value"),
    ("ResourcePool", "p100", "spec.policy.fair.mechanism", "drf-ish", "spec.policy.fair.mechanism: Invalid value"),
    ("ResourcePool", "p100", "spec.policy.fair.alpha", 0, "spec.policy.fair.alpha: Invalid value"),
    ("FungibleJob", "resnet50", "spec.throughput", {}, "spec.throughput: Invalid value"),
    ("FungibleJob", "resnet50", "spec.throughput", {"v100": -1}, "spec.throughput.v100: Invalid value"),
    ("FungibleJob", "resnet50", "spec.utility.type", "quadratic", "spec.utility.type: Invalid value"),
    ("FungibleJob", "resnet50", "spec.demand", 0, "spec.demand: Invalid value: 0: must be greater than 0"),
    ("FungibleJob", "resnet50", "spec.replicas.count", -2, "spec.replicas.count: Invalid value"),
    ("FungibleJob", "resnet50", "spec.weight", 0, "spec.weight: Invalid value"),
    ("FungibleJob", "resnet50", "spec.template", _DELETE, "spec.template: Required value"),
    ("FungibleJob", "resnet50", "spec.resources", {"cpu": "four"}, "spec.resources.cpu: Invalid value"),
    ("FungibleJob", "resnet50", "spec.demand", "one", "spec.demand: Invalid value: 'one': must be of type number"),
    ("FungibleJob", "etl", "spec.colocation.size", -4, "spec.colocation.size: Invalid value"),
    ("ColocationProfile", "web-batch", "spec.types", [], "spec.types: Invalid value"),
    ("ColocationProfile", "web-batch", "spec.interference", [[0.1, -0.2, 0.0]] * 3,
     "spec.interference[0][1]: Invalid value"),
    ("ColocationProfile", "web-batch", "spec.cost.type", "quadratic", "spec.cost.type: Invalid value"),
    ("ColocationProfile", "web-batch", "spec.types", ["Web", "batch", "cache"], "spec.types[0]: Invalid value"),
    # issue 30 item 7: every number a user writes is bounded (walras.planner.spec's MAX_* carry the same numbers)
    ("FungibleJob", "resnet50", "spec.utility", {"type": "log", "weight": 1e308}, "spec.utility.weight: Invalid value"),
    ("FungibleJob", "resnet50", "spec.weight", 1e7, "spec.weight: Invalid value"),
    ("FungibleJob", "resnet50", "spec.throughput", {"v100": 1e308}, "spec.throughput.v100: Invalid value"),
    ("FungibleJob", "resnet50", "spec.throughput", {f"p{k}": 1 for k in range(65)}, "spec.throughput: Invalid value"),
    ("FungibleJob", "resnet50", "spec.demand", 1e308, "spec.demand: Invalid value"),
    ("FungibleJob", "resnet50", "spec.replicas.count", 10**6, "spec.replicas.count: Invalid value"),
    ("FungibleJob", "resnet50", "spec.resources", {"cpu": "1e308"}, "spec.resources.cpu: Invalid value"),
    ("FungibleJob", "resnet50", "spec.resources", {f"r{k}": "1" for k in range(33)}, "spec.resources: Invalid value"),
    ("FungibleJob", "resnet50", "spec.backoffLimit", 10**9, "spec.backoffLimit: Invalid value"),
    ("ResourcePool", "cpu", "spec.capacity", 1e308, "spec.capacity: Invalid value"),
    ("ColocationProfile", "web-batch", "spec.interference", [[1e308, 0.0, 0.0]] * 3,
     "spec.interference[0][0]: Invalid value"),
    ("Budget", "team-ml", "spec.share", 0, "spec.share: Invalid value"),
    ("Budget", "team-ml", "spec.share", _DELETE, "spec.share: Required value"),
    ("Budget", "team-ml", "spec.namespaces", ["Not_A_Namespace"], "spec.namespaces[0]: Invalid value"),
    ("Budget", "team-ml", "spec.caps", [{"pool": "v100", "maxUnits": -1}], "spec.caps[0].maxUnits: Invalid value"),
    ("Budget", "team-ml", "spec.namespaceSelector.matchExpressions", [{"key": "team", "operator": "Among"}],
     "spec.namespaceSelector.matchExpressions[0].operator: Invalid value"),
]

#: Misspelled fields, as ``kubectl apply --validate=strict`` rejects them.
TYPOS = [
    ("FungibleJob", "resnet50", "spec.replica", {"count": 2}, 'spec.replica: unknown field "replica"'),
    ("FungibleJob", "resnet50", "spec.utility.exponnet", 0.5, 'spec.utility.exponnet: unknown field "exponnet"'),
    ("FungibleJob", "resnet50", "spec.utilityCurve.parametric.scal", 1.0,
     'spec.utilityCurve.parametric.scal: unknown field "scal"'),
    ("FungibleJob", "resnet50", "specs", {}, 'specs: unknown field "specs"'),
    ("ResourcePool", "cpu", "spec.policy.colocation.profle", "x", 'spec.policy.colocation.profle: unknown field'),
    ("ResourcePool", "cpu", "spec.nodeselector", {"a": "b"}, 'spec.nodeselector: unknown field "nodeselector"'),
    ("ColocationProfile", "web-batch", "spec.cost.exponant", 2, 'spec.cost.exponant: unknown field "exponant"'),
]

#: CEL rule violations: (kind, name, path, value, the error's path and the rule's message).
CEL = [
    ("ResourcePool", "cpu", "spec.preemption", {"maxPerPlan": 5, "maxPerHour": 2},  # docs/preemption.md
     "preemption.maxPerPlan must not exceed preemption.maxPerHour"),
    ("ResourcePool", "cpu", "spec.policy", {"type": "colocation"},
     "spec.policy: Invalid value: object: policy.colocation (with a profile) is required"),
    ("ResourcePool", "p100", "spec.policy.fair", {"mechanism": "pf-vds"},
     "spec.policy: Invalid value: object: policy.fair.alpha is required"),
    ("FungibleJob", "resnet50", "spec.utility", {"type": "power"}, "spec.utility: Invalid value: object: utility.exp"),
    ("FungibleJob", "resnet50", "spec.utility", {"type": "power", "exponent": 1.5}, "spec.utility: Invalid value"),
    ("FungibleJob", "resnet50", "spec.utility", {"type": "alpha-fair"}, "utility.alpha is required"),
    ("FungibleJob", "resnet50", "spec.utility", {"type": "target-priority"}, "utility.target is required"),
    ("FungibleJob", "resnet50", "spec.replicas", {"count": 2, "max": 3}, "spec.replicas: Invalid value: object: "
                                                                          "replicas takes either count"),
    ("FungibleJob", "resnet50", "spec.replicas", {"min": 2}, "replicas.max is required with replicas.min"),
    ("FungibleJob", "resnet50", "spec.replicas", {"min": 2, "max": 3, "gang": True},  # docs/gangs.md
     "replicas.gang needs replicas.count (at least 1), not min and max"),
    ("FungibleJob", "resnet50", "spec.replicas", {"min": 4, "max": 3}, "replicas.min must be at most replicas.max"),
    ("FungibleJob", "resnet50", "spec.utilityCurve", {"points": [{"amount": 0, "value": 0}, {"amount": 1, "value": 1}],
                                                      "parametric": {"type": "log"}},
     "spec.utilityCurve: Invalid value: object: utilityCurve takes either points or parametric"),
    ("ColocationProfile", "web-batch", "spec.cost", {"type": "convex"}, "cost.exponent is required for a convex"),
    ("FungibleJob", "resnet50", "spec.throughput", {"v100": 1e-12}, "spec.throughput: Invalid value: object: every "
                                                                     "throughput is 0 or at least 1e-9"),
    ("FungibleJob", "resnet50", "spec.resources", {"nvidia.com/gpu": "0.5"},
     "spec.resources: Invalid value: object: an extended resource (e.g. nvidia.com/gpu) takes a whole number only"),
    ("FungibleJob", "resnet50", "spec.demand", 1e-6, "spec.demand: Invalid value: 1e-06: demand must be at least"),
    ("FungibleJob", "resnet50", "spec.weight", 1e-9, "spec.weight: Invalid value: 1e-09: weight must be at least"),
    ("FungibleJob", "resnet50", "spec.utility", {"type": "log", "weight": 1e-9}, "utility.weight must be at least"),
    ("FungibleJob", "resnet50", "spec.utility", {"type": "target-priority", "target": 1e-12},
     "utility.target must be at least"),
    ("FungibleJob", "etl", "spec.colocation.size", 1e-6, "colocation.size must be at least"),
    ("FungibleJob", "resnet50", "spec.throughputDemand", 1e-12, "throughputDemand must be at least"),
    ("ColocationProfile", "web-batch", "spec.interference", [[0.1, 0.1, 0.1]] * 2,
     "spec: Invalid value: object: interference must have one row per type"),
    ("ColocationProfile", "web-batch", "spec.interference", [[0.1, 0.1]] * 3,
     "spec: Invalid value: object: every interference row must have one entry per type"),
    ("Budget", "team-ml", "spec", {"share": 1},
     "spec: Invalid value: object: a Budget needs spec.namespaceSelector or spec.namespaces"),
    ("Budget", "team-ml", "spec", {"share": 1, "namespaces": []}, "a Budget needs spec.namespaceSelector"),
    ("Budget", "team-ml", "spec.namespaceSelector.matchExpressions", [{"key": "team", "operator": "In"}],
     "spec.namespaceSelector.matchExpressions[0]: Invalid value: object: values are required with In and NotIn"),
    ("Budget", "team-ml", "spec.namespaceSelector.matchExpressions",
     [{"key": "team", "operator": "Exists", "values": ["ml"]}], "values are required with In and NotIn and forbidden"),
]

#: Objects valid only because of CEL's typing or defaulting: the API server accepts them too.
VALID_VARIANTS = [
    ("ResourcePool", "cpu", "spec.preemption", {"rule": "Never", "maxPerPlan": 2, "maxPerHour": 2}),
    ("FungibleJob", "resnet50", "spec.preemptible", False),
    ("FungibleJob", "resnet50", "spec.utility", {"type": "power", "exponent": 1}),  # integer literal of a number
    ("FungibleJob", "resnet50", "spec.demand", _DELETE),  # default 1
    ("FungibleJob", "resnet50", "spec.replicas", {"min": 1, "max": 1}),
    ("FungibleJob", "resnet50", "spec.resources", {"cpu": 4, "memory": "1.5Gi"}),  # int-or-string
    ("FungibleJob", "resnet50", "spec.resources", {"nvidia.com/gpu": 2, "example.com/fpga": "1k", "cpu": "0.5"}),
    ("FungibleJob", "resnet50", "spec.throughput", {"v100": 0}),  # 0: the pool cannot run it
    ("ColocationProfile", "web-batch", "spec.cost", {"type": "linear"}),
    ("Budget", "team-ml", "spec", {"share": 0.5, "namespaceSelector": {}}),  # the empty selector: every namespace
    ("Budget", "team-ml", "spec.namespaceSelector.matchExpressions", [{"key": "team", "operator": "Exists"}]),
    ("Budget", "team-ml", "spec.share", 3),  # integer literal of a number
]


def ids(cases: list[tuple[Any, ...]]) -> list[str]:
    return [f"{c[0]}-{c[2]}" for c in cases]


@pytest.mark.parametrize("doc", example_documents(), ids=lambda d: f"{d['kind']}-{d['metadata']['name']}")
def test_every_example_manifest_is_valid(doc: dict[str, Any]) -> None:
    assert validate(doc) == []


def test_the_packaged_examples_are_valid() -> None:
    text = (ROOT / "operator" / "walras" / "data" / "examples.yaml").read_text()
    docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    assert {d["kind"] for d in docs} >= set(KINDS)
    for doc in docs:
        assert validate(doc) == [], doc["metadata"]["name"]


@pytest.mark.parametrize(("kind", "name", "path", "value", "error"), STRUCTURAL, ids=ids(STRUCTURAL))
def test_structural_schema_rejects(kind: str, name: str, path: str, value: Any, error: str) -> None:
    errors = validate(with_value(kind, name, path, value))
    assert any(e.startswith(error) for e in errors), errors


@pytest.mark.parametrize(("kind", "name", "path", "value", "error"), TYPOS, ids=ids(TYPOS))
def test_misspelled_fields_are_errors_naming_their_path(kind: str, name: str, path: str, value: Any,
                                                        error: str) -> None:
    errors = validate(with_value(kind, name, path, value))
    assert len(errors) == 1 and errors[0].startswith(error), errors


@pytest.mark.parametrize(("kind", "name", "path", "value", "error"), CEL, ids=ids(CEL))
def test_cel_rules_reject(kind: str, name: str, path: str, value: Any, error: str) -> None:
    errors = validate(with_value(kind, name, path, value))
    assert any(error in e for e in errors), errors


@pytest.mark.parametrize(("kind", "name", "path", "value"), VALID_VARIANTS, ids=ids(VALID_VARIANTS))
def test_valid_variants_pass(kind: str, name: str, path: str, value: Any) -> None:
    assert validate(with_value(kind, name, path, value)) == []


def test_every_cel_rule_of_the_crds_is_exercised_by_a_failing_case() -> None:
    messages = set()
    for crd in schema.crds().values():
        stack: list[Any] = [crd.schema]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                messages.update(r["message"] for r in node.get("x-kubernetes-validations", []))
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
    hit = set()
    for kind, name, path, value, _ in CEL:
        for error in validate(with_value(kind, name, path, value)):
            hit.update(m for m in messages if error.endswith(m))
    assert hit == messages


def test_other_kinds_status_and_versions() -> None:
    assert validate({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {"bogus": 1}}) == []
    job = example("FungibleJob", "resnet50")
    job["status"] = {"phase": "NotAPhase", "whatever": 1}  # ignored on create: the status sub-resource
    assert validate(job) == []
    job["apiVersion"] = "walras.dev/v1"
    (error,) = validate(job)
    assert error.startswith('apiVersion: no matches for kind "FungibleJob" in version "walras.dev/v1"')
    assert "walras.dev/v1alpha1" in error


def test_validation_does_not_modify_its_argument() -> None:
    job = with_value("FungibleJob", "resnet50", "spec.demand", _DELETE)
    before = copy.deepcopy(job)
    validate(job)
    assert job == before


# ------------------------------------------------------------------ the reference: a real kube-apiserver


def _plural(kind: str) -> str:
    return {"ResourcePool": "resourcepools", "FungibleJob": "fungiblejobs",
            "ColocationProfile": "colocationprofiles", "Budget": "budgets"}[kind]


def test_the_api_server_agrees_on_every_case(control_plane: Any, namespace: str) -> None:
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    cases: list[tuple[str, dict[str, Any]]] = []
    for doc in example_documents():
        if doc["kind"] in KINDS:
            cases.append((f"example {doc['metadata']['name']}", doc))
    cases.append(("Budget team-ml", copy.deepcopy(BUDGET)))
    for table in (STRUCTURAL, TYPOS, CEL):
        for kind, name, path, value, _ in table:
            cases.append((f"{kind} {path}={value!r}", with_value(kind, name, path, value)))
    for kind, name, path, value in VALID_VARIANTS:
        cases.append((f"{kind} {path}={value!r}", with_value(kind, name, path, value)))
    disagreements = []
    for label, obj in cases:
        obj = copy.deepcopy(obj)
        obj["metadata"] = {"name": "probe"}
        scope = f"/namespaces/{namespace}" if obj["kind"] == "FungibleJob" else ""
        url = f"/apis/walras.dev/v1alpha1{scope}/{_plural(obj['kind'])}?dryRun=All&fieldValidation=Strict"
        code, body = control_plane.request("POST", url, obj)
        accepted = code in (200, 201)
        ours = validate(obj)
        if accepted != (ours == []):
            message = body.get("message") if isinstance(body, dict) else body
            disagreements.append(f"{label}: server {code} {message!r}; validate {ours}")
    assert disagreements == []
    assert len(cases) >= 50
