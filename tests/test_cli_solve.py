"""``walras solve``: synthetic instances, npz input/output, JSON output, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from walras.cli import main
from walras.cli.solve import synthetic

from allocator import pricing, utilities

KEYS = {
    "n_jobs", "n_resources", "utility", "prices", "utility_value", "dual_value", "gap", "iterations", "converged",
    "seconds", "startup_seconds", "import_seconds", "kernel_route", "device",
}


def test_json_output_on_the_section_62_instance(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["solve", "--jobs", "2000", "--resources", "4", "--utility", "log", "--json", "--device", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert KEYS <= set(out)
    assert out["n_jobs"] == 2000 and out["n_resources"] == 4 and out["converged"]
    assert out["dual_value"] >= out["utility_value"]
    a, r = synthetic(2000, 4, 0)
    ref = pricing.solve(a, r, utilities.Log(), device="cpu")
    assert out["prices"] == pytest.approx(ref.prices.tolist(), rel=1e-6)


def test_synthetic_instances() -> None:
    a, r = synthetic(1000, 4, 1)
    assert a.shape == (1000, 4) and r.tolist() == pytest.approx([800.0, 100.0, 10.0, 1.0])
    assert (a[:, 3] >= 0.6).all() and (a[:, 0] <= 0.3).all()
    a6, r6 = synthetic(500, 6, 1)
    assert a6.shape == (500, 6) and r6.shape == (6,) and (r6 > 0).all()


@pytest.mark.parametrize("spec", ["linear", "power:0.5", "alpha:2", "target:0.2:1,2", "target:0.3"])
def test_every_utility_spec_runs(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["solve", "--jobs", "500", "--resources", "3", "--utility", spec, "--json", "--device", "cpu"])
    out = json.loads(capsys.readouterr().out)
    assert out["utility"] == spec and len(out["prices"]) == 3
    assert rc == (0 if out["converged"] else 1)


def test_npz_input_and_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(5)
    a = rng.uniform(0.1, 1, (60, 3))
    cap = np.array([10.0, 8.0, 5.0])
    demand = rng.integers(1, 3, 60).astype(float)
    target = rng.uniform(0.2, 0.5, 60)
    weight = rng.choice([1.0, 3.0], 60)
    src, dst = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(src, throughput=a, capacity=cap, demand=demand, target=target, weight=weight)
    rc = main(["solve", "--input", str(src), "--output", str(dst), "--utility", "target:1", "--dtype", "float64"])
    text = capsys.readouterr().out
    assert "prices" in text and "gap" in text
    with np.load(dst) as out:
        x, p = out["allocation"], out["prices"]
    ref = pricing.solve(a, cap, utilities.TargetPriority(target, weight), demand=demand, dtype="float64")
    assert rc == (0 if ref.converged else 1)
    assert p == pytest.approx(ref.prices)
    assert x.shape == (60, 3) and ((demand[:, None] * x).sum(0) <= cap + 1e-9).all()


def test_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["solve", "--jobs", "10", "--utility", "cubic"]) == 2
    bad = tmp_path / "bad.npz"
    np.savez(bad, throughput=np.array([[1.0, -1.0]]), capacity=np.ones(2))
    assert main(["solve", "--input", str(bad)]) == 2
    assert "throughput[0, 1]" in capsys.readouterr().err
    missing = tmp_path / "missing.npz"
    np.savez(missing, throughput=np.ones((2, 2)))
    assert main(["solve", "--input", str(missing)]) == 2
