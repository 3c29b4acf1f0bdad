"""Tests of allocator.degree (paper 003): model validation, Algorithm 1 by hand, Theorem 4.4 against an exact MILP,
the valid approximation, MDGT, the Kubernetes pool rule, the heuristics and LCBC's worst case."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import Bounds, LinearConstraint, milp

from allocator.degree import (
    OnlineBestConnection,
    OnlineSeq,
    as_instance,
    connections,
    lcbc,
    lcls,
    mdgt,
    min_extra_degree,
    obc,
    plan_pool,
    seq,
    seq_left,
    seq_sparse,
    valid_seq,
    validate_allocation,
)
from allocator.degree._engine import run_sweep


def sweep(vals, ids, caps, dpar, tol, *, left):
    """Per-server allocations ``[(ids, amounts), ...]`` and the list left, from the compiled sweep."""
    rec, left_vals, left_ids = run_sweep(vals, ids, caps, dpar, tol, left=left)
    return [rec.served(j) for j in range(len(caps))], left_vals, left_ids


TOL = 1e-7


def milp_opt(demands, capacities, degrees) -> float:
    """Exact MTBD optimum (constraints (1)-(3)) by HiGHS: w_ij continuous, y_ij binary, w_ij <= min(w_i, b_j) y_ij."""
    w = np.asarray(demands, float)
    b = np.asarray(capacities, float)
    d = np.asarray(degrees, float)
    n, m = w.size, b.size
    nv = 2 * n * m  # [w_00..w_nm, y_00..y_nm], row-major (i, j)
    c = np.zeros(nv)
    c[: n * m] = -1.0
    rows, lo, hi = [], [], []

    def wi(i, j):
        return i * m + j

    def yi(i, j):
        return n * m + i * m + j

    for j in range(m):  # (1) capacity and (2) degree
        r = np.zeros(nv)
        r[[wi(i, j) for i in range(n)]] = 1
        rows.append(r), lo.append(-np.inf), hi.append(b[j])
        r = np.zeros(nv)
        r[[yi(i, j) for i in range(n)]] = 1
        rows.append(r), lo.append(-np.inf), hi.append(d[j])
    for i in range(n):  # (3) demand
        r = np.zeros(nv)
        r[[wi(i, j) for j in range(m)]] = 1
        rows.append(r), lo.append(-np.inf), hi.append(w[i])
    for i in range(n):  # linking
        for j in range(m):
            r = np.zeros(nv)
            r[wi(i, j)] = 1
            r[yi(i, j)] = -min(w[i], b[j])
            rows.append(r), lo.append(-np.inf), hi.append(0.0)
    integrality = np.r_[np.zeros(n * m), np.ones(n * m)]
    ub = np.r_[np.full(n * m, np.inf), np.ones(n * m)]
    res = milp(
        c,
        constraints=LinearConstraint(np.array(rows), lo, hi),
        integrality=integrality,
        bounds=Bounds(np.zeros(nv), ub),
        options={"mip_rel_gap": 0.0},
    )
    assert res.success, res.message
    return -float(res.fun)


def check_valid(w, demands, capacities, degrees, extra):
    rep = validate_allocation(w, demands, capacities, degrees, tol=1e-9)
    assert rep.capacity_excess <= TOL and rep.demand_excess <= TOL and rep.negative >= -TOL, rep
    assert rep.degree_excess <= extra, rep


# ---------------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("dem", "cap", "deg", "match"),
    [
        ([1.0, -1.0], [2.0], [1], r"demands\[1\]"),
        ([1.0], [2.0, -0.5], [1, 1], r"capacities\[1\]"),
        ([1.0], [2.0, 1.0], [1, 0], r"degrees\[1\]"),
        ([1.0], [2.0], [1.5], r"degrees\[0\]"),
        ([1.0], [2.0, 1.0], [1], "degrees"),
        ([np.nan], [2.0], [1], r"demands\[0\]"),
    ],
)
def test_bad_input_raises(dem, cap, deg, match):
    for fn in (seq, seq_left, valid_seq, lcls, lcbc, obc, plan_pool):
        with pytest.raises(ValueError, match=match):
            fn(dem, cap, deg)
    if match.startswith(("capac", "degree")) and len(cap) == len(deg):
        with pytest.raises(ValueError, match=match):
            OnlineSeq(cap, deg)
        with pytest.raises(ValueError, match=match):
            OnlineBestConnection(cap, deg)


def test_bad_extra_degree_and_online_demand():
    with pytest.raises(ValueError, match="extra_degree"):
        seq([1.0], [1.0], [1], extra_degree=-1)
    on = OnlineSeq([1.0], [1])
    with pytest.raises(ValueError, match="demand"):
        on.add("a", -1.0)
    on.add("a", 1.0)
    with pytest.raises(ValueError, match="already"):
        on.add("a", 1.0)
    with pytest.raises(ValueError, match="not present"):
        on.remove("b")


def test_validate_allocation_detects_each_constraint():
    dem, cap, deg = [3.0, 3.0], [4.0], [1]
    assert validate_allocation(np.array([[3.0], [1.0]]), dem, cap, deg).degree_excess == 1
    assert validate_allocation(np.array([[3.0], [2.0]]), dem, cap, deg).capacity_excess == pytest.approx(1.0)
    assert validate_allocation(np.array([[4.0], [0.0]]), dem, [5.0], deg).demand_excess == pytest.approx(1.0)
    assert validate_allocation(np.array([[3.0], [0.0]]), dem, cap, deg).ok(1e-9)


# ------------------------------------------------------------------------------------------ Algorithm 1 by hand
def test_case1_rightmost_interval_by_hand():
    # b = 10, d = 2 (extra_degree=1 -> Algorithm 1 with d_j = 2): windows of 2: 3,5,7,9,11 -> l at (4,5);
    # LC(4,6) = 15 >= 10, so 4 and 5 are served fully and 6 gives 1; remainder 5 keeps its place.
    w = seq([1, 2, 3, 4, 5, 6], [10.0], [2])
    np.testing.assert_allclose(w[:, 0], [0, 0, 0, 4, 5, 1])


def test_case2_smallest_prefix_by_hand():
    w = seq([3.0, 1.0, 2.0], [2.0], [2])  # LC(1, 2) = 1 + 2 >= 2: serve 1 and 1 of the 2
    np.testing.assert_allclose(w[:, 0], [0, 1, 1])


def test_case3_largest_clients_by_hand():
    w = seq([1, 2, 3, 4, 5, 6], [100.0], [2])  # 4 + 5 + 6 < 100: serve the 2 largest only
    np.testing.assert_allclose(w[:, 0], [0, 0, 0, 0, 5, 6])


def test_seq_left_by_hand_and_reinsertion():
    # leftmost window of 3 reaching 10: (3, 4, 5) -> 3, 4 fully, 3 of the 5; remainder 2 re-inserted before 3.
    w = seq_left([1, 2, 3, 4, 5, 6], [10.0, 3.0], [2, 1])
    np.testing.assert_allclose(w[:, 0], [0, 0, 3, 4, 3, 0])
    # second server (b = 3, d = 1) sees the sorted list [1, 2, 2(rem of 5), 6]: leftmost window of 2 >= 3 is (1, 2)
    np.testing.assert_allclose(w[:, 1], [1, 2, 0, 0, 0, 0])


def test_sequential_servers_keep_list_sorted():
    # after server 1 takes (4, 5, 1 of 6) the list is [1, 2, 3, 5]; server 2 (b=6, d=1): every single client is
    # below 6, so the rightmost interval is the last one, (3, 5): 3 fully and 3 of the 5 (client 5); the remainder
    # 2 is re-inserted at its sorted place (right end of the list, no interval [l+1, l+d+1] exists).
    w = seq([1, 2, 3, 4, 5, 6], [10.0, 6.0], [2, 1])
    np.testing.assert_allclose(w[:, 1], [0, 0, 3, 0, 0, 3])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.01, 100.0), min_size=1, max_size=40),
    st.lists(st.tuples(st.floats(0.0, 300.0), st.integers(0, 6)), min_size=1, max_size=8),
    st.booleans(),
)
def test_sweep_keeps_list_sorted_and_conserves(vals, servers, left):
    vals = np.sort(np.asarray(vals))
    ids = np.arange(vals.size, dtype=np.int64)
    caps = np.array([s[0] for s in servers])
    dpar = np.array([s[1] for s in servers], dtype=np.int64)
    served, left_vals, _ = sweep(vals, ids, caps, dpar, 1e-12, left=left)
    assert np.all(np.diff(left_vals) >= 0.0)  # still sorted after every server
    given_out = sum(a.sum() for _, a in served)
    assert given_out + left_vals.sum() == pytest.approx(vals.sum(), rel=1e-9)
    for j, (a_ids, a_amt) in enumerate(served):
        assert a_amt.sum() <= caps[j] + 1e-9
        assert a_ids.size <= dpar[j] + 1
        assert np.all(a_amt > 0)


def reference_algorithm_1(vals, caps, dpar, left, tol, ids=None):
    """Algorithm 1 on a plain Python list of ``(value, id)``, written from Section IV-A and VI-C without prefix sums
    or buffers: the independent reference for the in-place sweep of ``_engine``. The starting list is sorted by
    ``(value, id)``; a remainder takes the split client's place (ordering property) or, where it is re-inserted,
    goes after the clients of equal value. ``ids`` defaults to ``0 .. n-1``."""
    ids = range(len(vals)) if ids is None else ids
    L = sorted((float(v), int(i)) for v, i in zip(vals, ids))
    out = []

    def take_prefix(L, b):
        k, acc = 0, 0.0
        while acc < b and k < len(L):
            acc += L[k][0]
            k += 1
        k = max(k, 1)
        served = L[:k]
        rem = sum(v for v, _ in served) - b
        if rem <= tol:
            return served, L[k:]
        part = b - sum(v for v, _ in served[:-1])
        cid = served[-1][1]
        served = served[:-1] + ([(part, cid)] if part > tol else [])
        return served, [(rem, cid), *L[k:]]

    for b, D in zip(caps, dpar):
        b, D = float(b), int(D)
        r = len(L)
        if b <= tol or r == 0:
            out.append([])
        elif r <= D:  # short list: everything, or the smallest clients up to b
            if sum(v for v, _ in L) < b:
                out.append(L)
                L = []
            else:
                served, L = take_prefix(L, b)
                out.append(served)
        elif sum(v for v, _ in L[r - D - 1 :]) < b:  # case 3
            out.append(L[r - D :])
            L = L[: r - D]
        elif D >= 1 and sum(v for v, _ in L[:D]) >= b:  # case 2
            served, L = take_prefix(L, b)
            out.append(served)
        else:  # case 1
            starts = range(r - D)
            if left:
                l = min(s for s in starts if sum(v for v, _ in L[s : s + D + 1]) >= b)
            else:
                l = max(s for s in starts if sum(v for v, _ in L[s : s + D]) < b)
            inner = sum(v for v, _ in L[l : l + D])
            last, cid = L[l + D]
            rem = inner + last - b
            served = L[l : l + D + 1]
            if rem <= tol:
                out.append(served)
                L = L[:l] + L[l + D + 1 :]
                continue
            if b - inner <= tol:
                served, rem = served[:-1], last
            else:
                served = [*served[:-1], (b - inner, cid)]
            out.append(served)
            if not left and l + D + 1 < r:  # ordering property: the remainder keeps its place
                L = [*L[:l], (rem, cid), *L[l + D + 1 :]]
            else:  # re-inserted among the clients left of the interval
                pos = 0
                while pos < l and L[pos][0] <= rem:  # after the clients of equal value
                    pos += 1
                L = [*L[:pos], (rem, cid), *L[pos:l], *L[l + D + 1 :]]
    return out, L


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(1, 64), min_size=25, max_size=80),
    st.lists(st.tuples(st.integers(0, 160), st.integers(0, 6)), min_size=1, max_size=16),
    st.booleans(),
    st.sampled_from([1.0, 0.125]),
    st.randoms(use_true_random=False),
)
def test_in_place_sweep_equals_plain_list_algorithm_1(vals, servers, left, unit, rnd):
    """Every branch of the in-place sweep (prefix or suffix moved, exact fills, right-end and SEQLEFT re-insertion,
    cases 2, 3 and short lists) against the plain-list reference; dyadic values keep all sums exact, so the two must
    agree to the last bit, ties included (clients by id, then remainders after them). Client ids are shuffled so that
    the order of equal values is not the order of the input."""
    vals = np.asarray(vals, dtype=float) * unit
    caps = np.array([s[0] for s in servers], dtype=float) * unit
    dpar = np.array([s[1] for s in servers], dtype=np.int64)
    ids = np.arange(vals.size, dtype=np.int64)
    rnd.shuffle(ids)
    order = np.lexsort((ids, vals))
    served, left_vals, left_ids = sweep(vals[order], ids[order], caps, dpar, 1e-12, left=left)
    expect, rest = reference_algorithm_1(vals, caps, dpar, left, 1e-12, ids)
    got = [list(zip(a.tolist(), i.tolist())) for i, a in served]
    assert got == [[(v, c) for v, c in srv] for srv in expect]
    assert list(zip(left_vals.tolist(), left_ids.tolist())) == rest


# ----------------------------------------------------------------------------- Theorem 4.4 and Section IV-C
instances = st.integers(1, 3).flatmap(
    lambda m: st.tuples(
        st.lists(st.integers(1, 30).map(float), min_size=1, max_size=6),
        st.lists(st.integers(1, 40).map(float), min_size=m, max_size=m),
        st.lists(st.integers(1, 3), min_size=m, max_size=m),
    )
)
# larger, real-valued instances (ties are rare here; the integer ones above are full of ties)
float_instances = st.integers(1, 4).flatmap(
    lambda m: st.tuples(
        st.lists(st.floats(0.1, 50.0), min_size=1, max_size=8),
        st.lists(st.floats(0.1, 80.0), min_size=m, max_size=m),
        st.lists(st.integers(1, 4), min_size=m, max_size=m),
    )
)


@settings(max_examples=150, deadline=None)
@given(st.one_of(instances, float_instances))
def test_theorem_4_4_seq_beats_exact_optimum(inst):
    dem, cap, deg = inst
    opt = milp_opt(dem, cap, deg)
    w = seq(dem, cap, deg)
    check_valid(w, dem, cap, deg, extra=1)
    assert w.sum() >= opt - 1e-6
    # the valid version (Section IV-C): at most d_j connections and ratio d_min / (d_min + 1)
    v = valid_seq(dem, cap, deg)
    check_valid(v, dem, cap, deg, extra=0)
    assert v.sum() <= opt + 1e-6
    assert v.sum() >= min(deg) / (min(deg) + 1) * opt - 1e-6
    # the pool rule: hard limit respected, at least the optimum with one pod fewer, and the IV-C ratio
    p = plan_pool(dem, cap, deg)
    check_valid(p, dem, cap, deg, extra=0)
    assert p.sum() >= v.sum() - 1e-9
    if min(deg) >= 2:
        assert p.sum() >= milp_opt(dem, cap, np.asarray(deg) - 1) - 1e-6
    q = plan_pool(dem, cap, deg, extra_pod_allowed=True)
    check_valid(q, dem, cap, deg, extra=1)
    assert q.sum() >= opt - 1e-6


def test_valid_ratio_is_reached_on_a_tight_instance():
    # one server, b = 3, d = 2, three clients of 1: SEQ serves all three (3 connections) and the valid version
    # drops one: exactly d / (d + 1) of SEQ, and here also of the optimum (which is 2).
    v = valid_seq([1.0, 1.0, 1.0], [3.0], [2])
    assert v.sum() == pytest.approx(2.0)
    assert milp_opt([1.0, 1.0, 1.0], [3.0], [2]) == pytest.approx(2.0)
    assert seq([1.0, 1.0, 1.0], [3.0], [2]).sum() == pytest.approx(3.0)


@settings(max_examples=15, deadline=None)
@given(instances)
def test_mdgt_dichotomic_search(inst):
    dem, cap, deg = inst
    bound = min(sum(dem), sum(cap))
    a = mdgt(dem, cap, deg, bound)
    # brute force over a: the first a reaching the bound
    first = next(k for k in range(0, len(dem) + 2) if seq(dem, cap, deg, extra_degree=k).sum() >= bound - 1e-9)
    assert a == first
    # alpha_SEQ <= alpha* + 1, alpha* being the optimal augmentation of a valid solution (exact MILP)
    alpha_star = next(k for k in range(0, len(dem) + 1) if milp_opt(dem, cap, np.asarray(deg) + k) >= bound - 1e-6)
    assert a <= alpha_star + 1
    with pytest.raises(ValueError, match="exceeds"):
        mdgt(dem, cap, deg, bound + 1.0)


def test_min_extra_degree_for_heuristics_and_monotone_seq():
    rng = np.random.default_rng(3)
    dem = rng.pareto(1.09, 60) + 1
    cap = rng.pareto(1.09, 6) + 1
    cap *= dem.sum() / cap.sum()
    deg = np.maximum(1, np.round(cap / cap.sum() * 60)).astype(int)
    thr = [seq(dem, cap, deg, extra_degree=k).sum() for k in range(0, 12)]
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(thr))
    bound = min(dem.sum(), cap.sum())
    for alg in (seq, lcbc, lcls):
        a = min_extra_degree(alg, dem, cap, deg)
        assert alg(dem, cap, deg, extra_degree=a).sum() >= bound * (1 - 1e-9)
        if a > 0:
            assert alg(dem, cap, deg, extra_degree=a - 1).sum() < bound * (1 - 1e-9)


def test_plan_pool_degree_one_and_extra_pod():
    # max_pods = 1: SEQ with degree 0 gives each node a single job; the rule must never exceed 1 pod per node
    dem, cap = [5.0, 4.0, 3.0], [4.0, 4.0]
    w = plan_pool(dem, cap, [1, 1])
    assert connections(w, 1e-12).max() <= 1
    assert w.sum() == pytest.approx(milp_opt(dem, cap, [1, 1]))
    w2 = plan_pool(dem, cap, [1, 1], extra_pod_allowed=True)
    assert connections(w2, 1e-12).max() <= 2
    assert w2.sum() >= milp_opt(dem, cap, [1, 1]) - 1e-9


def test_seq_sparse_matches_dense_and_zero_inputs():
    dem = [0.0, 2.0, 5.0, 1.0]
    cap = [0.0, 3.0, 4.0]
    deg = [1, 1, 2]
    sp = seq_sparse(dem, cap, deg)
    np.testing.assert_allclose(sp.to_dense(), seq(dem, cap, deg))
    assert sp.throughput == pytest.approx(seq(dem, cap, deg).sum())
    assert not np.any(seq(dem, cap, deg)[0])  # zero demand never served
    assert not np.any(seq(dem, cap, deg)[:, 0])  # zero capacity serves nothing
    assert seq([], [1.0], [1]).shape == (0, 1)
    assert as_instance([], [], []).m == 0


# ------------------------------------------------------------------------------------------- heuristics
@settings(max_examples=30, deadline=None)
@given(instances, st.integers(0, 2))
def test_heuristics_are_valid_with_their_augmentation(inst, extra):
    dem, cap, deg = inst
    opt = milp_opt(dem, cap, np.asarray(deg) + extra)
    for alg in (lcls, lcbc, obc, seq_left):
        w = alg(dem, cap, deg, extra_degree=extra)
        check_valid(w, dem, cap, deg, extra=extra)
        assert w.sum() <= opt + 1e-6


def test_lcls_and_lcbc_by_hand():
    # clients 6, 3, 2; servers (b=5, d=1), (b=8, d=2) with extra_degree=0
    # LCLS: 6 -> server 1 (largest b'=8) gets 6, b'=2; 3 -> server 0 (b'=5) gets 3; 2 -> server 1 (b'=2, d'=1)
    np.testing.assert_allclose(lcls([6.0, 3.0, 2.0], [5.0, 8.0], [1, 2], extra_degree=0), [[0, 6], [3, 0], [0, 2]])
    # LCBC: ratios 5/1 vs 8/2: 6 -> server 0 (5 per connection) takes 5, remainder 1 back; server 0 is full.
    # 3 -> server 1 (8/2) takes 3 (b'=5, d'=1); 2 -> server 1 takes 2; remainder 1 has nowhere to go.
    np.testing.assert_allclose(lcbc([6.0, 3.0, 2.0], [5.0, 8.0], [1, 2], extra_degree=0), [[5, 0], [0, 3], [0, 2]])


@pytest.mark.parametrize("B", [10, 40, 200])
def test_lcbc_worst_case_ratio_tends_to_three_quarters(B):
    m = 4
    d = B // 2
    dem = [1.0] * (m * B // 2) + [m * B / 2]
    cap, deg = [float(B)] * m, [d] * m
    s = seq(dem, cap, deg)
    g = lcbc(dem, cap, deg)
    assert s.sum() == pytest.approx(m * B)  # SEQ: d unit clients plus B/2 of the big one on every server
    assert g.sum() == pytest.approx(m * B / 2 + (d + 1) * m / 2)
    ratio = g.sum() / s.sum()
    assert ratio == pytest.approx(0.75 + 1 / (2 * B))
    assert abs(ratio - 0.75) <= 0.5 / B + 1e-12
