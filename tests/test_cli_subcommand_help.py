"""Every sub-command's ``--help`` is quick, plain and shows its defaults (issue 29: ``walras run --help`` took
3-9.6 s and showed no default; ``walras solve --help`` printed reStructuredText and internal route names).

Not a timing test (the machine is shared and loaded): a fresh interpreter parses ``walras CMD --help`` and reports
``sys.modules`` at exit; none of the heavy libraries (numpy, torch, numba, scipy, kopf, aiohttp, the Kubernetes
client, the operator) may be among them, which is what kept ``--help`` over 0.5 s. The median wall time of three runs
is printed for the record.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time

import pytest
from walras import cli

HEAVY = ("torch", "numpy", "scipy", "numba", "kopf", "kubernetes", "aiohttp", "prometheus_client", "celpy",
         "jsonschema", "matplotlib", "allocator", "walras.operator", "walras.extender", "walras.metrics",
         "walras.planner", "walras.kube")

PROBE = """
import sys, atexit
atexit.register(lambda: sys.__stderr__.write("MODULES " + " ".join(sorted(sys.modules)) + "\\n"))
from walras.cli import main
sys.argv[0] = "walras"
sys.exit(main(sys.argv[1:]))
"""


def help_of(command: str) -> tuple[str, set[str], float]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", PROBE, command, "--help"], capture_output=True, text=True,
                            timeout=120, env=env)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(x for x in result.stderr.splitlines() if x.startswith("MODULES "))
    return result.stdout, set(line.split()[1:]), seconds


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_help_imports_nothing_heavy_and_shows_defaults(command: str) -> None:
    runs = [help_of(command) for _ in range(3)]
    text, modules, _ = runs[0]
    print(f"walras {command} --help: median {statistics.median(r[2] for r in runs):.3f} s of 3 runs")
    heavy = sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], heavy
    flat = " ".join(text.split())
    assert "(default: " in flat or "default" in flat.lower()
    for markup in ("``", ":func:", ":mod:", ":class:", ":data:"):
        assert markup not in text, (command, markup)


def test_run_help_shows_its_defaults() -> None:
    flat = " ".join(help_of("run")[0].split())
    for shown in ("(default: direct)", "(default: 8888)", "(default: 9847)", "(default: 8080)", "(default: 30.0)",
                  "(default: walras-scheduler)"):
        assert shown in flat, shown
    assert re.search(r"--extender-host .*loopback only", flat)


def test_run_parser_default_host_is_the_extenders() -> None:
    from walras.cli import run
    from walras.extender import DEFAULT_HOST

    assert run.DEFAULT_HOST == DEFAULT_HOST
