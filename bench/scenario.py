"""Before/after evidence for the planner issue (#16) on a realistic generated cluster.

Runs against whichever ``walras`` is importable, so the same file measures an older checkout too::

    python bench/scenario.py                                   # this tree
    PYTHONPATH=/tmp/old/operator:/tmp/old python bench/scenario.py --label before   # a worktree of an old commit

The cluster (seeded): 50 nodes in 4 pools named after Gavel's GPU types - ``v100`` (8 GPUs, 64 cpu, 512 Gi per node,
utility policy), ``p100`` (4 GPUs, 32 cpu, 256 Gi, throughput policy, degree limit 3), ``k80`` (4 GPUs, 16 cpu,
64 Gi, fair policy) and ``cpu`` (64 cpu, 256 Gi, colocation policy) - and 60 jobs: inference (1 GPU, 4-8 cpu), fine
tuning (2-6 replicas, 1-2 GPUs, 8-16 cpu, 64-128 Gi), elastic training (min 1, max 8, in the fair pool and others) and
CPU services, with throughputs of Gavel's measured table (``allocator.datasets``). ``--scale 10`` gives 500 nodes and
600 jobs.

Every number is computed here from the plan's pods and the cluster, independently of the planner's own checks:

1. node-resource pairs over allocatable after the plan (existing pods plus the pods the plan puts on nodes);
2. GPUs requested on the busiest pool after two plans from a cache that does not show the first plan's pods yet;
3. pod creations and deletions over 5 re-plans of the cluster with the created pods left Pending (extender mode);
4. ``largest_remainder_rows([[0, 0, 2.2e-308]], [4])``;
5. jobs whose status throughput differs by > 5 % from the throughput of the replicas placed;
6. at ``--scale 10``: converged, gap, plan seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np
from walras.kube.decode import cluster_from
from walras.planner import Snapshot, build_plan

from allocator.datasets import gavel_throughputs

LABELS = {"k80": "k80", "p100": "p100", "v100": "v100", "cpu": "cpu"}
NODE_SHAPES = {  # per pool: (nodes per 50, gpus, cpu, memory)
    "v100": (10, "8", "64", "512Gi"),
    "p100": (12, "4", "32", "256Gi"),
    "k80": (16, "4", "16", "64Gi"),
    "cpu": (12, "0", "64", "256Gi"),
}
UNITS = {"m": 1e-3, "": 1.0, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def quantity(text: Any) -> float:
    text = str(text)
    for suffix in ("Ki", "Mi", "Gi", "m"):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * UNITS[suffix]
    return float(text)


def cluster(scale: float = 1, seed: int = 0, n_jobs: int | None = None) -> Snapshot:
    """``50 * scale`` nodes in the four pools and ``n_jobs`` jobs (default ``60 * scale``)."""
    rng = np.random.default_rng(seed)
    table = gavel_throughputs()
    nodes = []
    for pool, (count, gpus, cpu, memory) in NODE_SHAPES.items():
        for k in range(round(count * scale)):
            alloc = {"cpu": cpu, "memory": memory, "pods": "110"}
            if gpus != "0":
                alloc["nvidia.com/gpu"] = gpus
            nodes.append({"kind": "Node", "metadata": {"name": f"{pool}-{k:03d}", "labels": {"pool": pool}},
                          "spec": {}, "status": {"allocatable": alloc,
                                                 "conditions": [{"type": "Ready", "status": "True"}]}})
    pools = [
        {"kind": "ResourcePool", "metadata": {"name": "v100"}, "spec": {"nodeSelector": {"pool": "v100"},
         "resource": "nvidia.com/gpu", "policy": {"type": "utility"}}},
        {"kind": "ResourcePool", "metadata": {"name": "p100"}, "spec": {"nodeSelector": {"pool": "p100"},
         "resource": "nvidia.com/gpu", "degreeLimit": 3, "policy": {"type": "throughput"}}},
        {"kind": "ResourcePool", "metadata": {"name": "k80"}, "spec": {"nodeSelector": {"pool": "k80"},
         "resource": "nvidia.com/gpu", "policy": {"type": "fair"}}},
        {"kind": "ResourcePool", "metadata": {"name": "cpu"}, "spec": {"nodeSelector": {"pool": "cpu"},
         "resource": "cpu", "policy": {"type": "colocation", "colocation": {"profile": "web"}}}},
    ]
    profile = {"kind": "ColocationProfile", "metadata": {"name": "web"},
               "spec": {"types": ["api", "batch"], "interference": [[0.2, 0.5], [0.3, 0.1]],
                        "cost": {"type": "convex", "exponent": 2}}}
    single = [i for i, s in enumerate(table.scale_factors) if s == 1 and np.all(np.isfinite(table.throughput[i]))
              and np.all(table.throughput[i] > 0)]
    jobs = []
    template = {"spec": {"containers": [{"name": "main", "image": "x"}]}}
    for i in range(n_jobs if n_jobs is not None else round(60 * scale)):
        kind = ("inference", "finetune", "elastic", "service")[i % 4]
        row = table.throughput[single[int(rng.integers(len(single)))]]
        tp = {"k80": float(row[0]), "p100": float(row[1]), "v100": float(row[2])}
        name = f"{kind}-{i:04d}"
        ns = ("research", "prod", "batch")[i % 3]
        if kind == "service":
            spec = {"throughput": {"cpu": 1.0}, "utility": {"type": "log"}, "demand": float(rng.choice([1, 2, 4])),
                    "replicas": {"count": int(rng.integers(2, 8))}, "resources": {"memory": "4Gi"},
                    "colocation": {"type": str(rng.choice(["api", "batch"])), "size": 1}}
        elif kind == "inference":
            spec = {"throughput": {k: round(v, 3) for k, v in tp.items() if k != "k80"}, "utility": {"type": "log"},
                    "demand": 1, "replicas": {"count": int(rng.integers(1, 4))},
                    "resources": {"cpu": str(int(rng.choice([4, 8]))), "memory": "32Gi"}}
        elif kind == "finetune":
            spec = {"throughput": {k: round(v, 3) for k, v in tp.items()}, "utility": {"type": "linear"},
                    "demand": float(rng.choice([1, 2])), "replicas": {"count": int(rng.integers(2, 7))},
                    "resources": {"cpu": str(int(rng.choice([8, 16]))), "memory": str(rng.choice(["64Gi", "128Gi"]))}}
        else:
            spec = {"throughput": {k: round(v, 3) for k, v in tp.items()},
                    "utility": {"type": "target-priority", "target": round(float(np.median(list(tp.values()))), 3)},
                    "demand": 1, "replicas": {"min": 1, "max": 8}, "resources": {"cpu": "4", "memory": "16Gi"}}
        spec["template"] = template
        jobs.append({"kind": "FungibleJob", "metadata": {"name": name, "namespace": ns, "generation": 1,
                                                          "uid": f"uid-{name}"}, "spec": spec})
    return Snapshot(nodes=tuple(nodes), pools=tuple(pools), jobs=tuple(jobs), profiles=(profile,))


def pod_objects(plan: Any, *, bound: bool, phase: str) -> list[dict[str, Any]]:
    out = []
    for p in plan.pods:
        if p.action == "delete" or p.node is None:
            continue
        out.append({"kind": "Pod", "metadata": {"name": p.name, "namespace": p.namespace,
                                                 "uid": f"u-{p.namespace}-{p.name}", "resourceVersion": "1",
                                                 "labels": {"walras.dev/job": p.job, "walras.dev/pool": p.pool,
                                                            "walras.dev/managed": "true"}},
                    "spec": {**({"nodeName": p.node} if bound else {}),
                             "containers": [{"name": "main", "resources": {"requests": dict(p.requests),
                                                                           "limits": dict(p.limits)}}]},
                    "status": {"phase": phase}})
    return out


def over_committed(snapshot: Snapshot, plan: Any) -> int:
    """Node-resource pairs (pods included) over allocatable once the plan's pods are on their nodes."""
    alloc = {n["metadata"]["name"]: {k: quantity(v) for k, v in n["status"]["allocatable"].items()}
             for n in snapshot.nodes}
    used: dict[str, dict[str, float]] = {name: {"pods": 0.0} for name in alloc}
    existing = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in snapshot.pods}
    placed: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
    for p in snapshot.pods:
        if p["spec"].get("nodeName"):
            placed[(p["metadata"]["namespace"], p["metadata"]["name"])] = (p["spec"]["nodeName"],
                                                                            p["spec"]["containers"][0]["resources"]
                                                                            .get("requests", {}))
    for p in plan.pods:
        key = (p.namespace, p.name)
        if p.action in ("create", "bind") and p.node and key not in placed:
            placed[key] = (p.node, p.requests)
        elif p.action == "resize" and key in placed:
            placed[key] = (placed[key][0], {**placed[key][1], **p.requests})
    del existing
    for node, requests in placed.values():
        row = used.setdefault(node, {"pods": 0.0})
        row["pods"] += 1
        for k, v in requests.items():
            row[k] = row.get(k, 0.0) + quantity(v)
    return sum(1 for node, row in used.items() for k, v in row.items() if v > alloc.get(node, {}).get(k, 0.0) + 1e-9)


def status_mismatch(snapshot: Snapshot, plan: Any) -> int:
    """Jobs whose status throughput is off by > 5 % from sum_j a_ij placed_ij / N_i of the replicas with a node."""
    specs = {(j["metadata"]["namespace"], j["metadata"]["name"]): j["spec"] for j in snapshot.jobs}
    count = 0
    for key, jp in plan.jobs.items():
        spec = specs.get(key)
        if spec is None or jp.phase in ("Invalid", "Unschedulable"):
            continue
        replicas = spec["replicas"].get("count", spec["replicas"].get("max", 1))
        placed: dict[str, int] = {}
        for p in jp.pods:
            if p.action != "delete" and p.node is not None:
                placed[p.pool] = placed.get(p.pool, 0) + 1
        actual = sum(spec["throughput"].get(pool, 0.0) * n for pool, n in placed.items()) / max(replicas, 1)
        if abs(jp.throughput - actual) > 0.05 * max(actual, 1e-9) and (actual > 0 or jp.throughput > 0):
            count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/scenario.py", description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="after")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"label": args.label, "load": os.getloadavg()[0]}
    snap = cluster(1, args.seed)
    plan = build_plan(cluster_from(snap))
    out["1_overcommitted_pairs"] = over_committed(snap, plan)
    out["5_status_mismatch_jobs"] = status_mismatch(snap, plan)
    out["jobs"] = len(snap.jobs)
    # 2. a stale cache: the second plan does not see the first plan's pods (bound by the operator meanwhile)
    truth = Snapshot(snap.nodes, tuple(pod_objects(plan, bound=True, phase="Running")), snap.pools, snap.jobs,
                     snap.profiles)
    more = [dict(j, spec=dict(j["spec"], replicas={"count": 8})) if "finetune" in j["metadata"]["name"] else j
            for j in snap.jobs]
    stale = Snapshot(snap.nodes, (), snap.pools, tuple(more), snap.profiles)
    try:
        from walras.kube.decode import pod_from

        assumed = [pod_from(p) for p in truth.pods]
        second = build_plan(cluster_from(stale), plan, assumed=assumed)
        out["2_cache"] = "assumed pods"
    except (ImportError, TypeError):
        second = build_plan(cluster_from(stale), plan)
        out["2_cache"] = "none"
    out["2_overcommitted_pairs_stale_cache"] = over_committed(
        Snapshot(snap.nodes, truth.pods, snap.pools, tuple(more), snap.profiles), second)
    # 3. pods created and left Pending (extender mode): re-plan 5 times
    pending = pod_objects(plan, bound=False, phase="Pending")
    churn = 0
    prev = plan
    for _ in range(5):
        state = Snapshot(snap.nodes, tuple(pending), snap.pools, snap.jobs, snap.profiles)
        prev = build_plan(cluster_from(state), prev)
        churn += sum(1 for p in prev.pods if p.action in ("create", "delete"))
        gone = {(p.namespace, p.name) for p in prev.pods if p.action == "delete"}
        pending = [p for p in pending if (p["metadata"]["namespace"], p["metadata"]["name"]) not in gone]
        pending += [x for x in pod_objects(prev, bound=False, phase="Pending")
                    if any(p.name == x["metadata"]["name"] and p.action == "create" for p in prev.pods)]
    out["3_creates_deletes_in_5_replans_pending"] = churn
    # 4. rounding
    try:
        from walras.planner.replicas import largest_remainder_rows
    except ImportError:
        from walras.planner.plan import largest_remainder_rows  # type: ignore[attr-defined,no-redef]
    try:
        out["4_rounding"] = largest_remainder_rows(np.array([[0.0, 0.0, 2.2e-308]]), np.array([4])).tolist()
    except Exception as exc:
        out["4_rounding"] = f"{type(exc).__name__}: {exc}"
    # 6. ten times the size
    big = cluster(10, args.seed)
    start = time.perf_counter()
    big_plan = build_plan(cluster_from(big))
    out["6_scale10_seconds"] = round(time.perf_counter() - start, 3)
    out["6_scale10_converged"] = big_plan.solver.converged
    out["6_scale10_gap"] = round(big_plan.solver.gap, 4)
    out["6_scale10_overcommitted_pairs"] = over_committed(big, big_plan)
    out["6_scale10_jobs_not_converged_condition"] = sum(
        1 for e in big_plan.events if e.reason == "SolverNotConverged")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
