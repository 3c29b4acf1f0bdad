"""Integral allocation: whole replicas on real nodes that maximise the market's objective (issue 33).

Why a package of its own: the market (paper 004, problem (4) with the demand extension of Sec. 7.1) sells time
fractions ``x_ij`` of each pool; what a cluster runs is an integer number of replicas of each job on each node, each
holding exactly its ``demand`` of the priced resource and its whole request vector on one node. Choosing those
replicas is a mechanism in its own right -- a multi-dimensional knapsack over nodes with concave utilities -- with an
exact route (a MILP) and a search route, numerics only, like the five mechanisms beside it (no Kubernetes, typed
result with a status). The planner builds the arrays and applies the result (:mod:`walras.planner.integral`).

The problem (the *fill* of a plan): rows ``i`` (jobs), pools ``j``, nodes ``k`` (each in one pool ``pool[k]``),
resources ``r``. Row i already has ``have[i, j]`` replicas in pool j and may get ``left[i]`` more; one more replica
in pool j costs the vector ``vectors[i, j]`` on one node of pool j that its mask admits, within the node's ``free``
vector on every resource, its ``slots`` (degree limit and free pod slots) and the pool's ``budget`` of the priced
resource (a ``spec.capacity`` override). The objective is the market's: ``sum_i u_i(t_i)`` with ``t_i = sum_j a_ij
n_ij / N_i`` (004 Sec. 2.1: the time fraction of ``n_ij`` of ``N_i`` replicas is ``n_ij / N_i``) and ``u_i`` a
utility of 004 Sec. 2.2. Where ``u_i(0) = -inf`` (log, power with ``p < 0``, alpha-fair with ``alpha >= 1``), a job
with no replica is valued ``u_i(t1) - P |u_i'(t1)| t1`` with ``t1`` its smallest positive throughput and ``P`` =
:data:`STARVED_PENALTY`: starving a job costs ``P`` times the first replica's marginal value, finite so both routes
compare plans.

Routes (the route table; docs/planner.md repeats it):

=========  =====================================================================  =================================
route      when                                                                   gap reported
=========  =====================================================================  =================================
exact      at most :data:`EXACT_CELLS` (row, node) cells that can take a replica,  ``bound - value``: HiGHS' MILP
           solved by HiGHS (branch and bound) within :data:`EXACT_NODES` nodes     bound of the tangent outer
                                                                                  approximation (an upper bound on
                                                                                  the true optimum) minus the true
                                                                                  utility of the plan
search     otherwise, or when the MILP has no answer within its limits (greedy      none (``None``)
           marginal-utility-per-unit fill, best-fit node)
=========  =====================================================================  =================================

Gang rows (``FillProblem.gang``, a FungibleJob's ``spec.replicas.gang``): the job is one indivisible bundle of the
market (004 Sec. 2.1: its time fractions ``n_ij / N_i`` are worth something only as a whole, the demand vector of
Sec. 7.1 taken N times), so a gang row gets exactly its ``left`` replicas, all in one pool (the pool it already has
replicas in, where it has any), or none: the MILP gives it a binary ``g_ij`` per pool with ``sum_k y_ik = left_i
g_ij`` over the pool's cells and ``sum_j g_ij <= 1``; the search adds a whole gang at once (its marginal utility per
unit over all ``left`` replicas, placed best fit one by one on a copy of the room and committed only when all fit)
or nothing (docs/gangs.md).

The search is price-guided in the market's sense: a replica's worth is its marginal utility per unit of the priced
resource it takes (the quantity the market's prices equalise, 004 Sec. 3); replicas are added best first while any
fits. So the search is work-conserving by construction: it stops only when no row with replicas left has a replica
that fits a node with a positive marginal utility. The exact route maximises the same objective over every
arrangement of the new replicas and, being optimal, is work-conserving for strictly increasing utilities; where it
ran, the better of the two routes' plans is kept (the search's when they tie) with the exact route's certificate.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "EXACT_CELLS",
    "EXACT_NODES",
    "EXACT_SECONDS",
    "LOCAL_CELLS",
    "STARVED_PENALTY",
    "FillProblem",
    "FillResult",
    "Utility",
    "fill_exact",
    "fill_search",
    "improve",
    "solve_fill",
    "utility_value",
]

#: Largest number of (row, node) cells the exact route takes (each an integer column of the MILP).
EXACT_CELLS = 400
#: HiGHS' branch-and-bound node limit on the exact route: the route's stop rule. A limit on work, not on time, so
#: a plan is the same plan on a loaded machine as on an idle one (the planner is deterministic). On the 48
#: generated clusters of issue 33 the MILPs that do not finish at the root need 45-2,016 nodes (0.3-1.1 s on one
#: core); a run stopped here keeps its incumbent (never worse than the search's start) and its certified bound.
EXACT_NODES = 1000
#: A safety net on the exact route's time (seconds), far above what :data:`EXACT_NODES` takes on the issue's
#: clusters: only a pathological root LP reaches it, and only then can load change a plan.
EXACT_SECONDS = 5.0
#: A starved job (no replica) is worth its first replica's marginal value times this less than that replica.
STARVED_PENALTY = 10.0
#: Cost of one replica in the exact route's objective, so that of two plans of equal utility the one with fewer
#: replicas wins (a replica of zero marginal utility is not added); the bound is corrected for it.
TIE_COST = 1e-9
#: Float slack in fit checks (decimal quantities summed).
EPS = 1e-9

KINDS = ("linear", "log", "power", "alpha-fair", "target-priority")


@dataclass(frozen=True)
class Utility:
    """``u_i`` per row: ``kind[i]`` an index into :data:`KINDS`, ``weight[i]``, ``param[i]`` (power's exponent,
    alpha-fair's alpha, target-priority's target; unused otherwise), 004 Sec. 2.2."""

    kind: np.ndarray
    weight: np.ndarray
    param: np.ndarray


def _raw(kind: int, w: float, q: float, t: float) -> float:
    """``u(t)`` of one row (``-inf`` where the family is at t = 0)."""
    if kind == 0:
        return w * t
    if kind == 4:
        return w * min(t - q, 0.0)
    if t <= 0.0:
        if kind == 1 or (kind == 2 and q < 0) or (kind == 3 and q >= 1):
            return -math.inf
        return 0.0
    if kind == 1 or (kind == 3 and q == 1):
        return w * math.log(t)
    if kind == 2:
        return w * math.copysign(1.0, q) * t**q
    return w * t ** (1.0 - q) / (1.0 - q)


def _slope(kind: int, w: float, q: float, t: float) -> float:
    """``u'(t)`` (a supergradient at kinks) of one row, ``t > 0``."""
    if kind == 0:
        return w
    if kind == 4:
        return w if t < q else 0.0
    if kind == 1 or (kind == 3 and q == 1):
        return w / t
    if kind == 2:
        return w * abs(q) * t ** (q - 1.0)
    return w * t ** (-q)


def utility_value(u: Utility, i: int, t: float, t1: float) -> float:
    """Row i's utility at throughput ``t``, with the starved value at 0 (module docstring; ``t1`` the row's smallest
    positive throughput)."""
    k, w, q = int(u.kind[i]), float(u.weight[i]), float(u.param[i])
    v = _raw(k, w, q, t)
    if v == -math.inf:
        return _raw(k, w, q, t1) - STARVED_PENALTY * abs(_slope(k, w, q, t1)) * t1
    return v


@dataclass(frozen=True)
class FillProblem:
    """The arrays of the fill (module docstring). Shapes: ``throughput``, ``have`` ``(n, m)``; ``replicas``,
    ``left`` ``(n,)``; ``vectors`` ``(n, m, R)``; ``priced`` ``(m,)`` the column of each pool's priced resource;
    ``free`` ``(K, R)``; ``slots`` ``(K,)``; ``pool`` ``(K,)``; ``masks`` ``(q, K)`` bool with ``mask_of[i]`` row
    i's; ``offered`` ``(n, m)`` bool; ``budget`` ``(m,)`` the priced amount each pool may still give (inf: no
    cap)."""

    throughput: np.ndarray
    replicas: np.ndarray
    have: np.ndarray
    left: np.ndarray
    utility: Utility
    vectors: np.ndarray
    priced: np.ndarray
    free: np.ndarray
    slots: np.ndarray
    pool: np.ndarray
    masks: np.ndarray
    mask_of: np.ndarray
    offered: np.ndarray
    budget: np.ndarray
    #: ``(n,)`` bool or None: rows that take all of ``left`` in one pool or nothing (module docstring)
    gang: np.ndarray | None = None

    def is_gang(self, i: int) -> bool:
        """Whether row i is a gang (all of ``left`` in one pool, or nothing)."""
        return self.gang is not None and bool(self.gang[i])

    def gang_pools(self, i: int) -> np.ndarray:
        """The pools gang row i may take its replicas in: where it has replicas already, else every pool offered."""
        where = self.have[i] > 0
        return (self.offered[i] & where) if where.any() else self.offered[i].copy()

    def rates(self, counts: np.ndarray) -> np.ndarray:
        """``t_i`` of ``counts`` (n, m) replicas: ``sum_j a_ij counts_ij / N_i``."""
        return np.einsum("ij,ij->i", self.throughput, counts) / np.maximum(self.replicas, 1)

    def smallest(self) -> np.ndarray:
        """Per row, the smallest positive throughput one replica gives (``t1`` of the module docstring)."""
        a = np.where(self.offered & (self.throughput > 0), self.throughput, np.inf).min(axis=1)
        return np.where(np.isfinite(a), a, 1.0) / np.maximum(self.replicas, 1)

    def value(self, counts: np.ndarray) -> float:
        """``sum_i u_i(t_i)`` of ``counts`` (n, m) replicas in all (``have`` included), the starved value at 0."""
        t, t1 = self.rates(counts), self.smallest()
        return math.fsum(utility_value(self.utility, i, float(t[i]), float(t1[i])) for i in range(t.size))


@dataclass(frozen=True)
class FillResult:
    """The replicas added: ``row[q]``, ``pool[q]``, ``node[q]`` (indices into the problem's rows, pools, nodes);
    ``route`` ``"exact"`` or ``"search"``; ``value`` the objective of the plan (``have`` plus these); ``bound`` an
    upper bound on the optimum where the exact route certified one (else None), ``gap`` = ``bound - value`` (or
    None); ``status`` HiGHS' model status text on the exact route, ``"ok"`` on the search; ``seconds``."""

    row: np.ndarray
    pool: np.ndarray
    node: np.ndarray
    route: str
    value: float
    bound: float | None = None
    gap: float | None = None
    status: str = "ok"
    seconds: float = 0.0
    counts: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))


def _fits(free: np.ndarray, vec: np.ndarray) -> np.ndarray:
    return np.all(free + EPS * np.maximum(1.0, np.abs(free)) >= vec, axis=-1)


def fill_search(p: FillProblem) -> FillResult:
    """The search route: greedy fill by marginal utility per unit of the pool's priced resource, each replica on
    the admitting node of its pool with room on every resource where it leaves the least of the priced resource
    free (best fit, ties to the lower node index); a (row, pool) with no such node is closed (free room only
    shrinks). Deterministic: ties go to the lower row, then pool."""
    started = time.perf_counter()
    n, m = p.have.shape
    free = p.free.astype(np.float64).copy()
    slots = p.slots.astype(np.int64).copy()
    budget = p.budget.astype(np.float64).copy()
    counts = p.have.astype(np.int64).copy()
    left = p.left.astype(np.int64).copy()
    t = p.rates(counts)
    t1 = p.smallest()
    nodes_of = [np.flatnonzero(p.pool == j) for j in range(m)]
    # the most free per pool and resource over its nodes with a slot: an upper bound for the whole search (free room
    # only shrinks), so a (row, pool) whose vector exceeds it anywhere is closed from the start
    top = np.full((m, free.shape[1]), -1.0)  # a pool with no slot: every vector exceeds it
    for j in range(m):
        at = nodes_of[j][slots[nodes_of[j]] > 0]
        if at.size:
            top[j] = free[at].max(axis=0)
    closed = ~p.offered | np.any(p.vectors > top[None, :, :] + EPS * np.maximum(1.0, np.abs(top[None, :, :])),
                                 axis=2)
    dead: set[tuple[int, int, bytes]] = set()  # (mask, pool, vector bytes) that fits no node any more
    rows: list[int] = []
    pools: list[int] = []
    nodes: list[int] = []
    version = np.zeros(n, dtype=np.int64)
    replicas = np.maximum(p.replicas, 1).astype(np.float64)

    def best(i: int) -> tuple[float, int] | None:
        if left[i] <= 0:
            return None
        now = utility_value(p.utility, i, float(t[i]), float(t1[i]))
        top: tuple[float, int] | None = None
        whole = int(left[i]) if p.is_gang(i) else 1  # a gang's replicas come as one bundle
        allowed = p.gang_pools(i) if p.is_gang(i) else p.offered[i]
        for j in np.flatnonzero(allowed & ~closed[i]).tolist():
            gain = utility_value(p.utility, i, float(t[i] + whole * p.throughput[i, j] / replicas[i]),
                                 float(t1[i])) - now
            if gain <= 1e-12:
                continue
            unit = whole * float(p.vectors[i, j, p.priced[j]])
            density = gain / unit if unit > 0 else math.inf
            if top is None or density > top[0]:
                top = (density, j)
        return top

    heap: list[tuple[float, int, int, int]] = []
    for i in np.flatnonzero((left > 0) & ~closed.all(axis=1)).tolist():
        got = best(i)
        if got is not None:
            heap.append((-got[0], i, got[1], 0))
    heapq.heapify(heap)
    while heap:
        _, i, j, ver = heapq.heappop(heap)
        if ver != version[i] or left[i] <= 0:
            continue
        vec = p.vectors[i, j]
        if p.is_gang(i):  # all of left[i] in pool j, or none
            bundle = _place_gang(p, i, j, int(left[i]), (free, slots, budget), nodes_of[j])
            if bundle is None:
                closed[i, j] = True
            else:
                counts[i, j] += len(bundle)
                t[i] += len(bundle) * p.throughput[i, j] / replicas[i]
                left[i] = 0
                rows.extend([i] * len(bundle))
                pools.extend([j] * len(bundle))
                nodes.extend(bundle)
            version[i] += 1
            again = best(i)
            if again is not None:
                heapq.heappush(heap, (-again[0], i, again[1], int(version[i])))
            continue
        key = (int(p.mask_of[i]), j, vec.tobytes())
        k = -1
        if key not in dead and budget[j] + EPS >= vec[p.priced[j]]:
            cand = nodes_of[j]
            ok = p.masks[p.mask_of[i]][cand] & (slots[cand] > 0)
            ok &= _fits(free[cand], vec)
            if ok.any():
                idx = cand[ok]
                rest = free[idx, p.priced[j]] - vec[p.priced[j]]
                k = int(idx[int(np.argmin(rest))])
            else:
                dead.add(key)
        if k < 0:
            closed[i, j] = True
        else:
            free[k] -= vec
            slots[k] -= 1
            budget[j] -= vec[p.priced[j]]
            counts[i, j] += 1
            left[i] -= 1
            t[i] += p.throughput[i, j] / replicas[i]
            rows.append(i)
            pools.append(j)
            nodes.append(k)
        version[i] += 1
        got = best(i)
        if got is not None:
            heapq.heappush(heap, (-got[0], i, got[1], int(version[i])))
    return FillResult(np.array(rows, dtype=np.int64), np.array(pools, dtype=np.int64), np.array(nodes, dtype=np.int64),
                      "search", p.value(counts), seconds=time.perf_counter() - started, counts=counts)


#: Largest (row, node) fit matrix the local search keeps (rows with replicas left times the problem's nodes);
#: beyond it the search route is the greedy fill alone.
LOCAL_CELLS = 20_000
#: Most passes of the local search (each pass: fill, swaps, ejections; it stops after a pass without a gain).
LOCAL_PASSES = 12


class _Local:
    """The state of the local search (:func:`improve`): the room left on every node (``free``, ``slots``) and pool
    (``budget``), the replicas per (row, pool) and each row's throughput and utility, the new replicas placed so far
    as ``(row, pool, node)`` (``placed``; gang rows' replicas are kept apart and never move), and two caches kept
    current by :meth:`add` and :meth:`remove`: ``gain[i, j]`` the marginal utility of one more replica of row i in
    pool j (``-inf`` where it may take none) and ``fit[i, k]`` whether one fits node k (mask, slot, every
    resource)."""

    def __init__(self, p: FillProblem, start: FillResult) -> None:
        self.p = p
        n, m = p.have.shape
        self.node_vec = p.vectors[:, p.pool, :]  # (n, K, R): row i's replica on node k
        priced = p.priced[p.pool]
        self.unit = np.take_along_axis(self.node_vec, priced[None, :, None], axis=2)[..., 0]  # (n, K)
        self.movable = np.array([not p.is_gang(i) for i in range(n)], dtype=bool)
        self.admit = (p.masks[p.mask_of] & p.offered[:, p.pool] & (p.throughput[:, p.pool] > 0)
                      & self.movable[:, None])
        self.free = p.free.astype(np.float64).copy()
        self.slots = p.slots.astype(np.int64).copy()
        self.budget = p.budget.astype(np.float64).copy()
        self.counts = p.have.astype(np.int64).copy()
        self.left = p.left.astype(np.int64).copy()
        self.N = np.maximum(p.replicas, 1).astype(np.float64)
        self.t1 = p.smallest()
        self.placed: list[tuple[int, int, int]] = []
        self.frozen: list[tuple[int, int, int]] = []
        for i, j, k in zip(start.row.tolist(), start.pool.tolist(), start.node.tolist(), strict=True):
            self.free[k] -= p.vectors[i, j]
            self.slots[k] -= 1
            self.budget[j] -= p.vectors[i, j, p.priced[j]]
            self.counts[i, j] += 1
            self.left[i] -= 1
            (self.placed if self.movable[i] else self.frozen).append((i, j, k))
        self.t = p.rates(self.counts)
        self.vals = np.array([self.value_at(i, float(self.t[i])) for i in range(n)])
        self.gain = np.full((n, m), -np.inf)
        for i in range(n):
            self._gains(i)
        self.fit = np.zeros((n, p.pool.size), dtype=bool)
        self._fits(np.arange(p.pool.size))

    def value_at(self, i: int, t: float) -> float:
        return utility_value(self.p.utility, i, t, float(self.t1[i]))

    def _gains(self, i: int) -> None:
        p = self.p
        self.gain[i] = -np.inf
        if self.left[i] <= 0 or not self.movable[i]:
            return
        for j in np.flatnonzero(p.offered[i] & (p.throughput[i] > 0)).tolist():
            self.gain[i, j] = self.value_at(i, float(self.t[i] + p.throughput[i, j] / self.N[i])) - self.vals[i]

    def _fits(self, ks: np.ndarray) -> None:
        free = self.free[ks]
        room = free + EPS * np.maximum(1.0, np.abs(free))
        self.fit[:, ks] = self.admit[:, ks] & (self.slots[ks] > 0)[None, :] & np.all(
            self.node_vec[:, ks, :] <= room[None, :, :], axis=2)

    def add(self, i: int, k: int) -> None:
        """One more replica of row i on node k (room taken, caches updated)."""
        p = self.p
        j = int(p.pool[k])
        self.free[k] -= self.node_vec[i, k]
        self.slots[k] -= 1
        self.budget[j] -= self.unit[i, k]
        self.counts[i, j] += 1
        self.left[i] -= 1
        self.t[i] += p.throughput[i, j] / self.N[i]
        self.vals[i] = self.value_at(i, float(self.t[i]))
        self.placed.append((i, j, k))
        self._gains(i)
        self._fits(np.array([k]))

    def remove(self, q: int) -> tuple[int, int, int]:
        """Take back new replica ``placed[q]`` (room given back, caches updated); returns it."""
        p = self.p
        i, j, k = self.placed.pop(q)
        self.free[k] += self.node_vec[i, k]
        self.slots[k] += 1
        self.budget[j] += self.unit[i, k]
        self.counts[i, j] -= 1
        self.left[i] += 1
        self.t[i] -= p.throughput[i, j] / self.N[i]
        self.vals[i] = self.value_at(i, float(self.t[i]))
        self._gains(i)
        self._fits(np.array([k]))
        return i, j, k

    def best_add(self, block: tuple[int, int] | None = None) -> tuple[int, int] | None:
        """The replica the greedy fill adds next: the (row, node) of the highest marginal utility per unit of the
        pool's priced resource that fits (within the pool's budget), on the node of its pool where it leaves the
        least of that resource free; ``block`` a (row, pool) left out; None when no replica of positive gain
        fits."""
        p = self.p
        gain = self.gain[:, p.pool]
        ok = self.fit & (gain > 1e-12) & (self.unit <= self.budget[p.pool][None, :] + EPS)
        if block is not None:
            ok[block[0], p.pool == block[1]] = False
        if not ok.any():
            return None
        density = np.where(ok, gain / np.maximum(self.unit, 1e-12), -np.inf)
        i = int(np.argmax(density) // density.shape[1])
        j = int(p.pool[int(np.argmax(density[i]))])
        at = np.flatnonzero(ok[i] & (p.pool == j))
        c = int(p.priced[j])
        return i, int(at[int(np.argmin(self.free[at, c] - self.unit[i, at]))])

    def fill(self, block: tuple[int, int] | None = None, most: int = 1 << 30) -> int:
        """Greedy fill (:meth:`best_add`) of at most ``most`` replicas, ``block`` left out of the first; returns
        how many were added."""
        added = 0
        while added < most:
            got = self.best_add(block if added == 0 else None)
            if got is None:
                break
            self.add(*got)
            added += 1
        return added

    def total(self) -> float:
        return math.fsum(self.vals.tolist())

    def better(self, value: float, than: float) -> bool:
        return value > than + 1e-9 * max(1.0, abs(than))

    def eject(self) -> bool:
        """One pass of ejections: each new replica in turn is taken back and the room refilled greedily (its own
        (row, pool) left out of the first refill); kept where the total utility rises, else undone. Returns whether
        any was kept."""
        kept = False
        q = 0
        while q < len(self.placed):
            before = self.total()
            i, j, k = self.remove(q)
            added = self.fill(block=(i, j), most=4)
            if self.better(self.total(), before):
                kept = True
                continue  # placed[q] is now the next replica
            for _ in range(added):
                self.remove(len(self.placed) - 1)
            self.add(i, k)
            self.placed.insert(q, self.placed.pop())
            q += 1
        return kept

    def swap(self) -> bool:
        """Swaps across pools: replicas (i, node k of pool j) and (i', node k' of pool j'), i != i', j != j',
        exchange nodes where both fit after the exchange and the total utility rises (the comparative advantage
        the market's prices measure, 004 Sec. 3); best exchange first, until none is left. Returns whether any
        was made."""
        p = self.p
        made = False
        for _ in range(4 * max(len(self.placed), 1)):
            R = len(self.placed)
            if R < 2:
                break
            rows = np.array([r[0] for r in self.placed])
            pools = np.array([r[1] for r in self.placed])
            nodes = np.array([r[2] for r in self.placed])
            mv = np.full((R, p.have.shape[1]), -np.inf)
            for r, (i, j, _) in enumerate(self.placed):
                base = float(self.t[i] - p.throughput[i, j] / self.N[i])
                for j2 in np.flatnonzero(p.offered[i] & (p.throughput[i] > 0)).tolist():
                    if j2 != j:
                        mv[r, j2] = self.value_at(i, base + p.throughput[i, j2] / self.N[i]) - self.vals[i]
            delta = mv[:, pools] + mv[:, pools].T  # delta[a, b]: a to b's pool, b to a's pool
            delta[(rows[:, None] == rows[None, :]) | (pools[:, None] == pools[None, :])] = -np.inf
            delta[~self.admit[rows[:, None], nodes[None, :]] | ~self.admit[rows[None, :], nodes[:, None]]] = -np.inf
            order = np.argsort(-delta, axis=None, kind="stable")
            done = False
            for flat in order.tolist():
                a, b = divmod(flat, R)
                if not delta[a, b] > 1e-9 * max(1.0, abs(self.total())):
                    break
                if a > b:
                    continue  # each pair once (delta is symmetric)
                (i, j, k), (i2, j2, k2) = self.placed[a], self.placed[b]
                into_k2 = self.free[k2] + self.node_vec[i2, k2] - self.node_vec[i, k2]
                into_k = self.free[k] + self.node_vec[i, k] - self.node_vec[i2, k]
                if (into_k2 < -EPS * np.maximum(1.0, np.abs(self.free[k2]))).any() or (
                        into_k < -EPS * np.maximum(1.0, np.abs(self.free[k]))).any():
                    continue
                if (self.budget[j] + self.unit[i, k] - self.unit[i2, k] < -EPS
                        or self.budget[j2] + self.unit[i2, k2] - self.unit[i, k2] < -EPS):
                    continue
                self.remove(b)
                self.remove(a)
                self.add(i, k2)
                self.add(i2, k)
                done = made = True
                break
            if not done:
                break
        return made

    def result(self, route: str, seconds: float) -> FillResult:
        rows = [r[0] for r in (*self.frozen, *self.placed)]
        pools = [r[1] for r in (*self.frozen, *self.placed)]
        nodes = [r[2] for r in (*self.frozen, *self.placed)]
        return FillResult(np.array(rows, dtype=np.int64), np.array(pools, dtype=np.int64),
                          np.array(nodes, dtype=np.int64), route, self.p.value(self.counts), seconds=seconds,
                          counts=self.counts.copy())


def improve(p: FillProblem, start: FillResult, passes: int = LOCAL_PASSES) -> FillResult:
    """The local search of the search route, from the plan ``start`` (its new replicas; ``have`` fixed): repeated
    passes of a greedy fill (:meth:`_Local.best_add`, so the plan stays work-conserving), swaps of two jobs'
    replicas across pools (:meth:`_Local.swap`) and ejections (:meth:`_Local.eject`: one replica out, the room
    refilled greedily), each move kept only where ``sum_i u_i(t_i)`` rises, until a pass gains nothing or after
    ``passes``. Gang rows' replicas stay as they are. Deterministic (every choice breaks ties by index). Returns
    the plan with ``start``'s route, its value at least ``start``'s."""
    started = time.perf_counter()
    state = _Local(p, start)
    for _ in range(passes):
        before = state.total()
        state.fill()
        state.swap()
        state.eject()
        state.fill()
        if not state.better(state.total(), before):
            break
    out = state.result(start.route, start.seconds + time.perf_counter() - started)
    if out.value < start.value:  # float noise only: never worse than the start
        return start
    return out


def _place_gang(p: FillProblem, i: int, j: int, count: int, room: tuple[np.ndarray, np.ndarray, np.ndarray],
                cand: np.ndarray) -> list[int] | None:
    """Gang row i's ``count`` replicas in pool j, each best fit (the admitting node with a slot and room on every
    resource that leaves the least of the priced resource free, ties to the lower node), tried on a copy of the
    room; when all fit, the room (``free``, ``slots``, ``budget``, changed in place) is taken and the nodes are
    returned, else None and nothing changes."""
    free, slots, budget = room
    vec = p.vectors[i, j]
    c = int(p.priced[j])
    if budget[j] + EPS < count * vec[c]:
        return None
    f, s = free[cand].copy(), slots[cand].copy()
    mask = p.masks[p.mask_of[i]][cand]
    out: list[int] = []
    for _ in range(count):
        ok = mask & (s > 0) & _fits(f, vec)
        if not ok.any():
            return None
        at = np.flatnonzero(ok)
        q = int(at[int(np.argmin(f[at, c] - vec[c]))])
        f[q] -= vec
        s[q] -= 1
        out.append(int(cand[q]))
    free[cand] = f
    slots[cand] = s
    budget[j] -= count * vec[c]
    return out


def fill_cells(p: FillProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (row, node) cells that can take at least one replica, with the most each can take."""
    rows: list[int] = []
    nodes: list[int] = []
    caps: list[float] = []
    for i in np.flatnonzero(p.left > 0).tolist():
        mask = p.masks[p.mask_of[i]]
        for j in np.flatnonzero(p.gang_pools(i) if p.is_gang(i) else p.offered[i]).tolist():
            vec = p.vectors[i, j]
            cand = np.flatnonzero((p.pool == j) & mask & (p.slots > 0))
            if cand.size == 0:
                continue
            need = vec > 0
            if need.any():
                room = np.floor((np.maximum(p.free[cand][:, need], 0.0) + EPS) / vec[need]).min(axis=1)
            else:
                room = np.full(cand.size, float(p.left[i]))
            cap = np.minimum(np.minimum(room, p.slots[cand]), p.left[i])
            keep = cap >= 1
            rows.extend([i] * int(keep.sum()))
            nodes.extend(cand[keep].tolist())
            caps.extend(cap[keep].tolist())
    return np.array(rows, dtype=np.int64), np.array(nodes, dtype=np.int64), np.array(caps, dtype=np.float64)


def _mip(ncol: int, columns: tuple[np.ndarray, np.ndarray, np.ndarray],
         rows: tuple[list[float], list[float], list[int], list[int], list[float]], integers: int,
         time_limit: float, max_nodes: int = EXACT_NODES) -> Any:
    """A HiGHS object holding the MILP ``min cost^T x`` over the row-wise (CSR) rows, the first ``integers``
    columns integer, quiet, within ``max_nodes`` branch-and-bound nodes and ``time_limit`` seconds (not yet run;
    the node limit is the stop rule, :data:`EXACT_NODES`); None when HiGHS rejects
    the model. The core object, as :mod:`allocator._highs` uses it (no banner on standard output); HiGHS' thread
    count is left alone (a process that ran HiGHS before refuses a change, and the run then fails)."""
    import highspy
    from highspy import _core

    cost, lower, upper = columns
    row_lo, row_hi, indptr, idx, val = rows
    lp = highspy.HighsLp()
    lp.num_col_ = ncol
    lp.num_row_ = len(row_lo)
    lp.col_cost_ = cost
    inf = highspy.kHighsInf
    lp.col_lower_ = np.clip(lower, -inf, inf)
    lp.col_upper_ = np.clip(upper, -inf, inf)
    lp.row_lower_ = np.clip(np.array(row_lo), -inf, inf)
    lp.row_upper_ = np.clip(np.array(row_hi), -inf, inf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = ncol
    lp.a_matrix_.num_row_ = len(row_lo)
    lp.a_matrix_.start_ = np.array(indptr, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(idx, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(val, dtype=np.float64)
    lp.integrality_ = [highspy.HighsVarType.kInteger] * integers + [highspy.HighsVarType.kContinuous] * (
        ncol - integers)
    h = _core._Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_max_nodes", int(max_nodes))
    h.setOptionValue("mip_rel_gap", 1e-6)
    if h.passModel(lp) != highspy.HighsStatus.kOk:
        return None
    return h


def fill_exact(p: FillProblem, time_limit: float = EXACT_SECONDS,
               cells: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
               start: FillResult | None = None) -> FillResult | None:
    """The exact route: the MILP ``max sum_i z_i`` over integer replicas ``y_ik`` per (row, node) cell, with node
    fit on every resource, slots, the pools' budgets and ``sum_k y_ik <= left_i``, where ``z_i`` is bounded by
    tangents of ``u_i`` (outer approximation of a concave function: its tangents lie above it, so the MILP's bound is
    an upper bound on the true optimum; 004 Sec. 3's concavity) at a geometric grid of throughputs, and by the chord
    to the starved value where ``u_i(0) = -inf``. The plan's true objective is re-evaluated; ``gap`` is the bound
    minus it. ``start`` (a plan of the same problem, e.g. the search's) is given to HiGHS as its first incumbent,
    so the solution it returns within ``time_limit`` is never worse in the MILP's objective. Returns None when
    HiGHS finds no solution in ``time_limit``."""
    started = time.perf_counter()
    n, m = p.have.shape
    rows, nodes, caps = cells if cells is not None else fill_cells(p)
    c = rows.size
    if c == 0:  # no replica fits anywhere: the plan as it is is the optimum
        value = p.value(p.have)
        empty = np.zeros(0, dtype=np.int64)
        return FillResult(empty, empty, empty, "exact", value, value, 0.0, "Optimal", time.perf_counter() - started,
                          p.have.astype(np.int64).copy())
    t0 = p.rates(p.have)
    t1 = p.smallest()
    replicas = np.maximum(p.replicas, 1).astype(np.float64)
    pool_of_cell = p.pool[nodes]
    coef = p.throughput[rows, pool_of_cell] / replicas[rows] if c else np.zeros(0)
    live = np.flatnonzero(p.left > 0)
    # a binary g per (gang row, pool with cells): the row's cells in the pool sum to left * g, at most one g is 1
    bundles = sorted({(int(rows[q]), int(pool_of_cell[q])) for q in range(c) if p.is_gang(int(rows[q]))})
    g = len(bundles)
    zcol = {int(i): c + g + q for q, i in enumerate(live.tolist())}
    ncol = c + g + live.size
    cost = np.full(ncol, TIE_COST)  # a replica that adds no utility is not worth adding (ties: fewer replicas)
    cost[c:c + g] = 0.0
    cost[c + g:] = -1.0
    lower = np.zeros(ncol)
    upper = np.concatenate([caps, np.ones(g), np.full(live.size, np.inf)])
    lower[c + g:] = -np.inf
    row_lo: list[float] = []
    row_hi: list[float] = []
    indptr = [0]
    idx: list[int] = []
    val: list[float] = []

    def add(cols: list[int], vals: list[float], lo: float, hi: float) -> None:
        idx.extend(cols)
        val.extend(vals)
        indptr.append(len(idx))
        row_lo.append(lo)
        row_hi.append(hi)

    # node fit (every resource) and slots
    order = np.argsort(nodes, kind="stable")
    for k in np.unique(nodes).tolist():
        at = order[np.searchsorted(nodes[order], k, side="left"):np.searchsorted(nodes[order], k, side="right")]
        for r in range(p.free.shape[1]):
            amounts = p.vectors[rows[at], pool_of_cell[at], r]
            if np.any(amounts > 0):
                add(at.tolist(), amounts.tolist(), -np.inf, float(p.free[k, r]) + EPS * max(1.0, abs(p.free[k, r])))
        add(at.tolist(), [1.0] * at.size, -np.inf, float(p.slots[k]))
    for j in range(m):
        at = np.flatnonzero(pool_of_cell == j)
        if at.size and math.isfinite(p.budget[j]):
            add(at.tolist(), p.vectors[rows[at], j, p.priced[j]].tolist(), -np.inf, float(p.budget[j]) + EPS)
    for b, (i, j) in enumerate(bundles):  # a gang: all of left in one pool, or none
        at = np.flatnonzero((rows == i) & (pool_of_cell == j))
        add([*at.tolist(), c + b], [1.0] * at.size + [-float(p.left[i])], 0.0, 0.0)
    for i in sorted({i for i, _ in bundles}):
        add([c + b for b, (r, _) in enumerate(bundles) if r == i], [1.0] * sum(r == i for r, _ in bundles), -np.inf,
            1.0)
    # per row: replicas left, and z_i <= tangent cuts at t in a grid (t = t0_i + sum coef y)
    for i in live.tolist():
        at = np.flatnonzero(rows == i)
        zi = zcol[i]
        if at.size:
            add(at.tolist(), [1.0] * at.size, -np.inf, float(p.left[i]))
        k, w, q = int(p.utility.kind[i]), float(p.utility.weight[i]), float(p.utility.param[i])
        top = float(t0[i] + (coef[at].max() if at.size else 0.0) * p.left[i])
        lo = max(float(t0[i]), float(t1[i]))
        points = [float(t0[i])] if t0[i] > 0 else []
        if top > lo:
            points += np.geomspace(lo, top, 16).tolist()
        else:
            points.append(lo)
        if k == 4:
            points = [float(q) * 0.5, float(q) * 2.0]  # two pieces: w (t - target) and 0
        for tp in points:
            slope = _slope(k, w, q, tp)
            base = utility_value(p.utility, i, tp, float(t1[i])) - slope * tp  # cut: z <= base + slope t
            add([zi, *at.tolist()], [1.0, *(-slope * coef[at]).tolist()], -np.inf, base + slope * float(t0[i]))
        if t0[i] <= 0 and _raw(k, w, q, 0.0) == -math.inf:
            v0 = utility_value(p.utility, i, 0.0, float(t1[i]))
            chord = (_raw(k, w, q, float(t1[i])) - v0) / float(t1[i])
            add([zi, *at.tolist()], [1.0, *(-chord * coef[at]).tolist()], -np.inf, v0)
    h = _mip(ncol, (cost, lower, upper), (row_lo, row_hi, indptr, idx, val), c + g, time_limit)
    if h is None:
        return None
    if start is not None:
        _incumbent(h, p, (rows, nodes, pool_of_cell), bundles, zcol, ncol, start)
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    info = h.getInfo()
    if info.primal_solution_status < 2:  # no feasible solution
        return None
    x = np.asarray(h.getSolution().col_value, dtype=np.float64)
    y = np.rint(x[:c]).astype(np.int64) if c else np.zeros(0, dtype=np.int64)
    counts = p.have.astype(np.int64).copy()
    out_rows, out_pools, out_nodes = [], [], []
    for q in np.flatnonzero(y > 0).tolist():
        counts[rows[q], pool_of_cell[q]] += y[q]
        out_rows += [int(rows[q])] * int(y[q])
        out_pools += [int(pool_of_cell[q])] * int(y[q])
        out_nodes += [int(nodes[q])] * int(y[q])
    # objective constant: the rows with no replica left keep their value
    fixed = math.fsum(utility_value(p.utility, i, float(t0[i]), float(t1[i]))
                      for i in range(n) if p.left[i] <= 0)
    bound = fixed - float(info.mip_dual_bound) + TIE_COST * float(p.left[live].sum())
    value = p.value(counts)
    return FillResult(np.array(out_rows, dtype=np.int64), np.array(out_pools, dtype=np.int64),
                      np.array(out_nodes, dtype=np.int64), "exact", value, bound, max(bound - value, 0.0), status,
                      time.perf_counter() - started, counts)


def _incumbent(h: Any, p: FillProblem, cells: tuple[np.ndarray, np.ndarray, np.ndarray],
               bundles: list[tuple[int, int]], zcol: dict[int, int], ncol: int, start: FillResult) -> None:
    """Give HiGHS ``start`` as a feasible solution of the exact route's MILP: its replicas per cell, each gang's
    pool binary, and ``z_i`` the row's true utility (below every tangent and the chord, concavity)."""
    import highspy

    rows, nodes = cells[0], cells[1]
    at = {(int(i), int(k)): q for q, (i, k) in enumerate(zip(rows.tolist(), nodes.tolist(), strict=True))}
    x = np.zeros(ncol)
    for i, k in zip(start.row.tolist(), start.node.tolist(), strict=True):
        q = at.get((int(i), int(k)))
        if q is None:  # a replica the cells do not cover: no start
            return
        x[q] += 1.0
    c = rows.size
    for b, (i, j) in enumerate(bundles):
        x[c + b] = 1.0 if start.counts[i, j] - p.have[i, j] > 0 else 0.0
    t, t1 = p.rates(start.counts), p.smallest()
    for i, col in zcol.items():
        v = utility_value(p.utility, i, float(t[i]), float(t1[i]))
        x[col] = v - 1e-7 * max(1.0, abs(v))
    sol = highspy.HighsSolution()
    sol.col_value = x.tolist()
    sol.value_valid = True
    h.setSolution(sol)


def solve_fill(p: FillProblem, *, exact_cells: int = EXACT_CELLS, time_limit: float = EXACT_SECONDS,
               local_cells: int = LOCAL_CELLS) -> FillResult:
    """The fill by the route table (module docstring): the search always (the greedy fill, then the local search
    :func:`improve` where the rows with replicas left times the nodes are at most ``local_cells``); the exact route
    as well where the problem has at most ``exact_cells`` (row, node) cells, started from the search's plan, its
    plan improved by the local search in turn (a time-limited incumbent is not optimal), keeping the exact plan when
    its value is above the search's (then with its certified gap)."""
    search = fill_search(p)
    if not (p.left > 0).any():
        return search
    local = int((p.left > 0).sum()) * p.pool.size <= local_cells
    if local:
        search = improve(p, search)
    found = fill_cells(p)
    if found[0].size == 0 or found[0].size > exact_cells:
        return search
    exact = fill_exact(p, time_limit, found, start=search)
    if exact is None:
        return search
    if local:
        better = improve(p, exact)
        exact = FillResult(better.row, better.pool, better.node, "exact", better.value, exact.bound,
                           max(exact.bound - better.value, 0.0) if exact.bound is not None else None, exact.status,
                           better.seconds, better.counts)
    if exact.value > search.value + 1e-9 * max(1.0, abs(search.value)):
        return FillResult(exact.row, exact.pool, exact.node, "exact", exact.value, exact.bound, exact.gap,
                          exact.status, search.seconds + exact.seconds, exact.counts)
    # the search's plan is as good: it keeps the exact route's certificate (the bound holds for every plan)
    gap = max(exact.bound - search.value, 0.0) if exact.bound is not None else None
    return FillResult(search.row, search.pool, search.node, "exact", search.value, exact.bound, gap, exact.status,
                      search.seconds + exact.seconds, search.counts)
