"""Two wrinkles of the reasons found in session 14 (issue 28): a pool said ``CapacityIdle`` / ``IdleWhilePriced``
while no job that may use it values another pod there, and a job whose next replica adds nothing to its utility
(a zero bid) told ``InsufficientCapacity`` or ``PriceAboveBid``. Each case is small enough to work out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_explain import conditions, gpu_node, job, plan_of, pool
from walras.cli import main


def saturated_cluster() -> tuple[list, list, list]:
    """5 GPUs; a target-priority job ``t`` (throughput 1, 4 replicas, target 0.5) and a log job ``h`` of 2 replicas.

    By hand: ``t`` reaches its target at 2 replicas (``t = 1 * 2 / 4 = 0.5``); beyond it, its marginal utility is 0
    (its bid ``u'(t) a / (N d) = 0``). ``h`` runs its 2. 4 GPUs are used, 1 is free, and only ``t`` could take it:
    no job values another pod in the pool."""
    t = job("t", {"a": 1.0}, count=4, utility={"type": "target-priority", "target": 0.5})
    return [gpu_node("a0", gpus=5)], [pool("a", "a")], [t, job("h", {"a": 1.0}, count=2)]


def test_no_capacity_idle_when_no_job_values_another_pod() -> None:
    plan = plan_of(*saturated_cluster())
    assert plan.jobs[("ml", "t")].replicas == {"a": 2} and plan.jobs[("ml", "h")].replicas == {"a": 2}
    assert plan.pools["a"].free == 1
    assert plan.pools["a"].price > 1e-9  # the market's price, within its tolerance: the case the rule misread
    assert [c for c in plan.pools["a"].conditions if c.type == "CapacityIdle"] == []
    assert not [e for e in plan.events if e.reason == "IdleWhilePriced"]


def test_a_job_whose_next_replica_adds_nothing_has_its_own_reason() -> None:
    plan = plan_of(*saturated_cluster())
    jp = plan.jobs[("ml", "t")]
    assert jp.bids == {"a": 0.0}
    (b,) = jp.blockers
    assert (b.pool, b.reason, b.replicas) == ("a", "NoMarginalUtility", 2)
    assert b.message == ("one more replica in pool 'a' adds nothing to the job's target-priority utility (its bid "
                         "is 0 per nvidia.com/gpu at 2 granted replica(s)): 2 of its 4 replica(s) have no value to it")
    cond = conditions(plan, "t")
    assert (cond["ReplicasGranted"].status, cond["ReplicasGranted"].reason) == ("False", "NoMarginalUtility")
    assert (cond["Scheduled"].status, cond["Scheduled"].reason) == ("True", "AllPodsPlaced")
    assert jp.reason == "NoMarginalUtility"


def test_only_the_replicas_the_job_values_wait_for_capacity() -> None:
    """4 GPUs held by a gang of 4; a target-priority job of 4 replicas with target 0.25 values only its first replica
    (``t = 1 * 1 / 4 = 0.25``): that one waits for capacity, the other 3 are of no value to it."""
    gang = job("g", {"a": 1.0}, replicas={"count": 4, "gang": True})
    t = job("t", {"a": 1.0}, count=4, utility={"type": "target-priority", "target": 0.25})
    plan = plan_of([gpu_node("a0")], [pool("a", "a")], [gang, t])
    jp = plan.jobs[("ml", "t")]
    assert plan.jobs[("ml", "g")].replicas == {"a": 4} and jp.replicas == {}
    assert jp.wanted == {"a": 1}
    assert [(b.pool, b.reason, b.replicas) for b in jp.blockers] == [
        ("a", "InsufficientCapacity", 1), ("a", "NoMarginalUtility", 3)]
    assert jp.blockers[0].message == ("pool 'a' has 0 nvidia.com/gpu free on the 1 node(s) the pod may use; 1 "
                                      "replica(s) need 1 (1 more needed)")
    cond = conditions(plan, "t")
    assert cond["ReplicasPlaceable"].reason == "InsufficientCapacity"
    said = cond["ReplicasPlaceable"].message
    assert said == f"1 wanted replica(s) have no node: 1 in pool 'a': {jp.blockers[0].message}"
    assert (cond["ReplicasGranted"].status, cond["ReplicasGranted"].reason) == ("False", "NoMarginalUtility")


def test_explain_says_no_marginal_utility(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pools, jobs = saturated_cluster()
    for doc in nodes + pools + jobs:
        doc.setdefault("apiVersion", "v1" if doc["kind"] == "Node" else "walras.dev/v1alpha1")
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump_all(nodes + pools + jobs))
    assert main(["explain", "ml/t", "--no-tenants", "-f", str(tmp_path), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(b["reason"], b["replicas"]) for b in doc["blocked"]] == [("NoMarginalUtility", 2)]
    assert doc["reason"] == "NoMarginalUtility"
    assert main(["explain", "ml/t", "--no-tenants", "-f", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "2 replica(s), pool a: NoMarginalUtility: one more replica in pool 'a' adds nothing" in out
