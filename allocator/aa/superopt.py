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


def reallocate(curves: CurveFamily, server: ArrayLike, capacities: ArrayLike, *, rel_tol: float = 1e-13) -> IntArray:
    """Optimal allocation for a *fixed* assignment: each server ``j`` splits its ``C_j`` units among its own threads
    to maximise their total utility (Definition V.1 applied server by server, i.e. the single-server problem of [12]).

    Never lowers the utility of an assignment whose per-server amounts fit, so Algorithms 1 and 2 followed by it keep
    their guarantees. This post-step is *not* part of the paper's pseudocode. Concave curves: one bisection on a
    per-server marginal price, vectorised over all servers at once; otherwise an exact DP per server.
    """
    g = np.asarray(server, dtype=np.int64)
    caps = np.asarray(capacities, dtype=np.int64)
    n, m = curves.n, caps.size
    if g.shape != (n,) or (g < 0).any() or (g >= m).any():
        raise ValueError("server must hold one server index in [0, m) per thread")
    if not curves.concave().all():
        from .curves import TableCurves

        table = curves.table()
        amount = np.zeros(n, dtype=np.int64)
        for j in range(m):
            idx = np.flatnonzero(g == j)
            if idx.size:
                amount[idx] = super_optimal_dp(TableCurves(table[idx]), int(caps[j])).amount
        return amount
    pos = curves.demand(0.0, strict=True)
    fits = np.bincount(g, weights=pos, minlength=m) <= caps
    done = fits.copy()
    hi0 = curves.max_first_marginal() * (1.0 + 1e-12) + 1e-300
    lo = np.zeros(m)
    hi = np.full(m, hi0)
    base = np.zeros(n, dtype=np.int64)
    top = pos.copy()
    for _ in range(200):
        active = ~done & (hi - lo > rel_tol * hi)
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
