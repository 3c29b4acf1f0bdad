"""``walras demo`` tells where its start-up time goes and, when it gives up, why and what to do (issue 29: a first
demo printed nothing for 30 s and then failed with "no plan yet", naming neither compilation nor ``--timeout``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT)])}
    return subprocess.run([sys.executable, "-m", "walras", "demo", "--cluster", "emulated", *args],
                          capture_output=True, text=True, timeout=600, env=env)


def test_a_timeout_names_compilation_and_the_option() -> None:
    result = demo("--timeout", "0.01")
    assert result.returncode == 1
    assert "not every planned pod was bound to its planned node within 0.01 s" in result.stderr
    assert "kernels compiled" in result.stderr and "walras demo --timeout SECONDS" in result.stderr
    # the planner was loaded before the clock started, the cluster after it, each reported on stderr
    lines = result.stderr.splitlines()
    loading = lines.index("walras demo: loading the planner (the first run after an install compiles its kernels) ...")
    starting = next(n for n, line in enumerate(lines) if line.startswith("walras demo: starting the emulated"))
    assert loading < starting
    assert result.stdout.strip()  # the (partial) report still goes to stdout


def test_quiet_keeps_stderr_free_of_progress() -> None:
    result = demo("--quiet", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "loading the planner" not in result.stderr
