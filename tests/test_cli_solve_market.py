"""``walras solve``: a pool with no capacity is reported, not priced; the ``.npz`` format is in --help; and
``--distributed`` under torchrun (gloo, 2 CPU processes) reaches the prices of one process (issue 29).

The two-process run is compared with the single-process solve of the same instance within the tolerances of
``tests/test_pricing_distributed.py`` (sums over the shards are associated differently); both are in turn checked
against an LP-free optimality certificate: a duality gap within eps (the dual value at the prices bounds every
allocation's utility from above, paper 004 Sec. 3).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def walras(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "walras", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def instance(tmp_path: Path, capacity: list[float]) -> Path:
    rng = np.random.default_rng(3)
    path = tmp_path / "market.npz"
    np.savez(path, throughput=rng.uniform(0.1, 1.0, (400, len(capacity))), capacity=np.array(capacity))
    return path


def test_a_pool_with_no_capacity_is_reported_and_not_priced(tmp_path: Path) -> None:
    path = instance(tmp_path, [60.0, 0.0, 30.0])
    result = walras("solve", "--input", str(path), "--dtype", "float64", "--json", "--output", str(tmp_path / "o.npz"))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["prices"][1] is None and out["zero_capacity_pools"] == [1]
    saved = np.load(tmp_path / "o.npz")
    assert np.isnan(saved["prices"][1]) and (saved["allocation"][:, 1] == 0).all()
    assert saved["allocation"].shape == (400, 3)
    # the market without the empty pool: the same prices for the other two
    with np.load(path) as data:
        np.savez(tmp_path / "two.npz", throughput=data["throughput"][:, [0, 2]], capacity=data["capacity"][[0, 2]])
    two = json.loads(walras("solve", "--input", str(tmp_path / "two.npz"), "--dtype", "float64", "--json").stdout)
    assert [out["prices"][0], out["prices"][2]] == pytest.approx(two["prices"], rel=1e-9)
    text = walras("solve", "--input", str(path)).stdout
    assert "no capacity:  pool 1 (capacity 0: left out of the market, not priced)" in text
    assert "169" not in text


def test_every_pool_without_capacity_is_an_error(tmp_path: Path) -> None:
    result = walras("solve", "--input", str(instance(tmp_path, [0.0, 0.0])))
    assert result.returncode == 2 and "every pool has capacity 0" in result.stderr


def test_help_documents_the_npz_format_in_plain_text() -> None:
    result = walras("solve", "--help")
    assert result.returncode == 0
    for key in ("throughput", "capacity", "demand", "weight", "target", "(N, M)", "numpy.savez", "torchrun"):
        assert key in result.stdout, key
    for markup in ("``", ":func:", ":mod:", ":class:", "paper 004", "aot", "jit", "route"):
        assert markup not in result.stdout, markup
    flat = " ".join(result.stdout.split())
    assert "number of jobs of a synthetic instance (default: 100000)" in flat  # defaults shown
    assert "seed of the synthetic instance and of drawn weights (default: 0)" in flat


def test_distributed_outside_torchrun_says_how_to_start_it() -> None:
    result = walras("solve", "--distributed", "--jobs", "100")
    assert result.returncode == 2 and "torchrun" in result.stderr, result.stderr


@pytest.mark.slow
def test_two_gloo_processes_under_torchrun_match_one_process(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    assert torchrun is not None, "torchrun (torch's launcher) is missing: make install installs torch"
    args = ["solve", "--jobs", "6000", "--dtype", "float64", "--json"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "two.npz"
    two = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "-m", "walras", *args, "--distributed",
                          "--output", str(out)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert two.returncode == 0, two.stderr[-3000:]
    lines = [line for line in two.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, two.stdout  # process 0 alone prints
    dist = json.loads(lines[0])
    one = json.loads(walras(*args).stdout)
    assert dist["processes"] == 2 and one["processes"] == 1
    assert dist["converged"] and one["converged"]
    assert dist["prices"] == pytest.approx(one["prices"], rel=2e-2, abs=1e-3)
    assert dist["dual_value"] == pytest.approx(one["dual_value"], abs=1e-3 * 6000)
    eps = 1e-3 * 6000
    assert dist["gap"] <= eps and one["gap"] <= eps
    saved = np.load(out)
    assert saved["allocation"].shape == (6000, 4)  # both shards gathered on process 0, in job order
