"""``allocator._highs.solve_lp`` (HiGHS through ``highspy``) against ``scipy.optimize.linprog(method="highs")`` as
the reference, and what it spares a fresh process (no ``scipy.optimize`` import, nothing on standard output)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.optimize
import scipy.sparse

from allocator._highs import solve_lp

ROOT = Path(__file__).resolve().parents[1]


def _random_lp(seed: int) -> tuple[np.ndarray, ...]:
    """A feasible bounded LP: ``min c^T x`` over ``A_eq x = b_eq``, ``A_ub x <= b_ub``, ``0 <= x <= u`` (some ``u``
    infinite), with ``b`` built from a known feasible point so that it is never infeasible."""
    rng = np.random.default_rng(seed)
    n, me, mu = int(rng.integers(3, 12)), int(rng.integers(0, 3)), int(rng.integers(1, 8))
    a_eq = np.where(rng.random((me, n)) < 0.5, rng.normal(size=(me, n)), 0.0)
    a_ub = np.where(rng.random((mu, n)) < 0.6, rng.uniform(0.1, 2.0, (mu, n)), 0.0)
    a_ub[:, a_ub.sum(axis=0) == 0] = 1.0  # every column constrained: the LP is bounded below (c >= -1, x >= 0)
    upper = np.where(rng.random(n) < 0.3, np.inf, rng.uniform(0.5, 3.0, n))
    x0 = rng.uniform(0.0, 0.5, n)
    return (rng.uniform(-1.0, 1.0, n), a_eq, a_eq @ x0, a_ub, a_ub @ x0 + rng.uniform(0.0, 1.0, mu), upper)


def _csr(a_eq: np.ndarray, a_ub: np.ndarray) -> scipy.sparse.csr_array:
    return scipy.sparse.csr_array(np.vstack([a_eq, a_ub]))


@pytest.mark.parametrize("seed", range(25))
def test_same_optimum_as_scipy_linprog(seed: int) -> None:
    c, a_eq, b_eq, a_ub, b_ub, upper = _random_lp(seed)
    ref = scipy.optimize.linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq if a_eq.size else None,
                                 b_eq=b_eq if a_eq.size else None, bounds=list(zip(np.zeros(c.size), upper,
                                                                                   strict=True)), method="highs")
    assert ref.status == 0, (seed, ref.message)
    m = _csr(a_eq, a_ub)
    got = solve_lp(c, m.indptr, m.indices, m.data, np.concatenate([b_eq, np.full(b_ub.size, -np.inf)]),
                   np.concatenate([b_eq, b_ub]), np.zeros(c.size), upper)
    assert got.optimal and got.x is not None, (seed, got.status)
    x = got.x
    assert c @ x == pytest.approx(ref.fun, rel=1e-7, abs=1e-9), seed
    assert np.all(a_ub @ x <= b_ub + 1e-7) and np.allclose(a_eq @ x, b_eq, atol=1e-7)
    assert np.all(x >= -1e-9) and np.all(x <= upper + 1e-9)


def test_infeasible_and_unbounded_models_are_not_optimal() -> None:
    # x >= 2 and x <= 1: infeasible
    one = np.array([1.0])
    got = solve_lp(one, np.array([0, 1]), np.array([0]), one, np.array([2.0]), np.array([np.inf]), np.zeros(1),
                   np.array([1.0]))
    assert not got.optimal and got.x is None and got.status
    # min -x, x >= 0 unconstrained above: unbounded
    got = solve_lp(-one, np.array([0, 1]), np.array([0]), one, np.array([0.0]), np.array([np.inf]), np.zeros(1),
                   np.array([np.inf]))
    assert not got.optimal and got.x is None


def test_non_finite_coefficients_and_nan_bounds_raise_value_error() -> None:
    """Refused before HiGHS sees them: with presolve off, a NaN cost made HiGHS 1.16's simplex loop past its own time
    limit (found by a review; scipy's linprog refuses the same inputs)."""
    base = dict(cost=np.array([-1.0, -1.0]), indptr=np.array([0, 2]), indices=np.array([0, 1]),
                values=np.array([1.0, 1.0]), row_lower=np.array([-np.inf]), row_upper=np.array([1.0]),
                col_lower=np.zeros(2), col_upper=np.ones(2))
    assert solve_lp(**base).optimal
    for name, bad in (("cost", np.array([np.nan, -1.0])), ("cost", np.array([-np.inf, -1.0])),
                      ("values", np.array([np.nan, 1.0])), ("row_upper", np.array([np.nan])),
                      ("col_lower", np.array([0.0, np.nan]))):
        with pytest.raises(ValueError, match=r"finite|NaN"):
            solve_lp(**{**base, name: bad})


def test_a_malformed_matrix_is_not_optimal_and_says_so() -> None:
    for indices in (np.array([0, 5]), np.array([0, 0])):  # a column out of range; a duplicate entry in a row
        got = solve_lp(np.array([-1.0, -1.0]), np.array([0, 2]), indices, np.array([1.0, 1.0]),
                       np.array([-np.inf]), np.array([1.0]), np.zeros(2), np.ones(2))
        assert (got.optimal, got.x, got.status) == (False, None, "model rejected by HiGHS")


def test_inconsistent_shapes_raise_value_error() -> None:
    with pytest.raises(ValueError, match="inconsistent LP"):
        solve_lp(np.ones(2), np.array([0, 1]), np.array([0]), np.ones(1), np.zeros(2), np.ones(2), np.zeros(2),
                 np.ones(2))


def test_a_fresh_process_solves_without_scipy_optimize_and_prints_nothing() -> None:
    """The market's recovery LP, run in a fresh process: ``scipy.optimize`` is not imported (0.5-0.7 s of a cold
    ``walras plan``), and HiGHS writes nothing to standard output (``walras plan -o json`` prints the plan there)."""
    code = """
import json, sys
import numpy as np
from allocator.pricing.primal.recovery import _split_lp
x = _split_lp(np.ones((2, 2), dtype=bool), np.array([[1.0, 2.0], [2.0, 1.0]]), np.ones((2, 2)),
              np.array([[1.0], [1.0]]), np.array([[2.0], [2.0]]), np.ones(2), np.array([1.0, 1.0]))
print(json.dumps({"x": x.tolist(), "scipy.optimize": "scipy.optimize" in sys.modules}))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                         check=True, timeout=120)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout  # nothing but the one line this program prints
    seen = json.loads(lines[0])
    assert seen["scipy.optimize"] is False
    # job 0 gets pool 1 (throughput 2), job 1 pool 0 (throughput 2): the whole of each pool, utility 4
    assert np.allclose(seen["x"], [[0.0, 1.0], [1.0, 0.0]])
