"""allocator.pricing.primal.repair: the per-pool shed that replaces column scaling (004 Sec. 5) where a pool is
over-used. Exact answers on hand-sized instances, and feasibility / no loss against column scaling on random ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import pricing
from allocator import utilities as U
from allocator.pricing.dual.oracle import DualOracle
from allocator.pricing.dual.subproblem import Subsolution
from allocator.pricing.primal.repair import shed_overuse
from allocator.pricing.problem import Problem, Route, prepare


def _one_pool(a: list[float], utility: U.UtilityBase, capacity: float) -> tuple[Problem, Subsolution, np.ndarray]:
    """Jobs that each run all their time on pool 0 of two (pool 1 has no capacity use here)."""
    n = len(a)
    at = torch.tensor(a, dtype=torch.float64)
    zero = torch.zeros(n, dtype=torch.float64)
    sol = Subsolution(
        t=at.clone(), j_lo=torch.full((n,), 2), x_lo=zero.clone(), a_lo=zero.clone(), c_lo=zero.clone(),
        j_hi=torch.zeros(n, dtype=torch.long), x_hi=torch.ones(n, dtype=torch.float64), a_hi=at.clone(),
        c_hi=zero.clone(),
    )
    prob = Problem(
        a=torch.stack([at, zero], 1), capacity=torch.tensor([capacity, 1.0], dtype=torch.float64), demand=None,
        utility=utility.to(dtype=torch.float64),
    )
    return prob, sol, np.array([float(n), 0.0])


def test_target_priority_sheds_the_cheapest_job_not_everyone() -> None:
    # loss per unit of pool freed: w a = 1, 0.5, 1.6: dropping job 1 entirely frees the excess 1 at cost 0.5;
    # column scaling (x = 2/3 for all) costs (1 + 0.5 + 1.6) / 3.
    util = U.TargetPriority([1.0, 0.5, 0.8], [1.0, 1.0, 2.0])
    prob, sol, usage = _one_pool([1.0, 0.5, 0.8], util, capacity=2.0)
    rep = shed_overuse(prob, sol, usage, prob.capacity.numpy())
    assert rep is not None
    np.testing.assert_allclose(rep.throughputs.numpy(), [1.0, 0.0, 0.8], atol=1e-9)
    assert rep.utility == pytest.approx(-0.5, abs=1e-9)
    assert rep.usage[0] <= 2.0
    assert rep.utility > float(util.value(np.array([1.0, 0.5, 0.8]) * 2 / 3).sum())


def test_strictly_concave_pools_are_scaled_uniformly_and_log_is_left_to_column_scaling() -> None:
    # no affine piece: the pool is scaled as in Sec. 5 (capacity 1 of usage 2: every job keeps half its time)
    util = U.Power(0.5, [1.0, 3.0])
    prob, sol, usage = _one_pool([1.0, 0.8], util, capacity=1.0)
    rep = shed_overuse(prob, sol, usage, prob.capacity.numpy())
    assert rep is not None
    np.testing.assert_allclose(rep.throughputs.numpy(), [0.5, 0.4], rtol=1e-12)
    assert rep.usage[0] == pytest.approx(1.0)
    prob, sol, usage = _one_pool([1.0, 0.8], U.Log([1.0, 3.0]), capacity=1.0)
    assert shed_overuse(prob, sol, usage, prob.capacity.numpy()) is None


def test_nothing_to_repair_without_an_over_used_pool() -> None:
    prob, sol, usage = _one_pool([1.0, 0.5], U.Log(), capacity=5.0)
    assert shed_overuse(prob, sol, usage, prob.capacity.numpy()) is None


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    family=st.sampled_from(["log", "target", "linear", "power"]),
    demand=st.booleans(),
)
def test_feasible_and_never_worse_than_column_scaling(seed: int, family: str, demand: bool) -> None:
    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(5, 60)), int(rng.integers(1, 5))
    a = rng.uniform(0.05, 1.0, (n, m))
    a[rng.random((n, m)) < 0.2] = 0.0
    cap = rng.uniform(0.05, 0.5, m) * n / m
    d = rng.uniform(0.5, 2.0, (n, m)) if demand else None
    util = {
        "log": U.Log(rng.uniform(0.5, 2, n)),
        "target": U.TargetPriority(rng.uniform(0.1, 0.8, n), rng.choice([1.0, 2.0], n)),
        "linear": U.Linear(rng.uniform(0.5, 2, n)),
        "power": U.Power(0.5, rng.uniform(0.5, 2, n)),
    }[family]
    prob = prepare(a, cap, util, d, Route("torch", "cpu", "float64"))
    oracle = DualOracle(prob)
    p = rng.uniform(0.0, 1.0, m) * rng.uniform(0.1, 3.0)  # some prices: usually over-use somewhere
    ev = oracle(p)
    rep = shed_overuse(prob, ev.subsolution(), ev.usage, oracle.cap64)
    if not (ev.usage > oracle.cap64).any() or family == "log":
        assert rep is None  # nothing over-used, or log (left to column scaling)
        return
    assert rep is not None
    assert (rep.usage <= oracle.cap64 * (1 + 1e-9) + 1e-12).all()
    sol = ev.subsolution()
    assert (rep.x_lo <= sol.x_lo + 1e-12).all() and (rep.x_hi <= sol.x_hi + 1e-12).all()
    assert (rep.x_lo >= 0).all() and (rep.x_hi >= 0).all()
    # the allocation's own usage, recomputed densely, respects the capacities
    x = sol.with_fractions(rep.x_lo, rep.x_hi).dense(m).numpy()
    dd = np.ones((n, m)) if d is None else d
    assert ((dd * x).sum(0) <= cap * (1 + 1e-9) + 1e-12).all()
    np.testing.assert_allclose(rep.throughputs.numpy(), (a * x).sum(1), rtol=1e-9, atol=1e-12)
    # the per-pool shed loses no more utility than scaling the over-used columns (Sec. 5)
    if np.isfinite(ev.primal):
        assert rep.utility >= ev.primal - 1e-9 * max(1.0, abs(ev.primal))


def test_solve_reports_the_repaired_allocation() -> None:
    """At 004 Sec. 6.2 n = 10^5 the best primal evaluation over-uses pools; the result's allocation is feasible and
    its utility is the reported lower bound."""
    rng = np.random.default_rng(0)
    n = 100_000
    a = rng.uniform([0.1, 0.1, 0.3, 0.6], [0.3, 0.5, 0.8, 1.0], (n, 4)).astype(np.float32)
    r = np.array([8e5, 1e5, 1e4, 1e3]) * n / 1e6
    u = U.from_spec("target:0.2:1,2", n, seed=0)
    res = pricing.solve(a, r, u, device="cpu")
    x = res.allocation.astype(np.float64)
    assert (x.sum(0) <= r * (1 + 1e-6)).all() and (x.sum(1) <= 1 + 1e-6).all()
    t = (a.astype(np.float64) * x).sum(1)
    w = np.asarray(u.weight)  # type: ignore[attr-defined]
    assert float((w * np.minimum(t - 0.2, 0)).sum()) == pytest.approx(res.utility_value, rel=1e-4)
