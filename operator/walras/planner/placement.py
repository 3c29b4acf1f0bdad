"""Phase *placement*: one pool's pods to its nodes (kube-scheduler's Filter -> Score -> Reserve for a batch).

1. **Filter**: a pod of job i may go to node k of the pool when k is usable, admits the job's template
   (:meth:`.capacity.NodeTable.admitted`) and has room for the pod's whole request vector and a degree slot.
2. **Score**: the pool's policy (:mod:`.policies`: utility, colocation, throughput, fair) proposes a node for every pod
   of the batch at once. The policies optimise over the priced resource; they are given, per node, the priced amount
   that the node's *other* free resources can actually back for this batch's pods (``effective_free``), and slots
   that are the smaller of the degree limit and the node's free ``pods`` count.
3. **Reserve**: pods are committed in order. A pod whose proposed node passes the Filter is reserved there (the node's
   free vector shrinks); otherwise it goes to the Filter-passing node with the most free priced resource (the
   LeastAllocated score), or stays unplaced when no node passes. So no node is ever over-committed on any resource,
   whatever a policy proposes; unplaced pods are fed back to the market (:mod:`.plan`).

A policy that raises or breaks its contract is reported (``PolicyApplied=False``) and the pool's pods are proposed by
``spread``; the Reserve step is the same either way.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from walras.planner.capacity import EPS, NodeTable
from walras.planner.cluster import PODS, pod_vector
from walras.planner.model import Condition
from walras.planner.policies import (
    UNLIMITED,
    PlacementRequest,
    PlacementResult,
    SpreadPolicy,
    check_result,
    get_policy,
)
from walras.planner.results import Batch, Placed, PlanContext, PoolInfo, Reservations
from walras.planner.reuse import Inputs, Reuse
from walras.planner.spec import JobSpec, PoolSpec

__all__ = ["Batch", "Placed", "PlacementEntry", "capacity_left", "effective_free", "place_batch", "placement_digest",
           "propose", "whole_replicas", "why_not"]

#: Why a pod stays unplaced when its pool's ``spec.capacity`` is sold out (:func:`capacity_left`).
POOL_CAPACITY = "PoolCapacity"


def capacity_left(pool: PoolInfo, table: NodeTable) -> float:
    """What the pool may still sell of its priced resource under its ``spec.capacity``: the capacity less what every
    pod bound to one of its member nodes (usable or not, Walras' or not) requests there now, as
    :func:`walras.planner.invariants.check_cluster` counts ``PoolOverCapacity``; ``inf`` without a capacity. New
    and pending pods are reserved only within it (the Reserve step, the integral fill), so a plan never sells
    beyond ``spec.capacity``."""
    if pool.spec.capacity is None:
        return float("inf")
    c = table.column.get(pool.spec.resource)
    used = float(table.used[pool.members, c].sum()) if c is not None and pool.members.size else 0.0
    return float(pool.spec.capacity) - used


def effective_free(table: NodeTable, nodes: np.ndarray, priced: str, vectors: np.ndarray) -> np.ndarray:
    """Per node of ``nodes``, the amount of the priced resource that the node can actually sell to pods of the given
    request ``vectors`` (rows): its free priced amount, lowered where another free resource runs out first (for the
    most demanding pod per unit of priced resource)."""
    free = np.maximum(table.free[nodes], 0.0)
    p = table.column.get(priced)
    if p is None or nodes.size == 0:
        return np.zeros(nodes.size)
    out = free[:, p].copy()
    priced_amount = vectors[:, p]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(priced_amount[:, None] > 0, vectors / priced_amount[:, None], 0.0)
    ratio = ratio.max(axis=0) if ratio.size else np.zeros(len(table.resources))
    ratio[p] = 0.0
    ratio[table.column[PODS]] = 0.0
    for r in np.flatnonzero(ratio > 0).tolist():
        out = np.minimum(out, free[:, r] / ratio[r])
    return out


def place_batch(ctx: PlanContext, batch: Batch, throughput: np.ndarray, work: Reservations, *,
                memoise: bool, sticky: np.ndarray | None = None) -> Placed:
    """Place ``batch`` in its pool (Filter, Score by the pool's policy, Reserve into ``work``); ``throughput`` is
    the round's (n, m) ``a_ij``; the pool's policy conditions are returned with the placement
    (:attr:`Placed.conditions`). ``memoise``: read and record the pool's proposal in the context's reuse
    (:func:`_placement`). ``sticky[q]`` (when given): the node pod q (a pending pod) had in the previous plan, -1
    for none; such a pod is reserved there first when it still passes the Filter, so a pending pod keeps its
    binding from plan to plan (the policy places the others)."""
    if sticky is not None and np.any(sticky >= 0):
        return _place_sticky(ctx, batch, throughput, work, memoise, sticky)
    n = len(batch.rows)
    out = Placed(np.full(n, -1, dtype=np.int64), np.zeros(n), [""] * n)
    pool = ctx.objects.pools[batch.pool]
    if n == 0:
        if memoise:
            ctx.reuse.drop(PlacementEntry, pool.name)
        return out
    jobs, templates = ctx.objects.jobs, ctx.templates
    table, walras_count = work.table, work.count
    spec = pool.spec
    priced = spec.resource
    nodes_k = pool.usable
    rows = sorted(set(batch.rows))
    local = {row: q for q, row in enumerate(rows)}
    pool_jobs = [jobs[r].spec for r in rows]
    pod_local = np.array([local[r] for r in batch.rows], dtype=np.int64)
    vectors = np.array([table.vector(pod_vector(templates[r], jobs[r].spec, priced, jobs[r].spec.demand))
                        for r in rows])
    free_priced = effective_free(table, nodes_k, priced, vectors)
    pods_free = np.maximum(np.floor(table.free[nodes_k, table.column[PODS]] + 1e-9), 0).astype(np.int64)
    if spec.degree_limit is None:
        slots = np.minimum(pods_free, UNLIMITED)
    else:
        slots = np.minimum(np.maximum(spec.degree_limit - walras_count[nodes_k], 0), pods_free).astype(np.int64)
    extra = sorted({r for job in pool_jobs for r in job.resources if r != priced})
    resource_names = [priced, *extra]
    node_resources = np.zeros((nodes_k.size, len(resource_names)))
    node_resources[:, 0] = free_priced
    for r, res in enumerate(extra, start=1):
        c = table.column.get(res)
        if c is not None:
            node_resources[:, r] = np.maximum(table.free[nodes_k, c], 0.0)
    j = batch.pool
    request = PlacementRequest(
        pool=spec,
        node_names=[table.names[k] for k in nodes_k],
        free=free_priced,
        slots=slots,
        resource_names=resource_names,
        node_resources=node_resources,
        jobs=pool_jobs,
        job_pods=np.bincount(pod_local, minlength=len(rows)).astype(np.int64),
        job_throughput=np.array([throughput[r, j] for r in rows]),
        job_replicas_total=np.array([max(jobs[r].spec.replicas, 1) for r in rows], dtype=np.float64),
        pod_job=pod_local,
        profile=pool.profile,
        job_max_amount=_max_amounts(pool_jobs, pool.name),
    )
    result, reports = _placement(request, ctx.reuse if memoise else None)
    result = whole_replicas(request, result)
    out = Placed(out.node, out.amount, out.why, reports)
    # Reserve, in pod order: the proposal when it passes the Filter, else the best node that does.
    vectors_of: dict[tuple[int, float], np.ndarray] = {}
    if _reserve_as_proposed(ctx, batch, result, work, nodes_k, spec, vectors_of, out):
        return out
    _reserve_one_by_one(ctx, batch, result, work, nodes_k, spec, vectors_of, out)
    return out


def _place_sticky(ctx: PlanContext, batch: Batch, throughput: np.ndarray, work: Reservations, memoise: bool,
                  sticky: np.ndarray) -> Placed:
    """:func:`place_batch` with the sticky pods reserved on their previous node first (where it passes the
    Filter), the rest placed by the pool's policy."""
    jobs, templates, admitted = ctx.objects.jobs, ctx.templates, ctx.admitted
    table, count = work.table, work.count
    spec = ctx.objects.pools[batch.pool].spec
    member = np.zeros(len(table.names), dtype=bool)
    member[ctx.objects.pools[batch.pool].usable] = True
    n = len(batch.rows)
    node = np.full(n, -1, dtype=np.int64)
    amount = np.zeros(n)
    c = table.column.get(spec.resource)
    left = capacity_left(ctx.objects.pools[batch.pool], table)
    for q in np.flatnonzero(sticky >= 0).tolist():
        k, row = int(sticky[q]), batch.rows[q]
        job = jobs[row].spec
        vec = table.vector(pod_vector(templates[row], job, spec.resource, job.demand))
        if not (member[k] and admitted[row][k] and table.fits(k, vec)):
            continue
        if spec.degree_limit is not None and count[k] >= spec.degree_limit:
            continue
        take = float(vec[c]) if c is not None else 0.0
        if take > left + EPS * max(1.0, abs(left)):
            continue  # spec.capacity sold out: the Reserve step below says so
        left -= take
        table.add(k, vec)
        count[k] += 1
        node[q] = k
        amount[q] = job.demand
    rest = np.flatnonzero(node < 0).tolist()
    got = place_batch(ctx, Batch(batch.pool, [batch.rows[q] for q in rest], [batch.optional[q] for q in rest]),
                      throughput, work, memoise=memoise)
    why = [""] * n
    for t, q in enumerate(rest):
        node[q], amount[q], why[q] = got.node[t], got.amount[t], got.why[t]
    return Placed(node, amount, why, got.conditions)


def _max_amounts(jobs: list[JobSpec], pool: str) -> np.ndarray | None:
    """Per job, the most units one pod may get in ``pool`` (:attr:`JobSpec.pod_caps`, a Budget cap); None when no
    job is bounded there."""
    if not any(job.pod_caps for job in jobs):
        return None
    return np.array([dict(job.pod_caps).get(pool, np.inf) for job in jobs], dtype=np.float64)


def whole_replicas(request: PlacementRequest, result: PlacementResult) -> PlacementResult:
    """The proposal with every pod of a job without a utility curve given exactly its ``demand`` of the priced
    resource (a replica is whole: a policy arranges replicas, it never cuts one; issue 33). A job with
    ``spec.curve`` asks for variable amounts explicitly (assign-and-allocate, paper 000 Sec. 3) and keeps the
    policy's, within its per-pod bound in the pool where a Budget caps it (``job_max_amount``). A pod whose node
    cannot hold its demand is moved or left unplaced by the Reserve step."""
    curved = np.array([job.curve is not None for job in request.jobs], dtype=bool)
    bound = request.job_max_amount
    if bound is not None and request.n_pods:  # a Budget cap's per-pod bound clips a curve's amount
        over = (result.node >= 0) & (result.amount > bound[request.pod_job] + 1e-9)
        if over.any():
            amount = result.amount.copy()
            amount[over] = bound[request.pod_job][over]
            result = PlacementResult(node=result.node, amount=amount, notes=list(result.notes))
    if curved.all() or request.n_pods == 0:
        return result
    demand = request.demand()
    fixed = ~curved[request.pod_job] & (result.node >= 0)
    if np.array_equal(result.amount[fixed], demand[fixed]):
        return result
    amount = result.amount.copy()
    amount[fixed] = demand[fixed]
    return PlacementResult(node=result.node, amount=amount, notes=list(result.notes))


def _reserve_one_by_one(ctx: PlanContext, batch: Batch, result: PlacementResult, work: Reservations,
                        nodes_k: np.ndarray, spec: PoolSpec, vectors_of: dict[tuple[int, float], np.ndarray],
                        out: Placed) -> None:
    """Reserve pod by pod: the proposal when it passes the Filter, else the Filter-passing node with the most free
    priced resource; an unplaced pod gets its reason in ``out.why``."""
    jobs, templates, admitted = ctx.objects.jobs, ctx.templates, ctx.admitted
    table, walras_count = work.table, work.count
    priced = spec.resource
    priced_col = table.column.get(priced)
    degree = spec.degree_limit
    node, amount, why = out.node, out.amount, out.why
    left = capacity_left(ctx.objects.pools[batch.pool], table)
    for q in range(len(batch.rows)):
        row = batch.rows[q]
        proposed = int(result.node[q])
        if proposed < 0 and batch.optional[q]:
            continue  # an elastic job's offer the fair allocation did not take: beyond its share, not an error
        got = float(result.amount[q]) if proposed >= 0 else jobs[row].spec.demand
        vec = vectors_of.get((row, got))
        if vec is None:
            vec = vectors_of[(row, got)] = table.vector(pod_vector(templates[row], jobs[row].spec, priced, got))
        mask = admitted[row][nodes_k]
        if degree is not None:
            mask = mask & (walras_count[nodes_k] < degree)
        k = int(nodes_k[proposed]) if proposed >= 0 else -1
        if k < 0 or not mask[proposed] or not table.fits(k, vec):
            if proposed >= 0 and batch.optional[q]:
                continue
            fits = mask & table.fits_many(nodes_k, vec)
            if not fits.any():
                why[q] = why_not(table, nodes_k, admitted[row], walras_count, degree, vec)
                continue
            score = table.free[nodes_k, priced_col] if priced_col is not None else np.zeros(nodes_k.size)
            t = int(np.flatnonzero(fits)[np.argmax(score[fits])])
            k = int(nodes_k[t])
        take = float(vec[priced_col]) if priced_col is not None else 0.0
        if take > left + EPS * max(1.0, abs(left)):  # the pool's spec.capacity is sold out for this pod
            if not batch.optional[q]:
                why[q] = POOL_CAPACITY
            continue
        left -= take
        node[q] = k
        amount[q] = got
        table.add(k, vec)
        walras_count[k] += 1


def _reserve_as_proposed(ctx: PlanContext, batch: Batch, result: PlacementResult, work: Reservations,
                         nodes_k: np.ndarray, spec: PoolSpec, vectors_of: dict[tuple[int, float], np.ndarray],
                         out: Placed) -> bool:
    """Reserve the whole proposal at once when every pod of it passes the Filter together: each pod placed or an
    optional one left out, each on a node its template admits, each node within its degree limit and with room on
    every resource for all the pods proposed there. Requests are non-negative, so then every pod passes the
    pod-by-pod check as well, with the same sums in the same order (``np.add.at`` adds in pod order): the result is
    the sequential loop's, without a Filter call per pod. Returns False, reserving nothing, when some pod fails."""
    jobs, templates, admitted = ctx.objects.jobs, ctx.templates, ctx.admitted
    table, walras_count = work.table, work.count
    priced, degree = spec.resource, spec.degree_limit
    proposed = result.node
    placed = proposed >= 0
    if np.any(~placed & ~np.asarray(batch.optional, dtype=bool)):
        return False
    qs = np.flatnonzero(placed)
    if qs.size == 0:
        return True
    ks = nodes_k[proposed[qs]]
    rows = [batch.rows[q] for q in qs.tolist()]
    amounts = result.amount[qs].tolist()
    vecs = np.empty((qs.size, len(table.resources)))
    for t, (row, got) in enumerate(zip(rows, amounts, strict=True)):
        vec = vectors_of.get((row, got))
        if vec is None:
            vec = vectors_of[(row, got)] = table.vector(pod_vector(templates[row], jobs[row].spec, priced, got))
        if not admitted[row][ks[t]]:
            return False
        vecs[t] = vec
    counts = np.bincount(ks, minlength=len(table.names))
    if degree is not None and np.any(walras_count + counts > degree):
        return False
    c = table.column.get(priced)
    left = capacity_left(ctx.objects.pools[batch.pool], table)
    if c is not None and np.isfinite(left) and float(vecs[:, c].sum()) > left + EPS * max(1.0, abs(left)):
        return False  # the pool's spec.capacity cannot take every pod: the pod-by-pod Reserve decides which
    used = table.used.copy()
    np.add.at(used, ks, vecs)
    touched = np.flatnonzero(counts)
    alloc = table.alloc[touched]
    if not np.all(used[touched] <= alloc + EPS * np.maximum(1.0, alloc)):
        return False
    table.used[:] = used
    walras_count += counts.astype(walras_count.dtype)
    out.node[qs] = ks
    out.amount[qs] = amounts
    return True


def why_not(table: NodeTable, nodes_k: np.ndarray, admitted: np.ndarray, walras_count: np.ndarray,
             degree: int | None, vec: np.ndarray) -> str:
    """Why no node of the pool takes a pod: the degree limit, fragmentation (the pool has the room in total, no
    single node does), or capacity."""
    eligible = nodes_k[admitted[nodes_k]]
    if eligible.size == 0:
        return "NoEligibleNode"
    fits_room = table.fits_many(eligible, vec)
    if degree is not None and fits_room.any() and np.all(walras_count[eligible[fits_room]] >= degree):
        return "DegreeLimited"
    free = np.maximum(table.free[eligible], 0.0).sum(axis=0)
    if np.all(free + 1e-9 >= vec):
        return "Fragmented"
    return "InsufficientCapacity"


def placement_digest(request: PlacementRequest) -> str:
    """A digest of everything a pool's placement policy reads from ``request``. Policies are deterministic
    functions of the request, so equal digests mean equal proposals: the planner reuses the previous plan's proposal
    of a pool whose digest did not change instead of running its policy again."""
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
        h.update(repr(job).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class PlacementEntry:
    """A pool's placement as its policy proposed it (:mod:`.reuse`, one entry per pool): ``inputs`` is
    ``(digest, pods)`` of the request (:func:`placement_digest`); ``node[q]`` and ``amount[q]`` are the policy's
    answer for the request's pod q (node index into the request's nodes, -1 when unplaced); ``fallback`` is the
    message of a policy failure that made the pool fall back to spread placement; ``notes`` the policy's."""

    inputs: Inputs
    node: tuple[int, ...]
    amount: tuple[float, ...]
    fallback: str | None = None
    notes: tuple[str, ...] = ()


def _placement(request: PlacementRequest, reuse: Reuse | None) -> tuple[PlacementResult, tuple[Condition, ...]]:
    """The policy's proposal for ``request``: the recorded one (of an earlier round of this plan, else of the
    previous plan) when its digest is unchanged, else :func:`propose`; this plan's is recorded. Without ``reuse``
    (a second batch in the same pool) it neither reads nor records. With it, the conditions the proposal reports
    on the pool (a policy's fallback, a solver's notes)."""
    inputs = (placement_digest(request), request.n_pods) if reuse is not None else ()
    hit = reuse.lookup(PlacementEntry, inputs, request.pool.name) if reuse is not None else None
    if hit is not None and reuse is not None:
        result = PlacementResult(node=np.array(hit.node, dtype=np.int64),
                                 amount=np.array(hit.amount, dtype=np.float64), notes=list(hit.notes))
        fallback = hit.fallback
        reuse.store(hit, request.pool.name)
    else:
        result, fallback = propose(request)
        if reuse is not None:
            reuse.store(PlacementEntry(inputs, tuple(result.node.tolist()), tuple(result.amount.tolist()),
                                       fallback, tuple(result.notes)), request.pool.name)
    reports = [("PolicyApplied", "PolicyFallback", fallback)] if fallback is not None else []
    reports += [("PolicyCertified", "SolverCapped", note) for note in result.notes]
    return result, tuple(Condition(type_, "False", reason, message) for type_, reason, message in reports)


def propose(request: PlacementRequest) -> tuple[PlacementResult, str | None]:
    """Run the pool's policy; if it raises or breaks its contract, propose by ``spread`` and say why."""
    try:
        result = get_policy(request.pool.policy).place(request)
        check_result(request, result)
        return result, None
    except Exception as exc:  # a failing policy must not stop the plan: it is reported on the pool
        message = f"policy {request.pool.policy!r} failed ({exc}); pods proposed most-free-node first instead"
        result = SpreadPolicy().place(request)
        check_result(request, result)
        return result, message
