"""Primal recovery at given prices: an exact split of the jobs whose subproblem optimum is not unique.

Column scaling (004 Sec. 5) turns the subproblem solutions at prices ``p`` into a feasible allocation, but where the
dual function ``g`` has a kink (the optimal prices of small markets, markets of identical jobs) many jobs are
indifferent between pools, or, with linear pieces in ``u``, between throughput levels, and the subproblem solver
sends all of them to the same vertex. Their optimal split is not a property of any single job; it is the solution of
a small linear program. This module

1. identifies, at ``p``, for every job a multiplier ``lambda_i`` in the supergradient of ``u_i`` that supports the
   subproblem optimum (the slope of the active segment of ``c_i`` when the optimum is inside one, ``u_i'(t_i)``
   otherwise) and its *candidate pools*: those whose reduced value ``lambda_i a_ij - p_j d_ij`` is within a tolerance
   of ``max(0, max_k lambda_i a_ik - p_k d_ik)`` (the pools on the supporting line of Sec. 4.1, ties included);
2. fixes every job with a single candidate and a unique throughput at its subproblem solution (scaled down where it
   alone over-uses a pool), and
3. solves, for the remaining "tied" jobs, the transportation-like LP

       maximise   sum_i lambda_i a_i^T x_i
       subject to a_i^T x_i <= t_max_i,  1^T x_i <= 1,  x_ij >= 0 only on candidate pools,
                  sum_i d_ij x_ij <= R_j - (usage of the fixed jobs)_j

   with HiGHS, where ``t_max_i`` is the subproblem throughput ``t_i`` when ``u_i`` is strictly concave there (the
   throughput is unique, only the split is free) and the largest candidate throughput when ``u_i`` is affine on that
   range (linear utilities, the linear part of target-priority).

Identical tied jobs (many copies of a few job types) are solved as weighted classes, so the LP's size is the number
of distinct tied jobs, not of jobs.

The allocation is feasible by construction; a tied job the LP spreads over more than two pools keeps its two
largest (a Walras job spans at most two pools, 004 Sec. 4.1). Its exact utility is a lower bound on ``U*``; the
caller keeps it when it beats the column-scaled allocation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from allocator.pricing.subproblem import Subsolution
from allocator.utilities import Utility

__all__ = ["MAX_TIED", "Recovery", "recover_allocation", "split_jobs"]

#: Default limit on the number of classes of tied jobs handed to HiGHS (keeps one LP to tens of milliseconds).
MAX_TIED = 2_000

#: Default limit on the jobs strictly inside a hull segment (:func:`split_jobs`) for which the recovery is attempted
#: at all: it builds a few ``n x m`` temporaries and sorts the tied jobs into classes before it knows whether the LP
#: is small enough.
MAX_SCAN = 200_000


@dataclass
class Recovery:
    """A feasible allocation recovered at one price vector."""

    allocation: Tensor  #: (n, m)
    throughputs: Tensor  #: (n,)
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


def _multipliers(sol: Subsolution, utility: Utility) -> Tensor:
    """``lambda_i``: the active segment's slope when ``t_i`` lies strictly inside it, else ``u_i'(t_i)``."""
    span = sol.a_hi - sol.a_lo
    inside = (sol.x_hi > 0) & (sol.x_hi < 1) & (span > 0)
    seg = (sol.c_hi - sol.c_lo) / torch.where(span > 0, span, torch.ones_like(span))
    du = utility.derivative(sol.t)
    du = torch.where(torch.isfinite(du), du, torch.zeros_like(du))
    return torch.where(inside, seg, du)


#: Breakpoints of the piecewise-linear model of a strictly concave u_i, as multiples of the subproblem throughput.
_BREAKS = np.array([0.0, 0.25, 0.5, 0.75, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 1.0, 1.001, 1.005, 1.01, 1.02, 1.05])


def _pieces(utility: Utility, t: Tensor, mu: Tensor, affine: Tensor, t_hi: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Concave piecewise-linear model of each tied job's utility: ``(slopes, lengths)``, both ``(k, P)``.

    Affine jobs get one piece ``[0, t_hi]`` of slope ``mu``; the others the chords of ``u`` between the breakpoints
    ``_BREAKS * t`` (the first piece gets the tangent slope at its right end, finite where ``u(0) = -inf``).
    Chord slopes of a concave function decrease, so the LP fills the pieces in order and values ``t`` exactly at
    the breakpoints.
    """
    k = t.shape[0]
    npc = _BREAKS.size - 1
    tt = t.double().cpu().numpy()
    pts = torch.as_tensor(np.outer(tt, _BREAKS), dtype=t.dtype, device=t.device)  # (k, P + 1)
    util_rep = utility.take(torch.arange(k, device=t.device).repeat_interleave(npc + 1)) if k else utility
    vals = util_rep.value(pts.reshape(-1)).reshape(k, npc + 1).double().cpu().numpy()
    dvals = util_rep.derivative(pts.reshape(-1)).reshape(k, npc + 1).double().cpu().numpy()
    p64 = pts.double().cpu().numpy()
    lengths = np.diff(p64, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        slopes = np.diff(vals, axis=1) / lengths
    slopes[:, 0] = dvals[:, 1]
    slopes = np.where(np.isfinite(slopes) & (lengths > 0), slopes, 0.0)
    slopes = np.minimum.accumulate(slopes, axis=1)  # guard concavity against rounding
    aff = affine.cpu().numpy()
    if aff.any():
        slopes[aff] = 0.0
        lengths[aff] = 0.0
        slopes[aff, 0] = mu.double().cpu().numpy()[aff]
        lengths[aff, 0] = t_hi.double().cpu().numpy()[aff]
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


def recover_allocation(
    a: Tensor,
    c: Tensor,
    demand: Tensor | None,
    capacity: np.ndarray,
    sol: Subsolution,
    utility: Utility,
    *,
    rtol: float = 1e-6,
    max_tied: int = MAX_TIED,
    max_scan: int = MAX_SCAN,
) -> Recovery | None:
    """Recover a feasible allocation at the prices that produced ``sol`` (see module doc).

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
    dtype, device = a.dtype, a.device
    lam = _multipliers(sol, utility)
    t = sol.t
    # mu_i: the marginal value of throughput just below t_i (left derivative), the LP's objective weight.
    mu = utility.derivative(t * (1 - 1e-7))
    mu = torch.where(torch.isfinite(mu), mu, lam)
    rho = lam.unsqueeze(1) * a - c  # reduced value of each pool at the multiplier
    best = rho.amax(1).clamp_min(0.0)
    scale = (torch.maximum(lam.abs(), mu.abs()) * a.amax(1)).clamp_min(c.amax(1)).clamp_min(1e-30)
    tol = (rtol + (0.0 if dtype == torch.float64 else 1e-4)) * scale
    cand = (rho >= (best - tol).unsqueeze(1)) & (a > 0)
    n_cand = cand.sum(1)
    slack_ok = best <= tol  # zero throughput (the origin) is on the supporting line as well
    # Is u_i affine between t_i and the largest candidate throughput?  Then the throughput level is free too.
    t_hi = torch.where(cand, a, torch.zeros_like(a)).amax(1)
    lin_gap = utility.value(t_hi) - utility.value(t) - mu * (t_hi - t)
    affine = torch.isfinite(lin_gap) & (lin_gap.abs() <= tol * t_hi.clamp_min(1.0)) & (t_hi > t)
    tied = (n_cand >= 2) | (affine & (n_cand >= 1)) | (slack_ok & (n_cand >= 1) & (t > 0))
    k_jobs = int(tied.sum())
    if k_jobs == 0:
        return None

    # Fixed jobs: their subproblem allocation, column-scaled among themselves if they alone over-use a pool.
    x_sub = sol.dense(m)
    x_fixed = torch.where(tied.unsqueeze(1), torch.zeros_like(x_sub), x_sub)
    if demand is None:
        dd = torch.ones_like(a)
    elif demand.ndim == 1:
        dd = demand.unsqueeze(1).expand(n, m)
    else:
        dd = demand
    used = (dd * x_fixed).sum(0, dtype=torch.float64).cpu().numpy()
    col = np.ones(m)
    over = used > capacity
    col[over] = capacity[over] / used[over]
    x_fixed = x_fixed * torch.as_tensor(col, dtype=dtype, device=device)
    remaining = np.maximum(capacity - used * col, 0.0)

    idx = torch.nonzero(tied).squeeze(1)
    cand_t = cand.index_select(0, idx).cpu().numpy()
    a_t = a.index_select(0, idx).double().cpu().numpy()
    d_t = dd.index_select(0, idx).double().cpu().numpy()
    slopes, lengths = _pieces(
        utility.take(idx),
        t.index_select(0, idx),
        mu.index_select(0, idx),
        affine.index_select(0, idx),
        t_hi.index_select(0, idx),
    )
    # Classes of identical tied jobs: the LP below is over classes, weighted by their sizes.
    key = np.hstack([cand_t.astype(np.float64), a_t, d_t, slopes, lengths])
    first, member, weight = _classes(key)
    k = first.size
    if k > max_tied:
        return None
    # scipy (0.5 s to import) is loaded only when an LP is actually solved, not by ``import allocator.pricing``
    import scipy.optimize
    import scipy.sparse

    cand_t, a_t, d_t, slopes, lengths = cand_t[first], a_t[first], d_t[first], slopes[first], lengths[first]
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
    a_eq = scipy.sparse.hstack(
        [
            scipy.sparse.csr_matrix((av, (rows, var)), shape=(k, nv)),
            scipy.sparse.csr_matrix((-np.ones(k * npc), (prow, pvar - nv)), shape=(k, k * npc)),
        ]
    ).tocsr()
    # Per tied job: time <= 1; per pool: usage <= the capacity the fixed jobs leave.
    a_ub = scipy.sparse.vstack(
        [
            scipy.sparse.csr_matrix((np.ones(nv), (rows, var)), shape=(k, nv + k * npc)),
            scipy.sparse.csr_matrix((dv * w[rows], (cols, var)), shape=(m, nv + k * npc)),
        ]
    ).tocsr()
    b_ub = np.concatenate([np.ones(k), remaining])
    bounds = np.zeros((nv + k * npc, 2))
    bounds[:nv, 1] = np.inf
    bounds[nv:, 1] = lengths.reshape(-1)
    try:
        res = scipy.optimize.linprog(
            obj, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.zeros(k), bounds=bounds, method="highs"
        )
    except ValueError:
        return None
    if res.status != 0 or res.x is None:
        return None
    res_x = res.x[:nv]
    xv = np.clip(res_x, 0.0, None)
    # Remove HiGHS' feasibility tolerance: rows (time) and columns (capacity) scaled back to exact feasibility.
    row_sum = np.bincount(rows, weights=xv, minlength=k)
    xv = xv / np.maximum(row_sum, 1.0)[rows]
    col_use = np.bincount(cols, weights=dv * xv * w[rows], minlength=m)
    shrink = np.where(col_use > remaining, remaining / np.maximum(col_use, 1e-300), 1.0)
    xv = xv * shrink[cols]
    x_tied = np.zeros((k, m))
    x_tied[rows, cols] = xv
    _keep_two_pools(x_tied, a_t)
    x = x_fixed.clone()
    x.index_copy_(0, idx, torch.as_tensor(x_tied[member], dtype=dtype, device=device))
    # Casting to the working dtype may round a column a hair above its capacity: scale it back.
    usage = (dd * x).sum(0, dtype=torch.float64).cpu().numpy()
    over = usage > capacity
    if over.any():
        fix = np.ones(m)
        fix[over] = capacity[over] / usage[over] * (1 - 4 * float(torch.finfo(dtype).eps))
        x = x * torch.as_tensor(fix, dtype=dtype, device=device)
        usage = (dd * x).sum(0, dtype=torch.float64).cpu().numpy()
    thr = (a * x).sum(1)
    value = float(utility.value(thr).sum(dtype=torch.float64))
    if not np.isfinite(value):
        return None
    return Recovery(allocation=x, throughputs=thr, usage=usage, utility=value, tied_jobs=k_jobs, classes=k)
