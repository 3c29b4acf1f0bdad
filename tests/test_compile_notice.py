"""The first run after a fresh install, without the ahead-of-time kernels: the kernels are compiled just in time and
the user is told so, once, on stderr (issue 29: a first ``walras demo`` paused for over a minute without a word).

A copy of ``allocator`` without the extension modules (``_kernels_aot*.so``) and with an empty numba cache directory
stands for a fresh install of a ``py3-none-any`` wheel; a second process on the same cache loads the kernels from
numba's cache and prints nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
from allocator.pricing._compiled import kernels
from allocator.degree import kernels as degree
k = kernels.load(); d = degree.load()
kernels.load(); degree.load()
import os
if os.environ.get("PROBE_EXTRA"):  # one SEQ run: the sweep kernel compiles (or loads) and is cached
    import numpy as np
    from allocator import degree as seq
    rng = np.random.default_rng(7)
    seq.plan_pool(rng.uniform(0.1, 5, 30), rng.uniform(1, 40, 5), rng.integers(1, 6, 5))
print(k.route, d.route)
"""


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("fresh")
    shutil.copytree(ROOT / "allocator", base / "allocator",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_kernels_aot*.so"))
    (base / "cache").mkdir()
    return base


def probe(base: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("WALRAS_PRICING_KERNELS", "WALRAS_DEGREE_KERNELS",
                                                               "WALRAS_COMPILE_NOTICE", "NUMBA_DISABLE_JIT")}
    clean.update({"PYTHONPATH": str(base), "NUMBA_CACHE_DIR": str(base / "cache"), **env})
    return subprocess.run([sys.executable, "-c", PROBE], cwd=base, env=clean, capture_output=True, text=True,
                          timeout=600)


def notices(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("walras: compiling")]


@pytest.mark.slow
def test_first_run_says_it_compiles_once_and_the_second_run_is_silent(fresh: Path) -> None:
    first = probe(fresh)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.split() == ["jit", "jit"]
    lines = notices(first)
    assert len(lines) == 2, first.stderr  # one per kernel set, not one per load() call
    assert "price-discovery" in lines[0] and "python -m allocator.pricing._compiled.aot" in lines[0]
    assert "degree" in lines[1] and "python -m allocator.degree.aot" in lines[1]
    # degree's kernels compile on their first call: one SEQ run caches the sweep
    from_cache = probe(fresh, PROBE_EXTRA="1")
    assert from_cache.returncode == 0, from_cache.stderr[-2000:]
    second = probe(fresh)  # numba's cache now holds the pricing kernels and the sweep
    assert second.returncode == 0, second.stderr[-2000:]
    assert notices(second) == [], second.stderr


def test_the_notice_can_be_silenced(fresh: Path, tmp_path: Path) -> None:
    result = probe(fresh, NUMBA_CACHE_DIR=str(tmp_path), WALRAS_COMPILE_NOTICE="0")
    assert result.returncode == 0, result.stderr[-2000:]
    assert notices(result) == []


COLOCATION = """
from allocator.colocation import kernels as colocation
from allocator.fairness import kernels as fairness
c = colocation.load(); f = fairness.load(); colocation.load(); fairness.load()
print(c.route, f.route)
"""


def test_the_just_in_time_kernels_of_other_packages_say_they_compile(fresh: Path, tmp_path: Path) -> None:
    def run(**env: str) -> subprocess.CompletedProcess[str]:
        clean = {k: v for k, v in os.environ.items() if k not in ("WALRAS_COMPILE_NOTICE", "NUMBA_DISABLE_JIT",
                                                                   "WALRAS_COLOCATION_KERNELS",
                                                                   "WALRAS_FAIRNESS_KERNELS")}
        clean.update({"PYTHONPATH": str(fresh), "NUMBA_CACHE_DIR": str(tmp_path), **env})
        return subprocess.run([sys.executable, "-c", COLOCATION], cwd=fresh, env=clean, capture_output=True,
                              text=True, timeout=600)

    first = run()
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.split() == ["jit", "jit"]  # the copy has no extension modules
    lines = notices(first)
    assert len(lines) == 2 and "the colocation kernels" in lines[0] and "the fairness kernels" in lines[1], lines
    assert "python -m allocator.colocation.aot" in lines[0] and "python -m allocator.fairness.aot" in lines[1]
    assert notices(run(NUMBA_DISABLE_JIT="1")) == []  # nothing is compiled then

