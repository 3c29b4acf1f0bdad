"""The SEQ sweep of Algorithm 1 (paper 003, Section IV-A) over a sorted client list held in numpy arrays.

The remaining clients form one list sorted by ``(value, rank)`` (``rank`` breaks ties so that the order is total and
reproducible), held in the slice ``V[s:e]`` of a buffer, with absolute prefix sums ``P`` (``P[i + 1] - P[i] = V[i]``)
so that every window sum ``LC(l, l + k - 1) = P[l + k] - P[l]`` is O(1) and the window that Algorithm 1 needs is
found by binary search (window sums of a sorted list are monotone in ``l``). Nothing is reallocated per server:
case 2 moves ``s`` past the served prefix, case 3 moves ``e`` before the served suffix, and case 1 closes the gap of
the ``d`` fully served clients by moving the shorter side of the list (with its prefix sums shifted by ``b``), the
split client's remainder keeping its place (ordering property, Section IV-A). This is what makes ``n = 1e5`` clients
times ``m = 1e3`` servers a run of a few hundredths of a second instead of a Python scan per server.

Both variants of Section VI-C are here: ``left=False`` is SEQ (rightmost suitable interval) and ``left=True`` is
SEQLEFT (leftmost suitable interval).

For the incremental online version (Section V-C) every server step also records the *range* of list keys whose
insertion or removal can change that server's step (inclusive ``[lo, hi]`` in the lexicographic ``(value, rank)``
order): outside it the step is unchanged, which is the "change outside ``[l, l + d]``" case of Lemma 5.4.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

_INF = float("inf")
#: clients recorded on each side of a server's interval for the incremental OSEQ
MARGIN = 2

Segment = tuple[IntArray, FloatArray, bool, bool]


@dataclass
class SweepResult:
    """Output of a sweep over servers ``start .. m-1``."""

    alloc_ids: list[IntArray]  # per server (from ``start``): client ids served
    alloc_amounts: list[FloatArray]  # per server: amounts ``w_i^j``
    cases: IntArray  # per server: 0 nothing, 1 interval, 2 smallest prefix, 3 largest clients, 4 short list
    lo_v: FloatArray  # affect range lower key (exclusive), value part
    lo_r: FloatArray  # affect range lower key, rank part
    hi_v: FloatArray  # affect range upper key (inclusive), value part
    hi_r: FloatArray  # affect range upper key, rank part
    left_vals: FloatArray  # clients left after the last server (sorted)
    left_ids: IntArray
    #: per server, for case 1 away from the list's right end: (ids, values, at list start, at list end) of the
    #: input list from ``MARGIN`` clients before the interval to ``MARGIN + 1`` after it; ``None`` otherwise
    seg: list[Segment | None]


def _sorted_pos(vals: FloatArray, ids: IntArray, rank_of: FloatArray, lo: int, stop: int, v: float, rk: float) -> int:
    """Index in ``vals[lo:stop]`` (sorted by (value, rank of ``ids``)) where key ``(v, rk)`` must be inserted."""
    pos = lo + int(np.searchsorted(vals[lo:stop], v, side="left"))
    while pos < stop and vals[pos] == v and rank_of[ids[pos]] < rk:
        pos += 1
    return pos


def sweep(
    vals: FloatArray,
    ids: IntArray,
    rank_of: FloatArray,
    caps: FloatArray,
    dparam: IntArray,
    start: int,
    tol: float,
    *,
    left: bool = False,
    segments: bool = False,
) -> SweepResult:
    """Run Algorithm 1 for servers ``start, ..., m-1`` on the sorted list ``(vals, ids)``.

    ``dparam[j]`` is the degree ``d`` handed to Algorithm 1 for server ``j`` (the step serves at most ``d + 1``
    clients); ``rank_of[id]`` is the tie-breaking rank of a client. ``vals`` must be sorted by ``(value, rank)`` and
    positive. Amounts and remainders at most ``tol`` are treated as zero.

    The list lives in the buffer slice ``V[s:e]`` with absolute prefix sums ``P`` (``P[i + 1] - P[i] = V[i]``), so
    that a prefix served by case 2, the suffix served by case 3 and the interval removed by case 1 cost no copy of
    the whole list: case 1 moves whichever side of the interval is shorter by ``d`` places (adding ``b`` to, or
    subtracting it from, the moved prefix sums), which keeps the split client's remainder in place (the ordering
    property of Section IV-A).
    """
    m = caps.shape[0]
    k_servers = m - start
    V = np.array(vals, dtype=np.float64)
    I = np.array(ids, dtype=np.int64)
    P = np.empty(V.shape[0] + 1, dtype=np.float64)
    P[0] = 0.0
    np.cumsum(V, out=P[1:])
    s, e = 0, int(V.shape[0])
    Pi, Vi, Ii, Ri = P.item, V.item, I.item, rank_of.item
    caps_l = caps.tolist()
    d_l = dparam.tolist()
    out_ids: list[IntArray] = []
    out_amt: list[FloatArray] = []
    cases = [0] * k_servers
    lo_v = [_INF] * k_servers
    lo_r = [-1.0] * k_servers
    hi_v = [-_INF] * k_servers
    hi_r = [-1.0] * k_servers
    empty_i = np.zeros(0, dtype=np.int64)
    empty_f = np.zeros(0, dtype=np.float64)
    seg: list[Segment | None] = [None] * k_servers

    for t in range(k_servers):
        j = start + t
        b = caps_l[j]
        D = d_l[j]
        r = e - s
        if b <= tol:
            out_ids.append(empty_i)
            out_amt.append(empty_f)
            continue  # range stays empty: nothing can ever reach this server
        if r <= D:
            # Fewer than d + 1 clients: pad with zero clients on the left (the convention of Section IV-B).
            # Case 3 serves everything when the total is below b, otherwise the smallest clients fill b.
            lo_v[t], hi_v[t] = -_INF, _INF
            cases[t] = 4
            if r == 0:
                out_ids.append(empty_i)
                out_amt.append(empty_f)
                continue
            if Pi(e) - Pi(s) < b:
                out_ids.append(I[s:e].copy())
                out_amt.append(V[s:e].copy())
                s = e
                continue
            k = max(int(np.searchsorted(P[s : e + 1], Pi(s) + b, side="left")), 1)
            s = _take_prefix(V, I, P, s, e, k, b, tol, out_ids, out_amt)
            continue
        if Pi(e) - Pi(e - D - 1) < b:
            # Case 3 (lines 16-18): even the d + 1 largest clients cannot fill b: serve the d largest.
            cases[t] = 3
            if e - D - 2 >= s:
                lo_v[t], lo_r[t] = Vi(e - D - 2), Ri(Ii(e - D - 2))
            else:
                lo_v[t] = -_INF
            hi_v[t] = _INF
            out_ids.append(I[e - D : e].copy())
            out_amt.append(V[e - D : e].copy())
            e -= D
            continue
        if D >= 1 and Pi(s + D) - Pi(s) >= b:
            # Case 2 (lines 10-14): the d smallest clients already exceed b: smallest prefix reaching b.
            cases[t] = 2
            k = max(int(np.searchsorted(P[s : e + 1], Pi(s) + b, side="left")), 1)
            k = min(k, D)
            lo_v[t] = -_INF
            hi_v[t], hi_r[t] = Vi(s + k - 1), Ri(Ii(s + k - 1))
            s = _take_prefix(V, I, P, s, e, k, b, tol, out_ids, out_amt)
            continue
        cases[t] = 1
        # window starts are absolute positions s .. e - D - 1
        lo, hi = s, e - D - 1
        if not left:
            # Case 1 (lines 4-8), rightmost suitable interval: the largest l with LC(l, l + d - 1) < b.
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if Pi(mid + D) - Pi(mid) < b:
                    lo = mid
                else:
                    hi = mid - 1
        else:
            # SEQLEFT: the smallest l with LC(l, l + d) >= b (then LC(l, l + d - 1) < b as well).
            while lo < hi:
                mid = (lo + hi) >> 1
                if Pi(mid + D + 1) - Pi(mid) >= b:
                    hi = mid
                else:
                    lo = mid + 1
        l = lo
        edge = l == e - D - 1
        if l > s:
            lo_v[t], lo_r[t] = Vi(l - 1), Ri(Ii(l - 1))
        else:
            lo_v[t] = -_INF
        if edge or left:
            hi_v[t] = _INF
        elif not segments:
            hi_v[t], hi_r[t] = Vi(l + D), Ri(Ii(l + D))
        else:
            # Record the list around the interval (MARGIN clients each side) for the local step of the incremental
            # OSEQ; the affect range widens to that whole segment (inclusive), which is conservative.
            s0 = max(s, l - MARGIN)
            s1 = min(e, l + D + 2 + MARGIN)
            seg[t] = (I[s0:s1].copy(), V[s0:s1].copy(), s0 == s, s1 == e)
            if s0 == s:
                lo_v[t] = -_INF
            else:
                lo_v[t], lo_r[t] = Vi(s0), Ri(Ii(s0))
            if s1 == e:
                hi_v[t] = _INF
            else:
                hi_v[t], hi_r[t] = Vi(s1 - 1), Ri(Ii(s1 - 1))
        p_l = Pi(l)
        p_d1 = Pi(l + D + 1)
        inner = Pi(l + D) - p_l
        rem = p_d1 - p_l - b
        last = Vi(l + D)
        split_id = Ii(l + D)
        a_ids = I[l : l + D + 1].copy()
        a_amt = V[l : l + D + 1].copy()
        if rem <= tol:
            rem = 0.0
        else:
            a_amt[D] = b - inner
            if a_amt[D] <= tol:  # the interval's first d clients fill b up to dust: drop the last connection
                a_amt = a_amt[:D]
                a_ids = a_ids[:D]
                rem = last
        out_ids.append(a_ids)
        out_amt.append(a_amt)
        if not left and not edge and rem > 0.0:
            # Ordering property (Section IV-A): the remainder keeps the split client's position.
            if l - s <= e - l - D - 1:
                V[s + D : l + D] = V[s:l]
                I[s + D : l + D] = I[s:l]
                np.add(P[s : l + 1], b, out=P[s + D : l + D + 1])
                V[l + D] = rem
                P[l + D] = p_d1 - rem
                s += D
            else:
                V[l + 1 : e - D] = V[l + D + 1 : e]
                I[l + 1 : e - D] = I[l + D + 1 : e]
                np.subtract(P[l + D + 1 : e + 1], b, out=P[l + 1 : e - D + 1])
                V[l] = rem
                I[l] = split_id
                P[l + 1] = p_l + rem
                e -= D
        elif rem <= 0.0:
            window = p_d1 - p_l
            if l - s <= e - l - D - 1:
                V[s + D + 1 : l + D + 1] = V[s:l]
                I[s + D + 1 : l + D + 1] = I[s:l]
                np.add(P[s : l + 1], window, out=P[s + D + 1 : l + D + 2])
                P[l + D + 1] = p_d1
                s += D + 1
            else:
                V[l : e - D - 1] = V[l + D + 1 : e]
                I[l : e - D - 1] = I[l + D + 1 : e]
                np.subtract(P[l + D + 1 : e + 1], window, out=P[l : e - D])
                P[l] = p_l
                e -= D + 1
        else:
            # Remainder re-inserted at its sorted place among the clients left of the interval (SEQLEFT, or the
            # right end of the list where no interval [l + 1, l + d + 1] exists).
            # In place: the clients between that place and the interval move right by one, those after the
            # interval (none at the right end) move left by d, prefix sums shifted accordingly.
            pos = _sorted_pos(V, I, rank_of, s, l, rem, Ri(split_id))
            V[pos + 1 : l + 1] = V[pos:l]
            I[pos + 1 : l + 1] = I[pos:l]
            P[pos + 1 : l + 2] = P[pos : l + 1] + rem
            V[pos] = rem
            I[pos] = split_id
            if e > l + D + 1:
                V[l + 1 : e - D] = V[l + D + 1 : e]
                I[l + 1 : e - D] = I[l + D + 1 : e]
                P[l + 2 : e - D + 1] = P[l + D + 2 : e + 1] + (p_l + rem - p_d1)
            e -= D
    return SweepResult(
        alloc_ids=out_ids,
        alloc_amounts=out_amt,
        cases=np.asarray(cases, dtype=np.int64),
        lo_v=np.asarray(lo_v, dtype=np.float64),
        lo_r=np.asarray(lo_r, dtype=np.float64),
        hi_v=np.asarray(hi_v, dtype=np.float64),
        hi_r=np.asarray(hi_r, dtype=np.float64),
        left_vals=V[s:e].copy(),
        left_ids=I[s:e].copy(),
        seg=seg,
    )


def _take_prefix(
    V: FloatArray,
    I: IntArray,
    P: FloatArray,
    s: int,
    e: int,
    k: int,
    b: float,
    tol: float,
    out_ids: list[IntArray],
    out_amt: list[FloatArray],
) -> int:
    """Case 2 of Algorithm 1 on ``V[s:e]``: serve its first ``k`` clients (the smallest prefix with sum ``>= b``),
    splitting the last one; returns the new start of the list (the remainder stays in place)."""
    k = min(k, e - s)
    base = P.item(s)
    rem = P.item(s + k) - base - b
    a_ids = I[s : s + k].copy()
    a_amt = V[s : s + k].copy()
    if rem <= tol:
        out_ids.append(a_ids)
        out_amt.append(a_amt)
        return s + k
    a_amt[k - 1] = b - (P.item(s + k - 1) - base)
    if a_amt[k - 1] <= tol:
        a_amt = a_amt[: k - 1]
        a_ids = a_ids[: k - 1]
    out_ids.append(a_ids)
    out_amt.append(a_amt)
    s += k - 1
    V[s] = rem
    P[s] = P.item(s + 1) - rem
    return s
