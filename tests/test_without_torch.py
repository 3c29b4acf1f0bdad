"""The CPU path never imports torch (issue 29: torch is the ``torch`` extra, not a dependency).

Each command runs in a fresh interpreter where ``torch`` is blocked (``sys.modules["torch"] = None``: ``import
torch`` raises ``ModuleNotFoundError`` and ``importlib.util.find_spec`` finds nothing, as in a venv without it);
the test checks that the command succeeds and that no torch module was loaded. A real fresh venv without torch is
installed and timed in docs/install.md (it needs the package index); this test runs offline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BLOCK = """
import atexit, sys
# None in sys.modules: `import torch` raises ModuleNotFoundError and importlib.util.find_spec("torch") returns None,
# as in an environment without torch.
sys.modules["torch"] = None
atexit.register(lambda: sys.__stderr__.write("TORCH_MODULES " + str(sorted(
    m for m, v in sys.modules.items() if (m == "torch" or m.startswith("torch.")) and v is not None)) + "\\n"))
from walras.cli import main
sys.argv[0] = "walras"
sys.exit(main(sys.argv[1:]))
"""


def walras_without_torch(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WALRAS_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "operator"), str(ROOT)])
    result = subprocess.run([sys.executable, "-c", BLOCK, *args], capture_output=True, text=True, timeout=timeout,
                            env=env, cwd=ROOT)
    line = next(x for x in result.stderr.splitlines() if x.startswith("TORCH_MODULES "))
    assert line == "TORCH_MODULES []", line
    return result


def test_the_blocker_blocks() -> None:
    result = subprocess.run([sys.executable, "-c", BLOCK.replace("from walras.cli import main", "import torch"),
                             "--version"], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr


def test_solve_on_the_cpu_without_torch() -> None:
    result = walras_without_torch("solve", "--jobs", "2000", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout)
    assert out["status"] == "optimal" and out["device"] == "cpu"


def test_plan_without_torch() -> None:
    result = walras_without_torch("plan", "-f", str(ROOT / "operator" / "walras" / "data" / "examples.yaml"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "solver:" in result.stdout


@pytest.mark.slow
def test_demo_without_torch() -> None:
    result = walras_without_torch("demo", "--cluster", "emulated", "--json", "--timeout", "120")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["emulated"] is True
