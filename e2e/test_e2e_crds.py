"""The CRDs on the real kube-apiserver, through the real kubectl: structural schemas, CEL rules, pruning,
defaulting, server-side printer columns and ``kubectl explain``. These need the real API server (the emulated API
applies no schema), so they run on the session's control plane only (and FAIL under ``CI=true`` without it)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.conftest import MANIFESTS, ROOT
from tests.controlplane import ControlPlane

pytestmark = pytest.mark.e2e

JOB = next(d for d in yaml.safe_load_all((MANIFESTS / "jobs.yaml").read_text()) if d)
POOL = next(d for d in yaml.safe_load_all((MANIFESTS / "pools.yaml").read_text()) if d)


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    control_plane.kubectl("apply", "-f", str(ROOT / "crds"))
    control_plane.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    yield control_plane


def job(namespace: str, name: str = "j", **spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(JOB)
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"].update(spec)
    return doc


def create(cp: ControlPlane, doc: dict[str, Any], *flags: str) -> tuple[int, str]:
    proc = cp.kubectl("create", *flags, "-f", "-", stdin=json.dumps(doc), check=False)
    return proc.returncode, proc.stderr


def test_schema_and_cel_rules_refuse_invalid_objects(crds: ControlPlane, namespace: str) -> None:
    code, err = create(crds, job(namespace, replicas={"count": 1, "min": 1, "max": 2}))
    assert code != 0 and "replicas takes either count, or min and max, not both" in err
    code, err = create(crds, job(namespace, replicas={"min": 3, "max": 2}))
    assert code != 0 and "replicas.min must be at most replicas.max" in err
    code, err = create(crds, job(namespace, utility={"type": "power"}))
    assert code != 0 and "utility.exponent is required for a power utility" in err
    code, err = create(crds, job(namespace, demand=0), "--validate=false")  # the server's schema, not kubectl's
    assert code != 0 and "spec.demand" in err and "greater than 0" in err
    code, err = create(crds, job(namespace, replicas={"count": "two"}), "--validate=false")
    assert code != 0 and "spec.replicas.count" in err
    pool = copy.deepcopy(POOL)
    pool["metadata"] = {"name": f"{namespace}-pool"}
    pool["spec"]["policy"] = {"type": "colocation"}
    code, err = create(crds, pool)
    assert code != 0 and "policy.colocation (with a profile) is required" in err
    assert create(crds, job(namespace))[0] == 0  # the valid one is accepted


def test_defaulting_and_pruning(crds: ControlPlane, namespace: str) -> None:
    doc = job(namespace, unknownField="dropped")
    del doc["spec"]["demand"]
    code, err = create(crds, doc, "--validate=false")
    assert code == 0, err
    stored = crds.get("fungiblejob", "j", "-n", namespace)
    assert stored["spec"]["demand"] == 1
    assert stored["spec"]["throughputUnit"] == "/s"
    assert "unknownField" not in stored["spec"]
    # kubectl's own validation refuses the unknown field (it reads the server's OpenAPI)
    strict = crds.kubectl("create", "--validate=strict", "-f", "-",
                          stdin=json.dumps(job(namespace, name="k", unknownField=1)), check=False)
    assert strict.returncode != 0 and "unknownField" in strict.stderr
    # the status subresource prunes unknown status fields and ignores spec changes
    crds.kubectl("patch", "fungiblejob", "j", "-n", namespace, "--subresource=status", "--type=merge", "-p",
                 json.dumps({"status": {"phase": "Running", "notAField": 1}, "spec": {"demand": 5}}))
    stored = crds.get("fungiblejob", "j", "-n", namespace)
    assert stored["status"]["phase"] == "Running" and "notAField" not in stored["status"]
    assert stored["spec"]["demand"] == 1


def test_printer_columns_and_explain(crds: ControlPlane, namespace: str) -> None:
    assert create(crds, job(namespace, weight=2))[0] == 0
    crds.kubectl("patch", "fungiblejob", "j", "-n", namespace, "--subresource=status", "--type=merge", "-p",
                 json.dumps({"status": {"phase": "Running", "allocationText": "e2e-v100=1.00",
                                        "placedReplicas": 2, "replicasText": "2/2", "throughputText": "3/s",
                                        "cost": 1.5, "costText": "1.5"}}))
    lines = crds.kubectl("get", "fungiblejob", "j", "-n", namespace).stdout.splitlines()
    assert lines[0].split() == ["NAME", "PHASE", "ALLOCATION", "REPLICAS", "THROUGHPUT", "COST", "TENANT", "AGE"]
    assert lines[1].split()[:6] == ["j", "Running", "e2e-v100=1.00", "2/2", "3/s", "1.5"]
    wide = crds.kubectl("get", "fungiblejob", "j", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert "WEIGHT" in wide[0].split() and "2" in wide[1].split()
    explained = crds.kubectl("explain", "fungiblejob.spec.replicas").stdout
    assert "Either a fixed count (optionally a gang), or min and max" in explained
    for field in ("count", "gang", "min", "max"):
        assert f"  {field}\t" in explained or f"  {field} " in explained, explained
    assert "ResourcePool" in crds.kubectl("explain", "resourcepools").stdout
    conditions = crds.kubectl("explain", "fungiblejob.status.conditions").stdout
    assert "ReplicasGranted" in conditions and "Scheduled" in conditions and "Placed," not in conditions
