"""End to end, the four placement policies: the real ``walras run`` process, driven by the real kubectl, on the
project's example cluster (``examples/``: a ``throughput``, a ``fair`` and a ``utility`` GPU pool, a ``colocation``
CPU pool with its ColocationProfile, and jobs of every utility family).

On the real control plane when its binaries are there (the example nodes played by the kubelet stand-in, the
operator as the chart's ServiceAccount), else against a fresh emulated API; with ``WALRAS_E2E_KUBECONFIG`` against
that cluster, where the example nodes are created as Node objects with the examples' status (see ``conftest.py``).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from walras.planner.quantity import parse_quantity

from e2e.conftest import REAL_KUBECONFIG, ROOT, Cluster, Operator, connect, wait_until
from e2e.invariants import violations

pytestmark = pytest.mark.e2e
EXAMPLES = ROOT / "examples"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


#: the example cluster's nodes (kept out of examples/ so that `kubectl apply -R -f examples/` creates no Node)
NODES = documents(ROOT / "operator" / "walras" / "data" / "emulated-nodes.yaml")
JOBS = [d for f in sorted((EXAMPLES / "jobs").glob("*.yaml")) for d in documents(f)]
POOLS = documents(EXAMPLES / "pools.yaml")
NAMESPACES = sorted({j["metadata"]["namespace"] for j in JOBS})


@pytest.fixture(scope="module")
def cluster(kubectl_bin: str, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """This module's cluster: the CRDs, the example namespaces, nodes (with their status), profile and pools."""
    with tempfile.TemporaryDirectory(prefix="walras-e2e-policies-") as tmp:
        c = connect(Path(tmp), kubectl_bin, request)
        try:
            c.apply(ROOT / "crds")
            for ns in NAMESPACES:
                c.apply_text(json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            c.add_nodes(NODES)
            c.apply(EXAMPLES / "profile.yaml")
            c.apply(EXAMPLES / "pools.yaml")
            yield c
        finally:
            if c.real:
                c.reset(NAMESPACES)
            elif REAL_KUBECONFIG:
                for path in sorted((EXAMPLES / "jobs").glob("*.yaml")):
                    c.kc("delete", "-f", str(path), "--wait=false", check=False)
                for pool in POOLS:  # the operator's kopf finalizer: nobody left to remove it
                    c.kc("patch", "resourcepool", pool["metadata"]["name"], "--type=merge", "-p",
                         '{"metadata":{"finalizers":null}}', check=False)
                c.kc("delete", "-f", str(EXAMPLES / "pools.yaml"), "--wait=false", check=False)
                c.kc("delete", "-f", str(EXAMPLES / "profile.yaml"), "--wait=false", check=False)
                for node in NODES:
                    c.kc("delete", "node", node["metadata"]["name"], "--wait=false", check=False)
            c.close()


UNSETTLED: list[str] = []  # why the last check failed (reported on timeout)


def settled(cluster: Cluster) -> dict[tuple[str, str], list[dict[str, Any]]] | None:
    """Every example job's planned pods, if each exists and is bound to its planned node with the planned requests."""
    out = {}
    UNSETTLED.clear()
    for job in JOBS:
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        status = cluster.get("fungiblejob", name, "-n", ns).get("status") or {}
        planned = status.get("pods") or []
        if not planned:
            UNSETTLED.append(f"{ns}/{name}: no pods in status ({status.get('conditions')})")
            continue
        items = cluster.get("pods", "-n", ns, "-l", f"walras.dev/job={name}")["items"]
        pods = {p["metadata"]["name"]: p for p in items}
        for want in planned:
            pod = pods.get(want["name"])
            if pod is None or not want.get("node") or pod["spec"].get("nodeName") != want["node"]:
                UNSETTLED.append(f"{ns}/{name}: {want} vs {None if pod is None else pod['spec'].get('nodeName')}")
                continue
            requests = pod["spec"]["containers"][0].get("resources", {}).get("requests", {})
            wanted = want.get("requests", requests)
            if {k: parse_quantity(v) for k, v in requests.items()} != {k: parse_quantity(v) for k, v in wanted.items()}:
                UNSETTLED.append(f"{ns}/{name}: requests {requests} vs {want.get('requests')}")
        out[(ns, name)] = planned
    return None if UNSETTLED else out


def test_every_policy_places_and_binds_the_example_jobs(cluster: Cluster) -> None:
    # Every example job exists before the operator starts, so its first plan (kopf starts the handlers once every
    # index holds the initial listing) prices them together. Applied while it runs, the jobs reach it in bursts, and
    # which of them runs then depends on the order they came in: a job that finds its pools full is not priced (the
    # planner's offer filter, rounds.py) and pods that run stay where they are (in a planner simulation of the 64
    # ways gpu.yaml's 7 jobs can arrive in bursts, 54 left one job or two with no pod; CI hit one such order).
    for path in sorted((EXAMPLES / "jobs").glob("*.yaml")):
        cluster.apply(path)
    operator = Operator(cluster, "direct").start()
    try:
        try:
            planned = wait_until(lambda: settled(cluster), 120, "every example job bound to its planned nodes")
            if cluster.real:  # Running on the kubelet stand-in, no node over-committed, no pod rejected
                wait_until(lambda: not violations(cluster), 60, "every planned pod Running, nothing over-committed")
        except AssertionError as exc:
            problems = violations(cluster) if cluster.real else []
            raise AssertionError(f"{exc}: {UNSETTLED} {problems}\n{operator.output()[-3000:]}") from None
    finally:
        operator.stop()
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in NODES}
    bound: dict[str, int] = {}
    for pods in planned.values():
        for pod in pods:
            pool = next(p for p in POOLS if p["metadata"]["name"] == pod["pool"])
            selector = pool["spec"]["nodeSelector"]
            assert all(labels[pod["node"]].get(k) == v for k, v in selector.items()), (pod, selector)
            bound[pod["pool"]] = bound.get(pod["pool"], 0) + 1
    policies = {p["metadata"]["name"]: p["spec"]["policy"]["type"] for p in POOLS}
    assert {policies[name] for name, count in bound.items() if count} == {"throughput", "fair", "utility", "colocation"}
    for pool in POOLS:
        status = cluster.get("resourcepool", pool["metadata"]["name"]).get("status") or {}
        assert status.get("nodeCount", 0) >= 1 and float(status.get("price", -1)) >= 0, status
