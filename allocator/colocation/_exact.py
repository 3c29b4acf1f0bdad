"""Exact partition by dynamic programming over machines on class-count vectors (paper 001, Sec. 6.1 generalised).

Tasks with the same (type, size, demand) are interchangeable, so a machine's content is a vector ``x`` of counts per
class ``k`` (``0 <= x_k <= c_k``). With ``F_r(y)`` the least cost of placing the count vector ``y`` on machines
``0..r``::

    F_0(y) = c_0(y),        F_r(y) = min_{0 <= x <= y} F_{r-1}(y - x) + c_r(x)

where ``c_r(x)`` is the cost of one machine holding ``x`` (eq. (1), or ``sum_u N_u f(E_u)`` for a convex ``f``,
Sec. 7) and ``+inf`` where ``x`` breaks machine ``r``'s hard limits (capacity on the summed demands, max tasks). This
is DynSize's recursion (eqs. (7)-(8)) with classes that also carry the demand and with one layer per machine, so it
enumerates every partition (not only the OrS ones of Lemma 4.1) and is exact for linear costs, for any increasing
convex cost and under hard limits. ``F_{m-1}(counts) = +inf`` proves that no partition fits the limits.

Work: ``S = prod_k (c_k + 1)`` states and ``prod_k (c_k + 1)(c_k + 2) / 2`` transitions per layer (pairs
``x <= y``); :func:`exact_work` is the number the automatic route compares with its limit. The compiled kernel visits
the sub-box of every ``y`` with an odometer; since a state's index is linear in its digits, ``index(y - x) =
index(y) - index(x)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._model import InfeasibleError, _Instance, _Limits, machine_costs
from .kernels import load as load_kernels


@dataclass(frozen=True)
class _Classes:
    """Tasks grouped by (type, size, demand): ``cls[i]`` is task i's class, ``counts[k]`` the class sizes."""

    cls: np.ndarray
    counts: np.ndarray
    c_type: np.ndarray
    c_size: np.ndarray
    c_dem: np.ndarray


def _classes(inst: _Instance, limits: _Limits | None) -> _Classes:
    dem = limits.demands if limits is not None else np.zeros(inst.n)
    keys = np.stack((inst.types.astype(np.float64), inst.sizes, dem), axis=1)
    uniq, cls = np.unique(keys, axis=0, return_inverse=True)
    cls = cls.reshape(-1).astype(np.int64)
    return _Classes(
        cls=cls,
        counts=np.bincount(cls, minlength=uniq.shape[0]).astype(np.int64),
        c_type=uniq[:, 0].astype(np.int64),
        c_size=uniq[:, 1],
        c_dem=uniq[:, 2],
    )


def _layers(inst: _Instance, limits: _Limits | None) -> int:
    """Machines the DP needs: ``min(m, n)`` identical machines without limits (more would stay empty), all with."""
    if limits is None:
        return max(1, min(inst.m, inst.n))
    return inst.m


def exact_work(inst: _Instance, limits: _Limits | None = None) -> float:
    """Transitions the DP would evaluate: ``(layers - 1) * prod (c_k + 1)(c_k + 2) / 2 + prod (c_k + 1) * layers``."""
    counts = _classes(inst, limits).counts if inst.n else np.zeros(0, dtype=np.int64)
    pairs = math.prod((int(c) + 1) * (int(c) + 2) / 2 for c in counts)
    states = math.prod(int(c) + 1 for c in counts)
    layers = _layers(inst, limits)
    return float((layers - 1) * pairs + states * layers)


def exact_partition(inst: _Instance, limits: _Limits | None = None) -> tuple[np.ndarray, int]:
    """A certified optimal partition by the DP over machines (module docstring); returns (assignment, transitions).

    Raises :class:`InfeasibleError` when no partition respects ``limits`` (a proof: the DP covers every partition).
    """
    if inst.n == 0:
        return np.zeros(0, dtype=np.int64), 0
    cl = _classes(inst, limits)
    K = cl.counts.shape[0]
    radix = cl.counts + 1
    stride = np.ones(K, dtype=np.int64)
    for k in range(K - 2, -1, -1):
        stride[k] = stride[k + 1] * radix[k + 1]
    S = int(np.prod(radix))
    X = np.indices(tuple(int(r) for r in radix)).reshape(K, S).T.astype(np.float64)  # C order, matches ``stride``
    onehot = np.zeros((K, inst.T))
    onehot[np.arange(K), cl.c_type] = 1.0
    L = X @ (onehot * cl.c_size[:, None])
    N = X @ onehot
    base = np.asarray(machine_costs(L, N, inst.alpha, inst.cost), dtype=np.float64)
    layers = _layers(inst, limits)
    if limits is None:
        c1s = [base] * layers
    else:
        count = X.sum(axis=1)
        dem = X @ cl.c_dem
        c1s = []
        for r in range(layers):
            ok = (count <= limits.max_tasks[r]) & (dem <= limits.capacity[r] * (1 + 1e-12) + 1e-12)
            c1s.append(np.where(ok, base, np.inf))
    kernels = load_kernels()
    F = [c1s[0].copy()]
    work = np.zeros(1, dtype=np.int64)
    for r in range(1, layers):
        nxt = np.empty(S)
        kernels.dp_layer(F[-1], c1s[r], radix, stride, work, nxt)
        F.append(nxt)
    y = S - 1  # the full count vector
    if not np.isfinite(F[-1][y]):
        raise InfeasibleError("infeasible: no partition respects capacity and max_tasks (exact DP over all partitions)")
    per_machine = np.zeros((layers, K), dtype=np.int64)
    for r in range(layers - 1, 0, -1):
        x = int(kernels.dp_backtrack(F[r - 1], c1s[r], stride, radix, y, F[r][y]))
        if x < 0:
            raise AssertionError("exact DP backtrack found no predecessor")
        per_machine[r] = (x // stride) % radix
        y -= x
    per_machine[0] = (y // stride) % radix
    members = [list(np.flatnonzero(cl.cls == k)) for k in range(K)]
    assignment = np.empty(inst.n, dtype=np.int64)
    for r in range(layers):
        for k in range(K):
            for _ in range(int(per_machine[r, k])):
                assignment[members[k].pop()] = r
    return assignment, int(work[0]) + S
