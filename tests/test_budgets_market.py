"""Property tests of the Budgets' Fisher market (docs/budgets.md) against an exact reference: the Eisenberg-Gale
program solved by CVXPY + Clarabel (tests/budgets_reference.py). The instances are generated from a seed that
hypothesis draws (printed on failure)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog
from walras.planner.cluster import TenantOptions
from walras.planner.market import slice_throughputs
from walras.planner.tenants import apply_tenants

from tests.budgets_reference import (
    cluster,
    eisenberg_gale,
    equilibrium_violation,
    generate,
    merged,
    scaled,
    split,
    tenant_units,
    tenant_utility,
    walras,
)

SEEDS = st.integers(0, 2**32 - 1)


def _instance(seed: int):  # type: ignore[no-untyped-def]
    print(f"seed {seed}")
    return generate(np.random.default_rng(seed))


@settings(max_examples=25, deadline=None)
@given(SEEDS)
def test_the_market_solves_the_eisenberg_gale_program(seed: int) -> None:
    """Where no job's time cap binds at the optimum of (T2), the budget-constrained equilibrium (T6) is (T2)'s
    optimum, and the planner's market reaches it (where caps bind it is not: see the sharing-incentive tests)."""
    inst = _instance(seed)
    exact, best = eisenberg_gale(inst)
    if (exact.sum(axis=1) >= 0.99).any():
        return
    ours = walras(inst)
    value = sum(tenant_utility(inst, ours.allocation, t) for t in range(len(inst.shares)))
    assert value >= best - 1e-2 * sum(inst.shares)  # the market's tolerance is 1e-5 sum B (T4), far inside this


@settings(max_examples=25, deadline=None)
@given(SEEDS, st.floats(-6, 6), st.booleans())
def test_scale_invariance(seed: int, exponent: float, of_weights: bool) -> None:
    """A tenant multiplying all its throughputs (or all its weights) by c in [1e-6, 1e6] gains <= 1 % of any
    pool's units."""
    inst = _instance(seed)
    c = 10.0**exponent
    greedy = scaled(inst, 0, weight=c) if of_weights else scaled(inst, 0, throughput=c)
    before = tenant_units(inst, walras(inst).allocation, 0)
    after = tenant_units(greedy, walras(greedy).allocation, 0)
    assert np.all(after - before <= 0.01 * np.array(inst.capacity) + 1e-9), (before, after)


@settings(max_examples=25, deadline=None)
@given(SEEDS, st.integers(2, 50))
def test_no_gain_from_splitting_a_job(seed: int, k: int) -> None:
    """A single-job tenant that splits its job into k identical jobs gains <= 1 %: of its throughput, and of the
    total units it holds (per pool, units may move between pools the tenant is indifferent between at the prices:
    the equilibrium's bundles are not unique there, its utilities are)."""
    base = generate(np.random.default_rng(seed), tenants=2)
    i = base.tenant.index(0)
    keep = [q for q in range(base.n) if base.tenant[q] != 0 or q == i]  # tenant 0 keeps one job
    from dataclasses import replace

    one = replace(base, throughput=tuple(base.throughput[q] for q in keep),
                  replicas=tuple(base.replicas[q] for q in keep), weights=tuple(base.weights[q] for q in keep),
                  families=tuple(base.families[q] for q in keep), tenant=tuple(base.tenant[q] for q in keep))
    whole = merged(one, 0, k)
    pieces = split(one, 0, k)
    x_whole, x_pieces = eisenberg_gale(whole)[0], eisenberg_gale(pieces)[0]  # the exact equilibrium of (T1)'s budgets
    before, after = tenant_units(whole, x_whole, 0), tenant_units(pieces, x_pieces, 0)
    assert after.sum() - before.sum() <= 0.01 * sum(one.capacity) + 1e-9, (k, before, after)
    rows = np.array(pieces.tenant) == 0

    def rates(xw: np.ndarray, xp: np.ndarray) -> tuple[float, float]:
        return float(whole.A()[0] @ xw[0]), float(np.einsum("ij,ij->", pieces.A()[rows], xp[rows]))

    # the mechanism (the exact Eisenberg-Gale equilibrium): no gain beyond 1 %
    ref_before, ref_after = rates(eisenberg_gale(whole)[0], eisenberg_gale(pieces)[0])
    assert ref_after <= 1.01 * ref_before + 1e-9, (k, ref_before, ref_after)
    # the planner's market (its tolerance 1e-5 sum b, TenantOptions.gap): no gain beyond 1 % either
    ours_before, ours_after = rates(walras(whole).allocation, walras(pieces).allocation)
    assert ours_after <= 1.01 * ours_before + 1e-9, (k, ours_before, ours_after)


def _slice_throughput(inst, i: int) -> float:  # type: ignore[no-untyped-def]
    """The most throughput job i can get from its budget's proportional slice b_i / sum B of every pool, under its
    time cap (HiGHS: max a_i^T x s.t. d_ij x_j <= part R_j, 1^T x <= 1)."""
    A, D, b, R = inst.A(), inst.D(), inst.budgets(), np.array(inst.capacity)
    part = b[i] / sum(inst.shares)
    best = linprog(-A[i], A_ub=np.vstack([np.diag(D[i]), np.ones((1, inst.m))]), b_ub=np.r_[part * R, 1.0],
                   bounds=[(0, None)] * inst.m, method="highs")
    return float(-best.fun)


@settings(max_examples=25, deadline=None)
@given(SEEDS)
def test_sharing_incentive_where_the_cap_does_not_bind(seed: int) -> None:
    """The exact Eisenberg-Gale equilibrium (T2) gives every job whose time cap does not bind at least the
    throughput of its proportional slice, within 1 %."""
    inst = _instance(seed)
    exact = eisenberg_gale(inst)[0]
    for i in range(inst.n):
        if exact[i].sum() < 0.99:
            assert inst.A()[i] @ exact[i] >= 0.99 * _slice_throughput(inst, i), i


def test_the_eisenberg_gale_equilibrium_fails_the_sharing_incentive_of_a_capped_job() -> None:
    """Why the market with budgets is the budget-constrained equilibrium (T6), not (T2): job 0 (throughputs 1 and
    10, one replica, alone in its tenant) and job 1 (pool b only) with equal budgets; pool b holds one replica.
    (T2) gives job 0 b-time 4/9 and throughput 5, its slice (half of every pool) 5.5: it pays mu = 0.2 of its
    budget for its own time. The planner's market gives it the slice's 5.5 (within 1 %)."""
    from tests.budgets_reference import Instance

    inst = Instance(capacity=(100.0, 1.0), throughput=((1.0, 10.0), (0.0, 10.0)), replicas=(1, 1),
                    weights=(1.0, 1.0), families=("log", "log"), tenant=(0, 1), shares=(1.0, 1.0))
    exact = eisenberg_gale(inst)[0]
    assert abs(inst.A()[0] @ exact[0] - 5.0) < 1e-3  # (T2): below the slice
    assert abs(_slice_throughput(inst, 0) - 5.5) < 1e-6
    ours = walras(inst).allocation
    assert inst.A()[0] @ ours[0] >= 0.99 * 5.5, ours


@settings(max_examples=40, deadline=None)
@given(SEEDS)
def test_sharing_incentive_of_the_planners_market_also_where_caps_bind(seed: int) -> None:
    """The planner's market (the budget-constrained equilibrium, T6) gives every job, its time cap binding or not,
    at least the throughput of its proportional slice under that cap (the guarantee of docs/budgets.md), within
    the documented tolerance of 2 % (worst case measured over generated instances: docs/bench/budgets.md)."""
    inst = _instance(seed)
    ours = walras(inst).allocation
    for i in range(inst.n):
        assert inst.A()[i] @ ours[i] >= 0.98 * _slice_throughput(inst, i), (i, ours[i].sum())


@pytest.mark.parametrize("seed", [92, 133, 196, 297, 332, 377])
def test_the_instances_the_twelve_solve_fixed_point_left_below_their_slices(seed: int) -> None:
    """Seeds of ``generate`` on which the market of main (12 solves, upward steps only) left a job more than 1 %
    below its capped slice (196: 4.2 %, a job nearly indifferent between two pools whose weight jumped to 58 times
    its budget and came back down a few percent a solve, while its neighbour stayed short): the downward step and
    the solves past 12 while a job is short (market.budget_equilibrium, T7) give every job 98.5 % of its slice."""
    inst = _instance(seed)
    ours = walras(inst).allocation
    for i in range(inst.n):
        assert inst.A()[i] @ ours[i] >= 0.985 * _slice_throughput(inst, i), (i, ours[i].sum())


@settings(max_examples=50, deadline=None)
@given(SEEDS)
def test_the_markets_slice_throughputs_are_the_slice_lps(seed: int) -> None:
    """market.slice_throughputs (the fractional knapsack the market's stopping test uses) equals HiGHS' solution of
    the slice LP for every job (the budgets b_i of T1, computed here from the instance)."""
    inst = _instance(seed)
    got = slice_throughputs(inst.A(), inst.D(), np.array(inst.capacity), inst.budgets())
    for i in range(inst.n):
        assert got[i] == pytest.approx(_slice_throughput(inst, i), rel=1e-9, abs=1e-12), i


@settings(max_examples=25, deadline=None)
@given(SEEDS)
def test_spend_never_exceeds_the_share(seed: int) -> None:
    """sum_j p_j units_tj <= B_t (T3) at the equilibrium of the budgets the planner gives the jobs (T1): prices are
    the reference's duals of the capacity constraints; the planner's own approximate prices are measured in
    docs/bench/budgets.md."""
    inst = _instance(seed)
    X, _, prices = eisenberg_gale(inst, duals=True)
    for t, share in enumerate(inst.shares):
        spend = float(prices @ tenant_units(inst, X, t))
        assert spend <= share * (1 + 1e-4) + 1e-7, (t, spend, share)


@settings(max_examples=50, deadline=None)
@given(SEEDS)
def test_the_planners_spend_never_exceeds_the_share_by_more_than_one_percent(seed: int) -> None:
    """(T3) at the planner's own prices and allocation (build_plan's tolerance, TenantOptions.gap = 1e-5 of the
    total budget): sum_j p_j units_tj <= 1.01 B_t (docs/budgets.md, "Accuracy")."""
    inst = _instance(seed)
    ours = walras(inst)
    for t, share in enumerate(inst.shares):
        spend = float(ours.prices @ tenant_units(inst, ours.allocation, t))
        assert spend <= share * 1.01, (t, spend, share)


@settings(max_examples=25, deadline=None)
@given(SEEDS)
def test_the_planner_gives_each_job_its_part_of_its_tenants_budget(seed: int) -> None:
    """The weights the planner hands the market are b_i = B_t w_i / sum w (T1), computed by the reference apart."""
    inst = _instance(seed)
    typed, _ = apply_tenants(cluster(inst), TenantOptions())
    got = {j.key: j.spec.utility.weight for j in typed.jobs if j.spec is not None}
    for i, b in enumerate(inst.budgets()):
        assert got[(f"t{inst.tenant[i]}", f"j{i:03d}")] == pytest.approx(b, rel=1e-12)


def test_seed_242_scaling_its_throughputs_moves_no_tenant_to_another_equilibrium() -> None:
    """Seed 242 (the 1,000-instance bench's worst scale-invariance case, 6.9 % of pool 2): where time caps bind the
    budget-constrained equilibrium (T6) is not unique, and the market's path on tenant 0's throughputs x 1.26e-4
    ended at another equilibrium. With the rows normalised (market.budget_equilibrium) both runs are the same
    equilibrium: each is one by the LP of supporting prices (``equilibrium_violation``, apart from the planner;
    (T2)'s exact allocation is not, 10 %), and tenant 0 gains nothing, also with its weights scaled."""
    inst = generate(np.random.default_rng(242))
    X, _ = eisenberg_gale(inst)
    assert equilibrium_violation(inst, X) > 0.05  # the reference tells T6 from T2 here
    before = walras(inst).allocation
    assert equilibrium_violation(inst, before) <= 2e-3
    for greedy in (scaled(inst, 0, throughput=1.2639319265302242e-4), scaled(inst, 0, throughput=1e6),
                   scaled(inst, 0, weight=1e-6), scaled(inst, 0, weight=1e6)):
        after = walras(greedy).allocation
        assert equilibrium_violation(inst, after) <= 2e-3
        gain = tenant_units(greedy, after, 0) - tenant_units(inst, before, 0)
        assert np.all(gain <= 0.01 * np.array(inst.capacity)), gain


@pytest.mark.parametrize("seed", [133, 437])
def test_the_fixed_point_goes_on_while_a_raised_weight_overspends(seed: int) -> None:
    """Seeds 437 and 133 (1.2 % and 2.4 % over a share when the iteration stopped at 12 or 30 solves because every
    job had its slice, the iterate not being the fixed point): the market goes on while a job whose weight exceeds
    its budget overspends, and ends at an equilibrium (the LP of supporting prices, apart from the planner) whose
    spend at the market's prices is within 1 % of every share."""
    inst = generate(np.random.default_rng(seed))
    ours = walras(inst)
    assert equilibrium_violation(inst, ours.allocation) <= 2e-3
    for t, share in enumerate(inst.shares):
        assert float(ours.prices @ tenant_units(inst, ours.allocation, t)) <= share * 1.01, t
