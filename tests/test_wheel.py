"""The wheel runs outside the checkout: it is built, installed into a fresh virtual environment in a temporary
directory, and ``walras --version``, ``walras plan -f`` and ``walras demo`` run from there.

The wheel is built with ``pip wheel --no-deps --no-build-isolation`` from a copy of the sources (so the build leaves
no ``build/`` behind in the checkout) and installed with ``--no-deps --no-index`` into a venv made with
``--without-pip``; the dependencies (numpy, torch, kopf, ...) come from this interpreter's site-packages, appended
to the new venv's path by a ``.pth`` line. That directory's own ``.pth`` files are not processed, so the editable
install of the checkout (a meta-path finder registered by a ``.pth``) stays out: ``walras`` is imported from the
wheel, which the test checks. Nothing is downloaded.

As ``make wheel`` does, the four ahead-of-time kernel modules (``python -m allocator.pricing._compiled.aot``,
``allocator.degree.aot``, ``allocator.colocation.aot``, ``allocator.fairness.aot``) are built into the copy before
the wheel is, so that the wheel is tagged for this platform and carries them: its fresh install loads every kernel
route ahead of time, imports no numba for a plan, and its first ``walras demo`` compiles nothing.

Most commands run with ``NUMBA_DISABLE_JIT=1`` (as a guard: with the extension modules nothing is JIT-compiled
anyway); the first-demo test runs with JIT enabled and an empty numba cache, as a user's first run does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from realtools import require

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "allocator", "operator", "crds")
#: The builders of the ahead-of-time kernels, the package each writes ``_kernels_aot*.so`` into, its route table.
AOT = {
    "allocator.pricing._compiled.aot": ("allocator/pricing/_compiled", "allocator.pricing._compiled.kernels"),
    "allocator.degree.aot": ("allocator/degree", "allocator.degree.kernels"),
    "allocator.colocation.aot": ("allocator/colocation", "allocator.colocation.kernels"),
    "allocator.fairness.aot": ("allocator/fairness", "allocator.fairness.kernels"),
}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "_kernels_aot*.so")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    require("gcc")
    for builder, (folder, _) in AOT.items():  # as make wheel: every kernel set compiled ahead of time
        subprocess.run([sys.executable, "-m", builder, str(src / folder)], check=True, cwd=base, capture_output=True,
                       text=True, env={**os.environ, "PYTHONPATH": str(src)}, timeout=900)
    dist = base / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(src)], check=True, cwd=base, capture_output=True, text=True)
    wheel = next(dist.glob("walras-*.whl"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True, text=True)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "zz_checkout_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = base / "elsewhere"
    work.mkdir()
    return {"wheel": wheel, "venv": venv, "site": site, "work": work}


def walras(env: dict[str, Path], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    clean["NUMBA_DISABLE_JIT"] = "1"
    return subprocess.run([str(env["venv"] / "bin" / "walras"), *args], cwd=env["work"], capture_output=True,
                          text=True, timeout=timeout, env=clean)


def test_wheel_contains_the_crds_and_the_examples(installed: dict[str, Path]) -> None:
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    for crd in sorted((ROOT / "crds").glob("*.yaml")):
        assert f"walras/crds/{crd.name}" in names
        packaged = zipfile.ZipFile(installed["wheel"]).read(f"walras/crds/{crd.name}")
        assert packaged == crd.read_bytes()
    assert "walras/data/examples.yaml" in names
    assert "walras_testbed/emulator/__init__.py" in names  # walras demo's stand-ins, outside the package walras
    assert "walras_testbed/kubelet/__init__.py" in names
    assert not any(n.startswith(("walras/kubelet/", "walras_emulator/")) for n in names)
    assert "walras/data/traces/small.csv" in names  # walras simulate's shipped trace


def test_wheel_carries_every_ahead_of_time_kernel_module(installed: dict[str, Path]) -> None:
    """The wheel is tagged for this interpreter and platform and ships the four extension modules; in the fresh
    venv every route table loads its ``aot`` route, and a plan of the examples imports no numba and prints no
    just-in-time notice."""
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    assert not installed["wheel"].name.endswith("-py3-none-any.whl"), installed["wheel"].name
    for folder, _ in AOT.values():
        assert [n for n in names if n.startswith(f"{folder}/_kernels_aot") and n.endswith(".so")], folder
    forced = ("WALRAS_PRICING_KERNELS", "WALRAS_DEGREE_KERNELS", "WALRAS_COLOCATION_KERNELS", "WALRAS_FAIRNESS_KERNELS")
    clean = {k: v for k, v in os.environ.items()
             if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NUMBA_DISABLE_JIT", *forced)}
    code = (
        "import importlib, json, sys\n"
        "from walras.cli import main\n"
        f"tables = {[table for _, table in AOT.values()]!r}\n"
        "try:\n"
        "    rc = main(['plan', '-f', sys.argv[1]])\n"
        "except SystemExit as e:\n"
        "    rc = e.code\n"
        "assert not rc, rc\n"
        "routes = [importlib.import_module(t).load().route for t in tables]\n"
        "print(json.dumps([routes, 'numba' in sys.modules]))"
    )
    manifests = installed["work"] / "first-plan.yaml"
    shutil.copy(ROOT / "operator" / "walras" / "data" / "examples.yaml", manifests)
    out = subprocess.run([str(installed["venv"] / "bin" / "python"), "-c", code, str(manifests)],
                         cwd=installed["work"], capture_output=True, text=True, env=clean, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    routes, numba = json.loads(out.stdout.strip().splitlines()[-1])
    assert routes == ["aot"] * 4
    assert numba is False
    assert "just in time" not in out.stderr, out.stderr


def test_walras_is_imported_from_the_wheel(installed: dict[str, Path]) -> None:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}  # as walras() runs
    out = subprocess.run([str(installed["venv"] / "bin" / "python"), "-c", "import walras; print(walras.__file__)"],
                         cwd=installed["work"], capture_output=True, text=True, check=True, env=clean).stdout.strip()
    assert Path(out).is_relative_to(installed["site"]), out


def test_version_matches_the_project_and_the_chart(installed: dict[str, Path]) -> None:
    result = walras(installed, "--version")
    assert result.returncode == 0, result.stderr
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert result.stdout.strip() == f"walras {version}"
    chart = yaml.safe_load((ROOT / "helm" / "walras" / "Chart.yaml").read_text())
    assert chart["appVersion"] == version


def test_plan_on_an_example_outside_the_checkout(installed: dict[str, Path]) -> None:
    manifests = installed["work"] / "cluster.yaml"
    shutil.copy(ROOT / "operator" / "walras" / "data" / "examples.yaml", manifests)
    result = walras(installed, "plan", "-f", str(manifests))
    assert result.returncode == 0, result.stderr
    assert "v100" in result.stdout and "solver:" in result.stdout


@pytest.mark.slow
def test_demo_runs_from_the_wheel(installed: dict[str, Path]) -> None:
    """``walras demo`` needs the CRDs and the example cluster packaged in the wheel (it failed with
    ``FileNotFoundError`` when the wheel had no CRDs)."""
    result = walras(installed, "demo", "--cluster", "emulated", "--json", "--timeout", "90")
    assert result.returncode == 0, result.stderr[-2000:]
    assert '"emulated": true' in result.stdout


def test_wheel_requires_torch_only_through_its_extras(installed: dict[str, Path]) -> None:
    """A CPU install pulls no torch (and so no CUDA wheels): torch is a requirement only under the ``torch`` and
    ``gpu`` extras (issue 29)."""
    wheel = zipfile.ZipFile(installed["wheel"])
    metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    torch = [r for r in requires if r.startswith("torch")]
    assert torch and all("extra ==" in r for r in torch), torch
    assert {r.split('extra == "')[1].rstrip('"') for r in torch} == {"torch", "gpu"}


@pytest.mark.slow
def test_first_demo_of_a_fresh_install_passes_with_the_default_timeout(installed: dict[str, Path],
                                                                       tmp_path: Path) -> None:
    """Issue 29: the first ``walras demo`` of a fresh install timed out while numba compiled the kernels. Here the
    wheel's first run has JIT enabled and an empty numba cache, with the default ``--timeout``: the wheel's
    ahead-of-time kernels leave nothing to compile (no just-in-time notice), and the planner is loaded before the
    timeout's clock starts."""
    import time

    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NUMBA_DISABLE_JIT")}
    clean["NUMBA_CACHE_DIR"] = str(tmp_path / "numba-cache")
    start = time.monotonic()
    result = subprocess.run([str(installed["venv"] / "bin" / "walras"), "demo", "--cluster", "emulated"],
                            cwd=installed["work"], capture_output=True, text=True, timeout=900, env=clean)
    print(f"first walras demo of the fresh install: {time.monotonic() - start:.1f} s")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "walras demo: loading the planner (the first run after an install compiles its kernels): done" in \
        result.stderr
    assert "just in time" not in result.stderr, result.stderr[-3000:]
    assert "solver:" in result.stdout
