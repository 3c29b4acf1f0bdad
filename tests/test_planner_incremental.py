"""Warm, incremental re-planning: placement reuse keyed by a digest of each pool's placement request, the row-wise
rounding, and determinism of warm plans (the previous plan is an input of the pure planner)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from walras.kube.encode import plan_document
from walras.planner import Plan, Snapshot
from walras.planner import placement as placement_module
from walras.planner import replicas as replicas_module
from walras.planner.cluster import Pod
from walras.planner.model import LABEL_JOB, LABEL_MANAGED, LABEL_POOL
from walras.planner.placement import PlacementEntry
from walras.planner.policies import REGISTRY, PlacementRequest
from walras.planner.replicas import largest_remainder
from walras.planner.reuse import PlanCache
from walras.planner.spec import PoolSpec

from tests.planning import build_plan, caches, entry, with_caches

POLICIES = ("utility", "throughput", "fair", "colocation")


def cluster(n_nodes: int = 40, n_pools: int = 4, n_jobs: int = 24, replicas: int = 4, seed: int = 3) -> Snapshot:
    """A small heterogeneous cluster with one pool per policy (4-GPU nodes, jobs usable on two pools each)."""
    rng = np.random.default_rng(seed)
    nodes = [
        {
            "kind": "Node",
            "metadata": {"name": f"n{k:03d}", "labels": {"pool": f"p{k % n_pools}"}},
            "spec": {},
            "status": {
                "allocatable": {"nvidia.com/gpu": "4", "cpu": "32", "memory": "128Gi"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        for k in range(n_nodes)
    ]
    pools = []
    for p in range(n_pools):
        policy: dict[str, Any] = {"type": POLICIES[p % len(POLICIES)]}
        if policy["type"] == "colocation":
            policy["colocation"] = {"profile": "prof"}
        pools.append(
            {
                "kind": "ResourcePool",
                "metadata": {"name": f"p{p}"},
                "spec": {"nodeSelector": {"pool": f"p{p}"}, "resource": "nvidia.com/gpu", "degreeLimit": 6,
                         "policy": policy},
            }
        )
    profile = {
        "kind": "ColocationProfile",
        "metadata": {"name": "prof"},
        "spec": {"types": ["a", "b"], "interference": [[0.1, 0.3], [0.3, 0.1]]},
    }
    utilities: list[dict[str, Any]] = [{"type": "log"}, {"type": "linear"}, {"type": "power", "exponent": 0.5}]
    jobs = []
    for i in range(n_jobs):
        usable = sorted(rng.choice(n_pools, size=2, replace=False).tolist())
        jobs.append(
            {
                "kind": "FungibleJob",
                "metadata": {"name": f"job-{i:03d}", "namespace": "ml", "generation": 1},
                "spec": {
                    "throughput": {f"p{p}": round(float(rng.uniform(1.0, 10.0)), 3) for p in usable},
                    "utility": utilities[i % len(utilities)],
                    "demand": 1,
                    "replicas": {"count": replicas},
                    "resources": {"cpu": "2", "memory": "8Gi"},
                    "colocation": {"type": "ab"[i % 2], "size": 1},
                    "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
                },
            }
        )
    return Snapshot(nodes=tuple(nodes), pools=tuple(pools), jobs=tuple(jobs), profiles=(profile,))


def running(snapshot: Snapshot, plan: Plan, pending_every: int = 0) -> Snapshot:
    """The cluster after the operator created and bound every placed pod of ``plan``; with ``pending_every`` = k,
    every k-th pod is created but not bound yet (its binding is in flight)."""
    placed = [p for p in plan.pods if p.action != "delete" and p.node is not None]
    pods = [
        {
            "kind": "Pod",
            "metadata": {"name": p.name, "namespace": p.namespace,
                         "labels": {LABEL_JOB: p.job, LABEL_POOL: p.pool, LABEL_MANAGED: "true"}},
            "spec": {
                **({} if pending_every and q % pending_every == 0 else {"nodeName": p.node}),
                "containers": [{"name": "c", "resources": {"requests": p.requests, "limits": p.limits}}],
            },
            "status": {"phase": "Pending" if pending_every and q % pending_every == 0 else "Running"},
        }
        for q, p in enumerate(placed)
    ]
    return Snapshot(snapshot.nodes, tuple(pods), snapshot.pools, snapshot.jobs, snapshot.profiles)


def grow(snapshot: Snapshot, index: int, by: int) -> Snapshot:
    jobs = copy.deepcopy(list(snapshot.jobs))
    jobs[index]["spec"]["replicas"]["count"] += by
    return Snapshot(snapshot.nodes, snapshot.pods, snapshot.pools, tuple(jobs), snapshot.profiles)


def placements(plan: Plan) -> list[tuple[str, str, str, str | None, tuple[tuple[str, str], ...], str]]:
    return [(p.namespace, p.name, p.pool, p.node, tuple(sorted(p.requests.items())), p.action) for p in plan.pods]


def without_memos(plan: Plan) -> Plan:
    """A copy of ``plan`` whose pools forgot their placements and which forgot its pod parses (as if the previous plan
    predated the memos)."""
    cache = caches(plan)[0]
    kept = {key: e for key, e in cache.entries.items() if key[0] is not PlacementEntry}
    return with_caches(plan, PlanCache(kept))


def comparable(plan: Plan) -> dict[str, Any]:
    body = plan_document(plan)
    body.pop("seconds")
    body["solver"].pop("seconds")
    return body


class CountingPolicies:
    """Wraps every registered policy to count how often each pool's policy really runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        for name, factory in list(REGISTRY.items()):
            monkeypatch.setitem(REGISTRY, name, self._wrap(factory))

    def _wrap(self, factory: Any) -> Any:
        calls = self.calls

        class Counted:
            def __init__(self) -> None:
                self.inner = factory()
                self.name = self.inner.name

            def place(self, request: PlacementRequest) -> Any:
                calls.append(request.pool.name)
                return self.inner.place(request)

        return Counted


# --- row-wise largest remainder -------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.floats(0.0, 6.0), min_size=3, max_size=3), st.integers(0, 12)), min_size=1, max_size=8
    )
)
def test_largest_remainder_rows_matches_the_row_by_row_rounding(rows: list[tuple[list[float], int]]) -> None:
    shares = np.array([r[0] for r in rows])
    totals = np.array([r[1] if sum(r[0]) > 0 else 0 for r in rows], dtype=np.int64)
    got = replicas_module.largest_remainder_rows(shares, totals)
    for i in range(len(rows)):
        expected = largest_remainder(shares[i], int(totals[i]))
        assert got[i].tolist() == expected.tolist(), (shares[i], totals[i])
        assert int(got[i].sum()) == int(totals[i])


def test_largest_remainder_rows_known_cases_and_bad_input() -> None:
    shares = np.array([[1.5, 1.5, 0.0], [0.2, 0.3, 0.5], [2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    got = replicas_module.largest_remainder_rows(shares, np.array([3, 1, 4, 0]))
    # row 0: floors 1+1, the tie of remainders goes to the lower column; row 1: the largest remainder wins;
    # row 2: 4 lies outside [2, 2], so the share is scaled to 4; row 3: zero total, zero replicas
    assert got.tolist() == [[2, 1, 0], [0, 0, 1], [4, 0, 0], [0, 0, 0]]
    with pytest.raises(ValueError, match="row 0"):
        replicas_module.largest_remainder_rows(np.zeros((1, 2)), np.array([2]))
    with pytest.raises(ValueError, match="shares must be"):
        replicas_module.largest_remainder_rows(np.zeros(3), np.array([1]))


# --- placement digest ----------------------------------------------------------------------------------------------


def _request(free: list[float], pod_job: list[int]) -> PlacementRequest:
    from walras.planner.spec import parse_job

    spec = PoolSpec("p", {"pool": "p"}, "nvidia.com/gpu", "utility")
    job = parse_job({"metadata": {"name": "j", "namespace": "ml"}, "spec": {"throughput": {"p": 1.0}}})
    free_a = np.array(free)
    return PlacementRequest(
        pool=spec, node_names=[f"n{k}" for k in range(len(free))], free=free_a, slots=np.full(len(free), 4),
        resource_names=["nvidia.com/gpu"], node_resources=free_a[:, None], jobs=[job],
        job_pods=np.array([len(pod_job)]), job_throughput=np.array([1.0]), job_replicas_total=np.array([2.0]),
        pod_job=np.array(pod_job, dtype=np.int64),
    )


def test_placement_digest_changes_with_every_input() -> None:
    base = placement_module.placement_digest(_request([4.0, 2.0], [0, 0]))
    assert base == placement_module.placement_digest(_request([4.0, 2.0], [0, 0]))
    assert base != placement_module.placement_digest(_request([4.0, 1.0], [0, 0]))  # free capacity
    assert base != placement_module.placement_digest(_request([4.0, 2.0], [0]))  # pods to place
    other = _request([4.0, 2.0], [0, 0])
    other.slots = np.array([4, 3])
    assert base != placement_module.placement_digest(other)  # degree slots
    renamed = _request([4.0, 2.0], [0, 0])
    renamed.node_names = ["n1", "n0"]
    assert base != placement_module.placement_digest(renamed)  # node identity


# --- warm plans -----------------------------------------------------------------------------------------------------


def test_warm_plan_of_an_unchanged_snapshot_places_as_the_cold_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = cluster()
    cold = build_plan(snap)
    counter = CountingPolicies(monkeypatch)
    warm = build_plan(snap, cold)
    # where the market result is the same (here: the same replicas per pool for every job), every pod lands where the
    # cold plan put it, and no pool ran its policy again: each reused the cold plan's placement
    same_market = all(warm.jobs[k].replicas == cold.jobs[k].replicas for k in cold.jobs)
    assert same_market
    assert placements(warm) == placements(cold)
    assert counter.calls == []
    # and a pool whose placement was reused carries it on for the plan after
    assert all(entry(warm, PlacementEntry, name) == entry(cold, PlacementEntry, name) for name in cold.pools)
    assert any(entry(warm, PlacementEntry, name) is not None for name in cold.pools)


def test_reused_placements_equal_recomputed_ones_after_a_small_change(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = cluster()
    steady = running(snap, build_plan(snap), pending_every=5)  # every pool has pods whose binding is in flight
    previous = build_plan(steady)
    changed = grow(steady, 0, 3)
    counter = CountingPolicies(monkeypatch)
    warm = build_plan(changed, previous)
    reran = sorted(set(counter.calls))
    counter.calls.clear()
    fresh = build_plan(changed, without_memos(previous))  # same warm prices, every policy re-run
    assert comparable(warm) == comparable(fresh)
    # only the pools whose requests changed ran their policy (job-000 grew; it may use two pools)
    grown_pools = set(snap.jobs[0]["spec"]["throughput"])
    assert set(reran) <= grown_pools
    # without the memo every pool with pods for its policy runs it: the pending pods keep the node the previous plan
    # gave them (placement.place_batch's sticky pods, issue 33), so only pools with new pods call their policy
    assert set(reran) <= set(counter.calls) <= grown_pools
    assert len(reran) < 4
    before = {p.name: p.node for p in previous.pods}
    pending = {pod["metadata"]["name"] for pod in steady.pods if "nodeName" not in pod["spec"]}
    assert pending
    assert {p.name: p.node for p in warm.pods if p.name in pending} == {name: before[name] for name in pending}


def test_warm_plans_are_deterministic() -> None:
    snap = cluster(seed=5)
    steady = running(snap, build_plan(snap))
    previous = build_plan(steady)
    changed = grow(steady, 2, 2)
    assert comparable(build_plan(changed, previous)) == comparable(build_plan(changed, previous))
    # a deep copy of the previous plan (same content, other objects) gives the same plan too
    assert comparable(build_plan(changed, copy.deepcopy(previous))) == comparable(build_plan(changed, previous))


def test_a_reused_fallback_is_reported_again(monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[str] = []

    class Broken:
        name = "utility"

        def place(self, request: PlacementRequest) -> Any:
            runs.append(request.pool.name)
            raise RuntimeError("broken on purpose")

    monkeypatch.setitem(REGISTRY, "utility", Broken)
    snap = cluster()
    cold = build_plan(snap)
    warm = build_plan(snap, cold)
    assert runs == ["p0"]  # the warm plan reused the fallback placement instead of calling the policy again
    for plan in (cold, warm):
        conditions = [c for c in plan.pools["p0"].conditions if c.reason == "PolicyFallback"]
        assert len(conditions) == 1 and "broken on purpose" in conditions[0].message
        assert [e.name for e in plan.events if e.reason == "PolicyFallback"] == ["p0"]
    assert placements(warm) == placements(cold)


def test_gc_is_restored_after_planning() -> None:
    import gc

    assert gc.isenabled()
    build_plan(cluster(n_jobs=4))
    assert gc.isenabled()
    gc.disable()
    try:
        build_plan(cluster(n_jobs=4))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_pod_parses_are_reused_by_uid_and_resource_version() -> None:
    snap = cluster()
    first = build_plan(snap)
    steady = running(snap, first)
    pods = [copy.deepcopy(p) for p in steady.pods]
    for k, pod in enumerate(pods):
        pod["metadata"].update(uid=f"u{k}", resourceVersion="7")
    with_ids = Snapshot(steady.nodes, tuple(pods), steady.pools, steady.jobs, steady.profiles)
    previous = build_plan(with_ids)
    assert sum(isinstance(v.item, Pod) for v in caches(previous)[1].objects.values()) == len(pods)
    # the same objects again: same plan as without the memo
    assert comparable(build_plan(with_ids, previous)) == comparable(build_plan(with_ids, without_memos(previous)))
    # a pod written since (new resourceVersion) is read again; one with an unchanged version is not
    changed = copy.deepcopy(pods)
    changed[0]["status"] = {"phase": "Failed"}
    changed[0]["metadata"]["resourceVersion"] = "8"
    stale = copy.deepcopy(pods)
    stale[1]["status"] = {"phase": "Succeeded"}  # an impossible edit that kept its resourceVersion: not seen
    plan = build_plan(Snapshot(steady.nodes, tuple(changed), steady.pools, steady.jobs, steady.profiles), previous)
    # the failed pod is deleted and (no clock: no backoff to wait) replaced at once by a new pod under a new name
    # (the failed pod still holds its name in the API server, so re-using it would be refused as AlreadyExists)
    finished = changed[0]["metadata"]["name"]
    assert plan.pod(changed[0]["metadata"]["namespace"], finished).action == "delete"
    created = [p for p in plan.pods if p.action == "create"]
    assert len(created) == 1 and created[0].name != finished and not created[0].exists
    plan = build_plan(Snapshot(steady.nodes, tuple(stale), steady.pools, steady.jobs, steady.profiles), previous)
    assert plan.pod(stale[1]["metadata"]["namespace"], stale[1]["metadata"]["name"]).action == "keep"
    # a node that goes away is seen even for pods whose parse is reused (the node index is looked up again)
    gone = steady.nodes[1:]
    node_name = steady.nodes[0]["metadata"]["name"]
    plan = build_plan(Snapshot(gone, tuple(pods), steady.pools, steady.jobs, steady.profiles), previous)
    on_gone = [p for p in plan.pods if p.exists and p.node == node_name]
    assert all(p.action == "delete" for p in on_gone)
    fresh = build_plan(Snapshot(gone, tuple(pods), steady.pools, steady.jobs, steady.profiles),
                       without_pod_memo(previous))
    assert comparable(plan) == comparable(fresh)


def without_pod_memo(plan: Plan) -> Plan:
    """``plan`` with its plan cache and an empty translation cache."""
    return with_caches(plan, caches(plan)[0])
