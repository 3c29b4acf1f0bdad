"""Compiled local search of :mod:`allocator.colocation._search` (moves, swaps, zero-gain plateau steps, tabu).

State per machine ``k``: per-type loads ``L[k]`` and counts ``N[k]`` (paper 001, Sec. 2), ``E[k] = L[k] @ alpha``
(the load that hits each victim type) and ``G[k] = N[k] @ alpha.T``. Removing a task ``(p, a)`` from machine ``k`` and
adding ``(q, b)`` changes the linear cost (eq. (1), ``L alpha N``) by::

    q G[b] - p G[a] + E[b] - E[a] + q alpha[b, b] - q alpha[b, a] - p alpha[a, b] + p alpha[a, a]

(either half alone when only one task moves), in O(1). For the power cost ``f(x) = x**e`` (Sec. 7) the new machine
cost ``sum_u N_u f(E_u)`` is evaluated in O(T).

For linear costs this change is affine in ``p`` and in ``q`` separately, so over the tasks of one type on one machine
the best move and the best swap use the smallest or the largest task of that type (the same exchange argument as the
OrS property, Lemma 4.1): the kernel evaluates only those extremes and loses no improving move or swap. For the power
cost the change is convex in ``p``, so every task is tried as a move; swaps still use the extremes (a heuristic
restriction).

Best-improvement descent keeps, for every pair of machines ``k < l``, the best move or swap between them; after a step
only the pairs that touch the two changed machines are evaluated again. At a local optimum a zero-gain step (plateau,
``|delta| <= tol``) among tasks that are not tabu is taken, its tasks become tabu for ``tenure`` plateau steps, and the
descent goes on; at most ``plateau`` such steps are taken since the last new best. The best partition seen is
returned.
"""

from __future__ import annotations

import numpy as np

from allocator._jit import njit


@njit(nogil=True)
def _fpow(x, expo):  # pragma: no cover - compiled
    if x <= 0.0:
        return 0.0
    if expo == 2.0:
        return x * x
    return x**expo


@njit(nogil=True)
def _mdelta(k, a, p, b, q, E, G, N, mc, alpha, kind, expo):  # pragma: no cover - compiled
    """Cost change of machine ``k`` when task ``(p, a)`` leaves (``a >= 0``) and ``(q, b)`` arrives (``b >= 0``)."""
    if kind == 0:
        d = 0.0
        if a >= 0:
            d += -p * G[k, a] - E[k, a] + p * alpha[a, a]
        if b >= 0:
            d += q * G[k, b] + E[k, b] + q * alpha[b, b]
        if a >= 0 and b >= 0:
            d -= q * alpha[b, a] + p * alpha[a, b]
        return d
    T = E.shape[1]
    tot = 0.0
    for u in range(T):
        e = E[k, u]
        nn = N[k, u]
        if a >= 0:
            e -= p * alpha[a, u]
            if u == a:
                nn -= 1.0
        if b >= 0:
            e += q * alpha[b, u]
            if u == b:
                nn += 1.0
        if nn > 0.0:
            tot += nn * _fpow(e, expo)
    return tot - mc[k]


@njit(nogil=True)
def _index(assign, types, sizes, m, T, order, mstart, lo, hi):  # pragma: no cover - compiled
    """Tasks by machine (counting sort into ``order``/``mstart``) and the smallest/largest task per (machine, type)."""
    n = assign.shape[0]
    cnt = np.zeros(m + 1, np.int64)
    for i in range(n):
        cnt[assign[i] + 1] += 1
    for k in range(m):
        cnt[k + 1] += cnt[k]
    for k in range(m + 1):
        mstart[k] = cnt[k]
    for i in range(n):
        k = assign[i]
        order[cnt[k]] = i
        cnt[k] += 1
    for k in range(m):
        for t in range(T):
            lo[k, t] = -1
            hi[k, t] = -1
        for s in range(mstart[k], mstart[k + 1]):
            i = order[s]
            t = types[i]
            if lo[k, t] < 0 or sizes[i] < sizes[lo[k, t]]:
                lo[k, t] = i
            if hi[k, t] < 0 or sizes[i] > sizes[hi[k, t]]:
                hi[k, t] = i


@njit(nogil=True)
def _extremes(assign, types, sizes, u, v, lo, hi):  # pragma: no cover - compiled
    """Smallest/largest task per type on machines ``u`` and ``v`` only (the two a step changed)."""
    T = lo.shape[1]
    for t in range(T):
        lo[u, t] = -1
        hi[u, t] = -1
        lo[v, t] = -1
        hi[v, t] = -1
    for i in range(assign.shape[0]):
        k = assign[i]
        if k != u and k != v:
            continue
        t = types[i]
        if lo[k, t] < 0 or sizes[i] < sizes[lo[k, t]]:
            lo[k, t] = i
        if hi[k, t] < 0 or sizes[i] > sizes[hi[k, t]]:
            hi[k, t] = i


@njit(nogil=True)
def _pair(
    k,
    l,
    sizes,
    types,
    dem,
    E,
    G,
    N,
    mc,
    D,
    C,
    cap,
    mt,
    alpha,
    kind,
    expo,
    limited,
    order,
    mstart,
    lo,
    hi,
    tabu,
    step,
    use_tabu,
    res,
):  # pragma: no cover - compiled
    """Best move (k -> l, l -> k) or swap between machines ``k`` and ``l``; writes (delta, i, j, dst) into ``res``.

    ``j = -1`` for a move of task ``i`` to ``dst``. Candidates that change no cost (a lone task to an empty machine,
    a swap of two tasks of the same type, size and demand) are skipped; with ``use_tabu`` so are the tasks
    with ``tabu[i] > step``. Returns the number of candidates evaluated.
    """
    T = E.shape[1]
    best = np.inf
    bi = -1
    bj = -1
    bd = -1
    evals = 0
    # linear cost, no tabu: the change is affine in each moved size, so the sign of its slope picks the smallest or
    # the largest task (one candidate instead of two per type, one instead of four per pair of types); under limits
    # the others are still tried when that one does not fit
    analytic = kind == 0 and not use_tabu
    slack = 1 + 1e-12
    for side in range(2):
        src = k if side == 0 else l
        dst = l if side == 0 else k
        if C[src] == 0:
            continue
        if C[src] == 1 and C[dst] == 0:
            continue
        if limited and C[dst] + 1 > mt[dst]:
            continue
        if kind == 0:
            for a in range(T):
                if lo[src, a] < 0:
                    continue
                one = -1
                if analytic:
                    slope = G[dst, a] - G[src, a] + 2.0 * alpha[a, a]
                    one = lo[src, a] if slope >= 0.0 or sizes[hi[src, a]] == sizes[lo[src, a]] else hi[src, a]
                    if limited and D[dst] + dem[one] > cap[dst] * slack + 1e-12:
                        one = -1
                for rep in range(2):
                    i = lo[src, a] if rep == 0 else hi[src, a]
                    if rep == 1 and sizes[i] == sizes[lo[src, a]]:
                        continue
                    if one >= 0 and i != one:
                        continue
                    if use_tabu and tabu[i] > step:
                        continue
                    if limited and D[dst] + dem[i] > cap[dst] * slack + 1e-12:
                        continue
                    p = sizes[i]
                    d = _mdelta(src, a, p, -1, 0.0, E, G, N, mc, alpha, kind, expo) + _mdelta(
                        dst, -1, 0.0, a, p, E, G, N, mc, alpha, kind, expo
                    )
                    evals += 1
                    if d < best:
                        best, bi, bj, bd = d, i, -1, dst
        else:
            for s in range(mstart[src], mstart[src + 1]):
                i = order[s]
                if use_tabu and tabu[i] > step:
                    continue
                if limited and D[dst] + dem[i] > cap[dst] * slack + 1e-12:
                    continue
                a = types[i]
                p = sizes[i]
                d = _mdelta(src, a, p, -1, 0.0, E, G, N, mc, alpha, kind, expo) + _mdelta(
                    dst, -1, 0.0, a, p, E, G, N, mc, alpha, kind, expo
                )
                evals += 1
                if d < best:
                    best, bi, bj, bd = d, i, -1, dst
    if C[k] > 0 and C[l] > 0:
        for a in range(T):
            if lo[k, a] < 0:
                continue
            for b in range(T):
                if lo[l, b] < 0:
                    continue
                i1 = -1
                j1 = -1
                if analytic:
                    s1 = G[l, a] - G[k, a] + 2.0 * (alpha[a, a] - alpha[a, b])
                    s2 = G[k, b] - G[l, b] + 2.0 * (alpha[b, b] - alpha[b, a])
                    i1 = lo[k, a] if s1 >= 0.0 or sizes[hi[k, a]] == sizes[lo[k, a]] else hi[k, a]
                    j1 = lo[l, b] if s2 >= 0.0 or sizes[hi[l, b]] == sizes[lo[l, b]] else hi[l, b]
                    if limited and (
                        D[k] - dem[i1] + dem[j1] > cap[k] * slack + 1e-12
                        or D[l] - dem[j1] + dem[i1] > cap[l] * slack + 1e-12
                    ):
                        i1 = -1
                        j1 = -1
                for r1 in range(2):
                    i = lo[k, a] if r1 == 0 else hi[k, a]
                    if r1 == 1 and sizes[i] == sizes[lo[k, a]]:
                        continue
                    if i1 >= 0 and i != i1:
                        continue
                    if use_tabu and tabu[i] > step:
                        continue
                    for r2 in range(2):
                        j = lo[l, b] if r2 == 0 else hi[l, b]
                        if r2 == 1 and sizes[j] == sizes[lo[l, b]]:
                            continue
                        if j1 >= 0 and j != j1:
                            continue
                        if use_tabu and tabu[j] > step:
                            continue
                        if a == b and sizes[i] == sizes[j] and dem[i] == dem[j]:
                            continue
                        if limited and (
                            D[k] - dem[i] + dem[j] > cap[k] * slack + 1e-12
                            or D[l] - dem[j] + dem[i] > cap[l] * slack + 1e-12
                        ):
                            continue
                        p = sizes[i]
                        q = sizes[j]
                        d = _mdelta(k, a, p, b, q, E, G, N, mc, alpha, kind, expo) + _mdelta(
                            l, b, q, a, p, E, G, N, mc, alpha, kind, expo
                        )
                        evals += 1
                        if d < best:
                            best, bi, bj, bd = d, i, j, l
    res[0] = best
    res[1] = bi
    res[2] = bj
    res[3] = bd
    return evals


@njit(nogil=True)
def _shift(mach, t, p, d, sign, L, N, E, G, D, C, alpha):  # pragma: no cover - compiled
    """Add (``sign = 1``) or remove (``-1``) a task of type ``t``, size ``p`` and demand ``d`` on machine ``mach``."""
    L[mach, t] += sign * p
    N[mach, t] += sign
    for u in range(L.shape[1]):
        E[mach, u] += sign * p * alpha[t, u]
        G[mach, u] += sign * alpha[u, t]
    D[mach] += sign * d
    C[mach] += sign


@njit(nogil=True)
def _machine_cost(mach, N, E, kind, expo):  # pragma: no cover - compiled
    """``sum_u N[u] E[u]`` (linear) or ``sum_u N[u] f(E[u])`` (power) of one machine."""
    tot = 0.0
    for u in range(N.shape[1]):
        if N[mach, u] > 0.0:
            tot += N[mach, u] * (E[mach, u] if kind == 0 else _fpow(E[mach, u], expo))
    return tot


@njit(nogil=True)
def _apply(i, dst, sizes, types, dem, assign, L, N, E, G, mc, D, C, alpha, kind, expo):  # pragma: no cover
    """Move task ``i`` to machine ``dst`` and update the per-machine state."""
    src = assign[i]
    _shift(src, types[i], sizes[i], dem[i], -1.0, L, N, E, G, D, C, alpha)
    _shift(dst, types[i], sizes[i], dem[i], 1.0, L, N, E, G, D, C, alpha)
    assign[i] = dst
    mc[src] = _machine_cost(src, N, E, kind, expo)
    mc[dst] = _machine_cost(dst, N, E, kind, expo)


@njit(nogil=True)
def local_search(
    sizes, types, dem, assign, alpha, m, kind, expo, limited, cap, mt, budget, plateau, tenure, out
):  # pragma: no cover - compiled
    """Descent with moves and swaps plus zero-gain plateau steps (module docstring) from ``assign`` (modified).

    Returns the best partition seen; ``out`` receives (evaluations, steps taken, plateau steps taken).
    """
    n = sizes.shape[0]
    T = alpha.shape[0]
    L = np.zeros((m, T))
    N = np.zeros((m, T))
    E = np.zeros((m, T))
    G = np.zeros((m, T))
    D = np.zeros(m)
    C = np.zeros(m)
    for i in range(n):
        _shift(assign[i], types[i], sizes[i], dem[i], 1.0, L, N, E, G, D, C, alpha)
    mc = np.zeros(m)
    for k in range(m):
        mc[k] = _machine_cost(k, N, E, kind, expo)
    order = np.empty(n, np.int64)
    mstart = np.empty(m + 1, np.int64)
    lo = np.empty((m, T), np.int64)
    hi = np.empty((m, T), np.int64)
    _index(assign, types, sizes, m, T, order, mstart, lo, hi)
    val = np.full((m, m), np.inf)
    mi = np.full((m, m), -1, np.int64)
    mj = np.full((m, m), -1, np.int64)
    md = np.full((m, m), -1, np.int64)
    res = np.empty(4)
    tabu = np.zeros(n, np.int64)
    dirty = np.ones(m, np.bool_)
    cur = mc.sum()
    best_cost = cur
    best = assign.copy()
    evals = 0
    steps = 0
    pstep = 0
    since_best = 0
    scan_tabu = False
    # One loop, one evaluation site (numba compiles the pair evaluation once): every pass first evaluates either the
    # pairs that touch a changed ("dirty") machine into the cache, or, for a plateau step the cache cannot serve,
    # every pair with the tabu list applied; then it picks and applies one step.
    while evals < budget:
        sbv = np.inf
        si, sj, sd = -1, -1, -1
        for k in range(m):
            for l in range(k + 1, m):
                if not scan_tabu and not (dirty[k] or dirty[l]):
                    continue
                evals += _pair(
                    k,
                    l,
                    sizes,
                    types,
                    dem,
                    E,
                    G,
                    N,
                    mc,
                    D,
                    C,
                    cap,
                    mt,
                    alpha,
                    kind,
                    expo,
                    limited,
                    order,
                    mstart,
                    lo,
                    hi,
                    tabu,
                    pstep,
                    scan_tabu,
                    res,
                )
                if scan_tabu:
                    if res[0] < sbv:
                        sbv, si, sj, sd = res[0], int(res[1]), int(res[2]), int(res[3])
                else:
                    val[k, l] = res[0]
                    mi[k, l], mj[k, l], md[k, l] = int(res[1]), int(res[2]), int(res[3])
        dirty[:] = False
        tol = 1e-10 * max(1.0, abs(cur))
        flat = True  # a zero-gain (plateau) step unless the cache offers an improving one
        if scan_tabu:
            # plateau step by full scan
            scan_tabu = False
            if si < 0 or sbv > tol:
                break
            i, j, dst = si, sj, sd
            since_best += 1
        else:
            bk, bl = -1, -1
            bv = np.inf
            for k in range(m):
                for l in range(k + 1, m):
                    if val[k, l] < bv:
                        bv, bk, bl = val[k, l], k, l
            if bk >= 0 and bv < -tol:
                i, j, dst = mi[bk, bl], mj[bk, bl], md[bk, bl]
                flat = False
            else:
                if since_best >= plateau:
                    break
                # plateau step: the best zero-gain step among tasks that are not tabu, first from the cached best
                # step of every pair, else (next pass) by a full scan that skips the tabu tasks
                pstep += 1
                bv = np.inf
                i, j, dst = -1, -1, -1
                for k in range(m):
                    for l in range(k + 1, m):
                        if val[k, l] < bv and tabu[mi[k, l]] <= pstep and (mj[k, l] < 0 or tabu[mj[k, l]] <= pstep):
                            bv, i, j, dst = val[k, l], mi[k, l], mj[k, l], md[k, l]
                if i < 0 or bv > tol:
                    scan_tabu = True
                    continue
                since_best += 1
        if flat:
            tabu[i] = pstep + tenure
            if j >= 0:
                tabu[j] = pstep + tenure
        u = assign[i]
        v = assign[j] if j >= 0 else dst
        for r in range(2 if j >= 0 else 1):
            task = i if r == 0 else j
            _apply(task, v if r == 0 else u, sizes, types, dem, assign, L, N, E, G, mc, D, C, alpha, kind, expo)
        cur = mc.sum()
        steps += 1
        if cur < best_cost - 1e-10 * max(1.0, abs(best_cost)):
            best_cost = cur
            best[:] = assign
            since_best = 0
        dirty[u] = True
        dirty[v] = True
        if kind == 0:
            _extremes(assign, types, sizes, u, v, lo, hi)
        else:
            _index(assign, types, sizes, m, T, order, mstart, lo, hi)
    out[0] = evals
    out[1] = steps
    out[2] = pstep
    return best
