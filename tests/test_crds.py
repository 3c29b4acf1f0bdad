"""The CRDs in crds/: structure, JSON-schema validation of valid and invalid objects, and the CEL rules."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CRDS = {p.name: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("*.yaml"))}
KINDS = {crd["spec"]["names"]["kind"]: crd for crd in CRDS.values()}


def to_json_schema(node: Any) -> Any:
    """OpenAPI v3 (Kubernetes structural subset) -> JSON Schema draft 2020-12.

    ``exclusiveMinimum: true`` + ``minimum`` becomes a numeric ``exclusiveMinimum``; ``nullable`` adds ``null`` to
    the type; ``x-kubernetes-*`` extensions are dropped (``x-kubernetes-preserve-unknown-fields`` means any object,
    which JSON Schema allows by default; ``x-kubernetes-int-or-string`` is already spelled as ``anyOf``).
    """
    if isinstance(node, list):
        return [to_json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("description", "default", "format"):
            continue
        if key in ("properties",):
            out[key] = {k: to_json_schema(v) for k, v in value.items()}
        else:
            out[key] = to_json_schema(value)
    if out.get("exclusiveMinimum") is True:
        out["exclusiveMinimum"] = out.pop("minimum")
    if out.pop("nullable", False):
        out["type"] = [out["type"], "null"]
    return out


def schema(kind: str) -> dict[str, Any]:
    return KINDS[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def validator(kind: str) -> jsonschema.Draft202012Validator:
    converted = to_json_schema(schema(kind))
    jsonschema.Draft202012Validator.check_schema(converted)
    return jsonschema.Draft202012Validator(converted)


def examples() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((ROOT / "examples").rglob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict))
    return docs


def example(kind: str, name: str | None = None) -> dict[str, Any]:
    for doc in examples():
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name):
            return copy.deepcopy(doc)
    raise LookupError((kind, name))


def test_three_crds_with_names_scope_and_status() -> None:
    assert set(KINDS) == {"ResourcePool", "FungibleJob", "ColocationProfile"}
    expected = {
        "ResourcePool": ("resourcepools", "Cluster"),
        "FungibleJob": ("fungiblejobs", "Namespaced"),
        "ColocationProfile": ("colocationprofiles", "Cluster"),
    }
    for kind, (plural, scope) in expected.items():
        crd = KINDS[kind]
        assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
        assert crd["metadata"]["name"] == f"{plural}.walras.dev"
        assert crd["spec"]["group"] == "walras.dev"
        assert crd["spec"]["names"]["plural"] == plural
        assert crd["spec"]["scope"] == scope
        (version,) = crd["spec"]["versions"]
        assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
        assert version["subresources"] == {"status": {}}
        assert f"{plural}.walras.dev.yaml" in CRDS


def test_short_names_do_not_collide_with_job_nodepool_or_workload() -> None:
    taken = {"job", "jobs", "nodepool", "nodepools", "np", "workload", "workloads", "wl", "po", "no", "pod", "node"}
    short = [s for crd in KINDS.values() for s in crd["spec"]["names"]["shortNames"]]
    assert short == sorted(set(short), key=short.index)  # no duplicates
    assert not set(short) & taken
    assert {"rpool", "fjob", "coprof"} <= set(short)


def test_printer_columns_show_price_allocation_throughput_phase() -> None:
    def columns(kind: str) -> dict[str, str]:
        return {c["name"]: c["jsonPath"] for c in KINDS[kind]["spec"]["versions"][0]["additionalPrinterColumns"]}

    assert columns("ResourcePool")["Price"] == ".status.price"
    job = columns("FungibleJob")
    assert job["Allocation"] == ".status.allocation"
    assert job["Throughput"] == ".status.throughput"
    assert job["Phase"] == ".status.phase"


def test_status_schema_accepts_what_the_planner_writes() -> None:
    from walras.planner import build_plan, load_manifests

    plan = build_plan(load_manifests(ROOT / "examples"))
    for pool in plan.pools.values():
        obj = {"apiVersion": "walras.dev/v1alpha1", "kind": "ResourcePool", "metadata": {"name": pool.name}}
        obj["spec"] = example("ResourcePool", pool.name)["spec"]
        obj["status"] = pool.status()
        validator("ResourcePool").validate(obj)
    for job in plan.jobs.values():
        obj = example("FungibleJob", job.name)
        obj["status"] = job.status()
        validator("FungibleJob").validate(obj)


@pytest.mark.parametrize("kind", ["ResourcePool", "FungibleJob", "ColocationProfile"])
def test_every_example_validates(kind: str) -> None:
    docs = [d for d in examples() if d["kind"] == kind]
    assert docs
    for doc in docs:
        validator(kind).validate(doc)


def _set(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    node = obj
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    if value is _DELETE:
        node.pop(keys[-1])
    else:
        node[keys[-1]] = value
    return obj


_DELETE = object()

INVALID = [
    ("ResourcePool", "cpu", "spec.resource", _DELETE),
    ("ResourcePool", "cpu", "spec.nodeSelector", {}),
    ("ResourcePool", "cpu", "spec.policy.type", "random"),
    ("ResourcePool", "cpu", "spec.degreeLimit", 0),
    ("ResourcePool", "cpu", "spec.capacity", -1),
    ("ResourcePool", "cpu", "spec.resource", "Not A Resource!"),
    ("ResourcePool", "p100", "spec.policy.fair.mechanism", "drf-ish"),
    ("ResourcePool", "p100", "spec.policy.fair.alpha", 0),
    ("FungibleJob", "resnet50", "spec.throughput", {}),
    ("FungibleJob", "resnet50", "spec.throughput", {"v100": -1}),
    ("FungibleJob", "resnet50", "spec.utility.type", "quadratic"),
    ("FungibleJob", "resnet50", "spec.demand", 0),
    ("FungibleJob", "resnet50", "spec.replicas.count", -2),
    ("FungibleJob", "resnet50", "spec.weight", 0),
    ("FungibleJob", "resnet50", "spec.template", _DELETE),
    ("FungibleJob", "resnet50", "spec.resources", {"cpu": "four"}),
    ("FungibleJob", "etl", "spec.colocation.size", -4),
    ("ColocationProfile", "web-batch", "spec.types", []),
    ("ColocationProfile", "web-batch", "spec.interference", [[0.1, -0.2, 0.0]] * 3),
    ("ColocationProfile", "web-batch", "spec.cost.type", "quadratic"),
    ("ColocationProfile", "web-batch", "spec.types", ["Web", "batch", "cache"]),
]


@pytest.mark.parametrize(("kind", "name", "path", "value"), INVALID)
def test_schema_rejects_invalid_objects(kind: str, name: str, path: str, value: Any) -> None:
    obj = _set(example(kind, name), path, value)
    assert list(validator(kind).iter_errors(obj)), f"{kind} with {path}={value!r} should be rejected"


# --- CEL rules: each rule written in the CRDs has a Python twin here, tested on valid and invalid objects ----------

CEL: dict[str, Callable[[dict[str, Any]], bool]] = {
    "self.type != 'colocation' || has(self.colocation)": lambda s: s["type"] != "colocation" or "colocation" in s,
    "!has(self.fair) || !has(self.fair.mechanism) || self.fair.mechanism != 'pf-vds' || has(self.fair.alpha)": (
        lambda s: (
            "fair" not in s
            or "mechanism" not in s["fair"]
            or s["fair"]["mechanism"] != "pf-vds"
            or "alpha" in s["fair"]
        )
    ),
    "self.type != 'power' || (has(self.exponent) && self.exponent != 0.0 && self.exponent <= 1.0)": (
        lambda s: s["type"] != "power" or ("exponent" in s and s["exponent"] != 0.0 and s["exponent"] <= 1.0)
    ),
    "self.type != 'alpha-fair' || has(self.alpha)": lambda s: s["type"] != "alpha-fair" or "alpha" in s,
    "self.type != 'target-priority' || has(self.target)": lambda s: s["type"] != "target-priority" or "target" in s,
    "has(self.count) != (has(self.min) || has(self.max))": lambda s: ("count" in s) != ("min" in s or "max" in s),
    "!has(self.min) || has(self.max)": lambda s: "min" not in s or "max" in s,
    "!has(self.min) || !has(self.max) || self.min <= self.max": (
        lambda s: "min" not in s or "max" not in s or s["min"] <= s["max"]
    ),
    "has(self.points) != has(self.parametric)": lambda s: ("points" in s) != ("parametric" in s),
    "self.type != 'convex' || has(self.exponent)": lambda s: s["type"] != "convex" or "exponent" in s,
    "size(self.interference) == size(self.types)": lambda s: len(s["interference"]) == len(s["types"]),
    "self.interference.all(row, size(row) == size(self.types))": (
        lambda s: all(len(row) == len(s["types"]) for row in s["interference"])
    ),
}


def _rules(node: Any, path: str = "") -> list[tuple[str, str]]:
    found = []
    if isinstance(node, dict):
        for rule in node.get("x-kubernetes-validations", []):
            found.append((path, rule["rule"]))
            assert rule["message"]
        for key, value in node.items():
            found.extend(_rules(value, f"{path}/{key}"))
    elif isinstance(node, list):
        for value in node:
            found.extend(_rules(value, path))
    return found


def _cel_errors(kind: str, obj: dict[str, Any]) -> list[str]:
    """Evaluate every CEL rule of ``kind`` where its object exists in ``obj`` (as the API server does)."""
    errors = []
    for path, rule in _rules(schema(kind)):
        keys = [k for k in path.split("/") if k and k != "properties"]
        node: Any = obj
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None and not CEL[rule](node):
            errors.append(rule)
    return errors


def test_every_cel_rule_has_an_evaluator() -> None:
    written = {rule for crd in KINDS.values() for _, rule in _rules(crd)}
    assert written == set(CEL)


def test_examples_pass_the_cel_rules() -> None:
    for doc in examples():
        if doc["kind"] in KINDS:
            assert _cel_errors(doc["kind"], doc) == [], doc["metadata"]["name"]


CEL_INVALID = [
    ("ResourcePool", "cpu", "spec.policy", {"type": "colocation"}),
    ("ResourcePool", "p100", "spec.policy.fair", {"mechanism": "pf-vds"}),
    ("FungibleJob", "resnet50", "spec.utility", {"type": "power"}),
    ("FungibleJob", "resnet50", "spec.utility", {"type": "power", "exponent": 1.5}),
    ("FungibleJob", "resnet50", "spec.utility", {"type": "alpha-fair"}),
    ("FungibleJob", "resnet50", "spec.utility", {"type": "target-priority"}),
    ("FungibleJob", "resnet50", "spec.replicas", {"count": 2, "max": 3}),
    ("FungibleJob", "resnet50", "spec.replicas", {"min": 2}),
    ("FungibleJob", "resnet50", "spec.replicas", {"min": 4, "max": 3}),
    ("FungibleJob", "resnet50", "spec.utilityCurve", {"points": [], "parametric": {"type": "log"}}),
    ("ColocationProfile", "web-batch", "spec.cost", {"type": "convex"}),
    ("ColocationProfile", "web-batch", "spec.interference", [[0.1, 0.1, 0.1]] * 2),
    ("ColocationProfile", "web-batch", "spec.interference", [[0.1, 0.1]] * 3),
]


@pytest.mark.parametrize(("kind", "name", "path", "value"), CEL_INVALID)
def test_cel_rules_reject_and_the_planner_agrees(kind: str, name: str, path: str, value: Any) -> None:
    from walras.planner.spec import parse_job, parse_pool, parse_profile

    obj = _set(example(kind, name), path, value)
    assert _cel_errors(kind, obj), f"{path}={value!r} should break a CEL rule"
    parse = {"ResourcePool": parse_pool, "FungibleJob": parse_job, "ColocationProfile": parse_profile}[kind]
    with pytest.raises(ValueError, match=path.split(".")[1]):
        parse(obj)


def test_crds_and_example_nodes_validate_against_kubernetes_schemas() -> None:
    import kubernetes_validate

    for name, crd in CRDS.items():
        assert kubernetes_validate.validate(crd, "1.30", strict=True), name
    typo = copy.deepcopy(KINDS["FungibleJob"])
    typo["spec"]["versions"][0]["subresource"] = {"status": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, "1.30", strict=True)
    for doc in examples():
        if doc["kind"] == "Node":
            kubernetes_validate.validate(doc, "1.30", strict=True)
