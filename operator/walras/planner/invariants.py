"""A scheduler's invariants, checked on a typed cluster (and optionally on a plan for it): the one place tests, the
e2e scenarios, the benchmarks and ``walras check`` share.

On the cluster:

* ``OverCommitted``: a node where the requests of its non-terminal pods (terminating ones included, as kube-scheduler
  counts them) exceed allocatable on some resource, the ``pods`` count included;
* ``NodeMissing``: a non-terminal pod bound to a node that does not exist;
* ``Orphaned``: a live pod Walras manages whose FungibleJob does not exist;
* ``PoolOverCapacity``: a pool with a ``spec.capacity`` whose bound pods use more of its priced resource;
* ``StatusDisagrees``: a job whose status reports a number of replicas other than the pods it has, or a phase its
  pods contradict (``Running`` with no pod in phase Running, ``Pending`` or ``Unschedulable`` with one) (checked
  only for jobs whose status was written for their current generation and that no pod is being created or deleted
  for).

On a plan for that cluster (``check_plan``):

* ``PlanOverCommits``: the plan puts pods on a node beyond allocatable on some resource;
* ``DoubleBinding``: the plan binds a pod that is already bound, or to a node other than its own;
* ``DuplicatePod``: the plan names a pod twice, or creates a pod whose name exists;
* ``LostPod``: a pod the cluster has, of a job that still wants replicas in its pool, that the plan neither keeps nor
  deletes (every managed live pod must appear in the plan);
* ``PartialGang``: a gang job (``spec.replicas.gang``) whose plan keeps, resizes, binds or creates ``0 < k < N`` pods,
  or puts them in more than one pool (docs/gangs.md; N is ``spec.replicas.count`` less the pods that Succeeded).
* ``PoolOverCapacity``: a pool with a ``spec.capacity`` into which the plan puts more of its priced resource (binds,
  creates, resizes up) while its member nodes' pods then use more than the capacity, counting every pod bound there
  that the plan does not remove (``delete``/``evict``) and what the plan adds (check_cluster's rule, after the plan);
* ``BudgetCapExceeded``: with tenants on, a tenant whose pods hold more units of a pool's priced resource after the
  plan than its Budget's cap there (the pods' own requests, assign-and-allocate's amounts included: every pod the
  plan keeps, resizes, binds or creates on a node, recounted from ``plan.pods``), where the plan adds some;
* ``NominationTaken``: the plan puts pods on a node into the room kube-scheduler holds there for a pod it nominated
  (:func:`walras.planner.capacity.nominations`, docs/refusals.md), beyond allocatable once that pod is counted.

On the cluster, ``PartialGang`` also flags a gang job with ``0 < k < N`` pods when all of them are Running on a node,
none is terminating and its status (where written) reports those k (a gang caught in a transition, pods still being
created, starting or leaving, is not judged).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from walras.planner.capacity import NodeTable, node_table, nominations, reserve_nominated
from walras.planner.cluster import PODS, Cluster
from walras.planner.model import Plan
from walras.planner.objects import select
from walras.planner.quantity import parse_quantity


@dataclass(frozen=True)
class Violation:
    kind: str
    object: str  # "Node/gpu-0", "Pod/ns/name", "FungibleJob/ns/name", "ResourcePool/name"
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.object}: {self.message}"


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def check_cluster(cluster: Cluster) -> list[Violation]:
    """Every cluster invariant of the module docstring that ``cluster`` breaks (empty when it holds them all)."""
    out: list[Violation] = []
    table = node_table(cluster)
    for node, resource, used, alloc in table.over_committed():
        out.append(Violation("OverCommitted", f"Node/{node}",
                             f"{resource} requested {_fmt(used)} > allocatable {_fmt(alloc)}"))
    jobs = {job.key: job for job in cluster.jobs}
    live = [p for p in cluster.pods if not p.terminal]
    for pod in live:
        if pod.node is not None and pod.node not in table.index:
            out.append(Violation("NodeMissing", f"Pod/{pod.namespace}/{pod.name}", f"bound to node {pod.node}, "
                                 "which does not exist"))
        if pod.job is not None and not pod.terminating and (pod.namespace, pod.job) not in jobs:
            out.append(Violation("Orphaned", f"Pod/{pod.namespace}/{pod.name}",
                                 f"FungibleJob {pod.namespace}/{pod.job} does not exist"))
    for pool in cluster.pools:
        spec = pool.spec
        if spec is None or spec.capacity is None:
            continue
        members = np.flatnonzero(select(table, spec.node_selector))
        c = table.column.get(spec.resource)
        used = float(table.used[members, c].sum()) if members.size and c is not None else 0.0
        if used > spec.capacity + 1e-9:
            out.append(Violation("PoolOverCapacity", f"ResourcePool/{pool.name}",
                                 f"{spec.resource} in use {_fmt(used)} > spec.capacity {_fmt(spec.capacity)}"))
    counts: dict[tuple[str, str], int] = Counter()
    settling: set[tuple[str, str]] = set()
    running: dict[tuple[str, str], int] = Counter()
    for pod in live:
        if pod.job is None:
            continue
        key = (pod.namespace, pod.job)
        if pod.terminating or pod.node is None:
            settling.add(key)
        if not pod.terminating:
            counts[key] += 1
            if pod.phase == "Running" and pod.node is not None:
                running[key] += 1
    out.extend(_partial_gangs_running(cluster))
    for key, job in jobs.items():
        if job.spec is None or key in settling or not job.reported.phase:
            continue
        if job.reported.observed_generation is not None and job.reported.observed_generation != job.generation:
            continue
        reported = sum(job.reported.replicas.values())
        if reported != counts.get(key, 0):
            out.append(Violation("StatusDisagrees", f"FungibleJob/{key[0]}/{key[1]}",
                                 f"status reports {reported} replica(s), the cluster has {counts.get(key, 0)} pod(s)"))
        phase, runs = job.reported.phase, running.get(key, 0)
        if phase == "Running" and not runs:
            out.append(Violation("StatusDisagrees", f"FungibleJob/{key[0]}/{key[1]}",
                                 "status says phase Running, but no pod of the job is Running"))
        elif phase in ("Pending", "Unschedulable") and runs:
            out.append(Violation("StatusDisagrees", f"FungibleJob/{key[0]}/{key[1]}",
                                 f"status says phase {phase}, but {runs} pod(s) of the job are Running"))
    return out


def check_plan(cluster: Cluster, plan: Plan) -> list[Violation]:
    """Every plan invariant of the module docstring that ``plan`` breaks for ``cluster``."""
    out: list[Violation] = []
    table = node_table(cluster)
    pods = {pod.key: pod for pod in cluster.pods}
    names = Counter((p.namespace, p.name) for p in plan.pods)
    for (namespace, name), count in names.items():
        if count > 1:
            out.append(Violation("DuplicatePod", f"Pod/{namespace}/{name}", f"planned {count} times"))
    extra = np.zeros_like(table.used)
    for p in plan.pods:
        current = pods.get((p.namespace, p.name))
        where = f"Pod/{p.namespace}/{p.name}"
        if p.action == "create" and current is not None:
            out.append(Violation("DuplicatePod", where, "created, but a pod of that name exists"))
        if p.action == "bind" and current is not None and current.node is not None and current.node != p.node:
            out.append(Violation("DoubleBinding", where, f"bound to {current.node}, planned to {p.node}"))
        if p.node is None or p.node not in table.index:
            continue
        k = table.index[p.node]
        if p.action in ("create", "bind") and (current is None or current.node is None):
            requests = {name: _parse(v) for name, v in p.requests.items()}
            if current is not None:
                requests = dict(current.requests)  # a pending pod brings its own requests
                requests.update({name: _parse(v) for name, v in p.requests.items()})
            requests[PODS] = 1.0
            extra[k] += table.vector(requests)
        elif p.action == "resize" and current is not None:
            new = {**current.requests, **{name: _parse(v) for name, v in p.requests.items()}}
            extra[k] += table.vector(new) - table.vector(current.requests)
    # a deletion frees room only once the pod is gone: a plan must not count on it, so nothing is subtracted
    after = table.used + extra
    over = after > table.alloc + 1e-9 * np.maximum(1.0, table.alloc)
    grew = extra > 1e-12
    for k, r in zip(*np.nonzero(over & grew), strict=True):
        out.append(Violation("PlanOverCommits", f"Node/{table.names[k]}",
                             f"{table.resources[r]} would be {_fmt(after[k, r])} > allocatable "
                             f"{_fmt(table.alloc[k, r])}"))
    bound = table.used.copy()
    reserve_nominated(table, cluster, nominations(cluster))  # this check's own table: restored below
    held, table.used = table.used - bound, bound
    taken = (after + held > table.alloc + 1e-9 * np.maximum(1.0, table.alloc)) & grew & ~over
    for k, r in zip(*np.nonzero(taken), strict=True):
        out.append(Violation("NominationTaken", f"Node/{table.names[k]}",
                             f"{table.resources[r]} would be {_fmt(after[k, r] + held[k, r])} > allocatable "
                             f"{_fmt(table.alloc[k, r])} with the pods nominated there"))
    planned = {(p.namespace, p.name) for p in plan.pods}
    by_job: dict[tuple[str, str], list[str]] = defaultdict(list)
    for pod in cluster.pods:
        if pod.job is None or pod.terminal or pod.terminating or pod.key in planned:
            continue
        by_job[(pod.namespace, pod.job)].append(pod.name)
    for (namespace, job), missing in sorted(by_job.items()):
        for name in missing:
            out.append(Violation("LostPod", f"Pod/{namespace}/{name}", f"pod of job {job} is not in the plan"))
    out.extend(_pools_over_capacity(cluster, plan, table, extra))
    out.extend(_caps_exceeded(cluster, plan))
    out.extend(partial_gangs(cluster, plan))
    return out


def _pools_over_capacity(cluster: Cluster, plan: Plan, table: NodeTable, extra: np.ndarray) -> list[Violation]:
    """``PoolOverCapacity`` on a plan: per pool with a ``spec.capacity`` that the plan adds use to (``extra``, per
    node: what its binds, creates and resizes add), the priced resource on the pool's member nodes after the plan
    (every bound pod the plan does not delete or evict, plus ``extra``) against the capacity."""
    out: list[Violation] = []
    removed = {(p.namespace, p.name) for p in plan.pods if p.action in ("delete", "evict")}
    for pool in cluster.pools:
        spec = pool.spec
        if spec is None or spec.capacity is None:
            continue
        c = table.column.get(spec.resource)
        members = np.flatnonzero(select(table, spec.node_selector))
        if c is None or members.size == 0:
            continue
        added = float(extra[members, c].sum())
        if added <= 1e-12:
            continue
        member = {table.names[k] for k in members.tolist()}
        gone = sum(pod.requests.get(spec.resource, 0.0) for pod in cluster.pods
                   if pod.key in removed and pod.node in member and not pod.terminal)
        after = float(table.used[members, c].sum()) - gone + added
        if after > spec.capacity + 1e-9 * max(1.0, spec.capacity):
            out.append(Violation("PoolOverCapacity", f"ResourcePool/{pool.name}",
                                 f"the plan puts {_fmt(added)} {spec.resource} into the pool: {_fmt(after)} in use "
                                 f"after it > spec.capacity {_fmt(spec.capacity)}"))
    return out


def _caps_exceeded(cluster: Cluster, plan: Plan) -> list[Violation]:
    """``BudgetCapExceeded``: per tenant of ``plan.tenants`` with caps, the units of each capped pool its namespaces'
    pods hold after the plan (the planned requests of every holding pod on a node) against the cap, for pools where
    the plan binds, creates or resizes a pod of the tenant (what ran before the cap is not the plan's doing)."""
    out: list[Violation] = []
    capped = [t for t in plan.tenants.values() if t.caps]
    if not capped:
        return out
    resource = {p.name: p.spec.resource for p in cluster.pools if p.spec is not None}
    for tenant in capped:
        spaces = set(tenant.namespaces)
        held: dict[str, float] = defaultdict(float)
        grew: set[str] = set()
        for p in plan.pods:
            if p.namespace not in spaces or p.node is None or p.action not in ("keep", "resize", "bind", "create"):
                continue
            res = resource.get(p.pool)
            if res is None:
                continue
            held[p.pool] += _parse(p.requests.get(res, "0"))
            if p.action != "keep":
                grew.add(p.pool)
        for pool, cap in sorted(tenant.caps.items()):
            if pool in grew and held.get(pool, 0.0) > cap + 1e-9 * max(1.0, cap):
                out.append(Violation("BudgetCapExceeded", f"Budget/{tenant.budget or tenant.name}",
                                     f"tenant {tenant.name} holds {_fmt(held[pool])} {resource[pool]} of pool "
                                     f"{pool} after the plan > cap {_fmt(cap)}"))
    return out


def partial_gangs(cluster: Cluster, plan: Plan) -> list[Violation]:
    """``PartialGang`` on a plan: every gang job of ``cluster`` whose ``plan`` leaves ``0 < k < N`` pods (kept,
    resized, bound or created) or spreads them over more than one pool."""
    out: list[Violation] = []
    live: dict[tuple[str, str], list[str]] = defaultdict(list)
    done = _succeeded(cluster)
    for p in plan.pods:
        if p.action in ("keep", "resize", "bind", "create"):
            live[(p.namespace, p.job)].append(p.pool)
    for job in cluster.jobs:
        if job.spec is None or not job.spec.gang:
            continue
        pools = live.get(job.key, [])
        big_n = job.spec.replicas - done.get(job.key, 0)
        if 0 < len(pools) < big_n:
            out.append(Violation("PartialGang", f"FungibleJob/{job.namespace}/{job.name}",
                                 f"the plan leaves {len(pools)} of the gang's {big_n} pod(s)"))
        elif len(set(pools)) > 1:
            out.append(Violation("PartialGang", f"FungibleJob/{job.namespace}/{job.name}",
                                 f"the gang's pods are planned in {len(set(pools))} pools: {sorted(set(pools))}"))
    return out


def _partial_gangs_running(cluster: Cluster) -> list[Violation]:
    """``PartialGang`` on a cluster: a gang job with ``0 < k < N`` live pods, all Running on a node, none
    terminating, and a status that (where written) reports k replicas (the operator is not still creating the rest)."""
    out: list[Violation] = []
    done = _succeeded(cluster)
    pods: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for pod in cluster.pods:
        if pod.job is not None and not pod.terminal:
            pods[(pod.namespace, pod.job)].append(pod.phase == "Running" and pod.node is not None
                                                  and not pod.terminating)
    for job in cluster.jobs:
        if job.spec is None or not job.spec.gang:
            continue
        states = pods.get(job.key, [])
        caught_up = not job.reported.phase or sum(job.reported.replicas.values()) == len(states)
        if 0 < len(states) < job.spec.replicas - done.get(job.key, 0) and all(states) and caught_up:
            out.append(Violation("PartialGang", f"FungibleJob/{job.namespace}/{job.name}",
                                 f"{len(states)} of the gang's {job.spec.replicas} pod(s) run"))
    return out


def _parse(value: str) -> float:
    try:
        return parse_quantity(value)
    except ValueError:
        return 0.0


def _succeeded(cluster: Cluster) -> dict[tuple[str, str], int]:
    """Per job, its pods in phase Succeeded (a gang's finished replicas: its size N counts the others)."""
    out: dict[tuple[str, str], int] = Counter()
    for pod in cluster.pods:
        if pod.job is not None and pod.phase == "Succeeded":
            out[(pod.namespace, pod.job)] += 1
    return out
