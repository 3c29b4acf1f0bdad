"""Heterogeneous node capacities for allocator.aa (issue 19, paper 000 extended beyond its Section III model).

References independent of the code under test: exhaustive enumeration of every (server, amount) choice of every
thread on tiny instances, and the HiGHS MILP (:func:`allocator.aa.exact_optimum`), itself checked against the
enumeration here and against a dense textbook MILP written separately in this file."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import Bounds, LinearConstraint, milp

from allocator.aa import (
    TableCurves,
    assign_and_allocate,
    exact_optimum,
    local_search,
    reallocate,
    search_route,
    solve,
)
from allocator.aa import search as search_mod
from bench.aa import concave_tables, nonconcave_tables, uniform_sampler

# ---------------------------------------------------------------------------------------------------------------------
# references


def brute_force_optimum(V: np.ndarray, caps: list[int]) -> float:
    """Enumerate every thread's (server, amount) option jointly (vectorised over all combinations) and keep the best
    feasible total. For ``n <= 4`` threads, ``m <= 3`` servers, capacities ``<= 5``."""
    n = V.shape[0]
    opts = [(j, c) for j in range(len(caps)) for c in range(caps[j] + 1)]
    k = len(opts)
    srv = np.array([o[0] for o in opts])
    amt = np.array([o[1] for o in opts])
    combos = np.indices((k,) * n).reshape(n, -1)  # (n, k^n)
    util = sum(V[i, amt[combos[i]]] for i in range(n))
    ok = np.ones(combos.shape[1], dtype=bool)
    for j, C in enumerate(caps):
        used = sum(np.where(srv[combos[i]] == j, amt[combos[i]], 0) for i in range(n))
        ok &= used <= C
    return float(np.max(np.where(ok, util, -np.inf)))


def dense_milp_optimum(V: np.ndarray, caps: list[int]) -> float:
    """Textbook MILP, written independently of exact_optimum: binary x[i, j, c] for every c = 0..C_j (no pruning),
    each thread exactly one option, dense matrices."""
    n = V.shape[0]
    cols = [(i, j, c) for i in range(n) for j in range(len(caps)) for c in range(caps[j] + 1)]
    A1 = np.zeros((n, len(cols)))
    A2 = np.zeros((len(caps), len(cols)))
    for k, (i, j, c) in enumerate(cols):
        A1[i, k] = 1
        A2[j, k] = c
    res = milp(
        np.array([-V[i, c] for i, _, c in cols]),
        constraints=[LinearConstraint(A1, 1, 1), LinearConstraint(A2, -np.inf, np.array(caps, dtype=float))],
        integrality=np.ones(len(cols)),
        bounds=Bounds(0, 1),
    )
    assert res.status == 0, res.message
    return float(-res.fun)


def utility(V: np.ndarray, amount: np.ndarray) -> float:
    return float(V[np.arange(V.shape[0]), amount].sum())


def check_feasible(server: np.ndarray, amount: np.ndarray, caps: list[int]) -> None:
    assert server.dtype.kind == "i" and amount.dtype.kind == "i"
    assert ((server >= 0) & (server < len(caps))).all() and (amount >= 0).all()
    assert (np.bincount(server, weights=amount, minlength=len(caps)) <= np.asarray(caps)).all()


def random_table(rng: np.random.Generator, n: int, C: int, concave: bool) -> np.ndarray:
    if concave:
        marg = np.sort(rng.exponential(size=(n, C)), axis=1)[:, ::-1] * rng.uniform(0.1, 3.0, size=(n, 1))
    else:
        marg = rng.exponential(size=(n, C)) * (rng.random((n, C)) < 0.5)
    return np.concatenate([np.zeros((n, 1)), np.cumsum(marg, axis=1)], axis=1)


def hetero_family(seed: int, count: int, concave: bool) -> list[tuple[np.ndarray, list[int]]]:
    """The bench's heterogeneous family (bench/aa.py): m in 2..4 servers with C_j in 4..20, n in m+1..10 threads,
    Section VIII's PCHIP curves (concave, or two concave pieces) with H uniform."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        m = int(rng.integers(2, 5))
        caps = [int(c) for c in rng.integers(4, 21, size=m)]
        n = int(rng.integers(m + 1, 11))
        make = concave_tables if concave else nonconcave_tables
        out.append((make(rng, n, max(caps), uniform_sampler), caps))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# the exact reference is exact


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 4),
    caps=st.lists(st.integers(0, 5), min_size=1, max_size=3),
    concave=st.booleans(),
)
def test_milp_equals_brute_force_and_nothing_beats_it(seed: int, n: int, caps: list[int], concave: bool) -> None:
    C = max(caps)
    V = random_table(np.random.default_rng(seed), n, C, concave)
    if seed % 3 == 0:
        V = V + 0.5  # positive utility at zero units
    ex = exact_optimum(V, caps)
    assert ex.status == "certified"
    check_feasible(ex.server, ex.amount, caps)
    bf = brute_force_optimum(V, caps)
    assert ex.utility == pytest.approx(bf, rel=1e-9, abs=1e-12)
    assert ex.utility == pytest.approx(utility(V, ex.amount), rel=1e-12, abs=1e-12)
    for method in ("alg1", "alg2", "aanc", "uu", "rr"):
        for kw in ({"refine": False, "search": False}, {"refine": True, "search": False}, {"search": True}):
            s, a = assign_and_allocate(V, caps, method=method, **kw)
            check_feasible(s, a, caps)
            assert utility(V, a) <= bf + 1e-9 * max(1.0, bf)


@pytest.mark.parametrize("seed", range(3))
def test_milp_matches_dense_textbook_milp_on_bench_sizes(seed: int) -> None:
    for V, caps in hetero_family(500 + seed, 3, concave=seed != 1):
        ex = exact_optimum(V, caps)
        assert ex.status == "certified" and ex.bound >= ex.utility - 1e-9
        assert ex.utility == pytest.approx(dense_milp_optimum(V, caps), rel=1e-8)


def test_milp_rejects_bad_capacities_and_large_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    V = random_table(np.random.default_rng(0), 3, 4, True)
    with pytest.raises(ValueError, match="capacities"):
        exact_optimum(V, [4, -1])
    with pytest.raises(ValueError, match="capacities"):
        exact_optimum(V, [[4, 4]])
    from allocator.aa import exact as exact_mod

    monkeypatch.setattr(exact_mod, "MILP_MAX_COLUMNS", 10)
    with pytest.raises(ValueError, match="binaries"):
        exact_optimum(V, [4, 4])


def test_milp_with_flat_curves_needs_no_binaries() -> None:
    V = np.full((3, 5), 2.0)
    ex = exact_optimum(V, [4, 2])
    assert ex.status == "certified" and ex.columns == 0 and ex.utility == 6.0


# ---------------------------------------------------------------------------------------------------------------------
# the target: within 5 % of the MILP on a seeded heterogeneous family


@pytest.mark.parametrize("concave", [True, False])
def test_shipped_within_five_percent_of_milp_on_heterogeneous_family(concave: bool) -> None:
    ratios = []
    for V, caps in hetero_family(2024 if concave else 2025, 30, concave):
        opt = exact_optimum(V, caps)
        assert opt.status == "certified"
        s, a = assign_and_allocate(V, caps, method="alg2" if concave else "aanc")
        check_feasible(s, a, caps)
        ratios.append(utility(V, a) / opt.utility)
    assert max(ratios) <= 1 + 1e-9
    assert min(ratios) >= 0.95  # the goal
    # measured on these families: worst 0.993 (concave) and 0.991 (nonconcave); without the search (the paper's
    # assignment + re-split) 0.964 and 0.847, so this bound fails without it on both
    assert min(ratios) >= 0.98
    assert float(np.mean(ratios)) >= 0.99


def test_without_search_the_family_misses_the_target() -> None:
    # the same family as above (nonconcave) with the paper's algorithm + re-split only: below 0.95 somewhere
    worst = min(
        utility(V, assign_and_allocate(V, caps, method="aanc", search=False)[1]) / exact_optimum(V, caps).utility
        for V, caps in hetero_family(2025, 30, concave=False)
    )
    assert worst < 0.95


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    caps=st.lists(st.integers(1, 12), min_size=2, max_size=4),
    n=st.integers(1, 9),
    concave=st.booleans(),
)
def test_search_never_lowers_utility_and_never_beats_milp(seed: int, caps: list[int], n: int, concave: bool) -> None:
    V = random_table(np.random.default_rng(seed), n, max(caps), concave)
    opt = exact_optimum(V, caps)
    assert opt.status == "certified"
    for method in ("alg1", "alg2", "aanc"):
        _, a0 = assign_and_allocate(V, caps, method=method, search=False)
        p, _ = solve(V, caps, method=method, search=True)
        check_feasible(p.server, p.amount, caps)
        u0, u1 = utility(V, a0), utility(V, p.amount)
        assert u1 >= u0 - 1e-9 * max(1.0, u0)
        assert u1 <= opt.utility + 1e-9 * max(1.0, opt.utility)
        assert p.search is not None and p.search.status in ("converged", "capped")
        assert p.search.after == pytest.approx(u1, rel=1e-9, abs=1e-9)


# ---------------------------------------------------------------------------------------------------------------------
# local search: a true local optimum, and every route


def node_optimum(V: np.ndarray, cap: int) -> float:
    """Best split of ``cap`` units among the rows of ``V`` by enumeration (rows <= 4, cap <= 6)."""
    if V.shape[0] == 0:
        return 0.0
    best = 0.0
    for z in itertools.product(range(cap + 1), repeat=V.shape[0]):
        if sum(z) <= cap:
            best = max(best, float(V[np.arange(V.shape[0]), z].sum()))
    return best


def assignment_value(V: np.ndarray, g: np.ndarray, caps: list[int]) -> float:
    return sum(node_optimum(V[g == j], caps[j]) for j in range(len(caps)))


@pytest.mark.parametrize("seed", range(6))
def test_converged_search_has_no_improving_relocate_or_swap(seed: int) -> None:
    rng = np.random.default_rng(seed)
    caps = [int(c) for c in rng.integers(2, 7, size=3)]
    V = random_table(rng, 5, max(caps), concave=seed % 2 == 0)
    start = rng.integers(0, 3, size=5)
    res = local_search(TableCurves(V), start, caps)
    assert res.status == "converged" and res.route == "relocate+swap"
    assert res.before == pytest.approx(assignment_value(V, start, caps), rel=1e-9)
    g = res.server
    here = assignment_value(V, g, caps)
    assert res.after == pytest.approx(here, rel=1e-9)
    for i in range(5):
        for b in range(3):
            if b != g[i]:
                h = g.copy()
                h[i] = b
                assert assignment_value(V, h, caps) <= here + 1e-9
        for k in range(5):
            if g[k] != g[i]:
                h = g.copy()
                h[i], h[k] = g[k], g[i]
                assert assignment_value(V, h, caps) <= here + 1e-9


def test_search_route_table() -> None:
    limit = search_mod.SEARCH_MAX_WORK
    assert search_route(10, 3, 21) == "relocate+swap"
    assert search_route(10, 1, 21) == "none"  # one server: nothing to move
    n = int(np.sqrt(limit / 11)) + 50  # n^2 W over the limit, n m W and n W^2 within
    assert n * n * 11 > limit and n * 4 * 11 <= limit
    assert search_route(n, 4, 11) == "relocate"
    assert search_route(n, limit // (n * 11) + 1, 11) == "none"
    assert search_route(10, 3, int(np.sqrt(limit / 10)) + 2) == "none"  # convolutions too large


def test_relocate_route_and_skipped_route() -> None:
    # two servers of 6 and 2 units; the paper's rule puts the steep short thread on the large server
    V = np.array([[0, 1, 2, 3, 4, 5, 6], [0, 3, 3, 3, 3, 3, 3], [0, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5]], dtype=float)
    caps = [6, 2]
    cur = TableCurves(V)
    start = np.array([1, 0, 0])  # the long thread on the small server
    for route in ("relocate", "relocate+swap"):
        res = local_search(cur, start, caps, route=route)
        assert res.route == route and res.status == "converged"
        assert res.after == pytest.approx(brute_force_optimum(V, caps))
    skipped = local_search(cur, start, caps, route="none")
    assert skipped.status == "skipped" and (skipped.server == start).all() and skipped.moves == 0
    capped = local_search(cur, start, caps, max_moves=0)
    assert capped.status == "capped" and capped.moves == 0
    with pytest.raises(ValueError, match="route"):
        local_search(cur, start, caps, route="bogus")
    with pytest.raises(ValueError, match="server"):
        local_search(cur, np.array([0, 0, 5]), caps)


def test_search_argument_routes() -> None:
    V = random_table(np.random.default_rng(3), 6, 8, concave=False)
    p, _ = solve(V, [8, 8, 8], method="aanc")  # equal capacities: "auto" keeps the paper's assignment
    assert p.search is None
    p, _ = solve(V, [8, 5, 3], method="aanc")  # unequal: "auto" searches
    assert p.search is not None and p.search.route == "relocate+swap"
    p, _ = solve(V, [8, 8, 8], method="aanc", search=True)
    assert p.search is not None
    p, _ = solve(V, [8, 5, 3], method="aanc", refine=False)  # paper-literal: never searched
    assert p.search is None
    with pytest.raises(ValueError, match="refine"):
        solve(V, [8, 5, 3], refine=False, search=True)
    with pytest.raises(ValueError, match="search"):
        solve(V, [8, 5, 3], search="yes")


def test_large_heterogeneous_family_skips_search_and_stays_feasible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search_mod, "SEARCH_MAX_WORK", 1000)
    V = random_table(np.random.default_rng(4), 40, 30, concave=True)
    caps = [30, 20, 10, 25]
    p, _ = solve(V, caps)
    assert p.search is not None and p.search.status == "skipped"
    check_feasible(p.server, p.amount, caps)
    best_split = reallocate(TableCurves(V), p.server, caps)
    assert utility(V, p.amount) == pytest.approx(utility(V, best_split), rel=1e-12)


def test_milp_status_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    """HiGHS's outcomes map to the result's status: proven optimum -> certified; limit reached with a point ->
    capped (the dual bound reported as the upper bound); limit reached without a point, or a failure -> error."""
    from allocator.aa import exact as exact_mod

    V = random_table(np.random.default_rng(9), 4, 6, False)
    caps = [6, 3]
    real = exact_mod.milp
    full = exact_optimum(V, caps)
    assert full.status == "certified" and full.bound == pytest.approx(full.utility, rel=1e-9)

    def limited(*args: object, **kwargs: object) -> object:
        res = real(*args, **kwargs)
        res.status = 1
        res.mip_dual_bound = res.fun - 1.0  # a looser dual bound, as HiGHS reports when stopped early
        return res

    monkeypatch.setattr(exact_mod, "milp", limited)
    capped = exact_optimum(V, caps, time_limit=5.0)
    assert capped.status == "capped"
    assert capped.utility == pytest.approx(full.utility, rel=1e-9)
    assert capped.bound == pytest.approx(full.utility + 1.0, rel=1e-9)

    def no_point(*args: object, **kwargs: object) -> object:
        res = real(*args, **kwargs)
        res.status, res.x = 1, None
        return res

    monkeypatch.setattr(exact_mod, "milp", no_point)
    with pytest.raises(RuntimeError, match="no feasible point"):
        exact_optimum(V, caps)

    def failed(*args: object, **kwargs: object) -> object:
        res = real(*args, **kwargs)
        res.status = 4
        return res

    monkeypatch.setattr(exact_mod, "milp", failed)
    with pytest.raises(RuntimeError, match="HiGHS failed"):
        exact_optimum(V, caps)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    caps=st.lists(st.integers(0, 9), min_size=2, max_size=4),
    n=st.integers(1, 12),
)
def test_concave_value_functions_match_the_convolutions(seed: int, caps: list[int], n: int) -> None:
    # the greedy (sorted marginals) per-server values used for concave curves equal the exact max-plus convolutions
    rng = np.random.default_rng(seed)
    T = random_table(rng, n, max(max(caps), 1), concave=True) + rng.uniform(0, 1, size=(n, 1))
    g = rng.integers(0, len(caps), size=n)
    F1, L1 = search_mod._server_functions(T, g, len(caps))
    F2, L2 = search_mod._server_functions_concave(T, g, len(caps))
    np.testing.assert_allclose(F2, F1, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(L2, L1, rtol=1e-12, atol=1e-12)
