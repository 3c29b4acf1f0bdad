"""Super-optimal allocation (Definition V.1, Lai et al.): the best split of the pooled ``total = m C`` units among
all threads as if the ``m`` servers were one, each thread still taking at most ``C`` units. Its utility ``F_hat`` is an
upper bound on the AA optimum (Lemma V.2), and the allocation ``c_hat`` drives Algorithms 1, 2 and AANC.

- :func:`super_optimal_concave` -- concave curves: bisection on the common marginal utility ``lam`` (Galil [12]):
  every thread takes the units whose marginal utility is at least ``lam``; ``sum_i demand_i(lam)`` is nonincreasing
  in ``lam`` and the bisection finds where it crosses ``total``. Exact on integer units (see the function).
  ``O(n log C)`` per demand evaluation for generic families, ``O(nK)`` for piecewise-linear ones, times the number of
  bisection steps (at most ~60 in double precision): the ``O(n (log mC)^2)`` bound of Theorem V.19.
- :func:`super_optimal_dp` -- any nondecreasing curves (Section VII's nonconcave case): exact dynamic programme over
  units ``F_k(x) = max_{0 <= z <= min(x, C)} f_k(z) + F_{k-1}(x - z)``. Time ``O(n * total * C)``, memory
  ``O(n * total)`` int32 back-pointers plus a bounded working block. It stands in for the INFOCOM'15 algorithm [10]
  (which exploits the ``s`` concave/convex segments); the DP needs no segment structure. Each transition costs about
  a nanosecond vectorised (``n = 100, total = 800, C = 100``, i.e. 8e6 transitions, takes about 13 ms on the bench
  machine), so ``n * total * C`` up to ~1e9 runs in seconds; above ``DP_MAX_WORK`` it refuses with ``ValueError``.
- :func:`reallocate` -- beyond the paper, run by default after Algorithms 1, 2 and AANC (``refine=True``): the
  optimal split of every server's units among the threads assigned to it, by the same two methods applied per server
  (per-server bisection for concave curves; :func:`reallocate_dp`, an exact DP vectorised over servers, otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import ArrayLike

from .curves import CurveFamily, IntArray

#: Largest ``n * (total + 1) * (C + 1)`` the exact dynamic programme accepts.
DP_MAX_WORK = 4_000_000_000


@dataclass(frozen=True)
class SuperOptimal:
    """``amount[i]`` = ``c_hat_i``, ``utility`` = ``F_hat``; ``lam`` is the common marginal utility found by the
    bisection (``nan`` for the dynamic programme); ``method`` says which solver ran."""

    amount: IntArray
    utility: float
    lam: float
    method: str


def super_optimal_concave(curves: CurveFamily, total: int, *, rel_tol: float = 1e-13) -> SuperOptimal:
    """Super-optimal allocation for concave curves by bisection on the marginal utility (Galil's approach [12]).

    With ``D(lam) = sum_i demand_i(lam)`` (units of marginal utility ``>= lam``), the greedy optimum of a separable
    concave resource allocation takes the ``total`` largest marginals. If all units of positive marginal fit
    (``D(0+) <= total``), every thread takes them. Otherwise bisection keeps ``D(hi) <= total < D(lo)``, giving each
    thread ``demand_i(hi)`` units; the ``R = total - D(hi)`` units still free go to the candidate units with marginal in
    ``[lo, hi)``, best first marginal first. When the bracket is below floating-point resolution these candidates are
    ties, so the result is optimal on integer units up to ``R * (hi - lo)``, i.e. to rounding.
    """
    n, C = curves.n, curves.capacity
    total = int(total)
    if total < 0:
        raise ValueError(f"total capacity must be >= 0; got {total}")
    pos = curves.demand(0.0, strict=True)
    if int(pos.sum()) <= total:
        amount = pos
        lam = 0.0
    else:
        hi = curves.max_first_marginal()
        hi = hi * (1.0 + 1e-12) + 1e-300
        lo = 0.0
        base = np.zeros(n, dtype=np.int64)
        base_sum = 0
        top = pos
        for _ in range(200):
            if hi - lo <= rel_tol * hi:
                break
            mid = 0.5 * (lo + hi)
            if mid <= lo or mid >= hi:
                break
            d = curves.demand(mid)
            s = int(d.sum())
            if s > total:
                lo, top = mid, d
            else:
                hi, base, base_sum = mid, d, s
                if s == total:
                    break
        rest = total - base_sum
        amount = base.copy()
        if rest > 0:
            extra = top - base
            cand = np.flatnonzero(extra > 0)
            first = curves.evaluate(base[cand] + 1, cand) - curves.evaluate(base[cand], cand)
            order = cand[np.argsort(-first, kind="stable")]
            cum = np.cumsum(extra[order])
            give = np.minimum(extra[order], np.maximum(rest - (cum - extra[order]), 0))
            amount[order] += give
        lam = hi
    amount = np.minimum(amount, C)
    utility = float(curves.evaluate(amount).sum())
    return SuperOptimal(amount=amount.astype(np.int64), utility=utility, lam=float(lam), method="bisection")


def super_optimal_dp(curves: CurveFamily, total: int) -> SuperOptimal:
    """Exact super-optimal allocation for arbitrary nondecreasing curves (Section VII) by dynamic programming over
    units: ``F_0 = 0``; ``F_k(x) = max_{0 <= z <= min(x, C)} f_k(z) + F_{k-1}(x - z)``; ``F_hat = F_n(total)``,
    allocation recovered by back-pointers. Ties prefer fewer units. Vectorised over ``x`` with a sliding window."""
    n, C = curves.n, curves.capacity
    total = int(total)
    if total < 0:
        raise ValueError(f"total capacity must be >= 0; got {total}")
    M = min(total, n * C)
    work = n * (M + 1) * (C + 1)
    if work > DP_MAX_WORK:
        raise ValueError(
            f"exact DP needs n*(total+1)*(C+1) = {work:.3g} steps (limit {DP_MAX_WORK:.1g}); "
            "use concave curves (bisection) or fewer units"
        )
    table = curves.table()
    F = np.zeros(M + 1)
    choice = np.zeros((n, M + 1), dtype=np.int32)
    neg = np.full(C, -np.inf)
    chunk = max(1, 4_000_000 // (C + 1))  # bounds the (x, z) candidate block to ~32 MB
    for k in range(n):
        padded = np.concatenate([neg, F])
        # win[x, t] = padded[x + t] = F[x + t - C]; reversed so column z holds F[x - z]
        win = sliding_window_view(padded, C + 1)[:, ::-1]
        newF = np.empty(M + 1)
        for a in range(0, M + 1, chunk):
            cand = win[a : a + chunk] + table[k][None, :]
            z = np.argmax(cand, axis=1)
            choice[k, a : a + chunk] = z
            newF[a : a + chunk] = cand[np.arange(cand.shape[0]), z]
        F = newF
    amount = np.zeros(n, dtype=np.int64)
    x = M
    for k in range(n - 1, -1, -1):
        z = int(choice[k, x])
        amount[k] = z
        x -= z
    utility = float(table[np.arange(n), amount].sum())
    return SuperOptimal(amount=amount, utility=utility, lam=float("nan"), method="dp")


def super_optimal(curves: CurveFamily, total: int, *, method: str = "auto") -> SuperOptimal:
    """Super-optimal allocation (Definition V.1) with ``total = sum of server capacities`` pooled units.

    ``method="auto"`` uses the bisection when every curve is concave and the exact DP otherwise; ``"bisection"`` and
    ``"dp"`` force one (the bisection on nonconcave curves raises ``ValueError`` naming the first nonconcave thread).
    """
    if method == "dp":
        return super_optimal_dp(curves, total)
    concave = curves.concave()
    if method == "bisection" or (method == "auto" and concave.all()):
        if not concave.all():
            raise ValueError(
                f"thread {int(np.argmin(concave))}: curve is not concave; the bisection needs concave curves"
            )
        return super_optimal_concave(curves, total)
    if method == "auto":
        return super_optimal_dp(curves, total)
    raise ValueError(f"unknown super-optimal method {method!r}; expected 'auto', 'bisection' or 'dp'")


def _rank_on_server(g: IntArray, m: int) -> tuple[IntArray, IntArray]:
    """``(k, rank)``: threads per server, and each thread's 0-based position among its server's threads (by index)."""
    n = g.size
    k = np.bincount(g, minlength=m)
    order = np.argsort(g, kind="stable")
    start = np.concatenate([[0], np.cumsum(k)[:-1]])
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - start[g[order]]
    return k.astype(np.int64), rank


def reallocate_dp(table: ArrayLike, server: ArrayLike, capacities: ArrayLike) -> IntArray:
    """Exact per-server split for arbitrary nondecreasing curves (the nonconcave case of Section VII, one server at a
    time): on server ``j`` with threads ``i_1 < ... < i_k``, ``F_r(x) = max_{0 <= z <= x} f_{i_r}(z) + F_{r-1}(x - z)``
    for ``x = 0..C_j``, ``F_0 = 0``; the split is recovered from the back-pointers at ``x = C_j``. Ties prefer fewer
    units for the later thread.

    Vectorised over servers: step ``r`` updates, for every server at once, the value function with its ``r``-th
    thread (a ``(servers, C_max + 1, C + 1)`` candidate block, chunked to ~32 MB). Time
    ``O(sum_j k_j (C_j + 1) (C + 1))`` = ``O(n C_max C)`` with ``max_j k_j`` numpy steps; memory ``O(n C_max)`` int32
    back-pointers. For Section VIII's sizes (``n <= 120, C = 100``) that is ~1.2e6 transitions, a few ms; above
    ``DP_MAX_WORK`` transitions it refuses with ``ValueError``."""
    t = np.asarray(table, dtype=np.float64)
    g = np.asarray(server, dtype=np.int64)
    caps = np.asarray(capacities, dtype=np.int64)
    n, W = t.shape
    m = caps.size
    if g.shape != (n,) or (g < 0).any() or (g >= m).any():
        raise ValueError("server must hold one server index in [0, m) per thread")
    k, rank = _rank_on_server(g, m)
    work = int((k * (caps + 1)).sum()) * W
    if work > DP_MAX_WORK:
        raise ValueError(
            f"exact per-server DP needs {work:.3g} transitions (limit {DP_MAX_WORK:.1g}); use concave curves"
        )
    X = int(caps.max())
    F = np.zeros((m, X + 1))
    choice = np.zeros((n, X + 1), dtype=np.int32)
    by_rank = np.argsort(rank, kind="stable")
    rank_start = np.concatenate([[0], np.cumsum(np.bincount(rank, minlength=int(k.max()) if n else 0))])
    chunk = max(1, 4_000_000 // ((X + 1) * W))
    neg = np.full((1, W - 1), -np.inf)
    for r in range(rank_start.size - 1):
        idx_r = by_rank[rank_start[r] : rank_start[r + 1]]  # at most one thread per server
        for a in range(0, idx_r.size, chunk):
            idx = idx_r[a : a + chunk]
            srv = g[idx]
            padded = np.concatenate([np.repeat(neg, idx.size, axis=0), F[srv]], axis=1)
            # win[s, x, z] = padded[s, x + W - 1 - z] = F[srv[s], x - z] (-inf when z > x)
            win = sliding_window_view(padded, W, axis=1)[:, :, ::-1]
            cand = win + t[idx][:, None, :]
            z = np.argmax(cand, axis=2)
            choice[idx] = z
            F[srv] = np.take_along_axis(cand, z[:, :, None], axis=2)[:, :, 0]
    amount = np.zeros(n, dtype=np.int64)
    x = caps.copy()
    for r in range(rank_start.size - 2, -1, -1):
        idx = by_rank[rank_start[r] : rank_start[r + 1]]
        z = choice[idx, x[g[idx]]].astype(np.int64)
        amount[idx] = z
        x[g[idx]] -= z
    return amount


def _reallocate_concave(curves: CurveFamily, g: IntArray, caps: IntArray, rel_tol: float) -> IntArray:
    """Per-server bisection on the marginal price (concave curves): :func:`super_optimal_concave` run for every server
    at once, with one price bracket per server."""
    n, m = curves.n, caps.size
    pos = curves.demand(0.0, strict=True)
    fits = np.bincount(g, weights=pos, minlength=m) <= caps
    done = fits.copy()
    one = np.ones(n, dtype=np.int64)
    first = curves.evaluate(one) - curves.evaluate(0 * one) if curves.capacity > 0 else np.zeros(n)
    hi = np.zeros(m)
    np.maximum.at(hi, g, first)  # per-server largest marginal: no unit has a marginal above it
    hi = hi * (1.0 + 1e-12) + 1e-300
    lo = np.zeros(m)
    base = np.zeros(n, dtype=np.int64)
    top = pos.copy()
    for _ in range(200):
        # a server is settled once its bracket is below resolution, its demand meets its capacity exactly, or only
        # one thread still has units with marginal in [lo, hi): the fill below then hands them out in exact order
        # (that thread's own units, best first; every other thread's next unit has marginal < lo).
        split = np.bincount(g, weights=(top > base), minlength=m)
        active = ~done & (hi - lo > rel_tol * hi) & (split > 1)
        if not active.any():
            break
        mid = np.where(active, 0.5 * (lo + hi), hi)
        d = curves.demand(mid[g])
        s = np.bincount(g, weights=d, minlength=m)
        over = active & (s > caps)
        under = active & (s <= caps)
        lo = np.where(over, mid, lo)
        hi = np.where(under, mid, hi)
        top = np.where(over[g], d, top)
        base = np.where(under[g], d, base)
        done |= under & (s == caps)
    amount = np.where(fits[g], pos, base)
    rest = caps - np.bincount(g, weights=amount, minlength=m).astype(np.int64)
    extra = np.where(fits[g], 0, top - base)
    cand = np.flatnonzero(extra > 0)
    if cand.size:
        first = curves.evaluate(base[cand] + 1, cand) - curves.evaluate(base[cand], cand)
        order = cand[np.lexsort((-first, g[cand]))]
        ex = extra[order]
        grp = g[order]
        cum = np.cumsum(ex)
        start = np.concatenate([[0], cum[:-1]])
        # units already handed out within the same group before this candidate
        first_of_group = np.concatenate([[True], grp[1:] != grp[:-1]])
        group_offset = np.maximum.accumulate(np.where(first_of_group, start, 0))
        before = start - group_offset
        give = np.minimum(ex, np.maximum(rest[grp] - before, 0))
        amount[order] += give
    return np.minimum(amount, curves.capacity).astype(np.int64)


def reallocate(
    curves: CurveFamily,
    server: ArrayLike,
    capacities: ArrayLike,
    *,
    current: ArrayLike | None = None,
    rel_tol: float = 1e-13,
) -> IntArray:
    """Optimal allocation for a *fixed* assignment: each server ``j`` splits its ``C_j`` units among its own threads
    to maximise their total utility (Definition V.1 applied server by server, i.e. the single-server problem of [12]).

    This post-step is *not* part of the paper's pseudocode (Algorithms 1 and 2 keep what a server has left, Lemma
    V.7); Walras runs it by default after them (``assign_and_allocate(..., refine=True)``). It never lowers the
    utility of an assignment whose per-server amounts fit, so the ``2(sqrt 2 - 1)`` and ``1/2`` guarantees of
    Theorems V.17, VI.1 and VII.3, proven for the literal algorithms, carry over.

    - Concave curves: one bisection on a per-server marginal price, vectorised over all servers at once;
      exact on integer units up to rounding, as :func:`super_optimal_concave`.
    - Otherwise: the exact per-server dynamic programme :func:`reallocate_dp` on the dense table.

    ``current`` (optional): the amounts the assignment algorithm gave. Per server, the new split replaces it only if
    it is not worse (so floating-point rounding in the bisection can never lower a server's utility); ``current``
    must fit every server's capacity (``ValueError`` otherwise)."""
    g = np.asarray(server, dtype=np.int64)
    caps = np.asarray(capacities, dtype=np.int64)
    n, m = curves.n, caps.size
    if g.shape != (n,) or (g < 0).any() or (g >= m).any():
        raise ValueError("server must hold one server index in [0, m) per thread")
    if curves.concave().all():
        amount = _reallocate_concave(curves, g, caps, rel_tol)
    else:
        amount = reallocate_dp(curves.table(), g, caps)
    if current is not None:
        cur = np.asarray(current, dtype=np.int64)
        if cur.shape != (n,) or (cur < 0).any() or (cur > curves.capacity).any():
            raise ValueError("current must hold one amount in [0, C] per thread")
        over = np.bincount(g, weights=cur, minlength=m) > caps
        if over.any():
            raise ValueError(f"server {int(np.argmax(over))}: current amounts exceed its capacity")
        u_new = np.bincount(g, weights=curves.evaluate(amount), minlength=m)
        u_old = np.bincount(g, weights=curves.evaluate(cur), minlength=m)
        amount = np.where((u_new < u_old)[g], cur, amount)
    return amount
