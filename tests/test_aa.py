"""Tests for allocator.aa (paper 000, Lai et al.): worked examples, tight instances, exact optima by MILP."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.interpolate import PchipInterpolator
from scipy.optimize import Bounds, LinearConstraint, milp

from allocator.aa import (
    PiecewiseLinearCurves,
    TableCurves,
    aamr,
    algorithm1,
    algorithm2,
    as_curves,
    assign_and_allocate,
    assign_and_allocate_multi,
    baseline,
    concat_curves,
    curves_from_points,
    dpsopt,
    parametric_curves,
    pchip_table,
    reallocate,
    solve,
    super_optimal,
    super_optimal_concave,
    super_optimal_dp,
)
from allocator.aa.algorithms import random_split_from_uniforms

ALPHA = 2 * (math.sqrt(2) - 1)


# ---------------------------------------------------------------------------------------------------------------------
# exact references


def milp_optimum(values: np.ndarray, caps: list[int]) -> float:
    """Exact AA optimum: binary x[i, j, c] = thread i on server j with c units (HiGHS via scipy.optimize.milp)."""
    n = values.shape[0]
    m = len(caps)
    cols = [(i, j, c) for i in range(n) for j in range(m) for c in range(min(caps[j], values.shape[1] - 1) + 1)]
    N = len(cols)
    obj = np.array([-values[i, c] for i, _, c in cols])
    A1 = np.zeros((n, N))
    A2 = np.zeros((m, N))
    for k, (i, j, c) in enumerate(cols):
        A1[i, k] = 1
        A2[j, k] = c
    cons = [LinearConstraint(A1, 1, 1), LinearConstraint(A2, -np.inf, np.array(caps, dtype=float))]
    res = milp(obj, constraints=cons, integrality=np.ones(N), bounds=Bounds(0, 1))
    assert res.status == 0, res.message
    return float(-res.fun)


def single_server_optimum(values: np.ndarray, total: int) -> float:
    """Definition V.1 by MILP: one server with `total` units, each thread at most C units."""
    n, W = values.shape
    N = n * W
    obj = -values.reshape(-1)
    A1 = np.kron(np.eye(n), np.ones(W))
    A2 = np.tile(np.arange(W, dtype=float), n)[None, :]
    cons = [LinearConstraint(A1, 1, 1), LinearConstraint(A2, -np.inf, total)]
    res = milp(obj, constraints=cons, integrality=np.ones(N), bounds=Bounds(0, 1))
    assert res.status == 0
    return float(-res.fun)


def check_feasible(server: np.ndarray, amount: np.ndarray, caps: list[int]) -> None:
    assert server.dtype.kind == "i" and amount.dtype.kind == "i"
    assert (server >= 0).all() and (server < len(caps)).all()
    assert (amount >= 0).all()
    used = np.bincount(server, weights=amount, minlength=len(caps))
    assert (used <= np.asarray(caps)).all()


def random_concave(rng: np.random.Generator, n: int, C: int) -> np.ndarray:
    marg = np.sort(rng.exponential(size=(n, C)), axis=1)[:, ::-1] * rng.uniform(0.1, 3.0, size=(n, 1))
    marg[rng.random((n, C)) < 0.1] = 0.0
    marg = np.sort(marg, axis=1)[:, ::-1]
    return np.concatenate([np.zeros((n, 1)), np.cumsum(marg, axis=1)], axis=1)


def random_nonconcave(rng: np.random.Generator, n: int, C: int) -> np.ndarray:
    marg = rng.exponential(size=(n, C)) * (rng.random((n, C)) < 0.5)
    return np.concatenate([np.zeros((n, 1)), np.cumsum(marg, axis=1)], axis=1)


# ---------------------------------------------------------------------------------------------------------------------
# worked examples: Tables II and III


@pytest.mark.parametrize("fit", ["first", "worst"])
def test_table_ii_algorithm1_step_by_step(fit: str) -> None:
    # Section V-B example: m = 2, C = 7, c_hat = (2, 3, 3, 6), g(c_hat) = (3, 6, 4, 7)
    p = algorithm1([2, 3, 3, 6], [3, 6, 4, 7], [7, 7], trace=True, fit=fit)
    # Table II (1-based): (4,1) c4=6 C=(1,7); (2,2) c2=3 C=(1,4); (3,2) c3=3 C=(1,1); (1,1) c1=1 C=(0,1).
    # The paper's table prints C2 = 3 after loop 2, a typo: 7 - 3 = 4, and loop 3 (c3 = 3) leaves C2 = 1.
    got = [(s.thread + 1, s.server + 1, s.amount, s.remaining, s.full) for s in p.steps]
    assert got == [
        (4, 1, 6, (1, 7), True),
        (2, 2, 3, (1, 4), True),
        (3, 2, 3, (1, 1), True),
        (1, 1, 1, (0, 1), False),
    ]
    # the set R after each loop, as in Table II
    left = {1, 2, 3, 4}
    rs = []
    for s in p.steps:
        left.discard(s.thread + 1)
        rs.append(set(left))
    assert rs == [{1, 2, 3}, {1, 3}, {1}, set()]


def test_table_iii_algorithm2_step_by_step() -> None:
    p = algorithm2([2, 3, 3, 6], [3, 6, 4, 7], [7, 7], trace=True)
    # lines 1-2 order: t4, t2, t1, t3
    assert (p.order + 1).tolist() == [4, 2, 1, 3]
    got = [(s.server + 1, s.amount, s.remaining) for s in p.steps]
    assert got == [(1, 6, (1, 7)), (2, 3, (1, 4)), (2, 2, (1, 2)), (2, 2, (1, 0))]
    assert [s.full for s in p.steps] == [True, True, True, False]


def test_algorithm2_takes_the_emptiest_server_and_keeps_leftovers() -> None:
    """Algorithm 2 read literally (Section VI, lines 2, 6, 7): m = 2, C = 10, c_hat = (6, 5, 3, 3), g_hat =
    (10, 9, 3, 2). Head t0 -> s0 (6 units, rest (4, 10)), t1 -> s1 (5, rest (4, 5)); tail by nonincreasing slope:
    t2 (slope 1) goes to the emptiest server s1 (3 units, rest (4, 2)) -- a best-fit rule would pick s0 -- then t3
    (slope 2/3) to s0 (3 units, rest (1, 2)). The 3 units left are not handed out (Lemma V.7 keeps them)."""
    p = algorithm2([6, 5, 3, 3], [10, 9, 3, 2], [10, 10], trace=True)
    assert p.order.tolist() == [0, 1, 2, 3]
    assert [(s.server, s.amount, s.remaining) for s in p.steps] == [
        (0, 6, (4, 10)),
        (1, 5, (4, 5)),
        (1, 3, (4, 2)),
        (0, 3, (1, 2)),
    ]


# ---------------------------------------------------------------------------------------------------------------------
# tight instances


def test_theorem_v18_ratio_five_sixths() -> None:
    x = np.arange(11)
    f1 = np.minimum(x / 5, 1.0)
    f2 = x / 10
    V = np.stack([f1, f1, f2])
    so = super_optimal(as_curves(V, 10), 20)
    assert so.amount.tolist() == [5, 5, 10]
    opt = milp_optimum(V, [10, 10])
    assert opt == pytest.approx(3.0)
    g_hat = V[np.arange(3), so.amount]
    worst = algorithm1(so.amount, g_hat, [10, 10], fit="worst")
    # the paper's algorithms as their pseudocode reads (refine=False): Theorem V.18's bound is about them
    for s, a in (assign_and_allocate(V, [10, 10], method="alg2", refine=False), (worst.server, worst.amount)):
        check_feasible(s, a, [10, 10])
        util = V[np.arange(3), a].sum()
        assert util / opt == pytest.approx(5 / 6)
        assert util >= ALPHA * opt
    # with first fit (the default) Algorithm 1 puts threads 1 and 2 together and reaches the optimum here
    s, a = assign_and_allocate(V, [10, 10], method="alg1", refine=False)
    assert s.tolist() == [0, 0, 1] and V[np.arange(3), a].sum() == pytest.approx(opt)


@pytest.mark.parametrize("m", [2, 3, 4, 6])
def test_theorem_vii4_ratio_m_over_2m_minus_1(m: int) -> None:
    x = np.arange(m + 1)
    f1 = np.minimum(x, 1.0)
    f2 = (x > m - 1).astype(float)
    V = np.stack([f1] * m + [f2] * (m - 1))
    so = super_optimal_dp(as_curves(V, m), m * m)
    assert so.amount.tolist() == [1] * m + [m] * (m - 1)
    s, a = assign_and_allocate(V, [m] * m, method="aanc", refine=False)
    check_feasible(s, a, [m] * m)
    util = V[np.arange(2 * m - 1), a].sum()
    assert util == pytest.approx(m)
    opt = milp_optimum(V, [m] * m) if m <= 4 else float(2 * m - 1)
    assert opt == pytest.approx(2 * m - 1)
    assert util / opt == pytest.approx(m / (2 * m - 1))
    assert util >= 0.5 * opt


# ---------------------------------------------------------------------------------------------------------------------
# super-optimal allocation


@pytest.mark.parametrize("seed", range(6))
def test_bisection_matches_dp_and_milp(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, C, m = int(rng.integers(2, 9)), int(rng.integers(1, 15)), int(rng.integers(1, 4))
    V = random_concave(rng, n, C)
    curves = as_curves(V, C)
    b = super_optimal_concave(curves, m * C)
    d = super_optimal_dp(curves, m * C)
    assert b.amount.sum() <= m * C and (b.amount <= C).all()
    assert b.utility == pytest.approx(d.utility, rel=1e-9, abs=1e-12)
    assert d.utility == pytest.approx(single_server_optimum(V, m * C), rel=1e-7)


def test_bisection_with_ties_is_exact() -> None:
    # identical linear curves: every unit has the same marginal -> the bisection has to fill by ties
    V = np.tile(np.arange(11) * 0.3, (7, 1))
    so = super_optimal_concave(as_curves(V, 10), 23)
    assert so.amount.sum() == 23 and (so.amount <= 10).all()
    assert so.utility == pytest.approx(0.3 * 23)


def test_piecewise_linear_bisection_matches_dense_dp() -> None:
    rng = np.random.default_rng(3)
    n, C, K = 30, 40, 5
    gaps = rng.uniform(0.5, C / K, size=(n, K - 1))  # non-integer breakpoints: straddling units are evaluated
    x = np.concatenate([np.zeros((n, 1)), np.cumsum(gaps, axis=1)], axis=1)
    slopes = np.sort(rng.exponential(size=(n, K - 1)), axis=1)[:, ::-1]
    y = np.concatenate([np.zeros((n, 1)), np.cumsum(slopes * np.diff(x, axis=1), axis=1)], axis=1)
    fam = PiecewiseLinearCurves(x, y, C)
    assert fam.concave().all()
    dense = TableCurves(fam.table())
    assert dense.concave().all()
    for total in (0, 7, 100, 333, n * C):
        b = super_optimal_concave(fam, total)
        d = super_optimal_dp(dense, total)
        assert b.utility == pytest.approx(d.utility, rel=1e-9, abs=1e-12)
    # demand in closed form equals the generic binary search
    for lam in (0.0, 0.1, 0.5, 1.3):
        from allocator.aa.curves import CurveFamily

        assert (fam.demand(lam) == CurveFamily.demand(fam, lam)).all()


def test_parametric_bisection_matches_dp() -> None:
    C = 12
    fam = parametric_curves("power", {"weight": [1.0, 2.0, 0.5, 3.0], "beta": [0.5, 0.3, 0.9, 0.7]}, C)
    logf = parametric_curves("log", {"weight": [1.0, 4.0, 2.0], "scale": [1.0, 5.0, 0.5]}, C)
    for f in (fam, logf):
        b = super_optimal_concave(f, 2 * C)
        d = super_optimal_dp(TableCurves(f.table()), 2 * C)
        assert b.utility == pytest.approx(d.utility, rel=1e-9)


# ---------------------------------------------------------------------------------------------------------------------
# approximation ratios against the exact MILP optimum (hypothesis)


@st.composite
def instances(draw: st.DrawFn, concave: bool) -> tuple[np.ndarray, list[int]]:
    seed = draw(st.integers(0, 2**31 - 1))
    n = draw(st.integers(1, 12))
    m = draw(st.integers(1, 4))
    C = draw(st.integers(1, 20))
    rng = np.random.default_rng(seed)
    V = random_concave(rng, n, C) if concave else random_nonconcave(rng, n, C)
    return V, [C] * m


@settings(max_examples=50, deadline=None)
@given(instances(concave=True))
def test_algorithms_1_2_reach_alpha_of_optimum(inst: tuple[np.ndarray, list[int]]) -> None:
    V, caps = inst
    opt = milp_optimum(V, caps)
    so = super_optimal(as_curves(V, caps[0]), sum(caps))
    assert so.utility >= opt - 1e-7 * max(1.0, opt)  # Lemma V.2: SO is an upper bound
    g_hat = V[np.arange(V.shape[0]), so.amount]
    worst = algorithm1(so.amount, g_hat, caps, fit="worst")
    runs = [assign_and_allocate(V, caps, method=m, refine=r) for m in ("alg1", "alg2") for r in (False, True)]
    runs.append((worst.server, worst.amount))
    for s, a in runs:
        check_feasible(s, a, caps)
        util = V[np.arange(V.shape[0]), a].sum()
        assert util >= ALPHA * opt - 1e-9
        assert util >= ALPHA * so.utility - 1e-9  # Lemma V.16 bounds against SO itself


@settings(max_examples=50, deadline=None)
@given(instances(concave=False))
def test_aanc_reaches_half_of_optimum(inst: tuple[np.ndarray, list[int]]) -> None:
    V, caps = inst
    opt = milp_optimum(V, caps)
    so = super_optimal_dp(as_curves(V, caps[0]), sum(caps))
    assert so.utility >= opt - 1e-7 * max(1.0, opt)
    assert so.utility == pytest.approx(single_server_optimum(V, sum(caps)), rel=1e-7, abs=1e-9)
    for refine in (False, True):
        s, a = assign_and_allocate(V, caps, method="aanc", refine=refine)
        check_feasible(s, a, caps)
        util = V[np.arange(V.shape[0]), a].sum()
        assert util >= 0.5 * opt - 1e-9


@pytest.mark.parametrize("seed", range(3))
def test_issue_sized_instance_against_milp(seed: int) -> None:
    # the issue's largest MILP size: n = 12, m = 4, C = 20
    rng = np.random.default_rng(100 + seed)
    V = random_concave(rng, 12, 20)
    caps = [20] * 4
    opt = milp_optimum(V, caps)
    for method in ("alg1", "alg2"):
        for refine in (False, True):
            s, a = assign_and_allocate(V, caps, method=method, refine=refine)
            check_feasible(s, a, caps)
            assert ALPHA * opt <= V[np.arange(12), a].sum() <= opt + 1e-9


def test_heterogeneous_capacities_feasible_and_bounded() -> None:
    rng = np.random.default_rng(7)
    for _ in range(5):
        caps = [int(c) for c in rng.integers(1, 12, size=3)]
        V = random_concave(rng, 6, max(caps))
        opt = milp_optimum(V, caps)
        for method in ("alg1", "alg2", "aanc"):
            place, so = solve(V, caps, method=method)
            check_feasible(place.server, place.amount, caps)
            util = V[np.arange(6), place.amount].sum()
            assert so is not None and so.utility >= opt - 1e-7
            assert util <= opt + 1e-9


# ---------------------------------------------------------------------------------------------------------------------
# curves


def test_pchip_table_matches_scipy() -> None:
    rng = np.random.default_rng(0)
    C = 50
    for K in (2, 3, 5):
        x = np.concatenate([[0.0], np.sort(rng.choice(np.arange(1, C + 1), K - 1, replace=False)).astype(float)])
        y = np.concatenate([[0.0], np.cumsum(rng.uniform(0, 3, K - 1))])
        ours = pchip_table(x[None, :], y[None, :], C)[0]
        grid = np.arange(C + 1)
        ref = np.where(grid <= x[-1], PchipInterpolator(x, y)(np.minimum(grid, x[-1])), y[-1])
        np.testing.assert_allclose(ours, ref, rtol=1e-12, atol=1e-12)


def test_curves_from_points_interpolation_and_concavity() -> None:
    C = 100
    concave_pts = [(0, 0), (50, 8), (100, 10)]
    nonconcave_pts = [(0, 0), (40, 1), (60, 9), (100, 10)]
    fam = curves_from_points([concave_pts, nonconcave_pts], C)
    assert isinstance(fam, TableCurves)
    conc = fam.concave()
    assert conc.tolist() == [True, False]
    ref = PchipInterpolator([0, 50, 100], [0, 8, 10])(np.arange(C + 1))
    np.testing.assert_allclose(fam.values[0], ref, rtol=1e-12)
    # the nonconcave curve is interpolated linearly: value at 50 = midpoint of (40,1),(60,9)
    assert fam.values[1, 50] == pytest.approx(5.0)
    assert fam.segments().tolist() == [1, 2]  # convex on [0, 60], concave (linear) on (60, 100]
    lin = curves_from_points([concave_pts, nonconcave_pts], C, interpolation="linear")
    assert isinstance(lin, PiecewiseLinearCurves)
    assert lin.evaluate(np.array([25, 50]), np.array([0, 1])).tolist() == pytest.approx([4.0, 5.0])
    assert lin.segments().tolist() == [1, 2]
    # a missing origin is added as (0, 0); the curve is flat after its last point
    short = curves_from_points([[(10, 2.0)]], 20, interpolation="linear")
    vals = short.evaluate(np.array([0, 5, 10, 20]), np.zeros(4, dtype=np.int64))
    assert vals.tolist() == pytest.approx([0.0, 1.0, 2.0, 2.0])


def test_parametric_curves_values_and_shape() -> None:
    C = 10
    p = parametric_curves("power", {"weight": 2.0, "beta": np.array([0.5, 1.0, 2.0])}, C)
    assert p.evaluate(np.array([4, 4, 4])).tolist() == pytest.approx([4.0, 8.0, 32.0])
    assert p.concave().tolist() == [True, True, False]
    lg = parametric_curves("log", {"weight": [1.0], "scale": [2.0]}, C)
    assert lg.evaluate(np.array([2]))[0] == pytest.approx(math.log(2.0))
    mn = parametric_curves("min", {"weight": [1.0, 3.0], "cap": [4, 50]}, C)
    assert mn.evaluate(np.array([7, 7])).tolist() == pytest.approx([4.0, 21.0])
    assert mn.concave().all()
    # saturating curves in an AA instance: one server, two threads needing 4 and 6 units
    _, a = assign_and_allocate(parametric_curves("min", {"cap": [4, 6]}, C), [10])
    assert a.tolist() == [4, 6]


def test_segment_count_on_tables() -> None:
    x = np.arange(21, dtype=float)
    concave = np.sqrt(x)
    convex = x**2
    s_shape = np.where(x < 10, x**2, 100 + 20 * (x - 10) - (x - 10) ** 2)  # convex then concave
    three = np.concatenate([np.sqrt(x[:7]), np.sqrt(6) + (x[7:14] - 6) ** 2, 0.0 * x[14:]])
    three[14:] = three[13] + np.sqrt(x[14:] - 13)
    t = TableCurves(np.stack([concave, convex, s_shape, three]))
    assert t.concave().tolist() == [True, False, False, False]
    assert t.segments().tolist() == [1, 1, 2, 3]


# ---------------------------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize(
    ("row", "msg"),
    [
        (np.array([0.0, 2.0, 1.0, 3.0]), "decreasing"),
        (np.array([-1.0, 2.0, 2.0, 3.0]), "negative"),
        (np.array([0.0, np.nan, 2.0, 3.0]), "NaN"),
    ],
)
def test_bad_tables_name_the_thread(row: np.ndarray, msg: str) -> None:
    V = np.tile(np.arange(4, dtype=float), (5, 1))
    V[3] = row
    with pytest.raises(ValueError, match=rf"thread 3.*{msg}"):
        assign_and_allocate(V, [3, 3])


def test_curve_longer_than_capacity_names_the_thread() -> None:
    rows = [np.arange(4.0), np.arange(3.0), np.arange(6.0)]
    with pytest.raises(ValueError, match="thread 2"):
        assign_and_allocate(rows, [3, 2])
    with pytest.raises(ValueError, match="thread 0"):
        assign_and_allocate(np.zeros((2, 8)), [3, 2])
    with pytest.raises(ValueError, match="thread 1"):
        curves_from_points([[(0, 0), (5, 1)], [(0, 0), (50, 1)]], 10)
    fam = curves_from_points([[(0, 0), (5, 1)], [(0, 0), (9, 1)]], 10, interpolation="linear")
    with pytest.raises(ValueError, match="thread 1"):
        assign_and_allocate(fam, [8, 8])


def test_bad_points_and_params_name_the_thread() -> None:
    with pytest.raises(ValueError, match=r"thread 1.*decreasing"):
        curves_from_points([[(0, 0), (5, 1)], [(0, 0), (5, 3), (8, 2)]], 10)
    with pytest.raises(ValueError, match=r"thread 0.*NaN"):
        curves_from_points([[(0, 0), (5, float("nan"))]], 10)
    with pytest.raises(ValueError, match="thread 2"):
        parametric_curves("power", {"beta": [0.5, 0.5, -1.0]}, 10)
    with pytest.raises(ValueError, match="thread 1"):
        PiecewiseLinearCurves(np.array([[0.0, 1.0], [0.0, 2.0]]), np.array([[0.0, 1.0], [3.0, 1.0]]), 5)
    with pytest.raises(ValueError, match="method"):
        assign_and_allocate(np.zeros((2, 3)), [2], method="nope")
    with pytest.raises(ValueError, match="server 1"):
        assign_and_allocate(np.zeros((2, 3)), [2, -1])


# ---------------------------------------------------------------------------------------------------------------------
# baselines


def test_baselines_feasible_and_uu_optimal_at_beta_one() -> None:
    rng = np.random.default_rng(1)
    V = random_concave(rng, 4, 10)
    caps = [10] * 4
    s, a = assign_and_allocate(V, caps, method="uu")
    assert s.tolist() == [0, 1, 2, 3] and a.tolist() == [10] * 4  # one thread per server gets it all
    for kind in ("uu", "ur", "ru", "rr"):
        for how in ("remaining", "proportions"):
            p = baseline(kind, 37, [10, 7, 3], np.random.default_rng(5), random_allocation=how)
            check_feasible(p.server, p.amount, [10, 7, 3])
            if kind[1] == "u" or how == "proportions":
                used = np.bincount(p.server, weights=p.amount, minlength=3)
                occupied = np.bincount(p.server, minlength=3) > 0
                assert (used[occupied] == np.array([10, 7, 3])[occupied]).all()  # every occupied server fully used
    with pytest.raises(ValueError, match="random_allocation"):
        baseline("ur", 4, caps, 0, random_allocation="dirichlet")


def test_random_allocation_hand_computed() -> None:
    """Section VIII's random allocation: each thread, in assignment order, a uniformly random amount of what its
    server still has: ``floor(u * (rest + 1))``. Server 0 (C = 10) holds threads 0, 1, 3: 5 (rest 5), 3 (rest 2),
    2 (rest 0); server 1 (C = 7) holds thread 2 alone: floor(0.25 * 8) = 2 -- not the whole server, as the
    proportions-of-the-server reading would give it."""
    server = np.array([0, 0, 1, 0])
    a = random_split_from_uniforms(server, np.array([10, 7]), np.array([0.5, 0.5, 0.25, 0.99]))
    assert a.tolist() == [5, 3, 2, 2]
    with pytest.raises(ValueError, match="one uniform draw"):
        random_split_from_uniforms(server, np.array([10, 7]), np.array([0.5, 0.5, 1.0, 0.2]))


def test_ur_not_optimal_at_beta_one() -> None:
    """Section VIII: "for beta = 1, UU achieves the optimal utility ... UR does not achieve optimal utility even for
    beta = 1, since it allocates threads random amounts of resources". With one thread per server the earlier
    proportions reading gives every thread its whole server (UR = UU); the paper's reading does not."""
    rng = np.random.default_rng(3)
    V = random_concave(rng, 8, 20)
    caps = [20] * 8
    best = float(V[:, 20].sum())
    uu = baseline("uu", 8, caps, 0)
    assert float(V[np.arange(8), uu.amount].sum()) == best
    prop = baseline("ur", 8, caps, 4, random_allocation="proportions")
    assert prop.amount.tolist() == [20] * 8
    ur = baseline("ur", 8, caps, 4)
    assert (ur.amount <= 20).all() and (ur.amount < 20).any()
    assert float(V[np.arange(8), ur.amount].sum()) < best


@settings(max_examples=40, deadline=None)
@given(
    server=st.lists(st.integers(0, 3), min_size=1, max_size=30),
    caps=st.lists(st.integers(0, 25), min_size=4, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_random_allocation_takes_at_most_what_is_left(server: list[int], caps: list[int], seed: int) -> None:
    s = np.asarray(server)
    c = np.asarray(caps)
    u = np.random.default_rng(seed).uniform(size=s.size)
    a = random_split_from_uniforms(s, c, u)
    rest = c.copy()
    for i in range(s.size):  # sequential reference
        assert 0 <= a[i] == int(np.floor(u[i] * (rest[s[i]] + 1))) <= rest[s[i]]
        rest[s[i]] -= a[i]


# ---------------------------------------------------------------------------------------------------------------------
# compact families at scale


def test_large_piecewise_linear_family_runs_without_dense_table() -> None:
    rng = np.random.default_rng(11)
    n, m, C, K = 5000, 50, 10_000, 8
    gaps = rng.integers(1, C // K, size=(n, K - 1))
    x = np.concatenate([np.zeros((n, 1)), np.cumsum(gaps, axis=1)], axis=1)
    slopes = np.sort(rng.uniform(0, 1, size=(n, K - 1)), axis=1)[:, ::-1]
    y = np.concatenate([np.zeros((n, 1)), np.cumsum(slopes * np.diff(x, axis=1), axis=1)], axis=1)
    fam = PiecewiseLinearCurves(x, y, C)
    place, so = solve(fam, [C] * m)
    check_feasible(place.server, place.amount, [C] * m)
    assert so is not None and so.method == "bisection"
    assert so.amount.sum() == m * C
    util = fam.evaluate(place.amount).sum()
    assert ALPHA * so.utility <= util <= so.utility * (1 + 1e-12)
    # optimality of the bisection: no single-unit move between two threads improves it
    c = so.amount
    up = np.where(c < C, fam.evaluate(np.minimum(c + 1, C)) - fam.evaluate(c), -np.inf)
    down = np.where(c > 0, fam.evaluate(c) - fam.evaluate(np.maximum(c - 1, 0)), np.inf)
    assert up.max() <= down.min() + 1e-9


# ---------------------------------------------------------------------------------------------------------------------
# multiple resources (Section IX)


def brute_force_multi_so(V: np.ndarray, totals: tuple[int, ...]) -> float:
    n, d = V.shape[0], V.ndim - 1
    ranges = [list(itertools.product(*[range(s) for s in V.shape[1:]]))] * n
    best = 0.0
    for combo in itertools.product(*ranges):
        use = np.sum(combo, axis=0)
        if all(use[k] <= totals[k] for k in range(d)):
            best = max(best, sum(V[(i, *combo[i])] for i in range(n)))
    return best


def separable_tables(rng: np.random.Generator, n: int, C1: int, C2: int) -> np.ndarray:
    g = rng.uniform(0, 1, size=(n, 2))
    a = rng.uniform(0, 1, size=(n, 2))
    x1 = np.arange(C1 + 1)[None, :, None]
    x2 = np.arange(C2 + 1)[None, None, :]
    return g[:, 0, None, None] * x1 ** a[:, 0, None, None] + g[:, 1, None, None] * x2 ** a[:, 1, None, None]


def test_dpsopt_matches_brute_force() -> None:
    rng = np.random.default_rng(2)
    V = separable_tables(rng, 3, 3, 2)
    V[1] = np.maximum.accumulate(np.maximum.accumulate(rng.uniform(0, 2, size=(4, 3)), axis=0), axis=1)  # nonconcave
    for totals in ((3, 2), (5, 3), (9, 6), (0, 1)):
        c_hat, F = dpsopt(V, totals)
        assert (c_hat.sum(axis=0) <= np.array(totals)).all()
        assert F == pytest.approx(brute_force_multi_so(V, totals))
        assert F == pytest.approx(V[(np.arange(3), *c_hat.T)].sum())


def test_aamr_feasible_and_near_super_optimal() -> None:
    rng = np.random.default_rng(4)
    m, C = 4, (40, 20)
    V = separable_tables(rng, 12, *C)
    caps = np.tile(C, (m, 1))
    c_hat, F = dpsopt(V, (m * C[0], m * C[1]))
    server, amount = aamr(V, c_hat, caps)
    for k in range(2):
        assert (np.bincount(server, weights=amount[:, k], minlength=m) <= C[k]).all()
    util = V[(np.arange(12), *amount.T)].sum()
    assert util <= F + 1e-9 and util >= 0.8 * F
    s2, a2 = assign_and_allocate_multi(V, caps, refine=False)  # Algorithm 3 as its pseudocode reads
    assert (s2 == server).all() and (a2 == amount).all()
    s3, a3 = assign_and_allocate_multi(V, caps)  # shipped default: the same assignment, each server re-split
    assert (s3 == server).all()
    for k in range(2):
        assert (np.bincount(s3, weights=a3[:, k], minlength=m) <= C[k]).all()
    assert util - 1e-9 <= V[(np.arange(12), *a3.T)].sum() <= F + 1e-9
    for kind in ("uu", "ur", "ru", "rr"):
        s, a = assign_and_allocate_multi(V, caps, method=kind)
        for k in range(2):
            assert (np.bincount(s, weights=a[:, k], minlength=m) <= C[k]).all()


def test_multi_bad_input_names_the_thread() -> None:
    V = np.ones((3, 3, 3))
    V[2, 1, 1] = 0.5
    with pytest.raises(ValueError, match=r"thread 2.*decreases"):
        assign_and_allocate_multi(V, [[2, 2]])
    V = np.ones((3, 3, 3))
    V[1, 0, 0] = np.nan
    with pytest.raises(ValueError, match="thread 1"):
        dpsopt(V, (2, 2))


# ---------------------------------------------------------------------------------------------------------------------
# per-server re-allocation (optional post-step, beyond the paper)


@pytest.mark.parametrize("concave", [True, False])
def test_reallocate_is_per_server_optimal(concave: bool) -> None:
    rng = np.random.default_rng(21 if concave else 22)
    caps = np.array([9, 4, 12, 0])
    n = 11
    V = random_concave(rng, n, 12) if concave else random_nonconcave(rng, n, 12)
    curves = as_curves(V, 12)
    server = rng.integers(0, 4, size=n)
    a = reallocate(curves, server, caps)
    check_feasible(server, a, caps.tolist())
    for j in range(4):
        idx = np.flatnonzero(server == j)
        if idx.size:
            got = V[idx, a[idx]].sum()
            assert got == pytest.approx(single_server_optimum(V[idx], int(caps[j])), rel=1e-9, abs=1e-12)


def test_refine_never_lowers_utility_on_large_family() -> None:
    rng = np.random.default_rng(8)
    n, m, C, K = 3000, 40, 1000, 6
    gaps = rng.uniform(1, C / K, size=(n, K - 1))
    x = np.concatenate([np.zeros((n, 1)), np.cumsum(gaps, axis=1)], axis=1)
    slopes = np.sort(rng.uniform(0, 1, size=(n, K - 1)), axis=1)[:, ::-1]
    y = np.concatenate([np.zeros((n, 1)), np.cumsum(slopes * np.diff(x, axis=1), axis=1)], axis=1)
    fam = PiecewiseLinearCurves(x, y, C)
    plain, so = solve(fam, [C] * m, refine=False)
    refined, _ = solve(fam, [C] * m, refine=True)
    check_feasible(refined.server, refined.amount, [C] * m)
    assert (refined.server == plain.server).all()
    u0, u1 = fam.evaluate(plain.amount).sum(), fam.evaluate(refined.amount).sum()
    assert so is not None and u0 - 1e-9 <= u1 <= so.utility * (1 + 1e-12)
    # per-server optimality of the refined split: no unit move inside a server improves it
    c = refined.amount
    up = np.where(c < C, fam.evaluate(np.minimum(c + 1, C)) - fam.evaluate(c), -np.inf)
    down = np.where(c > 0, fam.evaluate(c) - fam.evaluate(np.maximum(c - 1, 0)), np.inf)
    used = np.bincount(refined.server, weights=c, minlength=m)
    for j in range(m):
        idx = refined.server == j
        if used[j] == C:
            assert up[idx].max() <= down[idx].min() + 1e-9


def test_concat_curves_mixes_kinds_like_a_dense_table() -> None:
    C = 30
    pts = curves_from_points([[(0, 0), (10, 5), (30, 6)], [(0, 0), (5, 1), (20, 8)]], C, interpolation="linear")
    pw = parametric_curves("power", {"weight": [2.0, 1.0], "beta": [0.5, 0.8]}, C)
    lg = parametric_curves("log", {"weight": [3.0], "scale": [4.0]}, 20)  # a formula: extends to the larger capacity
    tab = as_curves(np.array([np.minimum(np.arange(C + 1), 12) * 0.7]), C)
    mixed = concat_curves([pts, pw, lg, tab])
    assert mixed.n == 6 and mixed.capacity == C
    dense = mixed.table()
    assert dense.shape == (6, C + 1)
    np.testing.assert_allclose(dense[2], 2.0 * np.sqrt(np.arange(C + 1)))
    np.testing.assert_allclose(dense[4, 25], 3.0 * np.log1p(25 / 4.0))
    np.testing.assert_allclose(dense[5, 20:], 0.7 * 12)
    assert mixed.concave().tolist() == [True, False, True, True, True, True]
    for caps in ([30, 30], [30, 12, 7]):
        for method in ("alg1", "alg2", "aanc"):
            s1, a1 = assign_and_allocate(mixed, caps, method=method)
            s2, a2 = assign_and_allocate(dense, caps, method=method)
            assert (s1 == s2).all() and (a1 == a2).all()


def test_dp_chunked_over_units_matches_bisection() -> None:
    # C = 3000 makes the DP process its (x, z) candidates in several chunks
    rng = np.random.default_rng(13)
    V = random_concave(rng, 3, 3000)
    curves = as_curves(V, 3000)
    for total in (1, 2500, 5000, 9000):
        d = super_optimal_dp(curves, total)
        b = super_optimal_concave(curves, total)
        assert d.amount.sum() <= total
        assert d.utility == pytest.approx(b.utility, rel=1e-9)


@pytest.mark.parametrize("interpolation", ["linear", "auto"])
def test_clip_cuts_curves_profiled_beyond_the_capacity(interpolation: str) -> None:
    pts = [[(0, 0), (500, 3), (1000, 4)], [(0, 0), (200, 5)], [(0, 0), (600, 2), (900, 3)]]
    with pytest.raises(ValueError, match="thread 0"):
        curves_from_points(pts, 600, interpolation=interpolation)
    cut = curves_from_points(pts, 600, interpolation=interpolation, clip=True)
    full = curves_from_points(pts, 1000, interpolation=interpolation)
    assert cut.capacity == 600
    np.testing.assert_allclose(cut.table(), full.table()[:, :601], rtol=1e-12, atol=1e-12)
    s, a = assign_and_allocate(cut, [600, 600])
    check_feasible(s, a, [600, 600])
