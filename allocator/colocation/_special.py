"""Exact special cases and DynSize / ApproxScheme (paper 001, Sec. 6, 6.1, 6.2)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ._bestors import OrSTable, _bestors, _type_orders, bestors_table
from ._model import _Instance, _validate, machine_costs

_MAX_DYNSIZE_STATES = 2_000_000

# ----------------------------------------------------------------------------------------------------------------
# Section 6 special cases
# ----------------------------------------------------------------------------------------------------------------


def _type_tables(inst: _Instance, machines: int) -> tuple[list[np.ndarray], list[OrSTable | None]]:
    orders = _type_orders(inst)
    tables: list[OrSTable | None] = []
    for o in orders:
        tables.append(bestors_table(inst.sizes[o], machines) if o.size else None)
    return orders, tables


def _independent(inst: _Instance) -> np.ndarray:
    off = inst.alpha - np.diag(np.diag(inst.alpha))
    if np.any(off != 0):
        raise ValueError("method 'independent' needs alpha[t, u] = 0 for all t != u (Sec. 6)")
    orders, tables = _type_tables(inst, inst.m)
    assignment = np.zeros(inst.n, dtype=np.int64)
    for o, tab in zip(orders, tables):
        if tab is not None:
            for k, (s, e) in enumerate(tab.segments()):
                assignment[o[s:e]] = k
    return assignment


def _equivalent(inst: _Instance) -> np.ndarray:
    if np.any(inst.alpha != inst.alpha.flat[0]):
        raise ValueError("method 'equivalent' needs all alpha[t, u] equal (Sec. 6)")
    return _bestors(inst)


def large_influence_condition(sizes: Any, types: Any, alpha: Any, n_machines: int) -> bool:
    """Sec. 6 "large influences": ``T' <= m`` and ``alpha[t, u] * p_min > D`` for all present ``t != u``.

    ``T'`` counts the types present, ``D = sum_t alpha[t, t] n_t W_t`` is the cost of the dedicated partition (every
    type alone on one machine) and ``p_min > 0`` the smallest size: then any task sharing a machine with another type
    costs more than ``D`` and some optimum dedicates machines to types. (The paper states the condition for sizes
    ``>= 1``; ``p_min`` makes it exact for real sizes.)
    """
    inst = _validate(sizes, types, alpha, n_machines)
    return _large_condition(inst)


def _large_condition(inst: _Instance) -> bool:
    present = np.unique(inst.types)
    if present.size > inst.m or inst.n == 0:
        return present.size <= inst.m
    if inst.sizes.min() <= 0:
        return False
    n_t = np.bincount(inst.types, minlength=inst.T)
    W_t = np.bincount(inst.types, weights=inst.sizes, minlength=inst.T)
    D = float(np.sum(np.diag(inst.alpha) * n_t * W_t))
    sub = inst.alpha[np.ix_(present, present)]
    off = sub[~np.eye(present.size, dtype=bool)]
    return bool(off.size == 0 or off.min() * inst.sizes.min() > D)


def _configurations(m: int, T: int) -> np.ndarray:
    """All ``(k_1..k_T)`` with ``k_t >= 1`` and ``sum k_t = m`` (the ``C(m-1, T-1)`` configurations of Sec. 6)."""
    combos = list(itertools.combinations(range(1, m), T - 1))
    cuts = np.array(combos, dtype=np.int64).reshape(len(combos), T - 1)
    full = np.concatenate((np.zeros((cuts.shape[0], 1), np.int64), cuts, np.full((cuts.shape[0], 1), m)), axis=1)
    return np.diff(full, axis=1)


def _large_influences(inst: _Instance) -> np.ndarray:
    if not _large_condition(inst):
        raise ValueError(
            "method 'large-influences' needs T <= m and alpha[t, u] * p_min > cost of the dedicated partition "
            "for every t != u (Sec. 6); see large_influence_condition()"
        )
    present = [t for t in range(inst.T) if np.any(inst.types == t)]
    assignment = np.zeros(inst.n, dtype=np.int64)
    if not present:
        return assignment
    P = len(present)
    orders, tables = _type_tables(inst, inst.m - P + 1)
    configs = _configurations(inst.m, P)
    total = np.zeros(configs.shape[0])
    for c, t in enumerate(present):
        tab = tables[t]
        assert tab is not None
        total += inst.alpha[t, t] * tab.costs[configs[:, c] - 1, -1]
    best = configs[int(np.argmin(total))]
    first = 0
    for c, t in enumerate(present):
        tab = tables[t]
        assert tab is not None
        for k, (s, e) in enumerate(tab.segments(r=int(best[c]))):
            assignment[orders[t][s:e]] = first + k
        first += int(best[c])
    return assignment


# ----------------------------------------------------------------------------------------------------------------
# DynSize (Sec. 6.1) and ApproxScheme (Sec. 6.2)
# ----------------------------------------------------------------------------------------------------------------


def _dynsize(inst: _Instance, sizes_for_classes: np.ndarray, budget: int | None) -> tuple[np.ndarray, int]:
    """DynSize on the classes (type, size) of ``sizes_for_classes``; costs use those sizes (eqs. 7-8)."""
    keys = np.stack((inst.types.astype(np.float64), sizes_for_classes), axis=1)
    uniq, cls = np.unique(keys, axis=0, return_inverse=True)
    cls = cls.reshape(-1)
    K = uniq.shape[0]
    c_type = uniq[:, 0].astype(np.int64)
    c_size = uniq[:, 1]
    counts = np.bincount(cls, minlength=K)
    shape = tuple(int(c) + 1 for c in counts)
    S = int(np.prod(shape, dtype=np.float64)) if K else 1
    pairs = math.prod((int(c) + 1) * (int(c) + 2) // 2 for c in counts)
    evaluations = pairs * max(inst.m - 1, 0) + S
    if S > _MAX_DYNSIZE_STATES:
        raise ValueError(f"DynSize would need {S} states per layer (limit {_MAX_DYNSIZE_STATES}); use fewer sizes")
    if budget is not None and evaluations > budget:
        raise ValueError(f"DynSize would need {evaluations} evaluations, more than budget={budget}")
    if inst.n == 0:
        return np.zeros(0, dtype=np.int64), 0
    X = np.indices(shape).reshape(K, S).T.astype(np.float64)  # every count vector, C order
    onehot = np.zeros((K, inst.T))
    onehot[np.arange(K), c_type] = 1.0
    L = X @ (onehot * c_size[:, None])
    N = X @ onehot
    c1 = machine_costs(L, N, inst.alpha, inst.cost).reshape(shape)
    cur = c1.copy()
    choices = []
    Xi = X.astype(np.int64)
    for _ in range(1, inst.m):
        prev = cur
        nxt = prev.copy()  # x = 0 on the new machine
        arg = np.zeros(shape, dtype=np.int64)
        for flat in range(1, S):
            x = Xi[flat]
            dst = tuple(slice(int(v), None) for v in x)
            src = tuple(slice(0, s - int(v)) for s, v in zip(shape, x))
            cand = prev[src] + c1.flat[flat]
            region = nxt[dst]
            better = cand < region
            if np.any(better):
                region[better] = cand[better]
                arg[dst][better] = flat
        cur = nxt
        choices.append(arg)
    # backtrack
    y = counts.astype(np.int64).copy()
    per_machine = np.zeros((inst.m, K), dtype=np.int64)
    for r in range(inst.m - 1, 0, -1):
        flat = int(choices[r - 1][tuple(y)])
        x = Xi[flat]
        per_machine[r] = x
        y = y - x
    per_machine[0] = y
    members = [list(np.flatnonzero(cls == c)) for c in range(K)]
    assignment = np.empty(inst.n, dtype=np.int64)
    for r in range(inst.m):
        for c in range(K):
            for _ in range(int(per_machine[r, c])):
                assignment[members[c].pop()] = r
    return assignment, evaluations


def _round_sizes(sizes: np.ndarray, eps: float) -> np.ndarray:
    """Sec. 6.2: ``p' = (1 + eps) ** ceil(log_{1+eps} p)`` (0 stays 0)."""
    out = np.zeros_like(sizes)
    pos = sizes > 0
    k = np.ceil(np.log(sizes[pos]) / np.log1p(eps) - 1e-9)
    out[pos] = np.power(1.0 + eps, k)
    return out
