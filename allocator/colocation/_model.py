"""Instance, validation and cost evaluation of the colocation model (paper 001, Sec. 2 eq. (1), Sec. 7 convex costs)
and the Kubernetes hard limits (capacity, max tasks per machine; not in the paper)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

CostFn = Callable[[np.ndarray], np.ndarray]


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
