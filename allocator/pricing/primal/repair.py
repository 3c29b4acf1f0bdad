"""Feasible allocation from the subproblem solutions by an exact per-pool shed (primal repair of over-used pools).

004 Sec. 5 makes the subproblem solutions feasible by scaling down every column of an over-used pool. Every job on
that pool then loses the same fraction of its time there, whatever that time is worth to it. For a target-priority
utility (eq. 2) this leaves *every* job of an over-used pool short of its target, even when the pool is over-used by
a fraction of a percent: on 004 Sec. 6.2 (n = 10^5, default tolerance) 84 % of the jobs were at their target after
column scaling against 96 % within 2 %.

This module removes the excess ``e_j = r_j - R_j`` of each over-used pool ``j`` at least utility cost instead. Cutting
job ``i``'s time on ``j`` lowers its throughput from ``t_i`` to ``t_i' in [t_i - a_ij x_ij, t_i]`` and frees
``d_ij (t_i - t_i') / a_ij`` of the pool. Maximising ``sum_i u_i(t_i')`` subject to freeing ``e_j`` is a concave
resource problem whose KKT conditions give, for a multiplier ``lambda >= 0``,

    t_i' = argmax_{t in [t_i - a_ij x_ij, t_i]}  u_i(t) - (lambda d_ij / a_ij) t,

the same one-dimensional maximisation as the subproblem on a hull segment (Sec. 4.2, eqs. 15-16: the utility's
``argmax``), so it holds for every utility family. The freed amount grows with ``lambda``; bisection finds the
smallest ``lambda`` that frees at least ``e_j``. For target-priority jobs the cut falls on the jobs with the lowest
``w_i a_ij / d_ij`` (and first on throughput above the target, which is free), so the other jobs stay at their
target. Where no job on the pool has an affine utility over its cut range (strictly concave utilities), the
pool is scaled uniformly as in Sec. 5: at the dual optimum all its jobs have the same marginal value per unit of the
pool (KKT), so the least-cost shed agrees with uniform scaling to first order, and the bisection (tens of passes over
the pool's jobs: seconds for 8 * 10^5 log jobs on a loaded 2-core machine) would buy nothing; log utility skips the
repair altogether. Pools are repaired one after another (a cut only lowers usage elsewhere). The result is feasible
by construction; the caller keeps it when its utility beats the column-scaled allocation's (both are lower bounds
on ``U*``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from allocator._xp import (
    Array,
    arange,
    as_numpy,
    asarray_like,
    astype,
    copy,
    finfo_eps,
    flatnonzero,
    fsum,
    full,
    namespace,
    numel,
)
from allocator.pricing.dual.subproblem import Subsolution
from allocator.pricing.problem import Problem
from allocator.utilities import Log, Utility

__all__ = ["Repair", "shed_overuse"]

#: Bisection steps on the multiplier of one pool (each halves the bracket: 60 reach float64 resolution).
BISECTION_STEPS = 60


@dataclass
class Repair:
    """A feasible allocation obtained by shedding each over-used pool's excess at least utility cost."""

    x_lo: Array  #: (n,) new time fraction on ``sol.j_lo``
    x_hi: Array  #: (n,) new time fraction on ``sol.j_hi``
    throughputs: Array  #: (n,)
    usage: np.ndarray  #: (m,) float64, ``<= capacity``
    utility: float  #: ``sum_i u_i(throughputs_i)``
    pools: int  #: pools repaired


def _slot_demand(prob: Problem, j: Array, rows: Array) -> Array:
    """Demand ``d_ij`` of job ``rows`` on pools ``j`` (1 without demands)."""
    d = prob.demand
    if d is None:
        return full((rows.shape[0],), 1.0, like=prob.a)
    if d.ndim == 1:
        return d[rows]
    return d[rows, j]


def _any_affine(util: Utility, t: Array, lo: Array) -> bool:
    """Whether some job's utility is affine on its cut range ``[lo, t]`` (``lo < t``): the chord equals the left
    derivative at ``t`` times the length, to a relative 1e-6 (target-priority below its target, linear pieces)."""
    xp = namespace(t)
    span = t - lo
    ok = span > 0
    if not bool(ok.any()):
        return False
    u_t, u_lo = util.value(t), util.value(lo)
    du = util.derivative(t - 1e-7 * span)
    with np.errstate(invalid="ignore", over="ignore"):
        gap = xp.abs(u_t - u_lo - du * span)
        scale = xp.clip(xp.abs(du) * span, 1e-300, None)
        return bool((ok & xp.isfinite(gap) & (gap <= 1e-6 * scale)).any())


def _freed(util: Utility, lam: float, t: Array, lo: Array, a: Array, d: Array) -> tuple[Array, float]:
    """New throughputs of the pool's jobs at multiplier ``lam`` and the pool usage they free."""
    xp = namespace(t)
    alpha = astype(lam * d / a, t.dtype)
    t_new = xp.minimum(xp.maximum(util.argmax(alpha, lo, t), lo), t)
    return t_new, fsum(astype(d, "float64") * (astype(t, "float64") - astype(t_new, "float64")) / astype(a, "float64"))


def shed_overuse(prob: Problem, sol: Subsolution, usage: np.ndarray, capacity: np.ndarray) -> Repair | None:
    """Repair the subproblem solutions ``sol`` (usage ``usage`` per pool) into a feasible allocation, see the module
    docstring; ``None`` when no pool is over-used or the utility is log (the repair would be column scaling)."""
    over = np.nonzero(usage > capacity)[0]
    if over.size == 0 or isinstance(prob.utility, Log):
        # Log utility has no affine piece: every pool would take the uniform scaling below, i.e. Sec. 5's column
        # scaling, which the caller already has.
        return None
    xp = namespace(sol.t)
    m = prob.a.shape[1]
    eps = finfo_eps(prob.a)
    t = copy(sol.t)
    x_lo, x_hi = copy(sol.x_lo), copy(sol.x_hi)
    used = usage.astype(np.float64).copy()
    for j in over[np.argsort(-(usage[over] - capacity[over]) / np.maximum(capacity[over], 1e-300))]:
        excess = used[j] - capacity[j]
        if excess <= 0:
            continue
        # the jobs on pool j (a job holds at most one of its two slots there): fraction, throughput, demand
        on_lo = (sol.j_lo == int(j)) & (x_lo > 0)
        on_hi = (sol.j_hi == int(j)) & (x_hi > 0)
        rows = flatnonzero(on_lo | on_hi)
        if numel(rows) == 0:
            continue
        lo_side = on_lo[rows]
        xs = xp.where(lo_side, x_lo[rows], x_hi[rows])
        a = xp.where(lo_side, sol.a_lo[rows], sol.a_hi[rows])
        d = _slot_demand(prob, full(rows.shape, int(j), like=rows), rows)
        ts = t[rows]
        lo = xp.clip(ts - a * xs, 0.0, None)
        util = prob.utility.take(rows)
        total = fsum(astype(d, "float64") * astype(xs, "float64"))
        if excess >= total:  # the pool must be emptied (no capacity left for these jobs)
            t_new, freed = lo, total
        elif not _any_affine(util, ts, lo):
            # No job's utility is affine over its cut range: at the dual optimum every job on the pool has the same
            # marginal value per unit of the pool (KKT), so the least-cost shed and Sec. 5's uniform scaling agree
            # to first order; scale (cheap) instead of bisecting (tens of vector passes over the pool's jobs).
            f = capacity[j] / used[j]
            t_new = ts - (1 - f) * (ts - lo)
            freed = excess
        else:
            lam_lo, lam_hi = 0.0, 1.0
            t_keep, kept = ts, 0.0  # the state at lam_lo (frees less than the excess)
            t_new, freed = _freed(util, lam_hi, ts, lo, a, d)
            while freed < excess and lam_hi < 1e300:
                lam_lo, lam_hi, t_keep, kept = lam_hi, lam_hi * 16.0, t_new, freed
                t_new, freed = _freed(util, lam_hi, ts, lo, a, d)
            for _ in range(BISECTION_STEPS):
                mid = 0.5 * (lam_lo + lam_hi)
                if mid <= lam_lo or mid >= lam_hi:
                    break
                t_mid, f_mid = _freed(util, mid, ts, lo, a, d)
                if f_mid >= excess:
                    lam_hi, t_new, freed = mid, t_mid, f_mid
                else:
                    lam_lo, t_keep, kept = mid, t_mid, f_mid
            if freed > kept:
                # Between the two multipliers some jobs jump (affine pieces of u: a job is cut entirely or not at
                # all at a given lambda): cut those jobs only by the fraction of the jump the excess needs, the
                # exact solution of the pool's problem at the critical lambda (all of them are indifferent there).
                theta = (excess - kept) / (freed - kept)
                t_new = t_keep - theta * (t_keep - t_new)
                freed = kept + theta * (freed - kept)
        x_new = xp.clip(xs - (ts - t_new) / a, 0.0, None)
        x_lo[rows] = xp.where(lo_side, x_new, x_lo[rows])
        x_hi[rows] = xp.where(lo_side, x_hi[rows], x_new)
        t[rows] = t_new
        used[j] -= freed
        if used[j] > capacity[j]:  # not enough freed (rounding of the working dtype): scale the rest (Sec. 5)
            f = float(capacity[j] / used[j] * (1 - 4 * eps))
            x_lo = xp.where(sol.j_lo == int(j), x_lo * f, x_lo)
            x_hi = xp.where(sol.j_hi == int(j), x_hi * f, x_hi)
            used[j] *= f
    # exact usage of the repaired allocation; a pool the working dtype's rounding left a hair above its capacity is
    # scaled back as in Sec. 5 (by a few ulps)
    final = _usage(prob, sol, x_lo, x_hi)
    over_after = final > capacity
    if over_after.any():
        f_all = np.ones(m + 1)
        f_all[:m][over_after] = capacity[over_after] / final[over_after] * (1 - 4 * eps)
        ft = asarray_like(f_all, x_lo)
        x_lo = x_lo * ft[sol.j_lo]
        x_hi = x_hi * ft[sol.j_hi]
        final = _usage(prob, sol, x_lo, x_hi)
    t = xp.clip(sol.a_lo * x_lo + sol.a_hi * x_hi, 0.0, None)
    value = fsum(prob.utility.value(t))
    return Repair(x_lo=x_lo, x_hi=x_hi, throughputs=t, usage=final, utility=value, pools=int(over.size))


def _usage(prob: Problem, sol: Subsolution, x_lo: Array, x_hi: Array) -> np.ndarray:
    """Usage per pool (float64) of the allocation with fractions ``x_lo``, ``x_hi`` on ``sol``'s pools."""
    xp = namespace(x_lo)
    m = prob.a.shape[1]
    out = np.zeros(m)
    every = arange(x_lo.shape[0], like=x_lo)
    for jj, x in ((sol.j_lo, x_lo), (sol.j_hi, x_hi)):
        ok = jj < m
        d = _slot_demand(prob, xp.clip(jj, None, m - 1), every)
        out += np.bincount(as_numpy(jj[ok]), weights=as_numpy(astype((x * d)[ok], "float64")), minlength=m)[:m]
    return out
