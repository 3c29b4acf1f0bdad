"""docs/budgets.md's worked example reproduces: its ``greedy.yaml`` (read from the page), planned with the examples and
the emulated nodes by ``walras plan --tenants``, prints the page's TENANTS table; with ``--no-tenants`` the greedy
job takes every V100 GPU, as the page says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from walras.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "budgets.md"


def _example(tmp_path: Path) -> tuple[Path, list[str]]:
    text = PAGE.read_text()
    block = re.search(r"on 8 GPUs:\n\n((?:    .*\n|\n)+?)\n    walras plan", text)
    assert block is not None, "the worked example's manifest block"
    greedy = tmp_path / "greedy.yaml"
    greedy.write_text("\n".join(line[4:] for line in block.group(1).splitlines()) + "\n")
    table = re.search(r"tenants:\n\n((?:    .*\n)+)", text)
    assert table is not None, "the worked example's TENANTS table"
    return greedy, [line[4:].rstrip() for line in table.group(1).splitlines()]


def _plan(greedy: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    code = main(["plan", "-f", str(ROOT / "examples"), "-f", str(ROOT / "operator/walras/data/emulated-nodes.yaml"),
                 "-f", str(greedy), *extra])
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def test_the_worked_example_prints_the_pages_tenants_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    greedy, table = _example(tmp_path)
    out = _plan(greedy, capsys, "--tenants")
    lines = [line.rstrip() for line in out.splitlines()]
    start = lines.index(table[0])
    assert lines[start:start + len(table)] == table


def test_without_tenants_the_greedy_job_takes_every_v100(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    greedy, _ = _example(tmp_path)
    out = _plan(greedy, capsys, "--no-tenants")
    hog = [line for line in out.splitlines() if line.startswith("greedy/hog-v100-") and " create " in line]
    assert len(hog) == 8, out
    assert "TENANT" not in out
