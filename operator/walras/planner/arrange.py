"""The integral fill's replicas in a colocation pool, arranged by the pool's interference model (issue 33).

The fill (:mod:`.integral`, :mod:`allocator.integral`) chooses how many replicas each job adds to each pool and puts
each one on a node best fit; its objective, the market's ``sum_i u_i``, does not depend on which node of a pool holds a
replica. A colocation pool (``spec.policy: colocation``) also has the side-effects cost of paper 001 (eq. (1), convex
``f`` of Sec. 7 by its ColocationProfile): where a replica runs changes how much it and its neighbours slow down. So,
as the pool's policy decides the node-level arrangement of the pods it places, the fill's replicas there are
re-arranged to lower that cost: HILL's best-improvement moves (001 Sec. 8.1.1) over the pool's usable nodes, the
pods already on them (running, and placed by the policy in this plan) fixed, each move within the node's free room on
every resource, its degree limit and the replica's admitted nodes (:func:`allocator.colocation.rearrange`). The
arrangement starts at the fill's own, which fits, so every replica the fill placed stays placed and the pool's cost
never rises; the counts per job and pool (the fill's plan and its certificate) are unchanged.
"""

from __future__ import annotations

import numpy as np

from allocator.integral import FillProblem, FillResult
from walras.planner.policies import UNLIMITED, colocation_cost
from walras.planner.results import Batch, Placed, PlanContext, PoolInfo, Reservations

__all__ = ["colocation_nodes"]


def colocation_nodes(ctx: PlanContext, work: Reservations, batches: list[tuple[Batch, Placed, list]],
                     problem: FillProblem, rows: np.ndarray, node_ids: np.ndarray, result: FillResult) -> np.ndarray:
    """The node (index into the plan's node table) of every replica of ``result``, the fill's solution of
    ``problem`` (problem row ``q`` is job row ``rows[q]``; ``result.node`` indexes ``node_ids``): the fill's node,
    except in colocation pools, where the pool's replicas are re-arranged by the module docstring's rule. ``work``
    holds every reservation but the fill's."""
    nodes = node_ids[result.node].astype(np.int64) if result.node.size else np.zeros(0, dtype=np.int64)
    for j, pool in enumerate(ctx.objects.pools):
        mine = np.flatnonzero(result.pool == j)
        if mine.size and pool.spec.policy == "colocation" and pool.profile is not None:
            nodes[mine] = _arranged(ctx, work, batches, pool, j, rows[result.row[mine]],
                                    problem.vectors[result.row[mine], j], nodes[mine])
    return nodes


def _arranged(ctx: PlanContext, work: Reservations, batches: list[tuple[Batch, Placed, list]], pool: PoolInfo,
              j: int, job_rows: np.ndarray, need: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The nodes of the fill's replicas of rows ``job_rows`` (request vectors ``need``) in colocation pool ``pool``
    (index ``j``), from the fill's nodes ``start``: :func:`allocator.colocation.rearrange` over the pool's usable
    nodes with the pods already there fixed."""
    from allocator import colocation

    profile = pool.profile
    assert profile is not None
    machines = pool.usable
    where = {int(k): c for c, k in enumerate(machines.tolist())}
    kind = {name: c for c, name in enumerate(profile.types)}
    jobs = ctx.objects.jobs
    row_of = {info.key: i for i, info in enumerate(jobs)}
    T = len(profile.types)
    loads = np.zeros((machines.size, T))
    counts = np.zeros((machines.size, T))

    def fix(row: int, k: int) -> None:
        spec = jobs[row].spec
        c = where.get(k)
        if c is not None and spec.colocation_type in kind:
            loads[c, kind[spec.colocation_type]] += spec.colocation_size
            counts[c, kind[spec.colocation_type]] += 1.0

    table = work.table
    names = {table.names[k] for k in machines.tolist()}
    for pod in ctx.cluster.pods:  # running (and bound) pods of the pool's jobs stay where they are
        node = pod.node
        if node is not None and node in names and pod.job is not None and not pod.terminal:
            row = row_of.get((pod.namespace, pod.job))
            if row is not None:
                fix(row, table.index[node])
    for batch, placed, _ in batches:  # so do the pods the pool's policy placed in this plan
        if batch.pool == j:
            for q, row in enumerate(batch.rows):
                if placed.node[q] >= 0:
                    fix(int(row), int(placed.node[q]))
    sizes = np.array([jobs[int(i)].spec.colocation_size for i in job_rows], dtype=np.float64)
    types = np.array([kind[jobs[int(i)].spec.colocation_type or ""] for i in job_rows], dtype=np.int64)
    limit = pool.spec.degree_limit
    slots = (np.maximum(limit - work.count[machines], 0) if limit is not None
             else np.full(machines.size, UNLIMITED)).astype(np.float64)
    allowed = np.stack([ctx.admitted[int(i)][machines] for i in job_rows])
    cost = colocation.cost_function(colocation_cost(profile))
    arranged = colocation.rearrange(
        loads, counts, sizes, types, np.asarray(profile.interference, dtype=np.float64),
        np.array([where[int(k)] for k in start.tolist()], dtype=np.int64),
        need=need, room=np.maximum(table.free[machines], 0.0), slots=slots, allowed=allowed, cost=cost)
    return machines[arranged.assignment]
