"""Compiled CPU kernel of the per-job subproblem (paper 004, Sec. 4, Alg. 1): the hull walk of
:func:`allocator.pricing.dual.subproblem.solve_hull`, one job at a time in a loop compiled by numba.

The vectorised torch walk costs a few dozen tensor operations per dual evaluation whatever the number of jobs, which
is most of an evaluation below ~10^4 jobs (per-operation overhead, not arithmetic). This kernel walks each job's lower
convex hull of ``(0, 0), (a_ij, c_ij)`` left to right exactly as the torch version does (the next vertex is the
point right of the current one with the smallest slope, the first such point on ties; the walk stops at the first
segment whose maximiser lies left of its right end), with the utility's maximiser of ``u(t) - alpha t`` on a segment
in closed form (eqs. 15-16) for the built-in families, and assembles the
:class:`~allocator.pricing.dual.subproblem.Subsolution` fields (``x_hi = (t - a_lo) / (a_hi - a_lo)``, Sec. 4.1).
Slopes are computed in the input's dtype as in the torch walk and the maximisers rounded to it, so the two walks
visit the same vertices; a compound formula (power, alpha-fair, the split ``x_hi``) can still differ in the last bit.
The tests compare the two walks.

This module is the source of both routes of :mod:`allocator.pricing._compiled.kernels`: imported, it compiles just in
time (numba, on-disk cache where one is writable); :mod:`allocator.pricing._compiled.aot` compiles the same functions
ahead of time into an extension module for the signatures in :data:`SIGNATURES`.

Families (``family`` code, per-job ``w`` = weight and ``q`` = the family's parameter):
0 linear ``w t``; 1 log ``w log t``; 2 power ``sign(q) w t^q`` (``q = 1`` linear); 3 alpha-fair ``w t^(1-q)/(1-q)``
(``q = 0`` linear, ``q = 1`` log); 4 target-priority ``w min(t - q, 0)``.
"""

from __future__ import annotations

import math

import numpy as np

from allocator._jit import njit

LINEAR, LOG, POWER, ALPHA, TARGET = 0, 1, 2, 3, 4


@njit(nogil=True, error_model="numpy")
def _argmax(family: int, w: float, q: float, alpha: float, gamma: float, delta: float, single: bool) -> float:
    """A maximiser of ``u(t) - alpha t`` on ``[gamma, delta]`` (eq. 15 for strictly concave ``u``, eq. 16 for
    target-priority, an end point for linear pieces), as the torch ``argmax`` of each family computes it; with
    ``single`` the interior maximiser is rounded to float32 (for ``w / alpha`` that is the float32 quotient the torch
    walk computes, so a job clipped at a vertex is seen at the vertex)."""
    if family == LOG:
        t = w / alpha
    elif family == POWER:
        if q == 1.0:
            return delta if w > alpha else gamma
        t = (alpha / (w * abs(q))) ** (1.0 / (q - 1.0))
    elif family == ALPHA:
        if q == 0.0:
            return delta if w > alpha else gamma
        t = (w / alpha) ** (1.0 / q)
    elif family == TARGET:
        if not w > alpha:
            return gamma
        t = q
    else:
        return delta if w > alpha else gamma
    if single:
        t = float(np.float32(t))
    return min(max(t, gamma), delta)


@njit(nogil=True, error_model="numpy")
def hull_walk(
    a,
    c,
    family,
    w,
    q,
    single,
    d,
    ends,
    t_out,
    j_lo_out,
    j_hi_out,
    x_lo_out,
    a_lo_out,
    c_lo_out,
    x_hi_out,
    a_hi_out,
    c_hi_out,
    r_lo,
    r_hi,
    cost,
):
    """Fill the ``*_out`` arrays (length ``n``) with every job's subproblem solution; ``c`` has ``n`` rows or one
    (costs shared by all jobs: unit demands), ``w`` and ``q`` have length ``n`` or 1 (shared); ``single``: the arrays
    are float32.

    In the same pass, the sums of a dual evaluation that need no transcendental function (eq. 12's ``g(p)`` and its
    gradient ``R - r(p)``, 004 Sec. 3): ``r_lo[j]`` and ``r_hi[j]`` (float64, length ``m + 1``, zeroed by the
    caller) accumulate the demand each job's low and high pool carry, ``x_lo d_lo`` and ``x_hi d_hi`` in the working
    dtype, in job order (the order of ``numpy.bincount``, so they are the sums the array route computes);
    ``cost[0]`` gets ``sum_i c_i(t_i) = sum_i x_lo c_lo + x_hi c_hi`` in float64. The utilities ``u_i(t_i)`` are
    left to the caller's vectorised ``value`` (numpy's SIMD ``log`` is several times faster than a scalar one per
    job). ``d`` holds the demands: one row of one entry 1 for unit demands, else one column (per job) or
    ``m`` columns (per job and pool) in the working dtype. With ``ends`` false the end values ``a_lo``, ``c_lo``,
    ``a_hi``, ``c_hi`` are not written (their arrays may be empty): the caller gathers them when it needs them.
    The accumulation adds about 5 % to the walk; the array expressions it replaces cost about half a walk."""
    n, m = a.shape
    inf = math.inf
    shared_w = w.shape[0] == 1
    shared_q = q.shape[0] == 1
    shared_c = c.shape[0] == 1
    unit = d.shape[0] == 1 and n != 1
    per_pool = d.shape[1] == m and m > 1
    paid = 0.0
    for i in range(n):
        ci = 0 if shared_c else i
        wi = w[0] if shared_w else w[i]
        qi = q[0] if shared_q else q[i]
        # step 0 from the origin: the most efficient pool (smallest c / a among a > 0)
        s = inf
        k = -1
        for j in range(m):
            aj = a[i, j]
            if aj > 0:
                sl = c[ci, j] / aj
                if sl < s:
                    s = sl
                    k = j
        if k < 0:  # runs nowhere: t = 0, no pool
            t_out[i] = 0.0
            j_lo_out[i] = m
            j_hi_out[i] = m
            x_lo_out[i] = 0.0
            x_hi_out[i] = 0.0
            if ends:
                a_lo_out[i] = 0.0
                c_lo_out[i] = 0.0
                a_hi_out[i] = 0.0
                c_hi_out[i] = 0.0
            continue
        na = a[i, k]
        t = _argmax(family, wi, qi, s, 0.0, na, single)
        jl = m
        jh = k
        if not t < na:
            cur_a = na
            cur_c = c[ci, k]
            cur_j = k
            for _ in range(1, m):
                s = inf
                k2 = -1
                for j in range(m):
                    da = a[i, j] - cur_a
                    if da > 0:
                        sl = (c[ci, j] - cur_c) / da
                        if sl < s:
                            s = sl
                            k2 = j
                if k2 < 0:  # the last vertex: the job uses that pool fully
                    t = cur_a
                    jl = m
                    jh = cur_j
                    break
                na = a[i, k2]
                t = _argmax(family, wi, qi, s, cur_a, na, single)
                jl = cur_j
                jh = k2
                if t < na:
                    break
                cur_a = na
                cur_c = c[ci, k2]
                cur_j = k2
        # assemble (Sec. 4.1): the point t of segment (lo, hi) as a convex combination of its ends
        alo = float(a[i, jl]) if jl < m else 0.0
        clo = float(c[ci, jl]) if jl < m else 0.0
        ahi = float(a[i, jh]) if jh < m else 0.0
        chi = float(c[ci, jh]) if jh < m else 0.0
        span = ahi - alo
        xhi = (t - alo) / span if (jh < m and span > 0) else 0.0
        t_out[i] = t
        j_lo_out[i] = jl
        j_hi_out[i] = jh
        x_hi_out[i] = xhi
        x_lo_out[i] = 1.0 - xhi if jl < m else 0.0
        if ends:
            a_lo_out[i] = alo
            c_lo_out[i] = clo
            a_hi_out[i] = ahi
            c_hi_out[i] = chi
        # the stored (working dtype) fractions, as the array route sees them
        xl = x_lo_out[i]
        xh = x_hi_out[i]
        if unit:
            r_lo[jl] += xl
            r_hi[jh] += xh
        elif per_pool:
            r_lo[jl] += xl * d[i, min(jl, m - 1)]
            r_hi[jh] += xh * d[i, min(jh, m - 1)]
        else:
            r_lo[jl] += xl * d[i, 0]
            r_hi[jh] += xh * d[i, 0]
        paid += float(xl) * clo + float(xh) * chi
    cost[0] = paid


@njit(nogil=True)
def dense_fill_kernel(j_lo, x_lo, j_hi, x_hi, scale, out):
    m = out.shape[1]
    for i in range(out.shape[0]):
        j = j_lo[i]
        if j < m:
            out[i, j] += x_lo[i] * scale[j]
        j = j_hi[i]
        if j < m:
            out[i, j] += x_hi[i] * scale[j]


@njit(nogil=True)
def rows_differ_kernel(a, b, out):
    n, m = a.shape
    for i in range(n):
        for j in range(m):
            if a[i, j] != b[i, j]:  # NaN differs from everything
                out[i] = True
                break


@njit(nogil=True)
def scaled_throughput_kernel(a, j_lo, x_lo, j_hi, x_hi, scale, out):
    """``out[i] = a[i, j_lo] x_lo s[j_lo] + a[i, j_hi] x_hi s[j_hi]`` in the working dtype: each job's throughput
    after column scaling (004 Sec. 5), the ends' throughputs read from ``a`` (a fraction is 0 on pool ``m``, so any
    finite throughput stands in for that pool's)."""
    m = a.shape[1]
    for i in range(out.shape[0]):
        jl = j_lo[i]
        jh = j_hi[i]
        out[i] = a[i, min(jl, m - 1)] * x_lo[i] * scale[jl] + a[i, min(jh, m - 1)] * x_hi[i] * scale[jh]


def _signatures() -> dict[str, list[tuple[str, str]]]:
    """``{kernel: [(suffix, numba signature), ...]}``: the argument types the wrappers of
    :mod:`allocator.pricing._compiled.kernels` pass (C-contiguous arrays, float32 or float64 values, int64 indices)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for f in ("f4", "f8"):
        v = f"{f}[::1]"
        out.setdefault("hull_walk", []).append(
            (
                f,
                f"void({f}[:, ::1], {f}[:, ::1], i8, {v}, {v}, b1, {f}[:, ::1], b1, {v}, i8[::1], i8[::1], "
                + ", ".join([v] * 6)
                + ", f8[::1], f8[::1], f8[::1])",
            )
        )
        out.setdefault("dense_fill_kernel", []).append((f, f"void(i8[::1], {v}, i8[::1], {v}, {v}, {f}[:, ::1])"))
        out.setdefault("rows_differ_kernel", []).append((f, f"void({f}[:, ::1], {f}[:, ::1], b1[::1])"))
        out.setdefault("scaled_throughput_kernel", []).append(
            (f, f"void({f}[:, ::1], i8[::1], {v}, i8[::1], {v}, {v}, {v})")
        )
    return out


#: Ahead-of-time signatures per kernel (export name = kernel name + ``_`` + suffix).
SIGNATURES = _signatures()
