"""Colocation with side effects (paper 001: Pascual & Rzadca, *Colocating tasks in data centers using a side-effects
performance model*).

Model (Sec. 2)
--------------
``n`` tasks with sizes ``p_i >= 0`` and types ``t_i in {0..T-1}`` go onto ``m`` identical machines. The interference
matrix ``alpha[t, u] >= 0`` is the impact of a unit of load of type ``t`` on a task of type ``u`` (row = influencer,
column = victim; not symmetric). A task's cost is eq. (1)::

    c_i = sum_{j on i's machine (i included)} p_j * alpha[t_j, t_i]

and the objective is ``C(P) = sum_i c_i``. Per machine ``k`` with per-type loads ``L[k, t]`` and counts ``N[k, t]``
this is ``sum_k L[k] @ alpha @ N[k]``. With a convex cost (Sec. 7) a task costs ``f(c_i)`` for an increasing convex
``f``; for one type with ``alpha = 1`` this is the paper's ``f(L_M)``.

Algorithms (``method=`` of :func:`partition` / :func:`solve`)
------------------------------------------------------------
``"bestors"``            Sec. 5 / 6.4: the single-type DP of eqs. (5)-(6) on all tasks (types ignored); exact for
                         one type, ``alpha_max/alpha_min``-approximate in general (Prop. 6.4), ``Delta``-approximate
                         for convex costs (Prop. 7.3). Two exact DP engines: ``"quadratic"`` (eq. (5) as written,
                         O(n^2 m)) and ``"dc"`` (default): the segment cost ``w(j, x) = (x - j)(S_x - S_j)`` satisfies
                         the quadrangle inequality (``w(a,d) + w(b,c) - w(a,c) - w(b,d) = |A| W_C + |C| W_A >= 0``),
                         so optimal split points are monotone and divide-and-conquer gives O(m n log n).
``"independent"``        Sec. 6: ``alpha`` diagonal; BestOrS separately for every type (exact).
``"equivalent"``         Sec. 6: all ``alpha`` equal; BestOrS once (exact).
``"large-influences"``   Sec. 6: types never share machines; enumerate the ``C(m-1, T-1)`` configurations
                         (machines per type) over per-type BestOrS tables (exact when the condition holds).
``"dynsize"``            Sec. 6.1, eqs. (7)-(8): DP over per-(type, size) counts; exact, also for convex costs.
``"approx"``             Sec. 6.2, ApproxScheme(eps): round sizes up to powers of ``1 + eps``, run DynSize;
                         ``(1 + eps)``-approximate for linear costs (Prop. 6.2).
``"cutjuxtapose"``       Sec. 6.3: all OrS partitions (cuts per type x juxtapositions); exact for linear costs
                         (Prop. 6.3) when it finishes within ``budget`` evaluations, best-so-far otherwise. For two
                         types the juxtaposition can be a min-cost bipartite matching (``juxtapose="matching"``).
``"bestors+hill"``, ``"one+hill"``, ``"dedic+hill"``
                         Sec. 8.1.1: best-improvement hill climbing over the four OrS-preserving moves, started from
                         BestOrS, from all tasks on one machine, or from type ``t`` on machine ``t mod m``.

:func:`lower_bound` is Sec. 8.1.3. Convex costs: Lemma 4.1 (OrS dominance) is proved for linear costs only and fails
for convex ones (sizes 5, 4, 3, 2 on two machines with ``f(x) = x^2``: the optimum {5, 2}, {4, 3} is not OrS), so
CutJuxtapose and HILL are heuristics there; DynSize stays exact.

Kubernetes hard limits (not in the paper)
-----------------------------------------
The HILL methods accept ``capacity=`` (allocatable capacity per machine, in the units of ``demands=``, which defaults
to ``sizes``) and ``max_tasks=`` (max pods per node), each a scalar or a per-machine array. See :func:`solve` for what
they do to the guarantees.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

__all__ = [
    "METHODS",
    "ColocationResult",
    "GavelInterference",
    "InfeasibleError",
    "OrSTable",
    "PowerCost",
    "bestors_table",
    "cost_function",
    "gavel_alpha",
    "large_influence_condition",
    "lower_bound",
    "machine_costs",
    "machine_loads",
    "partition",
    "solve",
    "total_cost",
]

CostFn = Callable[[np.ndarray], np.ndarray]

METHODS: tuple[str, ...] = (
    "bestors",
    "bestors+hill",
    "one+hill",
    "dedic+hill",
    "cutjuxtapose",
    "dynsize",
    "approx",
    "independent",
    "equivalent",
    "large-influences",
)
_HILL_METHODS = ("bestors+hill", "one+hill", "dedic+hill")
_DEFAULT_BUDGET = 10**6
_MAX_DYNSIZE_STATES = 2_000_000


class InfeasibleError(ValueError):
    """No partition respecting the hard limits (capacity, max tasks per machine) was found."""


# ----------------------------------------------------------------------------------------------------------------
# Cost functions
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PowerCost:
    """The convex cost ``f(x) = x ** exponent`` (``exponent >= 1``); ``f(0) = 0`` and ``f(1) = 1`` as Sec. 7.2 asks."""

    exponent: float

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.power(np.maximum(x, 0.0), self.exponent)

    @property
    def name(self) -> str:
        return "quadratic" if self.exponent == 2 else f"power:{self.exponent:g}"


def cost_function(name: str | None) -> PowerCost | None:
    """Turn a ``ColocationProfile`` cost name into the ``cost=`` argument of :func:`partition`.

    ``"linear"`` (or ``None``/``""``) -> ``None`` (eq. 1); ``"quadratic"`` -> ``x**2``; ``"power:k"`` -> ``x**k`` for
    ``k >= 1`` (``"power:1"`` is linear and returns ``None``). Anything else raises ``ValueError``.
    """
    if name is None:
        return None
    key = name.strip().lower()
    if key in ("", "linear"):
        return None
    if key == "quadratic":
        return PowerCost(2.0)
    if key.startswith("power:"):
        try:
            k = float(key.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"cost name {name!r}: exponent after 'power:' must be a number") from None
        if not math.isfinite(k) or k < 1:
            raise ValueError(f"cost name {name!r}: exponent must be finite and >= 1 (convex), got {k}")
        return None if k == 1 else PowerCost(k)
    raise ValueError(f"unknown cost name {name!r}: expected 'linear', 'quadratic' or 'power:k'")


# ----------------------------------------------------------------------------------------------------------------
# Input validation and cost evaluation
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Instance:
    sizes: np.ndarray  # (n,) float64
    types: np.ndarray  # (n,) int64
    alpha: np.ndarray  # (T, T) float64
    m: int
    cost: CostFn | None

    @property
    def n(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def T(self) -> int:
        return int(self.alpha.shape[0])


def _check_cost(cost: Any, hi: float) -> CostFn | None:
    if cost is None:
        return None
    if isinstance(cost, str):
        return cost_function(cost)
    if not callable(cost):
        raise ValueError("cost must be None (linear), a cost name or an increasing convex callable")
    xs = np.linspace(0.0, max(hi, 1.0), 33)
    ys = np.asarray(cost(xs), dtype=np.float64)
    if ys.shape != xs.shape or not np.all(np.isfinite(ys)):
        raise ValueError("cost must map a float array to a finite float array of the same shape")
    tol = 1e-9 * max(1.0, float(np.max(np.abs(ys))))
    if np.any(np.diff(ys) < -tol):
        raise ValueError("cost must be non-decreasing (Sec. 7)")
    if np.any(np.diff(ys, 2) < -tol):
        raise ValueError("cost must be convex (Sec. 7)")
    checked: CostFn = cost
    return checked


def _validate(
    sizes: Any,
    types: Any,
    alpha: Any,
    n_machines: Any,
    cost: Any = None,
    type_names: Sequence[str] | None = None,
) -> _Instance:
    a = np.asarray(alpha, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] == 0:
        raise ValueError(f"alpha must be a non-empty T x T matrix, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        bad = np.argwhere(~np.isfinite(a))[0]
        raise ValueError(f"alpha[{bad[0]}, {bad[1]}] is not finite")
    if np.any(a < 0):
        bad = np.argwhere(a < 0)[0]
        raise ValueError(f"alpha[{bad[0]}, {bad[1]}] = {a[bad[0], bad[1]]} is negative")
    T = a.shape[0]
    p = np.asarray(sizes, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError(f"sizes must be one-dimensional, got shape {p.shape}")
    if not np.all(np.isfinite(p)):
        raise ValueError(f"sizes[{int(np.flatnonzero(~np.isfinite(p))[0])}] is not finite")
    if np.any(p < 0):
        i = int(np.flatnonzero(p < 0)[0])
        raise ValueError(f"sizes[{i}] = {p[i]} is negative")
    raw = list(types) if not isinstance(types, np.ndarray) else types
    if type_names is not None:
        names = list(type_names)
        if len(names) != T:
            raise ValueError(f"type_names has {len(names)} names but alpha is {T} x {T}")
        lookup = {nm: k for k, nm in enumerate(names)}
        t_list = []
        for i, v in enumerate(raw):
            if isinstance(v, str):
                if v not in lookup:
                    raise ValueError(f"types[{i}] = {v!r} is not one of type_names")
                t_list.append(lookup[v])
            else:
                t_list.append(v)
        raw = t_list
    t = np.asarray(raw)
    if t.ndim != 1 or t.shape[0] != p.shape[0]:
        raise ValueError(f"types must have one entry per task ({p.shape[0]}), got shape {t.shape}")
    if t.size and not np.issubdtype(t.dtype, np.integer):
        if t.dtype.kind == "f" and np.all(np.isfinite(t)) and np.all(t == np.round(t)):
            t = t.astype(np.int64)
        else:
            raise ValueError("types must be integers in [0, T) (or names listed in type_names)")
    t = t.astype(np.int64)
    if t.size and (t.min() < 0 or t.max() >= T):
        i = int(np.flatnonzero((t < 0) | (t >= T))[0])
        raise ValueError(f"types[{i}] = {t[i]} is an unknown type (alpha has {T} types)")
    if isinstance(n_machines, bool) or not isinstance(n_machines, (int, np.integer)) or int(n_machines) < 1:
        raise ValueError(f"n_machines must be a positive integer, got {n_machines!r}")
    hi = float(p.sum() * (a.max() if a.size else 1.0))
    return _Instance(p, t, a, int(n_machines), _check_cost(cost, hi))


def machine_loads(
    sizes: np.ndarray, types: np.ndarray, assignment: np.ndarray, n_types: int, n_machines: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-machine, per-type loads ``L[k, t]`` (sum of sizes) and counts ``N[k, t]`` of a partition."""
    flat = np.asarray(assignment, dtype=np.int64) * n_types + np.asarray(types, dtype=np.int64)
    L = np.bincount(flat, weights=sizes, minlength=n_machines * n_types).reshape(n_machines, n_types)
    N = np.bincount(flat, minlength=n_machines * n_types).reshape(n_machines, n_types).astype(np.float64)
    return L, N


def machine_costs(L: np.ndarray, N: np.ndarray, alpha: np.ndarray, cost: CostFn | None = None) -> np.ndarray:
    """Cost of every machine, vectorised over leading axes: ``L`` and ``N`` have shape ``(..., T)``.

    Linear (eq. 1): ``L @ alpha @ N``; convex (Sec. 7): ``sum_u N[u] f((L @ alpha)[u])``.
    """
    E = L @ alpha
    if cost is None:
        return np.asarray(np.sum(E * N, axis=-1))
    return np.asarray(np.sum(N * np.asarray(cost(E)), axis=-1))


def total_cost(
    sizes: Any,
    types: Any,
    alpha: Any,
    assignment: Any,
    *,
    cost: Any = None,
    n_machines: int | None = None,
    type_names: Sequence[str] | None = None,
) -> float:
    """Total cost ``C(P) = sum_i c_i`` (eq. 1; ``sum_i f(c_i)`` with a convex ``cost``) of any partition.

    ``assignment[i]`` is task i's machine index; ``n_machines`` defaults to ``max(assignment) + 1``.
    """
    a = np.asarray(assignment)
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise ValueError("assignment must be a one-dimensional integer array")
    if a.size and a.min() < 0:
        raise ValueError(f"assignment[{int(np.argmin(a))}] is negative")
    m = int(n_machines) if n_machines is not None else int(a.max()) + 1 if a.size else 1
    inst = _validate(sizes, types, alpha, m, cost, type_names)
    if a.shape[0] != inst.n:
        raise ValueError(f"assignment has {a.shape[0]} entries for {inst.n} tasks")
    if a.size and a.max() >= m:
        raise ValueError(f"assignment[{int(np.argmax(a))}] = {int(a.max())} >= n_machines = {m}")
    L, N = machine_loads(inst.sizes, inst.types, a, inst.T, m)
    return float(machine_costs(L, N, inst.alpha, inst.cost).sum())


def _cost(inst: _Instance, assignment: np.ndarray) -> float:
    L, N = machine_loads(inst.sizes, inst.types, assignment, inst.T, inst.m)
    return float(machine_costs(L, N, inst.alpha, inst.cost).sum())


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
    :mod:`allocator._colocation_kernel`). Both are exact and return the same costs.

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
        from ._colocation_kernel import bestors_dc

        if not limited:
            dprefix, mt, cp, big = prefix, np.zeros(m), np.zeros(m), 0.0
        costs, choice = bestors_dc(prefix, dprefix, mt, cp, float(big), limited, m)
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


# ----------------------------------------------------------------------------------------------------------------
# HILL (Sec. 8.1.1) with optional hard limits
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Limits:
    capacity: np.ndarray  # (m,), inf where unlimited
    max_tasks: np.ndarray  # (m,), inf where unlimited
    demands: np.ndarray  # (n,)

    def check_obvious(self, n: int) -> None:
        total_pods = float(self.max_tasks.sum())
        if total_pods < n:
            raise InfeasibleError(f"infeasible: {n} tasks but the machines accept at most {total_pods:g} (max_tasks)")
        need, have = float(self.demands.sum()), float(self.capacity.sum())
        if need > have * (1 + 1e-12):
            raise InfeasibleError(f"infeasible: total demand {need:g} exceeds total capacity {have:g}")
        if n and float(self.demands.max()) > float(self.capacity.max()) * (1 + 1e-12):
            i = int(np.argmax(self.demands))
            raise InfeasibleError(
                f"infeasible: task {i} demands {self.demands[i]:g}, more than the largest machine capacity "
                f"{float(self.capacity.max()):g}"
            )


def _per_machine(value: Any, m: int, name: str, integer: bool) -> np.ndarray:
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 0:
        arr = np.full(m, float(arr))
    if arr.shape != (m,):
        raise ValueError(f"{name} must be a scalar or have one entry per machine ({m}), got shape {arr.shape}")
    bad = np.flatnonzero(~(arr >= 0) | np.isnan(arr))
    if bad.size:
        raise ValueError(f"{name}[{int(bad[0])}] = {arr[bad[0]]} must be >= 0")
    if integer and np.any(np.isfinite(arr) & (arr != np.floor(arr))):
        raise ValueError(f"{name} must hold integers")
    return arr


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


# ----------------------------------------------------------------------------------------------------------------
# Public entry points
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ColocationResult:
    """What :func:`solve` returns.

    ``assignment[i]``: machine of task i. ``cost``: its total cost. ``evaluations``: cost evaluations used
    (HILL: candidate moves evaluated; CutJuxtapose: partitions, ``m^2`` per matching; DynSize: DP transitions).
    ``complete``: an exact method finished within its budget (its ``cost`` is then optimal); False for heuristics
    and interrupted runs. ``moves``: HILL moves taken.
    """

    assignment: np.ndarray
    cost: float
    method: str
    evaluations: int
    complete: bool
    moves: int = 0


def solve(
    sizes: Any,
    types: Any,
    alpha: Any,
    n_machines: int,
    *,
    method: str = "bestors+hill",
    cost: Any = None,
    budget: int | None = None,
    eps: float = 0.1,
    juxtapose: str = "auto",
    capacity: Any = None,
    max_tasks: Any = None,
    demands: Any = None,
    type_names: Sequence[str] | None = None,
    dp: str = "dc",
) -> ColocationResult:
    """Partition tasks onto ``n_machines`` machines with ``method`` (see :data:`METHODS` and the module docstring).

    ``budget`` caps cost evaluations (default ``10**6``, Sec. 8.1.1) for HILL and CutJuxtapose; DynSize and
    ApproxScheme raise ``ValueError`` when they would exceed it. ``eps`` is ApproxScheme's epsilon; ``juxtapose``
    chooses CutJuxtapose's juxtaposition (``"matching"``: Hungarian via ``scipy.optimize.linear_sum_assignment``,
    two types, linear cost; ``"enumerate"``: all placements; ``"auto"``: matching for two types when ``m >= 5``).
    ``dp`` picks the BestOrS engine (``"dc"`` or ``"quadratic"``).

    Hard limits (HILL methods only): ``capacity`` (allocatable capacity per machine, in the units of ``demands``, which
    default to ``sizes``) and ``max_tasks`` (max tasks / pods per machine); scalars or one value per machine.
    BestOrS+HILL then starts from the BestOrS DP with the limits as a large penalty per layer (machines taken in order
    of decreasing capacity) and never takes a move that breaks a limit; if the start violates a limit it is repaired
    with the same moves first. Obviously infeasible instances (too many tasks, too much demand, a task larger than
    every machine) and instances where no feasible partition is found raise :class:`InfeasibleError` (a
    ``ValueError``). Effect on the guarantees: with limits the OrS dominance (Lemma 4.1) no longer holds (its exchanges
    can overload a machine), the single-type problem is no longer polynomial (``max_tasks = 3`` with capacities
    encodes 3-PARTITION), so Prop. 5.1 exactness and the ``alpha_max/alpha_min`` bound of Prop. 6.4 are lost: the
    result is a feasible local optimum of the four moves, with no approximation guarantee, and failing to find a
    feasible partition does not prove that none exists.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    inst = _validate(sizes, types, alpha, n_machines, cost, type_names)
    if budget is None:
        budget = _DEFAULT_BUDGET
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 1:
        raise ValueError(f"budget must be a positive integer, got {budget!r}")
    budget = int(budget)
    limited = capacity is not None or max_tasks is not None
    if demands is not None and not limited:
        raise ValueError("demands only matter with capacity= or max_tasks=")
    if limited and method not in _HILL_METHODS:
        raise ValueError(f"hard limits (capacity, max_tasks) are supported by {_HILL_METHODS}, not {method!r}")
    if method in ("independent", "equivalent", "large-influences", "approx") and inst.cost is not None:
        raise ValueError(f"method {method!r} is defined for the linear cost only (Sec. 6)")
    evaluations, complete, moves = 0, False, 0
    if method == "bestors":
        a = _bestors(inst, dp)
        one_type = np.unique(inst.types).size <= 1 or bool(np.all(inst.alpha == inst.alpha.flat[0]))
        complete = inst.cost is None and one_type
    elif method in _HILL_METHODS:
        limits = None
        if limited:
            dem = inst.sizes if demands is None else np.asarray(demands, dtype=np.float64)
            if dem.shape != inst.sizes.shape:
                raise ValueError(f"demands must have one entry per task ({inst.n}), got shape {dem.shape}")
            if np.any(~np.isfinite(dem) | (dem < 0)):
                raise ValueError(f"demands[{int(np.flatnonzero(~(dem >= 0))[0])}] must be finite and >= 0")
            limits = _Limits(
                capacity=np.inf * np.ones(inst.m)
                if capacity is None
                else _per_machine(capacity, inst.m, "capacity", False),
                max_tasks=np.inf * np.ones(inst.m)
                if max_tasks is None
                else _per_machine(max_tasks, inst.m, "max_tasks", True),
                demands=dem,
            )
            limits.check_obvious(inst.n)
        if method == "bestors+hill":
            start = _bestors(inst, dp) if limits is None else _bestors_limited(inst, limits)
        elif method == "one+hill":
            start = np.zeros(inst.n, dtype=np.int64)
        else:
            start = inst.types % inst.m
        a, evaluations, moves = _hill(inst, start, budget, limits)
    elif method == "cutjuxtapose":
        a, evaluations, complete = _cutjuxtapose(inst, budget, juxtapose)
        complete = complete and inst.cost is None
    elif method == "dynsize":
        a, evaluations = _dynsize(inst, inst.sizes, budget)
        complete = True
    elif method == "approx":
        if not (eps > 0 and math.isfinite(eps)):
            raise ValueError(f"eps must be positive, got {eps}")
        a, evaluations = _dynsize(inst, _round_sizes(inst.sizes, eps), budget)
    elif method == "independent":
        a, complete = _independent(inst), True
    elif method == "equivalent":
        a, complete = _equivalent(inst), True
    else:
        a, complete = _large_influences(inst), True
    return ColocationResult(a, _cost(inst, a), method, int(evaluations), bool(complete), moves)


def partition(
    sizes: Any,
    types: Any,
    alpha: Any,
    n_machines: int,
    *,
    method: str = "bestors+hill",
    cost: Any = None,
    budget: int | None = None,
    **options: Any,
) -> np.ndarray:
    """Machine index of every task (shape ``(n,)``, values in ``[0, n_machines)``) minimising the total cost.

    ``cost=None`` is the linear cost of eq. (1); otherwise an increasing convex callable (or a cost name, see
    :func:`cost_function`). Keyword options are those of :func:`solve`: ``capacity=``, ``max_tasks=``, ``demands=``
    (Kubernetes hard limits), ``eps=``, ``juxtapose=``, ``type_names=``, ``dp=``.
    """
    allowed = {"capacity", "max_tasks", "demands", "eps", "juxtapose", "type_names", "dp"}
    unknown = set(options) - allowed
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    return solve(sizes, types, alpha, n_machines, method=method, cost=cost, budget=budget, **options).assignment


# ----------------------------------------------------------------------------------------------------------------
# Measured interference (Gavel)
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GavelInterference:
    """An interference matrix derived from Gavel's space-sharing measurements.

    ``alpha[u, t]`` (paper orientation: influencer ``u``, victim ``t``) is the measured slowdown of class ``t`` while
    it shares a GPU with class ``u``: ``1 - paired[t, u] / isolated[t]``, clipped to ``[0, 1]``, averaged over the
    job types of each class. ``missing`` counts the (type, type) pairs that had no measurement.
    """

    names: list[str]
    alpha: np.ndarray
    members: list[list[str]]
    missing: int


def _model_family(job_type: str) -> str:
    return job_type.split(" (batch size", 1)[0].strip()


def gavel_alpha(data: Any = None, *, gpu: str = "v100", classes: str = "model", nan: str = "max") -> GavelInterference:
    """Asymmetric interference matrix from Gavel's measured pairwise throughputs (``allocator.datasets``).

    Mapping: with one unit-size task per job, eq. (1) gives a job of class ``t`` the cost
    ``alpha[t, t] + sum_{u != me on its GPU} alpha[u, t]``, so ``alpha[u, t]`` must be the slowdown that a ``u``
    inflicts on a ``t``: ``alpha = slowdown.T`` with ``slowdown[t, u] = 1 - paired[t, u] / isolated[t]``. The
    self-term ``alpha[t, t] p_t`` is the same for every partition, so minimising eq. (1) minimises the total modelled
    slowdown. Slowdowns are clipped to ``[0, 1]`` (a pair running faster than alone is noise). ``classes="model"``
    averages over the batch sizes of each model family (ResNet-18, LM, ...); ``"job"`` keeps the 26 job types.
    Unmeasured pairs (NaN): ``nan="max"`` assumes the worst measured slowdown (conservative: unknown pairs are
    avoided), ``"mean"`` the mean measured slowdown.
    """
    if data is None:
        from allocator.datasets import gavel_colocation

        data = gavel_colocation(gpu)
    iso = np.asarray(data.isolated, dtype=np.float64)
    paired = np.asarray(data.paired, dtype=np.float64)
    if nan not in ("max", "mean"):
        raise ValueError(f"nan must be 'max' or 'mean', got {nan!r}")
    with np.errstate(divide="ignore", invalid="ignore"):
        slow = 1.0 - paired / iso[:, None]
    slow[~np.isfinite(iso) | (iso <= 0), :] = np.nan
    missing = int(np.isnan(slow).sum())
    measured = slow[~np.isnan(slow)]
    fill = (
        (float(np.clip(measured, 0, 1).max()) if nan == "max" else float(np.clip(measured, 0, 1).mean()))
        if (measured.size)
        else 1.0
    )
    slow = np.clip(np.where(np.isnan(slow), fill, slow), 0.0, 1.0)
    jobs = list(data.job_types)
    if classes == "job":
        names, members = jobs, [[j] for j in jobs]
        cls_slow = slow
    elif classes == "model":
        names = []
        for j in jobs:
            fam = _model_family(j)
            if fam not in names:
                names.append(fam)
        idx = np.array([names.index(_model_family(j)) for j in jobs])
        members = [[j for j, c in zip(jobs, idx) if c == k] for k in range(len(names))]
        K = len(names)
        onehot = np.zeros((len(jobs), K))
        onehot[np.arange(len(jobs)), idx] = 1.0
        sizes = onehot.sum(axis=0)
        cls_slow = (onehot.T @ slow @ onehot) / np.outer(sizes, sizes)
    else:
        raise ValueError(f"classes must be 'model' or 'job', got {classes!r}")
    return GavelInterference(names=names, alpha=np.ascontiguousarray(cls_slow.T), members=members, missing=missing)
