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

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from walras.planner.capacity import NodeTable
from walras.planner.cluster import JobTemplate, Pod, pod_vector
from walras.planner.market import MarketResult, solve_market
from walras.planner.model import Plan, PlanEvent
from walras.planner.objects import Objects
from walras.planner.observe import Observed
from walras.planner.placement import Batch, Placed, Warn, place_batch
from walras.planner.replicas import fit_columns, largest_remainder, largest_remainder_rows, split_replicas
from walras.planner.reuse import array_key, frozen, recorded, same_items
from walras.planner.spec import UtilitySpec


@dataclass
class Outcome:
    """The last round: market result, replica targets, and what placement did with each batch."""

    market: MarketResult
    allocation: np.ndarray  # (n, m) X over every job row (zero rows for jobs out of the market)
    throughput: np.ndarray  # (n, m) a_ij as the market saw it in the last round
    offered: np.ndarray  # (n, m) bool: pools the job may use with throughput > 0 (before any was withdrawn)
    demand: np.ndarray  # (n, m)
    capacity: np.ndarray  # (m,) the sellable capacity of the last round
    target: np.ndarray  # (n, m) wanted replicas
    batches: list[tuple[Batch, Placed, list[Pod | None]]]  # pod q: existing pending pod, or None for a new one
    table: NodeTable  # after reservations
    walras_count: np.ndarray
    rounds: int = 1
    blocked: dict[tuple[int, int], str] = field(default_factory=dict)  # (row, pool) no longer offered, and why
    below_min: dict[int, int] = field(default_factory=dict)  # elastic job row -> replicas it would have (< min)
    #: (n, m) wanted replicas that rounding took out of a pool without room now (:func:`.replicas.fit_columns`);
    #: not in ``target``, reported on the job as unplaced (``InsufficientCapacity``).
    dropped: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))

    @cached_property
    def blocked_by_row(self) -> dict[int, list[tuple[int, str]]]:
        """:attr:`blocked` grouped by job row: row -> [(pool, why)] in pool order."""
        out: dict[int, list[tuple[int, str]]] = {}
        for (i, j), why in sorted(self.blocked.items()):
            out.setdefault(i, []).append((j, why))
        return out


def _sellable(objects: Objects, observed: Observed, table: NodeTable, memo: Mapping[str, Any] | None = None,
              record: MutableMapping[str, Any] | None = None) -> np.ndarray:
    """``R_j``: the pool's priced resource on its usable nodes (or its spec.capacity) less what pods other than its
    kept replicas use there. With ``memo`` (the previous plan's phase records, :mod:`.reuse`), the per-pool sums over
    the kept replicas are the previous plan's when the running pods are the same lists (the observe phase reused
    them) on the same nodes and each pool has the same usable nodes and priced resource; ``record`` receives this
    plan's."""
    m = len(objects.pools)
    out = np.zeros(m)
    resources = [pool.spec.resource for pool in objects.pools]
    key = (table.names, resources, [array_key(pool.usable) for pool in objects.pools])
    before = recorded(memo, "sellable")
    if before is not None and before[0] is observed.running and before[1] == key:
        kept: list[float] = before[2]
    else:
        kept = _kept(objects, observed, table, resources)
    if record is not None:
        record["sellable"] = (observed.running, key, kept)
    for j, pool in enumerate(objects.pools):
        c = table.column.get(pool.spec.resource)
        if c is None or pool.usable.size == 0:
            continue
        alloc = float(table.alloc[pool.usable, c].sum())
        base = alloc if pool.spec.capacity is None else float(pool.spec.capacity)
        used = float(table.used[pool.usable, c].sum())
        out[j] = max(base - (used - kept[j]), 0.0)
    return out


def _kept(objects: Objects, observed: Observed, table: NodeTable, resources: list[str]) -> list[float]:
    """Per pool, the priced resource its kept replicas (running pods on its usable nodes) use."""
    m = len(objects.pools)
    index = table.index
    # One pass over the running pods: per pool, the priced resource its kept replicas use on its usable nodes
    # (summed in row order, then pod order, as a per-pool pass would).
    in_pool = np.zeros(len(table.names), dtype=np.int64) - 1
    for j, pool in enumerate(objects.pools):
        in_pool[pool.usable] = j
    usable_in = in_pool.tolist()
    kept = [0.0] * m
    for row in observed.running:
        for j, pods in enumerate(row):
            if not pods:
                continue
            resource = resources[j]
            for pod in pods:
                if pod.node is not None and usable_in[index[pod.node]] == j:
                    kept[j] += pod.requests.get(resource, 0.0)
    return kept


def _room(objects: Objects, table: NodeTable) -> np.ndarray:
    """Per pool, the priced resource free now on its usable nodes (within ``spec.capacity`` where set): what new pods
    of this plan can use (room that this plan's deletions free counts only once they are gone)."""
    out = np.zeros(len(objects.pools))
    for j, pool in enumerate(objects.pools):
        c = table.column.get(pool.spec.resource)
        if c is None or pool.usable.size == 0:
            continue
        free = float(np.maximum(table.alloc[pool.usable, c] - table.used[pool.usable, c], 0.0).sum())
        if pool.spec.capacity is not None:
            free = min(free, max(float(pool.spec.capacity) - float(table.used[pool.usable, c].sum()), 0.0))
        out[j] = free
    return out


def _hostable(objects: Objects, templates: list[JobTemplate], admitted: list[np.ndarray], table: NodeTable,
              walras_count: np.ndarray, memo: Mapping[str, Any] | None = None,
              record: MutableMapping[str, Any] | None = None) -> tuple[np.ndarray, dict[tuple[int, int], str]]:
    """``(n, m)``: how many more pods of job i pool j's nodes can take now (room on every resource and slots); and
    the (job, pool) pairs where no pod of the job can ever run, with why: ``NoEligibleNode`` (no usable node admits
    the template) or ``TooLarge`` (no admitted node's allocatable holds the pod's requests).

    Jobs with the same admitted mask and pod vector have the same answer in a pool: one evaluation per distinct
    (mask, vector) pair. With ``memo`` (the previous plan's phase records, :mod:`.reuse`): a job's pod vector is the
    previous plan's when its template and requested resources are the same objects (the translation memo's), its
    demand is equal and the resources are the same; the evaluations are the previous plan's when the node table
    (allocatable, requested), the Walras pods per node, and each pool's usable nodes, degree limit and priced resource
    are equal (an evaluation reads nothing else but its mask and vector, which are its key). ``record`` receives this
    plan's."""
    n, m = len(objects.jobs), len(objects.pools)
    out = np.zeros((n, m), dtype=np.int64)
    never: dict[tuple[int, int], str] = {}
    in_pool = np.array([info.pools for info in objects.jobs], dtype=bool).reshape(n, m)
    state = (table.resources, array_key(table.alloc), array_key(table.used), array_key(walras_count),
             [(array_key(p.usable), p.spec.degree_limit, p.spec.resource) for p in objects.pools])
    before = recorded(memo, "hostable")
    caches: list[dict[tuple[bytes, bytes], tuple[int, str | None]]] = (
        [dict(c) for c in before[1]] if before is not None and before[0] == state else [{} for _ in range(m)])
    known = before[2] if before is not None and before[0][0] == table.resources else {}
    # (job key, priced resource) -> (template, resources, demand, the pod vector's bytes), computed once
    vectors: dict[tuple[tuple[str, str], str], tuple[JobTemplate, Any, float, bytes]] = {}
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
            was = known.get((info.key, resource))
            if was is not None and was[0] is template and was[1] is spec.resources and was[2] == spec.demand:
                got = was
            else:
                got = (template, spec.resources, spec.demand,
                       table.vector(pod_vector(template, spec, resource, spec.demand)).tobytes())
            vectors[(info.key, resource)] = got
        by_row[(i, resource)] = got[3]
        return got[3]

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
            hit = cache.get(key)
            if hit is None:
                vec = np.frombuffer(key[1])
                ok = mask[nodes]
                why: str | None = None
                if not ok.any():
                    why = "NoEligibleNode"
                elif not np.any(np.all(alloc[ok] + 1e-9 >= vec, axis=1)):
                    why = "TooLarge"
                hit = cache[key] = (int(np.minimum(table.fit_count(vec, nodes), slots)[ok].sum()), why)
            out[i, j] = hit[0]
            if hit[1] is not None:
                never[(i, j)] = hit[1]
    if record is not None:
        record["hostable"] = (state, caches, vectors)
    return out, never


def replica_targets(shares: np.ndarray, replicas: np.ndarray, existing: np.ndarray,
                    elastic: np.ndarray, low: np.ndarray, fair_elastic: np.ndarray,
                    columns: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
                    dropped: np.ndarray | None = None) -> np.ndarray:
    """Integral replicas per job and pool from the market's fractional replicas ``shares = N_i x_ij``.

    The job's total is ``round(sum_j shares_ij)`` (at most ``N_i``), or what exists when that is already the floor or
    the ceiling of the sum (hysteresis: a total on a rounding boundary does not flip between plans). An elastic job
    below its minimum gets none (its pods are a gang), except in fair pools, where the fair mechanism decides and what
    exists stays. The row is split by largest remainder and then reconciled with what exists
    (:func:`.replicas.split_replicas`): existing pods are kept whenever the total allows. With ``columns`` =
    ``(demand per replica, free room per pool, running (n, m), offered (n, m))``, new replicas that rounding put in a
    pool beyond its free room move to another offered pool of the job, or are dropped (:func:`.replicas.fit_columns`;
    existing pods always stay; ``dropped`` counts the replicas that found no pool with room).
    """
    total_share = shares.sum(axis=1)
    have = existing.sum(axis=1)
    rounded = np.floor(total_share + 0.5).astype(np.int64)
    keep = (np.floor(total_share + 1e-6) <= have) & (have <= np.ceil(total_share - 1e-6)) & (have > 0)
    totals = np.minimum(replicas, np.where(keep, have, rounded))
    totals[fair_elastic] = np.minimum(replicas, np.maximum(totals, have))[fair_elastic]
    totals[elastic & (low > 0) & (totals < low) & ~fair_elastic] = 0
    weights = np.where((shares.sum(axis=1) > 0)[:, None], shares, existing.astype(np.float64))
    zero = (weights.sum(axis=1) <= 0) & (totals > 0)
    totals[zero] = 0  # nothing to split by (no share, nothing exists): no replicas
    target = largest_remainder_rows(weights, totals)
    for i in np.flatnonzero((have > 0) & (target != existing).any(axis=1)).tolist():
        target[i] = split_replicas(target[i], existing[i])
    if columns is not None:
        demand, room, running, offered = columns
        target = fit_columns(target, shares, demand, room, running, np.minimum(existing, target), offered, dropped)
    return target


def run_rounds(objects: Objects, observed: Observed, templates: list[JobTemplate], admitted: list[np.ndarray],
               table: NodeTable, previous: Plan | None, plan: Plan, warn: Warn, *, device: str, max_rounds: int,
               market_iterations: int, memo: Mapping[str, Any] | None = None,
               record: MutableMapping[str, Any] | None = None) -> Outcome:
    """Run the rounds described in the module docstring; return the last one. ``memo`` and ``record``: the previous
    plan's phase records and this plan's (:mod:`.reuse`; :func:`_hostable`, :func:`_sellable`, round 1's
    :func:`_market`)."""
    jobs = objects.jobs
    n, m = len(jobs), len(objects.pools)
    replicas = np.array([info.spec.replicas for info in jobs], dtype=np.int64)
    per_replica = np.array([info.spec.demand for info in jobs], dtype=np.float64)
    running = observed.counts("running").reshape(n, m)
    pending = observed.counts("pending").reshape(n, m)
    existing = running + pending
    hostable, never = _hostable(objects, templates, admitted, table, observed.walras_count, memo, record)
    cap = running + hostable
    A = np.zeros((n, m))
    for i, info in enumerate(jobs):
        for j in np.flatnonzero(info.pools).tolist():
            A[i, j] = info.spec.throughput[objects.pools[j].name]
    blocked: dict[tuple[int, int], str] = {}
    for i, j in zip(*np.nonzero((A > 0) & (cap == 0)), strict=True):
        blocked[(int(i), int(j))] = never.get((int(i), int(j)), "NoRoom")
    D = np.repeat((np.maximum(replicas, 1) * per_replica)[:, None], m, axis=1) if n else np.zeros((0, m))
    R = _sellable(objects, observed, table, memo, record)
    room = _room(objects, table)
    elastic = np.array([info.spec.elastic for info in jobs], dtype=bool)
    low = np.array([info.spec.min_replicas for info in jobs], dtype=np.int64)
    fair_pool = np.array([p.spec.policy == "fair" for p in objects.pools], dtype=bool)
    warm = None
    if previous is not None and m and all(p.name in previous.pools for p in objects.pools):
        warm = np.array([previous.pools[p.name].price for p in objects.pools])
    rounds = 0
    last_short = 1 << 62
    while True:
        rounds += 1
        A_eff = A.copy()
        for i, j in blocked:
            A_eff[i, j] = 0.0
        active = np.flatnonzero((replicas > 0) & (A_eff > 0).any(axis=1)) if n else np.zeros(0, dtype=np.int64)
        market = _market(A_eff[active], R, [jobs[i].spec.utility for i in active], [1.0] * active.size, D[active],
                         warm, device=device, max_iter=market_iterations, memo=memo if rounds == 1 else None,
                         record=record if rounds == 1 else None)
        X = np.zeros((n, m))
        X[active] = market.allocation
        fair_share = elastic[:, None] & fair_pool[None, :] & (A_eff > 0) & ((X > 1e-9) | (existing > 0))
        fair_elastic = fair_share.any(axis=1)
        dropped = np.zeros((n, m), dtype=np.int64)
        target = replica_targets(replicas[:, None] * X, replicas, existing, elastic, low, fair_elastic,
                                 (per_replica, room, running, A_eff > 0), dropped)
        work = NodeTable(table.nodes, table.names, table.index, table.resources, table.column, table.alloc,
                         table.used.copy(), table.usable)
        count = observed.walras_count.copy()
        batches = []
        short = np.zeros((n, m), dtype=np.int64)
        reasons: dict[tuple[int, int], str] = {}
        wants = target - running
        granted_all = fair_elastic[:, None] & fair_share
        for j, pool in enumerate(objects.pools):
            rows: list[int] = []
            optional: list[bool] = []
            pods: list[Pod | None] = []
            # Only rows that want pods here or may be granted some contribute to the batch.
            candidates = np.flatnonzero((wants[:, j] > 0) | granted_all[:, j]).tolist() if n else []
            want_j = wants[:, j].tolist() if n else []
            for i in candidates:
                want = int(want_j[i])
                for q, pod in enumerate(observed.pending[i][j]):
                    if q < want:
                        rows.append(i)
                        optional.append(False)
                        pods.append(pod)
                new = max(want - len(observed.pending[i][j]), 0)
                offer = 0
                granted = bool(granted_all[i, j])
                if granted:  # the fair mechanism decides how many of an elastic job's new pods it takes (002)
                    offer = _offer(replicas[i] - int(target[i].sum()), fair_share[i], X[i], existing[i], j)
                rows.extend([i] * (new + offer))
                optional.extend([granted] * new + [True] * offer)
                pods.extend([None] * (new + offer))
            batch = Batch(j, rows, optional)
            placed = place_batch(batch, pool, jobs, templates, A_eff, admitted, work, count, plan.pools[pool.name],
                                 previous, warn, memoise=True)
            batches.append((batch, placed, pods))
            for q, (i, k) in enumerate(zip(rows, placed.node.tolist(), strict=True)):
                if k < 0 and not optional[q]:
                    short[i, j] += 1
                    reasons[(i, j)] = placed.why[q] or reasons.get((i, j), "")
        below_min = _gang(objects, templates, batches, running, work, count)
        if not short.any() or rounds >= max_rounds or short.sum() >= last_short:
            break  # realised, out of rounds, or the feedback no longer helps
        last_short = int(short.sum())
        # Feed back what placement could not realise, and re-price from the last prices.
        warm = market.prices
        for i, j in zip(*np.nonzero(short), strict=True):
            i, j = int(i), int(j)
            placed_here = int(target[i, j] - short[i, j] - running[i, j])
            if placed_here <= 0 and running[i, j] == 0:
                blocked[(i, j)] = reasons.get((i, j)) or "NoRoom"
            R[j] = max(R[j] - short[i, j] * per_replica[i], 0.0)
    outcome = Outcome(market, X, A_eff, A > 0, D, R, target, batches, work, count, rounds, blocked, below_min,
                      dropped)
    _report_market(plan, objects, market)
    return outcome


def _gang(objects: Objects, templates: list[JobTemplate], batches: list[tuple[Batch, Placed, list[Pod | None]]],
          running: np.ndarray, table: NodeTable, count: np.ndarray) -> dict[int, int]:
    """An elastic job whose replicas (running and placed) stay below ``spec.replicas.min`` gets no new pod: it could
    not run with fewer (its pods are a gang). Its new pods are unplaced again and their room given back. Returns the
    rows concerned with the replicas they would have had."""
    placed = running.sum(axis=1).astype(np.int64)
    for batch, result, _ in batches:
        for q, row in enumerate(batch.rows):
            if result.node[q] >= 0:
                placed[row] += 1
    out: dict[int, int] = {}
    for row, info in enumerate(objects.jobs):
        if info.spec.elastic and 0 < placed[row] < info.spec.min_replicas:
            out[row] = int(placed[row])
    if not out:
        return out
    for batch, result, pods in batches:
        priced = objects.pools[batch.pool].spec.resource
        for q, row in enumerate(batch.rows):
            k = int(result.node[q])
            if row in out and k >= 0 and pods[q] is None:
                spec = objects.jobs[row].spec
                table.used[k] -= table.vector(pod_vector(templates[row], spec, priced, float(result.amount[q])))
                count[k] -= 1
                result.node[q] = -1
                result.amount[q] = 0.0
                batch.optional[q] = True  # withdrawn, not unplaceable
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


def _report_market(plan: Plan, objects: Objects, market: MarketResult) -> None:
    first = objects.pools[0].name if objects.pools else ""
    if market.repaired > 1e-6:
        plan.events.append(PlanEvent(
            "ResourcePool", "", first, "Warning", "MarketInfeasible",
            f"The price solver's allocation broke a capacity by {market.repaired:.3g}; it was scaled back to fit."))
    if not market.converged:
        plan.events.append(PlanEvent(
            "ResourcePool", "", first, "Warning", "SolverNotConverged",
            f"Price discovery stopped after {market.iterations} evaluations with a duality gap of {market.gap:.4g}."))


def _market(throughput: np.ndarray, capacity: np.ndarray, specs: list[UtilitySpec], weights: Sequence[float],
            demand: np.ndarray, warm: np.ndarray | None, *, device: str, max_iter: int,
            memo: Mapping[str, Any] | None = None, record: MutableMapping[str, Any] | None = None) -> MarketResult:
    """The market of one round (004, Alg. 2): :func:`.market.solve_market` of these arguments. With ``memo`` (the
    previous plan's phase records, :mod:`.reuse`), the previous plan's result when every argument is equal (the
    throughput, capacity and demand arrays and the warm prices by their bytes, a cold start only after a cold start;
    the utility specs, the weights, the device and the evaluation bound), which the solve reads and nothing else: a
    copy sharing its arrays, with 0 seconds and ``reused`` set (no solve ran in this plan). ``record`` receives this
    plan's arguments and result, whose arrays are then read-only (shared with the next plan). The planner passes both
    in round 1 only: later rounds re-price a capacity that placement feedback lowered."""
    key = (array_key(throughput), array_key(capacity), array_key(demand), None if warm is None else array_key(warm),
           tuple(weights), device, max_iter)
    before = recorded(memo, "market")
    if before is not None and before[0] == key and (same_items(before[1], specs) or before[1] == specs):
        market: MarketResult = replace(before[2], seconds=0.0, reused=True)
    else:
        market = solve_market(throughput, capacity, specs, weights, demand, warm, device=device, max_iter=max_iter)
    if record is not None:
        for array in (market.prices, market.allocation, market.throughputs):
            frozen(array)
        record["market"] = (key, specs, market)
    return market
