"""Quiet means quiet (issue 31), on the REAL control plane, counted by the API server: the real ``walras run`` process
on the project's example cluster (``examples/``, the example nodes played by the kubelet stand-in, the operator as
the chart's ServiceAccount), periodic plan every 3 s (``e2e/conftest.py``'s ``Operator``), as the issue's run went:

1. every example job placed and Running;
2. ``kubectl cordon gpu-p100-1`` (the issue's node), then the ``spec.capacity`` of the GPU pool that uses the most
   lowered to one GPU less than it uses, each followed by the cluster settling (no write over 3 plans in a row; the
   pool's status then shows the new capacity);
3. **two full quiet minutes** (:data:`QUIET_SECONDS`, about 40 periodic plans): the API server's audit log records
   **0 writes** by the operator's identity (every create, update, patch and delete of any ServiceAccount of
   ``walras-system``, pods, bindings, evictions, status patches and Events included: see
   ``tests.controlplane.AUDIT_POLICY``) except the renewals of the leader Lease (``coordination.k8s.io`` Lease
   ``walras``: the leader election's heartbeat, a write by design, which the issue's "0 writes" does not mean);
   every plan of the window took the previous solve (``walras_solver_reused_total`` grows by the plans counted,
   ``walras_pool_price`` samples bit-identical as text) and no pod, job, pool or Event object of the example
   namespaces changed or appeared (their resourceVersions, a second observation beside the audit log).

Writes are counted on the API server's side (its audit log), not by the operator's own client or counters: a write
through any path of the operator (kopf's own patches and Events included) is seen. The module needs the session's
control plane (the audit log is its API server's); under ``CI=true`` missing binaries fail the run
(``e2e/conftest.py``), elsewhere (emulated API, ``WALRAS_E2E_KUBECONFIG``) it is skipped.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.conftest import ROOT, Cluster, Operator, connect, wait_until
from e2e.invariants import violations
from e2e.test_e2e_policies import EXAMPLES, NAMESPACES, NODES, UNSETTLED, settled
from tests.controlplane import CHART_NAMESPACE, AuditedWrite

pytestmark = pytest.mark.e2e
#: The issue's window: two minutes of wall clock with nothing changing.
QUIET_SECONDS = 120.0
#: The plan period of ``e2e.conftest.Operator`` (``--plan-period 3``).
PLAN_PERIOD = 3.0
CORDONED = "gpu-p100-1"
GPU_POOLS = ("k80", "p100", "v100")
#: The leader election's Lease (``walras run --peering``'s default name).
LEADER_LEASE = "walras"


@pytest.fixture(scope="module")
def cluster(kubectl_bin: str, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The session's real control plane with the CRDs, the example namespaces, nodes, profile, pools and jobs."""
    with tempfile.TemporaryDirectory(prefix="walras-e2e-quiet-") as tmp:
        c = connect(Path(tmp), kubectl_bin, request)
        try:
            if not c.real:
                pytest.skip("the writes are counted in the audit log of the session's own kube-apiserver")
            c.apply(ROOT / "crds")
            for ns in NAMESPACES:
                c.apply_text(json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            for ns in NAMESPACES:
                c.clear_jobs(ns)
            c.add_nodes(NODES)
            c.apply(EXAMPLES / "profile.yaml")
            c.apply(EXAMPLES / "pools.yaml")
            for path in sorted((EXAMPLES / "jobs").glob("*.yaml")):
                c.apply(path)
            yield c
        finally:
            if c.real:
                c.reset(NAMESPACES)
            c.close()


def operator_writes(writes: list[AuditedWrite]) -> list[AuditedWrite]:
    """The writes of the operator's identity (any ServiceAccount of the chart's namespace) but the leader Lease's."""
    prefix = f"system:serviceaccount:{CHART_NAMESPACE}:"
    return [w for w in writes if w.user.startswith(prefix)
            and not (w.resource == "leases" and w.name == LEADER_LEASE and w.namespace == CHART_NAMESPACE)]


def samples(operator: Operator) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The operator's ``/metrics``, one value per (sample name, sorted labels)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(operator.metrics()) for s in family.samples}


def price_lines(operator: Operator) -> list[str]:
    """The ``walras_pool_price`` samples as the operator renders them (the float's shortest exact text)."""
    return sorted(line for line in operator.metrics().splitlines() if line.startswith("walras_pool_price{"))


def plans(operator: Operator) -> float:
    return samples(operator).get(("walras_plans_total", (("result", "ok"),)), 0.0)


def versions(cluster: Cluster) -> dict[str, str]:
    """kind/namespace/name -> resourceVersion of every pod, Event and FungibleJob of the example namespaces and of
    every ResourcePool."""
    out = {}
    for ns in NAMESPACES:
        for item in cluster.get("pods,events,fungiblejobs", "-n", ns)["items"]:
            out[f"{item['kind']}/{ns}/{item['metadata']['name']}"] = item["metadata"]["resourceVersion"]
    for item in cluster.get("resourcepools")["items"]:
        out[f"ResourcePool/{item['metadata']['name']}"] = item["metadata"]["resourceVersion"]
    return out


def quiet_over(cluster: Cluster, operator: Operator, count: int) -> list[AuditedWrite]:
    """The operator's writes while it runs ``count`` plans (waited for; a plan every :data:`PLAN_PERIOD`)."""
    assert cluster.control_plane is not None
    mark, start = cluster.control_plane.audit_mark(), plans(operator)
    wait_until(lambda: plans(operator) >= start + count, count * PLAN_PERIOD + 30, f"{count} plans")
    return operator_writes(cluster.control_plane.audited_writes(mark))


def settle(cluster: Cluster, operator: Operator, what: str) -> None:
    """Wait until 3 plans in a row send no write (at most 3 minutes), failing with the last writes seen."""
    last: list[list[AuditedWrite]] = [[]]

    def calm() -> bool:
        last[0] = quiet_over(cluster, operator, 3)
        return not last[0]

    try:
        wait_until(calm, 180, f"the operator to settle after {what}", interval=0.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its last writes: {[str(w) for w in last[0]]}\n{operator.output()[-3000:]}") \
            from None


def test_two_quiet_minutes_after_a_cordon_and_a_capacity_change_send_no_write(cluster: Cluster) -> None:
    assert cluster.control_plane is not None
    operator = Operator(cluster, "direct").start()
    try:
        try:
            wait_until(lambda: settled(cluster), 120, "every example job bound to its planned nodes")
            wait_until(lambda: not violations(cluster), 60, "every planned pod Running, nothing over-committed")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {UNSETTLED} {violations(cluster)}\n{operator.output()[-3000:]}") from None
        settle(cluster, operator, "placing the example jobs")
        cluster.kc("cordon", CORDONED)
        settle(cluster, operator, f"cordoning {CORDONED}")
        used = {p: float(cluster.get("resourcepool", p)["status"]["used"]) for p in GPU_POOLS}
        shrunk = max(GPU_POOLS, key=lambda p: used[p])
        assert used[shrunk] >= 2, used
        cluster.kc("patch", "resourcepool", shrunk, "--type=merge", "-p",
                   json.dumps({"spec": {"capacity": used[shrunk] - 1}}))
        settle(cluster, operator, f"lowering {shrunk}'s capacity from {used[shrunk]:g} used to {used[shrunk] - 1:g}")
        assert float(cluster.get("resourcepool", shrunk)["status"]["capacity"]) == used[shrunk] - 1
        wait_until(lambda: not violations(cluster), 60, "every planned pod Running after the capacity change")

        before, prices, objects = samples(operator), price_lines(operator), versions(cluster)
        mark, started = cluster.control_plane.audit_mark(), time.monotonic()
        time.sleep(QUIET_SECONDS)
        writes = operator_writes(cluster.control_plane.audited_writes(mark))
        after, elapsed = samples(operator), time.monotonic() - started
        prices_after = price_lines(operator)
        changed = {k: v for k, v in versions(cluster).items() if objects.get(k) != v}
        assert operator.process is not None and operator.process.poll() is None, operator.output()[-3000:]
    finally:
        operator.stop()
    assert writes == [], f"{len(writes)} write(s) in {elapsed:.0f} quiet seconds: {[str(w) for w in writes]}"
    ran = after[("walras_plans_total", (("result", "ok"),))] - before[("walras_plans_total", (("result", "ok"),))]
    assert ran >= QUIET_SECONDS / PLAN_PERIOD * 0.75, f"the periodic plan ran: {ran:g} plans in {elapsed:.0f} s"
    reused = after[("walras_solver_reused_total", ())] - before[("walras_solver_reused_total", ())]
    assert reused == ran, f"{ran:g} plans of an unchanged cluster, {reused:g} of them reused the previous solve"
    assert len(prices) == 4 and prices_after == prices, "the four pools' prices bit-identical over the quiet window"
    assert changed == {}, f"objects changed or appeared over the quiet window: {changed}"
