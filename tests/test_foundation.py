"""Packaging invariants: the operator package is importable as ``walras`` and never shadows the stdlib ``operator``."""

import importlib
import operator
import subprocess
import sys
from pathlib import Path

import pytest
import walras
from walras import cli

ROOT = Path(__file__).resolve().parents[1]


def test_stdlib_operator_is_not_shadowed() -> None:
    assert operator.add(2, 3) == 5
    assert not (ROOT / "operator" / "__init__.py").exists()
    assert Path(walras.__file__).parent == ROOT / "operator" / "walras"


def test_every_listed_command_is_registered() -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(cli.COMMANDS) <= set(sub.choices)
    for name in cli.COMMANDS:
        module = importlib.import_module(f"walras.cli.{name}")
        assert callable(module.add_parser) and callable(module.run)


def test_cli_requires_a_command() -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2


def test_console_entry_point_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "walras", "--help"], capture_output=True, text=True, check=True)
    assert "walras" in out.stdout and "COMMAND" in out.stdout
