"""HILL (paper 001, Sec. 8.1.1): best-improvement hill climbing over the four OrS-preserving moves, with the
optional hard limits."""

from __future__ import annotations

import numpy as np

from ._bestors import _type_orders
from ._model import InfeasibleError, _Instance, _Limits, machine_costs, machine_loads


def _hill(inst: _Instance, start: np.ndarray, budget: int, limits: _Limits | None) -> tuple[np.ndarray, int, int]:
    """Best-improvement hill climbing over the four OrS-preserving moves of Sec. 8.1.1.

    For every type, machines holding that type are ordered by their block of the type's sorted tasks (OrS: each
    block is contiguous). Moves: the smallest task of a block to the next block's machine, the largest to the
    previous block's machine, and the smallest or the largest to any machine free of that type. Every iteration
    evaluates all candidate moves (vectorised, O(1) per move for linear costs), takes the best if it lowers the cost
    and stops when none does or ``budget`` candidate evaluations are used. Returns (assignment, evaluations, moves).

    With ``limits``: a move whose destination would exceed its capacity or task limit is never taken. If ``start``
    violates a limit, a repair phase first takes the moves that most reduce the total violation (ties by cost);
    :class:`InfeasibleError` if it gets stuck.
    """
    T, m = inst.T, inst.m
    orders = _type_orders(inst)
    # per-type sorted sizes (and demands) as one flat array: type t's q-th task is at toff[t] + q
    toff = np.concatenate(([0], np.cumsum([o.size for o in orders])[:-1])).astype(np.int64)
    flat_order = np.concatenate(orders) if orders else np.zeros(0, dtype=np.int64)
    tsizes = inst.sizes[flat_order]
    tdem = limits.demands[flat_order] if limits is not None else None
    start_ = np.zeros((T, m), dtype=np.int64)
    cnt = np.zeros((T, m), dtype=np.int64)
    for t, o in enumerate(orders):
        if o.size == 0:
            continue
        mach = start[o]
        change = np.flatnonzero(np.diff(mach)) + 1
        b_starts = np.concatenate(([0], change))
        b_mach = mach[b_starts]
        if np.unique(b_mach).size != b_mach.size:
            raise AssertionError("HILL needs an OrS start")
        b_len = np.diff(np.concatenate((b_starts, [o.size])))
        start_[t, b_mach] = b_starts
        cnt[t, b_mach] = b_len
    assignment = start.copy()
    L, N = machine_loads(inst.sizes, inst.types, assignment, T, m)
    alpha, f = inst.alpha, inst.cost
    E = L @ alpha
    G = N @ alpha.T
    if limits is not None:
        D = np.bincount(assignment, weights=limits.demands, minlength=m)
        C = N.sum(axis=1)
        cap, mt = limits.capacity, limits.max_tasks
        dscale = float(np.max(cap[np.isfinite(cap)])) if np.any(np.isfinite(cap)) else 1.0
        dscale = dscale if dscale > 0 else 1.0

        def viol(d: np.ndarray, c: np.ndarray, k: np.ndarray) -> np.ndarray:
            return np.maximum(0.0, d - cap[k]) / dscale + np.maximum(0.0, c - mt[k])

        repairing = bool(np.sum(viol(D, C, np.arange(m))) > 1e-12)
    else:
        repairing = False
    mcost = machine_costs(L, N, alpha, f)
    scale = max(1.0, float(np.abs(mcost).sum()))
    evaluations = 0
    moves = 0
    ar = np.arange(m)
    while evaluations < budget:
        cand = []  # (type, pos, src, dst)
        for t in range(T):
            occ = np.flatnonzero(cnt[t] > 0)
            if occ.size == 0:
                continue
            bo = occ[np.argsort(start_[t, occ])]
            free = np.flatnonzero(cnt[t] == 0)
            small = start_[t, bo] + cnt[t, bo] - 1
            large = start_[t, bo]
            b = bo.size
            parts = []
            if b > 1:
                parts.append(np.stack((small[:-1], bo[:-1], bo[1:]), axis=1))
                parts.append(np.stack((large[1:], bo[1:], bo[:-1]), axis=1))
            if free.size:
                nf = free.size
                parts.append(np.stack((np.repeat(small, nf), np.repeat(bo, nf), np.tile(free, b)), axis=1))
                multi = cnt[t, bo] > 1
                if np.any(multi):
                    lm, bm = large[multi], bo[multi]
                    parts.append(np.stack((np.repeat(lm, nf), np.repeat(bm, nf), np.tile(free, bm.size)), axis=1))
            if parts:
                arr = np.concatenate(parts)
                cand.append(np.concatenate((np.full((arr.shape[0], 1), t), arr), axis=1))
        if not cand:
            break
        cands = np.concatenate(cand)
        left = budget - evaluations
        if cands.shape[0] > left:
            cands = cands[:left]
        evaluations += cands.shape[0]
        ct, cpos, src, dst = cands.T
        p = tsizes[toff[ct] + cpos]
        if f is None:
            att = alpha[ct, ct]
            delta = (-E[src, ct] - p * G[src, ct] + p * att) + (E[dst, ct] + p * G[dst, ct] + p * att)
        else:
            onehot = (ct[:, None] == np.arange(T)[None, :]).astype(np.float64)
            new_src = machine_costs(L[src] - p[:, None] * onehot, N[src] - onehot, alpha, f)
            new_dst = machine_costs(L[dst] + p[:, None] * onehot, N[dst] + onehot, alpha, f)
            delta = new_src - mcost[src] + new_dst - mcost[dst]
        if limits is not None:
            assert tdem is not None
            d = tdem[toff[ct] + cpos]
            fits = (D[dst] + d <= cap[dst] * (1 + 1e-12) + 1e-12) & (C[dst] + 1 <= mt[dst])
            if repairing:
                dv = (
                    viol(D[src] - d, C[src] - 1, src)
                    + viol(D[dst] + d, C[dst] + 1, dst)
                    - viol(D[src], C[src], src)
                    - viol(D[dst], C[dst], dst)
                )
                ok = np.flatnonzero(dv < -1e-12)
                if ok.size == 0:
                    break
                k = int(ok[np.lexsort((delta[ok], dv[ok]))[0]])
            else:
                ok = np.flatnonzero(fits)
                if ok.size == 0:
                    break
                k = int(ok[np.argmin(delta[ok])])
                if delta[k] >= -1e-12 * scale:
                    break
        else:
            k = int(np.argmin(delta))
            if delta[k] >= -1e-12 * scale:
                break
        t, q, s, dd = (int(v) for v in cands[k])
        # update blocks
        was_free = cnt[t, dd] == 0
        is_smallest = q == start_[t, s] + cnt[t, s] - 1
        if is_smallest:
            cnt[t, s] -= 1
        else:
            start_[t, s] += 1
            cnt[t, s] -= 1
        if was_free or start_[t, dd] > q:  # a new block, or the next block grows at its front
            start_[t, dd] = q
        cnt[t, dd] += 1
        task = int(orders[t][q])
        assignment[task] = dd
        size = tsizes[toff[t] + q]
        for mach, sign in ((s, -1.0), (dd, 1.0)):
            L[mach, t] += sign * size
            N[mach, t] += sign
            E[mach] += sign * size * alpha[t]
            G[mach] += sign * alpha[:, t]
        mcost[[s, dd]] = machine_costs(L[[s, dd]], N[[s, dd]], alpha, f)
        if limits is not None:
            dem = limits.demands[task]
            D[s] -= dem
            D[dd] += dem
            C[s] -= 1
            C[dd] += 1
            if repairing and float(np.sum(viol(D, C, ar))) <= 1e-12:
                repairing = False
        moves += 1
    if limits is not None and repairing:
        over = np.flatnonzero(viol(D, C, ar) > 1e-12)
        raise InfeasibleError(
            "no partition within the hard limits found by hill climbing from the start: machines "
            f"{over.tolist()} still exceed capacity or max_tasks (loads {D[over].tolist()}, tasks "
            f"{C[over].tolist()}); the instance may be infeasible (bin packing)"
        )
    return assignment, evaluations, moves
