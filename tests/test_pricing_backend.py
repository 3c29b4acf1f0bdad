"""The two array routes of allocator.pricing (allocator.pricing.problem.resolve_route): the numpy route of CPU solves
never imports torch; the torch route (CUDA, distributed, tensor inputs, ``backend="torch"``) runs the same code; both
return the same result up to rounding."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import allocator
from allocator import pricing
from allocator import utilities as U
from allocator.pricing import problem
from allocator.pricing.problem import Route, resolve_route

ROOT = Path(allocator.__file__).resolve().parents[1]


def _fresh(code: str) -> Any:
    """Run ``code`` in a fresh interpreter with this checkout first on the path; it prints one JSON value."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "operator"), str(ROOT)]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _driver_present() -> bool:
    if os.path.exists("/proc/driver/nvidia/version"):
        return True
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def test_imports_and_cpu_solves_do_not_load_torch() -> None:
    """After each import and after CPU solves that go through every stage (presolve, recovery, repair, the closed-pool
    prices, the planner's market, the CLI), torch is not in ``sys.modules``. The solves name the CPU (``device="cpu"``):
    "auto" imports torch where an NVIDIA driver is present (the test below)."""
    seen = _fresh(
        """
import json, sys
import numpy as np
steps = {}
import allocator.pricing
steps["import allocator.pricing"] = "torch" in sys.modules
import allocator.utilities as U
steps["import allocator.utilities"] = "torch" in sys.modules
import walras.planner.plan
steps["import walras.planner.plan"] = "torch" in sys.modules
from allocator import pricing
from walras.cli.solve import synthetic
a, r = synthetic(20000, 4, 0)
res = pricing.solve(a.astype(np.float32), r, U.Log(), device="cpu")
assert res.converged and res.presolve_evaluations > 0 and res.device == "cpu"
rng = np.random.default_rng(0)
b = rng.uniform(0.1, 1.0, (60, 3))
res = pricing.solve(b, [5.0, 0.0, 8.0], U.TargetPriority(0.4, rng.choice([1.0, 2.0], 60)), dtype="float64",
                    device="cpu")
assert res.status in ("optimal", "stalled", "max_iter")
res = pricing.solve(b, [5.0, 3.0, 8.0], U.Linear(), demand=rng.uniform(0.5, 2, (60, 3)), device="cpu")
cold = pricing.solve(b, [5.0, 3.0, 8.0], U.Log(), device="cpu")
again = pricing.solve(b * 1.01, [5.0, 3.0, 8.0], U.Log(), previous=cold, device="cpu")
pricing.dual_evaluation(b, [5.0, 3.0, 8.0], U.Log(), [1.0, 1.0, 1.0], device="cpu")
steps["pricing.solve (cpu)"] = "torch" in sys.modules
from walras.planner.market import solve_market
from walras.planner.spec import UtilitySpec
specs = [UtilitySpec("log"), UtilitySpec("target-priority", target=0.5), UtilitySpec("power", exponent=0.5)] * 4
solve_market(b[:12], np.array([3.0, 2.0, 4.0]), specs, [1.0] * 12, np.ones((12, 3)), None)
steps["solve_market"] = "torch" in sys.modules
from walras.cli import main
main(["solve", "--jobs", "3000", "--json", "--no-progress", "--device", "cpu"])
steps["walras solve"] = "torch" in sys.modules
print(json.dumps(steps))
"""
    )
    assert seen == {
        "import allocator.pricing": False,
        "import allocator.utilities": False,
        "import walras.planner.plan": False,
        "pricing.solve (cpu)": False,
        "solve_market": False,
        "walras solve": False,
    }


def test_auto_device_decides_without_torch_where_there_is_no_driver() -> None:
    """``cuda_available`` imports torch only when a driver is present; it then asks torch. A solve with the default
    device runs where the route table says: CUDA when torch sees a device, else the CPU (numpy, no torch)."""
    seen = _fresh(
        "import json, sys\nfrom allocator import pricing, utilities\n"
        "ok = pricing.cuda_available()\nafter = 'torch' in sys.modules\n"
        "res = pricing.solve([[1.0, 2.0], [2.0, 1.0]], [1.0, 1.0], utilities.Log())\n"
        "print(json.dumps([ok, after, res.device, res.status, 'torch' in sys.modules]))"
    )
    if _driver_present():
        cuda = torch.cuda.is_available()
        assert seen == [cuda, True, "cuda" if cuda else "cpu", "optimal", True]
    else:
        assert seen == [False, False, "cpu", "optimal", False]


def test_route_table(monkeypatch: pytest.MonkeyPatch) -> None:
    a = np.ones((3, 2), dtype=np.float32)
    monkeypatch.setattr(problem, "cuda_available", lambda: False)
    assert resolve_route() == Route("numpy", "cpu", "float32")
    assert resolve_route("auto", "float64") == Route("numpy", "cpu", "float64")
    assert resolve_route("cpu", np.float64, inputs=(a,)) == Route("numpy", "cpu", "float64")
    assert resolve_route(None, None, "torch") == Route("torch", "cpu", "float32")
    assert resolve_route(None, torch.float64) == Route("torch", "cpu", "float64")
    assert resolve_route(inputs=(torch.from_numpy(a),)) == Route("torch", "cpu", "float32")
    assert resolve_route("cuda") == Route("torch", "cuda", "float32")
    assert resolve_route(torch.device("cuda", 1)) == Route("torch", "cuda:1", "float32")
    assert resolve_route(group=object()).backend == "torch"
    # auto on a machine with CUDA
    monkeypatch.setattr(problem, "cuda_available", lambda: True)
    assert resolve_route() == Route("torch", "cuda", "float32")
    assert resolve_route("cpu") == Route("numpy", "cpu", "float32")
    assert resolve_route(backend="numpy") == Route("numpy", "cpu", "float32")
    with pytest.raises(ValueError, match="backend='torch'"):
        resolve_route(backend="numpy", inputs=(torch.from_numpy(a),))
    with pytest.raises(ValueError, match="backend='torch'"):
        resolve_route("cuda", backend="numpy")
    with pytest.raises(ValueError, match="backend must be"):
        resolve_route(backend="jax")
    with pytest.raises(ValueError, match="float32 or float64"):
        resolve_route(dtype="int32")


def _instance(kind: str) -> tuple[np.ndarray, np.ndarray, Any, Any]:
    rng = np.random.default_rng(7)
    if kind == "log-presolve":  # 004 Sec. 6.2, large enough for the presolve
        n = 8000
        a = rng.uniform([0.1, 0.1, 0.3, 0.6], [0.3, 0.5, 0.8, 1.0], (n, 4))
        return a, np.array([8e5, 1e5, 1e4, 1e3]) * n / 1e6, U.Log(rng.choice([1.0, 2.0], n)), None
    n, m = 300, 5
    a = rng.uniform(0.0, 1.0, (n, m))
    r = rng.uniform(0.05, 0.3, m) * n
    if kind == "target-demands":  # repair of over-used pools, vector demands
        return a, r, U.TargetPriority(rng.uniform(0.1, 0.6, n), rng.choice([1.0, 2.0], n)), rng.uniform(0.5, 2, (n, m))
    if kind == "power-closed-pool":  # a pool of capacity 0 (masked, priced after the run)
        r[2] = 0.0
        return a, r, U.Power(0.5), rng.integers(1, 3, n).astype(float)
    if kind == "alpha":
        return a, r, U.AlphaFair(2.0), None
    raise AssertionError(kind)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kind", ["log-presolve", "target-demands", "power-closed-pool", "alpha"])
def test_both_routes_return_the_same_result(kind: str, dtype: str) -> None:
    """The same solve on the numpy and on the torch route (on the CPU): the same price path, evaluation for
    evaluation, so the same prices, dual bound and number of evaluations, bit for bit; the allocation and its
    utility to rounding (the closing repair and the closed-pool prices run on each route's own library). Both routes
    walk with the same compiled kernels and take the utility sums and the initial prices (eq. 17) from numpy on the
    CPU (``DualOracle.compiled_utility``, ``PriceDiscovery._initial_prices``): before, the two libraries' sums in
    another order started float32 runs a few ulps apart and let them part (5 against 17 evaluations on one
    alpha-fair market)."""
    a, r, u, d = _instance(kind)
    res = {b: pricing.solve(a, r, u, demand=d, dtype=dtype, backend=b) for b in ("numpy", "torch")}  # type: ignore[arg-type]
    ours, theirs = res["numpy"], res["torch"]
    assert ours.device == theirs.device == "cpu"
    assert ours.dtype == theirs.dtype  # float32 may escalate to float64; both routes do the same
    assert ours.status == theirs.status and ours.iterations == theirs.iterations
    np.testing.assert_array_equal(ours.prices, theirs.prices)
    assert ours.dual_value == theirs.dual_value
    rtol = 1e-6 if dtype == "float32" else 1e-12
    assert ours.utility_value == pytest.approx(theirs.utility_value, rel=rtol)
    np.testing.assert_allclose(ours.allocation, theirs.allocation, rtol=0, atol=rtol)
    for field in ("prices", "allocation", "throughputs", "usage"):
        assert type(getattr(ours, field)) is np.ndarray and type(getattr(theirs, field)) is np.ndarray


def test_utilities_move_between_the_libraries() -> None:
    """``to`` picks the library by the dtype (numpy dtype: numpy, torch dtype: torch); values agree."""
    u = U.Power(np.array([0.5, -1.0, 1.0]), np.array([1.0, 2.0, 3.0]))
    assert type(u.p) is np.ndarray
    on_torch = u.to("cpu", torch.float64)
    assert isinstance(on_torch.p, torch.Tensor) and on_torch.p.dtype == torch.float64
    back = on_torch.to("cpu", np.float32)
    assert type(back.p) is np.ndarray and back.p.dtype == np.float32
    t = np.array([0.5, 1.5, 2.0])
    np.testing.assert_allclose(u.value(t), on_torch.value(torch.from_numpy(t)).numpy(), rtol=1e-15)
    np.testing.assert_allclose(u.derivative(t), on_torch.derivative(torch.from_numpy(t)).numpy(), rtol=1e-15)
    assert u.take(np.array([2, 0])).n_jobs == 2 and on_torch.take(torch.tensor([1])).n_jobs == 1
