"""allocator.pricing._compiled.kernels: the route table (ahead-of-time extension, numba JIT), both routes computing the
same values, and one-time costs kept out of the package import and out of the solve's clock."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from realtools import require

from allocator import pricing
from allocator import utilities as U
from allocator.pricing._compiled import kernels
from allocator.pricing.dual.oracle import DualOracle, usage_weights
from allocator.pricing.dual.subproblem import Subsolution, solve_hull
from allocator.pricing.problem import Route, prepare

ROOT = Path(__file__).resolve().parents[1]


def _fresh(code: str, env: dict[str, str] | None = None) -> dict[str, object]:
    """Run ``code`` in a fresh interpreter (repository root as working directory); it prints one JSON line."""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
        env={**os.environ, **(env or {})},
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_import_loads_neither_numba_nor_scipy_optimize() -> None:
    mods = _fresh(
        "import json, sys\nimport allocator.pricing\n"
        "print(json.dumps({m: m in sys.modules for m in ('numba', 'scipy.optimize', 'scipy.sparse')}))"
    )
    assert mods == {"numba": False, "scipy.optimize": False, "scipy.sparse": False}


def test_first_solve_reports_kernel_loading_apart_from_its_clock() -> None:
    out = _fresh(
        "import json, numpy as np\nfrom allocator import pricing, utilities as U\n"
        "rng = np.random.default_rng(0); a = rng.uniform(0.1, 1, (300, 3)); r = np.array([50.0, 40.0, 30.0])\n"
        "first = pricing.solve(a, r, U.Log(), device='cpu'); second = pricing.solve(a, r, U.Log(), device='cpu')\n"
        "from allocator.pricing._compiled import kernels\n"
        "print(json.dumps([first.startup_seconds, second.startup_seconds, kernels.loaded().seconds,"
        " first.summary()['startup_seconds']]))",
        env={"WALRAS_PRICING_KERNELS": "jit"},
    )
    first, second, loading, summary = out  # type: ignore[misc]
    assert first == loading > 0  # the first solve paid the loading, before its clock started
    assert second == 0.0
    assert summary == first


def test_route_table_rejects_unknown_and_missing_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="kernel route"):
        kernels.load("cuda")
    monkeypatch.setattr(kernels, "AOT_MODULE", "allocator.pricing._compiled._no_such_module")
    monkeypatch.setattr(kernels, "_loaded", None)
    with pytest.raises(ImportError):
        kernels.load("aot")
    assert kernels.load().route == "jit"  # no extension module: the JIT route


def test_a_stale_aot_module_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """An extension built from another version of the kernel source (no ``source_<tag>`` export for this one) must
    not run: its kernels may take other arguments."""
    import types

    stale = types.ModuleType(kernels.AOT_MODULE)
    stale.source_0000000000000000 = lambda: 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, kernels.AOT_MODULE, stale)
    monkeypatch.setattr(kernels, "_loaded", None)
    with pytest.raises(ImportError, match="another version"):
        kernels.load("aot")
    assert kernels.load().route == "jit"


@pytest.fixture(scope="module")
def aot_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The ahead-of-time extension, built by ``python -m allocator.pricing._compiled.aot`` into a temporary folder."""
    require("gcc")
    out = tmp_path_factory.mktemp("aot")
    subprocess.run([sys.executable, "-m", "allocator.pricing._compiled.aot", str(out)], cwd=ROOT, check=True)
    found = sorted(out.glob("_kernels_aot*.so"))
    assert found, "no extension module written"
    yield found[0]


def _register(path: Path) -> None:
    spec = importlib.util.spec_from_file_location(kernels.AOT_MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[kernels.AOT_MODULE] = module


def _walk_inputs(dtype: type, family: str, seed: int) -> tuple[np.ndarray, np.ndarray, int, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n, m = 2000, 5
    a = rng.uniform(0, 1, (n, m)).astype(dtype)
    a[rng.random((n, m)) < 0.2] = 0
    c = (rng.uniform(0.1, 2, m) * rng.choice([1.0, 2.0], (n, 1))).astype(dtype)
    util = {
        "log": U.Log(rng.uniform(0.5, 2, n)),
        "linear": U.Linear(rng.uniform(0.5, 2, n)),
        "power": U.Power(rng.uniform(0.2, 0.9, n)),
        "alpha": U.AlphaFair(rng.uniform(0, 3, n)),
        "target": U.TargetPriority(rng.uniform(0.1, 1, n), rng.choice([1.0, 2.0], n)),
    }[family]
    spec = util.kernel_spec()
    assert spec is not None
    code, w, q = spec
    return np.ascontiguousarray(a), np.ascontiguousarray(c), code, w.astype(dtype), q.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("family", ["log", "linear", "power", "alpha", "target"])
def test_aot_and_jit_routes_agree_exactly(aot_module: Path, family: str, dtype: type) -> None:
    _register(aot_module)
    try:
        inputs = _walk_inputs(dtype, family, seed=len(family))
        jit = kernels.load("jit")
        ref = kernels.walk(*inputs)
        aot = kernels.load("aot")
        assert (jit.route, aot.route) == ("jit", "aot")
        got = kernels.walk(*inputs)
        for x, y in zip(got[0], ref[0]):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(got[1], ref[1])  # usage per pool
        assert got[2] == ref[2]  # what the jobs pay
        j_lo, x_lo, j_hi, x_hi = got[0][1], got[0][2], got[0][5], got[0][6]
        scale = np.linspace(0.5, 1.0, 6).astype(dtype)
        dense_aot = kernels.dense_fill(j_lo, x_lo, j_hi, x_hi, scale, 5, np.dtype(dtype))
        kernels.load("jit")
        np.testing.assert_array_equal(dense_aot, kernels.dense_fill(j_lo, x_lo, j_hi, x_hi, scale, 5, np.dtype(dtype)))
    finally:
        sys.modules.pop(kernels.AOT_MODULE, None)
        kernels.load("jit")


def test_aot_route_solves_without_numba(aot_module: Path) -> None:
    code = (
        "import importlib.util, json, sys, numpy as np\n"
        "name = 'allocator.pricing._compiled._kernels_aot'\n"
        f"spec = importlib.util.spec_from_file_location(name, {str(aot_module)!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "sys.modules[name] = mod\n"
        "from allocator import pricing, utilities as U\n"
        "rng = np.random.default_rng(0); a = rng.uniform(0.1, 1, (3000, 4)).astype(np.float32)\n"
        "res = pricing.solve(a, np.array([900.0, 700.0, 500.0, 300.0]), U.Log(), device='cpu')\n"
        "from allocator.pricing._compiled import kernels\n"
        "print(json.dumps([kernels.loaded().route, 'numba' in sys.modules, res.converged, res.prices.tolist()]))"
    )
    route, numba_loaded, converged, prices = _fresh(code)  # type: ignore[misc]
    assert (route, numba_loaded, converged) == ("aot", False, True)
    rng = np.random.default_rng(0)
    a = rng.uniform(0.1, 1, (3000, 4)).astype(np.float32)
    ref = pricing.solve(a, np.array([900.0, 700.0, 500.0, 300.0]), U.Log(), device="cpu")
    np.testing.assert_array_equal(np.asarray(prices), ref.prices)  # same kernels' values: the same price path


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("demand", ["unit", "per-job", "per-pool"])
@pytest.mark.parametrize("family", ["log", "linear", "power", "alpha", "target"])
def test_sums_of_the_walk_equal_the_array_expressions(family: str, demand: str, dtype: type) -> None:
    """The usage per pool the walk accumulates is numpy's ``bincount`` of ``usage_weights`` bit for bit (both add the
    working-dtype products ``x d`` in job order in float64), and what the jobs pay is the float64 sum of
    ``x_lo c_lo + x_hi c_hi``; the subproblem fields are those of the walk without demands' bookkeeping."""
    rng = np.random.default_rng(7)
    a, _, code, w, q = _walk_inputs(dtype, family, seed=3)
    n, m = a.shape
    p = rng.uniform(0.2, 2.0, m).astype(dtype)
    d = {
        "unit": None,
        "per-job": rng.uniform(0.5, 3.0, n).astype(dtype),
        "per-pool": rng.uniform(0.5, 3.0, (n, m)).astype(dtype),
    }[demand]
    c = np.ascontiguousarray(p[None, :] if d is None else (d[:, None] * p if d.ndim == 1 else d * p), dtype=dtype)
    fields, r, paid = kernels.walk(a, c, code, w, q, d)
    plain, r_unit, _ = kernels.walk(a, c, code, w, q)  # the same walk; the sums of unit demands
    for x, y in zip(fields, plain):
        np.testing.assert_array_equal(x, y)
    sol = Subsolution(*fields)
    j_lo, x_lo, c_lo, j_hi, x_hi, c_hi = sol.j_lo, sol.x_lo, sol.c_lo, sol.j_hi, sol.x_hi, sol.c_hi
    w_lo, w_hi = usage_weights(sol, d, m)
    expected = np.bincount(j_lo, weights=w_lo, minlength=m + 1) + np.bincount(j_hi, weights=w_hi, minlength=m + 1)
    np.testing.assert_array_equal(r, expected)
    assert r.shape == (m + 1,) and r.dtype == np.float64
    np.testing.assert_array_equal(
        r_unit, np.bincount(j_lo, weights=x_lo, minlength=m + 1) + np.bincount(j_hi, weights=x_hi, minlength=m + 1)
    )
    exact = math.fsum(
        (x_lo.astype(np.float64) * c_lo.astype(np.float64) + x_hi.astype(np.float64) * c_hi.astype(np.float64)).tolist()
    )
    assert paid == pytest.approx(exact, rel=1e-12)
    # every job pays something where it runs: the sum is not vacuous
    assert exact > 0 and (x_lo + x_hi > 0).any()


@pytest.mark.parametrize("demand", ["unit", "per-job", "per-pool"])
@pytest.mark.parametrize("family", ["log", "target", "alpha"])
def test_dual_evaluation_with_the_sums_of_the_walk_matches_the_array_route(family: str, demand: str) -> None:
    """One dual evaluation (eq. 12's ``g(p)``, the usage ``r(p)`` and the utility sum) computed with the walk's
    in-pass sums equals the one assembled from the vectorised walk and array expressions (float64: to rounding)."""
    rng = np.random.default_rng(11)
    a, _, _, _, _ = _walk_inputs(np.float64, family, seed=5)
    n, m = a.shape
    a[:, 0] = np.maximum(a[:, 0], 0.05)  # every job runs somewhere: u(t) finite, so the sums are not all -inf
    util = {
        "log": U.Log(rng.uniform(0.5, 2, n)),
        "target": U.TargetPriority(rng.uniform(0.1, 1, n), rng.choice([1.0, 2.0], n)),
        "alpha": U.AlphaFair(rng.uniform(0, 3, n)),
    }[family]
    d = {"unit": None, "per-job": rng.uniform(0.5, 3.0, n), "per-pool": rng.uniform(0.5, 3.0, (n, m))}[demand]
    prob = prepare(a, np.full(m, n / 8.0), util, d, Route("numpy", "cpu", "float64"))
    oracle = DualOracle(prob)
    prices = rng.uniform(0.2, 2.0, m)
    ev = oracle(prices)
    sol = solve_hull(prob.a, oracle.costs(oracle.prices_array(prices)), prob.utility, compiled=False)
    r, net, u_sum = oracle._sums(sol)
    np.testing.assert_allclose(ev.usage, r[:m], rtol=1e-9)
    assert ev.dual == pytest.approx(float(np.dot(prices, prob.capacity)) + net, rel=1e-9)
    assert ev.u_local == pytest.approx(u_sum, rel=1e-9)
    assert np.isfinite(ev.dual) and (ev.usage > 0).any()


def test_a_walk_without_end_values_gathers_them_as_the_walk_writes_them() -> None:
    """``walk(..., ends=False)`` leaves ``a_lo``, ``c_lo``, ``a_hi``, ``c_hi`` out; a :class:`Subsolution` given
    ``ends=(a, c)`` gathers them on first read, equal bit for bit to the ones the walk writes with ``ends=True``."""
    a, c, code, w, q = _walk_inputs(np.float32, "log", seed=4)
    full, r_full, paid_full = kernels.walk(a, c, code, w, q)
    part, r_part, paid_part = kernels.walk(a, c, code, w, q, ends=False)
    assert [v is None for v in part] == [False, False, False, True, True, False, False, True, True]
    np.testing.assert_array_equal(r_part, r_full)
    assert paid_part == paid_full
    t, j_lo, x_lo, _, _, j_hi, x_hi, _, _ = part
    lazy = Subsolution(t, j_lo, x_lo, None, None, j_hi, x_hi, None, None, ends=(a, c))
    for name, expected in zip(Subsolution.FIELDS, full, strict=True):
        got = getattr(lazy, name)
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match="all four end values"):
        Subsolution(t, j_lo, x_lo, None, None, j_hi, x_hi, None, None)


def test_the_state_kept_for_an_incremental_solve_does_not_read_the_callers_array() -> None:
    """The subsolution a result keeps for ``previous=`` gathers its end values from the result's private copy of the
    throughputs: changing the caller's array in place after the solve changes nothing in it."""
    rng = np.random.default_rng(3)
    n, m = 6000, 4
    a = rng.uniform([0.1, 0.1, 0.3, 0.6], [0.3, 0.5, 0.8, 1.0], (n, m)).astype(np.float32)
    r = np.array([8e5, 1e5, 1e4, 1e3]) * n / 1e6
    res = pricing.solve(a, r, U.Log(), device="cpu")
    kept = res._reuse
    assert kept is not None and kept.sol._ends is not None  # not gathered yet
    original = a.copy()
    a *= 3.0  # the caller reuses its buffer
    rows = np.arange(n)
    expected = np.where(kept.sol.j_lo < m, original[rows, np.minimum(kept.sol.j_lo, m - 1)], 0).astype(np.float32)
    np.testing.assert_array_equal(kept.sol.a_lo, expected)
    assert (expected > 0).any()


def test_rows_of_a_lazy_subsolution_gather_those_rows_only() -> None:
    """``rows`` of a subsolution whose end values are pending equals ``rows`` of the walked one, and leaves the
    rest pending (an incremental re-solve reads a few rows of a 10^6-job state)."""
    a, c, code, w, q = _walk_inputs(np.float64, "target", seed=6)
    full, _, _ = kernels.walk(a, c, code, w, q)
    part, _, _ = kernels.walk(a, c, code, w, q, ends=False)
    eager = Subsolution(*full)
    lazy = Subsolution(part[0], part[1], part[2], None, None, part[5], part[6], None, None, ends=(a, c))
    index = np.array([5, 0, 1999, 5, 17])
    sub = lazy.rows(index)
    assert lazy.pending and not sub.pending
    ref = eager.rows(index)
    for name in Subsolution.FIELDS:
        np.testing.assert_array_equal(getattr(sub, name), getattr(ref, name))


def test_walk_refuses_demands_of_another_shape() -> None:
    """The kernel reads ``d[i, j]`` without bounds checks: ``walk`` accepts ``(n,)`` or ``(n, m)`` only."""
    a, c, code, w, q = _walk_inputs(np.float32, "log", seed=1)
    n, m = a.shape
    for bad in (np.ones(n - 1, np.float32), np.ones((n, m + 1), np.float32), np.ones((1, m), np.float32)):
        with pytest.raises(ValueError, match="demand has shape"):
            kernels.walk(a, c, code, w, q, bad)


def test_an_incremental_resolve_keeps_the_end_values_pending_and_equals_a_warm_start() -> None:
    """With unit demands the state kept for ``previous=`` stays lazy through an incremental re-solve (only ``t``, the
    pools and the fractions of the changed rows are patched) and the re-solve equals the warm start from the same
    prices; with demands the walk writes the end values (a lazy one would keep the n x m costs alive)."""
    rng = np.random.default_rng(8)
    n, m = 6000, 4
    a = rng.uniform([0.1, 0.1, 0.3, 0.6], [0.3, 0.5, 0.8, 1.0], (n, m))
    r = np.array([8e5, 1e5, 1e4, 1e3]) * n / 1e6
    first = pricing.solve(a, r, U.Log(), device="cpu", dtype="float64")
    assert first._reuse is not None and first._reuse.sol.pending
    b = a.copy()
    rows = rng.choice(n, 30, replace=False)
    b[rows] *= 1.1
    again = pricing.solve(b, r, U.Log(), device="cpu", dtype="float64", previous=first)
    warm = pricing.solve(b, r, U.Log(), device="cpu", dtype="float64", prices=first.prices)
    assert again.resolved_jobs == rows.size
    assert again.iterations == warm.iterations
    np.testing.assert_allclose(again.prices, warm.prices, rtol=1e-9)
    np.testing.assert_allclose(again.allocation, warm.allocation, atol=1e-9)
    with_demand = pricing.solve(a, r, U.Log(), demand=rng.uniform(0.5, 2, n), device="cpu", dtype="float64")
    assert with_demand._reuse is not None and not with_demand._reuse.sol.pending


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_incremental_resolves_follow_the_warm_start_in_float32(backend: str) -> None:
    """A chain of incremental re-solves (``previous=``; the caller changes two jobs' rows of its array in place each
    time) against the warm start from the same prices, in float32: the same evaluations, prices and allocation to
    float32 resolution. The changed rows' sums must be taken in the arithmetic of a full evaluation (what the jobs pay
    as float64 products, utilities by numpy): with float32 costs per job the torch route parted from the warm start
    (prices by up to 3e-5, allocations by 8e-3, one more evaluation) in 4 of 72 cases of the hostile review."""
    import itertools

    import torch

    rng = np.random.default_rng(2)
    bad = []
    for n, kind in itertools.product([6, 60], ["none", "job", "pool"]):
        m = 3
        a = rng.uniform(0.1, 3, (n, m))
        a[rng.random((n, m)) < 0.2] = 0
        a[:, -1] = rng.uniform(0.5, 1, n)
        cap = rng.uniform(0.3, 1, m) * n / m
        d = None if kind == "none" else (rng.uniform(0.5, 2, n) if kind == "job" else rng.uniform(0.5, 2, (n, m)))
        w = rng.uniform(0.5, 2, n)
        x: Any = torch.from_numpy(a.astype(np.float32)) if backend == "torch" else a.astype(np.float32)
        res = pricing.solve(x, cap, U.Log(w), demand=d, dtype="float32", backend=backend, device="cpu")
        for step in range(3):
            k = rng.integers(0, n, size=2)
            fresh = rng.uniform(0.1, 3, (2, m)).astype(np.float32)
            x[k] = torch.from_numpy(fresh) if backend == "torch" else fresh
            if d is not None:
                d[k] = rng.uniform(0.5, 2, d[k].shape)
            assert res._reuse is not None
            start = res._reuse.prices.copy()
            inc = pricing.solve(x, cap, U.Log(w), demand=d, dtype="float32", backend=backend, device="cpu",
                                previous=res)
            copy_x = x.clone() if backend == "torch" else x.copy()
            ref = pricing.solve(copy_x, cap, U.Log(w), demand=d, dtype="float32", backend=backend, device="cpu",
                                prices=start)
            same = (inc.iterations == ref.iterations and np.allclose(inc.prices, ref.prices, rtol=1e-5, atol=1e-6)
                    and np.allclose(inc.allocation, ref.allocation, atol=1e-4))
            if not same:
                bad.append((n, kind, step, inc.iterations, ref.iterations,
                            float(np.abs(inc.prices - ref.prices).max())))
            res = inc
    assert bad == []
