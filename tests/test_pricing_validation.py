"""Input validation and the infeasible-job check of :mod:`allocator.pricing` on the single-pass routes (one
min/max reduction for the throughputs, a row maximum (torch) or the compiled comparison with zero (numpy) over the
open pools for reachability), on both array routes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from allocator import pricing
from allocator import utilities as U

BACKENDS = ["numpy", "torch"]


@pytest.mark.parametrize(
    ("bad", "where"),
    [(math.nan, r"throughput\[2, 1\]"), (-1e-30, r"throughput\[2, 1\]"), (math.inf, r"throughput\[2, 1\]"),
     (-math.inf, r"throughput\[2, 1\]")],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_one_bad_entry_among_many_is_named(bad: float, where: str, backend: Any) -> None:
    a = np.full((5, 3), 0.5)
    a[2, 1] = bad
    with pytest.raises(ValueError, match=where):
        pricing.solve(a, [1.0, 1.0, 1.0], U.Log(), dtype="float64", backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_zero_is_a_valid_throughput(backend: Any) -> None:
    a = np.array([[1.0, -0.0], [0.5, 1.0]])
    res = pricing.solve(a, [1.0, 1.0], U.Log(), dtype="float64", backend=backend)
    assert res.converged


@pytest.mark.parametrize("backend", BACKENDS)
def test_job_served_only_by_a_closed_pool_is_infeasible(backend: Any) -> None:
    # job 1 has positive throughput on pool 1 only, whose capacity is 0: log utility is -inf for it whatever happens;
    # job 3 has only a negative zero: it can run nowhere either
    a = np.array([[1.0, 2.0, 0.5], [0.0, 3.0, 0.0], [2.0, 1.0, 1.0], [-0.0, 0.0, -0.0]])
    res = pricing.solve(a, [1.0, 0.0, 1.0], U.Log(), dtype="float64", backend=backend)
    assert res.status == "infeasible"
    assert res.infeasible_jobs.tolist() == [1, 3]
    # the same job is fine when pool 1 opens, and with a utility that is finite at zero throughput
    assert pricing.solve(a[:3], [1.0, 1.0, 1.0], U.Log(), dtype="float64", backend=backend).converged
    res = pricing.solve(a, [1.0, 0.0, 1.0], U.TargetPriority(0.5), dtype="float64", backend=backend)
    assert res.status != "infeasible"
