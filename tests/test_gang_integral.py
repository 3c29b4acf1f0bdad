"""allocator.integral with gang rows (docs/gangs.md) against an independent brute force on tiny instances.

A gang row takes all of its ``left`` replicas in one pool or none (004 Sec. 2.1: the job's share is N replicas or
0, the demand vector of Sec. 7.1 taken N times). The reference enumerates every count of new replicas per (row,
node), keeps the feasible ones (node fit on every resource, slots, ``left``, and the gang rule written here again:
a gang's total is 0 or ``left``, in a single pool, the pool it has replicas in when it has any) and evaluates the
objective by hand (linear and log utilities, the starved value of the module docstring). Both routes must return
whole gangs; on linear utilities (the MILP's tangents are then exact) the exact route reaches the optimum; on log
utilities its bound covers the optimum and its value is within its certified gap.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.integral import STARVED_PENALTY, FillProblem, FillResult, Utility, fill_exact, fill_search, solve_fill


def _value(kind: int, t: float, t1: float) -> float:
    """Linear (kind 0) or log (kind 1) utility of throughput ``t``; the log's starved value at 0 by hand."""
    if kind == 0:
        return t
    return math.log(t) if t > 0 else math.log(t1) - STARVED_PENALTY


def _problem(seed: int, kind: int) -> FillProblem:
    """1-3 rows (at least one gang), 1-2 pools, at most 3 nodes; gpu, cpu and pod slots."""
    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(1, 4)), int(rng.integers(1, 3))
    pool = np.repeat(np.arange(m), [int(rng.integers(1, 3)), 1][:m])
    K = pool.size
    free = np.zeros((K, 3))
    free[:, 0] = rng.integers(1, 4, K)  # pods
    free[:, 1] = rng.integers(1, 5, K)  # gpu (priced)
    free[:, 2] = rng.integers(2, 9, K)  # cpu
    vectors = np.zeros((n, m, 3))
    for i in range(n):
        vectors[i, :, 0], vectors[i, :, 1], vectors[i, :, 2] = 1.0, float(rng.integers(1, 3)), float(rng.integers(1, 4))
    replicas = rng.integers(1, 4, n).astype(np.float64)
    gang = rng.uniform(size=n) < 0.6
    gang[int(rng.integers(0, n))] = True
    have = np.zeros((n, m), dtype=np.int64)
    left = replicas.astype(np.int64).copy()
    for i in range(n):
        if rng.uniform() < 0.25 and left[i] > 1:  # a gang that lost a pod: the rest must come in its pool
            j = int(rng.integers(0, m))
            have[i, j] = 1
            left[i] -= 1
    return FillProblem(
        throughput=rng.uniform(0.2, 2.0, (n, m)), replicas=replicas, have=have, left=left,
        utility=Utility(np.full(n, kind, dtype=np.int64), np.ones(n), np.zeros(n)), vectors=vectors,
        priced=np.ones(m, dtype=np.int64), free=free, slots=rng.integers(1, 4, K), pool=pool,
        masks=np.ones((1, K), dtype=bool), mask_of=np.zeros(n, dtype=np.int64), offered=np.ones((n, m), dtype=bool),
        budget=np.full(m, np.inf), gang=gang)


def _whole(p: FillProblem, i: int, per_pool: np.ndarray) -> bool:
    """The gang rule, written again: row i's new replicas are 0, or ``left`` in one pool (its pool if it has one)."""
    total = int(per_pool.sum())
    if total == 0:
        return True
    pools = np.flatnonzero(per_pool)
    if total != int(p.left[i]) or pools.size != 1:
        return False
    own = np.flatnonzero(p.have[i])
    return own.size == 0 or int(own[0]) == int(pools[0])


def _brute(p: FillProblem, kind: int) -> float:
    n, m = p.have.shape
    K = p.free.shape[0]
    cells = [(i, k) for i in range(n) for k in range(K)]
    t1 = [min(p.throughput[i, j] for j in range(m)) / p.replicas[i] for i in range(n)]
    best = -math.inf
    for combo in itertools.product(*[range(int(p.left[i]) + 1) for i, _ in cells]):
        use = np.zeros_like(p.free)
        count = np.zeros(K)
        per = np.zeros((n, m), dtype=np.int64)
        for (i, k), y in zip(cells, combo, strict=True):
            if y:
                use[k] += y * p.vectors[i, p.pool[k]]
                count[k] += y
                per[i, p.pool[k]] += y
        if np.any(use > p.free + 1e-9) or np.any(count > p.slots) or np.any(per.sum(axis=1) > p.left):
            continue
        if not all(_whole(p, i, per[i]) for i in range(n) if p.gang is not None and p.gang[i]):
            continue
        t = [float(((p.have[i] + per[i]) * p.throughput[i]).sum() / p.replicas[i]) for i in range(n)]
        best = max(best, math.fsum(_value(kind, t[i], t1[i]) for i in range(n)))
    return best


def _check_whole(p: FillProblem, result: FillResult) -> None:
    n, m = p.have.shape
    added = np.zeros((n, m), dtype=np.int64)
    for i, j in zip(result.row.tolist(), result.pool.tolist(), strict=True):
        added[i, j] += 1
    for i in range(n):
        if p.gang is not None and p.gang[i]:
            assert _whole(p, i, added[i]), f"row {i}: gang of {p.left[i]} left got {added[i].tolist()}"


@pytest.mark.parametrize("seed", range(30))
def test_exact_route_with_gangs_reaches_the_brute_force_optimum(seed: int) -> None:
    print("seed", seed)
    p = _problem(seed, kind=0)
    optimum = _brute(p, 0)
    exact = fill_exact(p, time_limit=5.0)
    assert exact is not None
    _check_whole(p, exact)
    assert exact.value == pytest.approx(optimum, rel=1e-9, abs=1e-9)
    best = solve_fill(p)
    _check_whole(p, best)
    assert best.value == pytest.approx(optimum, rel=1e-9, abs=1e-9)
    search = fill_search(p)
    _check_whole(p, search)
    assert search.value <= optimum + 1e-9


@pytest.mark.parametrize("seed", range(30))
def test_exact_route_with_gangs_is_certified_on_log_utilities(seed: int) -> None:
    print("seed", seed)
    p = _problem(1000 + seed, kind=1)
    optimum = _brute(p, 1)
    exact = fill_exact(p, time_limit=5.0)
    assert exact is not None and exact.bound is not None and exact.gap is not None
    _check_whole(p, exact)
    assert exact.bound >= optimum - 1e-7
    assert exact.value >= optimum - exact.gap - 1e-7
    assert exact.value <= optimum + 1e-9


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([0, 1]))
def test_no_route_ever_returns_a_partial_gang(seed: int, kind: int) -> None:
    p = _problem(seed, kind)
    for result in (fill_search(p), solve_fill(p)):
        _check_whole(p, result)


def test_search_adds_a_whole_gang_or_nothing() -> None:
    """One pool of two nodes with 3 and 1 GPUs: a gang of 4 one-GPU replicas fits only split over both nodes (it
    may: one pool), a gang of 5 fits nowhere and gets nothing, though 4 of its replicas would fit."""
    base = dict(throughput=np.ones((1, 1)), have=np.zeros((1, 1), dtype=np.int64),
                utility=Utility(np.zeros(1, dtype=np.int64), np.ones(1), np.zeros(1)),
                vectors=np.array([[[1.0, 1.0, 1.0]]]), priced=np.ones(1, dtype=np.int64),
                free=np.array([[10.0, 3.0, 8.0], [10.0, 1.0, 8.0]]), slots=np.array([10, 10]),
                pool=np.zeros(2, dtype=np.int64), masks=np.ones((1, 2), dtype=bool),
                mask_of=np.zeros(1, dtype=np.int64),
                offered=np.ones((1, 1), dtype=bool), budget=np.full(1, np.inf), gang=np.array([True]))
    four = FillProblem(replicas=np.array([4.0]), left=np.array([4]), **base)  # type: ignore[arg-type]
    got = fill_search(four)
    assert sorted(got.node.tolist()) == [0, 0, 0, 1]
    five = FillProblem(replicas=np.array([5.0]), left=np.array([5]), **base)  # type: ignore[arg-type]
    assert fill_search(five).row.size == 0
    exact = fill_exact(five, time_limit=5.0)
    assert exact is not None and exact.row.size == 0
    plain = FillProblem(replicas=np.array([5.0]), left=np.array([5]), **{**base, "gang": None})  # type: ignore[arg-type]
    assert fill_search(plain).row.size == 4  # without the gang rule, 4 of 5 are placed
