"""The compiled kernels of the SEQ sweep (Algorithm 1 of paper 003, Section IV-A): the source of both routes of
:mod:`allocator.degree.kernels`.

Imported, this module compiles the kernels just in time (numba, on-disk cache where one is writable, see
:mod:`allocator._jit`); :mod:`allocator.degree.aot` compiles the same functions ahead of time into an extension
module for the signatures in :data:`SIGNATURES`. The data layout (the list ``V[s:e]`` / ``I[s:e]`` with prefix sums
``P``, the per-server slots and records) and the order of ties are described in :mod:`allocator.degree._engine`,
which calls these kernels through the route table.

Every array argument is C-contiguous with the dtype of :data:`SIGNATURES` (float64 values, int64 ids and indices,
int8 marks, bool flags): the ahead-of-time functions do not check their arguments' dtypes.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from allocator._jit import njit

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
Int8Array = NDArray[np.int8]

_INF = np.inf


@njit()
def _lower_bound(A: FloatArray, lo: int, hi: int, x: float) -> int:  # pragma: no cover - compiled
    """Smallest ``i`` in ``[lo, hi]`` with ``A[i] >= x`` (``hi`` if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if A[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit()
def _upper_bound(V: FloatArray, lo: int, hi: int, x: float) -> int:  # pragma: no cover - compiled
    """Smallest ``i`` in ``[lo, hi]`` with ``V[i] > x`` (``hi`` if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if V[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit()
def sweep_kernel(
    V: FloatArray,
    I: IntArray,
    P: FloatArray,
    s: int,
    e: int,
    caps: FloatArray,
    dparam: IntArray,
    start: int,
    tol: float,
    ctol: float,
    left: bool,
    off: IntArray,
    cnt: IntArray,
    a_ids: IntArray,
    a_amt: FloatArray,
    lo_v: FloatArray,
    lo_r: IntArray,
    hi_v: FloatArray,
    hi_r: IntArray,
    sp_id: IntArray,
    sp_rem: FloatArray,
    changes: IntArray,
    mark: Int8Array,
    mark_amt: FloatArray,
) -> tuple[int, int]:  # pragma: no cover - compiled
    """Run Algorithm 1 for servers ``start, ..., m-1`` on the list ``V[s:e]`` (ids ``I``, prefix sums ``P``).

    ``dparam[j]`` is the degree ``d`` handed to Algorithm 1 for server ``j`` (the step serves at most ``d + 1``
    clients). ``V[s:e]`` must be positive and sorted by value (ties as in the module docstring) and ``P[s : e + 1]``
    hold its prefix sums (any offset). Amounts and remainders at most ``tol`` are treated as zero. Writes each
    server's allocation into its slot, its key range, its remainder and ``changes[j]`` (counted against the slot's
    previous content with tolerance ``ctol``); ``mark`` (zeros, one per client id) and ``mark_amt`` are scratch.
    Returns the list left after the last server, ``(s, e)``.
    """
    m = caps.shape[0]
    for j in range(start, m):
        b = caps[j]
        D = dparam[j]
        o = off[j]
        # previous allocation of this server, for N_j
        n_old = cnt[j]
        for q in range(n_old):
            c = a_ids[o + q]
            mark[c] = 1
            mark_amt[c] = a_amt[o + q]
        old_ids = a_ids[o : o + n_old].copy()
        nb = 0
        spc = -1
        spr = 0.0
        lov, lor, hiv, hir = _INF, -1, -_INF, -1
        r = e - s
        if b <= tol:
            pass  # range stays empty: nothing can ever reach this server
        elif r <= D:
            # Fewer than d + 1 clients: pad with zero clients on the left (the convention of Section IV-B).
            # Case 3 serves everything when the total is below b, otherwise the smallest clients fill b.
            lov, hiv = -_INF, _INF
            if r == 0:
                pass
            elif P[e] - P[s] < b:
                for q in range(r):
                    a_ids[o + q] = I[s + q]
                    a_amt[o + q] = V[s + q]
                nb = r
                s = e
            else:
                k = max(_lower_bound(P, s, e, P[s] + b) - s, 1)
                nb, s, spc, spr = _take_prefix(V, I, P, s, e, k, b, tol, a_ids, a_amt, o)
        elif P[e] - P[e - D - 1] < b:
            # Case 3 (lines 16-18): even the d + 1 largest clients cannot fill b: serve the d largest.
            if e - D - 2 >= s:
                lov, lor = V[e - D - 2], I[e - D - 2]
            else:
                lov = -_INF
            hiv = _INF
            for q in range(D):
                a_ids[o + q] = I[e - D + q]
                a_amt[o + q] = V[e - D + q]
            nb = D
            e -= D
        elif D >= 1 and P[s + D] - P[s] >= b:
            # Case 2 (lines 10-14): the d smallest clients already reach b: smallest prefix reaching b.
            k = min(max(_lower_bound(P, s, e, P[s] + b) - s, 1), D)
            lov = -_INF
            hiv, hir = V[s + k - 1], I[s + k - 1]
            nb, s, spc, spr = _take_prefix(V, I, P, s, e, k, b, tol, a_ids, a_amt, o)
        else:
            # window starts are absolute positions s .. e - D - 1
            lo, hi = s, e - D - 1
            if not left:
                # Case 1 (lines 4-8), rightmost suitable interval: the largest l with LC(l, l + d - 1) < b.
                while lo < hi:
                    mid = (lo + hi + 1) >> 1
                    if P[mid + D] - P[mid] < b:
                        lo = mid
                    else:
                        hi = mid - 1
            else:
                # SEQLEFT: the smallest l with LC(l, l + d) >= b (then LC(l, l + d - 1) < b as well).
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if P[mid + D + 1] - P[mid] >= b:
                        hi = mid
                    else:
                        lo = mid + 1
            l = lo
            edge = l == e - D - 1
            if l > s:
                lov, lor = V[l - 1], I[l - 1]
            else:
                lov = -_INF
            if edge or left:
                hiv = _INF
            else:
                hiv, hir = V[l + D], I[l + D]
            p_l = P[l]
            p_d1 = P[l + D + 1]
            inner = P[l + D] - p_l
            rem = p_d1 - p_l - b
            last = V[l + D]
            split_id = I[l + D]
            for q in range(D + 1):
                a_ids[o + q] = I[l + q]
                a_amt[o + q] = V[l + q]
            nb = D + 1
            if rem <= tol:
                rem = 0.0
            else:
                a_amt[o + D] = b - inner
                if a_amt[o + D] <= tol:  # the interval's first d clients fill b up to dust: drop that connection
                    nb = D
                    rem = last
                spc, spr = split_id, rem
            if not left and not edge and rem > 0.0:
                # Ordering property (Section IV-A): the remainder keeps the split client's position.
                if l - s <= e - l - D - 1:
                    for q in range(l - 1, s - 1, -1):
                        V[q + D] = V[q]
                        I[q + D] = I[q]
                    for q in range(l, s - 1, -1):
                        P[q + D] = P[q] + b
                    V[l + D] = rem
                    P[l + D] = p_d1 - rem
                    s += D
                else:
                    for q in range(l + D + 1, e):
                        V[q - D] = V[q]
                        I[q - D] = I[q]
                    for q in range(l + D + 1, e + 1):
                        P[q - D] = P[q] - b
                    V[l] = rem
                    I[l] = split_id
                    P[l + 1] = p_l + rem
                    e -= D
            elif rem <= 0.0:
                window = p_d1 - p_l
                if l - s <= e - l - D - 1:
                    for q in range(l - 1, s - 1, -1):
                        V[q + D + 1] = V[q]
                        I[q + D + 1] = I[q]
                    for q in range(l, s - 1, -1):
                        P[q + D + 1] = P[q] + window
                    P[l + D + 1] = p_d1
                    s += D + 1
                else:
                    for q in range(l + D + 1, e):
                        V[q - D - 1] = V[q]
                        I[q - D - 1] = I[q]
                    for q in range(l + D + 1, e + 1):
                        P[q - D - 1] = P[q] - window
                    P[l] = p_l
                    e -= D + 1
            else:
                # Remainder re-inserted at its sorted place among the clients left of the interval (SEQLEFT, or
                # the right end of the list where no interval [l + 1, l + d + 1] exists): the clients between that
                # place and the interval move right by one, those after the interval move left by d.
                pos = _upper_bound(V, s, l, rem)
                for q in range(l - 1, pos - 1, -1):
                    V[q + 1] = V[q]
                    I[q + 1] = I[q]
                    P[q + 2] = P[q + 1] + rem
                P[pos + 1] = P[pos] + rem
                V[pos] = rem
                I[pos] = split_id
                shift = p_l + rem - p_d1
                for q in range(l + D + 1, e):
                    V[q - D] = V[q]
                    I[q - D] = I[q]
                    P[q - D + 1] = P[q + 1] + shift
                e -= D
        # N_j: new connections, changed amounts, disconnections
        n_changes = 0
        for q in range(nb):
            c = a_ids[o + q]
            if mark[c] == 1:
                if abs(mark_amt[c] - a_amt[o + q]) > ctol:
                    n_changes += 1
                mark[c] = 2
            else:
                n_changes += 1
        for q in range(n_old):
            c = old_ids[q]
            if mark[c] == 1:
                n_changes += 1
            mark[c] = 0
        changes[j] = n_changes
        cnt[j] = nb
        lo_v[j], lo_r[j], hi_v[j], hi_r[j] = lov, lor, hiv, hir
        sp_id[j], sp_rem[j] = spc, spr
    return s, e


@njit()
def _take_prefix(
    V: FloatArray,
    I: IntArray,
    P: FloatArray,
    s: int,
    e: int,
    k: int,
    b: float,
    tol: float,
    a_ids: IntArray,
    a_amt: FloatArray,
    o: int,
) -> tuple[int, int, int, float]:  # pragma: no cover - compiled
    """Case 2 of Algorithm 1 on ``V[s:e]``: serve its first ``k`` clients (the smallest prefix with sum ``>= b``),
    splitting the last one, into the slot at ``o``. Returns (clients served, new list start, split client or -1,
    its remainder); the remainder stays in place (it is the smallest value left)."""
    k = min(k, e - s)
    base = P[s]
    rem = P[s + k] - base - b
    for q in range(k):
        a_ids[o + q] = I[s + q]
        a_amt[o + q] = V[s + q]
    if rem <= tol:
        return k, s + k, -1, 0.0
    nb = k
    a_amt[o + k - 1] = b - (P[s + k - 1] - base)
    if a_amt[o + k - 1] <= tol:
        nb = k - 1
    s += k - 1
    V[s] = rem
    P[s] = P[s + 1] - rem
    return nb, s, I[s], rem


@njit()
def list_insert(vals: FloatArray, ids: IntArray, n: int, x: float, c: int) -> None:  # pragma: no cover - compiled
    """Insert client ``c`` of value ``x`` into ``vals[:n]`` / ``ids[:n]`` (sorted by ``(value, id)``, room for one
    more); ``c`` must be the largest id, so it goes after the clients of equal value."""
    pos = _upper_bound(vals, 0, n, x)
    for q in range(n, pos, -1):
        vals[q] = vals[q - 1]
        ids[q] = ids[q - 1]
    vals[pos] = x
    ids[pos] = c


@njit()
def list_delete(vals: FloatArray, ids: IntArray, n: int, x: float, c: int) -> None:  # pragma: no cover - compiled
    """Remove client ``c`` of value ``x`` from ``vals[:n]`` / ``ids[:n]`` (sorted by value; ``c`` must be there)."""
    pos = _lower_bound(vals, 0, n, x)
    while ids[pos] != c:
        pos += 1
    for q in range(pos, n - 1):
        vals[q] = vals[q + 1]
        ids[q] = ids[q + 1]


@njit()
def first_affected(
    v: float, c: int, lo_v: FloatArray, lo_r: IntArray, hi_v: FloatArray, hi_r: IntArray
) -> int:  # pragma: no cover - compiled
    """First server whose recorded range ``[lo, hi]`` can contain the client ``c`` of value ``v`` (``m`` if none).

    The test is on values only, inclusive (a tie with a boundary counts as a hit, whatever the order among equal
    values), and a boundary that is the client itself is a hit (its stored value may differ by rounding): it may
    report a server earlier than needed, never a later one.
    """
    m = lo_v.shape[0]
    for j in range(m):
        if c == lo_r[j] or c == hi_r[j] or (lo_v[j] <= v <= hi_v[j]):
            return j
    return m


@njit()
def touched_before(
    j0: int,
    alive: NDArray[np.bool_],
    off: IntArray,
    cnt: IntArray,
    a_ids: IntArray,
    sp_id: IntArray,
    sp_rem: FloatArray,
    tol: float,
    mark: Int8Array,
) -> tuple[IntArray, IntArray, FloatArray]:  # pragma: no cover - compiled
    """Clients served by servers ``< j0`` (marked in ``mark``), and those of them still in the list seen by ``j0``
    with their remainders, by increasing server that left the remainder (the last server touching a client decides
    whether, and with which value, it is still in the list)."""
    nt = 0
    for j in range(j0):
        nt += cnt[j] + 1
    touched = np.empty(nt, dtype=np.int64)
    rid = np.empty(nt, dtype=np.int64)
    rval = np.empty(nt, dtype=np.float64)
    nt = 0
    k = 0
    for j in range(j0 - 1, -1, -1):
        c = sp_id[j]
        if c >= 0 and mark[c] == 0:
            mark[c] = 1
            touched[nt] = c
            nt += 1
            if alive[c] and sp_rem[j] > tol:
                rid[k] = c
                rval[k] = sp_rem[j]
                k += 1
        o = off[j]
        for q in range(cnt[j]):
            c = a_ids[o + q]
            if mark[c] == 0:
                mark[c] = 1
                touched[nt] = c
                nt += 1
    return touched[:nt], rid[:k][::-1].copy(), rval[:k][::-1].copy()


@njit()
def merge_list(
    g_val: FloatArray,
    g_id: IntArray,
    rid: IntArray,
    rval: FloatArray,
    touched: IntArray,
    tol: float,
    V: FloatArray,
    I: IntArray,
    P: FloatArray,
    mark: Int8Array,
) -> int:  # pragma: no cover - compiled
    """Merge the untouched clients of ``(g_val, g_id)`` (unmarked, first among equal values) with the sorted
    remainders into ``V[0:e]``, ``I``, ``P``; clears the marks of ``touched``; returns ``e``."""
    e = 0
    a = 0
    n_g = g_val.shape[0]
    k = rid.shape[0]
    for t in range(k + 1):
        x = rval[t] if t < k else _INF
        while a < n_g and g_val[a] <= x:
            if mark[g_id[a]] == 0 and g_val[a] > tol:
                V[e] = g_val[a]
                I[e] = g_id[a]
                e += 1
            a += 1
        if t < k:
            V[e] = x
            I[e] = rid[t]
            e += 1
    for t in range(touched.shape[0]):
        mark[touched[t]] = 0
    P[0] = 0.0
    acc = 0.0
    for t in range(e):
        acc += V[t]
        P[t + 1] = acc
    return e


def _signatures() -> dict[str, str]:
    """``{kernel: numba signature}``: the argument types :mod:`allocator.degree._engine` and
    :mod:`allocator.degree.online` pass (C-contiguous float64 values, int64 ids and indices, int8 marks, bool flags),
    the types the just-in-time route infers from those calls."""
    f, i, i1, b = "f8[::1]", "i8[::1]", "i1[::1]", "b1[::1]"
    records = ", ".join([i, i, i, f, f, i, f, i, i, f, i])  # off, cnt, a_ids, a_amt, lo/hi keys, sp_id, sp_rem, changes
    return {
        "sweep_kernel": f"UniTuple(i8, 2)({f}, {i}, {f}, i8, i8, {f}, {i}, i8, f8, f8, b1, {records}, {i1}, {f})",
        "list_insert": f"void({f}, {i}, i8, f8, i8)",
        "list_delete": f"void({f}, {i}, i8, f8, i8)",
        "first_affected": f"i8(f8, i8, {f}, {i}, {f}, {i})",
        "touched_before": f"Tuple(({i}, {i}, {f}))(i8, {b}, {i}, {i}, {i}, {i}, {f}, f8, {i1})",
        "merge_list": f"i8({f}, {i}, {i}, {f}, {i}, f8, {f}, {i}, {f}, {i1})",
    }


#: Ahead-of-time signature of each kernel called from Python (exported under the kernel's name).
SIGNATURES = _signatures()
