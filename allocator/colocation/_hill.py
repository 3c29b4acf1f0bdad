"""HILL (paper 001, Sec. 8.1.1): best-improvement hill climbing over the four OrS-preserving moves, with the
optional hard limits."""

from __future__ import annotations

import numpy as np

from ._bestors import _type_orders
from ._model import InfeasibleError, _Instance, _Limits, machine_costs, machine_loads


def _ors_blocks(orders: list[np.ndarray], start: np.ndarray, T: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The OrS blocks of ``start`` (Sec. 4, Lemma 4.1: each machine holds a contiguous block of every type's sorted
    tasks): ``(first, count)``, ``(T, m)``, the position in type ``t``'s sorted order of the first task machine ``k``
    holds and how many it holds. ``AssertionError`` if ``start`` is not OrS."""
    first = np.zeros((T, m), dtype=np.int64)
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
        first[t, b_mach] = b_starts
        cnt[t, b_mach] = b_len
    return first, cnt


def _candidate_moves(first: np.ndarray, cnt: np.ndarray) -> np.ndarray | None:
    """Rows ``(type, pos, src, dst)`` of the four OrS-preserving moves of Sec. 8.1.1 (``None`` if there are none).

    For every type, the machines holding it are ordered by their block; moves: the smallest task of a block to the
    next block's machine, the largest to the previous block's machine, and the smallest or (blocks of two or more)
    the largest to any machine free of that type. ``pos`` is the task's position in the type's sorted order.
    """
    cand = []
    for t in range(cnt.shape[0]):
        occ = np.flatnonzero(cnt[t] > 0)
        if occ.size == 0:
            continue
        bo = occ[np.argsort(first[t, occ])]
        free = np.flatnonzero(cnt[t] == 0)
        small = first[t, bo] + cnt[t, bo] - 1
        large = first[t, bo]
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
        return None
    return np.concatenate(cand)


class _LimitLoads:
    """Per-machine demand ``D`` and task count ``C`` under the hard limits, and whether HILL is still repairing a
    start that violates them (the violation of machine ``k`` is its excess demand, in units of the largest finite
    capacity, plus its excess tasks)."""

    def __init__(self, assignment: np.ndarray, N: np.ndarray, limits: _Limits, m: int) -> None:
        self.D = np.bincount(assignment, weights=limits.demands, minlength=m)
        self.C = N.sum(axis=1)
        self.cap, self.mt = limits.capacity, limits.max_tasks
        cap = self.cap
        dscale = float(np.max(cap[np.isfinite(cap)])) if np.any(np.isfinite(cap)) else 1.0
        self.dscale = dscale if dscale > 0 else 1.0
        self.repairing = bool(np.sum(self.viol(self.D, self.C, np.arange(m))) > 1e-12)

    def viol(self, d: np.ndarray, c: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Violation of machines ``k`` with demands ``d`` and task counts ``c``."""
        return np.maximum(0.0, d - self.cap[k]) / self.dscale + np.maximum(0.0, c - self.mt[k])

    def choose(self, src: np.ndarray, dst: np.ndarray, d: np.ndarray, delta: np.ndarray, scale: float) -> int | None:
        """The candidate move to take (``d`` its task's demand, ``delta`` its cost change), or ``None`` (stop).

        While repairing: the move that most reduces the total violation, ties by cost (``None`` if none reduces
        it). Otherwise the cheapest move whose destination stays within its capacity and task limit, if it lowers
        the cost by more than ``1e-12`` of ``scale``.
        """
        D, C = self.D, self.C
        fits = (D[dst] + d <= self.cap[dst] * (1 + 1e-12) + 1e-12) & (C[dst] + 1 <= self.mt[dst])
        if self.repairing:
            dv = (
                self.viol(D[src] - d, C[src] - 1, src)
                + self.viol(D[dst] + d, C[dst] + 1, dst)
                - self.viol(D[src], C[src], src)
                - self.viol(D[dst], C[dst], dst)
            )
            ok = np.flatnonzero(dv < -1e-12)
            if ok.size == 0:
                return None
            return int(ok[np.lexsort((delta[ok], dv[ok]))[0]])
        ok = np.flatnonzero(fits)
        if ok.size == 0:
            return None
        k = int(ok[np.argmin(delta[ok])])
        return None if delta[k] >= -1e-12 * scale else k

    def move(self, s: int, dd: int, dem: float, ar: np.ndarray) -> None:
        """A task of demand ``dem`` moved from machine ``s`` to ``dd``; the repair ends once nothing is violated."""
        self.D[s] -= dem
        self.D[dd] += dem
        self.C[s] -= 1
        self.C[dd] += 1
        if self.repairing and float(np.sum(self.viol(self.D, self.C, ar))) <= 1e-12:
            self.repairing = False


class _HillState:
    """The partition HILL walks over: the assignment, its OrS blocks (:func:`_ors_blocks`), per-machine loads ``L``
    and counts ``N`` per type, ``E = L alpha`` and ``G = N alpha^T`` (what a move changes in eq. (1) for the linear
    cost), the machine costs and, with hard limits, :class:`_LimitLoads`."""

    def __init__(self, inst: _Instance, start: np.ndarray, limits: _Limits | None) -> None:
        T, m = inst.T, inst.m
        self.inst = inst
        self.orders = _type_orders(inst)
        # per-type sorted sizes (and demands) as one flat array: type t's q-th task is at toff[t] + q
        self.toff = np.concatenate(([0], np.cumsum([o.size for o in self.orders])[:-1])).astype(np.int64)
        flat_order = np.concatenate(self.orders) if self.orders else np.zeros(0, dtype=np.int64)
        self.tsizes = inst.sizes[flat_order]
        self.tdem = limits.demands[flat_order] if limits is not None else None
        self.demands = limits.demands if limits is not None else None
        self.first, self.cnt = _ors_blocks(self.orders, start, T, m)
        self.assignment = start.copy()
        self.L, self.N = machine_loads(inst.sizes, inst.types, self.assignment, T, m)
        self.E = self.L @ inst.alpha
        self.G = self.N @ inst.alpha.T
        self.limited = _LimitLoads(self.assignment, self.N, limits, m) if limits is not None else None
        self.mcost = machine_costs(self.L, self.N, inst.alpha, inst.cost)
        self.scale = max(1.0, float(np.abs(self.mcost).sum()))
        self.ar = np.arange(m)

    def deltas(self, ct: np.ndarray, cpos: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Cost change of every candidate move: O(1) per move from ``E`` and ``G`` for the linear cost (eq. (1)),
        the two machines' costs recomputed otherwise."""
        alpha, f, T = self.inst.alpha, self.inst.cost, self.inst.T
        L, N, E, G, mcost = self.L, self.N, self.E, self.G, self.mcost
        p = self.tsizes[self.toff[ct] + cpos]
        if f is None:
            att = alpha[ct, ct]
            return np.asarray((-E[src, ct] - p * G[src, ct] + p * att) + (E[dst, ct] + p * G[dst, ct] + p * att))
        onehot = (ct[:, None] == np.arange(T)[None, :]).astype(np.float64)
        new_src = machine_costs(L[src] - p[:, None] * onehot, N[src] - onehot, alpha, f)
        new_dst = machine_costs(L[dst] + p[:, None] * onehot, N[dst] + onehot, alpha, f)
        return np.asarray(new_src - mcost[src] + new_dst - mcost[dst])

    def best_move(self, cands: np.ndarray) -> int | None:
        """Index in ``cands`` of the move to take, or ``None`` when HILL stops (no improving move; with limits see
        :meth:`_LimitLoads.choose`)."""
        ct, cpos, src, dst = cands.T
        delta = self.deltas(ct, cpos, src, dst)
        if self.limited is None:
            k = int(np.argmin(delta))
            return None if delta[k] >= -1e-12 * self.scale else k
        assert self.tdem is not None
        d = self.tdem[self.toff[ct] + cpos]
        return self.limited.choose(src, dst, d, delta, self.scale)

    def apply(self, t: int, q: int, s: int, dd: int) -> None:
        """Move type ``t``'s ``q``-th sorted task from machine ``s`` to ``dd``: blocks, assignment, loads, costs."""
        first, cnt, alpha = self.first, self.cnt, self.inst.alpha
        was_free = cnt[t, dd] == 0
        is_smallest = q == first[t, s] + cnt[t, s] - 1
        if is_smallest:
            cnt[t, s] -= 1
        else:
            first[t, s] += 1
            cnt[t, s] -= 1
        if was_free or first[t, dd] > q:  # a new block, or the next block grows at its front
            first[t, dd] = q
        cnt[t, dd] += 1
        task = int(self.orders[t][q])
        self.assignment[task] = dd
        size = self.tsizes[self.toff[t] + q]
        for mach, sign in ((s, -1.0), (dd, 1.0)):
            self.L[mach, t] += sign * size
            self.N[mach, t] += sign
            self.E[mach] += sign * size * alpha[t]
            self.G[mach] += sign * alpha[:, t]
        self.mcost[[s, dd]] = machine_costs(self.L[[s, dd]], self.N[[s, dd]], alpha, self.inst.cost)
        if self.limited is not None:
            assert self.demands is not None
            self.limited.move(s, dd, self.demands[task], self.ar)


def _hill(inst: _Instance, start: np.ndarray, budget: int, limits: _Limits | None) -> tuple[np.ndarray, int, int]:
    """Best-improvement hill climbing over the four OrS-preserving moves of Sec. 8.1.1.

    For every type, machines holding that type are ordered by their block of the type's sorted tasks (OrS: each
    block is contiguous). Moves (:func:`_candidate_moves`): the smallest task of a block to the next block's machine,
    the largest to the previous block's machine, and the smallest or the largest to any machine free of that type.
    Every iteration evaluates all candidate moves (vectorised, O(1) per move for linear costs), takes the best if it
    lowers the cost and stops when none does or ``budget`` candidate evaluations are used. Returns (assignment,
    evaluations, moves).

    With ``limits``: a move whose destination would exceed its capacity or task limit is never taken. If ``start``
    violates a limit, a repair phase first takes the moves that most reduce the total violation (ties by cost);
    :class:`InfeasibleError` if it gets stuck.
    """
    state = _HillState(inst, start, limits)
    evaluations = 0
    moves = 0
    while evaluations < budget:
        cands = _candidate_moves(state.first, state.cnt)
        if cands is None:
            break
        left = budget - evaluations
        if cands.shape[0] > left:
            cands = cands[:left]
        evaluations += cands.shape[0]
        k = state.best_move(cands)
        if k is None:
            break
        t, q, s, dd = (int(v) for v in cands[k])
        state.apply(t, q, s, dd)
        moves += 1
    lim = state.limited
    if lim is not None and lim.repairing:
        over = np.flatnonzero(lim.viol(lim.D, lim.C, state.ar) > 1e-12)
        raise InfeasibleError(
            "no partition within the hard limits found by hill climbing from the start: machines "
            f"{over.tolist()} still exceed capacity or max_tasks (loads {lim.D[over].tolist()}, tasks "
            f"{lim.C[over].tolist()}); the instance may be infeasible (bin packing)"
        )
    return state.assignment, evaluations, moves
