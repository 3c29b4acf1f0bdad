"""The SEQ sweep of Algorithm 1 (paper 003, Section IV-A) over a sorted client list held in numpy arrays.

The remaining clients form one list sorted by ``(value, rank)`` (``rank`` breaks ties so that the order is total and
reproducible). Alongside the values we keep the prefix sums ``P`` (``P[k]`` = sum of the ``k`` smallest values), so
that every window sum ``LC(l, l + k - 1) = P[l + k] - P[l]`` is O(1) and the window that Algorithm 1 needs is found by
binary search (window sums of a sorted list are monotone in ``l``). A server step then costs two array copies of the
list, which numpy does at memory speed: this is what makes ``n = 1e5`` clients times ``m = 1e3`` servers a sub-second
run instead of a Python scan per server.

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


def _sorted_pos(vals: FloatArray, ranks: FloatArray, stop: int, v: float, rk: float) -> int:
    """Index in ``vals[:stop]`` (sorted by (value, rank)) where key ``(v, rk)`` must be inserted."""
    pos = int(np.searchsorted(vals[:stop], v, side="left"))
    while pos < stop and vals[pos] == v and ranks[pos] < rk:
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
    """
    m = caps.shape[0]
    k_servers = m - start
    vals = np.array(vals, dtype=np.float64)
    ids = np.array(ids, dtype=np.int64)
    P = np.empty(vals.shape[0] + 1, dtype=np.float64)
    P[0] = 0.0
    np.cumsum(vals, out=P[1:])
    out_ids: list[IntArray] = []
    out_amt: list[FloatArray] = []
    cases = np.zeros(k_servers, dtype=np.int64)
    lo_v = np.full(k_servers, _INF)
    lo_r = np.full(k_servers, -1.0)
    hi_v = np.full(k_servers, -_INF)
    hi_r = np.full(k_servers, -1.0)
    empty_i = np.zeros(0, dtype=np.int64)
    empty_f = np.zeros(0, dtype=np.float64)
    seg: list[Segment | None] = [None] * k_servers

    def key(pos: int) -> tuple[float, float]:
        return float(vals[pos]), float(rank_of[ids[pos]])

    for t in range(k_servers):
        j = start + t
        b = float(caps[j])
        D = int(dparam[j])
        r = vals.shape[0]
        if b <= tol:
            out_ids.append(empty_i)
            out_amt.append(empty_f)
            continue  # range stays empty: nothing can ever reach this server
        if r == 0 or r <= D:
            # Fewer than d + 1 clients: pad with zero clients on the left (the convention of Section IV-B).
            # Case 3 serves everything when the total is below b, otherwise the smallest clients fill b.
            lo_v[t], hi_v[t] = -_INF, _INF
            cases[t] = 4
            if r == 0:
                out_ids.append(empty_i)
                out_amt.append(empty_f)
                continue
            if P[r] < b:
                out_ids.append(ids.copy())
                out_amt.append(vals.copy())
                vals, ids = vals[:0], ids[:0]
                P = P[:1]
                continue
            k = max(int(np.searchsorted(P, b, side="left")), 1)
            vals, ids, P = _take_prefix(vals, ids, P, k, b, tol, out_ids, out_amt)
            continue
        if P[r] - P[r - D - 1] < b:
            # Case 3 (lines 16-18): even the d + 1 largest clients cannot fill b: serve the d largest.
            cases[t] = 3
            if r - D - 2 >= 0:
                lo_v[t], lo_r[t] = key(r - D - 2)
            else:
                lo_v[t] = -_INF
            hi_v[t] = _INF
            out_ids.append(ids[r - D :].copy())
            out_amt.append(vals[r - D :].copy())
            vals, ids = vals[: r - D], ids[: r - D]
            P = P[: r - D + 1]
            continue
        if D >= 1 and P[D] >= b:
            # Case 2 (lines 10-14): the d smallest clients already exceed b: smallest prefix reaching b.
            cases[t] = 2
            k = max(int(np.searchsorted(P, b, side="left")), 1)
            lo_v[t] = -_INF
            hi_v[t], hi_r[t] = key(k - 1)
            vals, ids, P = _take_prefix(vals, ids, P, k, b, tol, out_ids, out_amt)
            continue
        cases[t] = 1
        if not left:
            # Case 1 (lines 4-8), rightmost suitable interval: the largest l with LC(l, l + d - 1) < b.
            lo, hi = 0, r - D - 1
            while lo < hi:
                mid = (lo + hi + 1) >> 1
                if P[mid + D] - P[mid] < b:
                    lo = mid
                else:
                    hi = mid - 1
        else:
            # SEQLEFT: the smallest l with LC(l, l + d) >= b (then LC(l, l + d - 1) < b as well).
            lo, hi = 0, r - D - 1
            while lo < hi:
                mid = (lo + hi) >> 1
                if P[mid + D + 1] - P[mid] >= b:
                    hi = mid
                else:
                    lo = mid + 1
        l = lo
        edge = l == r - D - 1
        if l >= 1:
            lo_v[t], lo_r[t] = key(l - 1)
        else:
            lo_v[t] = -_INF
        if edge or left:
            hi_v[t] = _INF
        elif not segments:
            hi_v[t], hi_r[t] = key(l + D)
        else:
            # Record the list around the interval (MARGIN clients each side) for the local step of the incremental
            # OSEQ; the affect range widens to that whole segment (inclusive), which is conservative.
            s0 = max(0, l - MARGIN)
            s1 = min(r, l + D + 2 + MARGIN)
            seg[t] = (ids[s0:s1].copy(), vals[s0:s1].copy(), s0 == 0, s1 == r)
            if s0 == 0:
                lo_v[t] = -_INF
            else:
                lo_v[t], lo_r[t] = key(s0)
            if s1 == r:
                hi_v[t] = _INF
            else:
                hi_v[t], hi_r[t] = key(s1 - 1)
        inner = P[l + D] - P[l]
        rem = float(P[l + D + 1] - P[l] - b)
        last = float(vals[l + D])
        a_ids = ids[l : l + D + 1].copy()
        a_amt = vals[l : l + D + 1].copy()
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
        split_id = int(ids[l + D])
        if not left and not edge and rem > 0.0:
            # Ordering property (Section IV-A): the remainder keeps the split client's position.
            vals = np.concatenate((vals[:l], vals[l + D :]))
            ids = np.concatenate((ids[:l], ids[l + D :]))
            vals[l] = rem
            P = np.concatenate((P[: l + 1], P[l + D + 1 :] - b))
        elif rem <= 0.0:
            window = P[l + D + 1] - P[l]
            vals = np.concatenate((vals[:l], vals[l + D + 1 :]))
            ids = np.concatenate((ids[:l], ids[l + D + 1 :]))
            P = np.concatenate((P[: l + 1], P[l + D + 2 :] - window))
        else:
            # Remainder re-inserted at its sorted place among the clients left of the interval (SEQLEFT, or the
            # right end of the list where no interval [l + 1, l + d + 1] exists).
            pos = _sorted_pos(vals, rank_of[ids], l, rem, float(rank_of[split_id]))
            vals = np.concatenate((vals[:pos], [rem], vals[pos:l], vals[l + D + 1 :]))
            ids = np.concatenate((ids[:pos], np.array([split_id], dtype=np.int64), ids[pos:l], ids[l + D + 1 :]))
            P = np.empty(vals.shape[0] + 1, dtype=np.float64)
            P[0] = 0.0
            np.cumsum(vals, out=P[1:])
    return SweepResult(
        alloc_ids=out_ids,
        alloc_amounts=out_amt,
        cases=cases,
        lo_v=lo_v,
        lo_r=lo_r,
        hi_v=hi_v,
        hi_r=hi_r,
        left_vals=vals,
        left_ids=ids,
        seg=seg,
    )


def _take_prefix(
    vals: FloatArray,
    ids: IntArray,
    P: FloatArray,
    k: int,
    b: float,
    tol: float,
    out_ids: list[IntArray],
    out_amt: list[FloatArray],
) -> tuple[FloatArray, IntArray, FloatArray]:
    """Case 2 of Algorithm 1: serve clients ``0 .. k-1`` (smallest ``k`` with ``P[k] >= b``), splitting the last."""
    k = min(k, vals.shape[0])
    rem = float(P[k] - b)
    a_ids = ids[:k].copy()
    a_amt = vals[:k].copy()
    if rem <= tol:
        out_ids.append(a_ids)
        out_amt.append(a_amt)
        base = P[k]
        return vals[k:], ids[k:], P[k:] - base
    a_amt[k - 1] = b - P[k - 1]
    if a_amt[k - 1] <= tol:
        a_amt = a_amt[: k - 1]
        a_ids = a_ids[: k - 1]
    out_ids.append(a_ids)
    out_amt.append(a_amt)
    vals = vals[k - 1 :].copy()
    vals[0] = rem
    newP = P[k - 1 :] - b
    newP[0] = 0.0
    return vals, ids[k - 1 :], newP
