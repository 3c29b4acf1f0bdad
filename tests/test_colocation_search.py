"""Tests for the exact DP, the multi-start search and the ``"auto"`` route table of allocator.colocation (issue 19).

References are independent of the code under test: brute force over all ``m ** n`` assignments (eq. (1) task by
task), and costs worked out by hand in the docstrings.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.colocation import (
    LIMITS_METHODS,
    METHODS,
    ROUTES,
    InfeasibleError,
    PowerCost,
    partition,
    solve,
    total_cost,
)
from allocator.colocation._search_kernel import _index, _pair, local_search

EXAMPLE = (np.ones(4), np.array([0, 1, 1, 0]), np.array([[1.0, 0.5], [0.5, 1.0]]), 2)


def brute(p, t, alpha, m, f=None, dem=None, cap=None, max_tasks=None) -> float:
    """Least cost over all assignments (eq. (1): c_i = sum_{j same machine} p_j alpha[t_j, t_i]); inf if none fits."""
    p = np.asarray(p, float)
    t = np.asarray(t)
    alpha = np.asarray(alpha, float)
    A = np.array(list(itertools.product(range(m), repeat=len(p))), dtype=np.int64).reshape(-1, len(p))
    same = A[:, :, None] == A[:, None, :]
    infl = p[None, :] * alpha[t[None, :], t[:, None]]
    c = np.sum(same * infl[None], axis=2)
    if f is not None:
        c = f(c)
    costs = c.sum(axis=1)
    ok = np.ones(A.shape[0], dtype=bool)
    if cap is not None:
        d = np.asarray(dem if dem is not None else p, float)
        load = np.stack([np.sum(np.where(A == k, d, 0.0), axis=1) for k in range(m)], axis=1)
        ok &= np.all(load <= np.asarray(cap, float) + 1e-9, axis=1)
    if max_tasks is not None:
        cnt = np.stack([np.sum(A == k, axis=1) for k in range(m)], axis=1)
        ok &= np.all(cnt <= np.asarray(max_tasks), axis=1)
    return float(costs[ok].min()) if np.any(ok) else float("inf")


def tiny(max_n=7, max_m=3, max_t=3, zeros=True):
    """Instances with integer sizes and alpha in {0, 0.25, ..., 1} (zeros included) or in [0, 1]."""
    alpha_entry = st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]) if zeros else st.floats(0.05, 1.0)
    return st.integers(1, max_n).flatmap(
        lambda n: st.integers(1, max_t).flatmap(
            lambda T: st.tuples(
                st.lists(st.integers(1, 6), min_size=n, max_size=n),
                st.lists(st.integers(0, T - 1), min_size=n, max_size=n),
                st.lists(st.lists(alpha_entry, min_size=T, max_size=T), min_size=T, max_size=T),
                st.integers(1, max_m),
            )
        )
    )


def unpack(inst):
    p, t, a, m = inst
    return np.array(p, float), np.array(t), np.array(a, float), m


# ------------------------------------------------------------------ the issue's example


def test_issue_example_costs_six():
    """Four unit tasks, types 0 1 1 0, alpha [[1, .5], [.5, 1]], two machines. Dedicated machines: every task has its
    twin next to it, cost 4 * 2 = 8. Mixed (one of each type per machine): each task 1 + 0.5, cost 4 * 1.5 = 6."""
    p, t, a, m = EXAMPLE
    assert solve(p, t, a, m, method="bestors+hill").cost == pytest.approx(8.0)  # the paper's HILL stays at 8
    for method in ("auto", "search", "exact"):
        r = solve(p, t, a, m, method=method)
        assert r.cost == pytest.approx(6.0)
        assert set(np.bincount(t[r.assignment == 0], minlength=2)) == {1}
    assert total_cost(p, t, a, partition(p, t, a, m), n_machines=m) == pytest.approx(6.0)


# ------------------------------------------------------------------ kernel moves: swap and plateau


def _kernel_state(p, t, a, assign, m):
    n, T = len(p), a.shape[0]
    L = np.zeros((m, T))
    N = np.zeros((m, T))
    np.add.at(L, (assign, t), p)
    np.add.at(N, (assign, t), 1.0)
    E, G = L @ a, N @ a.T
    mc = np.sum(E * N, axis=1)
    order, mstart = np.empty(n, np.int64), np.empty(m + 1, np.int64)
    lo, hi = np.empty((m, T), np.int64), np.empty((m, T), np.int64)
    _index(assign, t, p, m, T, order, mstart, lo, hi)
    D = np.zeros(m)
    C = np.bincount(assign, minlength=m).astype(float)
    return E, G, N, mc, D, C, order, mstart, lo, hi


def test_swap_is_the_only_improving_step_of_the_example():
    """From the dedicated partition (cost 8), every single move costs 8 (e.g. a type-0 task to the type-1 machine:
    1 + (1 + .5 + .5) + 2 * (1 + 1 + .5) = 8), and a swap of a type-0 and a type-1 task gives the mixed partition
    (6): the pair's best step is that swap with delta -2."""
    p, t, a, m = EXAMPLE
    t = t.astype(np.int64)
    assign = np.array([0, 1, 1, 0], dtype=np.int64)
    E, G, N, mc, D, C, order, mstart, lo, hi = _kernel_state(p, t, a, assign, m)
    res = np.empty(4)
    inf = np.full(m, np.inf)
    tabu = np.zeros(4, np.int64)
    evals = _pair(
        0,
        1,
        p,
        t,
        np.zeros(4),
        E,
        G,
        N,
        mc,
        D,
        C,
        inf,
        inf,
        a,
        0,
        1.0,
        False,
        order,
        mstart,
        lo,
        hi,
        tabu,
        0,
        False,
        res,
    )
    assert evals > 0
    delta, i, j = res[0], int(res[1]), int(res[2])
    assert delta == pytest.approx(-2.0)
    assert j >= 0 and t[i] != t[j]  # a swap of two tasks of different types
    # with the tabu list holding both type-0 tasks, no step that moves them is offered
    tabu[[0, 3]] = 5
    _pair(
        0,
        1,
        p,
        t,
        np.zeros(4),
        E,
        G,
        N,
        mc,
        D,
        C,
        inf,
        inf,
        a,
        0,
        1.0,
        False,
        order,
        mstart,
        lo,
        hi,
        tabu,
        1,
        True,
        res,
    )
    assert int(res[1]) not in (0, 3) and int(res[2]) not in (0, 3)


def test_swap_with_power_cost_matches_recomputed_cost():
    """The kernel's swap delta under ``f(x) = x**2`` equals the difference of the costs recomputed from scratch."""
    rng = np.random.default_rng(4)
    p = rng.integers(1, 9, 9).astype(float)
    t = rng.integers(0, 3, 9).astype(np.int64)
    a = rng.random((3, 3))
    assign = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2], dtype=np.int64)
    E, G, N, mc, D, C, order, mstart, lo, hi = _kernel_state(p, t, a, assign, 3)
    mc = np.sum(N * E**2, axis=1)
    res = np.empty(4)
    inf = np.full(3, np.inf)
    _pair(
        0,
        1,
        p,
        t,
        np.zeros(9),
        E,
        G,
        N,
        mc,
        D,
        C,
        inf,
        inf,
        a,
        1,
        2.0,
        False,
        order,
        mstart,
        lo,
        hi,
        np.zeros(9, np.int64),
        0,
        False,
        res,
    )
    i, j, dst = int(res[1]), int(res[2]), int(res[3])
    after = assign.copy()
    if j >= 0:
        after[i], after[j] = assign[j], assign[i]
    else:
        after[i] = dst
    sq = PowerCost(2.0)
    before_cost = total_cost(p, t, a, assign, cost=sq, n_machines=3)
    assert res[0] == pytest.approx(total_cost(p, t, a, after, cost=sq, n_machines=3) - before_cost, abs=1e-9)


def test_plateau_step_leaves_a_point_without_improving_move_or_swap():
    """One type, alpha = 0.5, sizes 1 1 1 2 3 3 on two machines, start {1, 2, 3} | {1, 1, 3} (loads 6 and 5, three
    tasks each: 0.5 * (3 * 6 + 3 * 5) = 16.5). Every swap keeps three tasks per machine and every move gives 16.5 or
    more; the optimum {3, 3} | {1, 1, 1, 2} costs 0.5 * (2 * 6 + 4 * 5) = 16. Without plateau steps the kernel stays
    at 16.5; with them it reaches 16."""
    p = np.array([1.0, 1.0, 1.0, 2.0, 3.0, 3.0])
    t = np.zeros(6, dtype=np.int64)
    a = np.array([[0.5]])
    start = np.array([1, 0, 1, 0, 0, 1], dtype=np.int64)
    assert total_cost(p, t, a, start, n_machines=2) == pytest.approx(16.5)
    assert brute(p, t, a, 2) == pytest.approx(16.0)
    inf = np.full(2, np.inf)
    out = np.zeros(3, np.int64)
    stuck = local_search(p, t, np.zeros(6), start.copy(), a, 2, 0, 1.0, False, inf, inf, 10**6, 0, 7, out)
    assert total_cost(p, t, a, stuck, n_machines=2) == pytest.approx(16.5)
    assert out[2] == 0
    free = local_search(p, t, np.zeros(6), start.copy(), a, 2, 0, 1.0, False, inf, inf, 10**6, 50, 7, out)
    assert total_cost(p, t, a, free, n_machines=2) == pytest.approx(16.0)
    assert out[2] >= 1  # it took plateau steps
    assert out[0] <= 10**6


def test_plateau_steps_end_without_improvement():
    """On a plateau with no exit (identical tasks, already optimal) the tabu list and the plateau budget stop the
    search after at most ``plateau`` zero-gain steps."""
    p = np.ones(6)
    t = np.array([0, 0, 0, 1, 1, 1], dtype=np.int64)
    a = np.array([[1.0, 1.0], [1.0, 1.0]])
    start = np.array([0, 0, 0, 1, 1, 1], dtype=np.int64)
    inf = np.full(2, np.inf)
    out = np.zeros(3, np.int64)
    best = local_search(p, t, np.zeros(6), start.copy(), a, 2, 0, 1.0, False, inf, inf, 10**9, 5, 2, out)
    assert out[2] <= 6
    assert total_cost(p, t, a, best, n_machines=2) == pytest.approx(brute(p, t, a, 2))


# ------------------------------------------------------------------ exact route against brute force


@settings(max_examples=60, deadline=None)
@given(tiny())
def test_exact_dp_equals_brute_force(inst):
    p, t, a, m = unpack(inst)
    r = solve(p, t, a, m, method="exact")
    assert r.route == "exact-dp" and r.status == "certified" and r.complete
    assert r.cost == pytest.approx(brute(p, t, a, m), abs=1e-9)
    assert total_cost(p, t, a, r.assignment, n_machines=m) == pytest.approx(r.cost)


@settings(max_examples=30, deadline=None)
@given(tiny(max_n=6), st.sampled_from([1.5, 2.0, 3.0]))
def test_exact_dp_equals_brute_force_convex(inst, k):
    p, t, a, m = unpack(inst)
    f = PowerCost(k)
    r = solve(p, t, a, m, method="exact", cost=f)
    assert r.status == "certified"
    assert r.cost == pytest.approx(brute(p, t, a, m, f=f), rel=1e-9, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(
    tiny(max_n=6),
    st.lists(st.integers(1, 4), min_size=3, max_size=3),
    st.lists(st.integers(3, 14), min_size=3, max_size=3),
)
def test_exact_dp_with_limits_equals_brute_force(inst, mt, cap):
    p, t, a, m = unpack(inst)
    mt, cap = mt[:m], cap[:m]
    ref = brute(p, t, a, m, cap=cap, max_tasks=mt)
    if not np.isfinite(ref):
        with pytest.raises(InfeasibleError):
            solve(p, t, a, m, method="exact", capacity=cap, max_tasks=mt)
        return
    r = solve(p, t, a, m, method="exact", capacity=cap, max_tasks=mt)
    assert r.cost == pytest.approx(ref, abs=1e-9)
    assert np.all(np.bincount(r.assignment, minlength=m) <= mt)
    assert np.all(np.bincount(r.assignment, weights=p, minlength=m) <= np.array(cap) + 1e-9)


def test_exact_proves_infeasibility_the_obvious_checks_miss():
    """Three tasks of demand 2 on two machines of capacity 3: total 6 <= 6 and every task fits alone, but any
    machine with two tasks holds 4 > 3."""
    with pytest.raises(InfeasibleError, match="exact DP"):
        solve([2, 2, 2], [0, 0, 0], [[1.0]], 2, method="exact", capacity=3)
    with pytest.raises(InfeasibleError, match="exact DP"):
        solve([2, 2, 2], [0, 0, 0], [[1.0]], 2, capacity=3)


def test_exact_refuses_above_its_limit():
    p = np.arange(1.0, 13.0)
    with pytest.raises(ValueError, match="exact_limit"):
        solve(p, np.zeros(12, int), [[1.0]], 4, method="exact", exact_limit=1000)


# ------------------------------------------------------------------ zero interference


def test_zero_interference_matrix_costs_nothing():
    p = np.array([3.0, 1.0, 4.0, 1.0, 5.0])
    t = np.array([0, 1, 1, 0, 1])
    for method in ("auto", "search", "exact"):
        r = solve(p, t, np.zeros((2, 2)), 2, method=method)
        assert r.cost == 0.0


def test_zero_cross_interference_separates_types():
    """alpha = [[0, 1], [1, 0]]: a task is only hurt by the other type, so dedicated machines cost 0."""
    p = np.array([2.0, 3.0, 1.0, 4.0, 2.0, 5.0, 1.0])
    t = np.array([0, 1, 0, 1, 0, 1, 1])
    a = np.array([[0.0, 1.0], [1.0, 0.0]])
    for method in ("auto", "search", "exact"):
        r = solve(p, t, a, 2, method=method, exact_limit=None if method != "search" else 0)
        assert r.cost == 0.0
        assert all(np.unique(t[r.assignment == k]).size <= 1 for k in range(2))


def test_zero_self_interference_hill_is_far_from_optimum():
    """Sizes 3 1 1 1 1, types 1 1 1 0 0, alpha = [[.5, .5], [1, 0]] (type 1 does not hurt type 1), two machines.
    Optimum 2: the type-1 tasks together cost 0, the two type-0 tasks together cost 2 * (0.5 + 0.5). BestOrS puts
    the 3 alone and the four 1s together (8); HILL stops at 7.5, 3.75 times the optimum."""
    p = np.array([3.0, 1.0, 1.0, 1.0, 1.0])
    t = np.array([1, 1, 1, 0, 0])
    a = np.array([[0.5, 0.5], [1.0, 0.0]])
    assert brute(p, t, a, 2) == pytest.approx(2.0)
    assert solve(p, t, a, 2, method="bestors+hill").cost >= 7.5 - 1e-9
    for method in ("auto", "search"):
        assert solve(p, t, a, 2, method=method, exact_limit=0 if method == "search" else None).cost == 2.0


@settings(max_examples=60, deadline=None)
@given(tiny(max_n=7, max_m=3, max_t=3, zeros=True))
def test_search_reaches_brute_force_optimum_with_zeros(inst):
    """The search alone (no exact route) on tiny instances with zeros in alpha: within 5 % of the optimum and exact
    where the optimum is 0 (the issue's 6.7x came from such matrices)."""
    p, t, a, m = unpack(inst)
    ref = brute(p, t, a, m)
    r = solve(p, t, a, m, method="search")
    assert r.route == "search" and r.status == "heuristic"
    if ref == 0:
        assert r.cost == 0
    else:
        assert r.cost <= 1.05 * ref + 1e-9


# ------------------------------------------------------------------ properties of the search


@settings(max_examples=50, deadline=None)
@given(tiny(max_n=8, max_m=4, zeros=False), st.sampled_from([None, 2.0]))
def test_search_never_worse_than_bestors_or_hill(inst, k):
    p, t, a, m = unpack(inst)
    f = None if k is None else PowerCost(k)
    r = solve(p, t, a, m, method="search", cost=f)
    assert r.cost <= solve(p, t, a, m, method="bestors", cost=f).cost + 1e-9
    assert r.cost <= solve(p, t, a, m, method="bestors+hill", cost=f).cost * (1 + 1e-12) + 1e-9
    assert r.cost >= brute(p, t, a, m, f=f) - 1e-9
    auto = solve(p, t, a, m, cost=f)
    assert auto.cost <= r.cost + 1e-9


@settings(max_examples=50, deadline=None)
@given(
    tiny(max_n=8, max_m=3),
    st.lists(st.integers(2, 5), min_size=3, max_size=3),
    st.lists(st.integers(6, 20), min_size=3, max_size=3),
    st.booleans(),
)
def test_search_respects_hard_limits(inst, mt, cap, own_demands):
    p, t, a, m = unpack(inst)
    mt, cap = mt[:m], cap[:m]
    dem = np.arange(len(p)) % 3 + 1.0 if own_demands else p
    kw = {"capacity": cap, "max_tasks": mt, "demands": dem}
    try:
        r = solve(p, t, a, m, method="search", exact_limit=0, **kw)
    except InfeasibleError:
        return  # heuristics may fail to find a feasible partition (documented); feasibility is checked below
    assert np.all(np.bincount(r.assignment, minlength=m) <= mt)
    assert np.all(np.bincount(r.assignment, weights=dem, minlength=m) <= np.array(cap, float) + 1e-9)
    try:
        hill = solve(p, t, a, m, method="bestors+hill", **kw)
    except InfeasibleError:
        return
    assert r.cost <= hill.cost * (1 + 1e-12) + 1e-9


def test_search_is_deterministic_and_seeded():
    rng = np.random.default_rng(8)
    p = rng.integers(1, 30, 80).astype(float)
    t = rng.integers(0, 3, 80)
    a = rng.random((3, 3))
    r1 = solve(p, t, a, 7, method="search")
    r2 = solve(p, t, a, 7, method="search")
    assert np.array_equal(r1.assignment, r2.assignment)
    assert r1.starts == 32
    small = solve(p, t, a, 7, method="search", budget=2000)
    assert small.cost <= solve(p, t, a, 7, method="bestors").cost + 1e-9
    assert small.starts < r1.starts
    assert (r1.status, small.status) == ("heuristic", "capped")
    assert small.evaluations >= 2000 and r1.evaluations < 1_500_000


def test_unbinding_limits_give_the_same_search():
    rng = np.random.default_rng(11)
    p = rng.integers(1, 20, 60).astype(float)
    t = rng.integers(0, 4, 60)
    a = rng.random((4, 4)) + 0.1
    free = solve(p, t, a, 6, method="search")
    loose = solve(p, t, a, 6, method="search", capacity=1e9, max_tasks=1000)
    assert np.array_equal(free.assignment, loose.assignment)


# ------------------------------------------------------------------ route table of "auto"


def test_auto_routes():
    p, t, a, m = EXAMPLE
    r = solve(p, t, a, m)
    assert (r.method, r.route, r.status) == ("auto", "exact-dp", "certified")
    r = solve(p, t, a, m, exact_limit=0)
    assert (r.route, r.status) == ("search", "heuristic") and r.cost == pytest.approx(6.0)

    def softplus_sq(x: np.ndarray) -> np.ndarray:  # increasing, convex, not a PowerCost
        return np.asarray(x, float) ** 2 + np.asarray(x, float)

    r = solve(p, t, a, m, cost=softplus_sq, exact_limit=0)
    assert (r.route, r.status) == ("bestors+hill", "heuristic")
    r = solve(p, t, a, m, cost=softplus_sq)
    assert r.route == "exact-dp"
    assert r.cost == pytest.approx(brute(p, t, a, m, f=softplus_sq))
    assert set(ROUTES) == {"exact-dp", "search", "bestors+hill"}


def test_route_is_taken_by_size():
    """A 40-task instance is beyond the default exact limit: the search route answers, with a heuristic status."""
    rng = np.random.default_rng(2)
    p = rng.integers(1, 50, 40).astype(float)
    t = rng.integers(0, 3, 40)
    r = solve(p, t, rng.random((3, 3)), 5)
    assert (r.route, r.status, r.complete) == ("search", "heuristic", False)
    assert r.starts >= 1 and r.moves >= 0


def test_limits_methods_constant():
    p, t, a, m = EXAMPLE
    for method in METHODS:
        if method in LIMITS_METHODS:
            x = partition(p, t, a, m, method=method, capacity=3, max_tasks=2)
            assert np.all(np.bincount(x, minlength=m) <= 2)
        else:
            with pytest.raises(ValueError, match="supported by"):
                partition(p, t, a, m, method=method, capacity=3)
    assert {"bestors+hill", "one+hill", "dedic+hill", "auto"} <= set(LIMITS_METHODS)


def test_status_of_the_other_methods():
    p, t, a, m = EXAMPLE
    assert solve(p, t, a, m, method="dynsize").status == "certified"
    assert solve(p, t, a, m, method="bestors").status == "heuristic"
    assert solve(p, t, a, m, method="bestors+hill").route == "bestors+hill"
    assert solve(p, t, a, m, method="bestors+hill").status == "heuristic"
    assert solve(p, t, a, m, method="one+hill", budget=3).status == "capped"
    with pytest.raises(ValueError, match="starts"):
        solve(p, t, a, m, starts=0)
