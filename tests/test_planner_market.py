"""The market step of the planner: mixed utility families and prices checked against CVXPY + Clarabel."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
import torch
from walras.planner.market import MarketSettings, build_utility, feasible, solve_market
from walras.planner.spec import UtilitySpec

from allocator import utilities

SPECS = [
    UtilitySpec("linear", weight=2.0),
    UtilitySpec("log"),
    UtilitySpec("power", exponent=0.5),
    UtilitySpec("alpha-fair", alpha=2.0),
    UtilitySpec("target-priority", target=3.0, weight=1.5),
    UtilitySpec("log", weight=3.0),
    UtilitySpec("power", exponent=-1.0),
]


def test_mixed_utility_matches_each_family() -> None:
    mixed = build_utility(SPECS, [1.0] * len(SPECS)).to("cpu", torch.float64)
    singles = [
        utilities.Linear(2.0),
        utilities.Log(),
        utilities.Power(0.5),
        utilities.AlphaFair(2.0),
        utilities.TargetPriority(3.0, weight=1.5),
        utilities.Log(weight=3.0),
        utilities.Power(-1.0),
    ]
    rng = np.random.default_rng(0)
    t = torch.tensor(rng.uniform(0.1, 5, len(SPECS)), dtype=torch.float64)
    alpha = torch.tensor(rng.uniform(0.1, 2, len(SPECS)), dtype=torch.float64)
    lo = torch.zeros(len(SPECS), dtype=torch.float64)
    hi = torch.full((len(SPECS),), 6.0, dtype=torch.float64)
    for i, single in enumerate(singles):
        one = single.to("cpu", torch.float64)
        assert mixed.value(t)[i].item() == pytest.approx(one.value(t[i : i + 1]).item())
        assert mixed.derivative(t)[i].item() == pytest.approx(one.derivative(t[i : i + 1]).item())
        assert mixed.argmax(alpha, lo, hi)[i].item() == pytest.approx(
            one.argmax(alpha[i : i + 1], lo[i : i + 1], hi[i : i + 1]).item()
        )
    sub = mixed.take(torch.tensor([4, 1]))
    assert sub.n_jobs == 2
    assert sub.value(t[[4, 1]]).tolist() == pytest.approx(mixed.value(t)[[4, 1]].tolist())


def test_feasible_repairs_rows_and_columns() -> None:
    x = np.array([[0.8, 0.6], [0.5, 0.5]])
    d = np.array([[2.0, 2.0], [1.0, 1.0]])
    out, violation = feasible(x, d, np.array([1.0, 10.0]))
    assert violation > 0
    assert np.all(out.sum(axis=1) <= 1 + 1e-12)
    assert np.all((d * out).sum(axis=0) <= np.array([1.0, 10.0]) + 1e-9)
    same, none = feasible(np.array([[0.2, 0.3]]), np.ones((1, 2)), np.ones(2))
    assert none == 0 and same.tolist() == [[0.2, 0.3]]


def cvxpy_reference(a: np.ndarray, d: np.ndarray, r: np.ndarray) -> tuple[float, np.ndarray]:
    """Problem (4) of 004 with demands and log utilities, solved by Clarabel: (optimal value, prices)."""
    x = cp.Variable(a.shape, nonneg=True)
    t = cp.sum(cp.multiply(a, x), axis=1)
    usage = cp.sum(cp.multiply(d, x), axis=0) <= r
    problem = cp.Problem(cp.Maximize(cp.sum(cp.log(t))), [cp.sum(x, axis=1) <= 1, usage])
    problem.solve(solver=cp.CLARABEL)
    return float(problem.value), np.asarray(usage.dual_value)


def test_market_matches_cvxpy_on_a_small_log_instance() -> None:
    rng = np.random.default_rng(7)
    n, m = 12, 3
    a = rng.uniform(0.5, 5.0, (n, m))
    d = np.repeat(rng.integers(1, 4, n)[:, None].astype(float), m, axis=1)
    r = np.array([6.0, 8.0, 5.0])
    optimum, prices = cvxpy_reference(a, d, r)
    market = solve_market(a, r, [UtilitySpec("log")] * n, [1.0] * n, d, None,
                          MarketSettings(max_iter=500, eps=1e-6 * n))
    x = market.allocation
    assert np.all(x.sum(axis=1) <= 1 + 1e-6)
    assert np.all((d * x).sum(axis=0) <= r + 1e-6)
    achieved = float(np.log(np.einsum("ij,ij->i", a, x)).sum())
    # Prices are the dual optimum (004 Sec. 3); the reported bounds bracket the exact optimum and the allocation's
    # utility is the reported lower bound (the gap is what column scaling of Sec. 5 leaves at tied prices).
    assert market.prices == pytest.approx(prices, rel=1e-2, abs=1e-3)
    assert market.dual >= optimum - 1e-6
    assert achieved == pytest.approx(market.primal, rel=1e-9, abs=1e-9)
    assert achieved >= optimum - market.gap - 1e-6
    assert market.dual - optimum <= 1e-3 * n


def test_market_on_the_example_gpu_jobs_matches_cvxpy() -> None:
    """The seven GPU jobs of examples/ (Gavel throughputs, demands of 2-6 GPUs) on three 8-GPU pools, log utility."""
    a = np.array(
        [
            [3.4388, 5.6814, 7.1758],
            [0.5048, 2.4027, 4.4261],
            [17.1423, 58.1727, 64.7425],
            [10.4412, 16.5966, 7.4696],
            [12.4955, 41.4822, 74.1359],
            [0.619, 2.6195, 4.3948],
            [1.7522, 5.0918, 8.6178],
        ]
    )
    d = np.repeat(np.array([2.0, 4, 2, 4, 6, 4, 4])[:, None], 3, axis=1)
    r = np.array([8.0, 8.0, 8.0])
    optimum, prices = cvxpy_reference(a, d, r)
    market = solve_market(a, r, [UtilitySpec("log")] * 7, [1.0] * 7, d, None, MarketSettings(max_iter=500))
    achieved = float(np.log(np.einsum("ij,ij->i", a, market.allocation)).sum())
    assert achieved == pytest.approx(market.primal, rel=1e-9, abs=1e-9)
    assert market.dual >= optimum - 1e-6
    assert market.prices == pytest.approx(prices, rel=1e-2, abs=1e-3)


def test_a_market_solve_leaves_the_torch_thread_count_as_it_found_it() -> None:
    """No process-global state changes inside a plan: allocator.pricing solves on one thread and restores the
    caller's setting (its own tests check the single thread during the solve)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        solve_market(np.ones((2, 2)), np.ones(2), [UtilitySpec("log")] * 2, [1.0, 1.0], np.ones((2, 2)), None)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
