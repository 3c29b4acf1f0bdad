"""The planner's incremental snapshot (issue 16, performance): nodes and FungibleJobs are memoised by
(uid, resourceVersion) like pods, a warm plan equals the plan of the same cluster without the memo, and rounding puts
no more new pods in a pool than it has room for (so one market round suffices when placement can realise it)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from walras.kube.decode import TranslationCache, cluster_from
from walras.kube.encode import plan_document
from walras.planner import Plan, Snapshot
from walras.planner.cluster import Job, Node, Pod
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL
from walras.planner.replicas import fit_columns, largest_remainder_rows

from tests.planning import build_plan, with_caches

POLICIES = ("utility", "throughput", "fair")


def cluster(n_nodes: int = 24, n_pools: int = 3, n_jobs: int = 12, replicas: int = 4, seed: int = 5) -> Snapshot:
    """4-GPU nodes in equal pools, jobs usable on two pools each; every object has a uid and a resourceVersion."""
    rng = np.random.default_rng(seed)
    nodes = [
        {
            "kind": "Node",
            "metadata": {"name": f"n{k:03d}", "labels": {"pool": f"p{k % n_pools}"}, "uid": f"node-uid-{k}",
                         "resourceVersion": str(10 + k)},
            "spec": {},
            "status": {
                "allocatable": {"nvidia.com/gpu": "4", "cpu": "32", "memory": "128Gi"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        for k in range(n_nodes)
    ]
    pools = [
        {
            "kind": "ResourcePool",
            "metadata": {"name": f"p{p}"},
            "spec": {"nodeSelector": {"pool": f"p{p}"}, "resource": "nvidia.com/gpu", "degreeLimit": 6,
                     "policy": {"type": POLICIES[p % len(POLICIES)]}},
        }
        for p in range(n_pools)
    ]
    utilities: list[dict[str, Any]] = [{"type": "log"}, {"type": "linear"}, {"type": "power", "exponent": 0.5}]
    jobs = []
    for i in range(n_jobs):
        usable = sorted(rng.choice(n_pools, size=2, replace=False).tolist())
        jobs.append(
            {
                "kind": "FungibleJob",
                "metadata": {"name": f"job-{i:03d}", "namespace": "ml", "generation": 1, "uid": f"job-uid-{i}",
                             "resourceVersion": str(1000 + i)},
                "spec": {
                    "throughput": {f"p{p}": round(float(rng.uniform(1.0, 10.0)), 3) for p in usable},
                    "utility": utilities[i % len(utilities)],
                    "demand": 1,
                    "replicas": {"count": replicas},
                    "resources": {"cpu": "2", "memory": "8Gi"},
                    "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
                },
            }
        )
    return Snapshot(nodes=tuple(nodes), pools=tuple(pools), jobs=tuple(jobs))


def running(snapshot: Snapshot, plan: Plan) -> Snapshot:
    """The cluster after the operator created and bound every placed pod of ``plan``."""
    pods = []
    for p in plan.pods:
        if p.action == "delete" or p.node is None:
            continue
        pods.append({
            "kind": "Pod",
            "metadata": {"name": p.name, "namespace": p.namespace, "uid": f"pod-uid-{p.name}",
                         "resourceVersion": str(5000 + len(pods)),
                         "labels": {LABEL_JOB: p.job, LABEL_POOL: p.pool, LABEL_MANAGED: "true"}},
            "spec": {"nodeName": p.node, "containers": [{"name": "c", "resources": {"requests": p.requests}}]},
            "status": {"phase": "Running"},
        })
    return Snapshot(snapshot.nodes, tuple(pods), snapshot.pools, snapshot.jobs, snapshot.profiles)


def written(obj: dict[str, Any], rv: str, **changes: Any) -> dict[str, Any]:
    """``obj`` after a write through the API server: ``changes`` applied, a new resourceVersion."""
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = rv
    for path, value in changes.items():
        at = out
        *parents, leaf = path.split("__")
        for part in parents:
            at = at.setdefault(part, {})
        at[leaf] = value
    return out


def comparable(plan: Plan) -> dict[str, Any]:
    body = plan_document(plan)
    body.pop("seconds")
    body["solver"].pop("seconds")
    return body


def without_memos(plan: Plan) -> Plan:
    """``plan`` with empty caches: a plan built after it translates and computes everything."""
    return with_caches(plan)


def test_nodes_and_jobs_are_reused_by_uid_and_resource_version() -> None:
    snap = cluster()
    cache = TranslationCache()
    first = cluster_from(snap, cache)
    memo = cache.objects
    assert sum(isinstance(v.item, Node) for v in memo.values()) == len(snap.nodes)
    assert sum(isinstance(v.item, Job) for v in memo.values()) == len(snap.jobs)
    second = cluster_from(snap, cache)
    again = cache.objects
    assert again is not memo  # replaced by this call's translations
    assert all(a is b for a, b in zip(first.nodes, second.nodes, strict=True))
    assert all(a is b for a, b in zip(first.jobs, second.jobs, strict=True))
    assert again == memo  # the next call's cache holds what this one used
    assert all(again[key] is memo[key] for key in memo)  # as the same entries: no new object per unchanged one
    # a node written since (new resourceVersion) is read again: its new allocatable is seen
    nodes = list(snap.nodes)
    nodes[3] = written(nodes[3], "99", status__allocatable={"nvidia.com/gpu": "8", "cpu": "64", "memory": "256Gi"})
    jobs = list(snap.jobs)
    jobs[2] = written(jobs[2], "2002", spec__replicas={"count": 9})
    third = cluster_from(Snapshot(tuple(nodes), (), snap.pools, tuple(jobs)), TranslationCache(again))
    by_name = {n.name: n for n in third.nodes}
    assert by_name["n003"].allocatable["nvidia.com/gpu"] == 8.0
    assert by_name["n004"] is first.nodes[4]
    job = next(j for j in third.jobs if j.name == "job-002")
    assert job.spec is not None and job.spec.replicas == 9
    assert next(j for j in third.jobs if j.name == "job-003") is first.jobs[3]
    # an edit that kept its resourceVersion is not seen (the API server never does that): the memo is trusted
    stale = list(snap.nodes)
    stale[5] = copy.deepcopy(stale[5])
    stale[5]["spec"]["unschedulable"] = True
    fourth = cluster_from(Snapshot(tuple(stale), (), snap.pools, snap.jobs), TranslationCache(again))
    assert next(n for n in fourth.nodes if n.name == "n005").usable
    # objects without a uid or a resourceVersion (manifest files) are translated every time and not recorded
    bare = [copy.deepcopy(n) for n in snap.nodes]
    for node in bare:
        del node["metadata"]["uid"]
    out = TranslationCache(memo)
    cluster_from(Snapshot(tuple(bare), (), snap.pools, snap.jobs), out)
    assert not any(isinstance(v.item, Node) for v in out.objects.values())
    assert any(isinstance(v.item, Job) for v in out.objects.values())


def test_kinds_never_share_a_memo_entry() -> None:
    """A pod, a node and a job with the same uid and resourceVersion each get their own translation."""
    snap = cluster(n_nodes=3, n_jobs=2)
    node = written(snap.nodes[0], "7")
    node["metadata"]["uid"] = "same"
    job = written(snap.jobs[0], "7")
    job["metadata"]["uid"] = "same"
    pod = {"kind": "Pod", "metadata": {"name": "x", "namespace": "ml", "uid": "same", "resourceVersion": "7"},
           "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}
    cache = TranslationCache()
    cluster_from(Snapshot((node,), (pod,), snap.pools, (job,)), cache)
    assert len(cache.objects) == 3
    again = cluster_from(Snapshot((node,), (pod,), snap.pools, (job,)), cache)
    assert isinstance(again.nodes[0], Node) and isinstance(again.pods[0], Pod) and isinstance(again.jobs[0], Job)
    assert again.nodes[0].name == "n000" and again.pods[0].name == "x" and again.jobs[0].name == "job-000"


def test_warm_plan_equals_the_plan_without_memos() -> None:
    """Reusing the previous plan's translations (pods, nodes, jobs) changes nothing in the plan: same actions,
    statuses, events and prices as re-translating everything, after a job grows, a node is cordoned and a job is
    edited."""
    snap = cluster()
    steady = running(snap, build_plan(snap))
    previous = build_plan(steady)
    nodes = list(steady.nodes)
    nodes[0] = written(nodes[0], "500", spec__unschedulable=True)
    jobs = list(steady.jobs)
    jobs[1] = written(jobs[1], "3001", spec__replicas={"count": 6})
    changed = Snapshot(tuple(nodes), steady.pods, steady.pools, tuple(jobs), steady.profiles)
    warm = build_plan(changed, previous)
    cold_translation = build_plan(changed, without_memos(previous))
    assert comparable(warm) == comparable(cold_translation)
    # the edits are seen: no new pod on the cordoned node, the grown job wants more
    assert not [p for p in warm.pods if p.action == "create" and p.node == "n000"]
    assert sum(warm.jobs[("ml", "job-001")].wanted.values()) > sum(previous.jobs[("ml", "job-001")].wanted.values())
    # an unchanged cluster warm-started from its own plan is a fixed point
    fixed = build_plan(steady, previous)
    assert all(p.action == "keep" for p in fixed.pods)


def test_a_full_cluster_is_planned_in_one_round() -> None:
    """More replicas than GPUs: row-by-row rounding used to put one pod more than the pool holds in some pools, and
    placement's shortfall cost a second and third market round. Now rounding leaves out what has no room: one round,
    and a job with a wanted replica left out says so (InsufficientCapacity)."""
    snap = cluster(n_nodes=24, n_pools=3, n_jobs=14, replicas=10, seed=1)
    plan = build_plan(snap)
    assert plan.solver.rounds == 1
    for key, job in plan.jobs.items():
        scheduled = next(c for c in job.conditions if c.type == "Scheduled")
        if sum(job.replicas.values()) < sum(job.wanted.values()):
            assert (scheduled.status, scheduled.reason) == ("False", "InsufficientCapacity"), key
        else:
            assert scheduled.status == "True", key
    for pool in plan.pools.values():
        assert pool.pods_planned <= 8 * 4


def _row_rounding(shares: np.ndarray, totals: np.ndarray) -> np.ndarray:
    return largest_remainder_rows(shares, totals)


def test_fit_columns_known_case() -> None:
    # two jobs split 1.5 / 0.5 over two pools of room 3 and 1: each row rounds to [2, 0] (tie to the lower index),
    # 4 pods in a pool of 3; the repair moves job 0's extra replica to pool 1, where it was below its share
    shares = np.array([[1.5, 0.5], [1.5, 0.5]])
    target = _row_rounding(shares, np.array([2, 2]))
    assert target.tolist() == [[2, 0], [2, 0]]
    zero = np.zeros_like(target)
    out = fit_columns(target, shares, np.ones(2), np.array([3.0, 1.0]), zero, zero, np.ones((2, 2), dtype=bool))
    assert out.tolist() == [[1, 1], [2, 0]]
    # a rounding that fits is returned unchanged
    same = fit_columns(out, shares, np.ones(2), np.array([3.0, 1.0]), zero, zero, np.ones((2, 2), dtype=bool))
    assert same.tolist() == out.tolist()
    # no pool with room: the replica is dropped, and running pods are never taken back
    running = np.array([[2, 0], [0, 0]])
    dropped = np.zeros((2, 2), dtype=np.int64)
    out = fit_columns(target, shares, np.ones(2), np.array([1.0, 0.0]), running, running,
                      np.ones((2, 2), dtype=bool), dropped)
    assert out.tolist() == [[2, 0], [1, 0]]
    assert dropped.tolist() == [[0, 0], [1, 0]]  # reported on the job as wanted and unplaced
    # a move into a pool where the job runs more than its target costs no room (one fewer deletion)
    target = np.array([[2, 0]])
    out = fit_columns(target, np.array([[1.5, 0.5]]), np.ones(1), np.array([1.0, 0.0]), np.array([[0, 1]]),
                      np.zeros((1, 2), dtype=np.int64), np.ones((1, 2), dtype=bool))
    assert out.tolist() == [[1, 1]]


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 6),
    m=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_fit_columns_keeps_pools_within_room(n: int, m: int, seed: int) -> None:
    """For market-feasible shares (column loads within the room), the repaired rounding never exceeds a pool's room,
    keeps every entry within one of its share, never adds to a job's total, and drops a replica only when no pool of
    the job had room for it."""
    rng = np.random.default_rng(seed)
    demand = rng.integers(1, 3, n).astype(np.float64)
    offered = rng.random((n, m)) < 0.8
    offered[np.arange(n), rng.integers(0, m, n)] = True
    raw = np.where(offered, rng.random((n, m)), 0.0)
    room = rng.integers(1, 8, m).astype(np.float64)
    load = demand @ raw
    shares = raw * np.min(np.where(load > 0, room / np.maximum(load, 1e-12), np.inf))  # column loads <= room
    totals = np.floor(shares.sum(axis=1) + 0.5).astype(np.int64)
    totals[shares.sum(axis=1) <= 0] = 0
    target = largest_remainder_rows(shares, totals)
    zero = np.zeros((n, m), dtype=np.int64)
    out = fit_columns(target, shares, demand, room, zero, zero, offered)
    assert np.all(demand @ out <= room + 1e-6)
    assert np.all(out >= 0) and np.all(out.sum(axis=1) <= target.sum(axis=1))
    assert np.all(np.abs(out - shares) < 1 + 1e-9)
    assert np.all(out[~offered] == target[~offered])
    if np.array_equal(demand @ target <= room + 1e-6, np.ones(m, dtype=bool)):
        assert np.array_equal(out, target)
    dropped = np.flatnonzero(out.sum(axis=1) < target.sum(axis=1))
    for i in dropped.tolist():  # no pool of the job could take one more within one of its share
        free = room - demand @ out
        assert not np.any(offered[i] & (free + 1e-6 >= demand[i]) & (shares[i] - out[i] > 1e-9))


def test_pods_written_alike_share_one_parse() -> None:
    """Within one translation, pods whose containers' resources are written alike share one requests mapping (the
    capacity phase then builds one vector for them); any difference in what the parse reads gives its own."""
    def pod(name: str, requests: dict[str, Any], init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": requests}},
                                               {"name": "side", "resources": {"limits": {"cpu": "500m"}}}]}
        if init is not None:
            spec["initContainers"] = init
        return {"kind": "Pod", "metadata": {"name": name, "namespace": "ml"}, "spec": spec,
                "status": {"phase": "Pending"}}

    pods = (
        pod("a", {"cpu": "2", "memory": "8Gi"}),
        pod("b", {"cpu": "2", "memory": "8Gi"}),
        pod("c", {"cpu": "3", "memory": "8Gi"}),
        pod("d", {"cpu": "2", "memory": "8Gi"}, init=[{"name": "i", "resources": {"requests": {"cpu": "4"}}}]),
        pod("e", {"cpu": 2, "memory": "8Gi"}),  # a number where the API server writes a string: parsed alone
    )
    got = {p.name: p for p in cluster_from(Snapshot(pods=pods)).pods}
    assert got["a"].requests is got["b"].requests
    assert got["a"].requests == {"cpu": 2.5, "memory": 8 * 2**30, "pods": 1.0}
    assert got["c"].requests["cpu"] == 3.5 and got["c"].requests is not got["a"].requests
    assert got["d"].requests["cpu"] == 4.0  # the init container's request is the larger
    assert got["e"].requests == got["a"].requests and got["e"].requests is not got["a"].requests
    assert got["e"].first == ((("cpu", "2"), ("memory", "8Gi")), ())
    assert got["a"].first == got["e"].first
    # equal numbers written differently (1 == 1.0 == True as keys) are never served each other's text, in any order
    spelled = (pod("f", {"cpu": 1, "memory": "8Gi"}), pod("g", {"cpu": 1.0, "memory": "8Gi"}),
               pod("h", {"cpu": 1, "memory": "8Gi"}), pod("i", {"cpu": "1", "memory": "8Gi"}))
    texts = {p.name: dict(p.first[0])["cpu"] for p in cluster_from(Snapshot(pods=spelled)).pods}
    assert texts == {"f": "1", "g": "1.0", "h": "1", "i": "1"}
    overhead = dict(pod("j", {"cpu": "1"}), spec={"containers": [{"name": "c"}], "overhead": {"cpu": 1}})
    plain = dict(pod("k", {"cpu": "1"}), spec={"containers": [{"name": "c"}], "overhead": {"cpu": "1"}})
    got = {p.name: p for p in cluster_from(Snapshot(pods=(overhead, plain))).pods}
    assert got["j"].requests == got["k"].requests == {"cpu": 1.0, "pods": 1.0}


def test_status_agrees_with_placement_when_a_job_grows_in_a_full_pool() -> None:
    """A job grows in a full pool: no pod is created (no room), and every job's status is Scheduled=True only when
    all its wanted replicas are placed, else InsufficientCapacity (replicas rounding took out for lack of room count
    as wanted and unplaced)."""
    snap = cluster(n_nodes=6, n_pools=2, n_jobs=3, replicas=8, seed=2)
    pools = snap.pools
    full = Snapshot(snap.nodes, (), pools, tuple(dict(j, spec=dict(j["spec"], throughput={"p0": 5.0}))
                                                 for j in snap.jobs))
    steady = running(full, build_plan(full))
    previous = build_plan(steady)
    assert previous.pools["p0"].pods_planned == 12  # 3 nodes x 4 GPUs, all taken
    jobs = list(steady.jobs)
    jobs[0] = written(jobs[0], "9000", spec__replicas={"count": 12})
    plan = build_plan(Snapshot(steady.nodes, steady.pods, pools, tuple(jobs)), previous)
    assert not [p for p in plan.pods if p.action == "create"]
    for key, job in plan.jobs.items():
        placed, wanted = sum(job.replicas.values()), sum(job.wanted.values())
        scheduled = next(c for c in job.conditions if c.type == "Scheduled")
        if placed < wanted:
            assert scheduled.status == "False" and scheduled.reason == "InsufficientCapacity", key
        else:
            assert scheduled.status == "True", key
