"""Time a user's first hour on this machine: ``pip install`` of the wheel into a fresh venv and the first
``walras demo --cluster emulated`` of that venv, repeated; prints the medians (docs/bench/install.md).

``python scripts/bench_install.py [--runs 5] [--wheel dist/walras-*.whl]``: without ``--wheel`` it builds the wheel
as ``make wheel`` does (the four ahead-of-time kernel modules into the checkout, then ``pip wheel --no-deps
--no-build-isolation``) into a temporary folder. Each run makes a new ``python3.11 -m venv``, installs the wheel
with its dependencies (pip's own cache and index settings as configured on the machine), measures the venv's size
(bytes on disk, ``du -sb``) and runs the first demo with an empty numba cache (``NUMBA_CACHE_DIR``), as after a
fresh install. It reports the exit status of every demo, the cores and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILDERS = ("allocator.pricing._compiled.aot", "allocator.degree.aot", "allocator.colocation.aot",
            "allocator.fairness.aot")


def build_wheel(out: Path) -> Path:
    """The wheel of ``make wheel``: every kernel module built ahead of time into the checkout first."""
    for builder in BUILDERS:
        subprocess.run([sys.executable, "-m", builder], cwd=ROOT, check=True, capture_output=True)
    src = out / "src"
    src.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in ("pyproject.toml", "setup.py", "README.md", "allocator", "operator", "crds"):
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(out / "dist"), str(src)], check=True, capture_output=True)
    return next((out / "dist").glob("walras-*.whl"))


def one_run(wheel: Path, base: Path, python: str) -> dict[str, float | int]:
    """One fresh venv: install seconds, venv bytes, first demo seconds and exit status."""
    venv = base / "venv"
    shutil.rmtree(venv, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith(
        ("WALRAS_", "NUMBA_"))}
    subprocess.run([python, "-m", "venv", str(venv)], check=True, env=env)
    start = time.monotonic()
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], check=True, env=env, cwd=base)
    install = time.monotonic() - start
    size = int(subprocess.run(["du", "-sb", str(venv)], check=True, capture_output=True, text=True).stdout.split()[0])
    cache = base / "numba-cache"
    shutil.rmtree(cache, ignore_errors=True)
    start = time.monotonic()
    demo = subprocess.run([str(venv / "bin" / "walras"), "demo", "--cluster", "emulated"], env={
        **env, "NUMBA_CACHE_DIR": str(cache)}, cwd=base, capture_output=True, text=True, timeout=900)
    first = time.monotonic() - start
    jit = sum("just in time" in line for line in demo.stderr.splitlines())
    return {"install_s": install, "venv_bytes": size, "demo_s": first, "demo_rc": demo.returncode, "jit_lines": jit}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--wheel", type=Path, default=None)
    ap.add_argument("--python", default="python3.11")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="walras-install-") as tmp:
        base = Path(tmp)
        wheel = args.wheel or build_wheel(base)
        load_before = os.getloadavg()
        runs = []
        for i in range(args.runs):
            runs.append(one_run(wheel, base, args.python))
            print(json.dumps({"run": i + 1, **runs[-1]}), flush=True)
        load_after = os.getloadavg()
    summary = {
        "wheel": wheel.name,
        "runs": len(runs),
        "cores": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after],
        "median_install_s": round(statistics.median(r["install_s"] for r in runs), 1),
        "median_venv_mb": round(statistics.median(r["venv_bytes"] for r in runs) / 1e6),
        "median_first_demo_s": round(statistics.median(r["demo_s"] for r in runs), 1),
        "demo_exit_codes": [r["demo_rc"] for r in runs],
        "jit_notice_lines": [r["jit_lines"] for r in runs],
    }
    print(json.dumps(summary))
    return 0 if all(r["demo_rc"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
