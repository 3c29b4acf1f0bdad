"""Phase *objects* (kube-scheduler's PreFilter, Kueue's ClusterQueue/flavor set-up): which profiles, pools and jobs
take part, which nodes each pool holds, and which pools each job may use.

A profile, pool or job that is invalid gets a ``Valid=False`` condition and a Warning event and is left out; planning
goes on for the rest. A job may use pool j when the pool exists and is valid, the job's throughput there is positive,
and (colocation pools) its colocation type is in the pool's profile. Whether the job's pods *fit* the pool's nodes is
the capacity phase's question, not this one's, with two exceptions that no node of the pool can ever meet: a pod
requesting a resource that no node of the pool offers (kube-scheduler's NodeResourcesFit: an extended resource no node
has; the kubelet would refuse the pod), and a fractional ``spec.demand`` of a pool whose priced resource Kubernetes
allocates in whole units (an extended resource such as ``nvidia.com/gpu``: ``demand: 0.5`` would be refused by the API
server, or rounded). Either makes the pool unusable for the job, with the reason in its ``PoolsValid`` condition.
"""

from __future__ import annotations

import numpy as np

from walras.planner.capacity import NodeTable
from walras.planner.cluster import PODS, Cluster, Job
from walras.planner.model import Blocker, Condition, JobPlan, PlanEvent, PoolPlan
from walras.planner.results import JobInfo, Objects, PoolInfo, Reported
from walras.planner.spec import ProfileSpec, integral_resource, whole

__all__ = ["JobInfo", "Objects", "PoolInfo", "build_objects", "select"]


def _warn(events: list[PlanEvent], kind: str, namespace: str, name: str, reason: str, message: str) -> None:
    """Add a Warning event against an object to ``events``."""
    events.append(PlanEvent(kind, namespace, name, "Warning", reason, message))


def select(table: NodeTable, selector: dict[str, str], columns: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Mask of the nodes whose labels include every ``key: value`` of ``selector``. ``columns`` (one dict per
    call site) keeps each label key's values over the nodes, read once for every pool that selects on that key."""
    mask = np.ones(len(table.nodes), dtype=bool)
    for key, value in selector.items():
        column = columns.get(key) if columns is not None else None
        if column is None:
            column = np.empty(len(table.nodes), dtype=object)
            column[:] = [n.labels.get(key) for n in table.nodes]
            column.setflags(write=False)
            if columns is not None:
                columns[key] = column
        mask &= column == value
    return mask


def build_objects(cluster: Cluster, table: NodeTable) -> tuple[Objects, Reported]:
    """Validate profiles, pools and jobs into :class:`Objects`; with what is :class:`Reported` of each (its plan,
    conditions and events)."""
    pool_of_node = np.full(len(table.names), -1, dtype=np.int64)
    pool_infos: list[PoolInfo] = []
    job_infos: list[JobInfo] = []
    invalid: set[tuple[str, str]] = set()
    events: list[PlanEvent] = []
    pool_plans: dict[str, PoolPlan] = {}
    job_plans: dict[tuple[str, str], JobPlan] = {}
    profile_conditions: dict[str, list[Condition]] = {}
    profiles: dict[str, ProfileSpec] = {}
    columns = table.labels  # each label key's values over the nodes, kept with the table (read-only)
    for obj in cluster.profiles:
        if obj.spec is None:
            profile_conditions[obj.name] = [Condition("Valid", "False", "InvalidSpec", obj.error or "")]
            _warn(events, "ColocationProfile", "", obj.name, "InvalidSpec", obj.error or "")
            continue
        profiles[obj.name] = obj.spec
        profile_conditions[obj.name] = [Condition("Valid", "True", "Valid", f"{len(obj.spec.types)} types")]

    for pool in cluster.pools:
        name = pool.name
        if pool.spec is None:
            pool_plans[name] = PoolPlan(name, "", "", 0, (), 0.0, 0.0, 0.0, 0.0,
                                        conditions=(Condition("Valid", "False", "InvalidSpec", pool.error or ""),),
                                        observed_generation=pool.generation)
            _warn(events, "ResourcePool", "", name, "InvalidSpec", pool.error or "")
            continue
        spec = pool.spec
        profile: ProfileSpec | None = None
        if spec.policy == "colocation":
            profile = profiles.get(spec.profile or "")
            if profile is None:
                message = f"ColocationProfile {spec.profile!r} does not exist or is invalid"
                pool_plans[name] = PoolPlan(name, spec.resource, spec.policy, 0, (), 0.0, 0.0, 0.0, 0.0,
                                            conditions=(Condition("Valid", "False", "ProfileNotFound", message),),
                                            observed_generation=pool.generation)
                _warn(events, "ResourcePool", "", name, "ProfileNotFound", message)
                continue
        conditions: list[Condition] = []
        match = select(table, spec.node_selector, columns)
        overlap = match & (pool_of_node >= 0)
        if overlap.any():
            other = pool_infos[int(pool_of_node[np.flatnonzero(overlap)[0]])].name
            message = f"{int(overlap.sum())} node(s) also match pool {other!r}; they stay in {other!r}"
            conditions.append(Condition("NodesOverlap", "True", "SelectorOverlap", message))
            _warn(events, "ResourcePool", "", name, "SelectorOverlap", message)
        members = np.flatnonzero(match & (pool_of_node < 0))
        pool_of_node[members] = len(pool_infos)
        usable = members[table.usable[members]]
        pool_infos.append(PoolInfo(spec, profile, members, usable))
        conditions.insert(0, Condition("Valid", "True", "Valid", f"{usable.size} usable node(s)"))
        if usable.size == 0:
            conditions.append(Condition("Ready", "False", "NoNodes", "no Ready, schedulable node matches"))
            message = "no Ready, schedulable node matches the pool's nodeSelector"
            _warn(events, "ResourcePool", "", name, "NoNodes", message)
        else:
            conditions.append(Condition("Ready", "True", "NodesReady", f"{usable.size} node(s) ready"))
        pool_plans[name] = PoolPlan(name, spec.resource, spec.policy, int(usable.size),
                                    tuple(table.names[k] for k in usable), 0.0, 0.0, 0.0, 0.0,
                                    conditions=tuple(conditions), observed_generation=pool.generation)

    index = {p.name: j for j, p in enumerate(pool_infos)}
    offers: dict[tuple[int, frozenset[str]], str | None] = {}  # (pool, requested names) -> a name none offers
    for job in cluster.jobs:
        namespace, name = job.key
        if job.spec is None:
            job_plans[job.key] = JobPlan(namespace, name, "Invalid", observed_generation=job.generation,
                                         conditions=(Condition("Valid", "False", "InvalidSpec", job.error or ""),))
            invalid.add(job.key)
            _warn(events, "FungibleJob", namespace, name, "InvalidSpec", job.error or "")
            continue
        job_spec = job.spec
        ok, problems = _usable_pools(job, pool_infos, index, profile_conditions, events)
        _fit_pools(job, pool_infos, table, ok, problems, offers)
        usable_any = bool(ok.any())
        for problem in problems:
            _warn(events, "FungibleJob", namespace, name, "PoolUnusable", problem)
        if problems:
            job_conditions = [Condition("PoolsValid", "False", "PoolUnusable", "; ".join(problems))]
        else:
            job_conditions = [Condition("PoolsValid", "True", "PoolsValid", "")]
        phase = "Pending"
        if not usable_any:
            phase = "Unschedulable"
            message = ("the job can run in no pool (no listed pool exists, is valid, has throughput > 0 for it and "
                       "can run its pods" + (f": {'; '.join(problems)})" if problems else ")"))
            job_conditions.append(Condition("Schedulable", "False", "NoUsablePool", message))
            _warn(events, "FungibleJob", namespace, name, "NoUsablePool", message)
        if not usable_any:
            found = _no_usable_pool(job, cluster, problems)
            job_plans[job.key] = JobPlan(namespace, name, phase, observed_generation=job_spec.generation,
                                         target=job_spec.utility.target, conditions=tuple(job_conditions),
                                         count=job_spec.replicas, minimum=job_spec.min_replicas,
                                         demand=job_spec.demand, blockers=found, reason="NoUsablePool",
                                         created=job.created)
            continue
        job_plans[job.key] = JobPlan(namespace, name, phase, observed_generation=job_spec.generation,
                                     target=job_spec.utility.target, conditions=tuple(job_conditions))
        job_infos.append(JobInfo(job, job_spec, ok))
    pool_of_node.setflags(write=False)
    out = Objects(tuple(pool_infos), tuple(job_infos), pool_of_node, frozenset(invalid))
    reported = {name: tuple(conditions) for name, conditions in profile_conditions.items()}
    return out, Reported(pool_plans, job_plans, reported, tuple(events))


def _no_usable_pool(job: Job, cluster: Cluster, problems: list[str]) -> tuple[Blocker, ...]:
    """The ``NoUsablePool`` blockers of a valid job that may use no pool: one per pool its ``spec.throughput``
    names, with why it cannot run there and the numbers (the pools that exist and are valid, the throughput it
    gives), all of its ``spec.replicas`` kept out. ``problems`` are the reasons :func:`_usable_pools` and
    :func:`_fit_pools` found, each naming its pool."""
    spec = job.spec
    assert spec is not None
    valid = sorted(p.name for p in cluster.pools if p.spec is not None)
    invalid = {p.name for p in cluster.pools if p.spec is None}
    known = f"the {len(valid)} valid pool(s) are {', '.join(valid)}" if valid else "there is no valid ResourcePool"
    out: list[Blocker] = []
    for pool, value in sorted(spec.throughput.items()):
        said = [p for p in problems if f"pool {pool!r}" in p]
        if pool in invalid:
            why = f"ResourcePool {pool!r} is invalid (its Valid condition says why); {known}"
        elif pool not in valid:
            why = f"no ResourcePool {pool!r} exists; {known}"
        elif value <= 0:
            why = f"spec.throughput gives pool {pool!r} {value:g}: the job cannot run there"
        elif said:
            why = "; ".join(said)
        else:
            continue
        out.append(Blocker(pool, "NoUsablePool", spec.replicas,
                           f"the job can run in none of the {len(spec.throughput)} pool(s) spec.throughput names: "
                           f"{why}"))
    return tuple(out)


def _usable_pools(job: Job, pools: list[PoolInfo], index: dict[str, int],
                  profile_conditions: dict[str, list[Condition]],
                  events: list[PlanEvent]) -> tuple[np.ndarray, list[str]]:
    """Which of the valid ``pools`` (``index``: by name) the valid ``job`` may use (throughput > 0 there, and its
    colocation type in the pool's profile), and the problems of the pools it names but may not use; a type missing
    from a profile adds a condition to the profile (in ``profile_conditions``) and a Warning to ``events``."""
    job_spec = job.spec
    assert job_spec is not None
    namespace, name = job.key
    ok = np.zeros(len(pools), dtype=bool)
    problems: list[str] = []
    for pool_name, value in sorted(job_spec.throughput.items()):
        j = index.get(pool_name)
        if j is None:
            problems.append(f"throughput names unknown or invalid pool {pool_name!r}")
            continue
        if value <= 0:
            continue
        info = pools[j]
        if info.profile is not None:
            if job_spec.colocation_type is None:
                problems.append(f"pool {pool_name!r} uses the colocation policy but spec.colocation is missing")
                continue
            if job_spec.colocation_type not in info.profile.types:
                message = (
                    f"type {job_spec.colocation_type!r} of job {namespace}/{name} is missing from the profile's "
                    f"types {list(info.profile.types)}"
                )
                problems.append(f"pool {pool_name!r}: {message}")
                profile_conditions[info.profile.name].append(
                    Condition("TypesComplete", "False", "MissingType", message))
                _warn(events, "ColocationProfile", "", info.profile.name, "MissingType", message)
                continue
        ok[j] = True
    return ok, problems


def _requested(job: Job, priced: str) -> frozenset[str]:
    """The resources a pod Walras creates for ``job`` in a pool pricing ``priced`` requests (a positive amount of):
    as :func:`walras.planner.cluster.pod_vector` composes them, without the ``pods`` slot."""
    spec = job.spec
    assert spec is not None
    template = job.template
    first = {**template.first, **spec.resources, priced: spec.demand}
    names = {name for part in (first, template.others, template.init, template.overhead)
             for name, value in part.items() if value > 0}
    names.discard(PODS)
    return frozenset(names)


def _missing(table: NodeTable, members: np.ndarray, names: frozenset[str]) -> str | None:
    """A resource of ``names`` that no node among ``members`` offers together with the others (None: some node
    offers every one): the first name no member offers, else the first of the set, sorted."""
    if members.size == 0:
        return None
    have = np.ones(members.size, dtype=bool)
    for name in sorted(names):
        column = table.column.get(name)
        if column is None:
            return name
        offered = table.alloc[members, column] > 0
        if not offered.any():
            return name
        have &= offered
    return None if have.any() else sorted(names)[0]


def _fit_pools(job: Job, pools: list[PoolInfo], table: NodeTable, ok: np.ndarray, problems: list[str],
               offers: dict[tuple[int, frozenset[str]], str | None]) -> None:
    """Clear ``ok[j]`` (and say why in ``problems``) for each pool the job's pods can never run in: a resource they
    request that no node of the pool offers, a fractional demand of a whole-unit priced resource, or a template asking
for host access (privileged, host namespaces, hostPath, hostPort) in a pool that does not allow it to the job's
namespace (the pod policy of docs/security.md). ``offers``
    memoises :func:`_missing` per (pool, requested names) over one plan."""
    spec = job.spec
    assert spec is not None
    for j in np.flatnonzero(ok):
        info = pools[int(j)]
        priced = info.spec.resource
        if spec.host_access and spec.namespace not in info.spec.host_access_namespaces:
            ok[j] = False
            problems.append(f"pool {info.name!r}: the pod template asks for {', '.join(spec.host_access)}, which the "
                            f"pod policy refuses unless the pool's spec.podPolicy.allowHostAccess lists namespace "
                            f"{spec.namespace!r} (docs/security.md)")
            continue
        if integral_resource(priced) and not whole(spec.demand):
            ok[j] = False
            problems.append(f"pool {info.name!r}: spec.demand {spec.demand:g} is not a whole number, but {priced} is "
                            "an extended resource that Kubernetes allocates in whole units only")
            continue
        names = _requested(job, priced)
        key = (int(j), names)
        if key not in offers:
            offers[key] = _missing(table, info.members, names)
        missing = offers[key]
        if missing is not None:
            ok[j] = False
            problems.append(f"pool {info.name!r}: no node of the pool offers {missing} (with the job's other "
                            "requests), which the job's pods request")
