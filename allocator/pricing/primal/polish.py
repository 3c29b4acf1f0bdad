"""The primal polish of small markets: the allocation problem (4) of 004 (with the demands of its Sec. 7.1) solved
from a feasible start by SLSQP, where price discovery's allocation leaves the duality gap open (kinks of ``g``: jobs
indifferent between pools at the optimal prices, which linear and target-priority utilities make common), and the
projection :func:`feasible` of an allocation onto the constraints of (4).

Imports scipy when the polish runs (not on import)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from allocator.utilities import Utility

__all__ = ["feasible", "polish_allocation"]


def polish_allocation(
    throughput: np.ndarray,
    capacity: np.ndarray,
    utility: Utility,
    demand: np.ndarray,
    start: np.ndarray,
    *,
    target: float = math.inf,
) -> np.ndarray | None:
    """Maximise ``sum_i u_i(a_i^T x_i)`` over the polytope of (4) (``x >= 0``, ``1^T x_i <= 1``,
    ``sum_i d_ij x_ij <= R_j``; 004 Sec. 2, with the demands of Sec. 7.1) by SLSQP from the feasible ``start``.

    Only the usable cells (``a_ij > 0``) are variables. Returns a feasible allocation (re-projected by
    :func:`feasible`), or ``None`` when the start has ``U = -inf`` or the optimiser fails; the caller keeps the
    better of the start and the result, so the polish can only raise ``U``. The optimiser stops as soon as ``U``
    reaches ``target`` (the caller passes the dual bound minus part of its tolerance).
    """
    from scipy.optimize import LinearConstraint, minimize

    n, m = throughput.shape
    cells = np.flatnonzero(throughput.ravel() > 0)
    if cells.size == 0:
        return None
    u64 = utility.to("cpu", np.float64)
    rows, cols = np.divmod(cells, m)
    a = throughput.ravel()[cells]

    def objective(z: np.ndarray) -> tuple[float, np.ndarray]:
        t = np.bincount(rows, weights=a * z, minlength=n)
        with np.errstate(divide="ignore", invalid="ignore"):
            value = float(u64.value(t).sum())
            grad = np.asarray(u64.derivative(t))[rows] * a
        return -value, -np.nan_to_num(grad, nan=0.0, posinf=1e12, neginf=-1e12)

    z0 = np.clip(start.ravel()[cells], 0.0, 1.0)
    if not math.isfinite(objective(z0)[0]):
        return None
    k = np.arange(cells.size)
    matrix = np.zeros((n + m, cells.size))
    matrix[rows, k] = 1.0
    matrix[n + cols, k] = demand.ravel()[cells]
    upper = np.concatenate([np.ones(n), capacity])
    best = [z0]

    def reached(intermediate_result: Any) -> None:
        best[0] = intermediate_result.x
        if -intermediate_result.fun >= target:
            raise StopIteration

    try:
        res = minimize(
            objective,
            z0,
            jac=True,
            method="SLSQP",
            bounds=[(0.0, 1.0)] * cells.size,
            constraints=[LinearConstraint(matrix, -np.inf, upper)],
            callback=reached,
            options={"maxiter": 300, "ftol": 1e-12},
        )
        z = res.x
    except (ValueError, ArithmeticError):
        z = best[0]
    if not np.all(np.isfinite(z)):
        return None
    out = np.zeros(n * m)
    out[cells] = np.clip(z, 0.0, 1.0)
    return feasible(out.reshape(n, m), demand, capacity)[0]


def feasible(
    allocation: np.ndarray, demand: np.ndarray, capacity: np.ndarray, tol: float = 1e-6
) -> tuple[np.ndarray, float]:
    """Project an allocation onto the constraints of (4): ``x >= 0``, rows ``1^T x_i <= 1`` (scaled down), then pool
    usage ``sum_i d_ij x_ij <= R_j`` (columns scaled down, as Alg. 2's feasible point in 004 Sec. 5).

    Returns the feasible allocation and the largest violation found (0 when the input was already feasible); the
    planner never hands an over-committed allocation to placement, whatever the solver returned.
    """
    x = np.clip(np.nan_to_num(allocation, nan=0.0), 0.0, None)
    rows = x.sum(axis=1)
    violation = float(max(rows.max(initial=0.0) - 1.0, 0.0))
    x = x / np.maximum(rows, 1.0)[:, None]
    usage = (demand * x).sum(axis=0)
    over = usage > capacity * (1 + tol) + tol
    if over.any():
        violation = max(violation, float(((usage - capacity) / np.maximum(capacity, 1e-12))[over].max()))
        scale = np.where(over, capacity / np.maximum(usage, 1e-300), 1.0)
        x = x * scale[None, :]
    return x, violation
