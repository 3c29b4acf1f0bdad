"""The real Gavel simulator side by side with ``walras simulate`` on the same trace (issue 31).

Gavel (Narayanan et al., OSDI 2020; stanford-futuredata/gavel, MIT) is a baseline, never a dependency: it runs from
a copy outside the repository (``../shared/baselines/gavel/RUNNING.md``: ``cp -r .../scheduler /tmp/gavel-X``, a venv
of its own, the RPC stubs built), in a subprocess, on a trace file this script writes.

Per rate: one trace from :func:`walras.simulate.trace.generate` (Gavel's generator, multi- or single-GPU), written in
Gavel's format (:func:`walras.simulate.trace.write_gavel`, work rounded to whole iterations) and read back
(:func:`walras.simulate.trace.read_gavel`), so both engines run the same jobs; then

- Gavel: ``scripts/drivers/simulate_scheduler_with_trace.py -t FILE -p POLICY -c 36:36:36 -s FIRST -e LAST --seed 0``
  (its 6-minute rounds; the run ends when every job of the window finished); the per-job JCTs it prints are read
  back and averaged here over the window;
- ours: :func:`walras.simulate.engine.simulate` with ``EngineOptions(until=(FIRST, LAST))`` on ``k80=36x1,p100=36x1,
  v100=36x1`` (one GPU per node, as Gavel's ``-c 36:36:36`` with one GPU per server), engine defaults otherwise.

Results are appended to ``docs/bench/simulate/gavel.json`` (one record per engine, policy, rate); ``render`` prints
the markdown table of what is recorded. Run it niced in the background: a Gavel run of a 1,000-job trace takes
minutes (LP per round)::

    nice python -m bench.gavel_baseline --gavel /tmp/gavel-steady --rates 0.5,1.5,2.5 --jobs 1000 --window 200,600
    python -m bench.gavel_baseline --render
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench._machine import machine_line, now_utc

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "bench" / "simulate" / "gavel.json"
CLUSTER = "k80=36x1,p100=36x1,v100=36x1"
GAVEL_POLICIES = ("fifo", "max_min_fairness_perf")
OURS = ("fifo", "gavel", "walras", "walras-migrate")
#: Column order of our policies in the table (the ones recorded).
ORDER = ("fifo", "kueue", "gavel-fifo", "gavel", "gavel-las", "walras", "walras-migrate", "walras-timeslice")
DRIVER = "scripts/drivers/simulate_scheduler_with_trace.py"
_JOB_LINE = re.compile(r"^Job (\d+)(?: \(high priority\))?: ([0-9.]+)$")


def gavel_jcts(out: str) -> dict[int, float]:
    """Per-job JCT (seconds) from the ``Job N: T`` lines Gavel's ``get_average_jct`` prints."""
    jcts: dict[int, float] = {}
    for line in out.splitlines():
        match = _JOB_LINE.match(line.strip())
        if match:
            jcts[int(match.group(1))] = float(match.group(2))
    return jcts


def run_gavel(gavel: Path, trace_file: Path, policy: str, first: int, last: int,
              reset: float | None = None) -> dict:
    """One run of Gavel's trace driver; its window's JCTs and utilisation. ``reset``: Gavel's
    ``minimum_time_between_allocation_resets`` (its default 1,920 s: the allocation is recomputed on an arrival or
    a completion only when that long has passed since the last recomputation; a job that arrived in between has no
    allocation and does not run) set for the experiment of the page; None: Gavel's default."""
    python = gavel / ".venv" / "bin" / "python"
    args = ["-t", str(trace_file), "-p", policy, "-c", "36:36:36", "-s", str(first), "-e", str(last), "--seed", "0"]
    # Gavel logs every round (hundreds of MB per run, most of its wall time): logging is disabled in the process
    # (the JCTs are printed, not logged); the simulation is untouched.
    patch = "" if reset is None else (
        "import scheduler; init = scheduler.Scheduler.__init__; "
        f"scheduler.Scheduler.__init__ = lambda self, *a, **k: init(self, *a, **{{**k, "
        f"'minimum_time_between_allocation_resets': {float(reset)!r}}}); ")
    wrapper = ("import logging, runpy, sys; logging.disable(logging.CRITICAL); " + patch +
               f"sys.argv = [{DRIVER!r}] + sys.argv[1:]; runpy.run_path({DRIVER!r}, run_name='__main__')")
    cmd = [str(python), "-c", wrapper, *args]
    tick = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        done = subprocess.run(cmd, cwd=gavel, stdout=subprocess.PIPE, stderr=err, text=True, check=False)
        if done.returncode != 0:
            err.seek(0, os.SEEK_END)
            err.seek(max(0, err.tell() - 4000))
            raise RuntimeError(f"gavel {policy} failed ({done.returncode}): {err.read()}")
    wall = time.perf_counter() - tick
    jcts = gavel_jcts(done.stdout)
    window = np.array([jcts[i] for i in range(first, last) if i in jcts]) / 3600.0
    util = re.search(r"Cluster utilization: ([0-9.]+)", done.stdout)
    command = " ".join([DRIVER, *args]) + ("" if reset is None else f" (allocation reset {reset:g} s)")
    return {"command": command, "finished": int(window.size), "avg_jct_h": float(window.mean()),
            "median_jct_h": float(np.median(window)), "p99_jct_h": float(np.percentile(window, 99)),
            "utilisation": float(util.group(1)) if util else None, "wall_s": wall}


def run_ours(trace, policy: str, first: int, last: int) -> dict:
    """One run of our engine on the same trace, stopped when the window finished."""
    from walras.simulate.cluster import parse_cluster
    from walras.simulate.engine import EngineOptions, simulate
    from walras.simulate.report import steady_state

    cluster = parse_cluster(CLUSTER)
    tick = time.perf_counter()
    run = simulate(trace, cluster, policy, EngineOptions(check=False, until=(first, last)))
    wall = time.perf_counter() - tick
    s = steady_state(run, trace.throughput_matrix(cluster.types), first, last)
    return {"finished": s.finished, "avg_jct_h": s.avg_jct, "median_jct_h": s.median_jct, "p99_jct_h": s.p99_jct,
            "rho_median": s.rho_median, "rho_p99": s.rho_p99, "in_system_start": s.in_system_start,
            "in_system_end": s.in_system_end, "jct_first_half": s.jct_first_half,
            "jct_second_half": s.jct_second_half, "growing": s.growing, "makespan_h": s.makespan,
            "moves_per_job_hour": s.moves_per_job_hour, "wall_s": wall}


def record(entry: dict, results: Path) -> None:
    results.parent.mkdir(parents=True, exist_ok=True)
    rows = json.loads(results.read_text()) if results.exists() else []
    rows.append(entry)
    results.write_text(json.dumps(rows, indent=1) + "\n")


def recorded() -> list[dict]:
    """Every record of ``docs/bench/simulate/gavel*.json``."""
    return [r for path in sorted(RESULTS.parent.glob("gavel*.json")) for r in json.loads(path.read_text())]


def _flag(r: dict) -> str:
    """`` (growing)`` past saturation (:func:`walras.simulate.report.steady_state`), `` (rising)`` when only the jobs
    in the system rose (a trace still warming up, or a record without the half-window JCTs)."""
    if "in_system_start" not in r:
        return ""
    if r.get("growing") and "jct_first_half" in r:
        return " (growing)"
    return " (rising)" if r["in_system_end"] - r["in_system_start"] > max(5.0, 0.25 * r["in_system_start"]) else ""


def _ratio(values: dict[tuple[str, str], float | None], a: tuple[str, str], b: tuple[str, str]) -> str:
    x, y = values.get(a), values.get(b)
    return "-" if x is None or y is None else f"{x / y:.2f}"


def render(rows: list[dict]) -> str:
    """Markdown: per trace kind and rate, average JCT of the window per engine and policy (latest record wins)."""
    latest: dict[tuple, dict] = {}
    for r in rows:
        latest[(r["kind"], r["rate"], r["jobs"], r["window"][0], r["window"][1], r["engine"], r["policy"])] = r
    keys = sorted({k[:5] for k in latest})
    extra = sorted({k[6] for k in latest if k[5] == "gavel" and k[6] not in GAVEL_POLICIES})
    ours = [p for p in ORDER if any(k[5] == "walras" and k[6] == p for k in latest)]
    columns = [("gavel", p) for p in (*GAVEL_POLICIES, *extra)] + [("walras", p) for p in ours]
    head = ["trace", "rate (jobs/h)", "window"] + [f"{e} {p}" for e, p in columns] + \
        ["ours fifo / Gavel FIFO", "ours gavel-fifo / Gavel FIFO", "ours gavel / Gavel LAS",
         "ours gavel-las / Gavel LAS", "ours walras / Gavel LAS"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in keys:
        cells = []
        values: dict[tuple[str, str], float | None] = {}
        for e, p in columns:
            r = latest.get((*key, e, p))
            values[(e, p)] = r["avg_jct_h"] if r else None
            cells.append("-" if r is None else f"{r['avg_jct_h']:.2f}" + _flag(r))

        cells += [_ratio(values, ("walras", "fifo"), ("gavel", "fifo")),
                  _ratio(values, ("walras", "gavel-fifo"), ("gavel", "fifo")),
                  _ratio(values, ("walras", "gavel"), ("gavel", "max_min_fairness_perf")),
                  _ratio(values, ("walras", "gavel-las"), ("gavel", "max_min_fairness_perf")),
                  _ratio(values, ("walras", "walras"), ("gavel", "max_min_fairness_perf"))]
        lines.append("| " + " | ".join([key[0], f"{key[1]:g}", f"{key[3]}-{key[4] - 1} of {key[2]}", *cells]) + " |")
    return "\n".join(lines) + "\n"


def section(rows: list[dict]) -> list[str]:
    """The page's section (``bench.simulate`` includes it in ``docs/bench/simulate.md``): what was run, the table,
    and the hand-written analysis ``docs/bench/simulate/gavel_notes.md`` when present."""
    if not rows:
        return []
    commands = sorted({r["command"] for r in rows if r["engine"] == "gavel"})
    machines = sorted({r["machine"] for r in rows})
    loads = [r["load"] for r in rows]
    lines = ["### The real Gavel side by side on the same trace (issue 31)", "",
             "`python -m bench.gavel_baseline` (module docstring): per rate, one trace of Gavel's generator "
             "(`walras.simulate.trace.generate`, seed 0) written in Gavel's format, then Gavel's own simulator "
             "(stanford-futuredata/gavel c4fa400, `../shared/baselines/gavel`, copied to /tmp with its own venv; 6-min "
             "rounds, ECOS) and `walras simulate`'s engine (`k80=36x1,p100=36x1,v100=36x1`, 60 s coalescing, 30 s "
             "restart delay) on that same file; average JCT (hours) of the window's jobs, each engine stopping when "
             "the window finished. Gavel's `max_min_fairness_perf` is its heterogeneity-aware LAS (\"Gavel\" in the "
             "paper). One run per cell (the simulated numbers are deterministic); machine: " + "; ".join(machines)
             + f", load average {min(loads):.1f}-{max(loads):.1f} (shared).", "",
             "Gavel's commands (run from its copy, `.venv/bin/python ...`):", "",
             *[f"- `{c}`" for c in commands], "", render(rows).rstrip(), ""]
    notes = RESULTS.parent / "gavel_notes.md"
    if notes.exists():
        lines += [notes.read_text().strip(), ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gavel", type=Path, default=Path("/tmp/gavel"), help="Gavel's copy with its .venv")
    parser.add_argument("--rates", default="0.5,1.5,2.5")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--window", default="200,600", help="FIRST,LAST job ids (LAST excluded)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--single-gpu", action="store_true", help="Gavel's single-GPU trace (default multi-GPU)")
    parser.add_argument("--engines", default="gavel,walras")
    parser.add_argument("--gavel-policies", default=",".join(GAVEL_POLICIES))
    parser.add_argument("--policies", default=",".join(OURS), help="our policies")
    parser.add_argument("--traces", type=Path, default=Path("/tmp/walras-gavel-traces"),
                        help="where the trace files are written (deterministic in kind, jobs, rate and seed)")
    parser.add_argument("--gavel-reset", type=float, default=None,
                        help="Gavel's minimum_time_between_allocation_resets, seconds (default: Gavel's 1,920)")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="the JSON file the records are appended to (render reads every gavel*.json beside it)")
    parser.add_argument("--render", action="store_true", help="print the table of the recorded results and exit")
    args = parser.parse_args(argv)
    if args.render:
        print(render(recorded()), end="")
        return 0
    from walras.simulate.trace import generate, read_gavel, write_gavel

    first, last = (int(v) for v in args.window.split(","))
    kind = "single" if args.single_gpu else "multi"
    engines = args.engines.split(",")
    traces: Path = args.traces
    traces.mkdir(parents=True, exist_ok=True)
    for rate in (float(r) for r in args.rates.split(",")):
        path = traces / f"{kind}-{args.jobs}-r{rate:g}-s{args.seed}.trace"
        write_gavel(generate(args.jobs, rate, seed=args.seed, multi_gpu=not args.single_gpu), path)
        trace = read_gavel(path)
        base = {"kind": kind, "rate": rate, "jobs": args.jobs, "window": [first, last], "seed": args.seed,
                "trace": path.name, "machine": machine_line()}
        todo = [("gavel", p) for p in args.gavel_policies.split(",") if "gavel" in engines] + \
            [("walras", p) for p in args.policies.split(",") if "walras" in engines]
        for engine, policy in todo:
            started = now_utc()
            load = os.getloadavg()[0]
            result = (run_gavel(args.gavel, path.resolve(), policy, first, last, args.gavel_reset)
                      if engine == "gavel" else run_ours(trace, policy, first, last))
            name = policy if engine != "gavel" or args.gavel_reset is None else f"{policy} reset {args.gavel_reset:g}"
            entry = {**base, "engine": engine, "policy": name, "started": started, "load": load, **result}
            record(entry, args.results)
            print(f"{kind} rate {rate:g} {engine} {policy}: avg JCT {result['avg_jct_h']:.2f} h "
                  f"({result['finished']} of the window finished, {result['wall_s']:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
