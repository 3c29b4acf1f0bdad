"""The compiled progressive filling (:mod:`allocator.fairness.psdsf._fill_kernels`) against the numpy reference
(:func:`allocator.fairness.psdsf.fill_server`, :func:`allocator.fairness.psdsf.filling._first_crossing`)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.fairness.psdsf._fill_kernels import fill_column, first_crossing
from allocator.fairness.psdsf.filling import _first_crossing, fill_server


@st.composite
def columns(draw: st.DrawFn) -> tuple[np.ndarray, ...]:
    """One server's filling problem: rates ``b``, tasks held elsewhere ``o`` (often 0, ties included), extra-task caps
    ``u`` (some infinite, some 0), demands with zero entries (some users need nothing), capacities (some 0)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    m, r = draw(st.integers(1, 40)), draw(st.integers(1, 4))
    b = rng.choice([0.5, 1.0, 2.0], m) * rng.uniform(0.1, 3.0, m) ** draw(st.sampled_from([0, 1]))
    o = np.where(
        rng.random(m) < 0.5, 0.0, rng.choice([1.0, 2.5], m) * rng.uniform(0, 3, m) ** draw(st.sampled_from([0, 1]))
    )
    u = np.where(rng.random(m) < 0.6, np.inf, rng.choice([0.0, 1.0, 4.0], m))
    dem = rng.integers(0, 4, (m, r)).astype(float) * rng.uniform(0.5, 1.5, (m, r)) ** draw(st.sampled_from([0, 1]))
    cap = np.where(rng.random(r) < 0.1, 0.0, rng.uniform(1.0, 40.0, r))
    return b, o, u, dem, cap


@settings(max_examples=300, deadline=None)
@given(prob=columns())
def test_fill_column_matches_the_reference(prob: tuple[np.ndarray, ...]) -> None:
    b, o, u, dem, cap = prob
    ref = fill_server(b, o, u, dem, cap)
    got = fill_column(b, o, u, dem, cap)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12 * max(float(np.abs(ref).max(initial=0.0)), 1.0))
    assert (dem.T @ got <= cap * (1 + 1e-12) + 1e-12).all()


@settings(max_examples=300, deadline=None)
@given(prob=columns(), seed=st.integers(0, 2**32 - 1))
def test_first_crossing_matches_the_reference(prob: tuple[np.ndarray, ...], seed: int) -> None:
    b, o, u, dem, cap = prob
    rem = np.where(np.random.default_rng(seed).random(cap.size) < 0.2, 0.0, cap)
    np.testing.assert_array_equal(first_crossing(b, o, u, dem, rem), _first_crossing(b, o, u, dem, rem))
