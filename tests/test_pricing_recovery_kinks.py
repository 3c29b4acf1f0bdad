"""Primal recovery (``allocator.pricing.primal.recovery``) at the kink of the target-priority utility (004 eq. 2).

A market of identical target-priority jobs whose target is the throughput of one pool clears with those jobs split
between that pool alone and a mix of the pools around it, at prices where the three pools lie on one line (the
subproblem's supporting line, 004 Sec. 4.1): the 400-node Gavel scenario of ``bench/planner.py`` (issue #16) is
such a market. The reference optima are exact: CVXPY + Clarabel for the allocation problem (the relaxation the dual
bounds), HiGHS' MILP for the same problem with at most two pools per job (the form the recovery prefers; a job may
span more pools where only that reaches the dual bound, see ``allocator.pricing.primal.recovery``).
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
import scipy.sparse
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import Bounds, LinearConstraint, milp

from allocator import pricing
from allocator import utilities as U
from allocator.pricing.dual.oracle import DualOracle
from allocator.pricing.dual.subproblem import Subsolution
from allocator.pricing.primal.recovery import recover_allocation
from allocator.pricing.problem import Route, prepare


def relaxation_optimum(a: np.ndarray, d: np.ndarray, r: np.ndarray, target: np.ndarray, w: np.ndarray) -> float:
    """``U*`` of problem (4) with target-priority utilities, by CVXPY + Clarabel."""
    n, m = a.shape
    x = cp.Variable((n, m), nonneg=True)
    t = cp.sum(cp.multiply(a, x), axis=1)
    demand = np.broadcast_to(d[:, None], (n, m))
    problem = cp.Problem(
        cp.Maximize(cp.sum(cp.multiply(w, cp.minimum(t - target, 0)))),
        [cp.sum(x, axis=1) <= 1, cp.sum(cp.multiply(demand, x), axis=0) <= r],
    )
    problem.solve(solver=cp.CLARABEL)
    return float(problem.value)


def two_pool_optimum(a: np.ndarray, d: np.ndarray, r: np.ndarray, target: np.ndarray, w: np.ndarray) -> float:
    """The optimum of the same problem with at most two pools per job (binary ``z_ij >= x_ij``, ``sum_j z_ij <= 2``),
    by HiGHS' MILP; the shortfall ``s_i <= min(t_i - t_des_i, 0)`` makes the objective linear."""
    n, m = a.shape
    nx = n * m
    cells = np.arange(nx).reshape(n, m)
    rows = [
        scipy.sparse.csr_matrix((np.ones(nx), (cells.ravel() // m, cells.ravel())), shape=(n, 2 * nx + n)),
        scipy.sparse.csr_matrix((np.repeat(d, m), (np.tile(np.arange(m), n), cells.ravel())), shape=(m, 2 * nx + n)),
        scipy.sparse.hstack([scipy.sparse.eye(nx), -scipy.sparse.eye(nx), scipy.sparse.csr_matrix((nx, n))]),
        scipy.sparse.csr_matrix((np.ones(nx), (cells.ravel() // m, nx + cells.ravel())), shape=(n, 2 * nx + n)),
        scipy.sparse.hstack(
            [scipy.sparse.csr_matrix((-a.ravel(), (cells.ravel() // m, cells.ravel())), shape=(n, nx)),
             scipy.sparse.csr_matrix((n, nx)), scipy.sparse.eye(n)]
        ),
    ]
    upper = np.concatenate([np.ones(n), r, np.zeros(nx), np.full(n, 2.0), -target])
    cost = np.concatenate([np.zeros(2 * nx), -w])
    integrality = np.concatenate([np.zeros(nx), np.ones(nx), np.zeros(n)])
    lower = np.concatenate([np.zeros(2 * nx), np.full(n, -np.inf)])
    bounds = Bounds(lower, np.concatenate([np.ones(2 * nx), np.zeros(n)]))
    res = milp(cost, constraints=LinearConstraint(scipy.sparse.vstack(rows).tocsr(), -np.inf, upper),
               integrality=integrality, bounds=bounds)
    assert res.status == 0
    return float(-res.fun)


def check_feasible(x: np.ndarray, a: np.ndarray, d: np.ndarray, r: np.ndarray, t: np.ndarray) -> None:
    assert (x >= 0).all() and (x.sum(1) <= 1 + 1e-9).all()
    assert ((d[:, None] * x).sum(0) <= r * (1 + 1e-9) + 1e-12).all()
    assert np.allclose((a * x).sum(1), t, atol=1e-9)


# Five copies of a job whose target (2) is the throughput of the middle pool; at the prices p the three pools lie on
# the line c = a - 0.5, so pool 2 alone and half of pools 1 and 3 each cost 1.5 for throughput 2. The capacities fit
# two copies on pool 2 and three on the mix: U* = 0 at p, with g(p) = p^T R - 5 * 1.5 = 0.
A_KINK = np.tile([1.0, 2.0, 3.0], (5, 1))
R_KINK = np.array([1.5, 2.0, 1.5])
P_KINK = np.array([0.5, 1.5, 2.5])
TARGET_KINK = np.full(5, 2.0)
W_KINK = np.full(5, 2.0)


@pytest.mark.parametrize("delta", [0.0, 1e-4, 1e-3])
def test_copies_at_their_target_are_dealt_whole_responses(delta: float) -> None:
    """From the optimal prices (``delta = 0``) or near them (pool 2 a little cheaper, so it is a hull vertex) the
    recovery deals the copies two pool-2 jobs and three mixes: U = U* = 0 at the first evaluation. Before, the class's
    common split (0.3, 0.4, 0.3) was trimmed to two pools in every copy (U = -3 or -8, 60 evaluations, open gap)."""
    util = U.TargetPriority(TARGET_KINK, W_KINK)
    ones = np.ones(5)
    optimum = relaxation_optimum(A_KINK, ones, R_KINK, TARGET_KINK, W_KINK)
    assert optimum == pytest.approx(0.0, abs=1e-7)
    assert two_pool_optimum(A_KINK, ones, R_KINK, TARGET_KINK, W_KINK) == pytest.approx(optimum, abs=1e-7)
    p = P_KINK - np.array([0.0, delta, 0.0])
    res = pricing.solve(A_KINK, R_KINK, util, prices=p, dtype="float64", max_iter=60)
    assert res.converged and res.iterations == 1
    assert res.utility_value == pytest.approx(optimum, abs=1e-9)
    assert res.dual_value >= optimum - 1e-9 and res.gap <= 5 * delta + 1e-9
    check_feasible(res.allocation, A_KINK, ones, R_KINK, res.throughputs)
    assert sorted(map(tuple, res.allocation.round(12))) == [(0, 1, 0)] * 2 + [(0.5, 0, 0.5)] * 3


def test_a_target_at_a_hull_vertex_gets_a_supporting_multiplier() -> None:
    """The subproblem solution of eq. (16) at a vertex: t = a_2 = the target, pool 2 alone. u'(t) there is 0 (right
    derivative), which supports no pool at positive prices, so the job used to count as untied and kept pool 2 (the
    recovery returned None and the capacity of pool 2 stayed over-sold). The multiplier from the intersection of
    [0, w] and the hull's slopes [1 - delta, 1 + delta] finds pools 1 and 3 within the tie tolerance."""
    delta = 1e-4
    n, m = A_KINK.shape
    p = P_KINK - np.array([0.0, delta, 0.0])
    a = torch.as_tensor(A_KINK)
    c = torch.as_tensor(p).expand(n, m)
    full = torch.full((n,), 1.0, dtype=torch.float64)
    sol = Subsolution(
        t=torch.full((n,), 2.0, dtype=torch.float64),
        j_lo=torch.zeros(n, dtype=torch.long),
        x_lo=torch.zeros(n, dtype=torch.float64),
        a_lo=full,
        c_lo=torch.full((n,), 0.5, dtype=torch.float64),
        j_hi=torch.ones(n, dtype=torch.long),
        x_hi=full,
        a_hi=torch.full((n,), 2.0, dtype=torch.float64),
        c_hi=torch.full((n,), 1.5 - delta, dtype=torch.float64),
    )
    util = U.TargetPriority(TARGET_KINK, W_KINK).to("cpu", torch.float64)
    rec = recover_allocation(a, c, None, R_KINK, sol, util, rtol=1e-3)
    assert rec is not None and rec.tied_jobs == n
    assert rec.utility == pytest.approx(0.0, abs=1e-9)
    check_feasible(rec.allocation.numpy(), A_KINK, np.ones(n), R_KINK, rec.throughputs.numpy())


def kink_market(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """2-3 job types in 1-5 copies over 3 pools, each type's target the throughput of one of its pools."""
    rng = np.random.default_rng(seed)
    m = 3
    types = int(rng.integers(2, 4))
    a_type = np.round(rng.uniform(0.5, 4.0, (types, m)), 2)
    copies = rng.integers(1, 6, types)
    target_type = a_type[np.arange(types), rng.integers(0, m, types)]
    w_type = rng.choice([1.0, 2.0], types)
    a = np.repeat(a_type, copies, axis=0)
    d = np.repeat(rng.choice([1.0, 2.0], types), copies)
    r = np.round(rng.uniform(0.2, 0.6, m) * d.sum(), 1)
    return a, d, r, np.repeat(target_type, copies), np.repeat(w_type, copies)


@pytest.mark.parametrize("seed", [6, 39, 76])
def test_kink_markets_converge_to_the_exact_optimum(seed: int) -> None:
    """Markets of copies with targets at pool throughputs (the committed recovery left them 0.4-4.6 below U* after 60
    evaluations): converged, and the allocation is optimal against Clarabel's U*."""
    a, d, r, target, w = kink_market(seed)
    n = a.shape[0]
    optimum = relaxation_optimum(a, d, r, target, w)
    res = pricing.solve(a, r, U.TargetPriority(target, w), demand=d, dtype="float64", eps=1e-4 * n, max_iter=60)
    assert res.converged
    check_feasible(res.allocation, a, d, r, res.throughputs)
    assert res.utility_value <= optimum + 1e-6
    assert optimum - res.utility_value <= 1e-4 * n
    assert res.dual_value >= optimum - 1e-6


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_recovered_allocations_are_feasible_and_the_certificate_honest(seed: int) -> None:
    """Small target-priority markets with kinks: whatever the run reaches in 30 evaluations, the allocation is
    feasible, no job gets throughput past its target (worthless there, eq. 2), the reported utility is the
    allocation's, and primal <= U* (Clarabel) <= dual, so the gap is a true bound."""
    a, d, r, target, w = kink_market(seed)
    optimum = relaxation_optimum(a, d, r, target, w)
    res = pricing.solve(a, r, U.TargetPriority(target, w), demand=d, dtype="float64", max_iter=30)
    check_feasible(res.allocation, a, d, r, res.throughputs)
    assert (res.throughputs <= target * (1 + 1e-9)).all()
    assert res.utility_value == pytest.approx(float((w * np.minimum(res.throughputs - target, 0)).sum()), abs=1e-9)
    tol = 1e-7 * max(1.0, abs(optimum))
    assert res.utility_value <= optimum + tol <= res.dual_value + 2 * tol
    assert res.gap == pytest.approx(res.dual_value - res.utility_value) and res.gap >= -tol


def test_the_prices_of_the_kink_market_are_optimal() -> None:
    """The premise of the tests above, checked by DualOracle: g(P_KINK) equals U* = 0 (strong duality, 004 Sec. 3)."""
    util = U.TargetPriority(TARGET_KINK, W_KINK)
    prob = prepare(A_KINK, R_KINK, util, None, Route("torch", "cpu", "float64"))
    assert DualOracle(prob)(P_KINK).dual == pytest.approx(0.0, abs=1e-12)
