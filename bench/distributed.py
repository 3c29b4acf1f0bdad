"""``python -m bench.distributed``: ``walras solve --distributed`` under torchrun (gloo, CPU processes) against one
process, on the synthetic instance of paper 004 Sec. 6.2 (4 pools, log utility).

Each configuration runs ``--runs`` times (default 5) alternating with the other, as separate processes: one process
``walras solve --jobs N --json``, and ``torchrun --standalone --nproc-per-node P -m walras solve --distributed
--jobs N --json``. Reported: the median solve time (the solver's own clock, ``seconds``: the dual evaluations and
the all-reduces, without interpreter start-up, imports or instance generation), the median wall time of the whole
command, the iterations, and the largest relative difference of the prices from the one-process solve. Writes
``docs/bench/distributed.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "bench" / "distributed.md"


def run(argv: list[str]) -> tuple[dict[str, Any], float]:
    """Run a command, parse the one JSON line it prints (process 0's), return it with the wall time."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr[-2000:]}")
    line = next(x for x in result.stdout.splitlines() if x.startswith("{"))
    return json.loads(line), wall


def main(argv: list[str] | None = None) -> int:
    from bench._machine import machine_line, now_utc

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="10^5 jobs, 5 runs")
    args = parser.parse_args(argv)
    sizes = [100_000] if args.quick else args.jobs
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    if torchrun is None:
        raise SystemExit("torchrun not found: install torch (pip install 'walras[torch]')")
    rows = []
    for n in sizes:
        common = ["solve", "--jobs", str(n), "--json"]
        one_cmd = [sys.executable, "-m", "walras", *common]
        many_cmd = [torchrun, "--standalone", "--nproc-per-node", str(args.processes), "-m", "walras", *common,
                    "--distributed"]
        ones, manys = [], []
        for _ in range(args.runs):
            ones.append(run(one_cmd))
            manys.append(run(many_cmd))
            print(f"n={n}: one {ones[-1][0]['seconds']:.3f} s, {args.processes} processes "
                  f"{manys[-1][0]['seconds']:.3f} s", file=sys.stderr)
        ref = ones[0][0]["prices"]
        diff = max(abs(p - q) / abs(q) for out, _ in manys for p, q in zip(out["prices"], ref))
        rows.append((n, ones, manys, diff))
    load = os.getloadavg()
    lines = [
        "## Distributed price discovery (`walras solve --distributed`)",
        "",
        f"Command: `python -m bench.distributed --jobs {' '.join(str(n) for n in sizes)} --processes "
        f"{args.processes} --runs {args.runs}`; {now_utc()}.",
        f"Machine: {machine_line('numba')}; load average after the runs {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}.",
        "Instance: paper 004 Sec. 6.2 (4 pools, log utility, float32, seed 0). One process is the baseline; the "
        f"{args.processes} processes are gloo CPU processes on the same machine (`torchrun --standalone`), "
        "`OMP_NUM_THREADS=1`. Medians of the runs, alternated.",
        "",
        "| jobs | processes | solve s (median) | wall s (median) | iterations | max rel. price diff vs 1 process |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for n, ones, manys, diff in rows:
        for label, runs in (("1", ones), (str(args.processes), manys)):
            lines.append(f"| {n:,} | {label} | {statistics.median(o['seconds'] for o, _ in runs):.3f} | "
                         f"{statistics.median(w for _, w in runs):.2f} | {runs[0][0]['iterations']} | "
                         f"{'-' if label == '1' else f'{diff:.1e}'} |")
    lines += ["", "On one 2-core machine the processes share the cores, and each all-reduce crosses loopback TCP: "
              "the split buys no speed here; it is for jobs that do not fit one machine's memory or time, over "
              "several machines (`torchrun --nnodes`).", ""]
    OUT.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
