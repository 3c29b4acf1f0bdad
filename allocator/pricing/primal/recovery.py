"""Primal recovery at given prices: an exact split of the jobs whose subproblem optimum is not unique.

Column scaling (004 Sec. 5) turns the subproblem solutions at prices ``p`` into a feasible allocation, but where the
dual function ``g`` has a kink (the optimal prices of small markets, markets of identical jobs) many jobs are
indifferent between pools, or, with linear pieces in ``u``, between throughput levels, and the subproblem solver
sends all of them to the same vertex. Their optimal split is not a property of any single job; it is the solution of
a small linear program. This module

1. identifies, at ``p``, for every job a multiplier ``lambda_i`` in the supergradient of ``u_i`` that supports the
   subproblem optimum (the slope of the active segment of ``c_i`` when the optimum is inside one; at a hull vertex
   a point of the supergradient of ``u_i`` within the hull's left and right slopes, :func:`_multipliers`, which
   matters at the target of a target-priority job, eq. 2) and its *candidate pools*: those whose reduced value
   ``lambda_i a_ij - p_j d_ij`` is within a tolerance of ``max(0, max_k lambda_i a_ik - p_k d_ik)`` (the pools on
   the supporting line of Sec. 4.1, ties included);
2. fixes every job with a single candidate and a unique throughput at its subproblem solution (scaled down where it
   alone over-uses a pool), and
3. solves, for the remaining "tied" jobs, the transportation-like LP

       maximise   sum_i lambda_i a_i^T x_i
       subject to a_i^T x_i <= t_max_i,  1^T x_i <= 1,  x_ij >= 0 only on candidate pools,
                  sum_i d_ij x_ij <= R_j - (usage of the fixed jobs)_j

   with HiGHS (through its own bindings, :mod:`allocator._highs`), where ``t_max_i`` is the subproblem throughput
   ``t_i`` when ``u_i`` is strictly concave there (the throughput is unique, only the split is free) and the largest
   candidate throughput when ``u_i`` is affine on that range (linear utilities, the linear part of target-priority).

Identical tied jobs (many copies of a few job types) are solved as weighted classes, so the LP's size is the number
of distinct tied jobs, not of jobs.

A class's split over three pools or more is dealt to its jobs as two-pool optimal responses of the same throughput
(:func:`_vertex_responses`, :func:`_responses`): each job's subproblem optimum spans at most two pools (004 Sec. 4.1),
and the class's total is unchanged, so this loses nothing. A job alone in its class may be spread by the LP over
three pools or more, and the market optimum can need that: a subproblem optimum spans two pools, but the allocation
problem's optimum is a convex combination of optimal responses, and where a pool is smaller than one job's share
(the scarce pools of 004 Sec. 6.2 with ten jobs: capacities 0.1 and 0.01) the best allocation with at most two pools
per job is measurably worse than ``U*`` (10 jobs, seed 0: at most -14.7232 by a MILP bound, ``U* = -14.7001``,
``eps = 0.01``), so no price can certify it. The two-pool form of such a job (split again alone on its two pools of
largest share, in a second LP with the classes around it; whatever is still wider keeps its two largest,
:func:`_keep_two_pools`) is returned when it reaches the caller's target utility or loses nothing; otherwise the
LP's optimum is. The allocation is feasible by construction. Its exact utility is a lower bound on ``U*``; the
caller keeps it when it beats the column-scaled allocation.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from allocator._highs import solve_lp
from allocator._xp import (
    Array,
    arange,
    as_numpy,
    asarray_like,
    astype,
    copy,
    dtype_name,
    finfo_eps,
    flatnonzero,
    fsum,
    namespace,
    pick,
    repeat,
)
from allocator.pricing.dual.oracle import DualOracle, Evaluation
from allocator.pricing.dual.subproblem import Subsolution
from allocator.utilities import Utility

__all__ = ["MAX_SCAN", "MAX_TIED", "RECOVERY_RTOLS", "Recovery", "recover", "recover_allocation", "split_jobs"]

#: Default limit on the number of classes of tied jobs handed to HiGHS (keeps one LP to tens of milliseconds).
MAX_TIED = 2_000

#: Default limit on the jobs strictly inside a hull segment (:func:`split_jobs`) for which the recovery is attempted
#: at all: it builds a few ``n x m`` temporaries and sorts the tied jobs into classes before it knows whether the LP
#: is small enough.
MAX_SCAN = 200_000


@dataclass
class Recovery:
    """A feasible allocation recovered at one price vector."""

    allocation: Array  #: (n, m)
    throughputs: Array  #: (n,)
    usage: np.ndarray  #: (m,) float64
    utility: float  #: exact sum of utilities of ``allocation``
    tied_jobs: int  #: jobs whose split was decided by the LP
    classes: int = 0  #: classes of identical tied jobs (the LP's size): one variable set per class


def split_jobs(sol: Subsolution, m: int) -> int:
    """Jobs whose subproblem optimum lies strictly inside a hull segment: a lower bound on the tied jobs.

    Such a job's multiplier is the segment's slope, and the supporting line of slope ``lambda_i`` touches the hull at
    both ends (004 Sec. 4.1): two pools, or the origin and a pool (then the job has slack and ``slack_ok`` holds), so
    the job is tied. Counting them costs a few ``O(n)`` passes and lets :func:`recover_allocation` give up early on
    large markets without building ``n x m`` temporaries.
    """
    inside = (sol.x_hi > 0) & (sol.x_hi < 1) & (sol.a_hi > sol.a_lo)
    return int(inside.sum())


def _multipliers(sol: Subsolution, utility: Utility, a: Array, c: Array) -> Array:
    """``lambda_i``: a multiplier that supports job ``i``'s subproblem optimum at its throughput ``t_i`` (eq. 11).

    ``t_i`` maximises ``u_i - c_i`` exactly when some ``lambda`` lies both in the supergradient of ``u_i`` at ``t_i``,
    ``[u_i'(t_i+), u_i'(t_i-)]``, and in the subdifferential of the convex cost ``c_i`` there, ``[s_l, s_r]``, the
    slopes of the hull of Sec. 4.1 left and right of ``t_i``; the pools on the supporting line of that slope are the
    job's optimal responses. Strictly inside a hull segment ``s_l = s_r`` is the segment's slope. At a hull vertex
    ``(a_k, c_k)``, ``s_l`` is the largest chord slope from a point left of it (the origin included) and ``s_r`` the
    smallest one to a point right of it, and the multiplier is the slope of the chord between those two neighbours,
    clipped to the intersection of both intervals: that is the slope at which the vertex and its neighbours are
    nearest to one line, so near-collinear neighbours (near-optimal prices of a tied market) show up as candidates.

    For a smooth ``u_i`` the intersection is the point ``u_i'(t_i)``. It matters where ``u_i`` has a kink at a hull
    vertex: a target-priority job (eq. 2) whose target is the throughput ``a_ik`` of a pool, where its solution by
    eq. (16) is that pool alone. ``u_i'(t_i)`` there is 0 (or ``w_i`` a hair below the target), which supports no
    pool at positive prices, and the job was taken for untied; its pools are now found at a slope in
    ``[s_l, min(w_i, s_r)]``.
    """
    xp = namespace(sol.t)
    span = sol.a_hi - sol.a_lo
    inside = (sol.x_hi > 0) & (sol.x_hi < 1) & (span > 0)
    seg = (sol.c_hi - sol.c_lo) / xp.where(span > 0, span, 1.0)
    du = utility.derivative(sol.t)
    du = xp.where(xp.isfinite(du), du, 0.0)
    vertex = ~inside & (sol.t > 0)
    if not bool(vertex.any()):
        return xp.where(inside, seg, du)
    idx = flatnonzero(vertex)
    t = sol.t[idx]
    ct = sol.cost()[idx]
    av, cv = a[idx], c[idx]
    near = 1e-9 * xp.clip(t, 1e-300, None)
    dx = t[:, None] - av
    left = (dx > near[:, None]) & (av >= 0)
    right = (dx < -near[:, None]) & (av > 0)
    safe = xp.where(left | right, dx, 1.0)
    chord = (ct[:, None] - cv) / safe
    from_left = xp.where(left, chord, -math.inf)
    from_right = xp.where(right, chord, math.inf)
    s_l = xp.maximum(xp.amax(from_left, axis=1), ct / t)  # the origin is a point left of every t > 0
    s_r = xp.amin(from_right, axis=1)
    j_l, j_r = xp.argmax(from_left, axis=1), xp.argmin(from_right, axis=1)
    from_origin = xp.amax(from_left, axis=1) < ct / t
    a_l = xp.where(from_origin, 0.0, pick(av, j_l))
    c_l = xp.where(from_origin, 0.0, pick(cv, j_l))
    a_r, c_r = pick(av, j_r), pick(cv, j_r)
    has_r = xp.isfinite(s_r)
    with np.errstate(divide="ignore", invalid="ignore"):
        over = xp.where(has_r, (c_r - c_l) / xp.where(has_r, a_r - a_l, 1.0), math.inf)
    util = utility.take(idx)
    d_right = util.derivative(t * (1 + 1e-7))
    d_left = util.derivative(t * (1 - 1e-7))
    lo = xp.maximum(xp.where(xp.isfinite(d_right), d_right, s_l), s_l)
    hi = xp.minimum(xp.where(xp.isfinite(d_left), d_left, s_r), s_r)
    with np.errstate(invalid="ignore"):
        lam_v = xp.where(lo <= hi, xp.minimum(xp.maximum(over, lo), hi), 0.5 * (lo + hi))
    lam_v = xp.where(xp.isfinite(lam_v), lam_v, du[idx])
    out = xp.where(inside, seg, du)
    out[idx] = lam_v
    return out


#: Breakpoints of the piecewise-linear model of a strictly concave u_i, as multiples of the subproblem throughput.
_BREAKS = np.array([0.0, 0.25, 0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0, 1.001, 1.005, 1.01, 1.02, 1.05])


def _pieces(utility: Utility, t: Array, mu: Array, affine: Array, t_hi: Array) -> tuple[np.ndarray, np.ndarray]:
    """Concave piecewise-linear model of each tied job's utility: ``(slopes, lengths)``, both ``(k, P)``.

    Affine jobs get one piece ``[0, t_hi]`` of slope ``mu``; the others the chords of ``u`` between the breakpoints
    ``_BREAKS * t`` (the first piece gets the tangent slope at its right end, finite where ``u(0) = -inf``).
    Chord slopes of a concave function decrease, so the LP fills the pieces in order and values ``t`` exactly at
    the breakpoints.
    """
    k = t.shape[0]
    npc = _BREAKS.size - 1
    tt = as_numpy(astype(t, "float64"))
    pts = asarray_like(np.outer(tt, _BREAKS), t)  # (k, P + 1)
    util_rep = utility.take(repeat(arange(k, like=t), npc + 1)) if k else utility
    vals = as_numpy(astype(util_rep.value(pts.reshape(-1)), "float64")).reshape(k, npc + 1)
    dvals = as_numpy(astype(util_rep.derivative(pts.reshape(-1)), "float64")).reshape(k, npc + 1)
    p64 = as_numpy(astype(pts, "float64"))
    lengths = np.diff(p64, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        slopes = np.diff(vals, axis=1) / lengths
    slopes[:, 0] = dvals[:, 1]
    # Concavity guarded against rounding; pieces of zero length (all of ``_BREAKS`` at ``t = 0``) do not take part, and
    # a leading run of them takes the first real piece's slope (a slope of 0 there made a job at t = 0 worthless).
    slopes = np.where(np.isfinite(slopes) & (lengths > 0), slopes, np.inf)
    slopes = np.minimum.accumulate(slopes, axis=1)
    lead = np.isinf(slopes)
    if lead.any():
        first = np.where(lead.all(1), 0.0, slopes[np.arange(k), np.argmin(lead, axis=1)] if k else 0.0)
        slopes = np.where(lead, first[:, None], slopes)
    # Throughput where u no longer increases is worth nothing: a target-priority job (eq. 2) above its target. Its
    # pieces there are dropped, and the piece across the plateau's start ends where u would reach the plateau at the
    # slope before it (exactly at the target for eq. 2), so the LP never buys throughput past the target: the
    # capacity stays with jobs that value it, and a job is not handed pools it cannot use (overshoot).
    flat = slopes <= 0
    rising = ~flat
    if flat.any() and rising.any():
        npc_ = slopes.shape[1]
        last = npc_ - 1 - np.argmax(rising[:, ::-1], axis=1)  # last rising piece of each row
        row = np.flatnonzero(rising.any(1) & (last >= 1) & (last < npc_ - 1))
        k_last = last[row]
        prev, cur = slopes[row, k_last - 1], slopes[row, k_last]
        cut = (cur < prev) & (prev > 0)
        row, k_last, prev, cur = row[cut], k_last[cut], prev[cut], cur[cut]
        lengths[row, k_last] = lengths[row, k_last] * cur / prev
        slopes[row, k_last] = prev
        lengths[flat] = 0.0
    aff = as_numpy(affine)
    if aff.any():
        slopes[aff] = 0.0
        lengths[aff] = 0.0
        slopes[aff, 0] = as_numpy(astype(mu, "float64"))[aff]
        lengths[aff, 0] = as_numpy(astype(t_hi, "float64"))[aff]
    return slopes, np.maximum(lengths, 0.0)


def _keep_two_pools(x: np.ndarray, a: np.ndarray) -> None:
    """Keep, in place, each row's two pools of largest throughput share ``a_ij x_ij`` and zero the rest.

    A vertex of the LP may split a tied job over three or more pools (a single job with small pools, say), but a
    Walras job spans at most two pools, the structure of the subproblem optimum (004 Sec. 4.1). Dropping pools
    only lowers usage, so the result stays feasible; its utility is recomputed and compared by the caller.
    """
    wide = (x > 0).sum(1) > 2
    if not wide.any():
        return
    share = a[wide] * x[wide]
    order = np.argsort(-share, axis=1, kind="stable")
    drop = np.zeros_like(share, dtype=bool)
    np.put_along_axis(drop, order[:, 2:], True, axis=1)
    sub = x[wide]
    sub[drop] = 0.0
    x[wide] = sub


def _vertex_responses(x: np.ndarray, a: np.ndarray, tiny: float = 1e-12) -> tuple[np.ndarray, np.ndarray]:
    """Write one job's split ``x`` (``(m,)``, ``1^T x <= 1``) as a convex combination of at most two-pool splits of
    the same throughput: ``(theta, V)`` with ``theta >= 0``, ``sum theta = 1``, ``theta @ V = x`` and every row of
    ``V`` a point of ``{v >= 0, supp v within supp x, 1^T v <= 1, a^T v = a^T x}`` with at most two nonzeros
    among ``(v, 1 - 1^T v)``.

    Those rows are the vertices of that polytope: it has two equality constraints once the slack ``s = 1 - 1^T v``
    is a variable, so a basic solution has at most two nonzero entries (the argument of 004 Sec. 4.1 for eq. (13)).
    The peel is Caratheodory's: take the vertex made of the pool (or the slack, ``a = 0``) of largest throughput at
    most ``t`` and the one of smallest throughput at least ``t`` (a single pool when one has ``a_j = t``), subtract
    it with the largest weight that keeps the rest non-negative, and repeat on the rest, which has lost an entry; at
    most ``|supp x|`` vertices. Each vertex costs what ``x`` costs at prices under which ``x`` is an optimal response
    (they lie on the same supporting line), so each is an optimal response as well.
    """
    m = x.size
    t = float(a @ x)
    z = np.append(np.clip(x, 0.0, None), max(1.0 - float(x.sum()), 0.0))  # the slack is entry m, with a = 0
    az = np.append(a, 0.0)
    scale = max(float(z.max(initial=0.0)), tiny)
    thetas: list[float] = []
    verts: list[np.ndarray] = []
    mass = float(z.sum())
    unit = t / max(mass, tiny)  # the throughput per unit of mass: every peeled vertex and the rest keep it
    while mass > tiny:
        supp = np.flatnonzero(z > tiny * scale)
        if supp.size <= 2:
            thetas.append(mass)
            verts.append(z[:m] / mass)
            break
        tt = min(max(unit, float(az[supp].min())), float(az[supp].max()))
        below = supp[az[supp] <= tt]
        above = supp[az[supp] >= tt]
        i = int(below[np.argmax(az[below])])
        j = int(above[np.argmin(az[above])])
        v = np.zeros(m + 1)
        if az[j] - az[i] <= 1e-12 * max(az[j], 1.0):
            v[i] = 1.0
        else:
            v[i] = (az[j] - tt) / (az[j] - az[i])
            v[j] = (tt - az[i]) / (az[j] - az[i])
        used = v > 0
        mu = min(float(np.min(z[used] / v[used])), mass)
        z = z - mu * v
        z[z <= tiny * scale] = 0.0
        mass -= mu
        thetas.append(mu)
        verts.append(v[:m])
    theta = np.asarray(thetas)
    out = np.asarray(verts).reshape(-1, m)
    out[out <= tiny * np.maximum(out.max(1, keepdims=True), tiny)] = 0.0  # rounding residue of the peel
    return theta / max(theta.sum(), tiny), out


def _chain(verts: np.ndarray) -> np.ndarray:
    """An order of the responses ``verts`` (``(K, m)``) in which as few neighbours as possible together use more than
    two pools (all ``K!`` orders for ``K <= 6``, stable among equals; the given order beyond)."""
    k = verts.shape[0]
    if k <= 2 or k > 6:
        return np.arange(k)
    used = verts > 0
    bad = (used[:, None, :] | used[None, :, :]).sum(2) > 2  # (K, K): the pair together needs three pools or more
    best, best_cost = np.arange(k), k
    for perm in itertools.permutations(range(k)):
        order = np.asarray(perm)
        cost = int(bad[order[:-1], order[1:]].sum())
        if cost < best_cost:
            best, best_cost = order, cost
            if cost == 0:
                break
    return best


def _responses(theta: np.ndarray, verts: np.ndarray, w: int) -> np.ndarray:
    """Deal the two-pool responses ``verts`` (weights ``theta``, :func:`_vertex_responses`) to the ``w`` jobs of a
    class: ``(w, m)``, one row per job, summing to ``w theta @ verts`` (the class's split).

    The responses are laid on ``[0, w)`` in the order of :func:`_chain`, response ``k`` on an interval of length
    ``w theta_k``, and job ``j`` takes what ``[j, j + 1)`` meets: most jobs get one response, and a job that straddles
    a cut mixes responses of the same throughput. The chain puts responses that together use at most two pools next
    to each other, so such a mix mostly stays on two pools. Where it cannot (a target-priority class at its target,
    eq. (2), split between the pool whose throughput is the target, alone, and two pools around it) one job is left
    over three pools; the caller re-splits it (pass 2 of :func:`recover_allocation`).
    """
    order = _chain(verts)
    theta, verts = theta[order], verts[order]
    edges = np.concatenate([[0.0], np.cumsum(w * theta)])
    edges[-1] = w
    near = np.round(edges)
    snap = np.abs(edges - near) <= 1e-9 * max(w, 1)
    edges[snap] = near[snap]
    j = np.arange(w, dtype=np.float64)[:, None]
    share = np.clip(np.minimum(j + 1, edges[1:]) - np.maximum(j, edges[:-1]), 0.0, None)  # (w, K)
    return share @ verts


def _classes(key: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Identical rows of ``key``: ``(first, member, count)`` with ``first[c]`` a row of class ``c``, ``member[i]`` the
    class of row ``i`` and ``count[c]`` its size. Rows are grouped by a random projection (one 1-d sort instead of a
    lexicographic sort of the whole matrix) and the grouping is then verified row by row; a projection collision
    between different rows (never seen, but possible) falls back to the exact row-wise unique."""
    if key.shape[0] == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    proj = key @ np.random.default_rng(0).uniform(1.0, 2.0, key.shape[1])
    _, first, member, count = np.unique(proj, return_index=True, return_inverse=True, return_counts=True)
    member = member.reshape(-1)
    if not np.array_equal(key, key[first][member]):
        _, first, member, count = np.unique(key, axis=0, return_index=True, return_inverse=True, return_counts=True)
        member = member.reshape(-1)
    return first, member, count


def _split_lp(
    cand_t: np.ndarray,
    a_t: np.ndarray,
    d_t: np.ndarray,
    slopes: np.ndarray,
    lengths: np.ndarray,
    weight: np.ndarray,
    remaining: np.ndarray,
) -> np.ndarray | None:
    """The LP of the module doc over ``k`` classes of tied jobs: the split ``(k, m)`` of one job of each class.

    ``cand_t``, ``a_t``, ``d_t``: ``(k, m)`` candidate pools, throughputs and demands of a job of each class;
    ``slopes``, ``lengths``: its piecewise-linear utility (:func:`_pieces`); ``weight``: the class sizes;
    ``remaining``: ``(m,)`` the capacity the fixed jobs leave. The result is exactly feasible (HiGHS' feasibility
    tolerance scaled away); ``None`` when HiGHS fails.
    """
    k, m = a_t.shape
    if k == 0:
        return np.zeros((0, m))
    w = weight.astype(np.float64)
    rows, cols = np.nonzero(cand_t)
    nv = rows.size
    npc = slopes.shape[1]
    av, dv = a_t[rows, cols], d_t[rows, cols]
    # Variables: x (candidate cells), then the pieces s_ik of each tied job's throughput t_i = sum_k s_ik.
    obj = np.concatenate([np.zeros(nv), -(slopes * w[:, None]).reshape(-1)])
    var = np.arange(nv)
    prow = np.repeat(np.arange(k), npc)
    pvar = nv + np.arange(k * npc)
    # Rows: per tied job a_i^T x_i - sum_k s_ik = 0 (k rows), then per tied job time <= 1 (k rows), then per pool
    # usage <= the capacity the fixed jobs leave (m rows); as (row, column, value) triples, sorted into CSR.
    r = np.concatenate([rows, prow, k + rows, 2 * k + cols])
    c = np.concatenate([var, pvar, var, var])
    v = np.concatenate([av, -np.ones(k * npc), np.ones(nv), dv * w[rows]])
    order = np.argsort(r, kind="stable")
    indptr = np.zeros(2 * k + m + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=2 * k + m), out=indptr[1:])
    lower = np.concatenate([np.zeros(k), np.full(k + m, -np.inf)])
    upper = np.concatenate([np.zeros(k), np.ones(k), remaining])
    col_upper = np.concatenate([np.full(nv, np.inf), lengths.reshape(-1)])
    try:
        res = solve_lp(obj, indptr, c[order], v[order], lower, upper, np.zeros(nv + k * npc), col_upper)
    except ValueError:
        return None
    if not res.optimal or res.x is None:
        return None
    xv = np.clip(res.x[:nv], 0.0, None)
    # Remove HiGHS' feasibility tolerance: rows (time) and columns (capacity) scaled back to exact feasibility.
    row_sum = np.bincount(rows, weights=xv, minlength=k)
    xv = xv / np.maximum(row_sum, 1.0)[rows]
    col_use = np.bincount(cols, weights=dv * xv * w[rows], minlength=m)
    shrink = np.where(col_use > remaining, remaining / np.maximum(col_use, 1e-300), 1.0)
    xv = xv * shrink[cols]
    x = np.zeros((k, m))
    x[rows, cols] = xv
    return x


def recover_allocation(
    a: Array,
    c: Array,
    demand: Array | None,
    capacity: np.ndarray,
    sol: Subsolution,
    utility: Utility,
    *,
    rtol: float = 1e-6,
    max_tied: int = MAX_TIED,
    max_scan: int = MAX_SCAN,
    target: float = math.inf,
) -> Recovery | None:
    """Recover a feasible allocation at the prices that produced ``sol`` (see module doc).

    ``target``: the utility the caller needs (its dual bound minus its tolerance). Where the LP's optimum spreads a
    job over three pools or more, its two-pool form (pass 2) is returned when it reaches ``target`` or loses nothing
    against the LP's optimum, the LP's optimum otherwise.

    ``a``: (n, m) throughputs; ``c``: (n, m) costs ``p_j d_ij``; ``demand``: ``None``, (n,) or (n, m); ``capacity``:
    (m,) float64. Returns ``None`` when there is nothing to split (no tied job), more than ``max_tied`` classes of
    tied jobs (or more than ``max_scan`` jobs inside a hull segment), or the LP fails; the caller then keeps the
    column-scaled allocation. The default ``max_tied`` keeps the LP to tens of milliseconds: the recovery is for
    small markets and markets of identical jobs (where kinks of ``g`` hold the column-scaled allocation back); large
    markets of distinct jobs converge by column scaling (004 Sec. 6).

    Identical tied jobs (same candidate pools, throughputs, demands and utility model) form one class with
    multiplicity ``w``: the LP has one set of variables per class, with its capacity use and objective weighted by
    ``w``, and every job of the class gets the class's split. This loses nothing: the LP is linear, so averaging an
    optimal solution over the jobs of a class is optimal and feasible, and it is symmetric.
    """
    n, m = a.shape
    if n == 0 or split_jobs(sol, m) > max_scan:
        return None
    ties = _tied_jobs(a, c, sol, utility, rtol)
    if ties is None:
        return None
    lp = _tied_lp(a, demand, capacity, sol, utility, ties, max_tied)
    if lp is None:
        return None
    # Pass 1: the LP over all classes, each class's split dealt to its jobs. This is the LP's optimum: a job the LP
    # spreads over three pools or more keeps that split (the market optimum of a small market needs it, see the
    # module doc).
    x_cls = _split_lp(lp.cand, lp.a_t, lp.d_t, lp.slopes, lp.lengths, lp.weight, lp.remaining)
    if x_cls is None:
        return None
    x_wide = np.zeros((lp.k_jobs, m))
    lp.deal(x_wide, np.arange(lp.k), x_cls)
    wide_rec = lp.finish(x_wide)
    mixed = np.flatnonzero(np.count_nonzero(x_wide, axis=1) > 2)
    if not mixed.size or wide_rec is None:
        return wide_rec
    two_rec = _two_pool_form(lp, x_wide, mixed)
    if two_rec is not None and (
        two_rec.utility >= target or two_rec.utility >= wide_rec.utility - 1e-12 * max(1.0, abs(wide_rec.utility))
    ):
        return two_rec
    return wide_rec


@dataclass(frozen=True)
class _Ties:
    """Step 1 of the module doc at the prices of a subsolution, per job: the candidate pools ``cand`` (n x m, the
    pools on the supporting line of slope ``lambda_i``), the LP's objective weight ``mu`` (the marginal value of
    throughput just below ``t_i``), whether ``u_i`` is ``affine`` from ``t_i`` up to ``t_hi`` (then the throughput
    level is free up to ``t_hi``), and which jobs are ``tied`` (``count`` of them)."""

    cand: Array
    mu: Array
    affine: Array
    t_hi: Array
    tied: Array
    count: int


def _tied_jobs(a: Array, c: Array, sol: Subsolution, utility: Utility, rtol: float) -> _Ties | None:
    """The multipliers, candidate pools and tied jobs of step 1 (module doc; eq. 11 and the supporting line of 004
    Sec. 4.1), or ``None`` when no job is tied."""
    xp = namespace(a)
    single = dtype_name(a.dtype) != "float64"
    lam = _multipliers(sol, utility, a, c)
    t = sol.t
    # mu_i: the marginal value of throughput just below t_i (left derivative), the LP's objective weight.
    mu = utility.derivative(t * (1 - 1e-7))
    mu = xp.where(xp.isfinite(mu), mu, lam)
    rho = lam[:, None] * a - c  # reduced value of each pool at the multiplier
    best = xp.clip(xp.amax(rho, axis=1), 0.0, None)
    scale = xp.maximum(xp.maximum(xp.abs(lam), xp.abs(mu)) * xp.amax(a, axis=1), xp.amax(c, axis=1))
    scale = xp.clip(scale, 1e-30, None)
    tol = (rtol + (1e-4 if single else 0.0)) * scale
    cand = (rho >= (best - tol)[:, None]) & (a > 0)
    n_cand = xp.sum(cand, axis=1)
    slack_ok = best <= tol  # zero throughput (the origin) is on the supporting line as well
    # Is u_i affine from t_i on, as far as the largest candidate throughput t_hi reaches?  Then the throughput level
    # is free too. The test is on [t_i, reach]: ``reach`` is where u, at slope mu, gains what it gains up to t_hi: t_hi
    # for a truly affine u, the target for a target-priority job whose candidates reach past it (eq. 2; such a job at a
    # hull vertex below its target, or at zero throughput, is indifferent up to the target at a kink of g, and the
    # subproblem solver reports one end, rarely the one the market needs: 004 Sec. 6.2, three jobs).
    t_hi = xp.amax(xp.where(cand, a, 0.0), axis=1)
    with np.errstate(invalid="ignore"):
        gain = utility.value(t_hi) - utility.value(t)
        reach = xp.where(mu > 0, t + xp.clip(gain, 0.0, None) / xp.where(mu > 0, mu, 1.0), t_hi)
        reach = xp.minimum(xp.maximum(reach, t), t_hi)
        # ``lin_gap`` is a utility, as ``tol`` is (a reduced value): the test is not scaled by ``t_hi`` (that let a
        # log job pass for affine at rtol 1e-3 and the LP leave it at zero throughput, u = -inf, losing the whole
        # recovery).
        lin_gap = utility.value(reach) - utility.value(t) - mu * (reach - t)
        affine = xp.isfinite(lin_gap) & (xp.abs(lin_gap) <= tol) & (reach > t)
    t_hi = xp.where(affine, reach, t_hi)
    tied = (n_cand >= 2) | (affine & (n_cand >= 1)) | (slack_ok & (n_cand >= 1) & (t > 0))
    k_jobs = int(tied.sum())
    if k_jobs == 0:
        return None
    return _Ties(cand=cand, mu=mu, affine=affine, t_hi=t_hi, tied=tied, count=k_jobs)


@dataclass(frozen=True)
class _TiedLP:
    """The LP of step 3 (module doc) over the classes of identical tied jobs, with what it needs to deal a solution
    back to the jobs and to complete it into an allocation: the fixed jobs' allocation ``x_fixed`` (step 2) and the
    capacity they leave, ``remaining``; per class its candidate pools, throughputs, demands and utility pieces; per
    tied job (rows ``idx`` of the market) its class ``member``; the jobs of class ``c`` are
    ``members[bounds[c]:bounds[c + 1]]``, ``weight[c]`` of them."""

    a: Array
    dd: Array  #: (n, m) demands
    capacity: np.ndarray
    utility: Utility
    x_fixed: Array
    remaining: np.ndarray
    idx: Array
    k_jobs: int
    cand: np.ndarray
    a_t: np.ndarray
    d_t: np.ndarray
    slopes: np.ndarray
    lengths: np.ndarray
    member: np.ndarray
    weight: np.ndarray
    members: np.ndarray
    bounds: np.ndarray

    @property
    def k(self) -> int:
        """The number of classes (the LP's size)."""
        return int(self.cand.shape[0])

    def deal(self, x_jobs: np.ndarray, classes: np.ndarray, split: np.ndarray) -> None:
        """Each class's split to its jobs (rows of ``x_jobs``): as it is, or as two-pool responses where it uses three
        pools or more and the class has several jobs (:func:`_responses`; lossless, the class's total is the same)."""
        for pos, cls in enumerate(classes):
            rows_c = self.members[self.bounds[cls] : self.bounds[cls + 1]]
            if self.weight[cls] > 1 and np.count_nonzero(split[pos]) > 2:
                x_jobs[rows_c] = _responses(*_vertex_responses(split[pos], self.a_t[cls]), int(self.weight[cls]))
            else:
                x_jobs[rows_c] = split[pos]

    def finish(self, x_jobs: np.ndarray) -> Recovery | None:
        """The full allocation: the fixed jobs' rows and the tied jobs' ``x_jobs``, with its exact utility."""
        a, dd, capacity = self.a, self.dd, self.capacity
        xp = namespace(a)
        m = a.shape[1]
        x = copy(self.x_fixed)
        x[self.idx] = asarray_like(x_jobs, a)
        # Casting to the working dtype may round a column a hair above its capacity: scale it back.
        usage = as_numpy(xp.sum(astype(dd * x, "float64"), axis=0))
        over = usage > capacity
        if over.any():
            fix = np.ones(m)
            fix[over] = capacity[over] / usage[over] * (1 - 4 * finfo_eps(a))
            x = x * asarray_like(fix, a)
            usage = as_numpy(xp.sum(astype(dd * x, "float64"), axis=0))
        thr = xp.sum(a * x, axis=1)
        value = fsum(self.utility.value(thr))
        if not np.isfinite(value):
            return None
        return Recovery(
            allocation=x, throughputs=thr, usage=usage, utility=value, tied_jobs=self.k_jobs, classes=self.k
        )


def _fixed_jobs(
    a: Array, demand: Array | None, capacity: np.ndarray, sol: Subsolution, tied: Array
) -> tuple[Array, Array, np.ndarray]:
    """Step 2 (module doc): the untied jobs keep their subproblem allocation, column-scaled among themselves where
    they alone over-use a pool (004 Sec. 5). Returns that allocation (zero rows for the tied jobs), the ``n x m``
    demands and the capacity left to the tied jobs."""
    xp = namespace(a)
    n, m = a.shape
    x_sub = sol.dense(m)
    x_fixed = xp.where(tied[:, None], 0.0, x_sub)
    if demand is None:
        dd = xp.ones_like(a)
    elif demand.ndim == 1:
        dd = xp.broadcast_to(demand[:, None], (n, m))
    else:
        dd = demand
    used = as_numpy(xp.sum(astype(dd * x_fixed, "float64"), axis=0))
    col = np.ones(m)
    over = used > capacity
    col[over] = capacity[over] / used[over]
    x_fixed = x_fixed * asarray_like(col, a)
    remaining = np.maximum(capacity - used * col, 0.0)
    return x_fixed, dd, remaining


def _tied_lp(
    a: Array,
    demand: Array | None,
    capacity: np.ndarray,
    sol: Subsolution,
    utility: Utility,
    ties: _Ties,
    max_tied: int,
) -> _TiedLP | None:
    """The fixed jobs (step 2) and the LP of step 3 over the classes of identical tied jobs (same candidate pools,
    throughputs, demands and utility pieces), or ``None`` when there are more than ``max_tied`` classes."""
    x_fixed, dd, remaining = _fixed_jobs(a, demand, capacity, sol, ties.tied)
    idx = flatnonzero(ties.tied)
    cand_t = as_numpy(ties.cand[idx])
    a_t = as_numpy(astype(a[idx], "float64"))
    d_t = as_numpy(astype(dd[idx], "float64"))
    slopes, lengths = _pieces(
        utility.take(idx),
        sol.t[idx],
        ties.mu[idx],
        ties.affine[idx],
        ties.t_hi[idx],
    )
    # Classes of identical tied jobs: the LP below is over classes, weighted by their sizes.
    key = np.hstack([cand_t.astype(np.float64), a_t, d_t, slopes, lengths])
    first, member, weight = _classes(key)
    if first.size > max_tied:
        return None
    return _TiedLP(
        a=a,
        dd=dd,
        capacity=capacity,
        utility=utility,
        x_fixed=x_fixed,
        remaining=remaining,
        idx=idx,
        k_jobs=ties.count,
        cand=cand_t[first],
        a_t=a_t[first],
        d_t=d_t[first],
        slopes=slopes[first],
        lengths=lengths[first],
        member=member,
        weight=weight,
        members=np.argsort(member, kind="stable"),
        bounds=np.concatenate([[0], np.cumsum(weight)]),
    )


def _two_pool_form(lp: _TiedLP, x_wide: np.ndarray, mixed: np.ndarray) -> Recovery | None:
    """Pass 2, the two-pool form of pass 1's dealt solution ``x_wide``: each job still over three pools or more
    (``mixed``) is split again alone, on its two pools of largest share, in one LP with every class none of whose jobs
    is such, while the other jobs of its class keep what they were dealt; whatever is still wider keeps its two
    largest (:func:`_keep_two_pools`; each job's subproblem optimum spans at most two pools, 004 Sec. 4.1)."""
    m = x_wide.shape[1]
    member, cand_t, a_t, d_t = lp.member, lp.cand, lp.a_t, lp.d_t
    x_jobs = x_wide.copy()
    touched = np.unique(member[mixed])
    stay = np.setdiff1d(np.arange(lp.k), touched)
    fixed_rows = np.isin(member, touched)
    fixed_rows[mixed] = False
    d_jobs = d_t[member]
    left = np.maximum(lp.remaining - (d_jobs[fixed_rows] * x_jobs[fixed_rows]).sum(0), 0.0)
    share = a_t[member[mixed]] * x_jobs[mixed]
    top = np.argsort(-share, axis=1, kind="stable")[:, :2]
    pair = np.zeros((mixed.size, m), dtype=bool)
    np.put_along_axis(pair, top, True, axis=1)
    cm = member[mixed]
    x2 = _split_lp(
        np.vstack([cand_t[stay], pair & cand_t[cm]]),
        np.vstack([a_t[stay], a_t[cm]]),
        np.vstack([d_t[stay], d_t[cm]]),
        np.vstack([lp.slopes[stay], lp.slopes[cm]]),
        np.vstack([lp.lengths[stay], lp.lengths[cm]]),
        np.concatenate([lp.weight[stay], np.ones(mixed.size, dtype=lp.weight.dtype)]),
        left,
    )
    if x2 is not None:
        lp.deal(x_jobs, stay, x2[: stay.size])
        x_jobs[mixed] = x2[stay.size :]
    _keep_two_pools(x_jobs, a_t[member])
    return lp.finish(x_jobs)


#: Candidate-pool tolerances tried in turn by :func:`recover`: exact ties first, then near ties, which lets the LP
#: reach U* from prices that are only close to optimal (piecewise-linear g: linear and target utilities).
RECOVERY_RTOLS = (1e-6, 1e-3, 3e-2)


def recover(oracle: DualOracle, ev: Evaluation, target: float) -> bool:
    """Try the LP recovery (:func:`recover_allocation`) at ``ev``'s prices (single process only), with each
    tolerance of :data:`RECOVERY_RTOLS` until its utility reaches ``target``; keep the best in ``ev`` (raising
    ``ev.primal``, the lower bound of Alg. 2's stopping rule) when it beats the column-scaled allocation of 004
    Sec. 5."""
    if oracle.group is not None or ev.recovered is not None:
        return False
    if split_jobs(ev.subsolution(), oracle.m) > MAX_SCAN:
        return False  # a large market of distinct jobs: too many tied jobs to sort into classes
    prob = oracle.prob
    costs = oracle.costs(oracle.prices_array(ev.prices))
    best: Recovery | None = None
    for rtol in RECOVERY_RTOLS:
        rec = recover_allocation(
            prob.a, costs, prob.demand, oracle.cap64, ev.subsolution(), prob.utility, rtol=rtol, target=target
        )
        if rec is not None and (best is None or rec.utility > best.utility):
            best = rec
        if best is not None and best.utility >= target:
            break
    if best is None or not best.utility > ev.primal:
        return False
    ev.recovered = best
    ev.primal = best.utility
    return True
