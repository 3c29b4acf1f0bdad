"""Steady-state sweep of ``walras simulate`` (issue 31), measured as Gavel measures its continuous traces.

Gavel (Narayanan et al., OSDI 2020, Sec. 7.2, Fig. 9-10) reports the average JCT of jobs 4,000-5,000 of a long
Poisson trace on 36 K80 + 36 P100 + 36 V100 against the arrival rate, for a single-GPU and a multi-GPU trace. Here:
per trace kind and rate, one trace of ``--jobs`` jobs from :func:`walras.simulate.trace.generate` (Gavel's generator,
seed 0, the same trace for every policy), on ``k80=36x1,p100=36x1,v100=36x1`` (one GPU per node, as Gavel's
``-c 36:36:36``), every policy run until each job of the window ``[first, last)`` finished
(``EngineOptions(until=...)``, as Gavel's ``-s``/``-e``), engine defaults otherwise (60 s coalescing, 30 s restart
delay), invariant checks off. Reported per cell (:func:`walras.simulate.report.steady_state`): the window's average,
median and p99 JCT, finish-time fairness rho (p50, p99), the jobs in the system when the window's first and last
jobs arrive (steady or growing), the makespan (the window's last finish), the pods moved per job-hour, wall seconds.

Results are recorded per (kind, rate, policy) in ``docs/bench/simulate/steady.json``; the section
``docs/bench/simulate/steady.md`` and the plots ``steady_jct_vs_rate.png``, ``steady_in_system_*.png`` are rebuilt
from everything recorded (``bench.simulate`` includes the section in ``docs/bench/simulate.md``)::

    nice python -m bench.simulate_steady --kind multi --rates 0.5 1.5 2.5 3 3.5 --jobs 2000 --window 500 1500
    python -m bench.simulate_steady --doc-only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from bench._machine import machine_line, now_utc

ROOT = Path(__file__).resolve().parents[1]
PLOTS = ROOT / "docs" / "bench" / "simulate"
RESULTS = PLOTS / "steady.json"
SECTION = PLOTS / "steady.md"
CLUSTER = "k80=36x1,p100=36x1,v100=36x1"
POLICIES = ("fifo", "gavel-fifo", "gavel", "gavel-las", "walras", "walras-migrate")
SEED = 0


def measure(kind: str, rate: float, jobs: int, window: tuple[int, int], policy: str) -> dict:
    """One policy on one trace, stopped when the window finished; the steady-state record and the jobs in the
    system over time (for the plot, thinned to at most 400 points)."""
    from walras.simulate.cluster import parse_cluster
    from walras.simulate.engine import EngineOptions, simulate
    from walras.simulate.report import steady_state
    from walras.simulate.trace import generate

    trace = generate(jobs, rate, seed=SEED, multi_gpu=kind == "multi")
    cluster = parse_cluster(CLUSTER)
    load_before = os.getloadavg()[0]
    tick = time.perf_counter()
    run = simulate(trace, cluster, policy, EngineOptions(check=False, until=window))
    wall = time.perf_counter() - tick
    s = steady_state(run, trace.throughput_matrix(cluster.types), *window)
    step = max(1, len(run.active) // 400)
    return {"kind": kind, "rate": rate, "jobs": jobs, "window": list(window), "policy": policy, "seed": SEED,
            **s.to_dict(), "wall_s": wall, "load": load_before, "started": now_utc(),
            "window_arrivals_h": [float(run.arrival[window[0]]) / 3600, float(run.arrival[window[1] - 1]) / 3600],
            "active": [[float(t) / 3600, int(c)] for t, c in run.active[::step]]}


def _read(path: Path = RESULTS) -> list[dict]:
    return json.loads(path.read_text()) if path.exists() else []


def _read_all() -> list[dict]:
    """Every record of ``docs/bench/simulate/steady*.json``."""
    return [r for path in sorted(PLOTS.glob("steady*.json")) for r in _read(path)]


def verdict(r: dict) -> str:
    """steady / rising (more jobs in the system, waits not longer, or not known) / growing."""
    rising = r["in_system_end"] - r["in_system_start"] > max(5.0, 0.25 * r["in_system_start"])
    if "jct_first_half" not in r:
        return "rising" if rising else "steady"
    return "growing" if r["growing"] else ("rising" if rising else "steady")


def write_section(rows: list[dict]) -> None:
    """``steady.md`` and the plots from every recorded row (latest per kind, rate, jobs, window, policy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latest: dict[tuple, dict] = {}
    for r in rows:
        latest[(r["kind"], r["rate"], r["jobs"], tuple(r["window"]), r["policy"])] = r
    cells = sorted(latest.values(), key=lambda r: (r["kind"], r["jobs"], r["rate"], POLICIES.index(r["policy"])
                                                     if r["policy"] in POLICIES else 99))
    lines = ["### Steady state (issue 31): average JCT of a window of a long Poisson trace, as Gavel measures", "",
             f"`python -m bench.simulate_steady` (module docstring): cluster `{CLUSTER}` (36 K80 + 36 P100 + 36 "
             "V100, one GPU per node), traces from `walras.simulate.trace.generate` (Gavel's generator; seed "
             f"{SEED}), each run stopped when every job of the window finished. Machine: {machine_line()}, shared "
             "with other sessions (load average per cell). JCT, rho, jobs in system and moves are simulated "
             "quantities, deterministic; only the wall seconds depend on the load (one run per cell).", "",
             "Steady?: `growing` when the jobs in the system at the window's last arrival exceed those at its first "
             "by more than max(5, 25 %) and the window's second half waits longer (average JCT more than 15 % above "
             "the first half's): the rate is past saturation for that policy "
             "(`walras.simulate.report.steady_state`). A rise alone is also what a trace still warming up shows "
             "(Gavel's long jobs accumulate towards rate x JCT, Little's law, over hundreds of hours): `rising` marks "
             "it; rows recorded before the half-window JCTs existed show `rising` on the first condition only.", "",
             "| trace | jobs | window | rate (jobs/h) | policy | avg JCT (h) | median JCT (h) | p99 JCT (h) | rho p50 "
             "| rho p99 | in system at start | at end | JCT 1st / 2nd half (h) | steady? | makespan (h) | moves/job-h "
             "| wall (s) | load |",
             "| --- | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: "
             "| ---: | ---: | ---: |"]

    def f(v: float | None, spec: str) -> str:
        return "-" if v is None or not np.isfinite(v) else format(v, spec)

    for r in cells:
        lines.append(
            f"| {r['kind']} | {r['jobs']} | {r['first']}-{r['last'] - 1} | {r['rate']:g} | {r['policy']} | "
            f"{f(r['avg_jct'], '.2f')} | {f(r['median_jct'], '.2f')} | {f(r['p99_jct'], '.2f')} | "
            f"{f(r['rho_median'], '.3f')} | {f(r['rho_p99'], '.3f')} | {r['in_system_start']} | {r['in_system_end']} "
            f"| {f(r.get('jct_first_half'), '.2f')} / {f(r.get('jct_second_half'), '.2f')} | {verdict(r)} | "
            f"{f(r['makespan'], '.1f')} | "
            f"{f(r['moves_per_job_hour'], '.3f')} | {r['wall_s']:.0f} | {r['load']:.1f} |")
    written = []
    kinds = sorted({r["kind"] for r in cells})
    if cells:
        fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4), squeeze=False)
        for ax, kind in zip(axes[0], kinds, strict=True):
            for p in POLICIES:
                pts = sorted((r["rate"], r["avg_jct"]) for r in cells if r["kind"] == kind and r["policy"] == p
                             and r["avg_jct"] is not None)
                if pts:
                    ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p)
            ax.set(xlabel="arrival rate (jobs/hour)", ylabel="average JCT of the window (hours)", yscale="log",
                   title=f"{kind}-GPU trace")
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(PLOTS / "steady_jct_vs_rate.png", dpi=110)
        plt.close(fig)
        written.append("steady_jct_vs_rate.png")
        for kind in kinds:
            rates = sorted({r["rate"] for r in cells if r["kind"] == kind})
            cols = min(3, len(rates))
            nrows = (len(rates) + cols - 1) // cols
            fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
            for k, x in enumerate(rates):
                ax = axes[k // cols][k % cols]
                for r in cells:
                    if r["kind"] == kind and r["rate"] == x:
                        ax.step([a for a, _ in r["active"]], [c for _, c in r["active"]], where="post",
                                label=r["policy"])
                        lo, hi = r["window_arrivals_h"]
                ax.axvspan(lo, hi, color="grey", alpha=0.15)
                ax.set(xlabel="time (h)", ylabel="jobs in system", title=f"{kind}, {x:g} jobs/h")
            for k in range(len(rates), nrows * cols):
                axes[k // cols][k % cols].axis("off")
            axes[0][0].legend(fontsize=7)
            fig.tight_layout()
            name = f"steady_in_system_{kind}.png"
            fig.savefig(PLOTS / name, dpi=110)
            plt.close(fig)
            written.append(name)
    lines += ["", "Plots: " + ", ".join(f"[{w}](simulate/{w})" for w in written) + " (shaded: the window's "
              "arrivals).", ""]
    SECTION.write_text("\n".join(lines))
    print(f"wrote {SECTION.relative_to(ROOT)} and {len(written)} plots")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simulate_steady", description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("multi", "single"), default="multi")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.5, 2.5, 3.0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--window", type=int, nargs=2, default=[500, 1500], metavar=("FIRST", "LAST"))
    parser.add_argument("--policies", nargs="+", default=list(POLICIES))
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="JSON file the rows are appended to (the section reads every steady*.json beside it)")
    parser.add_argument("--doc-only", action="store_true", help="only rebuild the section and plots")
    args = parser.parse_args(argv)
    if not args.doc_only:
        for rate in args.rates:
            for policy in args.policies:
                row = measure(args.kind, rate, args.jobs, tuple(args.window), policy)
                print(f"{args.kind} rate {rate:g} {policy:15s} avg {row['avg_jct']:.2f} h  rho p99 "
                      f"{row['rho_p99']:.3f}  in system {row['in_system_start']} -> {row['in_system_end']}  "
                      f"moves/job-h {row['moves_per_job_hour']:.3f}  wall {row['wall_s']:.0f} s", flush=True)
                rows = _read(args.results)
                rows.append(row)
                args.results.parent.mkdir(parents=True, exist_ok=True)
                args.results.write_text(json.dumps(rows) + "\n")
    write_section(_read_all())
    return 0


if __name__ == "__main__":
    sys.exit(main())
