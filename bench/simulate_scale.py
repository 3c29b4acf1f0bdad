"""Speed of ``walras simulate`` at the issue-21 scale: 10,000 jobs on 2,000 accelerators in <= 10 minutes on 2 cores.

The trace is :func:`walras.simulate.trace.generate` (Gavel's generator) with a fixed seed: ``--jobs`` jobs (10,000)
arriving at ``--rate`` jobs per hour (30), on ``--gpus`` accelerators (2,000) in three equal pools (k80, p100, v100)
of 8-GPU nodes (``k80=84x8,p100=83x8,v100=83x8``). ``--policy`` (``walras``) replays it to the last completion with
the engine's coalescing window ``--window`` (600 s: one re-plan per batch of events up to 10 minutes apart, see
docs/simulate.md) and the invariant checks off (``EngineOptions(check=False)``), ``--runs`` times (5).

Each run is a fresh ``python -m bench.simulate_scale --child`` process pinned to ``--cores`` CPUs (2;
``os.sched_setaffinity``, and the BLAS/OpenMP thread counts set to the same), so the numbers do not depend on how
many cores the machine has beyond that. Measured inside the child around the ``simulate`` call alone (imports and
trace generation excluded): wall seconds (``time.perf_counter``), CPU seconds of the process (``time.process_time``,
every thread), re-plans and seconds spent in the policy. The 1-minute load average is read before and after each run.

Reported: every run, the median wall and CPU seconds, and whether the median wall is within ``--target`` (600 s).
Recorded in ``docs/bench/simulate/speed.json``; ``docs/bench/simulate.md`` is rebuilt with it (``bench.simulate``'s
page)::

    python -m bench.simulate_scale                                 # the issue's run: 5 x 10,000 jobs (~6 min each)
    python -m bench.simulate_scale --runs 1 --jobs 300 --gpus 96 --no-doc   # a smoke test of the script
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench._machine import machine_line, now_utc

ROOT = Path(__file__).resolve().parents[1]
SPEED = ROOT / "docs" / "bench" / "simulate" / "speed.json"
SEED = 0
NODE_GPUS = 8


def cluster_text(gpus: int) -> str:
    """Three equal pools (k80, p100, v100) of 8-GPU nodes holding ``gpus`` accelerators (rounded down to whole
    nodes; the first pools take the remainder nodes): 2,000 -> ``k80=84x8,p100=83x8,v100=83x8``."""
    nodes = gpus // NODE_GPUS
    per = [nodes // 3 + (1 if k < nodes % 3 else 0) for k in range(3)]
    return ",".join(f"{t}={c}x{NODE_GPUS}" for t, c in zip(("k80", "p100", "v100"), per, strict=True) if c)


def child(args: argparse.Namespace) -> int:
    """One timed run; prints one JSON line."""
    if hasattr(os, "sched_setaffinity") and args.cores:
        available = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, available[: args.cores])
    from walras.simulate.cluster import parse_cluster
    from walras.simulate.engine import EngineOptions, simulate
    from walras.simulate.trace import generate

    cluster = parse_cluster(cluster_text(args.gpus))
    trace = generate(args.jobs, args.rate, seed=args.seed)
    load_before = os.getloadavg()[0]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    run = simulate(trace, cluster, args.policy, EngineOptions(window=args.window, check=False))
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    print(json.dumps({
        "wall_s": wall, "cpu_s": cpu, "replans": run.replans, "decide_s": run.decide_seconds,
        "finished": int(run.finished.sum()), "jobs": len(trace.jobs), "sim_hours": run.end / 3600.0,
        "gpus": int(cluster.capacity.sum()), "cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_before": load_before, "load_after": os.getloadavg()[0]}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simulate_scale", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs, each a fresh process (default 5)")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs in the trace (default 10000)")
    parser.add_argument("--gpus", type=int, default=2_000, help="accelerators, three pools of 8-GPU nodes")
    parser.add_argument("--rate", type=float, default=30.0, help="arrivals per hour (default 30)")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--window", type=float, default=600.0, help="coalescing window in seconds (default 600)")
    parser.add_argument("--policy", default="walras")
    parser.add_argument("--cores", type=int, default=2, help="CPUs each run is pinned to (0: no pinning)")
    parser.add_argument("--target", type=float, default=600.0, help="the target median wall seconds")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before a run is stopped")
    parser.add_argument("--no-doc", action="store_true", help="print only; record nothing")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)

    passed = list(argv if argv is not None else sys.argv[1:])
    command = "python -m bench.simulate_scale" + (" " + " ".join(passed)).rstrip()
    env = dict(os.environ)
    if args.cores:
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
            env[name] = str(args.cores)
    child_argv = [sys.executable, "-m", "bench.simulate_scale", "--child", "--jobs", str(args.jobs), "--gpus",
                  str(args.gpus), "--rate", repr(args.rate), "--seed", str(args.seed), "--window", repr(args.window),
                  "--policy", args.policy, "--cores", str(args.cores)]
    started = now_utc()
    runs: list[dict[str, object]] = []
    for k in range(args.runs):
        before = os.getloadavg()[0]
        try:
            done = subprocess.run(child_argv, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=args.timeout, check=False)
        except subprocess.TimeoutExpired:
            runs.append({"timed_out": True, "wall_s": args.timeout, "load_before": before,
                         "load_after": os.getloadavg()[0]})
            print(f"run {k + 1}/{args.runs}: stopped after {args.timeout:.0f} s", flush=True)
            continue
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            raise SystemExit(f"run {k + 1} failed with exit status {done.returncode}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        runs.append(result)
        print(f"run {k + 1}/{args.runs}: wall {result['wall_s']:.1f} s, CPU {result['cpu_s']:.1f} s, "
              f"{result['replans']} re-plans, {result['finished']}/{result['jobs']} finished, "
              f"{result['sim_hours']:.1f} simulated h, load {result['load_before']:.1f} -> "
              f"{result['load_after']:.1f}", flush=True)
    complete = [r for r in runs if not r.get("timed_out")]
    wall = statistics.median(float(r["wall_s"]) for r in runs)  # type: ignore[arg-type]
    cpu = statistics.median(float(r["cpu_s"]) for r in complete) if complete else float("nan")  # type: ignore[arg-type]
    print(f"median wall {wall:.1f} s, median CPU {cpu:.1f} s over {len(runs)} run(s); target {args.target:.0f} s: "
          f"{'met' if wall <= args.target and len(complete) == len(runs) else 'not met'}", flush=True)
    if args.no_doc:
        return 0
    SPEED.parent.mkdir(parents=True, exist_ok=True)
    SPEED.write_text(json.dumps({
        "command": command, "started": started, "ended": now_utc(), "machine": machine_line("scipy"),
        "config": {"jobs": args.jobs, "gpus": args.gpus, "cluster": cluster_text(args.gpus), "rate": args.rate,
                   "seed": args.seed, "window": args.window, "policy": args.policy, "cores": args.cores,
                   "target": args.target},
        "runs": runs, "median_wall_s": wall, "median_cpu_s": cpu}, indent=1))
    from bench.simulate import main as rebuild

    return rebuild(["--doc-only"])


if __name__ == "__main__":
    sys.exit(main())
