"""``walras explain`` for every blocking rule a FungibleJob can get (issue 28's evidence): one prepared cluster per
reason of :data:`walras.planner.model.REASONS`, written as the manifests ``walras explain -f`` reads, explained
offline through the CLI's own function, and checked for the reason and a number worked out by hand from the
cluster (free units, shortfalls, limits, caps). The reasons no single offline plan can produce are listed in
:data:`NOT_OFFLINE` with why (each has a live or multi-plan test of its own); the test fails if a reason is neither
covered nor listed. A job that waits is never told "Nothing blocks this job"."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_explain import foreign, gpu_node, job, pool
from walras.cli import main
from walras.planner.model import REASONS

Docs = list[dict[str, Any]]


def _no_usable_pool() -> Docs:
    return [gpu_node("a0"), pool("a", "a"), job("j", {"nope": 1.0}, count=2)]


def _no_usable_pool_resource() -> Docs:
    # the pods ask for an extended resource no node of pool a offers (kube-scheduler's NodeResourcesFit)
    template = {"spec": {"containers": [{"name": "c", "image": "x",
                                         "resources": {"requests": {"example.com/fpga": "1"},
                                                       "limits": {"example.com/fpga": "1"}}}]}}
    return [gpu_node("a0"), pool("a", "a"), pool("b", "b"), job("j", {"a": 1.0, "b": 0.0}, count=3, template=template)]


def _no_ready_node() -> Docs:
    down = gpu_node("v0", "v100")
    down["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    return [down, pool("v100", "v100"), job("j", {"v100": 1.0}, count=2)]


def _no_eligible_node() -> Docs:
    tainted = gpu_node("a0")
    tainted["spec"]["taints"] = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
    return [tainted, pool("a", "a"), job("j", {"a": 1.0}, count=1)]


def _too_large() -> Docs:
    return [gpu_node("a0"), pool("a", "a"), job("j", {"a": 1.0}, count=1, resources={"cpu": "32"})]


def _degree_limited() -> Docs:
    return [gpu_node("a0", gpus=8), pool("a", "a", degreeLimit=2), job("j", {"a": 1.0}, count=4)]


def _cpu() -> Docs:
    return [gpu_node("a0"), pool("a", "a"), job("j", {"a": 1.0}, count=4, resources={"cpu": "6"})]


def _memory() -> Docs:
    return [gpu_node("a0"), pool("a", "a"), job("j", {"a": 1.0}, count=2, resources={"memory": "40Gi"})]


def _resource() -> Docs:
    small = gpu_node("a0")
    small["status"]["allocatable"]["pods"] = "2"  # 2 pod slots, 4 GPUs: the third pod lacks a slot
    return [small, pool("a", "a"), job("j", {"a": 1.0}, count=3)]


def _fragmented() -> Docs:
    return [gpu_node("a0", gpus=2), gpu_node("a1", gpus=2), pool("a", "a"), job("j", {"a": 1.0}, count=1, demand=2),
            foreign("f0", "a0", 1), foreign("f1", "a1", 1)]


def _insufficient_capacity() -> Docs:
    return [gpu_node("a0", gpus=3), pool("a", "a"), job("j", {"a": 1.0}, count=3), foreign("f0", "a0", 2)]


def _pool_capacity() -> Docs:
    return [gpu_node("a0"), pool("a", "a", capacity=2), job("j", {"a": 1.0}, count=4)]


def _market_share() -> Docs:
    return [gpu_node("a0"), pool("a", "a"), job("j", {"a": 1.0}, replicas={"min": 3, "max": 4}),
            job("h", {"a": 1.0}, count=2)]


def _no_marginal_utility() -> Docs:
    return [gpu_node("a0"), pool("a", "a"),
            job("j", {"a": 1.0}, count=4, utility={"type": "target-priority", "target": 0.5})]


def _gang() -> Docs:
    return [gpu_node("a0", gpus=3), pool("a", "a"), job("j", {"a": 1.0}, replicas={"count": 4, "gang": True})]


def _gang_cpu() -> Docs:
    # two 1-GPU nodes, one with 2 cpu: a pod of 3 cpu fits a0 only, so the gang of 2 has 1 place, not 2
    return [gpu_node("a0", gpus=1), gpu_node("a1", gpus=1, cpu="2"), pool("a", "a"),
            job("j", {"a": 1.0}, replicas={"count": 2, "gang": True}, resources={"cpu": "3"})]


def _price_above_bid() -> Docs:
    # h (4 of 3 cpu) fits 2 pods in 8 cpu, so the market sells 2 GPUs to it at a high price and 2 stay free; j, an
    # elastic job below its minimum (2) that the fill leaves out by its rule, bids 0.1 / 3 = 0.03333 per GPU (a
    # linear utility: a_ij / (N d)), below that price: the market grants it nothing although its pods fit
    return [gpu_node("a0", cpu="8"), pool("a", "a"), job("h", {"a": 1.0}, count=4, resources={"cpu": "3"}),
            job("j", {"a": 0.1}, replicas={"min": 2, "max": 3}, utility={"type": "linear"},
                resources={"cpu": "1"})]


def _budget_share() -> Docs:
    # one tenant of share 1, split 3:1 by spec.weight: b_h = 0.75, b_j = 0.25. h's pods of 5 cpu fit 2 in 12 cpu,
    # so the market sells 3 GPUs: price = 1 credit/h over 3 = 0.3333; j (elastic, sized by the fair pool) buys
    # 0.25 / 0.3333 = 0.75 GPU, 1 replica, whose bid is b_j / 1 unit = 0.25, below the price, with 1 GPU still free
    return [gpu_node("a0", cpu="12"), pool("a", "a", policy="fair"),
            job("h", {"a": 1.0}, count=4, resources={"cpu": "5"}, weight=3),
            job("j", {"a": 1.0}, replicas={"min": 1, "max": 5}, resources={"cpu": "1"}, weight=1),
            {"kind": "Budget", "metadata": {"name": "team"}, "spec": {"share": 1, "namespaces": ["ml"]}}]


def _solver_failed() -> Docs:
    # values the schema admits (exponent -100, weight 1e-6, throughput 1e-9) whose power utility overflows a float
    # in the market's solver: the plan isolates the job (issue 30) and plans the other one
    return [gpu_node("a0"), pool("a", "a"), job("h", {"a": 1.0}, count=2),
            job("j", {"a": 1e-9}, count=3, utility={"type": "power", "exponent": -100, "weight": 1e-6})]


def _quota() -> Docs:
    hard = {"requests.nvidia.com/gpu": "2"}
    return [gpu_node("a0"), pool("a", "a"), job("j", {"a": 1.0}, count=4),
            {"kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "ml"}, "spec": {"hard": hard},
             "status": {"hard": hard, "used": {}}}]


def _pod_security() -> Docs:
    template = {"spec": {"containers": [{"name": "c", "image": "x", "securityContext": {"privileged": True}}]}}
    return [gpu_node("a0"), pool("a", "a"), job("j", {"a": 1.0}, count=1, template=template),
            {"kind": "Namespace", "metadata": {"name": "ml",
                                               "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}]


def _budget(caps: float) -> Docs:
    return [{"kind": "Budget", "metadata": {"name": "team"},
             "spec": {"share": 1, "namespaces": ["ml"], "caps": [{"pool": "a", "maxUnits": caps}]}}]


def _budget_cap() -> Docs:
    # a Budget caps pool a at 3 GPUs; the job asks for 4 of 1 GPU on an 8-GPU node: 3 fit, the fourth needs 1 more
    return [gpu_node("a0", gpus=8), pool("a", "a"), job("j", {"a": 1.0}, count=4), *_budget(3)]


def _budget_cap_pool() -> Docs:
    # the cap of 2 in pool a is taken by a job running there first; j (also able to use pool b) loses pool a
    return [gpu_node("a0", gpus=8), gpu_node("b0", "b", gpus=1), pool("a", "a"), pool("b", "b"),
            job("first", {"a": 1.0}, count=2), job("j", {"a": 2.0, "b": 1.0}, count=2), *_budget(2),
            *[{"kind": "Pod", "metadata": {"name": f"first-a-{k}", "namespace": "ml", "uid": f"uid-first-{k}",
                                           "labels": {"walras.dev/job": "first", "walras.dev/pool": "a",
                                                      "walras.dev/managed": "true"}},
               "spec": {"nodeName": "a0", "containers": [{"name": "c", "resources": {
                   "requests": {"nvidia.com/gpu": "1"}}}]}, "status": {"phase": "Running"}} for k in range(2)]]


#: reason -> (the cluster, numbers worked out by hand that the explanation must show)
CASES: dict[str, tuple[Callable[[], Docs], tuple[str, ...]]] = {
    "NoUsablePool": (_no_usable_pool, ("2 replica(s), pool nope: NoUsablePool", "none of the 1 pool(s)",
                                       "no ResourcePool 'nope' exists; the 1 valid pool(s) are a")),
    "NoReadyNode": (_no_ready_node, ("1 node(s) match its nodeSelector",)),
    "NoEligibleNode": (_no_eligible_node, ("none of the 1 Ready node(s)",)),
    "TooLarge": (_too_large, ("cpu 32 > 16",)),
    "DegreeLimited": (_degree_limited, ("degree limit of 2",)),
    "InsufficientCpu": (_cpu, ("cpu short by 2",)),  # 16 - 2 x 6 = 4 free, a pod needs 6
    "InsufficientMemory": (_memory, ("memory short by 16Gi",)),  # 64 - 40 = 24 free, a pod needs 40
    "InsufficientResource": (_resource, ("pods short by 1",)),
    "Fragmented": (_fragmented, ("2 nvidia.com/gpu free in total", "at most 1 on one node")),
    "InsufficientCapacity": (_insufficient_capacity, ("2 replica(s) need 2 (2 more needed)",)),
    "PoolCapacity": (_pool_capacity, ("spec.capacity 2 nvidia.com/gpu, 2 in use: 0 left",)),
    "MarketShare": (_market_share, ("2 replica(s), rounds to 0",)),  # 4 x_g + 2 x_h <= 4, x_g = 1/2: N x = 2
    "NoMarginalUtility": (_no_marginal_utility, ("2 of its 4 replica(s) have no value",)),  # target 0.5 = 2/4
    "GangNotPlaceable": (_gang, ("gang of 4",)),
    "QuotaLimited": (_quota, ("2 of 4",)),  # 2 GPUs of quota, 1 GPU a replica
    "PodSecurityRefused": (_pod_security, ("restricted",)),
    "BudgetCap": (_budget_cap, ("maxUnits 3", "3 replica(s) of 1 fit, the other 1 would need 1 more")),
    "PriceAboveBid": (_price_above_bid, ("3 replica(s), pool a: PriceAboveBid", "price 0.4844 per nvidia.com/gpu",
                                         "the job's bid 0.03333 per",
                                         "at 0 granted replica(s)); 2 nvidia.com/gpu free on 1 node(s)")),
    "BudgetShare": (_budget_share, ("4 replica(s), pool a: BudgetShare", "the job's budget is 0.25 credits/h",
                                    "its part of tenant 'team''s share 1 over 2 priced job(s)",
                                    "price 0.3333 per nvidia.com/gpu in pool 'a' is at or above its bid 0.25",
                                    "its bid 0.25", "1 nvidia.com/gpu free on 1 node(s)")),
    "SolverFailed": (_solver_failed, ("Valid=False SolverFailed", "OverflowError")),
}
#: the same reason on other clusters
MORE = {"BudgetCap/pool": ("BudgetCap", _budget_cap_pool, ("maxUnits 2", "take 2, 0 left", "2 replica(s) need 2")),
        # the gang's rule names the next pod's: 1 of 2 placeable, a1's 2 cpu short by 1 of the pod's 3
        "NoUsablePool/resource": ("NoUsablePool", _no_usable_pool_resource, (
            "3 replica(s), pool a: NoUsablePool", "no node of the pool offers example.com/fpga",
            "3 replica(s), pool b: NoUsablePool", "spec.throughput gives pool 'b' 0")),
        "GangNotPlaceable/cpu": ("GangNotPlaceable", _gang_cpu, (
            "2 replica(s), pool a: GangNotPlaceable: gang of 2", "can place 1 now (InsufficientCpu",
            # docs/troubleshooting.md quotes this message
            "gang of 2 needs 2 replicas in one pool; best pool 'a' can place 1 now (InsufficientCpu: needs 2 "
            "nvidia.com/gpu, 2 free on 2 admitted node(s); 1 node(s) have the 1 nvidia.com/gpu a pod needs but not "
            "its other requests; on the best node a1: cpu short by 1)"))}

#: reasons no single offline plan of manifests produces, with why (issue 28's report names them)
NOT_OFFLINE = {
    "AdmissionRefused": "needs the API server to refuse a pod create (recorded in the job's status), which an offline "
                        "plan has no server for; tests/test_refusals_operator.py covers it live",
    "Misplaced": "needs a pod bound outside its pool by another scheduler between two plans "
                 "(tests/test_misplacement.py runs the sequence)",
}


def _explain(tmp_path: Path, docs: Docs, capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    for doc in docs:
        doc.setdefault("apiVersion", "v1" if doc["kind"] in ("Node", "Pod", "Namespace", "ResourceQuota")
                       else "walras.dev/v1alpha1")
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump_all(docs))
    # the per-job market where no Budget is prepared (a rule such as NoMarginalUtility exists only there: with
    # tenants every job is a log buyer of its budget); with one, the tenants' market, as the operator plans
    market = [] if any(d["kind"] == "Budget" for d in docs) else ["--no-tenants"]
    assert main(["explain", "ml/j", "-f", str(tmp_path), "-o", "json", *market]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(["explain", "ml/j", "-f", str(tmp_path), *market]) == 0
    return doc, capsys.readouterr().out


def test_every_reason_is_covered_or_named() -> None:
    covered = set(CASES) | {reason for reason, _, _ in MORE.values()}
    assert covered.isdisjoint(NOT_OFFLINE)
    assert set(REASONS) == covered | set(NOT_OFFLINE), set(REASONS) ^ (covered | set(NOT_OFFLINE))


@pytest.mark.parametrize("case", [*CASES, *MORE])
def test_explain_names_the_rule_with_its_numbers(case: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    reason, build, numbers = (case, *CASES[case]) if case in CASES else MORE[case]
    doc, text = _explain(tmp_path, build(), capsys)
    said = {b["reason"] for b in doc["blocked"]} | {c["reason"] for c in doc["conditions"]}
    assert reason in said, (said, text)
    for number in numbers:
        assert number in text, text
    if any(b["reason"] == reason for b in doc["blocked"]):
        assert f": {reason}: " in text  # the "Not granted or not placed" line names the rule
    if doc["replicas"]["placed"] < doc["replicas"]["count"] or doc["phase"] == "Unschedulable":
        assert "Nothing blocks" not in text, text


def test_a_cap_is_the_condition_and_the_count_is_what_the_job_asked(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The cap of 3 leaves 3 of the 4 replicas: ``ReplicasGranted`` False ``BudgetCap`` says 3 of 4 with the cap's
    numbers, and explain shows the tenant's share, cap and held units (3 GPUs)."""
    doc, text = _explain(tmp_path, _budget_cap(), capsys)
    cond = {c["type"]: c for c in doc["conditions"]}["ReplicasGranted"]
    assert (cond["status"], cond["reason"]) == ("False", "BudgetCap")
    assert cond["message"].startswith("granted 3 of 4 replica(s): a=3; 1 not granted: tenant 'team' (Budget 'team') "
                                      "caps pool 'a' at spec.caps maxUnits 3 nvidia.com/gpu")
    assert doc["replicas"]["count"] == 4 and doc["replicas"]["placed"] == 3
    assert doc["blocked"] == [{"pool": "a", "reason": "BudgetCap", "replicas": 1, "message": doc["blocked"][0][
        "message"]}]
    assert doc["tenant"]["caps"] == {"a": 3.0} and doc["tenant"]["units"] == {"a": 3.0}
    assert "Tenant team (Budget team): share 1 credits/h; its placed pods hold a=3 unit(s)" in text
    assert "caps a=3" in text


def test_a_gang_is_never_said_granted_more_replicas_than_its_count(tmp_path: Path) -> None:
    """A GPU gang of 4 (``replicas: {count: 4, gang: true}``, Gavel's ResNet-50 at batch size 32) added to the example
    cluster: the rounds granted it 4 in k80 plus one dropped by rounding, and its status read "granted 5 of 4"; the
    granted replicas now stop at its count, and a placed gang is all 4 in one pool."""
    from walras.kube.decode import cluster_from
    from walras.manifests import load_manifests

    from tests.planning import build_plan

    root = Path(__file__).resolve().parents[1]
    gang = job("ddp", {"k80": 1.2366, "p100": 4.8883, "v100": 7.7873}, replicas={"count": 4, "gang": True},
               resources={"cpu": "4", "memory": "16Gi"})
    gang["apiVersion"] = "walras.dev/v1alpha1"
    (tmp_path / "ddp.yaml").write_text(yaml.safe_dump(gang))
    snapshot = load_manifests([root / "examples", root / "operator" / "walras" / "data" / "emulated-nodes.yaml",
                               tmp_path / "ddp.yaml"], validate=False)
    plan = build_plan(cluster_from(snapshot))
    jp = plan.jobs[("ml", "ddp")]
    assert sum(jp.wanted.values()) <= 4 and sum(jp.replicas.values()) in (0, 4) and len(jp.replicas) <= 1
    for key, other in plan.jobs.items():
        assert sum(other.wanted.values()) <= other.count, (key, other.wanted)
    granted = {c.type: c for c in jp.conditions}["ReplicasGranted"]
    assert " of 4 replica(s)" in granted.message and not granted.message.startswith("granted 5")
