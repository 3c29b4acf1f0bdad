"""Fractional allocations -> integral replicas per pool (Hamilton's largest-remainder method), bounded by what each
pool can host.

The market gives job i a time fraction ``x_ij`` of each pool (004 Sec. 2.1); with ``N_i`` replicas, ``N_i x_ij`` is a
fractional replica count. Rounding keeps each entry within one of its share, the row total at the rounded total, and
never exceeds ``hostable[i, j]`` (how many of the job's pods pool j's nodes can still take, :mod:`.capacity`).
Everything is computed on shares normalised by their row maximum, so no input that is finite overflows (a subnormal
share times a large total used to overflow to -9.2e18 pods).
"""

from __future__ import annotations

import numpy as np


def largest_remainder(shares: np.ndarray, total: int, cap: np.ndarray | None = None) -> np.ndarray:
    """Integers summing to ``min(total, cap.sum())`` close to ``shares`` scaled to that sum.

    When ``total`` lies between the sum of the floors and the sum of the ceilings of ``shares`` (rounding a vector
    whose sum is ``total``), every entry gets its floor and the entries with the largest remainders one more (ties to
    the lower index), so each stays within one unit of its share; otherwise the shares are first scaled to sum to
    ``total``. With ``cap``, no entry exceeds its cap: what a capped entry cannot take goes to the others by the same
    rule. All-zero shares with a positive total are an error the caller must avoid (``ValueError``).
    """
    shares = np.asarray(shares, dtype=np.float64)
    if shares.ndim != 1 or np.any(shares < 0) or not np.all(np.isfinite(shares)):
        raise ValueError("shares must be a finite non-negative vector")
    if total < 0:
        raise ValueError(f"total must be non-negative, got {total}")
    limit = np.full(shares.shape, np.iinfo(np.int64).max // 4, dtype=np.int64) if cap is None else (
        np.maximum(np.asarray(cap, dtype=np.int64), 0))
    out = np.zeros(shares.shape, dtype=np.int64)
    left = int(min(total, int(limit.sum()) if cap is not None else total))
    if left == 0:
        return out
    if not np.any(shares > 0):
        raise ValueError(f"cannot distribute a total of {total} over shares that are all zero")
    weights = shares.copy()
    first = True
    while left > 0:
        open_ = (out < limit) & (weights > 0)
        if not open_.any():
            open_ = out < limit  # the positive shares are all capped: the rest goes where room is left
            if not open_.any():
                break
            weights = open_.astype(np.float64)
        room = (limit - out).astype(np.float64)
        raw = np.where(open_, weights, 0.0)
        in_range = raw.max() <= left + 1 and np.floor(raw).sum() <= left <= np.ceil(raw).sum()
        if first and in_range and np.all(raw <= room):
            target = raw  # already sums to ``left`` within rounding: each entry stays within one of its share
        else:
            w = raw / raw.max()  # in [0, 1] with a 1: the scaling below cannot overflow, whatever the magnitudes
            target = np.minimum(w / w.sum() * left, room)
        first = False
        base = np.floor(target).astype(np.int64)
        extra = left - int(base.sum())
        frac = np.where(open_ & (base < limit - out), target - base, -1.0)
        order = np.lexsort((np.arange(shares.size), -frac))
        give = order[: max(extra, 0)]
        give = give[frac[give] >= 0]
        base[give] += 1
        out += base
        left -= int(base.sum())
        if base.sum() == 0:
            break
    return out


def largest_remainder_rows(shares: np.ndarray, totals: np.ndarray, cap: np.ndarray | None = None) -> np.ndarray:
    """:func:`largest_remainder` of each row of ``shares`` to ``totals[i]`` (rows with a zero total are zero; a row of
    zero shares with a positive total raises ``ValueError``)."""
    shares = np.asarray(shares, dtype=np.float64)
    totals = np.asarray(totals, dtype=np.int64)
    if shares.ndim != 2 or totals.shape != (shares.shape[0],):
        raise ValueError(f"shares must be (n, m) and totals (n,), got {shares.shape} and {totals.shape}")
    if np.any(shares < 0) or not np.all(np.isfinite(shares)) or np.any(totals < 0):
        raise ValueError("shares must be finite and non-negative, totals non-negative")
    out = np.zeros(shares.shape, dtype=np.int64)
    if cap is None:
        return _rows_uncapped(shares, totals)
    for i in np.flatnonzero(totals > 0).tolist():
        try:
            out[i] = largest_remainder(shares[i], int(totals[i]), None if cap is None else cap[i])
        except ValueError as exc:
            raise ValueError(f"row {i}: {exc}") from None
    return out


def _rows_uncapped(shares: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """:func:`largest_remainder` of every row at once (no caps): the same rounding, vectorised over the rows."""
    out = np.zeros(shares.shape, dtype=np.int64)
    live = np.flatnonzero(totals > 0)
    if live.size == 0:
        return out
    x = shares[live]
    t = totals[live].astype(np.float64)
    top = x.max(axis=1)
    if np.any(top <= 0):
        row = int(live[np.flatnonzero(top <= 0)[0]])
        raise ValueError(f"row {row}: cannot distribute a total of {int(totals[row])} over shares that are all zero")
    small = top <= t + 1  # rows whose shares may already sum to their total (no overflow in the sums below)
    sums_floor = np.where(small[:, None], np.floor(np.where(small[:, None], x, 0.0)), 0.0).sum(axis=1)
    sums_ceil = np.where(small[:, None], np.ceil(np.where(small[:, None], x, 0.0)), 0.0).sum(axis=1)
    as_is = small & (sums_floor <= t) & (t <= sums_ceil)
    w = x / top[:, None]  # in [0, 1] with a 1 per row
    scaled = w / w.sum(axis=1)[:, None] * t[:, None]
    target = np.where(as_is[:, None], x, scaled)
    base = np.floor(target).astype(np.int64)
    left = totals[live] - base.sum(axis=1)
    order = np.argsort(-(target - base), axis=1, kind="stable")  # largest remainders first, ties to the lower index
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(x.shape[1]), x.shape), axis=1)
    out[live] = base + (rank < left[:, None])
    return out


def split_replicas(target: np.ndarray, running: np.ndarray) -> np.ndarray:
    """Replicas per pool for a job whose market split rounds to ``target`` while ``running`` pods already run.

    The total stays ``target.sum()``. When it is at least the running total, every running pod is kept and the
    remaining replicas go to the pools where ``target`` exceeds what runs there (largest remainder over those
    deficits); otherwise the job shrinks and running pods are removed one at a time from the pool that runs the most
    above its target (ties to the lower pool index). Returns an integer vector ``>= 0``.
    """
    target = np.asarray(target, dtype=np.int64)
    running = np.asarray(running, dtype=np.int64)
    total, have = int(target.sum()), int(running.sum())
    if have == 0:
        return target.copy()
    if total >= have:
        deficit = np.maximum(target - running, 0)
        extra = total - have
        if extra == 0:
            return running.copy()
        return running + largest_remainder(deficit.astype(np.float64), extra)
    out = running.copy()
    for _ in range(have - total):
        over = np.where(out > 0, out - target, np.iinfo(np.int64).min)
        out[int(np.argmax(over))] -= 1
    return out


def fit_columns(target: np.ndarray, shares: np.ndarray, demand: np.ndarray, room: np.ndarray, running: np.ndarray,
                floor: np.ndarray, offered: np.ndarray, dropped: np.ndarray | None = None) -> np.ndarray:
    """Move rounded-up new replicas out of pools that have no room for them now.

    Rounding each job's row on its own (Hamilton) keeps every row total but not the pool's: with
    ``sum_i d_i shares_ij <= R_j`` (the market's capacity constraint, 004 Sec. 2.1) the rounded loads can exceed a
    pool by up to one pod per job rounded up there; and the pods this plan deletes free their room only once they are
    gone, so new pods can use only the pool's free room now. Placement then finds no node for the excess, and a
    market round is spent to learn it. The two-sided problem is matrix rounding (Bacharach 1966; Cox and Ernst 1982,
    controlled rounding); this is its greedy repair. The new pods of pool j cost ``sum_i d_i max(target_ij -
    running_ij, 0)`` of ``room[j]``; while that exceeds ``room[j]``, the new replica of pool j furthest above its
    share (``target - shares`` largest, never below ``floor`` nor ``running``, ties to the lower row) is taken back
    and given to the job's offered pool where it is furthest below its share and that can take it (room for a new
    pod, or one fewer deletion there), which keeps that entry within one of its share; a replica with no such pool
    is dropped (the job runs one fewer until room frees); a dropped replica is given back, row by row, where room
    taken back later leaves space for it within one of its share. Pools within their room are never touched, so a
    rounding that fits is returned unchanged. Returns a new integer matrix; ``dropped[i, j]`` (when given) counts
    the replicas of job i taken out of pool j that found no other pool (the job's status reports them as waiting for
    room).
    """
    out = np.asarray(target, dtype=np.int64).copy()
    if out.size == 0:
        return out
    shares = np.asarray(shares, dtype=np.float64)
    demand = np.asarray(demand, dtype=np.float64)
    room = np.asarray(room, dtype=np.float64)
    keep = np.maximum(np.asarray(floor, dtype=np.int64), np.asarray(running, dtype=np.int64))
    load = demand @ np.maximum(out - running, 0)
    slack = 1e-6 * np.maximum(room, 1.0)
    columns = np.arange(out.shape[1])
    for j in np.flatnonzero(load > room + slack).tolist():
        while load[j] > room[j] + slack[j]:
            above = np.where((out[:, j] > keep[:, j]) & (demand > 0), out[:, j] - shares[:, j], -np.inf)
            i = int(np.argmax(above))
            if not np.isfinite(above[i]):
                break  # only replicas that exist: nothing to take back
            out[i, j] -= 1
            load[j] -= demand[i]
            below = shares[i] - out[i]  # > 0: one more keeps the entry within one of its share
            cost = np.where(out[i] >= running[i], demand[i], 0.0)  # a new pod needs room; one fewer deletion not
            fits = load + cost <= room + slack
            candidates = np.where(offered[i] & fits & (below > 1e-9) & (columns != j), below, -np.inf)
            k = int(np.argmax(candidates))
            if np.isfinite(candidates[k]):
                out[i, k] += 1
                load[k] += cost[k]
            elif dropped is not None:
                dropped[i, j] += 1
    # Taking back a later replica can leave room for one taken back earlier (demands differ): give each row what
    # it lost back, in row order, wherever one more stays within one of its share and fits.
    lost = out.sum(axis=1) < np.asarray(target, dtype=np.int64).sum(axis=1)
    for i in np.flatnonzero(lost).tolist():
        left = int(np.asarray(target[i], dtype=np.int64).sum() - out[i].sum())
        while left > 0:
            below = shares[i] - out[i]
            cost = np.where(out[i] >= running[i], demand[i], 0.0)
            candidates = np.where(offered[i] & (load + cost <= room + slack) & (below > 1e-9), below, -np.inf)
            k = int(np.argmax(candidates))
            if not np.isfinite(candidates[k]):
                break
            out[i, k] += 1
            load[k] += cost[k]
            left -= 1
            if dropped is not None and dropped[i].any():
                dropped[i, int(np.flatnonzero(dropped[i])[0])] -= 1
    return out


def whole_gangs(target: np.ndarray, gang: np.ndarray, replicas: np.ndarray, existing: np.ndarray,
                surplus: np.ndarray, capable: np.ndarray) -> np.ndarray:
    """Replica targets with every gang row all or none in one pool (docs/gangs.md).

    A gang (``spec.replicas.gang``) is one indivisible bundle of the market: its share is ``N_i`` replicas in one
    pool or nothing (004 Sec. 2.1 with the demand vector of Sec. 7.1 taken ``N_i`` times: ``N_i d_i`` of the pool
    for the throughput ``a_ij``). So a gang row's target is ``N_i`` in one pool, else 0: the pool where it has pods
    (most of them, ties to the lower pool; what exists stays, as for every job), else the pool ``j`` that ``capable``
    allows (its nodes can host all ``N_i``) with the largest ``surplus[i, j]`` (the bundle's utility less its cost at
    the market's prices, less the utility of nothing), when that surplus is at least 0; else nothing. Rows that are
    not gangs are returned as given. Returns a new integer matrix."""
    out = np.asarray(target, dtype=np.int64).copy()
    for i in np.flatnonzero(gang).tolist():
        out[i] = 0
        if replicas[i] <= 0:
            continue
        if existing[i].sum() > 0:
            out[i, int(np.argmax(existing[i]))] = int(replicas[i])
            continue
        worth = np.where(capable[i], surplus[i], -np.inf)
        j = int(np.argmax(worth))
        if np.isfinite(worth[j]) and worth[j] >= 0.0:
            out[i, j] = int(replicas[i])
    return out
