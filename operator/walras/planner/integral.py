"""Phase *integral fill*: after placement, whole replicas on real nodes up to what fits (issue 33).

The market (004, Alg. 2) prices time fractions; replica rounding (:mod:`.replicas`) and the pools' policies
(:mod:`.placement`) realise its split. What rounding cannot see is left idle: a pool with free GPUs while a job that
may use it has replicas to spare (the collapse at overload, where every job's share rounds to 0 pods, is the extreme
case). This phase gives that room away by the market's own objective: it builds the fill problem of
:mod:`allocator.integral` from the round's reservations (each node's free vector on every resource, its degree slots,
each pool's ``spec.capacity`` budget, each job's pod vector per pool and admitted nodes) and adds the replicas that
problem's route table chooses (exact MILP on small instances, with a certified gap; the price-guided greedy search
beyond), each with exactly its ``demand`` of the priced resource on one node that has room for its whole request.
Where the exact route is small enough, it also re-arranges every new replica that the policies of :data:`REARRANGED`
pools placed, and its plan replaces theirs when it is better (:func:`_redo`). In a colocation pool the fill's replicas
are then arranged on the pool's nodes by its interference model (:mod:`.arrange`), the counts unchanged.

Which jobs take part (a job's own rule forbids the rest): jobs in the market with replicas left (``spec.replicas``
minus what runs, is pending or was placed), not an elastic job below its gang minimum, not an elastic job that a fair
pool's mechanism sizes (PS-DSF / PF-VDS decide those, 002), offered every pool whose throughput is positive (a pool
that a placement failure withdrew from the market is offered again: the fill checks every node itself). A fill
replica of a job whose wanted replica found no node replaces that one (the job's total stays within its replicas).
A gang job (``spec.replicas.gang``) takes part as one bundle: all of its replicas left, in one pool (the pool it runs
in, where it runs), or none (``allocator.integral``'s gang rows; :mod:`.gang`).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

import numpy as np

from allocator.integral import KINDS as UTILITY_KINDS
from allocator.integral import (
    LOCAL_CELLS,
    FillProblem,
    FillResult,
    Utility,
    solve_fill,
    utility_value,
)
from walras.planner.arrange import colocation_nodes
from walras.planner.capacity import NodeTable
from walras.planner.cluster import Pod, pod_vector
from walras.planner.placement import capacity_left, why_not
from walras.planner.policies import UNLIMITED
from walras.planner.replicas import whole_gangs
from walras.planner.results import Batch, IntegralReport, Placed, PlanContext, Reservations
from walras.planner.spec import UtilitySpec

__all__ = ["IntegralReport", "fill_plan", "gang_targets", "idle_while_priced", "placed_rows", "valued", "withdraw",
           "withdraw_gangs"]


def _still_waiting(ctx: PlanContext, inputs: FillInputs, work: Reservations, placed: np.ndarray, left: np.ndarray,
                   waiting: np.ndarray, unmet: list[list[tuple[int, int]]],
                   dropped: np.ndarray) -> list[list[tuple[int, int, str]]]:
    """Per pool, ``(row, count, why)`` for the replicas a job taking part still asks for (``spec.replicas``) with a
    positive marginal utility that no node can take after the fill, not yet reported as unplaced: they are wanted
    and unplaced, in the pool the market gave the job most of (else its best pool; pools withdrawn from it, which
    its status reports already, are left out), with why no node takes one
    there (:func:`.placement.why_not`: degree limit, fragmentation, capacity). The market sells only what can be
    placed (:func:`.rounds._placeable`), so a job it could not sell to says here why it waits."""
    objects, table = ctx.objects, work.table
    m = placed.shape[1]
    out: list[list[tuple[int, int, str]]] = [[] for _ in range(m)]
    rest = inputs.replicas - placed.sum(axis=1) - waiting - np.array([len(u) for u in unmet]) - dropped.sum(axis=1)
    rest = np.where(left > 0, rest, 0)
    rows = np.flatnonzero(rest > 0)
    if rows.size == 0:
        return out
    u = utility_arrays([objects.jobs[i].spec.utility for i in rows.tolist()])
    N = np.maximum(inputs.replicas[rows], 1).astype(np.float64)
    t = np.einsum("ij,ij->i", inputs.throughput[rows], placed[rows]) / N
    for q, i in enumerate(rows.tolist()):
        offered = np.array([j for j in np.flatnonzero(inputs.offered[i]).tolist() if (i, j) not in inputs.blocked],
                           dtype=np.int64)
        if offered.size == 0:  # withdrawn from every pool it may use: its status names the pools and why
            continue
        share = inputs.share[i, offered]
        j = int(offered[int(np.argmax(share))]) if share.max() > 0 else int(
            offered[int(np.argmax(inputs.throughput[i, offered]))])
        t1 = float(inputs.throughput[i, offered].min() / N[q])
        count = valued(u, q, float(t[q]), float(inputs.throughput[i, j] / N[q]), int(rest[i]), t1)
        if count == 0:
            continue  # no replica left adds to its utility: not waiting (its status says NoMarginalUtility)
        pool = objects.pools[j]
        job = objects.jobs[i].spec
        if capacity_left(pool, table) + 1e-9 < job.demand:
            continue  # spec.capacity sold out: the market grants nothing there (the status says PoolCapacity)
        vec = table.vector(pod_vector(ctx.templates[i], job, pool.spec.resource, job.demand))
        out[j].append((i, count, why_not(table, pool.usable, ctx.admitted[i], work.count,
                                                 pool.spec.degree_limit, vec)))
    return out


def valued(u: Utility, q: int, t: float, step: float, count: int, t1: float) -> int:
    """Of ``count`` more replicas of row ``q`` of ``u``, each adding ``step`` to its throughput ``t``, how many
    (from the first) raise its utility (:func:`allocator.integral.utility_value`) by more than ``1e-12``: the fill's
    test of a replica worth placing. A concave utility's gains fall, so the valued ones are a prefix."""
    now = utility_value(u, q, t, t1)
    for k in range(count):
        after = utility_value(u, q, t + (k + 1) * step, t1)
        if not after - now > 1e-12:
            return k
        now = after
    return count


def _rescue(ctx: PlanContext, batches: list[tuple[Batch, Placed, list]], work: Reservations,
            placed: np.ndarray) -> np.ndarray:
    """Place the wanted pending pods the pool's policy left without a node before any new replica: on the node the
    previous plan gave the pod when it still fits there (so a pending pod keeps its binding from plan to plan), else
    on the admitting node of its pool with room for its whole request where it leaves the least of the priced
    resource free, within the degree limit. Reserves them in ``work``; returns per row how many were placed (and
    adds them to ``placed``)."""
    objects, table = ctx.objects, work.table
    n = placed.shape[0]
    out = np.zeros(n, dtype=np.int64)
    before = {pod.name: pod.node for pod in ctx.previous.pods} if ctx.previous is not None else {}
    for batch, result, pods in batches:
        pool = objects.pools[batch.pool]
        spec = pool.spec
        c = table.column.get(spec.resource)
        for q, row in enumerate(batch.rows):
            pod = pods[q]
            if result.node[q] >= 0 or batch.optional[q] or pod is None or c is None:
                continue
            job = objects.jobs[row].spec
            vec = table.vector(pod_vector(ctx.templates[row], job, spec.resource, job.demand))
            nodes = pool.usable[ctx.admitted[row][pool.usable]]
            if spec.degree_limit is not None:
                nodes = nodes[work.count[nodes] < spec.degree_limit]
            nodes = nodes[table.fits_many(nodes, vec)] if nodes.size else nodes
            if nodes.size == 0 or capacity_left(pool, table) + 1e-9 < vec[c]:
                continue  # no node, or the pool's spec.capacity is sold out
            was = table.index.get(before.get(pod.name) or "", -1)
            k = was if was in set(nodes.tolist()) else int(nodes[int(np.argmin(table.free[nodes, c]))])
            table.add(k, vec)
            work.count[k] += 1
            result.node[q] = k
            result.amount[q] = job.demand
            result.why[q] = ""
            placed[row, batch.pool] += 1
            out[row] += 1
    return out


def utility_arrays(specs: list[UtilitySpec]) -> Utility:
    """The :class:`allocator.integral.Utility` of the jobs' utility specs (004 Sec. 2.2)."""
    kind = np.array([UTILITY_KINDS.index(s.type) for s in specs], dtype=np.int64)
    param = np.array([(s.exponent if s.type == "power" else s.alpha if s.type == "alpha-fair"
                       else s.target if s.type == "target-priority" else 0.0) or 0.0 for s in specs])
    return Utility(kind, np.array([s.weight for s in specs], dtype=np.float64), param)


@dataclass(frozen=True)
class FillInputs:
    """Per job row: spec.replicas, whether the row takes part, the (n, m) pools it is offered, throughput and the
    market's allocation X."""

    replicas: np.ndarray
    allowed: np.ndarray
    offered: np.ndarray
    throughput: np.ndarray
    share: np.ndarray
    #: (row, pool) pairs the rounds withdrew from the market (the job's status says why already)
    blocked: frozenset[tuple[int, int]] = frozenset()


def fill_plan(ctx: PlanContext, inputs: FillInputs, target: np.ndarray, dropped: np.ndarray,
              batches: list[tuple[Batch, Placed, list]], work: Reservations, running: np.ndarray) -> IntegralReport:
    """Add the fill's replicas (module docstring) to ``batches`` (new entries, placed) and ``target``, reserving
    them in ``work``; a replaced wanted replica is withdrawn from its batch (``optional``) or from ``dropped``, and
    from ``target``; what a job still asks for and no node takes is added as wanted and unplaced, with why
    (:func:`_still_waiting`). Returns the report."""
    n, m = target.shape
    if n == 0 or m == 0:
        return IntegralReport()
    placed = running.astype(np.int64).copy()
    unmet: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # (batch index, q) of wanted new pods with no node
    waiting = np.zeros(n, dtype=np.int64)  # wanted pending pods with no node
    for b, (batch, proposal, pods) in enumerate(batches):
        nodes = proposal.node.tolist()
        for q, row in enumerate(batch.rows):
            if nodes[q] >= 0:
                placed[row, batch.pool] += 1
            elif not batch.optional[q]:
                if pods[q] is None:
                    unmet[row].append((b, q))
                else:
                    waiting[row] += 1
    if waiting.any():
        waiting -= _rescue(ctx, batches, work, placed)
    left = np.maximum(inputs.replicas - placed.sum(axis=1) - waiting, 0)
    left[~inputs.allowed] = 0
    built = _problem(ctx, inputs, work, placed, left)
    report = IntegralReport()
    added: list[list[int]] = [[] for _ in range(m)]
    result = solve_fill(built[0]) if built is not None else None
    redo = _redo(ctx, inputs, work, batches, placed, waiting, built, result)
    if redo is not None:  # the exact route over every new replica beats the policies' arrangement plus the fill
        fresh, used, count, built, result = redo
        for b, q, row, j in fresh:
            batches[b][1].node[q] = -1
            batches[b][1].amount[q] = 0.0
            batches[b][0].optional[q] = True  # withdrawn: the exact plan places the row's replicas
            target[row, j] -= 1
            placed[row, j] -= 1
        work.table.used[:] = used
        work.count[:] = count
        for i in built[1].tolist():
            for b, u in unmet[i]:
                batches[b][0].optional[u] = True
                target[i, batches[b][0].pool] -= 1
            unmet[i] = []
            dropped[i] = 0
    if built is not None and result is not None:
        problem, rows, node_ids = built
        placed[rows] = result.counts
        table = work.table
        arranged = colocation_nodes(ctx, work, batches, problem, rows, node_ids, result).tolist()
        for q, j, node in zip(result.row.tolist(), result.pool.tolist(), arranged, strict=True):
            i = int(rows[q])
            table.add(node, problem.vectors[q, j])
            work.count[node] += 1
            target[i, j] += 1
            if unmet[i]:  # this replica stands in for a wanted one that found no node
                b, u = unmet[i].pop()
                batches[b][0].optional[u] = True
                target[i, batches[b][0].pool] -= 1
            elif dropped[i].any():
                dropped[i, int(np.flatnonzero(dropped[i])[0])] -= 1
            added[j] += [i, node]
        report = IntegralReport(result.route, int(result.row.size), result.value, result.bound, result.gap,
                                result.seconds)
    waits = _still_waiting(ctx, inputs, work, placed, left, waiting, unmet, dropped)
    for b in range(len(batches)):
        _append(ctx, batches, b, added[batches[b][0].pool], waits[batches[b][0].pool], target)
    return report


#: Pool policies whose new replicas the exact route may re-arrange (they optimise the priced resource alone);
#: colocation (interference) and fair (002's mechanisms) pools keep their policy's arrangement.
REARRANGED = frozenset({"utility", "throughput", "spread", "fair"})


def _redo(ctx: PlanContext, inputs: FillInputs, work: Reservations, batches: list[tuple[Batch, Placed, list]],
          placed: np.ndarray, waiting: np.ndarray, built: tuple[FillProblem, np.ndarray, np.ndarray] | None,
          result: FillResult | None) -> tuple[list[tuple[int, int, int, int]], np.ndarray, np.ndarray,
                                              tuple[FillProblem, np.ndarray, np.ndarray], FillResult] | None:
    """The exact route over every new replica (not only the fill's): the new pods the policies of
    :data:`REARRANGED` pools placed for rows taking part (jobs without a utility curve) are taken back, and the
    MILP of :func:`allocator.integral.fill_exact` decides all of them where it is small enough
    (:data:`allocator.integral.EXACT_CELLS`). Returned (the pods taken back as (batch, q, row, pool), the node
    table's ``used`` and the Walras pod counts without them, the problem and its result) only when its plan is
    better than the policies' plus the fill's on the rows it covers, or as good with fewer new replicas; else None."""
    objects, table = ctx.objects, work.table
    # (row, node) pairs the MILP could have: far above its cells' bound, the re-arrangement is not tried (a large
    # cluster's plan does not pay for building a problem the exact route will not take)
    sizes = np.array([p.usable.size for p in objects.pools], dtype=np.int64)
    if int((inputs.offered[inputs.allowed] @ sizes).sum()) > LOCAL_CELLS:
        return None
    fresh: list[tuple[int, int, int, int]] = []
    used, count = table.used.copy(), work.count.copy()
    for b, (batch, got, pods) in enumerate(batches):
        pool = objects.pools[batch.pool]
        if pool.spec.policy not in REARRANGED:
            continue
        for q, row in enumerate(batch.rows):
            k = int(got.node[q])
            job = objects.jobs[row].spec
            if k < 0 or pods[q] is not None or not inputs.allowed[row] or job.curve is not None:
                continue
            used[k] -= table.vector(pod_vector(ctx.templates[row], job, pool.spec.resource, float(got.amount[q])))
            count[k] -= 1
            fresh.append((b, q, row, batch.pool))
    if not fresh:
        return None
    before = placed.copy()
    for _, _, row, j in fresh:
        before[row, j] -= 1
    left = np.maximum(inputs.replicas - before.sum(axis=1) - waiting, 0)
    left[~inputs.allowed] = 0
    free = Reservations(NodeTable(table.nodes, table.names, table.index, table.resources, table.column, table.alloc,
                                  used, table.usable, table.masks, table.labels), count)
    again = _problem(ctx, inputs, free, before, left)
    if again is None:
        return None
    exact = solve_fill(again[0])
    now = placed.copy()
    if built is not None and result is not None:
        now[built[1]] = result.counts
    value = again[0].value(now[again[1]])
    tol = 1e-9 * max(1.0, abs(value))
    # Ties go to fewer new replicas, as in the MILP's objective (:data:`allocator.integral.TIE_COST`): a replica
    # that rounding placed but that adds nothing to its job's utility is not created, so the plan of the applied
    # plan (where the rows' replicas exist and nothing is left to re-arrange) is the same plan.
    new_now = len(fresh) + (int(result.row.size) if result is not None else 0)
    if exact.value > value + tol or (exact.value >= value - tol and int(exact.row.size) < new_now):
        return fresh, used, count, again, exact
    return None


def _problem(ctx: PlanContext, inputs: FillInputs, work: Reservations, placed: np.ndarray,
             left: np.ndarray) -> tuple[FillProblem, np.ndarray, np.ndarray] | None:
    """The fill problem of the rows with replicas left that may fit somewhere, with its rows and the global index
    of each of its nodes; None when there is nothing to fill."""
    objects, table = ctx.objects, work.table
    m = placed.shape[1]
    rows = np.flatnonzero((left > 0) & inputs.offered.any(axis=1))
    pools = objects.pools
    if rows.size == 0:
        return None
    # the nodes of the pools, compacted
    node_ids = np.concatenate([p.usable for p in pools])
    pool_of = np.concatenate([np.full(p.usable.size, j, dtype=np.int64) for j, p in enumerate(pools)])
    if node_ids.size == 0:
        return None
    free = np.maximum(table.free[node_ids], 0.0)
    slots = np.full(node_ids.size, UNLIMITED, dtype=np.int64)
    budget = np.full(m, np.inf)
    priced = np.zeros(m, dtype=np.int64)
    for j, pool in enumerate(pools):
        at = pool_of == j
        if pool.spec.degree_limit is not None:
            slots[at] = np.maximum(pool.spec.degree_limit - work.count[node_ids[at]], 0)
        c = table.column.get(pool.spec.resource)
        if c is None:
            slots[at] = 0
            continue
        priced[j] = c
        if pool.spec.capacity is not None:
            budget[j] = max(capacity_left(pool, table), 0.0)
    jobs, templates = objects.jobs, ctx.templates
    # A quick necessary condition (free room only shrinks): a row whose demand exceeds the most free priced resource
    # on any node of each pool it is offered, with a slot, takes no replica; such rows are left out of the problem.
    top = np.zeros(m)
    for j in range(m):
        at = (pool_of == j) & (slots > 0)
        if at.any():
            top[j] = free[at, priced[j]].max()
    demand = np.array([jobs[i].spec.demand for i in rows.tolist()])
    could = inputs.offered[rows] & (demand[:, None] <= top[None, :] + 1e-9)
    rows = rows[could.any(axis=1)]
    if rows.size == 0:
        return None
    vectors = np.zeros((rows.size, m, len(table.resources)))
    mask_index: dict[int, int] = {}
    masks: list[np.ndarray] = []
    mask_of = np.zeros(rows.size, dtype=np.int64)
    for q, i in enumerate(rows.tolist()):
        spec = jobs[i].spec
        for j in np.flatnonzero(inputs.offered[i]).tolist():
            vectors[q, j] = table.vector(pod_vector(templates[i], spec, pools[j].spec.resource, spec.demand))
        mask = ctx.admitted[i]
        g = mask_index.get(id(mask))
        if g is None:
            g = mask_index[id(mask)] = len(masks)
            masks.append(mask[node_ids])
        mask_of[q] = g
    problem = FillProblem(
        throughput=inputs.throughput[rows], replicas=inputs.replicas[rows].astype(np.float64), have=placed[rows],
        left=left[rows], utility=utility_arrays([jobs[i].spec.utility for i in rows.tolist()]), vectors=vectors,
        priced=priced, free=free, slots=slots, pool=pool_of, masks=np.array(masks, dtype=bool), mask_of=mask_of,
        offered=inputs.offered[rows], budget=budget,
        gang=np.array([jobs[i].spec.gang for i in rows.tolist()], dtype=bool))  # all or none (docs/gangs.md)
    return problem, rows, node_ids


def _append(ctx: PlanContext, batches: list[tuple[Batch, Placed, list]], b: int, extra: list[int],
            wait: list[tuple[int, int, str]], target: np.ndarray) -> None:
    """Batch b with the fill's replicas of its pool (``extra``: row, node pairs; placed) and the replicas still
    waiting there (``wait``: unplaced, with why; added to ``target``)."""
    if not extra and not wait:
        return
    batch, got, pods = batches[b]
    jobs = ctx.objects.jobs
    new_rows, new_nodes = extra[0::2], extra[1::2]
    amounts = [jobs[i].spec.demand for i in new_rows]
    batch.rows.extend(new_rows)
    batch.optional.extend([False] * len(new_rows))
    pods.extend([None] * len(new_rows))
    why = [*got.why, *([""] * len(new_rows))]
    for i, count, reason in wait:
        target[i, batch.pool] += count
        batch.rows.extend([i] * count)
        batch.optional.extend([False] * count)
        pods.extend([None] * count)
        why.extend([reason] * count)
    unplaced = sum(count for _, count, _ in wait)
    node = np.concatenate([got.node, np.array(new_nodes, dtype=np.int64), np.full(unplaced, -1, dtype=np.int64)])
    amount = np.concatenate([got.amount, np.array(amounts, dtype=np.float64), np.zeros(unplaced)])
    batches[b] = (batch, Placed(node, amount, why, got.conditions), pods)


def idle_while_priced(ctx: PlanContext, inputs: FillInputs, batches: list[tuple[Batch, Placed, list]],
                      work: Reservations, running: np.ndarray, prices: np.ndarray) -> dict[str, str]:
    """Per pool name, a message where the pool is priced (``p_j > 0``) while a job offered it has a replica left
    whose pod fits a node there now and adds to its utility (:func:`valued`, the fill's own test), after the fill
    (so only a job the fill leaves out by its own rule: a gang below
    its minimum, an elastic job a fair pool sizes): a positive price with placeable idle capacity is a defect the
    plan reports (issue 33), naming the jobs and the rule that keeps them out."""
    objects, table = ctx.objects, work.table
    n, m = running.shape
    if n == 0 or m == 0:
        return {}
    placed = running.sum(axis=1).astype(np.int64)
    for batch, got, _ in batches:
        for row, k in zip(batch.rows, got.node.tolist(), strict=True):
            if k >= 0:
                placed[row] += 1
    have = running.astype(np.float64)  # per row and pool: running or placed now, for the next pod's value
    for batch, got, _ in batches:
        for row, k in zip(batch.rows, got.node.tolist(), strict=True):
            if k >= 0:
                have[row, batch.pool] += 1
    u = utility_arrays([info.spec.utility for info in objects.jobs])
    N = np.maximum(inputs.replicas, 1).astype(np.float64)
    t = np.einsum("ij,ij->i", inputs.throughput, have) / N
    out: dict[str, str] = {}
    for j, pool in enumerate(objects.pools):
        if not prices[j] > 1e-9 or pool.usable.size == 0:
            continue
        waiting: list[str] = []
        for i in np.flatnonzero(inputs.offered[:, j] & (placed < inputs.replicas)).tolist():
            job = objects.jobs[i].spec
            a = inputs.throughput[i]
            if valued(u, i, float(t[i]), float(a[j] / N[i]), 1, float(a[a > 0].min() / N[i])) == 0:
                continue  # its next pod adds nothing to its utility: not a pod the pool leaves idle
            nodes = pool.usable[ctx.admitted[i][pool.usable]]
            if pool.spec.degree_limit is not None:
                nodes = nodes[work.count[nodes] < pool.spec.degree_limit]
            vec = table.vector(pod_vector(ctx.templates[i], job, pool.spec.resource, job.demand))
            if capacity_left(pool, table) + 1e-9 < job.demand:
                continue  # spec.capacity sold out: nothing idle to sell
            if nodes.size and table.fits_many(nodes, vec).any():
                rule = "below its gang minimum" if job.elastic and job.min_replicas > 1 else (
                    "sized by the fair mechanism" if job.elastic else "left out")
                waiting.append(f"{job.namespace}/{job.name} ({rule})")
        if waiting:
            out[pool.name] = (f"priced {prices[j]:.4g} while a replica of {', '.join(waiting[:5])}"
                              f"{' and others' if len(waiting) > 5 else ''} fits a node of the pool")
    return out


# --- gang jobs (walras.planner.gang: the rule, all or none in one pool) ------------------------------------------


def _gang_rows(ctx: PlanContext) -> np.ndarray:
    return np.array([info.spec.gang for info in ctx.objects.jobs], dtype=bool)


def gang_targets(ctx: PlanContext, target: np.ndarray, existing: np.ndarray, throughput: np.ndarray,
                 prices: np.ndarray, capable: np.ndarray, dropped: np.ndarray | None = None) -> np.ndarray:
    """The round's replica targets with each gang all or none in one pool (:mod:`.gang`, rule 1):
    ``throughput`` the (n, m) ``a_ij`` the market saw (0 where not offered), ``prices`` the market's ``p``,
    ``capable[i, j]`` how many of job i's pods pool j can hold (running plus placeable now). The surplus is
    ``u_i(a_ij) - p_j N_i d_i - u_i(0)`` (``u_i(0)`` the starved value of :mod:`allocator.integral`). A gang's
    row of ``dropped`` (replicas rounding took out of a pool without room) is cleared: its target says it all."""
    gang = _gang_rows(ctx)
    if not gang.any():
        return target
    jobs = ctx.objects.jobs
    n, m = target.shape
    rows = np.flatnonzero(gang)
    replicas = np.array([info.spec.replicas for info in jobs], dtype=np.int64)
    surplus = np.full((n, m), -np.inf)
    u = utility_arrays([jobs[i].spec.utility for i in rows.tolist()])
    for q, i in enumerate(rows.tolist()):
        a = throughput[i]
        if not (a > 0).any() or replicas[i] <= 0:
            continue
        t1 = float(a[a > 0].min()) / replicas[i]
        none = utility_value(u, q, 0.0, t1)
        cost = prices * replicas[i] * jobs[i].spec.demand if prices.size == m else np.zeros(m)
        for j in np.flatnonzero(a > 0).tolist():
            surplus[i, j] = utility_value(u, q, float(a[j]), t1) - float(cost[j]) - none
    ok = (capable >= replicas[:, None]) & (throughput > 0)
    if dropped is not None:
        dropped[gang] = 0
    return whole_gangs(target, gang, replicas, existing, surplus, ok)


def placed_rows(batches: list[tuple[Batch, Placed, list[Pod | None]]], running: np.ndarray) -> np.ndarray:
    """Per job row, the replicas that run (``running``, per row and pool) or were placed in this round."""
    out = running.sum(axis=1).astype(np.int64)
    for batch, result, _ in batches:
        for row, k in zip(batch.rows, result.node.tolist(), strict=True):
            if k >= 0:
                out[row] += 1
    return out


def withdraw(ctx: PlanContext, batches: list[tuple[Batch, Placed, list[Pod | None]]], rows: Container[int],
             work: Reservations, target: np.ndarray | None = None) -> None:
    """Unplace this round's new pods of the job ``rows`` (pods that do not exist yet): their room in ``work`` is given
    back and they are marked optional (withdrawn, not unplaceable), and each leaves ``target`` (when given: the
    round's replica targets, so a withdrawn replica is no longer counted granted). The one withdrawal of a job that
    cannot run with the replicas it got: a gang below N (:func:`withdraw_gangs`) and an elastic job below its minimum
    (the rounds)."""
    objects, templates = ctx.objects, ctx.templates
    for batch, result, pods in batches:
        priced = objects.pools[batch.pool].spec.resource
        for q, row in enumerate(batch.rows):
            k = int(result.node[q])
            if row in rows and k >= 0 and pods[q] is None:
                spec = objects.jobs[row].spec
                work.table.used[k] -= work.table.vector(pod_vector(templates[row], spec, priced,
                                                                   float(result.amount[q])))
                work.count[k] -= 1
                result.node[q] = -1
                result.amount[q] = 0.0
                batch.optional[q] = True
                if target is not None:
                    target[row, batch.pool] -= 1


def withdraw_gangs(ctx: PlanContext, batches: list[tuple[Batch, Placed, list[Pod | None]]], running: np.ndarray,
                   work: Reservations, target: np.ndarray) -> dict[int, int]:
    """Rule 2 of :mod:`.gang`: a gang row with ``0 < k < N`` replicas running or placed in this round gets
    none of its new pods (:func:`withdraw`), and they leave its row of ``target`` (the round's replica targets): the
    integral fill then counts the gang's replicas left from what remains (it may place the whole gang, or its
    still-waiting replicas are added back as wanted and unplaced, with why), so no row's target plus what rounding
    dropped exceeds ``spec.replicas`` (a gang once read "granted 5 of 4"). Returns the rows concerned with the
    replicas they had (k)."""
    gang = _gang_rows(ctx)
    if not gang.any():
        return {}
    placed = placed_rows(batches, running)
    out = {row: int(placed[row]) for row in np.flatnonzero(gang).tolist()
           if 0 < placed[row] < ctx.objects.jobs[row].spec.replicas}
    withdraw(ctx, batches, out, work, target)
    return out
