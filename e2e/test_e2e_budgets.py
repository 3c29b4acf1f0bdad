"""End to end, Budgets (docs/budgets.md): the real ``walras run`` (tenants on by default) against the real control
plane, two tenants competing for the two GPU pools, one of which inflates its numbers (its job, planned honestly
first, becomes a linear job of weight 1e6 whose throughputs are multiplied by 1e8, within the schema's bound of 1e9):
the inflating tenant holds no more GPUs than it held when honest (within one pod of rounding) and the honest tenant
no fewer, each tenant spends at most its share (within
one pod's price: the placed plan rounds the market's fractions to whole pods), the Budget's status shows its units,
spend rate and spend, and the accumulated spend continues across a restart of the operator by (T5) from the status
alone."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from e2e.conftest import Cluster, Operator, wait_until

pytestmark = pytest.mark.e2e
NS, GREEDY = "e2e", "e2e-greedy"


def _job(name: str, namespace: str, throughput: dict[str, float], utility: dict[str, Any], replicas: int) -> str:
    return json.dumps({"apiVersion": "walras.dev/v1alpha1", "kind": "FungibleJob",
                       "metadata": {"name": name, "namespace": namespace},
                       "spec": {"throughput": throughput, "utility": utility, "demand": 1,
                                "replicas": {"count": replicas},
                                "template": {"spec": {"containers": [{"name": "c",
                                                                      "image": "registry.invalid/x:1"}]}}}})


@pytest.fixture(scope="module")
def setup(cluster: Cluster) -> Iterator[Cluster]:
    cluster.kc("create", "namespace", GREEDY, check=False)
    budget = {"apiVersion": "walras.dev/v1alpha1", "kind": "Budget", "metadata": {"name": "team-e2e"},
              "spec": {"share": 1, "namespaces": [NS]}}
    honest = {"e2e-v100": 3.0, "e2e-k80": 1.0}
    docs = [json.dumps(budget), _job("honest-a", NS, honest, {"type": "log"}, 8),
            _job("honest-b", NS, {"e2e-v100": 2.0, "e2e-k80": 1.5}, {"type": "log"}, 8),
            _job("greedy", GREEDY, honest, {"type": "log"}, 16)]  # honest first; the first test inflates it
    cluster.apply_text("\n---\n".join(docs))
    try:
        yield cluster
    finally:
        for ns in (NS, GREEDY):
            for name in [i["metadata"]["name"] for i in cluster.get("fungiblejobs", "-n", ns)["items"]]:
                cluster.kc("patch", "fungiblejob", name, "-n", ns, "--type=merge", "-p",
                           '{"metadata":{"finalizers":null}}', check=False)
                cluster.kc("delete", "fungiblejob", name, "-n", ns, "--wait=false", check=False)
            cluster.kc("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", check=False)
        cluster.kc("delete", "budget", "team-e2e", "--wait=false", check=False)


def _metric(text: str, name: str, budget: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'budget="{budget}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def _status(cluster: Cluster) -> dict[str, Any]:
    return dict(cluster.get("budget", "team-e2e").get("status") or {})


def _updated(status: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(status["spentUpdated"]).replace("Z", "+00:00")).timestamp()


def _units(text: str, budget: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("walras_budget_units{") and f'budget="{budget}"' in line:
            pool = line.split('pool="', 1)[1].split('"', 1)[0]
            out[pool] = float(line.rsplit(" ", 1)[1])
    return out


def _settled(cluster: Cluster, op: Operator) -> tuple[dict[str, float], dict[str, float]]:
    """Both tenants' units per pool once the greedy job's current generation is planned and the metrics 5 s apart
    agree (honest tenant, greedy tenant)."""
    def planned() -> tuple[dict[str, float], dict[str, float]] | None:
        job = cluster.get("fungiblejob", "greedy", "-n", GREEDY)
        if (job.get("status") or {}).get("observedGeneration") != job["metadata"]["generation"]:
            return None
        first = op.metrics()
        time.sleep(5.0)  # a few plans later
        again = op.metrics()
        now = _units(again, "team-e2e"), _units(again, f"namespace/{GREEDY}")
        if not now[1] or (_units(first, "team-e2e"), _units(first, f"namespace/{GREEDY}")) != now:
            return None
        return now
    return wait_until(planned, 120, "the greedy job planned and the units settled", interval=1.0)


def test_inflating_its_numbers_gains_a_tenant_nothing(setup: Cluster) -> None:
    cluster = setup
    op = Operator(cluster, "direct").start()  # tenants on by default
    try:
        honest, greedy = _settled(cluster, op)
        print(f"live, greedy planned honestly: team-e2e {honest}, namespace/{GREEDY} {greedy}")
        patch = {"spec": {"throughput": {"e2e-v100": 3.0e8, "e2e-k80": 1.0e8},
                          "utility": {"type": "linear", "weight": 1e6}}}
        cluster.kc("patch", "fungiblejob", "greedy", "-n", GREEDY, "--type=merge", "-p", json.dumps(patch))
        honest2, greedy2 = _settled(cluster, op)
        print(f"live, greedy inflated (linear, weight 1e6, throughputs x 1e8): team-e2e {honest2}, "
              f"namespace/{GREEDY} {greedy2}")
        assert sum(greedy2.values()) <= sum(greedy.values()) + 1, (greedy, greedy2)
        assert sum(honest2.values()) >= sum(honest.values()) - 1, (honest, honest2)
    finally:
        op.stop()


def test_two_tenants_compete_and_inflating_gains_nothing_and_spend_survives_a_restart(setup: Cluster) -> None:
    cluster = setup
    op = Operator(cluster, "direct").start()  # tenants on by default
    try:
        status = wait_until(lambda: _status(cluster) if _status(cluster).get("units") else None, 90,
                            "the Budget's status")
        assert {c["type"]: c["status"] for c in status["conditions"]}["Valid"] == "True"
        assert status["namespaces"] == [NS] and status["spendRate"] > 0 and status["spent"] >= 0
        prices = [float(cluster.get("resourcepool", p)["status"]["price"]) for p in ("e2e-v100", "e2e-k80")]
        def exported() -> str | None:
            text = op.metrics()
            found = _metric(text, "walras_budget_spend_rate_credits_per_hour", f"namespace/{GREEDY}")
            return text if found is not None else None

        text = wait_until(exported, 60, "the greedy tenant's metrics")
        for tenant in ("team-e2e", f"namespace/{GREEDY}"):
            rate = _metric(text, "walras_budget_spend_rate_credits_per_hour", tenant)
            units = [line for line in text.splitlines() if line.startswith("walras_budget_units{") and tenant in line]
            print(f"live: {tenant} spend {rate} credits/h, units {units}, prices v100/k80 {prices}")
            assert rate is not None and math.isfinite(rate)
            # its share (1 credit/h), within the market's 1 % and one pod's price of rounding
            assert rate <= 1.01 + max(prices), (tenant, rate, prices)
        held = status["units"]
        assert sum(held.values()) >= 4, held  # the honest tenant is not starved by the inflated job
        # restart: the spend continues from the status alone
        op.kill()
        before = _status(cluster)
        op = Operator(cluster, "direct").start()  # tenants on by default
        cluster.kc("delete", "fungiblejob", "greedy", "-n", GREEDY)  # the honest tenant's units change
        def written() -> dict[str, Any] | None:
            now = _status(cluster)
            return now if _updated(now) > _updated(before) else None

        try:
            after = wait_until(written, 120, "a Budget write after the restart")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; status {_status(cluster)}; operator log:\n{op.output()[-4000:]}") from None
        expected = before["spent"] + before["spendRate"] * (_updated(after) - _updated(before)) / 3600
        assert after["spent"] == pytest.approx(expected, rel=1e-6, abs=1e-9)
        assert after["spent"] >= before["spent"]
        print(f"live restart: spent {before['spent']} at {before['spentUpdated']} rate {before['spendRate']} -> "
              f"{after['spent']} at {after['spentUpdated']}")
    finally:
        op.stop()
