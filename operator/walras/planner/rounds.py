"""Phases *market* -> *replicas* -> *placement*, repeated until placement realises what the market sold.

Round r (at most ``max_rounds``):

1. **Market** (004, Alg. 2; :func:`.market.solve_market`): prices ``p`` and time fractions ``X`` maximising
   ``sum_i u_i(a_i^T x_i)`` s.t. ``sum_i d_ij x_ij <= R_j``. What the market may sell reflects what placement can
   realise: ``R_j`` is the pool's priced resource on usable nodes less what pods that are not kept replicas use
   there, and job i is offered pool j only where at least one of its pods can run (``a_ij = 0`` where its template
   admits no node, no node has room for its whole request vector, or the degree limit leaves no slot).
2. **Replicas** (:mod:`.replicas`): ``N_i x_ij`` rounded by largest remainder to the job's total, never more than
   the pool can host for the job (running + placeable), keeping what exists (running and pending pods) whenever it is
   a valid rounding, so that re-planning an unchanged cluster changes nothing.
3. **Placement** (:mod:`.placement`): the replicas that do not run yet (pending pods first, then new ones) are placed
   pool by pool, each pod on a node with room on every resource.

If some wanted replica found no node, that is fed back: the pool's sellable capacity drops by what could not be
placed, a job that could place nothing in a pool is no longer offered it, and the market re-prices from the last
prices. The number of rounds is reported (``plan.solver.rounds``); what is still unplaced after the last round is
reported on the job with the reason (:mod:`.status`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from walras.planner.capacity import NodeTable
from walras.planner.cluster import PODS, Pod, pod_vector
from walras.planner.integral import (
    FillInputs,
    fill_plan,
    gang_targets,
    idle_while_priced,
    placed_rows,
    utility_arrays,
    withdraw,
    withdraw_gangs,
)
from walras.planner.market import MarketResult, MarketSettings, solve_market
from walras.planner.model import Condition, PlanEvent
from walras.planner.placement import capacity_left, place_batch
from walras.planner.queue import claimed_nodes, contested
from walras.planner.replicas import fit_columns, largest_remainder, largest_remainder_rows, split_replicas
from walras.planner.results import Batch, Objects, Observed, Outcome, Placed, PlanContext, PlanOptions, Reservations
from walras.planner.reuse import Inputs, Reuse, Same, array_key, frozen, matches
from walras.planner.spec import JobSpec, UtilitySpec

__all__ = ["MarketEntry", "MarketInputs", "Outcome", "replica_targets", "run_rounds"]


@dataclass(frozen=True)
class KeptUseEntry:
    """The sellable capacity's record (:mod:`.reuse`): per pool, the priced resource its kept replicas use, for the
    running pod lists and the node names, pool resources and usable nodes in ``inputs``."""

    inputs: Inputs
    kept: tuple[tuple[float, float], ...]  # per pool: on its usable nodes, on its other member nodes


def _placeable(ctx: PlanContext, walras_count: np.ndarray, hostable: np.ndarray, offered: np.ndarray) -> np.ndarray:
    """Per pool, the most of its priced resource new replicas can take now: at most, per usable node, its free
    priced amount or its free slots (degree limit and ``pods``) times the largest demand of the jobs offered the
    pool, whichever is less; and at most what the jobs offered it could place, each class's pods counted on every
    resource (``hostable[i, j]`` times its demand). So a pool with ``degreeLimit: 2`` and 4 pod slots is not sold 16
    GPUs (issue 33)."""
    objects, table = ctx.objects, ctx.table
    demand = np.array([info.spec.demand for info in objects.jobs], dtype=np.float64)
    out = np.zeros(len(objects.pools))
    pods = table.column[PODS]
    for j, pool in enumerate(objects.pools):
        c = table.column.get(pool.spec.resource)
        nodes = pool.usable
        if c is None or nodes.size == 0 or not offered[:, j].any():
            continue
        free = np.maximum(table.free[nodes], 0.0)
        slots = np.floor(free[:, pods] + 1e-9)
        if pool.spec.degree_limit is not None:
            slots = np.minimum(slots, np.maximum(pool.spec.degree_limit - walras_count[nodes], 0))
        top = float(demand[offered[:, j]].max())
        by_slots = float(np.minimum(free[:, c], slots * top).sum())
        by_class = float((hostable[offered[:, j], j] * demand[offered[:, j]]).sum())
        out[j] = min(by_slots, by_class)
    return out


def _sellable(ctx: PlanContext, observed: Observed, placeable: np.ndarray | None = None) -> np.ndarray:
    """``R_j``: the pool's priced resource on its usable nodes (or its spec.capacity) less what pods other than its
    kept replicas use there, plus what its kept replicas hold on its nodes that take no new pod (cordoned, or
    NotReady within the node-loss grace): a kept replica holds its capacity wherever it runs in the pool, so a
    cordon or a NotReady blip does not shrink what the market sells its jobs (issue 33; such pods are never removed
    for it). With the context's reuse (:mod:`.reuse`), the per-pool sums over the kept replicas are the recorded ones
    when the running pods are the same lists (the observe phase reused them) on the same nodes and each pool has the
    same member and usable nodes and priced resource; this plan's are recorded."""
    objects, table, reuse = ctx.objects, ctx.table, ctx.reuse
    m = len(objects.pools)
    out = np.zeros(m)
    resources = [pool.spec.resource for pool in objects.pools]
    inputs = (Same((observed.running,)), table.names, resources,
              [(array_key(pool.usable), array_key(pool.members)) for pool in objects.pools])
    hit = reuse.lookup(KeptUseEntry, inputs)
    kept = hit.kept if hit is not None else tuple(_kept(objects, observed, table, resources))
    reuse.store(hit if hit is not None else KeptUseEntry(inputs, kept))
    for j, pool in enumerate(objects.pools):
        c = table.column.get(pool.spec.resource)
        on_usable, elsewhere = kept[j]
        if c is None:
            continue
        if pool.usable.size == 0:
            out[j] = elsewhere
            continue
        alloc = float(table.alloc[pool.usable, c].sum())
        base = alloc if pool.spec.capacity is None else float(pool.spec.capacity)
        used = float(table.used[pool.usable, c].sum())
        sold = max(base - (used - on_usable), 0.0)
        if placeable is not None:
            sold = min(sold, on_usable + float(placeable[j]))
        out[j] = sold + elsewhere
    return out


def _kept(objects: Objects, observed: Observed, table: NodeTable, resources: list[str]) -> list[tuple[float, float]]:
    """Per pool, the priced resource its kept replicas (running pods on its nodes) use on its usable nodes and on
    its other member nodes (cordoned, NotReady)."""
    m = len(objects.pools)
    index = table.index
    # One pass over the running pods, summed in row order, then pod order, as a per-pool pass would.
    usable_in = np.zeros(len(table.names), dtype=bool)
    for pool in objects.pools:
        usable_in[pool.usable] = True
    usable_list = usable_in.tolist()
    on_usable = [0.0] * m
    elsewhere = [0.0] * m
    for row in observed.running:
        for j, pods in enumerate(row):
            if not pods:
                continue
            resource = resources[j]
            for pod in pods:
                if pod.node is None:
                    continue
                if usable_list[index[pod.node]]:
                    on_usable[j] += pod.requests.get(resource, 0.0)
                else:
                    elsewhere[j] += pod.requests.get(resource, 0.0)
    return list(zip(on_usable, elsewhere, strict=True))


def _room(objects: Objects, table: NodeTable) -> np.ndarray:
    """Per pool, the priced resource free now on its usable nodes (within what ``spec.capacity`` leaves, counted over
    its member nodes as :func:`.placement.capacity_left` does, where set): what new pods
    of this plan can use (room that this plan's deletions free counts only once they are gone)."""
    out = np.zeros(len(objects.pools))
    for j, pool in enumerate(objects.pools):
        c = table.column.get(pool.spec.resource)
        if c is None or pool.usable.size == 0:
            continue
        free = float(np.maximum(table.alloc[pool.usable, c] - table.used[pool.usable, c], 0.0).sum())
        out[j] = min(free, max(capacity_left(pool, table), 0.0))
    return out


@dataclass(frozen=True, slots=True)
class PodVector:
    """A job's pod vector (its bytes) for one priced resource, with what it was computed from: ``inputs`` is
    ``(Same((template, spec.resources)), demand)``."""

    inputs: Inputs
    data: bytes


@dataclass(frozen=True)
class HostableEntry:
    """The hostable counts' record (:mod:`.reuse`): per pool, the evaluation of each (admitted mask, pod vector)
    pair, valid for the node table, Walras pods per node and pool set-up in ``inputs`` (the dicts are copied before
    a plan adds to them)."""

    inputs: Inputs
    caches: tuple[dict[tuple[bytes, bytes], tuple[int, str | None]], ...]


@dataclass(frozen=True)
class PodVectorsEntry:
    """Each job's pod vector per priced resource (:mod:`.reuse`), valid for the node table's resources in
    ``inputs``; each vector is checked against its own inputs (:class:`PodVector`)."""

    inputs: Inputs
    vectors: Mapping[tuple[tuple[str, str], str], PodVector]


def _hostable(ctx: PlanContext, walras_count: np.ndarray) -> tuple[np.ndarray, dict[tuple[int, int], str]]:
    """``(n, m)``: how many more pods of job i pool j's nodes can take now (room on every resource and slots); and
    the (job, pool) pairs where no pod of the job can ever run, with why: ``NoEligibleNode`` (no usable node admits
    the template) or ``TooLarge`` (no admitted node's allocatable holds the pod's requests).

    Jobs with the same admitted mask and pod vector have the same answer in a pool: one evaluation per distinct
    (mask, vector) pair. With the context's reuse (:mod:`.reuse`): a job's pod vector is the recorded one when its
    template and requested resources are the same objects (the translation cache's), its demand is equal and the
    resources are the same; the evaluations are the recorded ones when the node table (allocatable, requested), the
    Walras pods per node, and each pool's usable nodes, degree limit and priced resource are equal (an evaluation
    reads nothing else but its mask and vector, which are its key). This plan's are recorded."""
    objects, templates, admitted, table, reuse = ctx.objects, ctx.templates, ctx.admitted, ctx.table, ctx.reuse
    n, m = len(objects.jobs), len(objects.pools)
    out = np.zeros((n, m), dtype=np.int64)
    never: dict[tuple[int, int], str] = {}
    in_pool = np.array([info.pools for info in objects.jobs], dtype=bool).reshape(n, m)
    inputs = (table.resources, array_key(table.alloc), array_key(table.used), array_key(walras_count),
              [(array_key(p.usable), p.spec.degree_limit, p.spec.resource) for p in objects.pools])
    hit = reuse.lookup(HostableEntry, inputs)
    caches = [dict(c) for c in hit.caches] if hit is not None else [{} for _ in range(m)]
    recorded_vectors = reuse.lookup(PodVectorsEntry, (table.resources,))
    known: Mapping[tuple[tuple[str, str], str], PodVector] = (
        recorded_vectors.vectors if recorded_vectors is not None else {})
    # (job key, priced resource) -> its pod vector, computed once
    vectors: dict[tuple[tuple[str, str], str], PodVector] = {}
    masks: dict[int, bytes] = {}  # id(mask) -> its bytes (the masks are alive for the whole call)
    by_row: dict[tuple[int, str], bytes] = {}

    def _vector_bytes(i: int, resource: str) -> bytes:
        done = by_row.get((i, resource))
        if done is not None:
            return done
        info = objects.jobs[i]
        got = vectors.get((info.key, resource))
        if got is None:
            template, spec = templates[i], info.spec
            parts = (Same((template, spec.resources)), spec.demand)
            was = known.get((info.key, resource))
            if was is not None and matches(was.inputs, parts):
                got = was
            else:
                got = PodVector(parts, table.vector(pod_vector(template, spec, resource, spec.demand)).tobytes())
            vectors[(info.key, resource)] = got
        by_row[(i, resource)] = got.data
        return got.data

    for j, pool in enumerate(objects.pools):
        nodes = pool.usable
        if nodes.size == 0:
            continue
        slots = np.full(nodes.size, 1 << 30, dtype=np.int64) if pool.spec.degree_limit is None else np.maximum(
            pool.spec.degree_limit - walras_count[nodes], 0)
        alloc = table.alloc[nodes]
        cache = caches[j]
        for i in np.flatnonzero(in_pool[:, j]).tolist():
            mask = admitted[i]
            mask_bytes = masks.get(id(mask))
            if mask_bytes is None:
                mask_bytes = masks[id(mask)] = mask.tobytes()
            key = (mask_bytes, _vector_bytes(i, pool.spec.resource))
            found = cache.get(key)
            if found is None:
                vec = np.frombuffer(key[1])
                ok = mask[nodes]
                why: str | None = None
                if not ok.any():
                    why = "NoEligibleNode"
                elif not np.any(np.all(alloc[ok] + 1e-9 >= vec, axis=1)):
                    why = "TooLarge"
                found = cache[key] = (int(np.minimum(table.fit_count(vec, nodes), slots)[ok].sum()), why)
            out[i, j] = found[0]
            if found[1] is not None:
                never[(i, j)] = found[1]
    reuse.store(HostableEntry(inputs, tuple(caches)))
    reuse.store(PodVectorsEntry((table.resources,), vectors))
    return out, never


def replica_targets(shares: np.ndarray, replicas: np.ndarray, existing: np.ndarray,
                    elastic: np.ndarray, low: np.ndarray, fair_elastic: np.ndarray,
                    columns: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
                    dropped: np.ndarray | None = None) -> np.ndarray:
    """Integral replicas per job and pool from the market's fractional replicas ``shares = N_i x_ij``.

    The job's total is ``round(sum_j shares_ij)`` (at most ``N_i``), or what exists when that is already the floor
    or the ceiling of the sum (hysteresis: a total on a rounding boundary does not flip between plans). An elastic
    job below its minimum gets none (its pods are a gang), except in fair pools, where the fair mechanism decides
    and what exists stays. The row is split by largest remainder and then reconciled with what exists
    (:func:`.replicas.split_replicas`): existing pods are kept whenever the total allows. With ``columns`` =
    ``(demand per replica, free room per pool, running (n, m), offered (n, m), keep (n,))``, new replicas that
    rounding put in a pool beyond its free room move to another offered pool of the job, or are dropped
    (:func:`.replicas.fit_columns`; existing pods always stay; ``dropped`` counts the replicas that found no pool
    with room). What exists stays up to ``N_i`` (the integral fill gives idle room beyond the rounding), except for
    the rows where ``columns``' ``keep`` is False: jobs with pods in a pool whose kept replicas need more than it
    sells (a ``spec.capacity`` lowered below what runs), which the market shrinks to its rounding (their surplus is
    evicted, :mod:`.reconcile`).
    """
    total_share = shares.sum(axis=1)
    have = existing.sum(axis=1)
    rounded = np.floor(total_share + 0.5).astype(np.int64)
    keep = (np.floor(total_share + 1e-6) <= have) & (have <= np.ceil(total_share - 1e-6)) & (have > 0)
    totals = np.minimum(replicas, np.where(keep, have, rounded))
    # What exists stays (up to the replicas): the integral fill gives idle room beyond the market's rounding, so a
    # job above its rounded share is not cut back to it (a plan of the applied plan changes nothing).
    kept = np.minimum(have, replicas)
    totals = np.maximum(totals, kept if columns is None else np.where(columns[4], kept, 0))
    totals[fair_elastic] = np.minimum(replicas, np.maximum(totals, have))[fair_elastic]
    totals[elastic & (low > 0) & (totals < low) & ~fair_elastic] = 0
    weights = np.where((shares.sum(axis=1) > 0)[:, None], shares, existing.astype(np.float64))
    zero = (weights.sum(axis=1) <= 0) & (totals > 0)
    totals[zero] = 0  # nothing to split by (no share, nothing exists): no replicas
    target = largest_remainder_rows(weights, totals)
    for i in np.flatnonzero((have > 0) & (target != existing).any(axis=1)).tolist():
        target[i] = split_replicas(target[i], existing[i])
    if columns is not None:
        demand, room, running, offered, _ = columns
        target = fit_columns(target, shares, demand, room, running, np.minimum(existing, target), offered, dropped)
    return target


@dataclass(frozen=True)
class _Fixed:
    """What every round of :func:`run_rounds` reads and no round changes (per job row: replicas, demand per replica,
    elastic, minimum; per row and pool: running and existing pods, throughput, demand; per pool: fair, free room)."""

    replicas: np.ndarray
    per_replica: np.ndarray
    running: np.ndarray
    existing: np.ndarray
    A: np.ndarray
    D: np.ndarray
    room: np.ndarray
    elastic: np.ndarray
    low: np.ndarray
    fair_pool: np.ndarray


def _fixed(ctx: PlanContext, observed: Observed) -> _Fixed:
    jobs = ctx.objects.jobs
    pools = ctx.objects.pools
    n, m = len(jobs), len(pools)
    replicas = np.array([info.spec.replicas for info in jobs], dtype=np.int64)
    per_replica = np.array([info.spec.demand for info in jobs], dtype=np.float64)
    running = observed.counts("running").reshape(n, m)
    existing = running + observed.counts("pending").reshape(n, m)
    A = np.zeros((n, m))
    for i, info in enumerate(jobs):
        for j in np.flatnonzero(info.pools).tolist():
            A[i, j] = info.spec.throughput[pools[j].name]
    D = np.repeat((np.maximum(replicas, 1) * per_replica)[:, None], m, axis=1) if n else np.zeros((0, m))
    return _Fixed(replicas, per_replica, running, existing, A, D, _room(ctx.objects, ctx.table),
                  np.array([info.spec.elastic for info in jobs], dtype=bool),
                  np.array([info.spec.min_replicas for info in jobs], dtype=np.int64),
                  np.array([p.spec.policy == "fair" for p in pools], dtype=bool))


def run_rounds(ctx: PlanContext, observed: Observed) -> Outcome:
    """Run the rounds described in the module docstring; return the last one. The context's reuse serves
    :func:`_hostable`, :func:`_sellable` and round 1's :func:`_market` (:mod:`.reuse`); the placement policies'
    conditions (each once per pool) and warnings and the market's warnings are returned in the outcome."""
    objects, opts = ctx.objects, ctx.options
    jobs = objects.jobs
    n, m = len(jobs), len(objects.pools)
    f = _fixed(ctx, observed)
    hostable, never = _hostable(ctx, observed.walras_count)
    cap = f.running + hostable
    # A waiting job bids in a pool where no pod of it fits now when the pool's preemption rule lets running pods
    # yield to it (issue 31; docs/preemption.md: :func:`.queue.contested`), so the prices say what it must beat
    # and the preemption phase decides which pods yield; elsewhere it is offered only where a pod fits (it spills).
    full = [(int(i), int(j)) for i, j in zip(*np.nonzero((f.A > 0) & (cap == 0)), strict=True)]
    pairs = [pair for pair in full if pair not in never]
    contest = contested(ctx, observed, pairs, utility_arrays([info.spec.utility for info in jobs])) if pairs else set()
    blocked: dict[tuple[int, int], str] = {}
    for pair in full:
        if pair in never or pair not in contest:
            blocked[pair] = never.get(pair, "NoRoom")
    R = _sellable(ctx, observed, _placeable(ctx, observed.walras_count, hostable, f.A > 0))
    # pools whose running replicas need more than the pool sells (spec.capacity lowered below what runs): their jobs
    # are shrunk to the market's rounding, every other job keeps what it runs
    oversold: np.ndarray = (f.running * f.per_replica[:, None]).sum(axis=0) > R + 1e-9
    keep_existing: np.ndarray = np.logical_not((f.running[:, oversold] > 0).any(axis=1))
    previous = ctx.previous
    warm = None
    if previous is not None and m and all(p.name in previous.pools for p in objects.pools):
        warm = np.array([previous.pools[p.name].price for p in objects.pools])
    # with tenants, the market weights of the solve that gave those prices (market.budget_equilibrium's warm start)
    weights_of: dict[tuple[str, str], float] = dict(previous.market_weights) if previous is not None else {}
    # each pending pod's node in the previous plan (a pending pod keeps it while it fits there)
    waiting = previous is not None and any(any(cell) for row in observed.pending for cell in row)
    before = {(p.namespace, p.name): p.node for p in previous.pods if p.node is not None} if (
        previous is not None and waiting) else {}
    if waiting:  # a claim pod (the preemption phase's) is reserved first on the node its victims free
        before.update((key, node) for key, (node, _) in claimed_nodes(previous).items())
    priority = [info.job.priority for info in jobs]
    by_priority = priority if len(set(priority)) > 1 else None  # higher priority served first in each batch
    rounds = 0
    last_short = 1 << 62
    reported: dict[str, list[Condition]] = {}
    events: list[PlanEvent] = []
    while True:
        rounds += 1
        A_eff = f.A.copy()
        for i, j in blocked:
            A_eff[i, j] = 0.0
        active = np.flatnonzero((f.replicas > 0) & (A_eff > 0).any(axis=1)) if n else np.zeros(0, dtype=np.int64)
        warm_weights = None
        if opts.tenants is not None and warm is not None and active.size and all(
                jobs[i].key in weights_of for i in active.tolist()):
            warm_weights = np.array([weights_of[jobs[i].key] for i in active.tolist()])
        market = _market(MarketInputs(A_eff[active], R, tuple(jobs[i].spec.utility for i in active),
                                      (1.0,) * active.size, f.D[active], warm, opts.device, opts.market_iterations,
                                      _eps(opts, [jobs[i].spec for i in active.tolist()]), opts.tenants is not None,
                                      warm_weights),
                         ctx.reuse if rounds == 1 else None)
        if market.weights is not None:
            weights_of = {jobs[i].key: float(v) for i, v in zip(active.tolist(), market.weights.tolist(), strict=True)}
        X = np.zeros((n, m))
        X[active] = market.allocation
        fair_share = f.elastic[:, None] & f.fair_pool[None, :] & (A_eff > 0) & ((X > 1e-9) | (f.existing > 0))
        fair_elastic = fair_share.any(axis=1)
        dropped = np.zeros((n, m), dtype=np.int64)
        target = replica_targets(f.replicas[:, None] * X, f.replicas, f.existing, f.elastic, f.low, fair_elastic,
                                 (f.per_replica, f.room, f.running, A_eff > 0, keep_existing), dropped)
        target = gang_targets(ctx, target, f.existing, A_eff, market.prices, cap, dropped)  # gangs: N in 1 pool or 0
        table = ctx.table
        work = Reservations(NodeTable(table.nodes, table.names, table.index, table.resources, table.column,
                                      table.alloc, table.used.copy(), table.usable), observed.walras_count.copy())
        granted = fair_elastic[:, None] & fair_share
        batches = []
        short = np.zeros((n, m), dtype=np.int64)
        reasons: dict[tuple[int, int], str] = {}
        for j in range(m):
            batch, pods = _batch(observed, f, j, target - f.running, (granted, fair_share, X, target), by_priority)
            placed = place_batch(ctx, batch, A_eff, work, memoise=True, sticky=_sticky(pods, before, table.index))
            batches.append((batch, placed, pods))
            _report_policy(reported, events, objects.pools[j].name, placed.conditions)
            for q, (i, k) in enumerate(zip(batch.rows, placed.node.tolist(), strict=True)):
                if k < 0 and not batch.optional[q]:
                    short[i, j] += 1
                    reasons[(i, j)] = placed.why[q] or reasons.get((i, j), "")
        below_min = _gang(ctx, batches, f.running, work)
        withdraw_gangs(ctx, batches, f.running, work, target)  # a gang below N gets no new pod (walras.planner.gang)
        if not short.any() or rounds >= opts.max_rounds or short.sum() >= last_short:
            break  # realised, out of rounds, or the feedback no longer helps
        last_short = int(short.sum())
        # Feed back what placement could not realise, and re-price from the last prices.
        warm = market.prices
        for i, j in zip(*np.nonzero(short), strict=True):
            i, j = int(i), int(j)
            placed_here = int(target[i, j] - short[i, j] - f.running[i, j])
            if placed_here <= 0 and f.running[i, j] == 0:
                blocked[(i, j)] = reasons.get((i, j)) or "NoRoom"
            R[j] = max(R[j] - short[i, j] * f.per_replica[i], 0.0)
    # The integral fill (:mod:`.integral`): whole replicas on the room rounding and the policies left idle.
    gang = f.elastic & (f.low > 0) & (placed_rows(batches, f.running) < f.low)
    allowed = (f.replicas > 0) & ~fair_elastic & ~gang
    allowed[list(below_min)] = False
    fill = FillInputs(f.replicas, allowed, f.A > 0, f.A, X, frozenset(blocked))
    report = fill_plan(ctx, fill, target, dropped, batches, work, f.running)
    for name, message in idle_while_priced(ctx, fill, batches, work, f.running, market.prices).items():
        _report_policy(reported, events, name, (Condition("CapacityIdle", "True", "IdleWhilePriced", message),))
    events.extend(_report_market(objects, market))
    return Outcome(market, X, A_eff, f.A > 0, f.D, R, target, batches, work.table, work.count, rounds, blocked,
                   below_min, dropped, {name: tuple(conditions) for name, conditions in reported.items()},
                   tuple(events), report, weights_of if market.weights is not None else {})


def _eps(opts: PlanOptions, specs: list[JobSpec]) -> float | None:
    """The market's duality-gap tolerance: ``opts.market_eps`` when set; with tenants, ``gap * sum_i b_i`` over
    the jobs in this round's market (docs/budgets.md, "Accuracy"; each priced job's log weight is its budget
    ``b_i``), so a job left out of the market (invalid, no usable pool) does not change the others' accuracy;
    else None (the allocator's default)."""
    if opts.market_eps is not None:
        return opts.market_eps
    if opts.tenants is None:
        return None
    total = math.fsum(float(s.utility.weight) for s in specs)
    return opts.tenants.gap * total if total > 0 else None


def _sticky(pods: list[Pod | None], before: Mapping[tuple[str, str], str | None],
            index: Mapping[str, int]) -> np.ndarray | None:
    """Per pod of a batch, the node index the previous plan gave its pending pod, else the node its
    ``walras.dev/planned-node`` annotation names (:attr:`.cluster.Pod.planned`: the plan that created it; a plan
    without the previous one, after a restart, keeps it there too); -1 for a new pod or none; None when no pod has
    one."""
    out = np.full(len(pods), -1, dtype=np.int64)
    for q, pod in enumerate(pods):
        if pod is not None:
            node = before.get((pod.namespace, pod.name)) or pod.planned
            if node is not None:
                out[q] = index.get(node, -1)
    return out if np.any(out >= 0) else None


def _batch(observed: Observed, f: _Fixed, j: int, wants: np.ndarray,
           fair: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
           priority: list[int] | None = None) -> tuple[Batch, list[Pod | None]]:
    """Pool j's batch of one round: each row's pending pods it still wants (first), then its new pods, then the
    optional pods an elastic job offers a fair pool; with, per pod, the pending pod or None for a new one. ``fair``:
    (granted (n, m), fair share (n, m), X, target). With ``priority`` (per row, when the jobs' PriorityClass
    priorities differ) the rows of higher priority come first (docs/preemption.md: PriorityClass order is served
    before the market's)."""
    granted_all, fair_share, X, target = fair
    rows: list[int] = []
    optional: list[bool] = []
    pods: list[Pod | None] = []
    n = wants.shape[0]
    # Only rows that want pods here or may be granted some contribute to the batch.
    candidates = np.flatnonzero((wants[:, j] > 0) | granted_all[:, j]).tolist() if n else []
    want_j = wants[:, j].tolist() if n else []
    if priority is not None:
        candidates.sort(key=lambda i: -priority[i])
    for i in candidates:
        want = int(want_j[i])
        pending = observed.pending[i][j]
        for q, pod in enumerate(pending):
            if q < want:
                rows.append(i)
                optional.append(False)
                pods.append(pod)
        new = max(want - len(pending), 0)
        offer = 0
        granted = bool(granted_all[i, j])
        if granted:  # the fair mechanism decides how many of an elastic job's new pods it takes (002)
            offer = _offer(int(f.replicas[i]) - int(target[i].sum()), fair_share[i], X[i], f.existing[i], j)
        rows.extend([i] * (new + offer))
        optional.extend([granted] * new + [True] * offer)
        pods.extend([None] * (new + offer))
    return Batch(j, rows, optional), pods


def _gang(ctx: PlanContext, batches: list[tuple[Batch, Placed, list[Pod | None]]], running: np.ndarray,
          work: Reservations) -> dict[int, int]:
    """An elastic job whose replicas (running and placed) stay below ``spec.replicas.min`` gets no new pod: it could
    not run with fewer (its pods are a gang). Its new pods are unplaced again and their room given back
    (:func:`.integral.withdraw`). Returns the rows concerned with the replicas they would have had."""
    placed = placed_rows(batches, running)
    out = {row: int(placed[row]) for row, info in enumerate(ctx.objects.jobs)
           if info.spec.elastic and 0 < placed[row] < info.spec.min_replicas}
    if out:
        withdraw(ctx, batches, out, work)
    return out


def _offer(left: int, share: np.ndarray, x: np.ndarray, existing: np.ndarray, j: int) -> int:
    """Optional pods an elastic job offers fair pool j: what its maximum leaves above its replicas, split over its
    fair pools by its market shares (or by what runs there when it has no share)."""
    if left <= 0:
        return 0
    weights = np.where(share, x, 0.0)
    if weights.sum() <= 0:
        weights = np.where(share, existing, 0).astype(np.float64)
    if weights.sum() <= 0:
        weights = share.astype(np.float64)
    return int(largest_remainder(weights, left)[j])


def _report_policy(reported: dict[str, list[Condition]], events: list[PlanEvent], pool: str,
                   conditions: tuple[Condition, ...]) -> None:
    """Add to ``reported[pool]`` the policy ``conditions`` it does not hold yet (a later round may place the same
    request again), each with a Warning event against the pool in ``events``."""
    held = reported.setdefault(pool, [])
    for condition in conditions:
        if condition not in held:
            held.append(condition)
            events.append(PlanEvent("ResourcePool", "", pool, "Warning", condition.reason, condition.message))


def _report_market(objects: Objects, market: MarketResult) -> list[PlanEvent]:
    """The market's warnings: its allocation repaired to fit a capacity, its solver not converged."""
    first = objects.pools[0].name if objects.pools else ""
    events: list[PlanEvent] = []
    if market.repaired > 1e-6:
        events.append(PlanEvent(
            "ResourcePool", "", first, "Warning", "MarketInfeasible",
            f"The price solver's allocation broke a capacity by {market.repaired:.3g}; it was scaled back to fit."))
    if not market.converged:
        events.append(PlanEvent(
            "ResourcePool", "", first, "Warning", "SolverNotConverged",
            f"Price discovery stopped after {market.iterations} evaluations with a duality gap of {market.gap:.4g}."))
    return events


@dataclass(frozen=True)
class MarketInputs:
    """The arguments of one round's :func:`.market.solve_market`: throughput ``a`` (rows: the jobs in the market),
    sellable capacity, the jobs' utility specs and weights, demand, warm-start prices (None: a cold start), device
    and the bound on dual evaluations."""

    throughput: np.ndarray
    capacity: np.ndarray
    specs: tuple[UtilitySpec, ...]
    weights: tuple[float, ...]
    demand: np.ndarray
    warm: np.ndarray | None
    device: str
    max_iter: int
    eps: float | None = None  # the duality-gap tolerance (None: the allocator's default)
    budgets: bool = False  # tenants on: the weights are budgets (market.budget_equilibrium, docs/budgets.md T6)
    #: with budgets: the market weights b' of the solve that gave ``warm`` (per row; None: start from the budgets)
    warm_weights: np.ndarray | None = None

    def key(self) -> Inputs:
        """Everything the solve reads, comparable: the arrays by their bytes (a cold start only matches a cold
        start), the rest by value."""
        return (array_key(self.throughput), array_key(self.capacity), array_key(self.demand),
                None if self.warm is None else array_key(self.warm), self.weights, self.device, self.max_iter,
                self.specs, self.eps, self.budgets,
                None if self.warm_weights is None else array_key(self.warm_weights))


@dataclass(frozen=True)
class MarketEntry:
    """The market's record (:mod:`.reuse`): the result of the solve of the inputs in ``inputs``
    (:meth:`MarketInputs.key`), its arrays read-only."""

    inputs: Inputs
    result: MarketResult


def _market(args: MarketInputs, reuse: Reuse | None) -> MarketResult:
    """The market of one round (004, Alg. 2): :func:`.market.solve_market` of ``args``. With ``reuse``
    (:mod:`.reuse`), the recorded result when every argument is equal (:meth:`MarketInputs.key`), which the solve
    reads and nothing else: a copy sharing its arrays, with 0 seconds and ``reused`` set (no solve ran in this
    plan). This plan's arguments and result are recorded, the result's arrays then read-only (shared with the next
    plan). The planner passes ``reuse`` in round 1 only: later rounds re-price a capacity that placement feedback
    lowered."""
    key = args.key() if reuse is not None else ()
    hit = reuse.lookup(MarketEntry, key) if reuse is not None else None
    if hit is not None:
        market: MarketResult = replace(hit.result, seconds=0.0, reused=True)
    else:
        market = solve_market(args.throughput, args.capacity, args.specs, args.weights, args.demand, args.warm,
                              MarketSettings(args.device, args.max_iter, args.eps, args.budgets),
                              warm_weights=args.warm_weights)
    if reuse is not None:
        for array in (market.prices, market.allocation, market.throughputs):
            frozen(array)
        reuse.store(MarketEntry(key, market))
    return market
