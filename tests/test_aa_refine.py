"""Tests for the per-node re-split that Walras runs after the paper's algorithms (``refine=True``, the default of
``allocator.aa.assign_and_allocate`` and ``assign_and_allocate_multi``): it keeps the algorithm's assignment, stays
feasible, never lowers the utility, and is the optimal split of every node for that assignment. References are
independent of the code under test: brute-force enumeration of every split, and HiGHS MILP (scipy.optimize.milp)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import Bounds, LinearConstraint, milp
from test_aa import random_concave, random_nonconcave

import allocator.aa.multi as multi
from allocator.aa import (
    aamr,
    as_curves,
    assign_and_allocate,
    assign_and_allocate_multi,
    dpsopt,
    reallocate,
    reallocate_dp,
    reallocate_multi,
    solve,
)

# ---------------------------------------------------------------------------------------------------------------------
# references


def brute_node_optimum(V: np.ndarray, cap: tuple[int, ...]) -> float:
    """Best split of one node's ``cap`` (one entry per resource type) among the threads of ``V`` (shape
    ``(k, C_1+1, ..., C_d+1)``) by enumerating every feasible amount vector of every thread (depth first, each
    thread choosing among the vectors that fit what the threads before it left)."""
    k = V.shape[0]
    boxes = [list(itertools.product(*[range(min(s - 1, c) + 1) for s, c in zip(V.shape[1:], cap)]))]

    def best(i: int, rest: tuple[int, ...]) -> float:
        if i == k:
            return 0.0
        return max(
            float(V[(i, *z)]) + best(i + 1, tuple(r - q for r, q in zip(rest, z)))
            for z in boxes[0]
            if all(q <= r for q, r in zip(z, rest))
        )

    return best(0, tuple(cap))


def milp_node_optimum(V: np.ndarray, cap: int) -> float:
    """One node, one resource: binary ``x[i, c]`` = thread ``i`` gets ``c`` units; sum_c c x <= cap (HiGHS)."""
    k, W = V.shape
    if k == 0:
        return 0.0
    obj = -V.reshape(-1)
    A1 = np.kron(np.eye(k), np.ones(W))
    A2 = np.tile(np.arange(W, dtype=float), k)[None, :]
    res = milp(
        obj,
        constraints=[LinearConstraint(A1, 1, 1), LinearConstraint(A2, -np.inf, cap)],
        integrality=np.ones(k * W),
        bounds=Bounds(0, 1),
    )
    assert res.status == 0, res.message
    return float(-res.fun)


def fixed_assignment_optimum(V: np.ndarray, server: np.ndarray, caps: list[int]) -> float:
    return sum(milp_node_optimum(V[server == j], caps[j]) for j in range(len(caps)))


def random_tables(rng: np.random.Generator, n: int, shape: tuple[int, ...]) -> np.ndarray:
    """Random nondecreasing (generally nonconcave) ``d``-dimensional tables, ``V[i, 0, ..., 0] = 0``."""
    V = rng.exponential(size=(n, *shape)) * (rng.random((n, *shape)) < 0.6)
    V.reshape(n, -1)[:, 0] = 0.0
    for ax in range(1, V.ndim):
        V = np.cumsum(V, axis=ax)
    return V


def feasible(server: np.ndarray, amount: np.ndarray, caps: np.ndarray) -> bool:
    a = amount.reshape(amount.shape[0], -1)
    c = np.asarray(caps).reshape(len(caps), -1)
    used = np.stack([np.bincount(server, weights=a[:, t], minlength=c.shape[0]) for t in range(a.shape[1])], axis=1)
    return bool((a >= 0).all() and (used <= c).all())


# ---------------------------------------------------------------------------------------------------------------------
# a hand-computed instance where the paper's Algorithm 2 leaves a unit idle


def test_refine_hands_out_the_unit_algorithm2_leaves() -> None:
    """m = 2, C = 4; f0 = 3 min(x, 3), f1 = 2 min(x, 3) + 0.5 max(x - 3, 0), f2 = min(x, 2). The super-optimal split
    of 8 units takes the 8 best marginals 3, 3, 3, 2, 2, 2, 1, 1: c_hat = (3, 3, 2), g_hat = (9, 6, 2). Algorithm 2:
    t0 -> s0 (3 units, rest (1, 4)), t1 -> s1 (3, rest (1, 1)), t2 -> s0 (tie, lowest index; min(2, 1) = 1 unit,
    rest (0, 1)): utility 9 + 6 + 1 = 16 with s1's last unit idle although t1 gains 0.5 from it. The re-split gives
    it to t1: amounts (3, 4, 1), utility 16.5."""
    x = np.arange(5, dtype=float)
    V = np.stack([3 * np.minimum(x, 3), 2 * np.minimum(x, 3) + 0.5 * np.maximum(x - 3, 0), np.minimum(x, 2)])
    s0, a0 = assign_and_allocate(V, [4, 4], refine=False)
    assert s0.tolist() == [0, 1, 0] and a0.tolist() == [3, 3, 1]
    assert V[np.arange(3), a0].sum() == pytest.approx(16.0)
    s1, a1 = assign_and_allocate(V, [4, 4])  # default: refine=True
    assert s1.tolist() == [0, 1, 0] and a1.tolist() == [3, 4, 1]
    assert V[np.arange(3), a1].sum() == pytest.approx(16.5)
    # the trace of solve() is the paper's loop either way; only the amounts differ
    p0, _ = solve(V, [4, 4], trace=True, refine=False)
    p1, _ = solve(V, [4, 4], trace=True)
    assert p0.steps == p1.steps and [st.amount for st in p1.steps] == [3, 3, 1]
    # baselines ignore refine
    for kind in ("uu", "ur", "ru", "rr"):
        sb0, ab0 = assign_and_allocate(V, [4, 4], method=kind, refine=False)
        sb1, ab1 = assign_and_allocate(V, [4, 4], method=kind)
        assert (sb0 == sb1).all() and (ab0 == ab1).all()


# ---------------------------------------------------------------------------------------------------------------------
# one resource: property tests against the literal algorithms and the MILP optimum for the fixed assignment


@st.composite
def instances(draw: st.DrawFn, concave: bool) -> tuple[np.ndarray, list[int]]:
    seed = draw(st.integers(0, 2**31 - 1))
    m = draw(st.integers(1, 4))
    n = draw(st.integers(1, 10))
    equal = draw(st.booleans())
    rng = np.random.default_rng(seed)
    if equal:
        caps = [int(rng.integers(1, 13))] * m
    else:
        caps = [int(c) for c in rng.integers(0, 13, size=m)]
        caps[0] = max(caps[0], 1)
    C = max(caps)
    V = random_concave(rng, n, C) if concave else random_nonconcave(rng, n, C)
    return V, caps


def check_refine(V: np.ndarray, caps: list[int], methods: tuple[str, ...]) -> None:
    n = V.shape[0]
    for method in methods:
        s0, a0 = assign_and_allocate(V, caps, method=method, refine=False)
        s1, a1 = assign_and_allocate(V, caps, method=method, refine=True, search=False)
        assert (s1 == s0).all()  # same server assignment
        assert feasible(s1, a1, np.asarray(caps))
        u0, u1 = V[np.arange(n), a0].sum(), V[np.arange(n), a1].sum()
        assert u1 >= u0 - 1e-12 * max(1.0, u0)  # never lower
        for j in range(len(caps)):  # per node, never lower either
            on = s1 == j
            assert V[on, a1[on]].sum() >= V[on, a0[on]].sum() - 1e-12 * max(1.0, u0)
        opt = fixed_assignment_optimum(V, s1, caps)
        assert u1 == pytest.approx(opt, rel=1e-9, abs=1e-9)  # optimal for the fixed assignment


@settings(max_examples=40, deadline=None)
@given(instances(concave=True))
def test_refine_concave_never_lower_and_optimal_for_the_assignment(inst: tuple[np.ndarray, list[int]]) -> None:
    V, caps = inst
    check_refine(V, caps, ("alg1", "alg2", "aanc"))


@settings(max_examples=40, deadline=None)
@given(instances(concave=False))
def test_refine_nonconcave_never_lower_and_optimal_for_the_assignment(inst: tuple[np.ndarray, list[int]]) -> None:
    V, caps = inst
    check_refine(V, caps, ("alg1", "alg2", "aanc"))


@pytest.mark.parametrize("seed", range(4))
def test_reallocate_dp_matches_brute_force(seed: int) -> None:
    """Any assignment (not only the algorithms'), unequal capacities, a node of capacity 0, an empty node, and curves
    defined up to a larger C than some nodes have."""
    rng = np.random.default_rng(seed)
    caps = [5, 0, 3, 6, 2]
    n = 9
    V = random_nonconcave(rng, n, 6)
    server = rng.integers(0, 4, size=n)  # node 4 stays empty
    a = reallocate_dp(V, server, caps)
    assert feasible(server, a, np.asarray(caps))
    for j, c in enumerate(caps):
        on = server == j
        assert V[on, a[on]].sum() == pytest.approx(brute_node_optimum(V[on], (c,)), rel=1e-12, abs=1e-12)
    # the public reallocate takes the same DP for nonconcave curves
    assert (reallocate(as_curves(V, 6), server, caps) == a).all()


def test_reallocate_dp_bench_size_matches_milp() -> None:
    """Section VIII's size (m = 8, C = 100, n = 40 nonconcave curves): the vectorised DP against HiGHS node by node."""
    rng = np.random.default_rng(5)
    m, C, n = 8, 100, 40
    V = random_nonconcave(rng, n, C)
    server = rng.integers(0, m, size=n)
    a = reallocate_dp(V, server, [C] * m)
    assert feasible(server, a, np.full(m, C))
    for j in range(m):
        on = server == j
        assert V[on, a[on]].sum() == pytest.approx(milp_node_optimum(V[on], C), rel=1e-9)


def test_reallocate_current_validation_and_keep() -> None:
    rng = np.random.default_rng(9)
    V = random_concave(rng, 4, 5)
    curves = as_curves(V, 5)
    server = np.array([0, 0, 1, 1])
    with pytest.raises(ValueError, match="server 0"):
        reallocate(curves, server, [5, 5], current=[3, 3, 0, 0])
    with pytest.raises(ValueError, match="current"):
        reallocate(curves, server, [5, 5], current=[1, 1, 1])
    cur = np.array([2, 1, 0, 5])
    a = reallocate(curves, server, [5, 5], current=cur)
    for j in (0, 1):
        on = server == j
        assert V[on, a[on]].sum() >= V[on, cur[on]].sum()
        assert V[on, a[on]].sum() == pytest.approx(brute_node_optimum(V[on], (5,)), rel=1e-12)
    with pytest.raises(ValueError, match="server index"):
        reallocate_dp(V, [0, 0, 1, 2], [5, 5])


# ---------------------------------------------------------------------------------------------------------------------
# d resources (AAMR, Section IX)


@pytest.mark.parametrize("dense", [True, False])
@pytest.mark.parametrize("shape", [(4,), (4, 3), (3, 2, 2)])
def test_reallocate_multi_matches_brute_force(
    monkeypatch: pytest.MonkeyPatch, dense: bool, shape: tuple[int, ...]
) -> None:
    """Both code paths (the dense G x G difference table, and dpsopt per node) against enumeration, on unequal
    node capacities with a zero entry."""
    if not dense:
        monkeypatch.setattr(multi, "REFINE_DENSE_MAX", 0)
    rng = np.random.default_rng(len(shape) + 10 * dense)
    d = len(shape)
    full = tuple(s - 1 for s in shape)
    caps = np.array([full, tuple(max(c - 1, 0) for c in full), (0,) * (d - 1) + (full[-1],), full])
    n = 7
    V = random_tables(rng, n, shape)
    server = rng.integers(0, 4, size=n)
    a = reallocate_multi(V, server, caps)
    assert a.shape == (n, d) and feasible(server, a, caps)
    for j in range(4):
        on = server == j
        got = V[(np.flatnonzero(on), *a[on].T)].sum()
        assert got == pytest.approx(brute_node_optimum(V[on], tuple(int(c) for c in caps[j])), rel=1e-12, abs=1e-12)


@st.composite
def multi_instances(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    seed = draw(st.integers(0, 2**31 - 1))
    m = draw(st.integers(1, 3))
    n = draw(st.integers(1, 6))
    C1, C2 = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    rng = np.random.default_rng(seed)
    return random_tables(rng, n, (C1 + 1, C2 + 1)), np.tile([C1, C2], (m, 1))


@settings(max_examples=30, deadline=None)
@given(multi_instances())
def test_aamr_refine_never_lower_and_optimal_for_the_assignment(inst: tuple[np.ndarray, np.ndarray]) -> None:
    V, caps = inst
    n = V.shape[0]
    s0, a0 = assign_and_allocate_multi(V, caps, refine=False)
    c_hat, _ = dpsopt(V, caps.sum(axis=0))
    sl, al = aamr(V, c_hat, caps)
    assert (s0 == sl).all() and (a0 == al).all()  # refine=False is Algorithm 3 as written
    s1, a1 = assign_and_allocate_multi(V, caps)
    assert (s1 == s0).all()
    assert feasible(s1, a1, caps)
    rows = np.arange(n)
    u0, u1 = V[(rows, *a0.T)].sum(), V[(rows, *a1.T)].sum()
    assert u1 >= u0 - 1e-12 * max(1.0, u0)
    opt = sum(brute_node_optimum(V[s1 == j], tuple(int(c) for c in caps[j])) for j in range(caps.shape[0]))
    assert u1 == pytest.approx(opt, rel=1e-12, abs=1e-12)


def test_reallocate_multi_section_ix_size_keeps_the_better_split() -> None:
    """Section IX's size (m = 4, C = (40, 20), 20 threads): the refined split is feasible, per node at least
    Algorithm 3's, and per node at least as good as a random feasible split."""
    rng = np.random.default_rng(3)
    m, C, n = 4, (40, 20), 20
    g = rng.uniform(0, 1, size=(n, 2))
    al = rng.uniform(0, 1, size=(n, 2))
    x1 = np.arange(C[0] + 1)[None, :, None].astype(float)
    x2 = np.arange(C[1] + 1)[None, None, :].astype(float)
    V = g[:, 0, None, None] * x1 ** al[:, 0, None, None] + g[:, 1, None, None] * x2 ** al[:, 1, None, None]
    caps = np.tile(C, (m, 1))
    s0, a0 = assign_and_allocate_multi(V, caps, refine=False)
    a1 = reallocate_multi(V, s0, caps, current=a0)
    assert feasible(s0, a1, caps)
    rows = np.arange(n)
    u0 = np.bincount(s0, weights=V[(rows, *a0.T)], minlength=m)
    u1 = np.bincount(s0, weights=V[(rows, *a1.T)], minlength=m)
    assert (u1 >= u0 - 1e-12).all()
    for _ in range(20):  # random splits that use every unit of each node
        ar = np.zeros_like(a0)
        for j in range(m):
            on = np.flatnonzero(s0 == j)
            for t in range(2):
                cut = np.sort(rng.integers(0, C[t] + 1, size=on.size - 1)) if on.size else np.array([], dtype=int)
                ar[on, t] = np.diff(np.concatenate([[0], cut, [C[t]]]))
        ur = np.bincount(s0, weights=V[(rows, *ar.T)], minlength=m)
        assert (u1 >= ur - 1e-12).all()
    with pytest.raises(ValueError, match="server 0"):
        reallocate_multi(V, s0, caps, current=np.full((n, 2), 20))
