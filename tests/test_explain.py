"""Status that agrees with the pods, replicas granted said plainly, and ``walras explain`` (issue 28).

One prepared cluster per blocking rule (docs/troubleshooting.md's reason table), each small enough that its numbers
are computed by hand in the test (free units, shortfalls, degree limits, the market's price of a symmetric log
market, a linear job's bid), then compared with what the plan's status phase wrote and what ``walras explain``
prints. ``walras check`` flags a status whose phase its pods contradict (:mod:`walras.planner.invariants`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_planner import job, node, pool
from walras.cli import main
from walras.kube.decode import cluster_from
from walras.planner import Snapshot
from walras.planner.invariants import check_cluster
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL, Plan

from tests.planning import build_plan

GPU = "nvidia.com/gpu"


def gpu_node(name: str, label: str = "a", gpus: int = 4, cpu: str = "16", **extra: Any) -> dict[str, Any]:
    return node(name, {"gpu": label}, **{GPU: str(gpus), "cpu": cpu, "memory": "64Gi", "pods": "110"}, **extra)


def foreign(name: str, on: str, gpus: float) -> dict[str, Any]:
    """A pod Walras does not manage, bound and running, holding ``gpus``."""
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "other", "uid": f"uid-{name}"},
            "spec": {"nodeName": on, "containers": [{"name": "c", "resources": {"requests": {GPU: f"{gpus:g}"}}}]},
            "status": {"phase": "Running"}}


def managed(name: str, job_name: str, pool_name: str, on: str | None, phase: str, gpus: int = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {GPU: str(gpus)}}}]}
    if on is not None:
        spec["nodeName"] = on
    return {"kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                         "labels": {LABEL_JOB: job_name, LABEL_POOL: pool_name, LABEL_MANAGED: "true"}},
            "spec": spec, "status": {"phase": phase, **({"startTime": "2026-11-25T12:00:10Z"} if on else {})}}


def plan_of(nodes: list[Any], pools: list[Any], jobs: list[Any], pods: list[Any] = ()) -> Plan:  # type: ignore[assignment]
    return build_plan(cluster_from(Snapshot(nodes=tuple(nodes), pods=tuple(pods), pools=tuple(pools),
                                            jobs=tuple(jobs))))


def conditions(plan: Plan, name: str) -> dict[str, Any]:
    return {c.type: c for c in plan.jobs[("ml", name)].conditions}


def only_blocker(plan: Plan, name: str) -> Any:
    (blocker,) = plan.jobs[("ml", name)].blockers
    return blocker


# --- one prepared cluster per rule ----------------------------------------------------------------------------------


def test_no_ready_node() -> None:
    """The issue's "no nodes at all -> 'no room'": now the pool says it matches no Ready node."""
    down = gpu_node("v0", "v100")
    down["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    plan = plan_of([down], [pool("v100", "v100")], [job("j", {"v100": 1.0}, count=2)])
    b = only_blocker(plan, "j")
    assert (b.pool, b.reason, b.replicas) == ("v100", "NoReadyNode", 2)
    assert b.message == ("pool 'v100' matches no Ready node (1 node(s) match its nodeSelector, none Ready and "
                         "schedulable)")
    cond = conditions(plan, "j")
    assert (cond["ReplicasGranted"].status, cond["ReplicasGranted"].reason) == ("False", "NoReadyNode")
    assert cond["ReplicasGranted"].message.startswith("granted 0 of 2 replica(s)")
    assert cond["Scheduled"].reason == "NoReadyNode" and "room" not in cond["Scheduled"].message
    empty = plan_of([], [pool("v100", "v100")], [job("j", {"v100": 1.0}, count=2)])
    assert only_blocker(empty, "j").message == "pool 'v100' matches no Ready node (no node matches its nodeSelector)"
    assert plan.jobs[("ml", "j")].phase == "Pending"


def test_no_eligible_node() -> None:
    tainted = gpu_node("a0")
    tainted["spec"]["taints"] = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
    # a0 is tainted, a1 is not the node the template selects: no Ready node of the pool admits the pod
    template = {"spec": {"nodeSelector": {"kubernetes.io/hostname": "a0"}, "containers": [{"name": "c", "image": "x"}]}}
    plan = plan_of([tainted, gpu_node("a1")], [pool("a", "a")], [job("j", {"a": 1.0}, count=1, template=template)])
    b = only_blocker(plan, "j")
    assert (b.reason, b.replicas) == ("NoEligibleNode", 1)
    assert b.message == ("none of the 2 Ready node(s) of pool 'a' admits the pod (taints, nodeSelector, node "
                         "affinity)")
    assert plan.jobs[("ml", "j")].phase == "Unschedulable"


def test_too_large() -> None:
    # 32 cpu asked per pod, the pool's only node allocates 16
    plan = plan_of([gpu_node("a0")], [pool("a", "a")], [job("j", {"a": 1.0}, count=1, resources={"cpu": "32"})])
    b = only_blocker(plan, "j")
    assert b.reason == "TooLarge"
    assert b.message == "the pod requests more than the largest node of pool 'a' may allocate: cpu 32 > 16"


def test_degree_limit_with_a_free_gpu_is_not_insufficient_capacity() -> None:
    """The issue's case: degreeLimit 2 on a node with 8 GPUs: 2 pods placed, 6 GPUs free, 2 replicas wait for a
    slot, not for capacity."""
    plan = plan_of([gpu_node("a0", gpus=8)], [pool("a", "a", degreeLimit=2)], [job("j", {"a": 1.0}, count=4)])
    jp = plan.jobs[("ml", "j")]
    assert jp.replicas == {"a": 2} and jp.wanted == {"a": 4}
    b = only_blocker(plan, "j")
    assert (b.reason, b.replicas) == ("DegreeLimited", 2)
    assert b.message == ("1 node(s) of pool 'a' have room for the pod but no pod slot under its degree limit of 2 "
                         "Walras pod(s) per node")
    cond = conditions(plan, "j")
    assert cond["ReplicasPlaceable"].reason == "DegreeLimited" and cond["Scheduled"].reason == "DegreeLimited"
    assert "InsufficientCapacity" not in {c.reason for c in jp.conditions}
    assert plan.pools["a"].free == 8 - 2 and plan.pools["a"].degree_limit == 2


def test_cpu_fit() -> None:
    # 6 cpu per pod on a 16-cpu node with 4 GPUs: 2 pods fit (12 cpu), a third lacks 6 - 4 = 2 cpu
    plan = plan_of([gpu_node("a0")], [pool("a", "a")], [job("j", {"a": 1.0}, count=4, resources={"cpu": "6"})])
    jp = plan.jobs[("ml", "j")]
    assert sum(jp.replicas.values()) == 2
    b = only_blocker(plan, "j")
    assert (b.reason, b.replicas) == ("InsufficientCpu", 2)
    assert b.message == ("1 node(s) of pool 'a' have the 1 nvidia.com/gpu a pod needs but not its other requests; "
                         "on the best node a0: cpu short by 2")


def test_memory_fit() -> None:
    # 40Gi per pod on a 64Gi node: one fits, the next lacks 40 - 24 = 16Gi
    plan = plan_of([gpu_node("a0")], [pool("a", "a")], [job("j", {"a": 1.0}, count=2, resources={"memory": "40Gi"})])
    b = only_blocker(plan, "j")
    assert (b.reason, b.replicas) == ("InsufficientMemory", 1)
    assert b.message.endswith("on the best node a0: memory short by 16Gi")


def test_fragmented() -> None:
    # two nodes with 1 GPU free each; a pod needs 2
    nodes = [gpu_node("a0", gpus=2), gpu_node("a1", gpus=2)]
    plan = plan_of(nodes, [pool("a", "a")], [job("j", {"a": 1.0}, count=1, demand=2)],
                   [foreign("f0", "a0", 1), foreign("f1", "a1", 1)])
    b = only_blocker(plan, "j")
    assert b.reason == "Fragmented"
    assert b.message == ("pool 'a' has 2 nvidia.com/gpu free in total but no node has the 2 a pod needs (at most 1 "
                         "on one node)")


def test_insufficient_capacity() -> None:
    # 3 GPUs, 2 held by a foreign pod: 1 free; 3 replicas of 1 GPU: 1 placed, 2 need 2 GPUs, 0 free after the plan.
    # The market sells only what can be placed (1); the integral fill reports the 2 the job still asks for as wanted
    # and unplaced (as the degree limit's), so the rule is said where they wait: ReplicasPlaceable and Scheduled.
    plan = plan_of([gpu_node("a0", gpus=3)], [pool("a", "a")], [job("j", {"a": 1.0}, count=3)],
                   [foreign("f0", "a0", 2)])
    jp = plan.jobs[("ml", "j")]
    assert jp.replicas == {"a": 1} and jp.wanted == {"a": 3}
    b = only_blocker(plan, "j")
    assert (b.reason, b.replicas) == ("InsufficientCapacity", 2)
    assert b.message == ("pool 'a' has 0 nvidia.com/gpu free on the 1 node(s) the pod may use; 2 replica(s) need 2 "
                         "(2 more needed)")
    cond = conditions(plan, "j")
    assert (cond["ReplicasPlaceable"].status, cond["ReplicasPlaceable"].reason) == ("False", "InsufficientCapacity")
    assert cond["ReplicasPlaceable"].message == f"2 wanted replica(s) have no node: 2 in pool 'a': {b.message}"
    assert (cond["Scheduled"].status, cond["Scheduled"].reason) == ("False", "InsufficientCapacity")
    assert cond["Scheduled"].message == "1 of 3 wanted replica(s) placed, 0 running"
    assert plan.pools["a"].free == 0


def test_pool_capacity() -> None:
    # spec.capacity 2 on a node of 4 GPUs: 2 granted, 2 GPUs free on the node but none left to sell
    plan = plan_of([gpu_node("a0")], [pool("a", "a", capacity=2)], [job("j", {"a": 1.0}, count=4)])
    b = only_blocker(plan, "j")
    assert (b.reason, b.replicas) == ("PoolCapacity", 2)
    assert b.message == ("pool 'a' sells at most spec.capacity 2 nvidia.com/gpu, 2 in use: 0 left, a replica needs 1")


def market_cluster() -> tuple[list[Any], list[Any], list[Any]]:
    """4 GPUs; three log jobs of 2 replicas (a = 1) and one linear job of 1 replica with a = 0.1 (weight 1).

    By hand: the log jobs share the pool, each ``x = 2/3`` (``2 x_1 + 2 x_2 + 2 x_3 <= 4``), ``t = 2/3``; the price
    is ``u'(t) a / (N d) = (3/2) / 2 = 0.75``; the linear job's bid ``a / (N d) = 0.1 < 0.75`` gets nothing. Each log
    job's ``N x = 4/3`` rounds to 1 replica: 3 GPUs used, 1 free. The integral fill gives the free GPU to the replica
    of largest utility gain: a log job's second (``log 1 - log 1/2 = 0.69``) beats the linear job's (0.1); the log
    jobs tie, the first row (log0) takes it. The pool is then full: log1, log2 and lin still ask for one replica each
    and wait for capacity (InsufficientCapacity); at 2 wanted replicas a log job bids ``(1 / 1) / 2 = 0.5``."""
    nodes = [gpu_node("a0")]
    pools = [pool("a", "a")]
    jobs = [job(f"log{k}", {"a": 1.0}, count=2) for k in range(3)]
    for k, j in enumerate(jobs):
        j["metadata"]["creationTimestamp"] = f"2026-11-25T12:0{k}:00Z"
    jobs.append(job("lin", {"a": 0.1}, count=1, utility={"type": "linear"}))
    jobs[-1]["metadata"]["creationTimestamp"] = "2026-11-25T11:00:00Z"
    return nodes, pools, jobs


def test_the_fill_gives_the_free_gpu_and_the_rest_wait_for_capacity() -> None:
    """The market cluster (see there): the GPU rounding left free goes to a log job's second replica; nothing is
    idle, so every job short of replicas names the pool's capacity, with the plan's numbers."""
    plan = plan_of(*market_cluster())
    price = plan.pools["a"].price
    assert price == pytest.approx(0.75, rel=2e-3) and plan.pools["a"].free == 0
    assert plan.jobs[("ml", "log0")].replicas == {"a": 2} and plan.jobs[("ml", "log0")].blockers == ()
    assert plan.jobs[("ml", "log0")].units == {"a": 2.0}
    assert plan.jobs[("ml", "log0")].spend == {"a": pytest.approx(2 * price)}
    for name in ("log1", "log2"):
        jp = plan.jobs[("ml", name)]
        assert jp.wanted == {"a": 2} and jp.replicas == {"a": 1} and jp.bids == {"a": pytest.approx(0.5)}
        assert jp.units == {"a": 1.0} and jp.spend == {"a": pytest.approx(price)}
        b = only_blocker(plan, name)
        assert (b.pool, b.reason, b.replicas) == ("a", "InsufficientCapacity", 1)
        assert b.message == ("pool 'a' has 0 nvidia.com/gpu free on the 1 node(s) the pod may use; 1 replica(s) need 1 "
                             "(1 more needed)")
    lin = plan.jobs[("ml", "lin")]
    assert lin.replicas == {} and lin.bids == {"a": pytest.approx(0.1)}
    assert (only_blocker(plan, "lin").reason, only_blocker(plan, "lin").replicas) == ("InsufficientCapacity", 1)


def test_a_zero_bid_is_no_marginal_utility_not_price_above_bid() -> None:
    """Room, and a job whose marginal utility per unit is 0: a target-priority job (a = 1, 4 replicas, target 0.5)
    reaches its target at 2 replicas (``t = 1 * 2 / 4``); beyond it its bid is 0. The fill adds no replica of zero
    value, so 2 GPUs stay free, unsold (price 0), and the 2 other replicas are not granted: not because of the price
    (it is 0) but because they add nothing to the job (``NoMarginalUtility``; this was ``PriceAboveBid``, price 0 at
    or above bid 0, before issue 28's wrinkle (b))."""
    saturated = job("t", {"a": 1.0}, count=4, utility={"type": "target-priority", "target": 0.5})
    plan = plan_of([gpu_node("a0")], [pool("a", "a")], [saturated])
    jp = plan.jobs[("ml", "t")]
    assert jp.replicas == {"a": 2} and jp.wanted == {"a": 2} and jp.bids == {"a": 0.0}
    assert plan.pools["a"].price == pytest.approx(0.0, abs=1e-9) and plan.pools["a"].free == 2
    b = only_blocker(plan, "t")
    assert (b.pool, b.reason, b.replicas) == ("a", "NoMarginalUtility", 2)
    assert b.message == ("one more replica in pool 'a' adds nothing to the job's target-priority utility (its bid is "
                         "0 per nvidia.com/gpu at 2 granted replica(s)): 2 of its 4 replica(s) have no value to it")
    cond = conditions(plan, "t")
    assert (cond["ReplicasGranted"].status, cond["ReplicasGranted"].reason) == ("False", "NoMarginalUtility")
    assert cond["ReplicasGranted"].message.startswith("granted 2 of 4 replica(s): a=2; 2 not granted: one more ")
    assert (cond["Scheduled"].status, cond["Scheduled"].reason) == ("True", "AllPodsPlaced")
    assert [c for c in plan.pools["a"].conditions if c.type == "CapacityIdle"] == []


def test_market_share() -> None:
    """Room, a bid above the price, and a share that rounds to fewer replicas: a gang (elastic, min 3, max 4, log)
    and a log job of 2 replicas on 4 GPUs. By hand: ``4 x_g + 2 x_h <= 4`` with equal spending, ``x_g = 1/2``,
    ``x_h = 1``, price ``u'(1) a / (N d) = 1 / 2 = 0.5``. The gang's share ``N x = 2`` is below its minimum 3 and
    rounds to 0 replicas (the fill leaves a gang below its minimum out), so 2 GPUs stay free; at 0 granted its log
    bid is unbounded."""
    gang = job("g", {"a": 1.0}, replicas={"min": 3, "max": 4})
    plan = plan_of([gpu_node("a0")], [pool("a", "a")], [gang, job("h", {"a": 1.0}, count=2)])
    price = plan.pools["a"].price
    assert price == pytest.approx(0.5, rel=2e-3) and plan.pools["a"].free == 2
    assert plan.jobs[("ml", "h")].replicas == {"a": 2} and plan.jobs[("ml", "h")].blockers == ()
    jp = plan.jobs[("ml", "g")]
    assert jp.replicas == {} and jp.wanted == {} and jp.bids == {"a": None}
    assert jp.allocation == {"a": pytest.approx(0.5, rel=2e-3)}
    b = only_blocker(plan, "g")
    assert (b.pool, b.reason, b.replicas) == ("a", "MarketShare", 4)
    assert b.message == (f"the market's share of pool 'a' for the job, 2 replica(s), rounds to 0; price {price:.4g} "
                         "per nvidia.com/gpu, bid unbounded; 2 nvidia.com/gpu free on 1 node(s) with a slot")
    cond = conditions(plan, "g")
    assert (cond["ReplicasGranted"].status, cond["ReplicasGranted"].reason) == ("False", "MarketShare")
    assert (cond["Scheduled"].status, cond["Scheduled"].reason) == ("False", "MarketShare")


def test_queue_position_is_priority_then_bid_then_age() -> None:
    nodes, pools, jobs = market_cluster()
    plan = plan_of(nodes, pools, jobs)
    # log0 has all its replicas (the fill); the others wait; equal weights; log1 and log2 bid 0.5 (the older first),
    # the linear one 0.1 (although the oldest)
    assert [plan.jobs[("ml", n)].queue_position for n in ("log0", "log1", "log2", "lin")] == [None, 1, 2, 3]
    assert {jp.waiting for jp in plan.jobs.values() if jp.queue_position is not None} == {3}
    assert plan.jobs[("ml", "log0")].waiting == 0
    jobs[3]["spec"]["weight"] = 5  # priority first
    plan = plan_of(nodes, pools, jobs)
    assert plan.jobs[("ml", "lin")].queue_position == 1


def test_a_healthy_job_has_no_false_condition_and_no_empty_event() -> None:
    plan = plan_of([gpu_node("a0")], [pool("a", "a")], [job("j", {"a": 1.0}, count=2)])
    jp = plan.jobs[("ml", "j")]
    assert [c for c in jp.conditions if c.status == "False"] == []
    assert conditions(plan, "j")["ReplicasGranted"].message == "granted 2 of 2 replica(s): a=2"
    assert jp.blockers == () and jp.queue_position is None and jp.reason == ""
    assert not [e for e in plan.events if "none (wanted 0)" in e.message]
    (planned,) = [e for e in plan.events if e.reason == "Planned"]
    assert planned.message.startswith("Placed 2 of 2 replica(s): a=2; granted 2;")
    # a job given nothing raises no "Planned" event at all
    none = plan_of([], [pool("a", "a")], [job("j", {"a": 1.0}, count=4)])
    assert not [e for e in none.events if e.reason == "Planned"]


# --- phase = pods ---------------------------------------------------------------------------------------------------


def test_phase_is_the_pods() -> None:
    """A job whose only pod is Running is Running, even while a second replica waits; one whose pods are bound but
    not started is Pending."""
    nodes = [gpu_node("a0", gpus=1)]
    pods = [managed("j-a-0", "j", "a", "a0", "Running")]
    plan = plan_of(nodes, [pool("a", "a")], [job("j", {"a": 1.0}, count=2)], pods)
    jp = plan.jobs[("ml", "j")]
    assert jp.phase == "Running" and jp.running == 1 and jp.bound == 1 and jp.count == 2
    assert jp.first_running is not None
    starting = plan_of(nodes, [pool("a", "a")], [job("j", {"a": 1.0}, count=1)],
                       [managed("j-a-0", "j", "a", "a0", "Pending")])
    assert starting.jobs[("ml", "j")].phase == "Pending" and starting.jobs[("ml", "j")].bound == 1


def test_check_flags_a_phase_its_pods_contradict() -> None:
    nodes = [gpu_node("a0", gpus=1)]
    pods = [managed("j-a-0", "j", "a", "a0", "Running")]
    said = job("j", {"a": 1.0}, count=1)
    said["status"] = {"phase": "Pending", "replicas": {"a": 1}, "observedGeneration": 3}
    violations = check_cluster(cluster_from(Snapshot(nodes=tuple(nodes), pods=tuple(pods), pools=(pool("a", "a"),),
                                                     jobs=(said,))))
    assert [(v.kind, v.message) for v in violations] == [
        ("StatusDisagrees", "status says phase Pending, but 1 pod(s) of the job are Running")]
    said["status"]["phase"] = "Running"
    assert check_cluster(cluster_from(Snapshot(nodes=tuple(nodes), pods=tuple(pods), pools=(pool("a", "a"),),
                                               jobs=(said,)))) == []
    idle = [managed("j-a-0", "j", "a", "a0", "Pending")]
    violations = check_cluster(cluster_from(Snapshot(nodes=tuple(nodes), pods=tuple(idle), pools=(pool("a", "a"),),
                                                     jobs=(said,))))
    assert [v.message for v in violations] == ["status says phase Running, but no pod of the job is Running"]


# --- walras explain -------------------------------------------------------------------------------------------------


@pytest.fixture
def market_dir(tmp_path: Path) -> Path:
    nodes, pools, jobs = market_cluster()
    for doc in nodes + pools + jobs:
        doc.setdefault("apiVersion", "v1" if doc["kind"] == "Node" else "walras.dev/v1alpha1")
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump_all(nodes + pools + jobs))
    return tmp_path


def test_explain_json_carries_the_plans_numbers(market_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "ml/lin", "--no-tenants", "-f", str(market_dir), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    plan = plan_of(*market_cluster())
    jp = plan.jobs[("ml", "lin")]
    # lin: the market sells it nothing (bid 0.1 < price 0.75); what it still asks for waits for capacity (wanted)
    assert doc["replicas"] == {"count": 1, "granted": 1, "placed": 0, "bound": 0, "running": 0}
    assert doc["pools"]["a"]["bid"] == pytest.approx(0.1) and doc["pools"]["a"]["price"] == plan.pools["a"].price
    assert doc["blocked"] == [b.to_dict() for b in jp.blockers] and doc["reason"] == "InsufficientCapacity"
    assert doc["reason"] == jp.reason
    assert doc["queue"]["position"] == 3 and doc["queue"]["waiting"] == 3
    assert doc["asked"]["throughput"] == {"a": 0.1} and doc["asked"]["replicas"] == 1
    assert main(["explain", "ml/log1", "--no-tenants", "-f", str(market_dir), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["pools"]["a"]["units"] == 1.0 and doc["pools"]["a"]["spend"] == pytest.approx(0.75, rel=2e-3)
    assert doc["pools"]["a"]["bid"] == pytest.approx(0.5) and doc["queue"]["position"] == 1


def test_explain_text(market_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "ml/lin", "--no-tenants", "-f", str(market_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("FungibleJob ml/lin: Pending (0 of 1 replica(s) running, 0 placed, 1 granted)")
    assert ("1 replica(s), pool a: InsufficientCapacity: pool 'a' has 0 nvidia.com/gpu free on the 1 node(s) the pod "
            "may use; 1 replica(s) need 1 (1 more needed)") in out
    assert ("Queue: position 3 of 3 waiting job(s) (order: priority (PriorityClass, high first), then spec.weight, "
            "then bid") in out
    price = f"{plan_of(*market_cluster()).pools['a'].price:.4g}"
    row = next(line for line in out.splitlines() if line.strip().startswith("a "))
    assert row.split()[:8] == ["a", "nvidia.com/gpu", "1", "0", price, "0", "0", "0.1"]


def test_explain_an_unknown_job_suggests_the_near_names(market_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "ml/lni", "-f", str(market_dir)]) == 2
    assert "no FungibleJob ml/lni; did you mean ml/lin" in capsys.readouterr().err
    assert main(["explain", "a/b/c", "-f", str(market_dir)]) == 2


def test_the_reason_table_documents_every_reason() -> None:
    """docs/troubleshooting.md has a row per blocking rule (:data:`walras.planner.model.REASONS`) and names every
    condition reason the product writes (read from the source)."""
    import re

    from walras.planner.model import REASONS

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "troubleshooting.md").read_text()
    rows = set(re.findall(r"^\| `([A-Za-z]+)` \|", text, re.M))
    assert set(REASONS) <= rows, set(REASONS) - rows
    written: set[str] = set()
    for path in (root / "operator" / "walras" / "planner").rglob("*.py"):
        written |= set(re.findall(r'Condition\(\s*"[A-Za-z]+",\s*"[A-Za-z]+",\s*"([A-Za-z]+)"', path.read_text()))
    status = (root / "operator" / "walras" / "planner" / "status.py").read_text()
    measured = set(re.findall(r'return "([A-Z][A-Za-z]+)", [{(]', status))
    measured |= set(re.findall(r'Blocker\([^,()]+, "([A-Z][A-Za-z]+)"', status))
    assert {"NoReadyNode", "PriceAboveBid", "NoMarginalUtility"} <= measured  # the source is really read
    measured.discard("Room")  # _measure's "there is room": the market's rules follow
    assert measured <= set(REASONS), measured - set(REASONS)  # every blocking rule the status phase measures
    pool_only = {"SelectorOverlap", "NodesReady", "NoNodes", "MissingType", "Valid", "PoolsValid", "ProfileNotFound"}
    assert "AllGranted" in written and "MarketRepriced" in written  # the source is really read
    missing = {r for r in written - pool_only if f"`{r}`" not in text}
    assert missing == set(), missing


def test_explain_reads_a_live_cluster(control_plane: Any, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``walras explain --kubeconfig`` on the real kube-apiserver (the kubectl plugin ``kubectl-walras`` runs the
    same ``main``): a pool with ``degreeLimit: 2`` on a node with 8 GPUs grants 4 replicas and places 2; the other 2
    are blocked by the degree limit, not by capacity."""
    root = Path(__file__).resolve().parents[1]
    control_plane.kubectl("apply", "-f", str(root / "crds"))
    label, name = f"explain-{namespace}", f"explain-{namespace}"
    control_plane.ready_node(name, {"gpu": label}, {GPU: "8", "cpu": "16", "memory": "64Gi", "pods": "110"})
    the_pool = pool(name, label, degreeLimit=2)
    the_job = job("dl", {name: 1.0}, count=4, ns=namespace)
    for doc in (the_pool, the_job):
        doc["apiVersion"] = "walras.dev/v1alpha1"
        doc["metadata"].pop("generation", None)
    try:
        control_plane.apply_objects([the_pool, the_job])
        capsys.readouterr()
        assert main(["explain", f"{namespace}/dl", "--kubeconfig", str(control_plane.kubeconfig), "-o", "json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["replicas"]["granted"] == 4 and doc["replicas"]["placed"] == 2
        assert [(b["pool"], b["reason"], b["replicas"]) for b in doc["blocked"]] == [(name, "DegreeLimited", 2)]
        assert "degree limit of 2" in doc["blocked"][0]["message"]
    finally:
        control_plane.kubectl("delete", "fungiblejob", "dl", "-n", namespace, "--ignore-not-found", check=False)
        control_plane.kubectl("delete", "resourcepool", name, "--ignore-not-found", check=False)
        control_plane.kubectl("delete", "node", name, "--ignore-not-found", check=False)


def test_kubectl_finds_the_plugin() -> None:
    """``kubectl walras explain ...`` works: the distribution installs a ``kubectl-walras`` script (pyproject's
    ``[project.scripts]``, the same ``walras.cli:main``) that the real kubectl finds on the PATH as a plugin."""
    import os
    import shutil
    import subprocess
    import sys

    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "kubectl is installed by `make tools`"
    bindir = Path(sys.executable).parent
    assert (bindir / "kubectl-walras").exists(), "the kubectl-walras script is installed (`make install`)"
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    listed = subprocess.run([kubectl, "plugin", "list"], env=env, capture_output=True, text=True, timeout=60)
    assert "kubectl-walras" in listed.stdout, listed.stdout + listed.stderr
    out = subprocess.run([kubectl, "walras", "explain", "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "NAMESPACE/NAME" in out.stdout or "namespace/name" in out.stdout.lower(), out.stdout
