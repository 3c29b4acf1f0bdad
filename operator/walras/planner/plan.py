"""``build_plan(snapshot, previous) -> Plan``: the pure planning pass of Walras.

Steps (all deterministic for a given snapshot; objects are processed in name order):

1. Parse nodes (Ready, schedulable, allocatable) and pods (what they request and where they run).
2. Validate the ColocationProfiles, ResourcePools and FungibleJobs (:mod:`walras.planner.spec`). A semantically bad
   object gets a condition and a Warning event and is left out; planning goes on for the rest.
3. Pool capacity ``R_j``: the priced resource's allocatable summed over the pool's Ready, schedulable nodes (or the
   pool's override), minus what pods Walras does not manage already use there.
4. The market (paper 004, Alg. 2, :mod:`walras.planner.market`): prices ``p`` and time fractions ``X`` maximising
   ``sum_i u_i(a_i^T x_i)`` subject to ``sum_i d_ij x_ij <= R_j``, warm-started from the previous plan's prices.
5. Replicas: job i gets ``round(N_i sum_j x_ij)`` pods split over pools by largest remainder of ``N_i x_ij``.
6. Pods that run stay; surplus pods are deleted; pending pods and new replicas are placed by each pool's policy
   (:mod:`walras.planner.policies`) on the capacity and degree slots left by running pods.
7. Statuses (PoolPlan, JobPlan), the pod list and Events.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from walras.planner.market import solve_market, utility_values
from walras.planner.model import (
    LABEL_JOB,
    LABEL_MANAGED,
    LABEL_POOL,
    Condition,
    JobPlan,
    Plan,
    PlanEvent,
    PodAction,
    PodPlan,
    PoolPlan,
    Snapshot,
    SolverStats,
)
from walras.planner.policies import (
    UNLIMITED,
    PlacementRequest,
    PlacementResult,
    SpreadPolicy,
    check_result,
    get_policy,
    largest_remainder,
)
from walras.planner.quantity import format_quantity, parse_quantity
from walras.planner.spec import JobSpec, PoolSpec, ProfileSpec, parse_job, parse_pool, parse_profile

_TERMINAL = ("Succeeded", "Failed")
_GONE = -2
_NAME_SAFE = re.compile(r"[^a-z0-9-]+")


@dataclass
class _Nodes:
    names: list[str]
    labels: list[Mapping[str, str]]
    usable: np.ndarray
    allocatable: list[Mapping[str, Any]]
    index: dict[str, int]
    _cache: dict[str, np.ndarray] = field(default_factory=dict)
    _by_label: dict[tuple[str, str], np.ndarray] | None = None

    def select(self, selector: Mapping[str, str]) -> np.ndarray:
        """Boolean mask of the nodes whose labels include every ``key: value`` of ``selector``."""
        if self._by_label is None:
            index: dict[tuple[str, str], list[int]] = defaultdict(list)
            for k, labels in enumerate(self.labels):
                for item in labels.items():
                    index[item].append(k)
            self._by_label = {item: np.array(ks, dtype=np.int64) for item, ks in index.items()}
        mask = np.ones(len(self.names), dtype=bool)
        for item in selector.items():
            hit = np.zeros(len(self.names), dtype=bool)
            found = self._by_label.get(item)
            if found is not None:
                hit[found] = True
            mask &= hit
        return mask

    def resource(self, name: str) -> np.ndarray:
        """Allocatable amount of resource ``name`` per node (0 where absent or malformed)."""
        if name not in self._cache:
            out = np.zeros(len(self.names))
            for k, alloc in enumerate(self.allocatable):
                raw = alloc.get(name)
                if raw is not None:
                    try:
                        out[k] = parse_quantity(raw)
                    except ValueError:
                        out[k] = 0.0
            self._cache[name] = out
        return self._cache[name]


def _parse_nodes(objs: Iterable[Mapping[str, Any]]) -> _Nodes:
    rows = []
    for obj in objs:
        meta = obj.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str):
            continue
        status = obj.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in (status.get("conditions") or []))
        schedulable = not (obj.get("spec") or {}).get("unschedulable", False)
        rows.append((name, meta.get("labels") or {}, ready and schedulable, status.get("allocatable") or {}))
    rows.sort(key=lambda r: r[0])
    names = [r[0] for r in rows]
    return _Nodes(
        names=names,
        labels=[r[1] for r in rows],
        usable=np.array([r[2] for r in rows], dtype=bool),
        allocatable=[r[3] for r in rows],
        index={n: k for k, n in enumerate(names)},
    )


@dataclass
class _Pod:
    namespace: str
    name: str
    node: int  # index into nodes; -1 when not bound; _GONE when bound to a node that no longer exists
    requests: dict[str, float]
    job: str | None
    pool_label: str | None


def _pod_requests(spec: Mapping[str, Any]) -> dict[str, float]:
    """Sum of the containers' requests (a limit stands in for a missing request, as Kubernetes defaults it)."""
    total: dict[str, float] = {}
    for container in spec.get("containers") or ():
        resources = container.get("resources")
        if not resources:
            continue
        requests = resources.get("requests")
        limits = resources.get("limits")
        key = (tuple(requests.items()) if requests else (), tuple(limits.items()) if limits else ())
        for name, value in _parsed(key):
            total[name] = total.get(name, 0.0) + value
    return total


@lru_cache(maxsize=4096)
def _parsed(key: tuple[tuple[tuple[str, Any], ...], tuple[tuple[str, Any], ...]]) -> tuple[tuple[str, float], ...]:
    merged = {**dict(key[1]), **dict(key[0])}
    out = []
    for name, raw in merged.items():
        try:
            out.append((name, parse_quantity(raw)))
        except ValueError:
            continue
    return tuple(out)


def _parse_pods(objs: Iterable[Mapping[str, Any]], nodes: _Nodes) -> list[_Pod]:
    pods = []
    for obj in objs:
        meta = obj.get("metadata") or {}
        if (obj.get("status") or {}).get("phase") in _TERMINAL:
            continue
        spec = obj.get("spec") or {}
        labels = meta.get("labels") or {}
        managed = labels.get(LABEL_MANAGED) == "true" and LABEL_JOB in labels
        node_name = spec.get("nodeName")
        pods.append(
            _Pod(
                namespace=meta.get("namespace") or "default",
                name=str(meta.get("name")),
                node=nodes.index.get(node_name, _GONE) if node_name else -1,
                requests=_pod_requests(spec),
                job=labels.get(LABEL_JOB) if managed else None,
                pool_label=labels.get(LABEL_POOL) if managed else None,
            )
        )
    pods.sort(key=lambda p: (p.namespace, p.name))
    return pods


def _object_name(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "<unnamed>")


@dataclass
class _Pool:
    spec: PoolSpec
    members: np.ndarray  # node indices (usable and not usable) claimed by this pool
    usable: np.ndarray  # usable member node indices
    capacity: float
    market_capacity: float
    profile: ProfileSpec | None


def _pod_name(job: str, pool: str, k: int) -> str:
    base = _NAME_SAFE.sub("-", f"{job}-{pool}".lower()).strip("-")[:240]
    return f"{base}-{k}"


def build_plan(snapshot: Snapshot, previous: Plan | None = None, *, device: str = "cpu") -> Plan:
    """Plan prices, allocations and pod placements for ``snapshot`` (warm-started from ``previous``'s prices).

    Pure and deterministic: no I/O, objects in name order, ties broken by index. See the module docstring for the
    steps; ``device`` is the torch device of the price discovery (``"cuda"`` where available).
    """
    started = time.perf_counter()
    plan = Plan()
    nodes = _parse_nodes(snapshot.nodes)
    pods = _parse_pods(snapshot.pods, nodes)
    events = plan.events

    def warn(kind: str, namespace: str, name: str, reason: str, message: str) -> None:
        events.append(PlanEvent(kind, namespace, name, "Warning", reason, message))

    # --- ColocationProfiles -------------------------------------------------------------------------------------
    profiles: dict[str, ProfileSpec] = {}
    for obj in sorted(snapshot.profiles, key=_object_name):
        _, name = _object_name(obj)
        try:
            parsed = parse_profile(obj)
        except ValueError as exc:
            plan.profiles[name] = [Condition("Valid", "False", "InvalidSpec", str(exc))]
            warn("ColocationProfile", "", name, "InvalidSpec", str(exc))
            continue
        profiles[name] = parsed
        plan.profiles[name] = [Condition("Valid", "True", "Valid", f"{len(parsed.types)} types")]

    # --- ResourcePools -------------------------------------------------------------------------------------------
    pools: list[_Pool] = []
    claimed = np.full(len(nodes.names), -1, dtype=np.int64)
    foreign = [p for p in pods if p.job is None and p.node >= 0]
    for obj in sorted(snapshot.pools, key=_object_name):
        _, name = _object_name(obj)
        try:
            spec = parse_pool(obj)
        except ValueError as exc:
            plan.pools[name] = PoolPlan(name, "", "", 0, [], 0.0, 0.0, 0.0, 0.0)
            plan.pools[name].conditions.append(Condition("Valid", "False", "InvalidSpec", str(exc)))
            warn("ResourcePool", "", name, "InvalidSpec", str(exc))
            continue
        conditions: list[Condition] = []
        profile: ProfileSpec | None = None
        if spec.policy == "colocation":
            profile = profiles.get(spec.profile or "")
            if profile is None:
                message = f"ColocationProfile {spec.profile!r} does not exist or is invalid"
                pp = PoolPlan(name, spec.resource, spec.policy, 0, [], 0.0, 0.0, 0.0, 0.0)
                pp.conditions.append(Condition("Valid", "False", "ProfileNotFound", message))
                plan.pools[name] = pp
                warn("ResourcePool", "", name, "ProfileNotFound", message)
                continue
        match = nodes.select(spec.node_selector)
        overlap = match & (claimed >= 0)
        if overlap.any():
            other = pools[int(claimed[np.flatnonzero(overlap)[0]])].spec.name
            message = f"{int(overlap.sum())} node(s) also match pool {other!r}; they stay in {other!r}"
            conditions.append(Condition("NodesOverlap", "True", "SelectorOverlap", message))
            warn("ResourcePool", "", name, "SelectorOverlap", message)
        members = np.flatnonzero(match & (claimed < 0))
        claimed[members] = len(pools)
        usable = members[nodes.usable[members]]
        allocatable = float(nodes.resource(spec.resource)[usable].sum())
        capacity = allocatable if spec.capacity is None else spec.capacity
        in_pool = set(usable.tolist())
        foreign_use = sum(p.requests.get(spec.resource, 0.0) for p in foreign if p.node in in_pool)
        pools.append(_Pool(spec, members, usable, capacity, max(capacity - foreign_use, 0.0), profile))
        conditions.insert(0, Condition("Valid", "True", "Valid", f"{usable.size} usable node(s)"))
        if usable.size == 0:
            conditions.append(Condition("Ready", "False", "NoNodes", "no Ready, schedulable node matches"))
            warn("ResourcePool", "", name, "NoNodes", "no Ready, schedulable node matches the pool's nodeSelector")
        else:
            conditions.append(Condition("Ready", "True", "NodesReady", f"{usable.size} node(s) ready"))
        plan.pools[name] = PoolPlan(
            name=name,
            resource=spec.resource,
            policy=spec.policy,
            node_count=int(usable.size),
            nodes=[nodes.names[k] for k in usable],
            capacity=capacity,
            used=0.0,
            price=0.0,
            utilisation=0.0,
            conditions=conditions,
        )
    pool_index = {p.spec.name: j for j, p in enumerate(pools)}
    m = len(pools)

    # --- FungibleJobs ------------------------------------------------------------------------------------------
    jobs: list[JobSpec] = []
    usable_pools: list[np.ndarray] = []
    for obj in sorted(snapshot.jobs, key=lambda o: (_object_name(o)[0] or "default", _object_name(o)[1])):
        namespace, name = _object_name(obj)
        namespace = namespace or "default"
        generation = (obj.get("metadata") or {}).get("generation")
        try:
            job = parse_job(obj)
        except ValueError as exc:
            jp = JobPlan(namespace, name, "Invalid", observed_generation=generation)
            jp.conditions.append(Condition("Valid", "False", "InvalidSpec", str(exc)))
            plan.jobs[(namespace, name)] = jp
            warn("FungibleJob", namespace, name, "InvalidSpec", str(exc))
            continue
        jp = JobPlan(namespace, name, "Pending", observed_generation=job.generation, target=job.utility.target)
        plan.jobs[job.key] = jp
        ok = np.zeros(m, dtype=bool)
        problems: list[str] = []
        for pool_name, value in sorted(job.throughput.items()):
            j = pool_index.get(pool_name)
            if j is None:
                problems.append(f"throughput names unknown or invalid pool {pool_name!r}")
                continue
            pool = pools[j]
            if value <= 0:
                continue
            biggest = float(nodes.resource(pool.spec.resource)[pool.usable].max()) if pool.usable.size else 0.0
            if job.demand > biggest + 1e-9:
                problems.append(
                    f"demand {job.demand:g} {pool.spec.resource} per replica exceeds the largest node of pool "
                    f"{pool_name!r} ({biggest:g})"
                )
                continue
            if pool.profile is not None:
                if job.colocation_type is None:
                    problems.append(f"pool {pool_name!r} uses the colocation policy but spec.colocation is missing")
                    continue
                if job.colocation_type not in pool.profile.types:
                    message = (
                        f"type {job.colocation_type!r} of job {namespace}/{name} is missing from the profile's "
                        f"types {list(pool.profile.types)}"
                    )
                    problems.append(f"pool {pool_name!r}: {message}")
                    plan.profiles[pool.profile.name].append(Condition("TypesComplete", "False", "MissingType", message))
                    warn("ColocationProfile", "", pool.profile.name, "MissingType", message)
                    continue
            ok[j] = True
        for problem in problems:
            warn("FungibleJob", namespace, name, "PoolUnusable", problem)
        if problems:
            jp.conditions.append(Condition("PoolsValid", "False", "PoolUnusable", "; ".join(problems)))
        else:
            jp.conditions.append(Condition("PoolsValid", "True", "PoolsValid", ""))
        if not ok.any():
            jp.phase = "Unschedulable"
            message = "the job can run in no pool (no listed pool exists, has nodes and throughput > 0 for it)"
            jp.conditions.append(Condition("Schedulable", "False", "NoUsablePool", message))
            warn("FungibleJob", namespace, name, "NoUsablePool", message)
            continue
        jobs.append(job)
        usable_pools.append(ok)
    n = len(jobs)

    # --- The market (004, Alg. 2) -------------------------------------------------------------------------------
    A = np.zeros((n, m))
    for i, job in enumerate(jobs):
        for jj in np.flatnonzero(usable_pools[i]).tolist():
            A[i, jj] = job.throughput[pools[jj].spec.name]
    replicas_max = np.array([job.replicas for job in jobs], dtype=np.float64)
    per_replica = np.array([job.demand for job in jobs], dtype=np.float64)
    D = np.repeat((np.maximum(replicas_max, 1.0) * per_replica)[:, None], m, axis=1) if n else np.zeros((0, m))
    R = np.array([p.market_capacity for p in pools])
    active = np.flatnonzero(replicas_max > 0)
    warm = None
    if previous is not None and m:
        old = previous.prices
        if all(p.spec.name in old for p in pools):
            warm = np.array([old[p.spec.name] for p in pools])
    market = solve_market(
        A[active],
        R,
        [jobs[i].utility for i in active],
        [1.0] * active.size,
        D[active],
        warm,
        device=device,
    )
    X = np.zeros((n, m))
    X[active] = market.allocation
    prices = market.prices
    plan.solver = SolverStats(
        iterations=market.iterations,
        gap=market.gap,
        primal=market.primal,
        dual=market.dual,
        converged=market.converged,
        seconds=market.seconds,
        device=market.device,
    )
    if market.repaired > 1e-6:
        plan.events.append(
            PlanEvent(
                "ResourcePool",
                "",
                pools[0].spec.name if pools else "",
                "Warning",
                "MarketInfeasible",
                f"the price solver's allocation broke a constraint by {market.repaired:.3g}; scaled back to feasible",
            )
        )
    if not market.converged:
        plan.events.append(
            PlanEvent(
                "ResourcePool",
                "",
                pools[0].spec.name if pools else "",
                "Warning",
                "SolverNotConverged",
                f"price discovery stopped after {market.iterations} evaluations with duality gap {market.gap:.4g}",
            )
        )

    # --- Replicas per pool (largest remainder, totals preserved, running pods stay) --------------------------------
    # running[i, j]: job i's pods bound to an existing node of pool j that the job may use. They stay where they are
    # (issue 7): the market's split only decides where the job's *new* replicas go, and running pods are deleted only
    # when the job shrinks in total (or their node is gone, or the job can no longer use their pool).
    job_row = {job.key: i for i, job in enumerate(jobs)}
    running = np.zeros((n, m), dtype=np.int64)
    for pod in pods:
        if pod.job is None or pod.node < 0 or claimed[pod.node] < 0:
            continue
        i = job_row.get((pod.namespace, pod.job), -1)
        if i >= 0 and usable_pools[i][int(claimed[pod.node])]:
            running[i, int(claimed[pod.node])] += 1
    replicas = np.zeros((n, m), dtype=np.int64)
    for i, job in enumerate(jobs):
        shares = job.replicas * X[i]
        total = min(job.replicas, int(np.floor(shares.sum() + 0.5)))
        if job.elastic and total < job.min_replicas:
            total = 0
        if total > 0:
            replicas[i] = split_replicas(largest_remainder(shares, total), running[i])

    # --- Existing pods: keep, bind candidates, surplus ------------------------------------------------------------
    managed: dict[tuple[str, str], list[_Pod]] = defaultdict(list)
    for pod in pods:
        if pod.job is not None:
            managed[(pod.namespace, pod.job)].append(pod)
    pod_plans: dict[tuple[str, str], list[PodPlan]] = defaultdict(list)
    # used[j][k]: priced resource in use on pool j's node k (bound pods of every kind, surplus included)
    used_by_node = {j: np.zeros(len(nodes.names)) for j in range(m)}
    walras_count = np.zeros(len(nodes.names), dtype=np.int64)
    for pod in pods:
        if pod.node >= 0 and claimed[pod.node] >= 0:
            j = int(claimed[pod.node])
            used_by_node[j][pod.node] += pod.requests.get(pools[j].spec.resource, 0.0)
            if pod.job is not None:
                walras_count[pod.node] += 1
    to_place: dict[int, list[tuple[int, _Pod, bool]]] = defaultdict(list)  # pool -> (job row, pod, exists)
    unplaceable: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for key in sorted(set(managed) | set(job_row)):
        namespace, name = key
        row = job_row.get(key)
        existing = managed.get(key, [])
        frozen = plan.jobs.get(key)
        if row is None and frozen is not None and frozen.phase == "Invalid":
            # A job whose spec became invalid keeps its pods as they are until it is fixed or deleted: one bad edit
            # must not tear down a running job.
            for pod in existing:
                node_name = nodes.names[pod.node] if pod.node >= 0 else None
                pod_plans[key].append(
                    PodPlan(
                        namespace,
                        pod.name,
                        name,
                        pod.pool_label or "",
                        node_name,
                        _fmt(pod.requests),
                        _fmt(pod.requests),
                        "keep",
                        True,
                    )
                )
            continue
        wanted = replicas[row] if row is not None else np.zeros(m, dtype=np.int64)
        kept = np.zeros(m, dtype=np.int64)
        pending_by_pool: dict[int, list[_Pod]] = defaultdict(list)
        for pod in existing:
            j = int(claimed[pod.node]) if pod.node >= 0 else pool_index.get(pod.pool_label or "", -1)
            pool_name = pools[j].spec.name if j >= 0 else (pod.pool_label or "")
            if pod.node >= 0:
                if j >= 0 and kept[j] < wanted[j]:
                    kept[j] += 1
                    pod_plans[key].append(
                        PodPlan(
                            namespace,
                            pod.name,
                            name,
                            pool_name,
                            nodes.names[pod.node],
                            _fmt(pod.requests),
                            _fmt(pod.requests),
                            "keep",
                            True,
                        )
                    )
                else:
                    pod_plans[key].append(
                        PodPlan(namespace, pod.name, name, pool_name, nodes.names[pod.node], {}, {}, "delete", True)
                    )
            elif j >= 0 and pod.node != _GONE:
                pending_by_pool[j].append(pod)
            else:
                pod_plans[key].append(PodPlan(namespace, pod.name, name, pool_name, None, {}, {}, "delete", True))
        if row is None:
            continue
        taken = {pod.name for pod in existing}
        counter = 0
        for j in range(m):
            left = int(wanted[j] - kept[j])
            for pod in pending_by_pool.get(j, []):
                if left > 0:
                    to_place[j].append((row, pod, True))
                    left -= 1
                else:
                    pod_plans[key].append(
                        PodPlan(namespace, pod.name, name, pools[j].spec.name, None, {}, {}, "delete", True)
                    )
            base = _pod_name(name, pools[j].spec.name, 0)[:-2]
            for _ in range(left):
                while f"{base}-{counter}" in taken:
                    counter += 1
                new_name = f"{base}-{counter}"
                taken.add(new_name)
                to_place[j].append((row, _Pod(namespace, new_name, -1, {}, name, pools[j].spec.name), False))
            counter = 0

    # --- Placement inside each pool ------------------------------------------------------------------------------
    for j, pool in enumerate(pools):
        pp = plan.pools[pool.spec.name]
        entries = to_place.get(j, [])
        nodes_k = pool.usable
        alloc_k = nodes.resource(pool.spec.resource)[nodes_k]
        free = np.maximum(alloc_k - used_by_node[j][nodes_k], 0.0)
        degree = pool.spec.degree_limit
        slots = (
            np.full(nodes_k.size, UNLIMITED, dtype=np.int64)
            if degree is None
            else np.maximum(degree - walras_count[nodes_k], 0).astype(np.int64)
        )
        rows = sorted({row for row, _, _ in entries})
        local = {row: q for q, row in enumerate(rows)}
        pool_jobs = [jobs[r] for r in rows]
        pod_local = np.array([local[row] for row, _, _ in entries], dtype=np.int64)
        extra_resources = sorted({r for job in pool_jobs for r in job.resources if r != pool.spec.resource})
        resource_names = [pool.spec.resource, *extra_resources]
        node_resources = np.zeros((nodes_k.size, len(resource_names)))
        node_resources[:, 0] = free
        for r, res in enumerate(extra_resources, start=1):
            use = np.zeros(len(nodes.names))
            for pod in pods:
                if pod.node >= 0 and claimed[pod.node] == j:
                    use[pod.node] += pod.requests.get(res, 0.0)
            node_resources[:, r] = np.maximum(nodes.resource(res)[nodes_k] - use[nodes_k], 0.0)
        request = PlacementRequest(
            pool=pool.spec,
            node_names=[nodes.names[k] for k in nodes_k],
            free=free,
            slots=slots,
            resource_names=resource_names,
            node_resources=node_resources,
            jobs=pool_jobs,
            job_pods=np.bincount(pod_local, minlength=len(rows)).astype(np.int64),
            job_throughput=np.array([A[r, j] for r in rows]),
            job_replicas_total=np.array([max(jobs[r].replicas, 1) for r in rows], dtype=np.float64),
            pod_job=pod_local,
            profile=pool.profile,
        )
        result = _place(request, pp, warn)
        planned = 0
        for q, (row, pod, exists) in enumerate(entries):
            job = jobs[row]
            k = int(result.node[q])
            node_name = request.node_names[k] if k >= 0 else None
            if k < 0 and not exists:
                # A new replica the pool's policy cannot place is not created (it would sit Pending with no node);
                # the job's status counts it as unplaceable and says why.
                unplaceable[job.key][pool.spec.name] += 1
                continue
            amount = float(result.amount[q]) if k >= 0 else job.demand
            requests = {
                **job.resource_text,
                pool.spec.resource: format_quantity(amount),
            }
            action: PodAction
            if exists:
                action = "bind" if node_name is not None else "keep"
            else:
                action = "create"
            pod_plans[job.key].append(
                PodPlan(
                    job.namespace,
                    pod.name,
                    job.name,
                    pool.spec.name,
                    node_name,
                    requests,
                    dict(requests),
                    action,
                    exists,
                )
            )
            if k >= 0:
                planned += 1
                used_by_node[j][nodes_k[k]] += amount
        kept_here = int(walras_count[nodes_k].sum())
        price = float(prices[j]) if j < prices.size else 0.0
        pp.price = price
        pp.used = float(used_by_node[j][nodes_k].sum())
        pp.utilisation = float(min(pp.used / pool.capacity, 1.0)) if pool.capacity > 0 else 0.0
        pp.pods_planned = planned + kept_here
        pp.pods_bound = kept_here
        old_pool = previous.pools.get(pool.spec.name) if previous is not None else None
        if old_pool is None or abs(old_pool.price - price) > 1e-3 * max(abs(old_pool.price), 1e-9):
            events.append(
                PlanEvent(
                    "ResourcePool",
                    "",
                    pool.spec.name,
                    "Normal",
                    "Priced",
                    f"price {price:.6g} per {pool.spec.resource}, capacity {pool.capacity:g}",
                )
            )

    # --- Job statuses ---------------------------------------------------------------------------------------------
    t = np.einsum("ij,ij->i", A, X)
    u = utility_values([job.utility for job in jobs], [1.0] * n, t) if n else np.zeros(0)
    cost = (D * X) @ prices if n and m else np.zeros(n)
    for i, job in enumerate(jobs):
        jp = plan.jobs[job.key]
        jp.allocation = {pools[j].spec.name: round(float(X[i, j]), 6) for j in range(m) if X[i, j] > 1e-9}
        jp.pods = sorted(pod_plans.get(job.key, []), key=lambda p: p.name)
        live = [p for p in jp.pods if p.action != "delete"]
        # Replicas actually placed (running, or planned on a node); unplaceable ones are reported, not counted.
        placed: dict[str, int] = defaultdict(int)
        for p in live:
            if p.node is not None:
                placed[p.pool] += 1
        jp.replicas = {name: placed[name] for name in sorted(placed)}
        jp.throughput = float(t[i])
        jp.utility = float(u[i])
        jp.cost = float(cost[i])
        missing = unplaceable.get(job.key)
        if missing:
            detail = ", ".join(
                f"{count} in pool {name!r} (policy {plan.pools[name].policy!r} found no node with room within the "
                "degree limit)"
                for name, count in sorted(missing.items())
            )
            message = f"{sum(missing.values())} replica(s) not created: {detail}"
            jp.conditions.append(Condition("ReplicasPlaceable", "False", "Unplaceable", message))
            warn("FungibleJob", job.namespace, job.name, "Unplaceable", message)
        if job.replicas > 0 and not live:
            jp.phase = "Pending"
            if missing:
                message = "no replica of this job could be placed in its pools"
                jp.conditions.append(Condition("Scheduled", "False", "Unplaceable", message))
            else:
                message = "the market gives this job no replicas at current prices"
                jp.conditions.append(Condition("Scheduled", "False", "NoAllocation", message))
        elif live and all(p.action == "keep" and p.node is not None for p in live):
            jp.phase = "Running"
            jp.conditions.append(Condition("Scheduled", "True", "AllPodsPlaced", f"{len(live)} pod(s) running"))
        else:
            unplaced = sum(1 for p in live if p.node is None)
            jp.phase = "Pending"
            if unplaced:
                message = f"{unplaced} of {len(live)} pod(s) found no node with room in their pool"
                jp.conditions.append(Condition("Scheduled", "False", "NoRoom", message))
                warn("FungibleJob", job.namespace, job.name, "NoRoom", message)
            else:
                jp.conditions.append(Condition("Scheduled", "True", "AllPodsPlaced", f"{len(live)} pod(s) placed"))
        old_job = previous.jobs.get(job.key) if previous is not None else None
        if old_job is None or old_job.replicas != jp.replicas:
            events.append(
                PlanEvent(
                    "FungibleJob",
                    job.namespace,
                    job.name,
                    "Normal",
                    "Planned",
                    f"replicas {jp.replicas or '{}'}, throughput {jp.throughput:.4g}, cost {jp.cost:.4g}",
                )
            )
    # Pods of invalid or unschedulable jobs are listed in their status; pods of deleted jobs only in plan.pods.
    for key, plans in pod_plans.items():
        if key not in job_row:
            gone = plan.jobs.get(key)
            if gone is not None:
                gone.pods = sorted(plans, key=lambda p: p.name)
    for key in sorted(pod_plans):
        plan.pods.extend(sorted(pod_plans[key], key=lambda p: p.name))
    plan.seconds = time.perf_counter() - started
    return plan


def split_replicas(target: np.ndarray, running: np.ndarray) -> np.ndarray:
    """Replicas per pool for a job whose market split rounds to ``target`` while ``running`` pods already run.

    The total stays ``target.sum()``. When it is at least the running total, every running pod is kept and the
    remaining replicas go to the pools where ``target`` exceeds what runs there (largest remainder over those
    deficits); otherwise the job shrinks and running pods are removed one at a time from the pool that runs the most
    above its target (ties to the lower pool index). Returns an integer vector ``>= 0``.
    """
    target = np.asarray(target, dtype=np.int64)
    running = np.asarray(running, dtype=np.int64)
    total, have = int(target.sum()), int(running.sum())
    if have == 0:
        return target.copy()
    if total >= have:
        deficit = np.maximum(target - running, 0)
        extra = total - have
        if extra == 0:
            return running.copy()
        return running + largest_remainder(deficit.astype(np.float64), extra)
    out = running.copy()
    for _ in range(have - total):
        over = np.where(out > 0, out - target, np.iinfo(np.int64).min)
        out[int(np.argmax(over))] -= 1
    return out


def _fmt(requests: Mapping[str, float]) -> dict[str, str]:
    return dict(_formatted(tuple(sorted(requests.items()))))


@lru_cache(maxsize=4096)
def _formatted(items: tuple[tuple[str, float], ...]) -> tuple[tuple[str, str], ...]:
    return tuple((k, format_quantity(v)) for k, v in items)


def _place(request: PlacementRequest, pool_plan: PoolPlan, warn: Any) -> PlacementResult:
    """Run the pool's policy; if it fails or breaks a limit, fall back to spread placement and say so."""
    if request.n_pods == 0:
        return PlacementResult(node=np.zeros(0, dtype=np.int64), amount=np.zeros(0))
    try:
        result = get_policy(request.pool.policy).place(request)
        check_result(request, result)
        return result
    except Exception as exc:  # a failing policy must not stop the plan: fall back and report it
        message = f"policy {request.pool.policy!r} failed ({exc}); pods placed most-free-node first instead"
        pool_plan.conditions.append(Condition("PolicyApplied", "False", "PolicyFallback", message))
        warn("ResourcePool", "", request.pool.name, "PolicyFallback", message)
        result = SpreadPolicy().place(request)
        check_result(request, result)
        return result
