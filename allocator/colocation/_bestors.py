"""BestOrS, the single-type dynamic programme (paper 001, Sec. 5, eqs. (5)-(6)), and the lower bound of Sec. 8.1.3."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._model import _Instance, _Limits, _validate
from .kernels import load as load_kernels

# ----------------------------------------------------------------------------------------------------------------
# BestOrS: the single-type dynamic programme (Sec. 5)
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OrSTable:
    """Result of the single-type DP on sizes sorted non-increasingly.

    ``costs[r - 1, x]`` is the minimum single-type cost (eqs. 5-6, ``alpha = 1``) of the ``x`` largest tasks on at
    most ``r`` machines (plus a penalty where hard limits are violated); ``choice[r - 1, x]`` is the number ``j`` of
    tasks left to the first ``r - 1`` machines (machine ``r`` takes tasks ``j..x-1``).
    """

    costs: np.ndarray
    choice: np.ndarray

    def segments(self, r: int | None = None, x: int | None = None) -> list[tuple[int, int]]:
        """``[(start, end)]`` of the sorted tasks on machines ``1..r`` in an optimal solution for ``x`` tasks."""
        r = self.costs.shape[0] if r is None else r
        x = self.costs.shape[1] - 1 if x is None else x
        out = []
        for layer in range(r, 0, -1):
            j = int(self.choice[layer - 1, x])
            out.append((j, x))
            x = j
        return out[::-1]


def _segment_cost(prefix: np.ndarray, j: np.ndarray, x: np.ndarray) -> np.ndarray:
    return (x - j) * (prefix[x] - prefix[j])


def bestors_table(
    sorted_sizes: Any,
    n_machines: int,
    *,
    algorithm: str = "dc",
    max_tasks: np.ndarray | None = None,
    capacity: np.ndarray | None = None,
    demands: np.ndarray | None = None,
    penalty: float | None = None,
) -> OrSTable:
    """The BestOrS DP (Sec. 5, eqs. 5-6) for every prefix of ``sorted_sizes`` and every number of machines.

    ``C(x, r) = min_{0 <= j <= x} C(j, r - 1) + (x - j) (S_x - S_j)`` with ``S`` the prefix sums (``j = x`` leaves
    machine ``r`` empty). ``algorithm="quadratic"`` evaluates eq. (5) directly (O(n^2 m)); ``"dc"`` uses the
    monotonicity of the optimal split point that the quadrangle inequality of the segment cost gives (module
    docstring) and evaluates each layer by divide and conquer (O(m n log n), compiled:
    :mod:`allocator.colocation._bestors_kernel`). Both are exact and return the same costs.

    Optional per-layer hard limits ``max_tasks[r]`` / ``capacity[r]`` (on prefix sums of ``demands``) add
    ``penalty * (excess count + excess demand)`` to a segment; a convex function of a segment's length or demand is
    itself Monge, so ``"dc"`` stays exact for the penalised objective.
    """
    p = np.asarray(sorted_sizes, dtype=np.float64)
    n = p.shape[0]
    m = int(n_machines)
    if m < 1:
        raise ValueError("n_machines must be >= 1")
    if n > 1 and np.any(np.diff(p) > 0):
        raise ValueError("sorted_sizes must be sorted non-increasingly")
    if algorithm not in ("dc", "quadratic"):
        raise ValueError(f"algorithm must be 'dc' or 'quadratic', got {algorithm!r}")
    prefix = np.concatenate(([0.0], np.cumsum(p)))
    limited = max_tasks is not None or capacity is not None
    if limited:
        dprefix = np.concatenate(([0.0], np.cumsum(p if demands is None else np.asarray(demands, dtype=float))))
        mt = np.full(m, np.inf) if max_tasks is None else np.asarray(max_tasks, dtype=float)
        cp = np.full(m, np.inf) if capacity is None else np.asarray(capacity, dtype=float)
        big = float(penalty) if penalty is not None else 1e3 * (n * prefix[-1] + 1.0)

    def w(layer: int, j: np.ndarray, x: np.ndarray) -> np.ndarray:
        val = _segment_cost(prefix, j, x)
        if limited:
            over = np.maximum(0.0, (x - j) - mt[layer]) + np.maximum(0.0, dprefix[x] - dprefix[j] - cp[layer])
            val = val + big * over
        return val

    if algorithm == "dc":
        if not limited:
            dprefix, mt, cp, big = prefix, np.zeros(m), np.zeros(m), 0.0
        costs, choice = load_kernels().bestors_dc(prefix, dprefix, mt, cp, float(big), limited, m)
        return OrSTable(costs, choice)
    costs = np.empty((m, n + 1))
    choice = np.zeros((m, n + 1), dtype=np.int64)
    xs = np.arange(n + 1)
    costs[0] = w(0, np.zeros(n + 1, dtype=np.int64), xs)
    for layer in range(1, m):
        prev = costs[layer - 1]
        cur = np.empty(n + 1)
        arg = np.empty(n + 1, dtype=np.int64)
        for x in range(n + 1):
            js = np.arange(x + 1)
            vals = prev[js] + w(layer, js, np.full(x + 1, x))
            k = int(np.argmin(vals))
            cur[x], arg[x] = vals[k], k
        costs[layer], choice[layer] = cur, arg
    return OrSTable(costs, choice)


def _global_order(inst: _Instance) -> np.ndarray:
    """Tasks by non-increasing size, ties by type then index (restricted to one type: size, then index)."""
    return np.lexsort((np.arange(inst.n), inst.types, -inst.sizes))


def _type_orders(inst: _Instance) -> list[np.ndarray]:
    order = _global_order(inst)
    return [order[inst.types[order] == t] for t in range(inst.T)]


def _bestors(inst: _Instance, algorithm: str = "dc") -> np.ndarray:
    order = _global_order(inst)
    m_eff = max(1, min(inst.m, inst.n))
    table = bestors_table(inst.sizes[order], m_eff, algorithm=algorithm)
    assignment = np.empty(inst.n, dtype=np.int64)
    for k, (s, e) in enumerate(table.segments()):
        assignment[order[s:e]] = k
    return assignment


def _bestors_limited(inst: _Instance, limits: _Limits) -> np.ndarray:
    """BestOrS with penalised hard limits; machines sorted by (capacity, max_tasks) descending get layers 1..m."""
    order = _global_order(inst)
    perm = np.lexsort((-limits.max_tasks, -limits.capacity))
    table = bestors_table(
        inst.sizes[order],
        inst.m,
        max_tasks=limits.max_tasks[perm],
        capacity=limits.capacity[perm],
        demands=limits.demands[order],
    )
    assignment = np.empty(inst.n, dtype=np.int64)
    for k, (s, e) in enumerate(table.segments()):
        assignment[order[s:e]] = perm[k]
    return assignment


# ----------------------------------------------------------------------------------------------------------------
# Lower bound (Sec. 8.1.3)
# ----------------------------------------------------------------------------------------------------------------


def lower_bound(sizes: Any, types: Any, alpha: Any, n_machines: int, *, cost: Any = None) -> float:
    """Sec. 8.1.3: BestOrS on one type with ``alpha_min = min alpha``: ``LB = alpha_min * C*(n, m)``.

    Valid because every task costs at least ``alpha_min`` times its machine's load. For a convex increasing ``f``,
    Jensen's inequality gives ``sum_i f(c_i) >= n f(alpha_min C*(n, m) / n)``, which is returned instead.
    """
    inst = _validate(sizes, types, alpha, n_machines, cost)
    if inst.n == 0:
        return 0.0
    order = _global_order(inst)
    table = bestors_table(inst.sizes[order], max(1, min(inst.m, inst.n)))
    lin = float(inst.alpha.min()) * float(table.costs[-1, -1])
    if inst.cost is None:
        return lin
    return float(inst.n * np.asarray(inst.cost(np.array([lin / inst.n])))[0])
