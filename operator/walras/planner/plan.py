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

import gc
import hashlib
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
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
    PlacementMemo,
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


@dataclass(slots=True)
class _Pod:
    namespace: str
    name: str
    node: int  # index into nodes; -1 when not bound; _GONE when bound to a node that no longer exists
    requests: dict[str, float]
    job: str | None
    pool_label: str | None
    text: tuple[tuple[str, str], ...] = ()  # the requests formatted as quantities, sorted by resource name
    first: _ResourcesKey = ((), ())  # the first container's (requests, limits) items: what Walras sets and resizes


_ResourcesKey = tuple[tuple[tuple[str, Any], ...], tuple[tuple[str, Any], ...]]
_NO_RESOURCES: _ResourcesKey = ((), ())


def _pod_requests(spec: Mapping[str, Any]) -> tuple[dict[str, float], tuple[tuple[str, str], ...], _ResourcesKey]:
    """Sum of the containers' requests (a limit stands in for a missing request, as Kubernetes defaults it), the
    same sums formatted as quantities (sorted by resource name), and the first container's own (requests, limits)."""
    containers = spec.get("containers") or ()
    keys = []
    first = _NO_RESOURCES
    for container in containers:
        resources = container.get("resources")
        if not resources:
            continue
        requests = resources.get("requests")
        limits = resources.get("limits")
        keys.append((tuple(requests.items()) if requests else (), tuple(limits.items()) if limits else ()))
    if len(keys) == 1:
        parsed, text, canonical = _parsed(keys[0])
        return dict(parsed), text, (canonical if containers[0].get("resources") else first)
    total: dict[str, float] = {}
    for c, key in enumerate(keys):
        parsed, _, canonical = _parsed(key)
        if c == 0 and containers[0].get("resources"):
            first = canonical
        for name, value in parsed:
            total[name] = total.get(name, 0.0) + value
    return total, _formatted(tuple(sorted(total.items()))), first


@lru_cache(maxsize=4096)
def _parsed_limits(items: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, float], ...]:
    out = []
    for name, raw in items:
        try:
            out.append((name, parse_quantity(raw)))
        except ValueError:
            continue
    return tuple(out)


#: The resources Kubernetes can change in a running pod (in-place resize, KEP-1287: cpu and memory only).
RESIZABLE = frozenset({"cpu", "memory"})


@dataclass(frozen=True)
class _Resize:
    """New requests/limits of a running pod (text), the change of each request (amount), what changes in place
    (``reason``, empty when nothing does), and what cannot change in place and waits for the next pod (``later``)."""

    requests: dict[str, str]
    limits: dict[str, str]
    delta: tuple[tuple[str, float], ...]
    reason: str
    later: str = ""


def _differs(a: float, b: float) -> bool:
    return abs(a - b) > 1e-9 * max(1.0, abs(a), abs(b))


def resize_target(job: JobSpec, pool: PoolSpec, first: _ResourcesKey) -> _Resize | None:
    """What a running pod of ``job`` in ``pool`` must be resized to, or None when it already has it.

    The planned resources of a pod are the job's per-task ``spec.resources`` and, for the pool's priced resource,
    the job's demand per replica (under the ``utility`` policy the amount AA gave the pod stays: AA decides it per
    pod, issue 7). They are compared with the pod's first container (the one Walras writes): a request that differs,
    or a limit that exists and differs, needs a resize. Only cpu and memory change in place (:data:`RESIZABLE`); a
    change of any other resource (a GPU count, say) is reported in ``later``: the running pod keeps it and the next
    pod gets the new value. A resource the container does not request at all is not added in place (adding one would
    change the pod's QoS class, which in-place resize does not allow); it is reported in ``later`` too.
    """
    current = dict(_parsed(first)[0])  # requests, a limit standing in for a missing request
    limits = dict(_parsed_limits(first[1]))
    wanted = dict(job.resources)
    wanted_text = dict(job.resource_text)
    priced = pool.resource
    if pool.policy == "utility" and current.get(priced, 0.0) > 0:
        wanted[priced] = current[priced]
    else:
        wanted[priced] = job.demand
    wanted_text[priced] = format_quantity(wanted[priced])
    changes = []
    added = []
    for name in sorted(wanted):
        have = current.get(name)
        if have is None:
            if wanted[name] > 0:
                added.append(name)
            continue
        limit = limits.get(name)
        if _differs(have, wanted[name]) or (limit is not None and _differs(limit, wanted[name])):
            changes.append((name, have, wanted[name]))
    if not changes and not added:
        return None
    now = [c for c in changes if c[0] in RESIZABLE]
    later = [c for c in changes if c[0] not in RESIZABLE]
    requests = dict(_parsed(first)[1])
    limits_text = dict(_formatted(tuple(sorted(limits.items()))))
    for name, _, _ in now:
        requests[name] = wanted_text[name]
        if name in limits:
            limits_text[name] = wanted_text[name]
    reason = ", ".join(f"{name} {format_quantity(have)} -> {wanted_text[name]}" for name, have, _ in now)
    waits = ", ".join(
        [f"{name} {format_quantity(have)} -> {wanted_text[name]}" for name, have, _ in later]
        + [f"{name} not requested -> {wanted_text[name]}" for name in added]
    )
    delta = tuple((name, want - have) for name, have, want in now if _differs(have, want))
    return _Resize(requests, limits_text, delta, reason, waits)


@lru_cache(maxsize=4096)
def _parsed(key: _ResourcesKey) -> tuple[tuple[tuple[str, float], ...], tuple[tuple[str, str], ...], _ResourcesKey]:
    """A container's (requests, limits) items parsed (a limit standing in for a missing request), formatted, and
    the cached key itself: one canonical object per distinct content, so equal resources compare by identity."""
    merged = {**dict(key[1]), **dict(key[0])}
    out = []
    for name, raw in merged.items():
        try:
            out.append((name, parse_quantity(raw)))
        except ValueError:
            continue
    return tuple(out), _formatted(tuple(sorted(out))), key


def _parse_pods(
    objs: Iterable[Mapping[str, Any]], nodes: _Nodes, memo: Mapping[tuple[str, str], Any] | None = None
) -> tuple[list[_Pod], dict[tuple[str, str], Any]]:
    """The pods Walras plans around (terminal ones left out), in (namespace, name) order, and a memo for the next plan.

    The memo maps a pod's ``(metadata.uid, metadata.resourceVersion)`` to its parse (or None for a terminal pod):
    the API server changes the resourceVersion on every write, so an object with the same uid and resourceVersion has
    the same content, and the next plan (which gets this plan as ``previous``) reuses the parse instead of reading the
    object again. Objects without both fields (manifests, hand-built snapshots) are always parsed.
    """
    pods = []
    index = nodes.index
    memo = memo or {}
    out: dict[tuple[str, str], Any] = {}
    for obj in objs:
        meta = obj.get("metadata") or {}
        uid = meta.get("uid")
        rv = meta.get("resourceVersion")
        ident = (uid, rv) if uid and rv else None
        if ident is not None and ident in memo:
            hit = memo[ident]
            out[ident] = hit
            if hit is None:
                continue
            node_name, cached = hit
            node = index.get(node_name, _GONE) if node_name else -1
            if node == cached.node:
                pods.append(cached)
            else:  # the node list changed since (a node came or went): same parse, new node index
                pods.append(
                    _Pod(
                        cached.namespace,
                        cached.name,
                        node,
                        cached.requests,
                        cached.job,
                        cached.pool_label,
                        cached.text,
                        cached.first,
                    )
                )
            continue
        status = obj.get("status")
        if status and status.get("phase") in _TERMINAL:
            if ident is not None:
                out[ident] = None
            continue
        spec = obj.get("spec") or {}
        labels = meta.get("labels") or {}
        job = labels.get(LABEL_JOB)
        managed = job is not None and labels.get(LABEL_MANAGED) == "true"
        node_name = spec.get("nodeName")
        requests, text, first = _pod_requests(spec)
        pods.append(
            _Pod(
                meta.get("namespace") or "default",
                str(meta.get("name")),
                index.get(node_name, _GONE) if node_name else -1,
                requests,
                job if managed else None,
                labels.get(LABEL_POOL) if managed else None,
                text,
                first,
            )
        )
        if ident is not None:
            out[ident] = (node_name, pods[-1])
    pods.sort(key=lambda p: (p.namespace, p.name))
    return pods, out


@dataclass
class _PodTable:
    """Column view of the parsed pods for vectorised sums: node index per pod, whether Walras manages it, and (lazily,
    cached) each resource's requested amount per pod."""

    pods: list[_Pod]
    node: np.ndarray  # int64, -1 unbound, _GONE bound to a node that is gone
    managed: np.ndarray  # bool
    _amounts: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def of(cls, pods: list[_Pod]) -> _PodTable:
        node = np.fromiter((p.node for p in pods), dtype=np.int64, count=len(pods))
        managed = np.fromiter((p.job is not None for p in pods), dtype=bool, count=len(pods))
        return cls(pods, node, managed)

    def amount(self, resource: str) -> np.ndarray:
        """Requested amount of ``resource`` per pod (0 where the pod does not request it)."""
        out = self._amounts.get(resource)
        if out is None:
            values = (p.requests.get(resource, 0.0) for p in self.pods)
            out = np.fromiter(values, dtype=np.float64, count=len(self.pods))
            self._amounts[resource] = out
        return out


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


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Hold the cyclic garbage collector off while a plan is built (and restore its state afterwards).

    A plan allocates ~10^5 small acyclic objects (parsed pods, PodPlans, their dicts) next to a snapshot of a few
    10^5 more; with the collector on, the allocations trigger hundreds of generation-0 passes and, every few plans, a
    full pass over the whole snapshot (0.1-0.4 s at 20,000 pods). Paused, the same objects are examined once, by the
    next ordinary collection. Reference counting still frees everything that is not in a cycle.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def build_plan(snapshot: Snapshot, previous: Plan | None = None, *, device: str = "cpu") -> Plan:
    """Plan prices, allocations and pod placements for ``snapshot`` (warm-started from ``previous``).

    Pure and deterministic: no I/O, objects in name order, ties broken by index. ``previous`` (the last plan)
    warm-starts the prices and lends its per-pool placements to pools whose placement request is unchanged (see
    :func:`_placement`; reuse gives the placement the policy would compute). See the module docstring for the steps;
    ``device`` is the torch device of the price discovery (``"cuda"`` where available).
    """
    with _gc_paused():
        return _build_plan(snapshot, previous, device=device)


def _build_plan(snapshot: Snapshot, previous: Plan | None = None, *, device: str = "cpu") -> Plan:
    """:func:`build_plan` with the garbage collector paused."""
    started = time.perf_counter()
    plan = Plan()
    nodes = _parse_nodes(snapshot.nodes)
    pods, plan._pod_memo = _parse_pods(snapshot.pods, nodes, previous._pod_memo if previous is not None else None)
    table = _PodTable.of(pods)
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
    foreign = np.flatnonzero(~table.managed & (table.node >= 0))
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
        in_pool = np.zeros(len(nodes.names), dtype=bool)
        in_pool[usable] = True
        foreign_use = float(table.amount(spec.resource)[foreign][in_pool[table.node[foreign]]].sum())
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
    biggest_node = [float(nodes.resource(p.spec.resource)[p.usable].max()) if p.usable.size else 0.0 for p in pools]

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
            biggest = biggest_node[j]
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
    pod_row = np.array([job_row.get((pod.namespace, pod.job), -1) if pod.job else -1 for pod in pods], dtype=np.int64)
    pod_pool = np.where(table.node >= 0, claimed[np.maximum(table.node, 0)], -1)
    counted = (pod_row >= 0) & (pod_pool >= 0)
    if n and m:
        usable_matrix = np.array(usable_pools, dtype=bool).reshape(n, m)
        counted[counted] = usable_matrix[pod_row[counted], pod_pool[counted]]
    running = np.zeros((n, m), dtype=np.int64)
    np.add.at(running, (pod_row[counted], pod_pool[counted]), 1)
    replicas = np.zeros((n, m), dtype=np.int64)
    # Elastic jobs (replicas min/max) in ``fair`` pools (002): the market decides the pools and the replicas it pays
    # for; the fair mechanism decides how many replicas, up to the maximum, the job gets in its fair pools. Such a job
    # is offered ``max - (replicas planned)`` optional pods in the fair pools where the market gives it a share (or
    # where it runs), split by its market shares; the pool's fair allocation (allocator.fairness.allocate with the
    # offered pods as max_tasks) places as many as its fair share allows, and optional pods it does not place are
    # simply not created. Running pods stay (issue 7), so such a job never shrinks below what runs, except to its max.
    optional = np.zeros((n, m), dtype=np.int64)
    fair_elastic = np.zeros(n, dtype=bool)
    fair_share = np.zeros((n, m), dtype=bool)
    if n:
        replicas_max_int = np.array([job.replicas for job in jobs], dtype=np.int64)
        shares = replicas_max_int[:, None] * X
        totals = np.minimum(replicas_max_int, np.floor(shares.sum(axis=1) + 0.5).astype(np.int64))
        elastic = np.array([job.elastic for job in jobs], dtype=bool)
        low = np.array([job.min_replicas for job in jobs], dtype=np.int64)
        if m:
            fair_pool = np.array([p.spec.policy == "fair" for p in pools], dtype=bool)
            fair_share = usable_matrix & fair_pool[None, :] & ((X > 1e-9) | (running > 0)) & elastic[:, None]
        fair_elastic = fair_share.any(axis=1)
        totals[fair_elastic] = np.minimum(replicas_max_int, np.maximum(totals, running.sum(axis=1)))[fair_elastic]
        totals[elastic & (low > 0) & (totals < low) & ~fair_elastic] = 0
        target = largest_remainder_rows(shares, totals)
        for i in np.flatnonzero(running.any(axis=1) & (totals > 0)).tolist():
            if not np.array_equal(target[i], running[i]):
                target[i] = split_replicas(target[i], running[i])
        replicas = target
        for i in np.flatnonzero(fair_elastic).tolist():
            offer = int(replicas_max_int[i] - replicas[i].sum())
            if offer <= 0:
                continue
            weights = np.where(fair_share[i], X[i], 0.0)
            if weights.sum() <= 0:
                weights = np.where(fair_share[i], running[i], 0).astype(np.float64)
            optional[i] = largest_remainder(weights, offer)

    # --- Existing pods: keep, bind candidates, surplus ------------------------------------------------------------
    managed: dict[tuple[str, str], list[_Pod]] = defaultdict(list)
    for pod in pods:
        if pod.job is not None:
            managed[(pod.namespace, pod.job)].append(pod)
    pod_plans: dict[tuple[str, str], list[PodPlan]] = defaultdict(list)
    # used[j][k]: priced resource in use on pool j's node k (bound pods of every kind, surplus included)
    n_nodes = len(nodes.names)
    in_a_pool = pod_pool >= 0
    used_by_node = {}
    for j in range(m):
        here = pod_pool == j
        used_by_node[j] = np.bincount(
            table.node[here], weights=table.amount(pools[j].spec.resource)[here], minlength=n_nodes
        ).astype(np.float64)
    walras_count = np.bincount(table.node[in_a_pool & table.managed], minlength=n_nodes).astype(np.int64)
    # pool -> (job row, pod, exists, optional): optional pods are an elastic job's offer to a fair pool
    to_place: dict[int, list[tuple[int, _Pod, bool, bool]]] = defaultdict(list)
    running_kept: list[tuple[PodPlan, _Pod, int, int]] = []  # running pods that stay: (plan, pod, job row, pool)
    unplaceable: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    taken_names: dict[tuple[str, str], set[str]] = {}  # pod names each job has or is about to create
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
                        dict(pod.text),
                        dict(pod.text),
                        "keep",
                        True,
                    )
                )
            continue
        wanted = replicas[row].tolist() if row is not None else [0] * m
        kept = [0] * m
        pending_by_pool: dict[int, list[_Pod]] = defaultdict(list)
        for pod in existing:
            j = int(claimed[pod.node]) if pod.node >= 0 else pool_index.get(pod.pool_label or "", -1)
            pool_name = pools[j].spec.name if j >= 0 else (pod.pool_label or "")
            if pod.node >= 0:
                if j >= 0 and kept[j] < wanted[j]:
                    kept[j] += 1
                    keep = PodPlan(
                        namespace,
                        pod.name,
                        name,
                        pool_name,
                        nodes.names[pod.node],
                        dict(pod.text),
                        dict(pod.text),
                        "keep",
                        True,
                    )
                    pod_plans[key].append(keep)
                    if row is not None:
                        running_kept.append((keep, pod, row, j))
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
        taken_names[key] = taken
        counter = 0
        for j in range(m):
            left = wanted[j] - kept[j]
            for pod in pending_by_pool.get(j, []):
                if left > 0:
                    to_place[j].append((row, pod, True, False))
                    left -= 1
                else:
                    pod_plans[key].append(
                        PodPlan(namespace, pod.name, name, pools[j].spec.name, None, {}, {}, "delete", True)
                    )
            extra = int(optional[row, j])
            if left + extra <= 0:
                continue
            base = _pod_name(name, pools[j].spec.name, 0)[:-2]
            for q in range(max(left, 0) + extra):
                while f"{base}-{counter}" in taken:
                    counter += 1
                new_name = f"{base}-{counter}"
                taken.add(new_name)
                new_pod = _Pod(namespace, new_name, -1, {}, name, pools[j].spec.name)
                # in a fair pool every new pod of an elastic job is the fair allocation's to grant or not
                to_place[j].append((row, new_pod, False, q >= left or bool(fair_share[row, j])))
            counter = 0

    # --- Running pods whose planned requests/limits changed: in-place resize -----------------------------------
    # A kept pod whose resources differ from the plan's is marked ``resize`` with the new values and why (the operator
    # patches pods/resize where the cluster serves it; elsewhere the change waits for the next pod). An increase must
    # fit in what its node has left (allocatable minus every bound pod's requests); where it does not, the pod keeps
    # its resources and the job says so. Resizes are decided before placement, so new pods see the resized amounts.
    bound = table.node >= 0
    room: dict[str, np.ndarray] = {}
    targets: dict[tuple[int, int, int], _Resize | None] = {}
    resize_blocked: dict[tuple[str, str], list[str]] = defaultdict(list)
    resized: dict[tuple[str, str], int] = defaultdict(int)
    resize_later: dict[tuple[str, str], list[str]] = defaultdict(list)
    for keep, pod, row, j in running_kept:
        cache_key = (row, j, id(pod.first))  # canonical objects (see _parsed), alive while the pods are
        if cache_key not in targets:
            targets[cache_key] = resize_target(jobs[row], pools[j].spec, pod.first)
        target = targets[cache_key]
        if target is None:
            continue
        if target.later:
            resize_later[jobs[row].key].append(f"{pod.name} ({target.later})")
        if not target.reason:
            continue
        for res, _ in target.delta:
            if res not in room:
                used = np.bincount(table.node[bound], weights=table.amount(res)[bound], minlength=n_nodes)
                room[res] = nodes.resource(res) - used
        short = [res for res, change in target.delta if change > 0 and room[res][pod.node] + 1e-9 < change]
        if short:
            resize_blocked[jobs[row].key].append(
                f"{pod.name} ({target.reason}): node {keep.node} lacks {', '.join(short)}"
            )
            continue
        for res, change in target.delta:
            room[res][pod.node] -= change
            if res == pools[j].spec.resource:
                used_by_node[j][pod.node] += change
        keep.action = "resize"
        keep.requests = dict(target.requests)
        keep.limits = dict(target.limits)
        keep.reason = target.reason
        resized[jobs[row].key] += 1

    # --- Placement inside each pool ------------------------------------------------------------------------------
    planned = np.zeros(m, dtype=np.int64)  # new and pending pods placed per pool
    elastic_created: dict[int, list[tuple[PodPlan, int, int, float]]] = defaultdict(list)

    def place_in_pool(j: int, entries: list[tuple[int, _Pod, bool, bool]], memoise: bool) -> list[int]:
        """Run pool ``j``'s policy on ``entries`` around what is already placed; record the pod plans; return the
        indices of the new, non-optional replicas it could not place (``memoise``: reuse and keep the placement
        memo, which only the first pass over the pools does)."""
        pool = pools[j]
        pp = plan.pools[pool.spec.name]
        nodes_k = pool.usable
        alloc_k = nodes.resource(pool.spec.resource)[nodes_k]
        free = np.maximum(alloc_k - used_by_node[j][nodes_k], 0.0)
        degree = pool.spec.degree_limit
        slots = (
            np.full(nodes_k.size, UNLIMITED, dtype=np.int64)
            if degree is None
            else np.maximum(degree - walras_count[nodes_k], 0).astype(np.int64)
        )
        rows = sorted({entry[0] for entry in entries})
        local = {row: q for q, row in enumerate(rows)}
        pool_jobs = [jobs[r] for r in rows]
        pod_local = np.array([local[entry[0]] for entry in entries], dtype=np.int64)
        extra_resources = sorted({r for job in pool_jobs for r in job.resources if r != pool.spec.resource})
        resource_names = [pool.spec.resource, *extra_resources]
        node_resources = np.zeros((nodes_k.size, len(resource_names)))
        node_resources[:, 0] = free
        here = pod_pool == j
        for r, res in enumerate(extra_resources, start=1):
            if res in room:  # resizes changed what running pods use
                node_resources[:, r] = np.maximum(room[res][nodes_k], 0.0)
                continue
            use = np.bincount(table.node[here], weights=table.amount(res)[here], minlength=n_nodes)
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
        result = _placement(request, pp, previous, warn, memoise=memoise)
        left_out = []
        for q, (row, pod, exists, is_optional) in enumerate(entries):
            job = jobs[row]
            k = int(result.node[q])
            node_name = request.node_names[k] if k >= 0 else None
            if k < 0 and not exists:
                # A new replica the pool's policy cannot place is not created (it would sit Pending with no node);
                # it may spill over to another pool (below), else the job's status counts it as unplaceable and says
                # why. An elastic job's optional pod that the fair allocation does not place is beyond its fair
                # share: not created, not an error.
                if not is_optional:
                    left_out.append(q)
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
            new_plan = PodPlan(
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
            pod_plans[job.key].append(new_plan)
            if k >= 0:
                planned[j] += 1
                used_by_node[j][nodes_k[k]] += amount
                if fair_elastic[row] and action == "create":
                    elastic_created[row].append((new_plan, j, int(nodes_k[k]), amount))
        return left_out

    waiting: dict[int, list[int]] = defaultdict(list)  # job row -> the pool of each replica left out
    for j in range(m):
        entries = to_place.get(j, [])
        for q in place_in_pool(j, entries, True):
            waiting[entries[q][0]].append(j)

    # --- Spill-over: replicas the market's pool has no room for -------------------------------------------------
    # Running pods stay where they are, so a pool the market prices for new replicas can be full of pods that the
    # market would have put elsewhere. A new replica that its pool cannot place tries the job's other usable pools
    # (highest throughput first, then lowest price) before it is reported unplaceable; the job says where it went.
    spilled: dict[tuple[str, str], dict[tuple[str, str], int]] = defaultdict(lambda: defaultdict(int))
    candidates = {
        row: sorted(
            (t for t in range(m) if t not in origins and usable_pools[row][t] and A[row, t] > 0),
            key=lambda t, row=row: (-A[row, t], float(prices[t]) if t < prices.size else 0.0, t),
        )
        for row, origins in waiting.items()
    }
    for step in range(max(m - 1, 0)):
        batch: dict[int, list[tuple[int, _Pod, bool, bool]]] = defaultdict(list)
        came_from: dict[int, list[int]] = defaultdict(list)
        for row in sorted(waiting):
            if step >= len(candidates[row]):
                continue
            t = candidates[row][step]
            job = jobs[row]
            names = taken_names[job.key]
            base = _pod_name(job.name, pools[t].spec.name, 0)[:-2]
            counter = 0
            for origin in waiting[row]:
                while f"{base}-{counter}" in names:
                    counter += 1
                names.add(f"{base}-{counter}")
                pod = _Pod(job.namespace, f"{base}-{counter}", -1, {}, job.name, pools[t].spec.name)
                batch[t].append((row, pod, False, False))
                came_from[t].append(origin)
            waiting[row] = []
        if not batch:
            break
        for t in sorted(batch):
            left = set(place_in_pool(t, batch[t], False))
            for q, (row, pod, _, _) in enumerate(batch[t]):
                if q in left:
                    waiting[row].append(came_from[t][q])
                    names_left = taken_names[jobs[row].key]
                    names_left.discard(pod.name)
                else:
                    spilled[jobs[row].key][(pools[came_from[t][q]].spec.name, pools[t].spec.name)] += 1
        waiting = defaultdict(list, {row: origins for row, origins in waiting.items() if origins})
    for row, origins in waiting.items():
        for origin in origins:
            unplaceable[jobs[row].key][pools[origin].spec.name] += 1

    # --- Elastic jobs below their minimum -------------------------------------------------------------------------
    # An elastic job whose replicas (running and placed) stay below spec.replicas.min gets no new pod: it could not run
    # with fewer (its pods are a gang); what it was planned is given back to the pools.
    below_min: dict[tuple[str, str], str] = {}
    for row, created in elastic_created.items():
        job = jobs[row]
        live = sum(1 for p in pod_plans[job.key] if p.node is not None and p.action != "delete")
        if live >= job.min_replicas:
            continue
        for new_plan, j, k, amount in created:
            pod_plans[job.key].remove(new_plan)
            planned[j] -= 1
            used_by_node[j][k] -= amount
        below_min[job.key] = (
            f"the fair share gives {live} replica(s), fewer than spec.replicas.min {job.min_replicas}; "
            "no new pod is created until it reaches the minimum"
        )

    # --- Pool statuses --------------------------------------------------------------------------------------------
    for j, pool in enumerate(pools):
        pp = plan.pools[pool.spec.name]
        nodes_k = pool.usable
        kept_here = int(walras_count[nodes_k].sum())
        price = float(prices[j]) if j < prices.size else 0.0
        pp.price = price
        pp.used = float(used_by_node[j][nodes_k].sum())
        pp.utilisation = float(min(pp.used / pool.capacity, 1.0)) if pool.capacity > 0 else 0.0
        pp.pods_planned = int(planned[j]) + kept_here
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
    ordered: dict[tuple[str, str], list[PodPlan]] = {}  # each job's pod plans in name order
    pool_names = [p.spec.name for p in pools]
    x_rows = X.tolist()
    for i, job in enumerate(jobs):
        jp = plan.jobs[job.key]
        jp.allocation = {pool_names[j]: round(x, 6) for j, x in enumerate(x_rows[i]) if x > 1e-9}
        jp.pods = ordered[job.key] = sorted(pod_plans.get(job.key, []), key=_by_name)
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
        if resized.get(job.key):
            message = (
                f"{resized[job.key]} running pod(s) get new requests/limits in place (pods/resize where the cluster "
                "serves it, else with the next pod)"
            )
            jp.conditions.append(Condition("ResourcesCurrent", "False", "ResizeNeeded", message))
        if resize_blocked.get(job.key):
            blocked = resize_blocked[job.key]
            message = (
                f"{len(blocked)} running pod(s) keep their resources: the new ones do not fit on their node "
                f"({_first_few(blocked)}); the next pod gets them"
            )
            jp.conditions.append(Condition("ResizeBlocked", "True", "NoRoomOnNode", message))
            warn("FungibleJob", job.namespace, job.name, "ResizeBlocked", message)
        if resize_later.get(job.key):
            later = resize_later[job.key]
            message = (
                f"{len(later)} running pod(s) keep resources that cannot change in place "
                f"({_first_few(later)}); the change waits for the next pod"
            )
            jp.conditions.append(Condition("ResizeDeferred", "True", "NotResizableInPlace", message))
            events.append(PlanEvent("FungibleJob", job.namespace, job.name, "Normal", "ResizeDeferred", message))
        if job.key in below_min:
            jp.conditions.append(Condition("MinimumReplicas", "False", "BelowMinimum", below_min[job.key]))
            warn("FungibleJob", job.namespace, job.name, "BelowMinimum", below_min[job.key])
        moved = spilled.get(job.key)
        if moved:
            detail = ", ".join(
                f"{count} in pool {to!r} instead of {origin!r}" for (origin, to), count in sorted(moved.items())
            )
            message = (
                f"{sum(moved.values())} replica(s) placed outside the market's pools: {detail} (no room there: "
                "running pods stay where they are)"
            )
            jp.conditions.append(Condition("PlacedAsPriced", "False", "SpilledOver", message))
            events.append(PlanEvent("FungibleJob", job.namespace, job.name, "Normal", "SpilledOver", message))
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
        elif live and all(p.action in ("keep", "resize") and p.node is not None for p in live):
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
                gone.pods = ordered[key] = sorted(plans, key=_by_name)
    for key in sorted(pod_plans):
        listed = ordered.get(key)
        plan.pods.extend(listed if listed is not None else sorted(pod_plans[key], key=_by_name))
    plan.seconds = time.perf_counter() - started
    return plan


def _by_name(pod: PodPlan) -> str:
    return pod.name


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


def largest_remainder_rows(shares: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Row-wise :func:`walras.planner.policies.largest_remainder`: row i of ``shares`` rounded to integers summing to
    ``totals[i]`` (Hamilton's method; rows whose total lies outside [sum of floors, sum of ceilings] are first scaled to
    sum to it; ties go to the lower column). Rows with a zero total are zero. Vectorised over the rows."""
    shares = np.asarray(shares, dtype=np.float64)
    totals = np.asarray(totals, dtype=np.int64)
    if shares.ndim != 2 or totals.shape != (shares.shape[0],):
        raise ValueError(f"shares must be (n, m) and totals (n,), got {shares.shape} and {totals.shape}")
    if np.any(shares < 0) or not np.all(np.isfinite(shares)) or np.any(totals < 0):
        raise ValueError("shares must be finite and non-negative, totals non-negative")
    out = np.zeros(shares.shape, dtype=np.int64)
    live = np.flatnonzero(totals > 0)
    if live.size == 0:
        return out
    x = shares[live]
    t = totals[live]
    sums = x.sum(axis=1)
    if np.any(sums <= 0):
        row = int(live[np.flatnonzero(sums <= 0)[0]])
        raise ValueError(f"row {row}: cannot distribute a total of {int(totals[row])} over shares that are all zero")
    outside = ~((np.floor(x).sum(axis=1) <= t) & (t <= np.ceil(x).sum(axis=1)))
    if outside.any():
        x = x.copy()
        x[outside] = x[outside] * (t[outside] / sums[outside])[:, None]
    base = np.floor(x).astype(np.int64)
    left = t - base.sum(axis=1)
    order = np.argsort(-(x - base), axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(x.shape[1])[None, :].repeat(x.shape[0], axis=0), axis=1)
    out[live] = base + (rank < left[:, None])
    return out


def placement_digest(request: PlacementRequest) -> str:
    """A digest of everything a pool's placement policy reads from ``request`` (the pool spec and profile, its nodes
    with their free resources and slots, the jobs with their pods, throughputs and totals). Placement policies are
    deterministic functions of the request, so equal digests mean equal placements: the planner reuses the previous
    plan's placement of a pool whose digest did not change instead of running its policy again."""
    h = hashlib.blake2b(digest_size=20)
    h.update(repr((request.pool, request.profile, request.resource_names)).encode())
    h.update("\0".join(request.node_names).encode())
    for array, dtype in (
        (request.free, np.float64),
        (request.slots, np.int64),
        (request.node_resources, np.float64),
        (request.job_pods, np.int64),
        (request.job_throughput, np.float64),
        (request.job_replicas_total, np.float64),
        (request.pod_job, np.int64),
    ):
        a = np.ascontiguousarray(array, dtype=dtype)
        h.update(repr(a.shape).encode())
        h.update(a.tobytes())
    for job in request.jobs:
        h.update(_job_repr(job).encode())
    return h.hexdigest()


def _job_repr(job: JobSpec) -> str:
    # JobSpec is frozen; its repr is deterministic for a given object (dicts keep their insertion order)
    return repr(job)


def _fmt(requests: Mapping[str, float]) -> dict[str, str]:
    return dict(_formatted(tuple(sorted(requests.items()))))


@lru_cache(maxsize=4096)
def _formatted(items: tuple[tuple[str, float], ...]) -> tuple[tuple[str, str], ...]:
    return tuple((k, format_quantity(v)) for k, v in items)


def _first_few(items: list[str], shown: int = 5) -> str:
    """``"a; b; c; ..."``: the first ``shown`` items of a list for a condition message."""
    return "; ".join(items[:shown]) + ("; ..." if len(items) > shown else "")


def _placement(
    request: PlacementRequest, pool_plan: PoolPlan, previous: Plan | None, warn: Any, *, memoise: bool = True
) -> PlacementResult:
    """The pool's placement: the previous plan's when its request digest is unchanged, else :func:`_place`'s.

    Reuse is exact (placement policies are deterministic functions of the request, and the digest covers all of it),
    so a warm plan places pods exactly as a cold plan would for the same request; the previous plan is an input of
    the pure function like the snapshot. The result is memoised in ``pool_plan.placement`` for the next plan.
    ``memoise=False`` (the spill-over passes, a second request to the same pool) neither reads nor replaces the memo.
    A policy fallback is reported on the pool either way.
    """
    if request.n_pods == 0:
        if memoise:
            pool_plan.placement = None
        return PlacementResult(node=np.zeros(0, dtype=np.int64), amount=np.zeros(0))
    memo: PlacementMemo | None = None
    if memoise:
        digest = placement_digest(request)
        old_pool = previous.pools.get(request.pool.name) if previous is not None else None
        memo = old_pool.placement if old_pool is not None else None
    if memo is not None and memo.digest == digest and len(memo.node) == request.n_pods:
        result = PlacementResult(
            node=np.array(memo.node, dtype=np.int64), amount=np.array(memo.amount, dtype=np.float64)
        )
        fallback = memo.fallback
    else:
        result, fallback = _place(request)
        if memoise:
            memo = PlacementMemo(digest, tuple(result.node.tolist()), tuple(result.amount.tolist()), fallback)
    if fallback is not None:
        pool_plan.conditions.append(Condition("PolicyApplied", "False", "PolicyFallback", fallback))
        warn("ResourcePool", "", request.pool.name, "PolicyFallback", fallback)
    if memoise:
        pool_plan.placement = memo
    return result


def _place(request: PlacementRequest) -> tuple[PlacementResult, str | None]:
    """Run the pool's policy; if it fails or breaks a limit, fall back to spread placement and say why (the second
    element is that message, None when the policy's placement was used)."""
    try:
        result = get_policy(request.pool.policy).place(request)
        check_result(request, result)
        return result, None
    except Exception as exc:  # a failing policy must not stop the plan: fall back and report it
        message = f"policy {request.pool.policy!r} failed ({exc}); pods placed most-free-node first instead"
        result = SpreadPolicy().place(request)
        check_result(request, result)
        return result, message
