"""Placement quality benchmark (issue 33): the planner's integral plans against the exact integral optimum.

Usage::

    python -m bench.placement                     # 50 generated clusters and the examples, 5 timed plans each
    python -m bench.placement --clusters 10 --repeat 3 --no-write    # a quick look, docs untouched

For each generated cluster of issue 33's shape (:func:`tests.reference.generate`, seeds ``0..clusters-1``) and for
the repository's examples (``examples/`` with ``operator/walras/data/emulated-nodes.yaml``), one cold plan of the
empty cluster (``walras.planner.build_plan``, no previous plan, no cache, the cyclic collector paused as the operator
runs it) is measured against the exact optimum (:func:`tests.reference.optimum`, HiGHS, ``--time-limit`` seconds) by
:func:`tests.reference.evaluate`:

* ``placed/optimal``: the weighted geometric mean over jobs of the plan's throughput over the optimum's;
* idle-while-waiting: plans that leave GPUs idle in a pool where a job that may use it waits and its next replica
  fits on a node there (and how many GPUs);
* starved: jobs the optimum serves that get no pod; under-demand: pods with less of the priced resource than the
  job's ``demand``; GPUs used by the plan and by the optimum; invariant violations (``check_plan``);
* time per plan: the median of ``--repeat`` cold plans (wall clock and process CPU time);
* fixed points: the plan of the cluster with the plan's pods bound and Running (previous: the plan) makes no action
  but ``keep``; with the same pods Pending it only binds. Counted are the actions that break that, and the
  ``placed/optimal`` after three such re-plans (``settled``).

Writes ``docs/bench/placement.md`` (unless ``--no-write``), keeping the hand-written notes after :data:`NOTES`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from walras.collector import paused
from walras.kube.decode import cluster_from
from walras.planner import build_plan
from walras.planner.invariants import check_plan

from bench._machine import machine_line, now_utc
from tests.planning import build_plan as chained_plan
from tests.reference import Instance, applied, evaluate, fixed_point_actions, generate, optimum, snapshot
from tests.reference.clusters import from_snapshot

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "bench" / "placement.md"
#: What follows this line in the page is written by hand and kept when the bench rewrites the page.
NOTES = "<!-- notes: kept by python -m bench.placement -->"
EXAMPLES = (ROOT / "examples", ROOT / "operator" / "walras" / "data" / "emulated-nodes.yaml")


@dataclass(frozen=True)
class Row:
    """One cluster's measures."""

    name: str
    jobs: int
    gpus: float
    ratio: float
    starved: int
    under: int
    idle: float
    waiting: int
    used: float
    used_opt: float
    violations: int
    seconds: float
    cpu: float
    ref_seconds: float
    ref_status: str
    ref_gap: float
    running_actions: int
    pending_actions: int
    settled: float


def timed_plans(snap: Any, repeat: int) -> tuple[Any, float, float]:
    """The plan of ``snap`` (decoded once) and the median wall and CPU seconds of ``repeat`` cold plans."""
    cluster = cluster_from(snap)
    walls, cpus, plan = [], [], None
    for _ in range(repeat):
        with paused():
            w0, c0 = time.perf_counter(), time.process_time()
            plan = build_plan(cluster)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
    assert plan is not None
    return plan, statistics.median(walls), statistics.median(cpus)


def measure(name: str, inst: Instance, snap: Any, repeat: int, time_limit: float) -> Row:
    ref = optimum(inst, time_limit=time_limit)
    plan, wall, cpu = timed_plans(snap, repeat)
    met = evaluate(inst, plan, ref)
    violations = len(check_plan(cluster_from(snap), plan)) + met.violations
    first = chained_plan(snap)
    running = chained_plan(applied(snap, first), first)
    pending = chained_plan(applied(snap, first, bound=False), first)
    current, state = first, snap
    for _ in range(3):
        state = applied(state, current)
        current = chained_plan(state, current)
    settled = evaluate(inst, current, ref).ratio
    return Row(name, inst.n, inst.gpus(), met.ratio, met.starved, met.under_demand, met.idle_waiting,
               met.waiting_jobs, met.gpus, met.gpus_optimum, violations, wall, cpu, ref.seconds, ref.status, ref.gap,
               fixed_point_actions(running), fixed_point_actions(pending, pending=True), settled)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) if values else float("nan")


def summary(rows: list[Row]) -> list[str]:
    ratios = [r.ratio for r in rows]
    idle = [r for r in rows if r.idle > 0]
    lines = [
        "| measure | value |",
        "| --- | --- |",
        f"| clusters | {len(rows)} |",
        f"| placed/optimal (geometric mean over jobs): median, p10, min | {_pct(ratios, 50):.3f}, "
        f"{_pct(ratios, 10):.3f}, {min(ratios):.3f} |",
        f"| plans at the optimum (ratio >= 0.9999) | {sum(r.ratio >= 0.9999 for r in rows)} of {len(rows)} |",
        f"| plans idle while a job waits | {len(idle)} of {len(rows)} (idle GPUs: median "
        f"{_pct([r.idle for r in idle], 50) if idle else 0:.0f}, max "
        f"{max((r.idle / r.gpus for r in idle), default=0.0):.0%} of the cluster) |",
        f"| plans with a starved job (jobs) | {sum(r.starved > 0 for r in rows)} ({sum(r.starved for r in rows)}) |",
        f"| plans with under-demand replicas (pods) | {sum(r.under > 0 for r in rows)} "
        f"({sum(r.under for r in rows)}) |",
        f"| GPUs used, median share of the cluster: plan, optimum | {_pct([r.used / r.gpus for r in rows], 50):.0%}, "
        f"{_pct([r.used_opt / r.gpus for r in rows], 50):.0%} |",
        f"| invariant violations | {sum(r.violations for r in rows)} |",
        f"| time per plan (median over clusters of the median of the runs): wall, CPU | "
        f"{_pct([r.seconds for r in rows], 50):.3f} s, {_pct([r.cpu for r in rows], 50):.3f} s |",
        f"| fixed point, pods Running: plans with actions (actions) | "
        f"{sum(r.running_actions > 0 for r in rows)} ({sum(r.running_actions for r in rows)}) |",
        f"| fixed point, pods Pending: plans with non-bind actions (actions) | "
        f"{sum(r.pending_actions > 0 for r in rows)} ({sum(r.pending_actions for r in rows)}) |",
        f"| placed/optimal after 3 re-plans of the applied plan: median, p10, min | "
        f"{_pct([r.settled for r in rows], 50):.3f}, {_pct([r.settled for r in rows], 10):.3f}, "
        f"{min(r.settled for r in rows):.3f} |",
        f"| reference: status optimal, largest certified gap, median time | "
        f"{sum(r.ref_status == 'optimal' for r in rows)} of {len(rows)}, {max(r.ref_gap for r in rows):.2g}, "
        f"{_pct([r.ref_seconds for r in rows], 50):.2f} s |",
    ]
    return lines


def table(rows: list[Row]) -> list[str]:
    out = ["| cluster | jobs | GPUs | placed/opt | starved | under | idle GPUs (waiting jobs) | used / opt | "
           "plan s | running, pending actions | settled | ref |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        out.append(f"| {r.name} | {r.jobs} | {r.gpus:.0f} | {r.ratio:.3f} | {r.starved} | {r.under} | "
                   f"{r.idle:.0f} ({r.waiting}) | {r.used:.0f} / {r.used_opt:.0f} | {r.seconds:.3f} | "
                   f"{r.running_actions}, {r.pending_actions} | {r.settled:.3f} | {r.ref_status}, "
                   f"gap {r.ref_gap:.1g}, {r.ref_seconds:.1f} s |")
    return out


def examples(repeat: int, time_limit: float) -> Row:
    from walras.manifests.loader import load_manifests

    snap = load_manifests(list(EXAMPLES))
    return measure("examples", from_snapshot(snap), snap, repeat, time_limit)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.placement", description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--no-examples", action="store_true")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    load = os.getloadavg()
    build_plan(cluster_from(snapshot(generate(0))))  # compile the JIT kernels outside the timings
    rows = []
    for seed in range(args.clusters):
        row = measure(f"seed {seed}", generate(seed), snapshot(generate(seed)), args.repeat, args.time_limit)
        rows.append(row)
        print(table([row])[-1], flush=True)
    extra = [] if args.no_examples else [examples(args.repeat, args.time_limit)]
    for row in extra:
        print(table([row])[-1], flush=True)
    head = summary(rows)
    print("\n".join(head))
    if not args.no_write:
        command = "python -m bench.placement" + (f" {' '.join(argv or sys.argv[1:])}" if (argv or sys.argv[1:])
                                                else "")
        text = [
            "# Placement quality: the planner's integral plans against the exact integral optimum (issue 33)", "",
            f"Command: `{command}` ({now_utc()}, {time.perf_counter() - started:.0f} s in all). Machine: "
            f"{machine_line('highspy')}; load average before the run {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}.",
            "", "How it is measured: see the docstring of `bench/placement.py` and `tests/reference/`.", "",
            f"## Generated clusters (seeds 0-{args.clusters - 1})", "", *head, "",
        ]
        if extra:
            text += ["## The examples", "", *table(extra), ""]
        text += ["## Every cluster", "", *table(rows), ""]
        notes = OUTPUT.read_text().split(NOTES, 1)[1] if OUTPUT.exists() and NOTES in OUTPUT.read_text() else "\n"
        OUTPUT.write_text("\n".join(text) + "\n" + NOTES + notes)
        print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
