"""Phase *status*: what each job and pool reports, from what was placed and what the pods say (not from what was
priced or hoped).

A job's status carries the market's priced allocation (``allocation``: time fraction per pool, ``pricedThroughput``
``a_i^T x_i``, ``pricedCost`` ``sum_j p_j d_ij x_ij``; 004 Sec. 2) and, separately, what placement realised: replicas
per pool that run or have a node (``replicas``), what the market granted (``wantedReplicas``), and the throughput and
cost of the placed replicas (replica k of N runs a 1/N share of the job: ``sum_j a_ij placed_ij / N_i``).

The phase is the pods': ``Running`` when at least one pod of the job exists on a node in phase Running, else
``Pending`` (``Unschedulable`` when no pool can ever run a pod of it; the lifecycle phase sets Complete, Failed,
Suspended). Conditions (docs/troubleshooting.md has the table of reasons):

* ``ReplicasGranted``: True ``AllGranted`` when the market granted ``count`` replicas (an elastic job: True
  ``ElasticShare`` at or above its minimum); else False with the blocking rule of its best pool
  (:data:`~walras.planner.model.REASONS`) and a message with the numbers (granted k of N, per pool why).
* ``Scheduled``: True ``AllPodsPlaced`` when every granted replica has a node (with how many run); False with the
  rule that keeps replicas out (nothing granted, or granted replicas without a node).
* ``ReplicasPlaceable`` False: granted replicas that no node takes, per pool, with the rule.
* ``PlacedAsPriced`` False ``MarketRepriced`` only on a job short of replicas: pools withdrawn from its market.

Every rule is measured once, here, after this plan's placement (:class:`_Diagnosis`), and kept on the job's plan
(``JobPlan.blockers``, ``bids``, ``units``, ``spend``, ``queue_position``) for ``walras explain``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

import numpy as np

from walras.planner.cluster import pod_vector
from walras.planner.integral import utility_arrays, valued
from walras.planner.market import build_utility, utility_values
from walras.planner.model import Blocker, Condition, JobPlan, PlanEvent, PodPlan, PoolPlan, evolve
from walras.planner.queue import queue_key
from walras.planner.results import Actions, JobStatuses, Outcome, PlanContext, PoolStatuses, Resizes
from walras.planner.reuse import Inputs, Same, matches
from walras.planner.tenants import Tenancy

_WHY = {
    "DegreeLimited": "the pool's degree limit leaves no slot on a node with room",
    "Fragmented": "the pool has the room in total but no single node has room for a whole pod",
    "InsufficientCapacity": "the pool has no room left for the pod's requests",
    "NoEligibleNode": "no usable node of the pool admits the pod (taints, nodeSelector, node affinity)",
    "NoRoom": "no node of the pool has room for a pod of this job now",
    "TooLarge": "the pod's requests exceed the allocatable of the largest node the pod may use",
}
_name = attrgetter("name")
#: Reasons that no change of load can cure: the job can never run in that pool as it is specified.
_STRUCTURAL = ("TooLarge", "NoEligibleNode")


def allocation_text(allocation: dict[str, float]) -> str:
    """``a100=0.46,v100=0.54``: the priced allocation, two decimals, largest first (for printer columns)."""
    items = sorted(allocation.items(), key=lambda kv: (-kv[1], kv[0]))
    return ",".join(f"{name}={value:.2f}" for name, value in items) or "-"


def _first_few(items: list[str], shown: int = 5) -> str:
    return "; ".join(items[:shown]) + ("; ..." if len(items) > shown else "")


PoolCounts = tuple[tuple[str, int, int], ...]
"""Per pool (in first-seen order): the pods planned there (live, with a node) and those bound (existing, kept or
resized)."""
Given = tuple[Any, ...]
"""Everything :func:`_conditions` reads of one job (its inputs, see there), compared by value."""
Concluded = tuple[tuple[Condition, ...], str, tuple[PlanEvent, ...]]
"""What :func:`_conditions` returns: the conditions it adds, the phase, the events it raises."""


@dataclass(frozen=True)
class StatusEntry:
    """One job's record of the status phase (:mod:`.reuse`), in three parts, each reused where its own inputs
    :func:`~.reuse.matches` the present ones: ``inputs`` (``(Same(listed),)``, its pod plans as the reconcile phase
    listed them) for those plans in name order (``ordered``) and what :func:`_pod_counts` (``live``, ``resized``,
    ``bound``) and :func:`_pool_counts` (``pools``) found in them; ``allocation`` (its priced allocation) for its
    ``text`` (:func:`allocation_text`); ``given`` (:func:`_conditions`'s inputs) for ``done``, its result."""

    inputs: Inputs
    ordered: tuple[PodPlan, ...]
    live: int
    resized: int
    bound: bool
    pools: PoolCounts
    allocation: dict[str, float]
    text: str
    given: Given
    done: Concluded


def _amount(resource: str, value: float) -> str:
    """A quantity for a person: bytes of memory and storage in Gi, others as a short number."""
    if resource == "memory" or resource.endswith("storage"):
        return f"{value / 2 ** 30:.3g}Gi"
    return f"{value:.3g}"


class _Diagnosis:
    """The blocking rule of each (job, pool), from the node table after this plan's reservations
    (``outcome.table``) and the Walras pods per node (``outcome.walras_count``): what room the pool has for one more
    pod of the job (:meth:`_room`, memoised per admitted mask, pod vector and pool: it reads nothing else), then the
    market's side (spec.capacity, the price against the job's bid)."""

    def __init__(self, ctx: PlanContext, outcome: Outcome, tenancy: Tenancy | None = None,
                 spends: Sequence[float] = ()) -> None:
        self.ctx, self.table, self.count = ctx, outcome.table, outcome.walras_count
        self.allocation = outcome.allocation
        self.rooms: dict[tuple[int, bytes, int], tuple[str, dict[str, Any]]] = {}
        self.tenancy, self.spends = tenancy or Tenancy(), spends
        self.members: dict[str, int] = {}  # priced jobs per tenant (T1's sum runs over them)
        for ns, _ in self.tenancy.budgets:
            owner = self.tenancy.of_namespace.get(ns, "")
            self.members[owner] = self.members.get(owner, 0) + 1

    def blockers(self, i: int, granted: list[int], placed: list[float], bids: Mapping[int, float | None],
                 prices: list[float]) -> tuple[Blocker, ...]:
        """Job row ``i``'s blockers: first, per pool where granted replicas have no node, the rule that keeps them
        out; then, for the replicas not granted (``count`` less the granted ones), the rule of every pool it may use,
        its best pools (highest throughput) first."""
        info = self.ctx.objects.jobs[i]
        pools = self.ctx.objects.pools
        usable = [j for j in np.flatnonzero(info.pools).tolist() if info.spec.throughput.get(pools[j].name, 0.0) > 0]
        usable.sort(key=lambda j: (-info.spec.throughput[pools[j].name], j))
        out: list[Blocker] = []
        if not usable:
            return ()
        n = max(info.spec.replicas, 1)
        a = [info.spec.throughput.get(pools[j].name, 0.0) for j in range(len(pools))]
        t_placed = sum(a[j] * placed[j] for j in usable) / n
        t_granted = sum(a[j] * granted[j] for j in usable) / n
        u = utility_arrays([info.spec.utility])
        t1 = min(a[j] for j in usable) / n
        for j in usable:
            short = int(granted[j] - placed[j])
            if short > 0:
                out.extend(self._valued(i, j, short, valued(u, 0, t_placed, a[j] / n, short, t1), granted, bids,
                                        prices))
        missing = info.spec.replicas - max(sum(granted), int(sum(placed)))
        if missing > 0:
            for j in usable:
                out.extend(self._valued(i, j, missing, valued(u, 0, t_granted, a[j] / n, missing, t1), granted,
                                        bids, prices))
        return _merged(out)

    def _valued(self, i: int, j: int, replicas: int, worth: int, granted: list[int],
                bids: Mapping[int, float | None], prices: list[float]) -> list[Blocker]:
        """The blockers of ``replicas`` replicas of row ``i`` in pool ``j`` of which the first ``worth`` add to the
        job's utility (:func:`walras.planner.integral.valued`, the fill's test): the rule that keeps those out, and
        ``NoMarginalUtility`` for the rest (no capacity would make the job take them)."""
        out = [self._blocker(i, j, worth, granted, bids, prices)] if worth > 0 else []
        if replicas > worth:
            info, pool = self.ctx.objects.jobs[i], self.ctx.objects.pools[j]
            bid = bids.get(j)
            out.append(Blocker(pool.name, "NoMarginalUtility", replicas - worth, (
                f"one more replica in pool {pool.name!r} adds nothing to the job's {info.spec.utility.type} utility "
                f"(its bid is {'unbounded' if bid is None else f'{bid:.4g}'} per {pool.spec.resource} at "
                f"{sum(granted)} granted replica(s)): {replicas - worth} of its {info.spec.replicas} replica(s) "
                "have no value to it")))
        return out

    def _blocker(self, i: int, j: int, replicas: int, granted: list[int], bids: Mapping[int, float | None],
                 prices: list[float]) -> Blocker:
        info, pool = self.ctx.objects.jobs[i], self.ctx.objects.pools[j]
        spec, name, res = info.spec, pool.name, pool.spec.resource
        kind, got = self._room(i, j)
        d = spec.demand
        if kind == "NoReadyNode":
            members = got["members"]
            message = (f"pool {name!r} matches no Ready node ("
                       + (f"{members} node(s) match its nodeSelector, none Ready and schedulable)" if members
                          else "no node matches its nodeSelector)"))
        elif kind == "NoEligibleNode":
            message = (f"none of the {got['ready']} Ready node(s) of pool {name!r} admits the pod (taints, "
                       "nodeSelector, node affinity)")
        elif kind == "TooLarge":
            over = ", ".join(f"{r} {_amount(r, need)} > {_amount(r, have)}" for r, need, have in got["over"])
            message = f"the pod requests more than the largest node of pool {name!r} may allocate: {over}"
        elif kind == "DegreeLimited":
            message = (f"{got['nodes']} node(s) of pool {name!r} have room for the pod but no pod slot under its "
                       f"degree limit of {got['limit']} Walras pod(s) per node")
        elif kind in ("InsufficientCpu", "InsufficientMemory", "InsufficientResource"):
            shorts = ", ".join(f"{r} short by {_amount(r, v)}" for r, v in got["shorts"])
            message = (f"{got['nodes']} node(s) of pool {name!r} have the {d:g} {res} a pod needs but not its other "
                       f"requests; on the best node {got['node']}: {shorts}")
            if got.get("limit") is not None:
                message += f" (and no pod slot under its degree limit of {got['limit']} Walras pod(s) per node)"
        elif kind == "Fragmented":
            message = (f"pool {name!r} has {got['free']:g} {res} free in total but no node has the {d:g} a pod "
                       f"needs (at most {got['largest']:g} on one node)")
        elif kind == "InsufficientCapacity":
            need = replicas * d
            message = (f"pool {name!r} has {got['free']:g} {res} free on the {got['nodes']} node(s) the pod may use; "
                       f"{replicas} replica(s) need {need:g} ({max(need - got['free'], d):g} more needed)")
        else:  # room for a pod: the market's side
            kind, message = self._market(i, j, replicas, granted, bids, prices, got)
        return Blocker(name, kind, replicas, message)

    def _market(self, i: int, j: int, replicas: int, granted: list[int], bids: Mapping[int, float | None],
                prices: list[float], got: dict[str, Any]) -> tuple[str, str]:
        info, pool = self.ctx.objects.jobs[i], self.ctx.objects.pools[j]
        name, res, d = pool.name, pool.spec.resource, info.spec.demand
        if pool.spec.capacity is not None:
            c = self.table.column.get(res)
            used = float(self.table.used[pool.usable, c].sum()) if c is not None and pool.usable.size else 0.0
            left = pool.spec.capacity - used
            if left + 1e-9 < d:
                return "PoolCapacity", (f"pool {name!r} sells at most spec.capacity {pool.spec.capacity:g} {res}, "
                                        f"{used:g} in use: {max(left, 0.0):g} left, a replica needs {d:g}")
        bid, price = bids.get(j), prices[j]
        g = sum(granted)
        room = f"{got['free']:g} {res} free on {got['nodes']} node(s) with a slot"
        bid_text = "unbounded" if bid is None else f"{bid:.4g}"
        if bid is not None and bid <= price * (1 + 1e-9) + 1e-12:
            budget = self.tenancy.budgets.get(info.key)
            if budget is not None:  # a tenant's buyer: its purchasing power is its part of the tenant's budget
                owner = self.tenancy.of_namespace.get(info.key[0], "")
                tenant = self.tenancy.tenant(owner)
                share = tenant.share if tenant is not None else 0.0
                spend = float(self.spends[i]) if i < len(self.spends) else 0.0
                return "BudgetShare", (
                    f"the job's budget is {budget:.4g} credits/h, its part of tenant {owner!r}'s share {share:g} "
                    f"over {self.members.get(owner, 0)} priced job(s); the market's allocation spends "
                    f"{spend:.4g} of it ({max(budget - spend, 0.0):.4g} left); price {price:.4g} per {res} in pool "
                    f"{name!r} is at or above its bid {bid:.4g} (marginal utility per unit at {g} granted "
                    f"replica(s)), one more replica costs {price * d:.4g} credits/h; {room}")
            return "PriceAboveBid", (f"price {price:.4g} per {res} in pool {name!r} is at or above the job's bid "
                                     f"{bid:.4g} per {res} (its marginal utility per unit at {g} granted "
                                     f"replica(s)); {room}")
        share = float(self.allocation[i, j]) * info.spec.replicas if self.allocation.shape[0] > i else 0.0
        return "MarketShare", (f"the market's share of pool {name!r} for the job, {share:.3g} replica(s), rounds to "
                               f"{granted[j]}; price {price:.4g} per {res}, bid {bid_text}; {room}")

    def _room(self, i: int, j: int) -> tuple[str, dict[str, Any]]:
        """What room pool ``j`` has now for one more pod of job row ``i`` (the order of
        :data:`~walras.planner.model.REASONS`)."""
        ctx, table = self.ctx, self.table
        info, pool = ctx.objects.jobs[i], ctx.objects.pools[j]
        res = pool.spec.resource
        vec = table.vector(pod_vector(ctx.templates[i], info.spec, res, info.spec.demand))
        mask = ctx.admitted[i]
        key = (id(mask), vec.tobytes(), j)
        hit = self.rooms.get(key)
        if hit is None:
            hit = self.rooms[key] = self._measure(mask, vec, j)
        return hit

    def _measure(self, mask: np.ndarray, vec: np.ndarray, j: int) -> tuple[str, dict[str, Any]]:
        table, pool = self.table, self.ctx.objects.pools[j]
        nodes = pool.usable
        if nodes.size == 0:
            return "NoReadyNode", {"members": int(pool.members.size)}
        cand = nodes[mask[nodes]]
        if cand.size == 0:
            return "NoEligibleNode", {"ready": int(nodes.size)}
        alloc = table.alloc[cand]
        free = alloc - table.used[cand]
        tol = 1e-9 * np.maximum(1.0, alloc)
        big = np.all(alloc + tol >= vec, axis=1)
        if not big.any():
            most = alloc.max(axis=0)
            over = [(table.resources[r], float(vec[r]), float(most[r])) for r in np.flatnonzero(vec > most + 1e-9)]
            return "TooLarge", {"over": over}
        fits = np.all(free + tol >= vec, axis=1)
        limit = pool.spec.degree_limit
        slot = np.ones(cand.size, dtype=bool) if limit is None else self.count[cand] < limit
        c = table.column.get(pool.spec.resource)
        col_free = np.maximum(free[:, c], 0.0) if c is not None else np.zeros(cand.size)
        if (fits & slot).any():
            return "Room", {"nodes": int((fits & slot).sum()), "free": float(col_free[fits & slot].sum())}
        if (fits & ~slot).any():
            return "DegreeLimited", {"nodes": int((fits & ~slot).sum()), "limit": limit}
        need = vec[c] if c is not None else 0.0
        has = col_free + (tol[:, c] if c is not None else 0.0) >= need
        # nodes with the priced resource free: those with a slot first; else those the degree limit also closes
        priced = has & slot if (has & slot).any() else has
        if priced.any():
            lack = np.maximum(vec - free, 0.0)[priced]
            if c is not None:
                lack[:, c] = 0.0
            score = (lack / np.maximum(vec, 1e-12)).sum(axis=1)
            best = int(np.argmin(score))
            shorts = [(table.resources[r], float(lack[best, r])) for r in np.flatnonzero(lack[best] > 1e-9)]
            names = {r for r, _ in shorts}
            kind = "InsufficientCpu" if "cpu" in names else "InsufficientMemory" if "memory" in names else (
                "InsufficientResource")
            return kind, {"nodes": int(priced.sum()), "node": table.names[int(cand[priced][best])], "shorts": shorts,
                          "limit": None if (has & slot).any() else limit}
        total = float(col_free.sum())
        if total + 1e-9 >= need > 0:
            return "Fragmented", {"free": total, "largest": float(col_free.max())}
        return "InsufficientCapacity", {"free": total, "nodes": int(cand.size)}


def _merged(found: list[Blocker]) -> tuple[Blocker, ...]:
    """``found`` with the blockers of one pool that give the same rule and message (granted replicas without a
    node and replicas not granted, held back by the same rule) as one, their replicas added, in first-seen order."""
    out: dict[tuple[str, str, str], Blocker] = {}
    for b in found:
        key = (b.pool, b.reason, b.message)
        held = out.get(key)
        out[key] = b if held is None else replace(held, replicas=held.replicas + b.replicas)
    return tuple(out.values())


def _cap_blockers(tenancy: Tenancy, capped: Mapping[tuple[str, str], list[tuple[str, float, float, int]]],
                  key: tuple[str, str], demand: float, resources: Mapping[str, str], placed: int,
                  ) -> tuple[tuple[Blocker, ...], int]:
    """The ``BudgetCap`` blockers of job ``key`` (its pools' ``(pool, cap, left, asked)`` in ``capped``, as the
    tenants step recorded them in :attr:`~walras.planner.tenants.Tenancy.cap_room`) and the replicas it asked for
    (its ``spec.replicas`` before a cap lowered it; 0 when no cap touched it): a pool the cap took keeps out the
    replicas not granted, a lowered count the replicas above it."""
    rows = capped.get(key)
    if not rows:
        return (), 0
    owner = tenancy.of_namespace.get(key[0], "")
    tenant = tenancy.tenant(owner)
    budget = f" (Budget {tenant.budget!r})" if tenant is not None and tenant.budget else ""
    out: list[Blocker] = []
    asked = max(a for _, _, _, a in rows)
    for pool, cap, left, want in rows:
        res = resources.get(pool, "units")
        head = (f"tenant {owner!r}{budget} caps pool {pool!r} at spec.caps maxUnits {cap:g} {res}; its jobs "
                f"admitted before this one take {cap - left:g}, {max(left, 0.0):g} left")
        fits = tenancy.reduced.get(key) if pool not in tenancy.capped.get(key, ()) else None
        if fits is not None:
            out.append(Blocker(pool, "BudgetCap", want - fits, (
                f"{head}: {fits} replica(s) of {demand:g} fit, the other {want - fits} would need "
                f"{(want - fits) * demand:g} more")))
        elif want - placed > 0:
            out.append(Blocker(pool, "BudgetCap", want - placed, (
                f"{head}, the job's {want} replica(s) need {want * demand:g}: the pool is not offered to it")))
    return tuple(out), asked


def _placed_matrix(actions: Actions, keys: list[tuple[str, str]], column: Mapping[str, int], m: int) -> np.ndarray:
    """(n, m) the replicas each job has placed per pool (``actions.placed``), by the pools' column."""
    out = np.zeros((len(keys), m), dtype=np.float64)
    for i, key in enumerate(keys):
        for name, count in actions.placed.get(key, {}).items():
            j = column.get(name)
            if j is not None:
                out[i, j] = count
    return out


def _nonzero_rows(X: np.ndarray, wanted: np.ndarray, names: list[str]) -> tuple[list[dict[str, float]],
                                                                                  list[dict[str, int]]]:
    """Per job row, its priced allocation (``X``'s non-zero entries, rounded to 6 digits) and its wanted replicas
    (``wanted``'s), by pool name in column order (a job uses a few of the pools)."""
    n = X.shape[0]
    allocations: list[dict[str, float]] = [{} for _ in range(n)]
    wanted_rows: list[dict[str, int]] = [{} for _ in range(n)]
    if n and X.shape[1]:
        rows, cols = np.nonzero(X > 1e-9)
        for i, j, x in zip(rows.tolist(), cols.tolist(), X[rows, cols].tolist(), strict=True):
            allocations[i][names[j]] = round(x, 6)
        rows, cols = np.nonzero(wanted > 0)
        for i, j, w in zip(rows.tolist(), cols.tolist(), wanted[rows, cols].tolist(), strict=True):
            wanted_rows[i][names[j]] = int(w)
    return allocations, wanted_rows


def _capped_by_job(tenancy: Tenancy) -> dict[tuple[str, str], list[tuple[str, float, float, int]]]:
    """Per job, ``(pool, cap, units left at its turn, replicas it asked)`` of every Budget cap the tenants step
    applied to it (:attr:`walras.planner.tenants.Tenancy.cap_room`), for its ``BudgetCap`` rule."""
    capped: dict[tuple[str, str], list[tuple[str, float, float, int]]] = {}
    for (ns, job_name, pool_name), (cap, left, want) in tenancy.cap_room.items():
        capped.setdefault((ns, job_name), []).append((pool_name, cap, left, want))
    return capped


def job_statuses(ctx: PlanContext, outcome: Outcome, actions: Actions, resizes: Resizes,
                 job_plans: Mapping[tuple[str, str], JobPlan], tenancy: Tenancy | None = None) -> JobStatuses:
    """Fill every valid job's :class:`JobPlan` and its events. With the context's reuse (a :class:`StatusEntry`
    per job, :mod:`.reuse`), a job takes from the recorded entry, each part only where every input of that part is
    equal to what it was then:

    - its pods' name order and counts, where its pod plans are the same objects in the same order as then (the
      reconcile phase reuses unchanged jobs' ``keep`` plans, :mod:`.reconcile`);
    - its allocation text, where its priced allocation (the non-zero entries of its row of X, rounded) is equal;
    - its conditions, phase and the events they raise, where every input of :func:`_conditions` is equal (the job's
      replicas and minimum, placed and wanted totals, pools offered, pod counts, the pools no longer offered with
      why, what was unplaced, deferred, resize-blocked and resize-deferred, the replicas below its minimum, its
      running pods and its :func:`blockers`).

    The numbers that depend on the prices or on X (throughputs, costs, utility, bids) are computed for every job at
    once, the running pods (phase Running in the cluster) and the blockers (for jobs with fewer replicas placed than
    ``count``) for each job, and the ``Planned`` event (which compares with the previous plan's replicas) for each
    job. With ``tenancy`` (tenants on), a job a Budget's cap kept out of a pool or lowered gets ``BudgetCap``
    blockers (:func:`_cap_blockers`) and its count is the replicas it asked for; where its budget is what keeps it
    from a pool, ``BudgetShare``. Then the waiting jobs are ranked (:func:`_queue`). This plan's entries are
    recorded. Returns each valid
    job's plan (its plan in ``job_plans`` filled in), its pods planned and bound per pool (for
    :func:`pool_statuses`) and the events raised."""
    objects, previous, reuse = ctx.objects, ctx.previous, ctx.reuse
    jobs = objects.jobs
    n, m = len(jobs), len(objects.pools)
    prices = outcome.market.prices if outcome.market.prices.size == m else np.zeros(m)
    X = outcome.allocation
    names = [p.name for p in objects.pools]
    column = {name: j for j, name in enumerate(names)}
    A = outcome.throughput
    priced_t = np.einsum("ij,ij->i", A, X) if n else np.zeros(0)
    priced_cost = (outcome.demand * X) @ prices if n and m else np.zeros(n)
    keys = [info.key for info in jobs]
    placed_all = _placed_matrix(actions, keys, column, m)
    big_ns = np.maximum(np.array([info.spec.replicas for info in jobs], dtype=np.float64), 1.0)
    placed_t = np.einsum("ij,ij->i", A, placed_all) / big_ns if n else np.zeros(0)
    specs = [info.spec.utility for info in jobs]
    utilities = utility_values(specs, [1.0] * n, placed_t) if n else np.zeros(0)
    # Python lists of the per-job rows: the loop below reads them element by element.
    wanted_all = outcome.target + outcome.dropped if outcome.dropped.shape == outcome.target.shape else outcome.target
    rows_target = wanted_all.tolist()
    demands = np.array([info.spec.demand for info in jobs], dtype=np.float64)
    costs = ((placed_all * demands[:, None]) @ prices).tolist() if n and m else [0.0] * n
    utilities_l, priced_t_l, priced_cost_l = utilities.tolist(), priced_t.tolist(), priced_cost.tolist()
    placed_t_l = placed_t.tolist() if m else [0.0] * n
    bids = _bids(ctx, wanted_all, big_ns, demands)
    prices_l = prices.tolist()
    # each row's non-zero entries only, in column order (a job uses a few of the pools)
    allocations, wanted_rows = _nonzero_rows(X, wanted_all, names)
    no_pods: tuple[PodPlan, ...] = ()
    per_pool: dict[tuple[str, str], PoolCounts] = {}
    offered_counts = outcome.offered.sum(axis=1).tolist() if n else []
    blocked_by_row = outcome.blocked_by_row
    below_min, deferred, unplaced_all = outcome.below_min, actions.deferred, actions.unplaced
    resize_blocked, resize_later = resizes.blocked, resizes.later
    states = {pod.key: (pod.phase, pod.started) for pod in ctx.cluster.pods if pod.job is not None}
    diagnosis = _Diagnosis(ctx, outcome, tenancy, priced_cost_l)
    tenancy = tenancy or Tenancy()
    capped = _capped_by_job(tenancy)
    resources = {p.name: p.spec.resource for p in objects.pools}
    events: list[PlanEvent] = []
    out: dict[tuple[str, str], JobPlan] = {}
    for i, info in enumerate(jobs):
        key = keys[i]
        spec = info.spec
        placed = actions.placed.get(key, {})
        allocation = allocations[i]
        replicas = {name: int(c) for name, c in sorted(placed.items()) if c > 0}
        listed = actions.pods.get(key, no_pods)
        before = reuse.recorded(StatusEntry, key)
        inputs = (Same(tuple(listed)),)
        if before is not None and matches(before.inputs, inputs):
            ordered, live, resized, bound = before.ordered, before.live, before.resized, before.bound
            pools = before.pools
        else:
            ordered = tuple(sorted(listed, key=_name))
            live, resized, bound = _pod_counts(ordered)
            pools = _pool_counts(ordered)
        per_pool[key] = pools
        running, on_node, first_running = _running(ordered, states)
        text = before.text if before is not None and matches((before.allocation,), (allocation,)) else (
            allocation_text(allocation))
        blocked_pools = [(names[j], why) for j, why in blocked_by_row.get(i, ())]
        placed_total, wanted_total = sum(replicas.values()), sum(rows_target[i])
        row_bids = bids[i]
        found = diagnosis.blockers(i, rows_target[i], placed_all[i].tolist(), row_bids, prices_l) if (
            placed_total < spec.replicas) else ()
        found = _as_gang(found, actions.gangs.get(key))
        by_cap, asked = _cap_blockers(tenancy, capped, key, spec.demand, resources, placed_total)
        count = max(asked, spec.replicas)
        if by_cap:
            found = by_cap + found
        given = (count, spec.min_replicas, placed_total, wanted_total, offered_counts[i],
                 live, resized, bound, blocked_pools, unplaced_all.get(key), deferred.get(key),
                 resize_blocked.get(key), resize_later.get(key), below_min.get(i), running, found, spec.elastic,
                 _counts_text(wanted_rows[i]))
        done = before.done if before is not None and matches((before.given,), (given,)) else _conditions(key, given)
        conditions, phase, raised = _gang_waiting(done, actions.gangs.get(key))  # walras.planner.gang
        if raised:
            events.extend(raised)
        reuse.store(StatusEntry(inputs, ordered, live, resized, bound, pools, allocation, text, given, done), key)
        units = {name: spec.demand * c for name, c in replicas.items()}
        jp = out[key] = evolve(
            job_plans[key], utility=utilities_l[i], allocation=allocation, throughput_unit=spec.throughput_unit,
            wanted=wanted_rows[i], replicas=replicas, priced_throughput=priced_t_l[i], priced_cost=priced_cost_l[i],
            throughput=placed_t_l[i], cost=costs[i], pods=ordered, allocation_text=text, phase=phase,
            conditions=job_plans[key].conditions + conditions, count=count, minimum=spec.min_replicas,
            running=running, bound=on_node, demand=spec.demand, units=units,
            spend={name: prices_l[column[name]] * u for name, u in units.items()},
            bids={names[j]: b for j, b in row_bids.items()}, blockers=found,
            reason="GangNotPlaceable" if key in actions.gangs else (found[0].reason if found else ""),
            created=info.job.created, first_running=first_running)
        planned = _planned(previous.jobs.get(key) if previous is not None else None, jp, wanted_total)
        if planned is not None:
            events.append(planned)
    return JobStatuses(_queue(out, jobs), per_pool, tuple(events))


#: Rules that hold for every pod of a pool, so for a gang's too; the others (room for some pods) are the gang's rule.
_PER_POOL = ("NoReadyNode", "NoEligibleNode", "TooLarge", "PoolCapacity", "NoMarginalUtility")


def _as_gang(found: tuple[Blocker, ...], note: str | None) -> tuple[Blocker, ...]:
    """A waiting gang's blockers (``note``: its ``GangNotPlaceable`` message from :func:`walras.planner.gang.enforce`,
    None for any other job): the rules that keep every pod out of a pool stay (:data:`_PER_POOL`); the rules of a
    pool that has room for some of its pods (the degree limit, cpu or memory, capacity, the market's side of one more
    pod) are not what holds a gang back, so they become one ``GangNotPlaceable`` blocker, in the first such pool,
    with the gang's numbers (how many its best pool can place and the rule that stops the next pod)."""
    if not note:
        return found
    whole = [b for b in found if b.reason not in _PER_POOL]
    if not whole:
        return found
    gang = Blocker(whole[0].pool, "GangNotPlaceable", max(b.replicas for b in whole), note)
    return (gang, *(b for b in found if b.reason in _PER_POOL))


def _gang_waiting(done: Concluded, note: str | None) -> Concluded:
    """``done`` with a waiting gang's ``GangPlaced`` False ``GangNotPlaceable`` condition (``note``, the message of
    :func:`walras.planner.gang.enforce`) added."""
    if not note:
        return done
    return (*done[0], Condition("GangPlaced", "False", "GangNotPlaceable", note)), done[1], done[2]


def _planned(old: JobPlan | None, jp: JobPlan, granted: int) -> PlanEvent | None:
    """The ``Planned`` event of a job whose placed replicas changed since the previous plan (none for a job that
    had none and still has none): placed k of N per pool, what it had, what was granted, the first blocking rule."""
    if (old is None and not jp.replicas) or (old is not None and old.replicas == jp.replicas):
        return None
    was = f" (was {_counts_text(old.replicas)})" if old is not None else ""
    why = f": {jp.blockers[0].reason}" if jp.blockers else ""
    return PlanEvent("FungibleJob", jp.namespace, jp.name, "Normal", "Planned",
                     f"Placed {sum(jp.replicas.values())} of {jp.count} replica(s): {_counts_text(jp.replicas)}{was}; "
                     f"granted {granted}{why}; throughput {jp.throughput:.4g}, cost {jp.cost:.4g} at current prices.")


def _counts_text(counts: Mapping[str, int]) -> str:
    """``a100=3,v100=1`` (pool order as given), ``none`` when empty."""
    return ",".join(f"{k}={v}" for k, v in counts.items() if v) or "none"


def _running(pods: Sequence[PodPlan], states: Mapping[tuple[str, str], tuple[str, float | None]],
             ) -> tuple[int, int, float | None]:
    """Of a job's pod plans that keep (or resize) a pod on its node: those whose pod is in phase Running, all of
    them, and the earliest ``status.startTime`` of the running ones (what the pods say, not what the plan hopes)."""
    running = on_node = 0
    first: float | None = None
    for p in pods:
        if (p.action != "keep" and p.action != "resize") or not p.exists or p.node is None:
            continue
        on_node += 1
        state = states.get((p.namespace, p.name))
        if state is not None and state[0] == "Running":
            running += 1
            if state[1] is not None and (first is None or state[1] < first):
                first = state[1]
    return running, on_node, first


def _bids(ctx: PlanContext, granted: np.ndarray, big_ns: np.ndarray, demands: np.ndarray,
          ) -> list[dict[int, float | None]]:
    """Per job row, per pool it may use with a throughput: its bid per unit of the pool's priced resource at the
    granted allocation, ``u_i'(t_i) a_ij / (N_i d_i)`` with ``t_i = sum_j a_ij g_ij / N_i`` (``g`` the granted
    replicas): the marginal utility of one more unit, which the market compares with the price ``p_j`` (at the
    equilibrium ``u_i'(t_i) a_ij <= p_j N_i d_i``, with equality where ``x_ij > 0``; 004 Sec. 2.2). None where the
    slope is unbounded (a log or power utility at nothing granted)."""
    jobs, pools = ctx.objects.jobs, ctx.objects.pools
    n = len(jobs)
    out: list[dict[int, float | None]] = [{} for _ in range(n)]
    if not n or not pools:
        return out
    a = np.zeros((n, len(pools)))
    for i, info in enumerate(jobs):
        for j in np.flatnonzero(info.pools).tolist():
            a[i, j] = info.spec.throughput.get(pools[j].name, 0.0)
    t = np.einsum("ij,ij->i", a, granted) / big_ns
    mixed = build_utility([info.spec.utility for info in jobs], [1.0] * n).to("cpu", np.float64)
    with np.errstate(all="ignore"):
        slope = np.asarray(mixed.derivative(t), dtype=np.float64)
        per_unit = slope[:, None] * a / (big_ns * np.maximum(demands, 1e-300))[:, None]
    for i, j in zip(*np.nonzero(a > 0), strict=True):
        value = float(per_unit[i, j])
        out[int(i)][int(j)] = value if math.isfinite(value) else None
    return out


def _queue(plans: dict[tuple[str, str], JobPlan], jobs: Sequence[Any]) -> dict[tuple[str, str], JobPlan]:
    """``plans`` with each waiting job's place in the queue: the jobs with fewer replicas placed than ``count``, in
    the order of :mod:`walras.planner.queue` (PriorityClass priority, then ``spec.weight``, then bid, then age)."""
    info = {i.key: (i.job.priority, i.spec.weight) for i in jobs}
    waiting = [jp for jp in plans.values() if sum(jp.replicas.values()) < jp.count]

    def order(jp: JobPlan) -> tuple[float, float, float, float, str, str]:
        priority, weight = info.get(jp.key, (0, 1.0))
        return queue_key(priority, weight, jp.bids.values(), jp.created, jp.namespace, jp.name)

    for position, jp in enumerate(sorted(waiting, key=order), start=1):
        plans[jp.key] = evolve(jp, queue_position=position, waiting=len(waiting))
    return plans


def _pool_counts(pods: Sequence[PodPlan]) -> PoolCounts:
    """Of a job's pod plans, per pool: the live ones with a node (planned), and those of them that exist and are
    kept or resized (bound)."""
    planned: dict[str, int] = {}
    bound: dict[str, int] = {}
    for p in pods:
        action = p.action
        if action == "delete" or action == "evict" or p.node is None:
            continue
        at = p.pool
        planned[at] = planned.get(at, 0) + 1
        if p.exists and (action == "keep" or action == "resize"):
            bound[at] = bound.get(at, 0) + 1
    return tuple((at, count, bound.get(at, 0)) for at, count in planned.items())


def _pod_counts(pods: Sequence[PodPlan]) -> tuple[int, int, bool]:
    """Of a job's pod plans: the live ones (neither deleted nor evicted), those resized in place, and whether every
    live pod is kept (or resized) on a node."""
    live = resized = 0
    bound = True
    for p in pods:  # one pass over the job's pods: a plan reads 20,000 of them here
        action = p.action
        if action == "delete" or action == "evict":
            continue
        live += 1
        if action == "resize":
            resized += 1
        elif action != "keep":
            bound = False
        if p.node is None:
            bound = False
    return live, resized, bound


def _conditions(key: tuple[str, str], given: Given) -> Concluded:
    """The conditions a job adds to its status, its phase, and the events they raise, from what was placed and what
    its pods say (see the module docstring). ``given``, as :func:`job_statuses` builds it: the job's
    ``spec.replicas`` and ``spec.replicas.min``, its placed and granted replica totals, how many pools it is offered,
    its pods' live, resized and bound counts (:func:`_pod_counts`), the pools no longer offered to it with why (in
    pool order), what was unplaced per pool, how many deletions were deferred, which pods' resizes are blocked and
    deferred, the replicas the fair share would give it below its minimum (None where these do not apply), its
    running pods (:func:`_running`), its :func:`blockers`, whether it is elastic, and its granted replicas as text."""
    (replicas, minimum, placed, wanted, offered, _live, resized, _bound, blocked_pools, unplaced, deferred, blocked,
     later, below_min, running, found, elastic, granted_text) = given
    conditions: list[Condition] = []
    raised: list[PlanEvent] = []
    warn = raised.append
    ns, name = key
    phase: str
    if resized:
        conditions.append(Condition(
            "ResourcesCurrent", "False", "ResizeNeeded",
            f"{resized} running pod(s) get new requests/limits in place (pods/resize where the cluster serves it, "
            "else with the next pod)"))
    if blocked:
        message = (f"{len(blocked)} running pod(s) keep their resources: the new ones do not fit on their node "
                   f"({_first_few(blocked)}); the next pod gets them")
        conditions.append(Condition("ResizeBlocked", "True", "NoRoomOnNode", message))
        warn(PlanEvent("FungibleJob", ns, name, "Warning", "ResizeBlocked", message))
    if later:
        message = (f"{len(later)} running pod(s) keep resources that cannot change in place ({_first_few(later)}); "
                   "the change waits for the next pod")
        conditions.append(Condition("ResizeDeferred", "True", "NotResizableInPlace", message))
        warn(PlanEvent("FungibleJob", ns, name, "Normal", "ResizeDeferred", message))
    if below_min is not None:
        message = (f"the fair share gives {below_min} replica(s), fewer than spec.replicas.min {minimum}; "
                   "no new pod is created until it reaches the minimum")
        conditions.append(Condition("MinimumReplicas", "False", "BelowMinimum", message))
        warn(PlanEvent("FungibleJob", ns, name, "Warning", "BelowMinimum", message))
    if deferred:
        message = f"{deferred} surplus pod(s) wait for the next plan (churn budget of this plan spent)"
        conditions.append(Condition("ChurnLimited", "True", "DeletionsDeferred", message))
    unplaced = unplaced or {}
    # the status phase's diagnosis (with numbers) of each pool, else placement's own reason
    unplaced_found: dict[str, Blocker] = {}
    for b in found:  # a pool's first rule; replicas of no value to the job wait for nothing (NoMarginalUtility)
        if b.reason and b.reason != "NoMarginalUtility" and b.pool in unplaced and b.replicas > 0:
            unplaced_found.setdefault(b.pool, b)
    ungranted = [b for b in found if b not in unplaced_found.values()]
    if unplaced:
        parts, reasons = [], []
        for pool, (count, why) in sorted(unplaced.items()):
            b = unplaced_found.get(pool)
            reasons.append(b.reason if b is not None else (why or "InsufficientCapacity"))
            parts.append(f"{count} in pool {pool!r}: {b.message if b is not None else _WHY.get(why, why)}")
        message = f"{sum(c for c, _ in unplaced.values())} wanted replica(s) have no node: {'; '.join(parts)}"
        conditions.append(Condition("ReplicasPlaceable", "False", reasons[0], message))
        warn(PlanEvent("FungibleJob", ns, name, "Warning", "Unplaceable", message))
    short = replicas - wanted
    detail = "; ".join(b.message for b in ungranted)
    if short <= 0:
        conditions.append(Condition("ReplicasGranted", "True", "AllGranted",
                                    f"granted {wanted} of {replicas} replica(s): {granted_text}"))
    elif elastic and wanted >= max(minimum, 1):
        conditions.append(Condition(
            "ReplicasGranted", "True", "ElasticShare",
            f"granted {wanted} of up to {replicas} replica(s) (at least {minimum}): {granted_text}"
            + (f"; the next one: {detail}" if detail else "")))
    else:
        reason = ungranted[0].reason if ungranted else "NoAllocation"
        conditions.append(Condition(
            "ReplicasGranted", "False", reason,
            f"granted {wanted} of {replicas} replica(s): {granted_text}; {short} not granted: "
            + (detail or "the market gives this job no more replicas at current prices")))
        if blocked_pools:
            said = {b.pool: b.message for b in ungranted}
            pools_text = "; ".join(said.get(pool) or f"pool {pool!r}: {_WHY.get(why, why)}"
                                   for pool, why in blocked_pools)
            conditions.append(Condition("PlacedAsPriced", "False", "MarketRepriced",
                                        f"not offered in {pools_text}; the market priced the job without it"))
    structural = [(pool, why) for pool, why in blocked_pools if why in _STRUCTURAL]
    if replicas > 0 and structural and len(structural) == offered:
        phase = "Running" if running else "Unschedulable"
        message = "no pod of this job can run in its pools: " + "; ".join(
            b.message for b in found if b.reason in _STRUCTURAL) if found else (
            "no pod of this job can run in its pools: " + "; ".join(
                f"pool {pool!r}: {_WHY[why]}" for pool, why in structural))
        conditions.append(Condition("Schedulable", "False", structural[0][1], message))
        warn(PlanEvent("FungibleJob", ns, name, "Warning", structural[0][1], message))
    else:
        phase = "Running" if running else "Pending"
    if replicas > 0 and wanted == 0:
        reason = found[0].reason if found else "NoAllocation"
        message = f"no replica of {replicas} granted: " + (
            "; ".join(b.message for b in found) if found else "the market gives this job no replicas at current prices")
        conditions.append(Condition("Scheduled", "False", reason, message))
    elif placed < wanted:
        reason = next((b.reason for b in unplaced_found.values()), None) or next(
            (why for _, (_, why) in sorted(unplaced.items()) if why), "InsufficientCapacity")
        conditions.append(Condition("Scheduled", "False", reason,
                                    f"{placed} of {wanted} wanted replica(s) placed, {running} running"))
    elif wanted > 0:
        conditions.append(Condition("Scheduled", "True", "AllPodsPlaced",
                                    f"{placed} of {wanted} granted replica(s) have a node, {running} running"))
    return tuple(conditions), phase, tuple(raised)


def pool_statuses(ctx: PlanContext, outcome: Outcome, actions: Actions, pool_plans: Mapping[str, PoolPlan],
                  counted: Mapping[tuple[str, str], PoolCounts] | None = None) -> PoolStatuses:
    """Every valid pool's :class:`PoolPlan`, from its plan in ``pool_plans`` with its price, what is used and its
    pods; and a ``Priced`` event for each pool whose price changed.
    ``counted``: what :func:`job_statuses` returned for the same ``actions`` (the jobs' pods per pool, counted
    there); the pods of other jobs are counted here."""
    objects, previous = ctx.objects, ctx.previous
    table = outcome.table
    prices = outcome.market.prices
    planned: dict[str, int] = {}
    bound: dict[str, int] = {}
    for key, plans in actions.pods.items():
        pools = counted.get(key) if counted is not None else None
        for at, count, held in pools if pools is not None else _pool_counts(plans):
            planned[at] = planned.get(at, 0) + count
            bound[at] = bound.get(at, 0) + held
    events: list[PlanEvent] = []
    out: dict[str, PoolPlan] = {}
    for j, pool in enumerate(objects.pools):
        price = float(prices[j]) if j < prices.size else 0.0
        c = table.column.get(pool.spec.resource)
        used = float(table.used[pool.usable, c].sum()) if c is not None and pool.usable.size else 0.0
        alloc = float(table.alloc[pool.usable, c].sum()) if c is not None and pool.usable.size else 0.0
        capacity = alloc if pool.spec.capacity is None else float(pool.spec.capacity)
        out[pool.name] = replace(pool_plans[pool.name], price=price, capacity=capacity, used=used,
                                 utilisation=float(min(used / capacity, 1.0)) if capacity > 0 else 0.0,
                                 pods_planned=planned.get(pool.name, 0), pods_bound=bound.get(pool.name, 0),
                                 member_count=int(pool.members.size), degree_limit=pool.spec.degree_limit,
                                 free=max(capacity - used, 0.0))
        old = previous.pools.get(pool.name) if previous is not None else None
        if old is None or abs(old.price - price) > 1e-3 * max(abs(old.price), 1e-9):
            events.append(PlanEvent("ResourcePool", "", pool.name, "Normal", "Priced",
                                    f"Price is {price:.6g} per {pool.spec.resource} (capacity {capacity:g})."))
    return PoolStatuses(out, tuple(events))
