"""The CRDs in crds/: structure, JSON-schema validation of valid and invalid objects, and the CEL rules."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from walras.kube.encode import job_status, pool_status
from walras.manifests.schema import to_json_schema

ROOT = Path(__file__).resolve().parents[1]
CRDS = {p.name: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("*.yaml"))}
KINDS = {crd["spec"]["names"]["kind"]: crd for crd in CRDS.values()}


def schema(kind: str) -> dict[str, Any]:
    return KINDS[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def validator(kind: str) -> jsonschema.Draft202012Validator:
    """The JSON Schema of ``kind`` as :mod:`walras.manifests.schema` translates it, status included (the status
    written by the operator is checked here; ``validate`` skips status like the API server does on create)."""
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
    assert set(KINDS) == {"ResourcePool", "FungibleJob", "ColocationProfile", "Budget"}
    expected = {
        "ResourcePool": ("resourcepools", "Cluster"),
        "FungibleJob": ("fungiblejobs", "Namespaced"),
        "ColocationProfile": ("colocationprofiles", "Cluster"),
        "Budget": ("budgets", "Cluster"),
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

    pool = columns("ResourcePool")
    assert pool["Price"] == ".status.priceText" and pool["Utilisation"] == ".status.utilisationText"
    job = columns("FungibleJob")
    assert job["Allocation"] == ".status.allocationText"  # text such as a100=0.46,v100=0.54, not a JSON map
    assert job["Throughput"] == ".status.throughputText"  # rounded, with spec.throughputUnit
    assert job["Replicas"] == ".status.replicasText"  # running/count, e.g. 3/4 (issue 28)
    assert job["Cost"] == ".status.costText"  # rounded for a person (issue 29)
    assert job["Phase"] == ".status.phase"


def test_status_schema_accepts_what_the_planner_writes() -> None:
    from walras.kube.decode import cluster_from
    from walras.manifests import load_manifests
    from walras.planner import build_plan

    plan = build_plan(cluster_from(load_manifests(ROOT / "examples")))
    for pool in plan.pools.values():
        obj = {"apiVersion": "walras.dev/v1alpha1", "kind": "ResourcePool", "metadata": {"name": pool.name}}
        obj["spec"] = example("ResourcePool", pool.name)["spec"]
        obj["status"] = pool_status(pool)
        validator("ResourcePool").validate(obj)
    for job in plan.jobs.values():
        obj = example("FungibleJob", job.name)
        obj["status"] = job_status(job)
        validator("FungibleJob").validate(obj)


@pytest.mark.parametrize("kind", ["ResourcePool", "FungibleJob", "ColocationProfile"])
def test_every_example_validates(kind: str) -> None:
    docs = [d for d in examples() if d["kind"] == kind]
    assert docs
    for doc in docs:
        validator(kind).validate(doc)


def test_crds_and_example_nodes_validate_against_kubernetes_schemas() -> None:
    import kubernetes_validate

    for name, crd in CRDS.items():
        assert kubernetes_validate.validate(crd, "1.30", strict=True), name
    typo = copy.deepcopy(KINDS["FungibleJob"])
    typo["spec"]["versions"][0]["subresource"] = {"status": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, "1.30", strict=True)
    nodes = ROOT / "operator" / "walras" / "data" / "emulated-nodes.yaml"
    docs = [d for d in yaml.safe_load_all(nodes.read_text()) if isinstance(d, dict)]
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30", strict=True)


def _properties(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every property schema under ``node`` with its path (``.spec.replicas.min``, ``[]`` for items, ``{}`` for
    additionalProperties)."""
    found: list[tuple[str, dict[str, Any]]] = []
    if not isinstance(node, dict):
        return found
    for key, sub in (node.get("properties") or {}).items():
        found.append((f"{path}.{key}", sub))
        found.extend(_properties(sub, f"{path}.{key}"))
    if isinstance(node.get("items"), dict):
        found.extend(_properties(node["items"], f"{path}[]"))
    if isinstance(node.get("additionalProperties"), dict):
        found.extend(_properties(node["additionalProperties"], f"{path}{{}}"))
    return found


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_property_has_a_description(kind: str) -> None:
    """``kubectl explain`` teaches the API: every field says what it is. ``metadata`` is exempt: the API server
    forbids anything but ``type`` there (it is ObjectMeta, described by Kubernetes itself)."""
    root = schema(kind)
    assert root.get("description")
    props = _properties(root)
    assert len(props) > 10
    missing = [path for path, sub in props if not sub.get("description") and path != ".metadata"]
    assert missing == []
    assert schema(kind)["properties"]["metadata"] == {"type": "object"}


def test_printer_columns_have_descriptions_and_readable_types() -> None:
    for kind, crd in KINDS.items():
        for column in crd["spec"]["versions"][0]["additionalPrinterColumns"]:
            assert column["name"] == "Age" or column.get("description"), (kind, column["name"])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_status_has_observed_generation(kind: str) -> None:
    """Without it in the schema a real API server prunes the field and the operator patches it again forever."""
    status = schema(kind)["properties"]["status"]["properties"]
    assert status["observedGeneration"]["type"] == "integer"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_conditions_have_the_metav1_condition_shape(kind: str) -> None:
    conditions = schema(kind)["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == ["type"]
    item = conditions["items"]
    assert set(item["properties"]) == {"type", "status", "reason", "message", "lastTransitionTime",
                                       "observedGeneration"}
    assert item["properties"]["lastTransitionTime"]["format"] == "date-time"
    assert item["properties"]["status"]["enum"] == ["True", "False", "Unknown"]
    ok = {"conditions": [{"type": "Valid", "status": "True", "reason": "Ok", "message": "",
                          "lastTransitionTime": "2026-11-25T12:00:00Z", "observedGeneration": 3}]}
    bad_reason = {"conditions": [{"type": "Valid", "status": "True", "reason": "not camel case"}]}
    status_schema = jsonschema.Draft202012Validator(to_json_schema(schema(kind)["properties"]["status"]))
    assert list(status_schema.iter_errors(ok)) == []
    assert list(status_schema.iter_errors(bad_reason))


def test_fungiblejob_status_fields() -> None:
    status = schema("FungibleJob")["properties"]["status"]["properties"]
    assert status["allocationText"]["type"] == "string"
    assert status["throughputText"]["type"] == "string"
    assert status["wantedReplicas"]["additionalProperties"]["type"] == "integer"
    assert status["pricedThroughput"]["type"] == "number" and status["pricedCost"]["type"] == "number"
    assert status["placedReplicas"]["type"] == "integer"


def test_the_helm_chart_and_the_wheel_use_the_same_crd_files() -> None:
    """One source: helm/walras/crds/* are byte-equal copies of crds/ (make chart; a chart may not link out of
    itself) and operator/walras/crds (what the wheel packages) is a link to crds/."""
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        chart = ROOT / "helm" / "walras" / "crds" / path.name
        assert not chart.is_symlink() and chart.read_bytes() == path.read_bytes(), chart
    packaged = ROOT / "operator" / "walras" / "crds"
    assert packaged.is_symlink() and packaged.resolve() == (ROOT / "crds").resolve()


# --- on a real kube-apiserver: explain, printer columns, no pruning of what the operator writes -------------------


@pytest.fixture
def applied_crds(control_plane: Any) -> Any:
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    # kubectl keeps the server's discovery in a cache (one per control plane here, shared by the session's tests):
    # written by an earlier test before these CRDs existed, it lacks walras.dev, and ``kubectl explain`` does not
    # refresh it on a miss (``get`` does). ``api-resources`` without --cached re-reads discovery.
    control_plane.kubectl("api-resources", "--api-group=walras.dev")
    # The API server publishes a CRD's OpenAPI v3 schema (what ``kubectl explain`` reads) a moment after the CRD is
    # Established; until then explain answers "couldn't find resource". Wait for each kind's schema, bounded.
    deadline = time.monotonic() + 60
    for kind in ("fungiblejobs", "resourcepools", "colocationprofiles"):
        while control_plane.kubectl("explain", f"{kind}.spec", check=False).returncode != 0:
            assert time.monotonic() < deadline, f"the OpenAPI schema of {kind} was not published within 60 s"
            time.sleep(0.5)
    return control_plane


def test_kubectl_explain_teaches_the_api(applied_crds: Any) -> None:
    def explain(field: str) -> str:
        return " ".join(applied_crds.kubectl("explain", field).stdout.split())  # kubectl wraps lines

    assert "Fewest replicas of an elastic job" in explain("fungiblejobs.spec.replicas.min")
    out = explain("resourcepools.spec.policy.type")
    assert "degree-limited" in out and "multi-resource fairness" in out
    assert "slowdown of a task of type k" in explain("colocationprofiles.spec.interference")


def test_printer_columns_and_status_fields_survive_a_real_api_server(applied_crds: Any, namespace: str) -> None:
    """The status the operator writes is kept as written (fields missing from a schema are pruned, and the operator
    would patch them again forever), and ``kubectl get`` shows readable columns."""
    cp = applied_crds
    job = example("FungibleJob", "resnet50")
    job["metadata"] = {"name": "resnet50", "namespace": namespace}
    pool = example("ResourcePool", "v100")
    pool["metadata"] = {"name": f"v100-{namespace}"}
    profile = example("ColocationProfile", "web-batch")
    profile["metadata"] = {"name": f"web-batch-{namespace}"}
    cp.apply_objects([job, pool, profile])
    job_status = {"phase": "Running", "allocation": {"p100": 0.46, "v100": 0.54},
                  "allocationText": "p100=0.46,v100=0.54",
                  "replicas": {"p100": 2, "v100": 2}, "placedReplicas": 4, "wantedReplicas": {"p100": 2, "v100": 2},
                  "runningReplicas": 3, "replicasText": "3/4", "grantedReplicas": 4, "costText": "3.4",
                  "queuePosition": 2, "waitingReason": "PriceAboveBid",
                  "throughput": 13.9, "throughputText": "13.9 /s", "pricedThroughput": 14.2, "pricedCost": 3.5,
                  "cost": 3.4, "observedGeneration": 1,
                  "conditions": [{"type": "Scheduled", "status": "True", "reason": "AllPodsPlaced", "message": "4 of 4",
                                  "lastTransitionTime": "2026-11-25T12:00:00Z", "observedGeneration": 1}]}
    pool_status = {"nodeCount": 1, "capacity": 8.0, "used": 6.0, "price": 1.23456789, "priceText": "1.235",
                   "utilisation": 0.75, "utilisationText": "75%", "observedGeneration": 1}
    profile_status = {"observedGeneration": 1,
                      "conditions": [{"type": "Valid", "status": "True", "reason": "TypesComplete", "message": ""}]}
    for kind, name, ns, status in (("fungiblejob", "resnet50", namespace, job_status),
                                   ("resourcepool", pool["metadata"]["name"], None, pool_status),
                                   ("colocationprofile", profile["metadata"]["name"], None, profile_status)):
        cp.kubectl("patch", kind, name, *(["-n", ns] if ns else []), "--subresource=status", "--type=merge",
                   "-p", json.dumps({"status": status}))
        stored = cp.get(kind, name, *(["-n", ns] if ns else []))["status"]
        assert stored == status, kind  # nothing pruned
    table = cp.kubectl("get", "fungiblejobs", "-n", namespace, "-o", "wide").stdout
    header, row = table.splitlines()[:2]
    assert header.split()[:7] == ["NAME", "PHASE", "ALLOCATION", "REPLICAS", "THROUGHPUT", "COST", "WEIGHT"]
    assert "p100=0.46,v100=0.54" in row and "13.9 /s" in row and "Running" in row
    assert "3/4" in row.split() and "3.4" in row.split() and "PriceAboveBid" in row.split()
    table = cp.kubectl("get", "resourcepool", pool["metadata"]["name"]).stdout
    assert "1.235" in table and "75%" in table and "1.23456789" not in table
    cp.kubectl("delete", "resourcepool", pool["metadata"]["name"], "--wait=false")
    cp.kubectl("delete", "colocationprofile", profile["metadata"]["name"], "--wait=false")


def _condition_types_written() -> set[str]:
    """Every condition type the product writes on a FungibleJob or elsewhere: ``Condition("Type", ...)`` in the
    planner and the ``"type": "..."`` condition bodies of the boundary (read from the source, not from the CRD)."""
    import re

    found: set[str] = set()
    for path in (ROOT / "operator" / "walras").rglob("*.py"):
        text = path.read_text()
        found |= set(re.findall(r'Condition\(\s*"([A-Za-z]+)"', text))
        found |= set(re.findall(r'"type": "([A-Z][A-Za-z]+)", "status"', text))
        constants = dict(re.findall(r'^([A-Z_]+) = "([A-Z][A-Za-z]+)"$', text, re.MULTILINE))
        found |= {constants[name] for name in re.findall(r'"type": ([A-Z_]+), "status"', text) if name in constants}
        for listed in re.findall(r'^CONDITION_TYPES = \(([A-Z_, ]+)\)$', text, re.MULTILINE):  # types set by variable
            found |= {constants[name.strip()] for name in listed.split(",") if name.strip() in constants}
    return found


def test_the_conditions_description_names_the_conditions_that_exist() -> None:
    """``kubectl explain fungiblejob.status.conditions`` (the schema's description) names every job condition type
    the planner writes and no type that does not exist (issue 28: it named Placed, which nothing writes)."""
    import re

    text = schema("FungibleJob")["properties"]["status"]["properties"]["conditions"]["description"]
    single = "Valid|Scheduled|Schedulable|Backoff|Complete|Failed|Suspended|Misplaced"
    named = set(re.findall(rf"\b([A-Z][a-z]+(?:[A-Z][a-z]+)+|{single})\b", text))
    named -= {"InvalidSpec", "ResourceQuota"}  # a reason quoted with its condition; a kind
    written = _condition_types_written()
    pool_or_profile = {"Ready", "NodesOverlap", "TypesComplete", "PolicyApplied", "PolicyCertified",
                       "NamespacesOverlap", "CapsApplied",  # a Budget's (planner/tenants.py)
                       "CapacityIdle"}  # a pool's (planner/integral.py)
    job_types = written - pool_or_profile
    assert "ReplicasGranted" in written and "Scheduled" in written  # the source is really read
    assert named - written == set(), f"described but never written: {named - written}"
    assert job_types - named == set(), f"written but not described: {job_types - named}"
    assert "Placed," not in text and "e.g. Valid or Placed" not in text
