"""Compiled exact progressive filling of one server (paper 002 Sec. 2.3, Definition 4; eq. 9).

:func:`fill_column` computes what :func:`allocator.fairness.psdsf.fill_server` computes, the weighted max-min column
of one server on the levels ``(o_n + y_n) / b_n``, in one compiled call. The numpy function stays the reference
(``tests/test_fairness_fill_kernels.py`` compares the two); this one removes its per-call interpreter overhead, which
dominated a Gauss-Seidel sweep over many servers with a few hundred users each (about 0.8 ms per server at
1000 x 500). The arithmetic follows the reference step by step: the same stable order of breakpoints, the same
cumulative sums in the same order, the same tolerances; only the final products ``dem.T @ y`` are summed in a loop
rather than by BLAS.
"""

from __future__ import annotations

import numpy as np

from allocator._jit import njit

from .._model import FloatArray


@njit(error_model="numpy")
def first_crossing(b: FloatArray, o: FloatArray, u: FloatArray, dem: FloatArray, rem: FloatArray) -> FloatArray:
    """Smallest ``t`` with ``sum_n dem[n, r] clip(t b_n - o_n, 0, u_n) >= rem[r]``, per resource (``inf`` if never);
    as :func:`allocator.fairness.psdsf.filling._first_crossing` (breakpoints ``o_n / b_n`` and
    ``(o_n + u_n) / b_n``)."""
    m, r = dem.shape
    start = o / b
    nfin = 0
    for n in range(m):
        if np.isfinite(u[n]):
            nfin += 1
    size = m + nfin
    times = np.empty(size)
    dslope = np.empty((size, r))
    dinter = np.empty((size, r))
    for n in range(m):
        times[n] = start[n]
        for q in range(r):
            dslope[n, q] = dem[n, q] * b[n]
            dinter[n, q] = dem[n, q] * o[n]
    p = m
    for n in range(m):
        if np.isfinite(u[n]):
            times[p] = (o[n] + u[n]) / b[n]
            for q in range(r):
                dslope[p, q] = -(dem[n, q] * b[n])
                dinter[p, q] = -(dem[n, q] * (o[n] + u[n]))
            p += 1
    order = np.argsort(times, kind="mergesort")
    out = np.full(r, np.inf)
    for q in range(r):
        if rem[q] <= 0:
            # saturated already: blocks from the moment a user that needs it would start receiving
            best = np.inf
            for n in range(m):
                if dem[n, q] > 0 and start[n] < best:
                    best = start[n]
            out[q] = best
            continue
        slope = 0.0
        inter = 0.0
        prev_slope = 0.0
        prev_inter = 0.0
        prev_time = 0.0
        found = False
        for jj in range(size):
            i = order[jj]
            slope += dslope[i, q]
            inter += dinter[i, q]
            t = times[i]
            if t * slope - inter >= rem[q] * (1 - 1e-13):
                if jj == 0:
                    out[q] = t
                else:
                    v = (rem[q] + prev_inter) / prev_slope if prev_slope > 0 else t
                    out[q] = min(max(v, prev_time), t)
                found = True
                break
            prev_slope, prev_inter, prev_time = slope, inter, t
        if not found and slope > 0:
            out[q] = max((rem[q] + inter) / slope, times[order[size - 1]])
    return out


@njit(error_model="numpy")
def fill_column(b: FloatArray, o: FloatArray, u: FloatArray, dem: FloatArray, cap: FloatArray) -> FloatArray:
    """Tasks ``y`` ``(m,)`` of the weighted max-min column of one server (as :func:`allocator.fairness.psdsf.
    fill_server`, whose docstring gives the arguments): feasible and non-wasteful."""
    m, r = dem.shape
    y = np.zeros(m)
    active = np.zeros(m, dtype=np.bool_)
    for n in range(m):
        if u[n] > 0:
            for q in range(r):
                if dem[n, q] > 0:
                    active[n] = True
                    break
    used = np.zeros(r)
    while True:
        a = np.flatnonzero(active)
        na = a.size
        if na == 0:
            break
        need = np.zeros(r, dtype=np.bool_)
        for q in range(r):
            for i in range(na):
                if dem[a[i], q] > 0:
                    need[q] = True
                    break
        cols = np.flatnonzero(need)
        ba = b[a]
        oa = o[a]
        ua = u[a]
        da = np.empty((na, cols.size))
        rem = np.empty(cols.size)
        for c in range(cols.size):
            rem[c] = max(cap[cols[c]] - used[cols[c]], 0.0)
            for i in range(na):
                da[i, c] = dem[a[i], cols[c]]
        t_r = np.full(r, np.inf)
        tc = first_crossing(ba, oa, ua, da, rem)
        for c in range(cols.size):
            t_r[cols[c]] = tc[c]
        t_star = t_r.min()
        if not np.isfinite(t_star):
            for i in range(na):
                y[a[i]] = ua[i]  # every active user reaches its cap before any resource saturates
            break
        ya = np.empty(na)
        for i in range(na):
            ya[i] = min(max(t_star * ba[i] - oa[i], 0.0), ua[i])
            y[a[i]] = ya[i]
        sat = t_r <= t_star * (1 + 1e-12) + 1e-300
        freeze = np.zeros(na, dtype=np.bool_)
        anyf = False
        for i in range(na):
            f = ya[i] >= ua[i]
            if not f:
                for q in range(r):
                    if sat[q] and dem[a[i], q] > 0:
                        f = True
                        break
            freeze[i] = f
            anyf = anyf or f
        if not anyf:  # numerical guard: freeze the users of the first saturating resource
            q0 = int(np.argmin(t_r))
            for i in range(na):
                freeze[i] = dem[a[i], q0] > 0
        for q in range(r):
            s = 0.0
            for i in range(na):
                if freeze[i]:
                    s += dem[a[i], q] * ya[i]
            used[q] = used[q] + s
        for i in range(na):
            if freeze[i]:
                active[a[i]] = False
    # remove round-off overshoot so the column is feasible
    worst = 0.0
    for q in range(r):
        load = 0.0
        for n in range(m):
            load += dem[n, q] * y[n]
        if cap[q] > 0:
            over = load / cap[q]
        elif load > 0:
            over = np.inf
        else:
            over = 0.0
        if over > worst:
            worst = over
    if worst > 1.0:
        for n in range(m):
            y[n] = y[n] / worst
    return y
