"""CutJuxtapose (paper 001, Sec. 6.3): all OrS partitions, exact for linear costs within its budget."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from ._bestors import _type_orders
from ._model import _Instance, machine_costs

# ----------------------------------------------------------------------------------------------------------------
# CutJuxtapose (Sec. 6.3)
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class _Placements:
    """Placements of one type's OrS groups on machines: loads ``L`` and counts ``N`` of shape (a, m)."""

    L: np.ndarray
    N: np.ndarray
    blocks: list[tuple[int, int, np.ndarray, np.ndarray]]  # (offset, k, cut points, maps)


def _placement_count(n_t: int, m: int, fixed: bool) -> int:
    if n_t == 0:
        return 1
    return sum(math.comb(n_t - 1, k - 1) * (1 if fixed else math.perm(m, k)) for k in range(1, min(m, n_t) + 1))


def _placements(sorted_sizes: np.ndarray, m: int, fixed: bool, limit: int, with_maps: bool = True) -> _Placements:
    n_t = sorted_sizes.shape[0]
    prefix = np.concatenate(([0.0], np.cumsum(sorted_sizes)))
    Ls, Ns, blocks = [], [], []
    if n_t == 0:
        return _Placements(np.zeros((1, m)), np.zeros((1, m)), [(0, 0, np.zeros((1, 0), np.int64), np.zeros((1, 0)))])
    done = 0
    for k in range(1, min(m, n_t) + 1):
        if done >= limit:
            break
        if fixed or not with_maps:
            maps = np.arange(k, dtype=np.int64)[None, :]
        else:
            maps = np.array(list(itertools.permutations(range(m), k)), dtype=np.int64).reshape(-1, k)
        Pk = maps.shape[0]
        need = -(-(limit - done) // Pk)
        cut_list = list(itertools.islice(itertools.combinations(range(1, n_t), k - 1), need))
        cuts = np.array(cut_list, dtype=np.int64).reshape(len(cut_list), k - 1)
        C = cuts.shape[0]
        bounds = np.concatenate((np.zeros((C, 1), np.int64), cuts, np.full((C, 1), n_t)), axis=1)
        g_load = prefix[bounds[:, 1:]] - prefix[bounds[:, :-1]]
        g_cnt = np.diff(bounds, axis=1).astype(np.float64)
        rows = (np.arange(C)[:, None, None] * Pk + np.arange(Pk)[None, :, None]) + np.zeros((1, 1, k), np.int64)
        cols = np.broadcast_to(maps[None, :, :], (C, Pk, k))
        L = np.zeros((C * Pk, m))
        N = np.zeros((C * Pk, m))
        L[rows.ravel(), cols.ravel()] = np.broadcast_to(g_load[:, None, :], (C, Pk, k)).ravel()
        N[rows.ravel(), cols.ravel()] = np.broadcast_to(g_cnt[:, None, :], (C, Pk, k)).ravel()
        take = min(C * Pk, limit - done)
        Ls.append(L[:take])
        Ns.append(N[:take])
        blocks.append((done, k, cuts, maps))
        done += take
    return _Placements(np.concatenate(Ls), np.concatenate(Ns), blocks)


def _placement_machines(pl: _Placements, index: int, n_t: int) -> np.ndarray:
    """Machine of every position (in the type's sorted order) for placement ``index``."""
    for off, k, cuts, maps in reversed(pl.blocks):
        if index >= off:
            if k == 0:
                return np.zeros(0, dtype=np.int64)
            Pk = maps.shape[0]
            c, q = divmod(index - off, Pk)
            bounds = np.concatenate(([0], cuts[c], [n_t]))
            return np.repeat(maps[q], np.diff(bounds))
    raise AssertionError("placement index out of range")


def _water_fill(counts: list[int], budget: int) -> list[int]:
    """Per-type limits ``a_t <= counts[t]`` with ``prod a_t <= budget``, as balanced as possible."""
    order = sorted(range(len(counts)), key=lambda t: counts[t])
    out = [1] * len(counts)
    rest = float(max(budget, 1))
    for i, t in enumerate(order):
        share = rest ** (1.0 / (len(counts) - i))
        a = int(max(1, min(counts[t], math.floor(share + 1e-9))))
        out[t] = a
        rest = rest / a
    return out


def _cutjuxtapose(inst: _Instance, budget: int, juxtapose: str) -> tuple[np.ndarray, int, bool]:
    orders = _type_orders(inst)
    n_t = [o.size for o in orders]
    m = inst.m
    present = [t for t in range(inst.T) if n_t[t] > 0]
    if not present:
        return np.zeros(0, dtype=np.int64), 0, True
    if juxtapose == "auto":
        juxtapose = "matching" if (len(present) == 2 and m >= 5 and inst.cost is None) else "enumerate"
    if juxtapose == "matching":
        if len(present) != 2:
            raise ValueError("juxtapose='matching' needs exactly two types present (Sec. 6.3)")
        if inst.cost is not None:
            raise ValueError("juxtapose='matching' is for linear costs only")
        return _cutjuxtapose_matching(inst, orders, present, budget)
    if juxtapose != "enumerate":
        raise ValueError(f"juxtapose must be 'auto', 'enumerate' or 'matching', got {juxtapose!r}")
    free = {t: _placement_count(n_t[t], m, False) for t in present}
    fixed_counts = {t: _placement_count(n_t[t], m, True) for t in present}
    best_fixed = min(present, key=lambda f: fixed_counts[f] * math.prod(free[t] for t in present if t != f))
    full = [fixed_counts[t] if t == best_fixed else free[t] for t in present]
    total = math.prod(full)
    complete = total <= budget
    limits = full if complete else _water_fill(full, budget)
    pls = [_placements(inst.sizes[orders[t]], m, t == best_fixed, limits[i]) for i, t in enumerate(present)]
    sizes_ = [pl.L.shape[0] for pl in pls]
    evaluations = math.prod(sizes_)
    P = len(present)
    A = inst.alpha[np.ix_(present, present)]
    best_val = np.inf
    best_idx: tuple[int, ...] = (0,) * P
    rest = math.prod(sizes_[1:])
    chunk = max(1, 4_000_000 // max(rest * (m if inst.cost is not None else 1), 1))
    if inst.cost is None:
        d = [A[i, i] * np.sum(pl.L * pl.N, axis=1) for i, pl in enumerate(pls)]
        cross = {}
        for i in range(1, P):
            for j in range(i + 1, P):
                cross[i, j] = A[i, j] * pls[i].L @ pls[j].N.T + A[j, i] * pls[i].N @ pls[j].L.T

        def shaped(v: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
            shp = [1] * P
            for ax, s in zip(axes, v.shape):
                shp[ax] = s
            return v.reshape(shp)

        base = np.zeros([1, *sizes_[1:]])
        for i in range(1, P):
            base = base + shaped(d[i], (i,))
        for (i, j), X in cross.items():
            base = base + shaped(X, (i, j))
        for s in range(0, sizes_[0], chunk):
            e = min(sizes_[0], s + chunk)
            tens = base + shaped(d[0][s:e], (0,))
            for j in range(1, P):
                X0 = A[0, j] * pls[0].L[s:e] @ pls[j].N.T + A[j, 0] * pls[0].N[s:e] @ pls[j].L.T
                tens = tens + shaped(X0, (0, j))
            flat = int(np.argmin(tens))
            if tens.flat[flat] < best_val:
                best_val = float(tens.flat[flat])
                idx = np.unravel_index(flat, tens.shape)
                best_idx = (int(idx[0]) + s, *(int(v) for v in idx[1:]))
    else:
        Lstack = [pl.L for pl in pls]
        Nstack = [pl.N for pl in pls]
        n_all = evaluations
        step = max(1, 400_000 // m)
        for s in range(0, n_all, step):
            flat_ix = np.arange(s, min(n_all, s + step))
            gidx: tuple[np.ndarray, ...] = tuple(np.unravel_index(flat_ix, sizes_))
            L = np.stack([Lstack[i][gidx[i]] for i in range(P)], axis=-1)
            N = np.stack([Nstack[i][gidx[i]] for i in range(P)], axis=-1)
            vals = machine_costs(L, N, A, inst.cost).sum(axis=1)
            k = int(np.argmin(vals))
            if vals[k] < best_val:
                best_val = float(vals[k])
                best_idx = tuple(int(v[k]) for v in gidx)
    assignment = np.zeros(inst.n, dtype=np.int64)
    for i, t in enumerate(present):
        assignment[orders[t]] = _placement_machines(pls[i], best_idx[i], n_t[t])
    return assignment, evaluations, complete


def _cutjuxtapose_matching(
    inst: _Instance, orders: list[np.ndarray], present: list[int], budget: int
) -> tuple[np.ndarray, int, bool]:
    """Two types: for every pair of cuts, juxtapose by a min-cost assignment of type-B groups to type-A machines.

    The matching minimises ``sum_k alpha[A,B] L^A_k N^B_k + alpha[B,A] L^B_k N^A_k`` over the assignments (the paper
    writes it as ``M - w``; the interaction itself is what must be minimised). Each matching counts as ``m^2``
    evaluations (its cost-matrix entries).
    """
    m = inst.m
    a, b = present
    n_a, n_b = orders[a].size, orders[b].size
    ca, cb = _placement_count(n_a, m, True), _placement_count(n_b, m, True)
    per = m * m
    total = ca * cb * per
    complete = total <= budget
    la, lb = (ca, cb) if complete else _water_fill([ca, cb], max(budget // per, 1))
    pa = _placements(inst.sizes[orders[a]], m, True, la)
    pb = _placements(inst.sizes[orders[b]], m, True, lb, with_maps=False)
    A = inst.alpha
    da = A[a, a] * np.sum(pa.L * pa.N, axis=1)
    db = A[b, b] * np.sum(pb.L * pb.N, axis=1)
    best_val = np.inf
    best = (0, 0, np.arange(m))
    for i in range(pa.L.shape[0]):
        # cost[j, r, g]: type-A machine r with type-B group g, for every type-B cut j
        cost = A[a, b] * pa.L[i][None, :, None] * pb.N[:, None, :] + A[b, a] * pb.L[:, None, :] * pa.N[i][None, :, None]
        for j in range(cost.shape[0]):
            rows, cols = linear_sum_assignment(cost[j])
            val = da[i] + db[j] + float(cost[j][rows, cols].sum())
            if val < best_val:
                best_val = val
                perm = np.empty(m, dtype=np.int64)
                perm[cols] = rows
                best = (i, j, perm)
    evaluations = pa.L.shape[0] * pb.L.shape[0] * per
    assignment = np.zeros(inst.n, dtype=np.int64)
    assignment[orders[a]] = _placement_machines(pa, best[0], n_a)
    groups_b = _placement_machines(pb, best[1], n_b)
    assignment[orders[b]] = best[2][groups_b]
    return assignment, evaluations, complete
