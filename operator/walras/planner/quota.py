"""Phase *admission*: what the API server will admit caps what the plan holds for a job (docs/refusals.md).

Two inputs of the typed cluster, applied after the lifecycle's pre-phase and before the market, as each job's
*effective* replicas (``dataclasses.replace`` of its spec, as :func:`walras.planner.lifecycle.prepare` does):

* **ResourceQuota** (``Cluster.quotas``): per namespace, the smallest ``hard`` amount of each request resource over
  its quotas, less what the namespace's other pods request (every non-terminal pod that is not a live replica of a
  Walras job: other controllers' pods, Walras's terminating ones), is what Walras's replicas there may request
  together (the API server's quota admission counts a pod's requests as kube-scheduler does: containers summed, at
  least the largest init container, plus overhead, plus one ``pods``). Every job keeps its live pods (a quota never
  removes a pod: the API server only refuses new ones) and they count first; then the namespace's valid jobs take
  what is left in name order, each as many more replicas as fit, a replica counted at its largest request vector
  over the pools it may use. A job
  capped below its spec's replicas gets the condition ``QuotaLimited`` and a blocker with the numbers; the market
  never prices the capacity the quota would refuse, so other namespaces' jobs are offered it.
* **Refusals** (``Cluster.refused``, the operator's record of pod creations the API server refused: Pod Security, a
  quota the planner does not model, a webhook; with no previous plan, also the record the job's
  ``status.admissionRefusal`` carries, :func:`refusals`, so an operator restart loses nothing): while
  ``PlanOptions.now`` is before the refusal's ``until`` (the operator's backoff), the job's effective replicas are
  its live pods, so no capacity is held for the replicas the API server refuses. Once the backoff ends the plan asks
  for *one* more pod (the ReplicaSet controller's slow start: a batch of one before the rest), and only where a node
  of one of the job's pools has free room for it now, so a retry never displaces a running pod of another job; the
  operator creates it, and the refusal ends when the API server admits it (the next plan asks for the rest) or
  starts a longer backoff when it refuses it again.
  Without a clock a refusal holds until the operator drops it. The job gets the condition ``AdmissionRefused`` with
  the API server's message and the number of refused pods (while it has fewer live pods than it wants).

Pure: no I/O, no clock of its own; the result is a function of the cluster and ``now``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from walras.planner.capacity import NodeTable, node_table, nominations
from walras.planner.cluster import Cluster, Job, Pod, Quota, Refusal, pod_vector
from walras.planner.model import Blocker, Condition, JobPlan, rfc3339
from walras.planner.objects import select

__all__ = ["Admission", "Limit", "admit", "annotate", "quota_room", "refusals"]

ADMISSION_REFUSED = "AdmissionRefused"
QUOTA_LIMITED = "QuotaLimited"
#: The job condition types this phase writes (``Condition(limit.reason, ...)``: the type is the reason).
CONDITION_TYPES = (ADMISSION_REFUSED, QUOTA_LIMITED)

JobKey = tuple[str, str]


@dataclass(frozen=True)
class Limit:
    """Why a job's effective replicas are below its spec's: ``replicas`` of ``wanted`` allowed; the condition it
    gets (type = reason, ``QuotaLimited`` or ``AdmissionRefused``) and its message."""

    reason: str
    replicas: int
    wanted: int
    message: str


@dataclass(frozen=True)
class Admission:
    """The cluster with each job's effective replicas capped, and each capped or refused job's :class:`Limit` s."""

    cluster: Cluster
    limits: Mapping[JobKey, tuple[Limit, ...]]


def _live(pod: Pod) -> bool:
    return not pod.terminal and not pod.terminating


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def _largest_vector(job: Job, cluster: Cluster) -> dict[str, float]:
    """The job's pod request vector (:func:`pod_vector`), the largest per resource over the pools it may use."""
    assert job.spec is not None
    pools = {p.name: p.spec for p in cluster.pools if p.spec is not None}
    out: dict[str, float] = {}
    for name in job.spec.throughput:
        spec = pools.get(name)
        if spec is None:
            continue
        for resource, value in pod_vector(job.template, job.spec, spec.resource, job.spec.demand).items():
            out[resource] = max(value, out.get(resource, 0.0))
    return out


def quota_room(cluster: Cluster) -> dict[str, tuple[dict[str, float], dict[str, str]]]:
    """Per namespace with a quota: (what Walras's live replicas and new pods there may request together, per
    resource: the smallest ``hard`` over its quotas less the requests of its other non-terminal pods; the quota
    that sets each resource's limit)."""
    hard: dict[str, dict[str, float]] = defaultdict(dict)
    binding: dict[str, dict[str, str]] = defaultdict(dict)
    for quota in cluster.quotas:
        _tighten(hard[quota.namespace], binding[quota.namespace], quota)
    jobs = {job.key for job in cluster.jobs if job.spec is not None}
    for pod in cluster.pods:
        if pod.namespace not in hard or pod.terminal:
            continue
        if pod.job is not None and (pod.namespace, pod.job) in jobs and not pod.terminating:
            continue  # a live replica: counted against its job below
        room = hard[pod.namespace]
        for resource, value in pod.requests.items():
            if resource in room:
                room[resource] -= value
    return {ns: (hard[ns], binding[ns]) for ns in sorted(hard)}


def _tighten(room: dict[str, float], binding: dict[str, str], quota: Quota) -> None:
    for resource, value in quota.hard.items():
        if value < room.get(resource, math.inf):
            room[resource] = value
            binding[resource] = quota.name


def _fit(room: Mapping[str, float], vector: Mapping[str, float]) -> tuple[int, str]:
    """How many pods of ``vector`` fit ``room`` (a large number when no limited resource is requested), and the
    resource that limits it."""
    best, which = 1 << 30, ""
    for resource, have in room.items():
        need = vector.get(resource, 0.0)
        if need > 0:
            fits = max(0, math.floor((have + 1e-9 * max(1.0, abs(have))) / need))
            if fits < best:
                best, which = fits, resource
    return best, which


def _quota_caps(cluster: Cluster, live: Mapping[JobKey, list[Pod]]) -> dict[JobKey, tuple[int, Limit]]:
    """Each quota-limited job's allowed replicas and its ``QuotaLimited`` :class:`Limit` (see the module
    docstring)."""
    out: dict[JobKey, tuple[int, Limit]] = {}
    by_namespace: dict[str, list[Job]] = defaultdict(list)
    for job in cluster.jobs:
        if job.spec is not None:
            by_namespace[job.namespace].append(job)
    for namespace, (room, binding) in quota_room(cluster).items():
        ordered = sorted(by_namespace.get(namespace, ()), key=lambda j: j.name)
        for job in ordered:  # every live pod counts first: the quota holds them already
            for pod in live.get(job.key, []):
                for resource, value in pod.requests.items():
                    if resource in room:
                        room[resource] -= value
        for job in ordered:
            assert job.spec is not None
            pods = live.get(job.key, [])
            vector = _largest_vector(job, cluster)
            wanted = job.spec.replicas
            more, which = _fit(room, vector)
            extra = max(0, min(more, wanted - len(pods)))
            for resource in room:
                room[resource] -= extra * vector.get(resource, 0.0)
            allowed = len(pods) + extra
            if allowed < wanted:
                left = room[which] + extra * vector[which]
                message = (f"ResourceQuota {namespace}/{binding[which]} leaves room for {allowed} of {wanted} "
                           f"replica(s): {which} {_fmt(left)} left for new pods after the namespace's other pods, "
                           f"the live pods of its Walras jobs ({len(pods)} of this one) and the new pods of the jobs "
                           f"before it in name order, {_fmt(vector[which])} per replica")
                out[job.key] = (allowed, Limit(QUOTA_LIMITED, allowed, wanted, message))
    return out


def _room_for_one(job: Job, cluster: Cluster, tabled: Callable[[], NodeTable]) -> bool:
    """Whether a usable node of one of ``job``'s pools, admitting its template, has free room for one of its pods
    now (bound and nominated pods counted; the pool's degree limit and ``spec.capacity`` are not); ``tabled`` gives
    the node table (built once, on first use)."""
    assert job.spec is not None
    table = tabled()
    admitted = table.admitted(job.template.constraints)
    for pool in cluster.pools:
        if pool.spec is None or pool.name not in job.spec.throughput:
            continue
        nodes = np.flatnonzero(admitted & select(table, pool.spec.node_selector))
        vector = table.vector(pod_vector(job.template, job.spec, pool.spec.resource, job.spec.demand))
        if nodes.size and bool(table.fits_many(nodes, vector).any()):
            return True
    return False


def _refusal_limit(refusal: Refusal, live: int, wanted: int, now: float | None,
                   room: Callable[[], bool]) -> tuple[int, Limit]:
    """A refused job's allowed replicas and its ``AdmissionRefused`` :class:`Limit` (see the module docstring)."""
    holding = refusal.until is None or now is None or now < refusal.until
    if holding:
        allowed = min(live, wanted)
        when = f"asked again at {rfc3339(refusal.until)}" if refusal.until is not None else "held"
    elif room():
        allowed, when = min(live + 1, wanted), "one pod asked again now"
    else:
        allowed, when = min(live, wanted), "asked again once a node has room for one pod"
    message = (f"the API server refused {refusal.pods} pod(s) ({refusal.code}, {refusal.attempts} time(s) in a row; "
               f"{when}, backoff doubling): {refusal.message}")
    return allowed, Limit(ADMISSION_REFUSED, allowed, wanted, message)


def refusals(cluster: Cluster, restarted: bool) -> dict[JobKey, Refusal]:
    """The refusals a plan reads: ``Cluster.refused`` (the operator's record), and when ``restarted`` (no previous
    plan: the operator's memory is new) each valid job's ``status.admissionRefusal`` (``Job.reported.refusal``,
    what the operator last wrote) where the record has none for it, so a restart neither asks again before the
    backoff ends nor restarts the backoff (as ``status.preemptionTimes`` keeps a pool's hourly budget)."""
    out = dict(cluster.refused)
    if restarted:
        for job in cluster.jobs:
            if job.spec is not None and job.reported.refusal is not None:
                out.setdefault(job.key, job.reported.refusal)
    return out


def admit(cluster: Cluster, now: float | None, restarted: bool = False) -> Admission:
    """The :class:`Admission` of ``cluster`` at ``now`` (see the module docstring; ``restarted``: there is no
    previous plan, :func:`refusals`); the cluster itself when no quota or refusal applies."""
    refused = refusals(cluster, restarted)
    if not cluster.quotas and not refused:
        return Admission(cluster, {})
    live: dict[JobKey, list[Pod]] = defaultdict(list)
    for pod in cluster.pods:
        if pod.job is not None and _live(pod):
            live[(pod.namespace, pod.job)].append(pod)
    caps = _quota_caps(cluster, live) if cluster.quotas else {}
    limits: dict[JobKey, list[Limit]] = defaultdict(list)
    allowed: dict[JobKey, int] = {}
    for key, (n, limit) in caps.items():
        allowed[key] = n
        limits[key].append(limit)
    valid = {job.key: job for job in cluster.jobs if job.spec is not None}
    tables: list[NodeTable] = []

    def table() -> NodeTable:
        if not tables:
            tables.append(node_table(cluster, nominated=nominations(cluster)))
        return tables[0]

    for key, refusal in sorted(refused.items()):
        job = valid.get(key)
        if job is None or job.spec is None:
            continue
        have, wanted = len(live.get(key, ())), allowed.get(key, job.spec.replicas)
        if have >= wanted:
            continue  # it wants no pod it does not have: nothing to refuse
        n, limit = _refusal_limit(refusal, have, wanted, now, functools.partial(_room_for_one, job, cluster, table))
        allowed[key] = n
        limits[key].append(limit)
    jobs = []
    changed = False
    for job in cluster.jobs:
        cap = allowed.get(job.key)
        if job.spec is not None and cap is not None and cap < job.spec.replicas:
            spec = dataclasses.replace(job.spec, replicas=cap, min_replicas=min(job.spec.min_replicas, cap))
            job = dataclasses.replace(job, spec=spec)
            changed = True
        jobs.append(job)
    out = dataclasses.replace(cluster, jobs=tuple(jobs)) if changed else cluster
    return Admission(out, {key: tuple(found) for key, found in sorted(limits.items())})


def annotate(jobs: Mapping[JobKey, JobPlan], admission: Admission) -> dict[JobKey, JobPlan]:
    """The job plans of ``jobs`` that an :class:`Admission` limit applies to, each with its conditions
    (``QuotaLimited`` / ``AdmissionRefused``, status True, reason = type), its spec's replica count as ``count``,
    and, for the replicas it keeps out, a blocker first (so its ``reason`` says why)."""
    out: dict[JobKey, JobPlan] = {}
    for key, limits in admission.limits.items():
        jp = jobs.get(key)
        if jp is None:
            continue
        conditions = tuple(c for c in jp.conditions if c.type not in (QUOTA_LIMITED, ADMISSION_REFUSED))
        conditions += tuple(Condition(limit.reason, "True", limit.reason, limit.message[:32000]) for limit in limits)
        pool = next(iter(jp.replicas), "") or next(iter(jp.allocation), "")
        blockers = tuple(Blocker(pool, limit.reason, limit.wanted - limit.replicas, limit.message) for limit in limits
                         if limit.replicas < limit.wanted)
        wanted = max(limit.wanted for limit in limits)
        out[key] = dataclasses.replace(jp, conditions=conditions, count=max(jp.count, wanted),
                                       blockers=blockers + jp.blockers,
                                       reason=blockers[0].reason if blockers else jp.reason)
    return out
