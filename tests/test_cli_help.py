"""``walras --help`` and ``walras --version`` import no sub-command and none of their heavy dependencies.

Not a timing test: a fresh interpreter runs the console entry point (``walras.cli.main``) with the arguments and
prints ``sys.modules`` when it exits; the test reads which modules were imported. ``python -X importtime -m walras
--help`` is checked too (it lists every import on stderr). The measured times are in the report of issue 18
and in ``docs/design-choices.md``'s CLI section.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys

import pytest
from walras import cli

#: Modules ``walras --help`` must not import: each takes from tenths of a second (aiohttp) to seconds (torch).
HEAVY = ("torch", "numpy", "scipy", "numba", "allocator", "kopf", "kubernetes", "aiohttp", "prometheus_client",
         "celpy", "jsonschema", "walras.planner", "walras.operator", "walras.extender", "walras.metrics",
         "walras.cli.solve", "walras.cli.plan", "walras.cli.run", "walras.cli.demo")


PROBE = """
import sys, atexit
atexit.register(lambda: sys.__stderr__.write("MODULES " + " ".join(sorted(sys.modules)) + "\\n"))
from walras.cli import main
sys.argv[0] = "walras"
sys.exit(main(sys.argv[1:]))
"""


def imported_by(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120,
                            env=env)
    line = next(x for x in result.stderr.splitlines() if x.startswith("MODULES "))
    return result, set(line.split()[1:])


def test_importtime_of_help_lists_no_heavy_module() -> None:
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "walras", "--help"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0
    modules = {m.group(1) for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", result.stderr, re.M)}
    assert "walras.cli" in modules
    assert heavy(modules) == []


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("args", [("--help",), ("--version",)])
def test_top_level_help_and_version_import_nothing_heavy(args: tuple[str, ...]) -> None:
    result, modules = imported_by(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "walras.cli" in modules  # -X importtime really lists the imports
    assert heavy(modules) == []


def test_help_lists_every_command_with_its_summary() -> None:
    result, _ = imported_by("--help")
    for name in cli.COMMANDS:
        assert re.search(rf"^\s+{name}\s", result.stdout, re.M), name
    assert "--version" in result.stdout


def test_a_command_imports_only_its_own_module() -> None:
    result, modules = imported_by("plan", "--help")
    assert result.returncode == 0 and "--filename" in result.stdout
    assert "walras.cli.plan" in modules
    assert not {"walras.cli.solve", "walras.cli.run", "walras.cli.demo", "kopf", "walras.operator"} & modules


def test_summaries_equal_the_modules_own_help() -> None:
    """The one-line summaries of ``walras --help`` (kept in ``cli.COMMANDS`` so that no module is imported) are the
    ``help=`` each sub-command registers."""
    for name, summary in cli.COMMANDS.items():
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(f"walras.cli.{name}").add_parser(sub)
        registered = {action.dest: action.help for action in sub._choices_actions}
        assert registered[name] == summary, name


def test_version_is_the_package_version() -> None:
    import walras

    result, _ = imported_by("--version")
    assert result.stdout.strip() == f"walras {walras.__version__}"
