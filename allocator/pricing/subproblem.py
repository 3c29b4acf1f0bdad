"""Per-job subproblem of price discovery, solved analytically and vectorised over jobs (paper 004, Sec. 4, Alg. 1).

For prices ``p`` and job ``i`` with throughputs ``a_ij`` and demands ``d_ij`` the subproblem (eq. 10) is

    maximise u_i(t) - c_i(t),    c_i(t) = min { sum_j p_j d_ij x_j : x >= 0, 1^T x <= 1, a_i^T x = t },

and ``c_i`` is the lower convex hull of the points ``(0, 0)`` and ``(a_ij, c_ij)`` with ``c_ij = p_j d_ij``
(Sec. 4.1; the demand multiplies the price as in Sec. 7.1). Two solvers live here:

:func:`solve_hull`
    walks the hull from ``(0, 0)`` to the right, one vertex per step (gift wrapping: the next vertex is the point
    right of the current one with the smallest slope, ties resolved to any of them, which only splits a collinear
    segment). On each segment ``c`` is affine with slope ``alpha`` and the utility's ``argmax`` gives the best ``t``
    there (eq. 15/16). Because ``u - c`` is concave, the first segment whose maximiser lies left of its right end
    holds a global maximiser; a job stops walking there, and the walk continues only on the jobs still climbing
    (compacted each step). Memory: a few ``n x m`` temporaries; work: at most ``m`` steps of ``O(m)`` per job, and
    in practice most jobs stop after one or two steps.
:func:`solve_pairs`
    the enumeration of Alg. 1 step 1: every chord between two of the ``m + 1`` points is an upper bound of ``c`` on
    its interval, and the hull segments are among them, so the best chord-restricted maximiser over all
    ``m (m + 1) / 2`` chords solves the subproblem. It materialises ``n x m(m+1)/2`` tensors and evaluates the
    utility on every chord; kept as an independent reference and for the hull-vs-pairs benchmark.

On CPU, for the built-in utility families, :func:`solve_hull` runs the same walk compiled, one job at a time
(:mod:`allocator.pricing.kernels`): the torch walk costs a few dozen tensor operations per evaluation whatever ``n``
is, which dominates small markets (10^4 jobs: about 3.5x slower than the compiled walk on this project's 2-core
machine, 1 thread). The torch walk remains the path on CUDA and for user-defined utilities, and the reference the
compiled walk is tested against.

Both return a :class:`Subsolution`: the optimal ``t`` and the (at most two, Sec. 4.1) pools used, as a left and a
right vertex of the active segment with their time fractions (pool index ``m`` stands for "none": the origin or the
slack), so resource usage and the feasible-allocation utility are computed without an ``n x m`` allocation matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from allocator.utilities import Utility

__all__ = ["Subsolution", "solve_hull", "solve_pairs"]


@dataclass
class Subsolution:
    """Optimal solutions of all job subproblems at one price vector (all tensors have shape ``(n,)``).

    Job ``i`` runs a fraction ``x_lo[i]`` of its time on pool ``j_lo[i]`` and ``x_hi[i]`` on pool ``j_hi[i]``
    (index ``m`` = unused, fraction 0); ``a_*`` and ``c_*`` are the throughputs and costs ``p_j d_ij`` of those
    pools, so ``t = a_lo x_lo + a_hi x_hi`` and ``c(t) = c_lo x_lo + c_hi x_hi``.
    """

    t: Tensor
    j_lo: Tensor
    x_lo: Tensor
    a_lo: Tensor
    c_lo: Tensor
    j_hi: Tensor
    x_hi: Tensor
    a_hi: Tensor
    c_hi: Tensor

    def cost(self) -> Tensor:
        """``c_i(t_i)``: what each job pays at the prices of this evaluation."""
        return self.x_lo * self.c_lo + self.x_hi * self.c_hi

    def dense(self, m: int, scale: Tensor | None = None) -> Tensor:
        """The allocation as an ``n x m`` matrix, each column multiplied by ``scale`` (``(m,)``) when given."""
        n = self.t.shape[0]
        if self.t.device.type == "cpu":
            from allocator.pricing.kernels import dense_fill

            s = np.ones(m) if scale is None else scale.detach().double().cpu().numpy()
            out = dense_fill(
                self.j_lo.numpy(),
                self.x_lo.numpy(),
                self.j_hi.numpy(),
                self.x_hi.numpy(),
                s,
                m,
                self.x_lo.numpy().dtype,
            )
            return torch.from_numpy(out)
        x = torch.zeros((n, m + 1), dtype=self.t.dtype, device=self.t.device)
        x.scatter_add_(1, self.j_lo.unsqueeze(1), self.x_lo.unsqueeze(1))
        x.scatter_add_(1, self.j_hi.unsqueeze(1), self.x_hi.unsqueeze(1))
        return x[:, :m] if scale is None else x[:, :m] * scale


def _assemble(a: Tensor, c: Tensor, t: Tensor, j_lo: Tensor, j_hi: Tensor) -> Subsolution:
    """The full :class:`Subsolution` from each job's optimal ``t`` and the two ends ``j_lo``, ``j_hi`` of its active
    segment (index ``m``: the origin or none). Throughputs and costs of the ends are gathered once here, so the hull
    walk only carries three ``(n,)`` tensors; ``x_hi = (t - a_lo) / (a_hi - a_lo)``, ``x_lo = 1 - x_hi`` when the left
    end is a pool (Sec. 4.1: a point of the segment is a convex combination of its ends)."""
    m = a.shape[1]
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    lo_ok = j_lo < m
    hi_ok = j_hi < m
    lo_idx = j_lo.clamp(max=m - 1).unsqueeze(1)
    hi_idx = j_hi.clamp(max=m - 1).unsqueeze(1)
    a_lo = torch.where(lo_ok, a.gather(1, lo_idx).squeeze(1), zero)
    c_lo = torch.where(lo_ok, c.gather(1, lo_idx).squeeze(1), zero)
    a_hi = torch.where(hi_ok, a.gather(1, hi_idx).squeeze(1), zero)
    c_hi = torch.where(hi_ok, c.gather(1, hi_idx).squeeze(1), zero)
    span = a_hi - a_lo
    x_hi = torch.where(hi_ok & (span > 0), (t - a_lo) / torch.where(span > 0, span, torch.ones_like(span)), zero)
    x_lo = torch.where(lo_ok, 1 - x_hi, zero)
    return Subsolution(t=t, j_lo=j_lo, x_lo=x_lo, a_lo=a_lo, c_lo=c_lo, j_hi=j_hi, x_hi=x_hi, a_hi=a_hi, c_hi=c_hi)


def solve_hull(
    a: Tensor, c: Tensor, utility: Utility, *, a_pos: Tensor | None = None, compiled: bool | None = None
) -> Subsolution:
    """Solve every job's subproblem by walking the lower convex hull of ``(0,0), (a_ij, c_ij)`` (see module doc).

    ``a`` and ``c`` are ``n x m`` (throughputs and costs ``p_j d_ij``), ``utility`` describes the ``n`` jobs.
    ``a_pos`` (optional, ``a > 0``) can be passed precomputed since it does not depend on the prices.
    The walk records only ``t`` and the segment ends per job; :func:`_assemble` derives the rest once at the end.

    On CPU, for the built-in utility families (``utility.kernel_spec()``), the same walk runs compiled, one job at a
    time (:mod:`allocator.pricing.kernels`), unless ``compiled=False``; ``compiled=True`` requires it. The torch walk
    below is the path everywhere else (CUDA, user-defined utilities).
    """
    if compiled is not False and a.device.type == "cpu":
        spec = getattr(utility, "kernel_spec", None)
        fast = spec() if spec is not None else None
        if fast is not None:
            from allocator.pricing.kernels import walk

            an = a.detach().contiguous().numpy()
            c = c.detach().to(a.dtype)
            if c.shape[0] > 1 and c.stride(0) == 0:
                c = c[:1]  # the same costs for every job (unit demands): one row, not an n x m copy
            cn = c.contiguous().numpy()
            family, w, q = fast
            # parameters in the working dtype, as the torch walk uses them (a float32 quotient w / alpha rounds as
            # it does there, so a job at a vertex is reported at the same vertex)
            fields = walk(an, cn, family, w.astype(an.dtype), q.astype(an.dtype))
            names = ("t", "j_lo", "x_lo", "a_lo", "c_lo", "j_hi", "x_hi", "a_hi", "c_hi")
            return Subsolution(**{name: torch.from_numpy(v) for name, v in zip(names, fields)})
    if compiled:
        raise ValueError("compiled=True needs a CPU tensor and a utility with a compiled form (kernel_spec)")
    n, m = a.shape
    dtype, device = a.dtype, a.device
    inf = torch.tensor(float("inf"), dtype=dtype, device=device)
    if a_pos is None:
        a_pos = a > 0
    # Step 0 from the origin: the most efficient pool, slope c/a (pools with a = 0 are never used).
    slope = torch.where(a_pos, c / a, inf)
    s, k = slope.min(dim=1)
    del slope
    has = s < inf
    kk = k.unsqueeze(1)
    na = a.gather(1, kk).squeeze(1)
    zero = torch.zeros((), dtype=dtype, device=device)
    # Rows that cannot run anywhere (all a = 0): alpha = inf makes every argmax return gamma = 0.
    t = utility.argmax(s, torch.zeros_like(s), torch.where(has, na, zero))
    done = (~has) | (t < na)
    j_lo = torch.full((n,), m, dtype=torch.long, device=device)
    j_hi = torch.where(has, k, j_lo)
    if m == 1 or bool(done.all()):
        return _assemble(a, c, t, j_lo, j_hi)
    t_out = t
    # Continue with the jobs still climbing: their current vertex is the pool just reached.
    keep = torch.nonzero(~done).squeeze(1)
    active = keep
    a_act = a.index_select(0, keep)
    c_act = c.index_select(0, keep)
    cur_a = na.index_select(0, keep)
    cur_c = c_act.gather(1, k.index_select(0, keep).unsqueeze(1)).squeeze(1)
    cur_j = k.index_select(0, keep)
    util = utility.take(keep)
    for _ in range(1, m):
        da = a_act - cur_a.unsqueeze(1)
        slope = torch.where(da > 0, (c_act - cur_c.unsqueeze(1)) / da, inf)
        del da
        s, k = slope.min(dim=1)
        del slope
        has = s < inf
        kk = k.unsqueeze(1)
        na = torch.where(has, a_act.gather(1, kk).squeeze(1), cur_a)
        t = util.argmax(torch.where(has, s, zero), cur_a, na)
        t = torch.where(has, t, cur_a)
        done = (~has) | (t < na)
        # Jobs at their last vertex use that pool fully; otherwise the segment (cur, next) is active.
        t_out.index_copy_(0, active, t)
        j_lo.index_copy_(0, active, torch.where(has, cur_j, torch.full_like(k, m)))
        j_hi.index_copy_(0, active, torch.where(has, k, cur_j))
        if bool(done.all()):
            break
        sel = torch.nonzero(~done).squeeze(1)
        active = active.index_select(0, sel)
        a_act = a_act.index_select(0, sel)
        c_act = c_act.index_select(0, sel)
        cur_a = na.index_select(0, sel)
        cur_j = k.index_select(0, sel)
        cur_c = c_act.gather(1, cur_j.unsqueeze(1)).squeeze(1)
        util = util.take(sel)
    return _assemble(a, c, t_out, j_lo, j_hi)


def pair_indices(m: int, device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Index pairs ``(v, w)`` over points ``0..m`` where ``m`` is the origin: all ``m (m + 1) / 2`` chords."""
    lo, hi = torch.triu_indices(m + 1, m + 1, offset=1, device=device)
    return lo, hi


def solve_pairs(a: Tensor, c: Tensor, utility: Utility) -> Subsolution:
    """Solve every job's subproblem by enumerating all ``m (m + 1) / 2`` chords (Alg. 1 as written, see module doc)."""
    n, m = a.shape
    dtype, device = a.dtype, a.device
    zcol = torch.zeros((n, 1), dtype=dtype, device=device)
    a1 = torch.cat([a, zcol], dim=1)  # point m is the origin
    c1 = torch.cat([c, zcol], dim=1)
    lo, hi = pair_indices(m, device)
    av, aw = a1[:, lo], a1[:, hi]
    cv, cw = c1[:, lo], c1[:, hi]
    swap = av > aw
    a_l, a_r = torch.where(swap, aw, av), torch.where(swap, av, aw)
    c_l, c_r = torch.where(swap, cw, cv), torch.where(swap, cv, cw)
    j_l = torch.where(swap, hi.expand(n, -1), lo.expand(n, -1))
    j_r = torch.where(swap, lo.expand(n, -1), hi.expand(n, -1))
    valid = a_r > a_l
    span = torch.where(valid, a_r - a_l, torch.ones_like(a_r))
    slope = torch.where(valid, (c_r - c_l) / span, torch.zeros_like(span))
    npairs = lo.shape[0]
    flat = torch.arange(n, device=device).repeat_interleave(npairs)
    util = utility.take(flat) if utility.n_jobs is not None else utility
    t = util.argmax(slope.reshape(-1), a_l.reshape(-1), a_r.reshape(-1)).reshape(n, npairs)
    net = util.value(t.reshape(-1)).reshape(n, npairs) - (c_l + slope * (t - a_l))
    ninf = torch.tensor(float("-inf"), dtype=dtype, device=device)
    net = torch.where(valid, torch.nan_to_num(net, nan=float("-inf")), ninf)
    best = net.argmax(dim=1, keepdim=True)
    anyv = valid.any(dim=1)
    zero = torch.zeros(n, dtype=dtype, device=device)
    none = torch.full((n,), m, dtype=torch.long, device=device)

    def pick(x: Tensor) -> Tensor:
        return x.gather(1, best).squeeze(1)

    tb, al, ar, cl, cr = pick(t), pick(a_l), pick(a_r), pick(c_l), pick(c_r)
    jl, jr = pick(j_l), pick(j_r)
    frac_hi = torch.where(anyv, (tb - al) / pick(span), zero)
    frac_lo = torch.where(anyv & (jl < m), 1 - frac_hi, zero)
    return Subsolution(
        t=torch.where(anyv, tb, zero),
        j_lo=torch.where(anyv, jl, none),
        x_lo=frac_lo,
        a_lo=torch.where(anyv & (jl < m), al, zero),
        c_lo=torch.where(anyv & (jl < m), cl, zero),
        j_hi=torch.where(anyv, jr, none),
        x_hi=frac_hi,
        a_hi=torch.where(anyv, ar, zero),
        c_hi=torch.where(anyv, cr, zero),
    )
