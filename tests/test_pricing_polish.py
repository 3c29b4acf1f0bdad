"""allocator.pricing.primal.polish: the SLSQP polish of small markets' allocations (problem (4) of 004 with the
demands of Sec. 7.1) and the projection onto its constraints."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linprog

from allocator import pricing
from allocator import utilities as U
from allocator.pricing.primal.polish import feasible, polish_allocation


def _instance(seed: int, n: int = 6, m: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.5, 4.0, (n, m))
    d = np.repeat(rng.integers(1, 3, n)[:, None].astype(float), m, axis=1)
    r = rng.uniform(1.5, 4.0, m)
    return a, d, r


def _lp_optimum(a: np.ndarray, d: np.ndarray, r: np.ndarray, w: np.ndarray) -> float:
    """``max sum_i w_i a_i^T x_i`` over the polytope of (4): the optimum of a linear utility, by HiGHS."""
    n, m = a.shape
    rows = np.kron(np.eye(n), np.ones((1, m)))
    cols = np.hstack([np.diag(d[i]) for i in range(n)])
    res = linprog(-(w[:, None] * a).ravel(), A_ub=np.vstack([rows, cols]), b_ub=np.concatenate([np.ones(n), r]),
                  bounds=(0, 1), method="highs")
    assert res.status == 0
    return float(-res.fun)


def _check_feasible(x: np.ndarray, d: np.ndarray, r: np.ndarray) -> None:
    assert np.all(x >= 0)
    assert np.all(x.sum(axis=1) <= 1 + 1e-9)
    assert np.all((d * x).sum(axis=0) <= r * (1 + 1e-6) + 1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_polish_reaches_the_optimum_of_a_linear_market(seed: int) -> None:
    a, d, r = _instance(seed)
    w = np.random.default_rng(seed + 10).uniform(0.5, 2.0, a.shape[0])
    utility = U.Linear(w)
    start = feasible(np.full(a.shape, 1 / a.shape[1]), d, r)[0]
    out = polish_allocation(a, r, utility, d, start)
    assert out is not None
    _check_feasible(out, d, r)
    value = float((w * np.einsum("ij,ij->i", a, out)).sum())
    assert value >= float((w * np.einsum("ij,ij->i", a, start)).sum())
    assert value == pytest.approx(_lp_optimum(a, d, r, w), abs=1e-4)


def test_polish_of_a_log_market_stays_below_the_dual_bound_and_above_its_start() -> None:
    a, d, r = _instance(4)
    utility = U.Log()
    start = feasible(np.full(a.shape, 1 / a.shape[1]), d, r)[0]
    out = polish_allocation(a, r, utility, d, start)
    assert out is not None
    _check_feasible(out, d, r)
    value = float(np.log(np.einsum("ij,ij->i", a, out)).sum())
    before = float(np.log(np.einsum("ij,ij->i", a, start)).sum())
    bound = pricing.solve(a, r, utility, demand=d, device="cpu", dtype="float64").dual_value
    assert before < value <= bound + 1e-9 * abs(bound)
    assert value == pytest.approx(bound, abs=1e-3)


def test_polish_refuses_a_start_of_minus_infinite_utility_and_a_market_without_usable_cells() -> None:
    a, d, r = _instance(5)
    assert polish_allocation(a, r, U.Log(), d, np.zeros(a.shape)) is None  # log(0) = -inf
    assert polish_allocation(np.zeros(a.shape), r, U.Linear(), d, np.zeros(a.shape)) is None


def test_feasible_scales_rows_then_over_used_pools_and_reports_the_violation() -> None:
    d = np.ones((2, 2))
    r = np.array([1.0, 4.0])
    x, violation = feasible(np.array([[2.0, 0.0], [0.5, -1.0]]), d, r)
    np.testing.assert_allclose(x, [[2 / 3, 0.0], [1 / 3, 0.0]])  # row 0 scaled to 1, then pool 0 (1.5 used) to 1
    assert violation == pytest.approx(1.0)  # row 0 summed to 2
    same, none = feasible(np.array([[0.5, 0.5], [0.25, 0.0]]), d, r)
    np.testing.assert_array_equal(same, [[0.5, 0.5], [0.25, 0.0]])
    assert none == 0.0
