"""``walras solve --plot`` draws the convergence, ``--progress`` reports each dual evaluation, ``--device`` is
checked before the solve."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from walras.cli import main


def test_plot_and_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "convergence.png"
    assert main(["solve", "--jobs", "2000", "--resources", "4", "--plot", str(out), "--progress", "--json"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    err = capsys.readouterr().err.splitlines()
    assert err and all(line.startswith("walras solve: evaluation") and "gap" in line for line in err)
    assert "(init)" in err[0]


def test_unwritable_plot_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["solve", "--jobs", "200", "--plot", str(tmp_path / "missing" / "x.png"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "cannot write the plot" in err and "Traceback" not in err


def test_a_missing_device_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    device = "cuda:99" if torch.cuda.is_available() else "cuda"  # a device this machine does not have
    assert main(["solve", "--jobs", "100", "--device", device]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"walras solve: error: --device {device}") and len(err.splitlines()) == 1
