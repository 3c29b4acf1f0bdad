"""``walras simulate``: run a trace of jobs over a virtual cluster under several scheduling policies and compare them.

The trace is a CSV file (``--trace``; columns ``arrival,job_type,work,pods``) or generated as Gavel does
(``--generate --jobs N --rate R --seed S``); the cluster is ``TYPE=NODESxGPUS,...``. Writes ``report.md``,
``report.json`` and the plots into ``-o DIR`` and prints the table. See ``docs/simulate.md``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from walras.cli.errors import UsageError

HELP = "simulate a trace of jobs over time and compare scheduling policies"
DEFAULT_CLUSTER = "k80=8x4,p100=8x4,v100=8x4"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``walras simulate`` and its options."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate", help=HELP,
        description="Discrete-event simulation of a job trace on a virtual GPU cluster under Walras' planner "
                    "and baseline policies (fifo, kueue, gavel); writes a report with job completion times, makespan, "
                    "utilisation, moves, fairness and prices (see docs/simulate.md).")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", metavar="FILE", help="CSV trace (columns arrival,job_type,work,pods)")
    source.add_argument("--generate", action="store_true", help="generate a trace as Gavel does")
    source.add_argument("--job-types", action="store_true",
                        help="list the job types a trace may name (with their pod counts) and the accelerator types "
                             "they are measured on, then exit")
    source.add_argument("--gavel-trace", metavar="FILE", help="a trace file in Gavel's tab-separated format")
    parser.add_argument("--single-gpu", action="store_true", help="generate Gavel's single-GPU trace (default multi)")
    parser.add_argument("--measure", metavar="FIRST,LAST", default=None,
                        help="steady state: stop when jobs FIRST..LAST-1 finished and report their JCT (as Gavel)")
    parser.add_argument("--jobs", type=int, default=100, help="jobs to generate (default 100)")
    parser.add_argument("--rate", type=float, default=10.0, help="arrivals per hour when generating (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated trace (default 0)")
    parser.add_argument("--cluster", default=DEFAULT_CLUSTER,
                        help="pools as TYPE=NODESxGPUS,... with TYPE an accelerator type of the throughput table "
                             f"(k80, p100, v100), NODES the nodes and GPUS the accelerators per node (default "
                             f"{DEFAULT_CLUSTER})")
    parser.add_argument("--policies", default=None,
                        help="comma-separated policies (default: fifo,kueue,gavel,walras,walras-migrate,"
                             "walras-timeslice)")
    parser.add_argument("-o", "--output", default="simulation", metavar="DIR",
                        help="directory for report.md, report.json and the plots (default ./simulation)")
    parser.add_argument("--window", type=float, default=60.0,
                        help="seconds within which events share one re-plan (default 60)")
    parser.add_argument("--restart-delay", type=float, default=30.0,
                        help="seconds without progress after a job's pods move or it resumes (default 30)")
    parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                        help="check the planner's invariants after every re-plan (default on)")
    parser.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True,
                        help="write the PNG plots (default on)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="report each policy's progress on stderr (default: when stderr is a terminal)")
    return parser


def job_types() -> dict[str, list[int]]:
    """The job types of the throughput table (Gavel's measurements, :func:`allocator.datasets.gavel_throughputs`)
    with the pod counts each is measured with, for the rows a trace may use (every type measured, some throughput
    positive; the rule of :func:`walras.simulate.trace.read_csv`)."""
    import numpy as np

    from allocator.datasets import gavel_throughputs

    table = gavel_throughputs()
    out: dict[str, list[int]] = {}
    for i, name in enumerate(table.job_types):
        row = table.throughput[i]
        if np.all(np.isfinite(row)) and np.any(row > 0):
            out.setdefault(name, []).append(int(table.scale_factors[i]))
    return {name: sorted(set(pods)) for name, pods in out.items()}


def check_cluster_types(types: tuple[str, ...], known: tuple[str, ...]) -> None:
    """:class:`UsageError` for a pool type the throughput table has no measurement of (no job could run there: the
    simulation would be meaningless), with the closest known type (``difflib``) and the format."""
    import difflib

    for name in types:
        if name in known:
            continue
        # close spellings only (V100, p-100); another accelerator (a100) gets the list, not a look-alike
        close = difflib.get_close_matches(name.lower().replace("-", ""), list(known), n=1, cutoff=0.8)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"--cluster: no job type is measured on {name!r}: {hint}the accelerator types are "
                         f"{', '.join(known)}; the format is TYPE=NODESxGPUS,... (e.g. {DEFAULT_CLUSTER})")


def explain_job_type(message: str) -> str:
    """``message`` (an unknown job type from :func:`walras.simulate.trace.read_csv`) with the closest job types of the
    table (``difflib``) and where to find them all."""
    import difflib
    import re

    found = re.search(r"job type '(.*)' with", message)
    if found is None or "not a job type" not in message:
        return message
    close = difflib.get_close_matches(found.group(1), list(job_types()), n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"{message}{hint} (walras simulate --job-types lists them all)"


def run(args: argparse.Namespace) -> int:
    """Simulate every chosen policy on the trace; write the report; exit 0, or 1 when an invariant was violated."""
    if args.job_types:
        from allocator.datasets import GAVEL_GPU_TYPES

        print(f"job types (pods measured with), on {', '.join(GAVEL_GPU_TYPES)}:")
        for name, pods in job_types().items():
            print(f"  {name}  pods {','.join(str(p) for p in pods)}")
        return 0
    from allocator.datasets import GAVEL_GPU_TYPES
    from walras.simulate.cluster import parse_cluster
    from walras.simulate.engine import EngineOptions, check_trace, simulate
    from walras.simulate.policies import ALL_POLICIES, POLICIES
    from walras.simulate.report import write_report
    from walras.simulate.trace import generate, read_csv, read_gavel

    try:
        cluster = parse_cluster(args.cluster)
    except ValueError as exc:
        raise UsageError(f"--cluster: {exc}; TYPE is one of {', '.join(GAVEL_GPU_TYPES)} (lower case), NODES and "
                         "GPUS whole numbers >= 1") from None
    check_cluster_types(cluster.types, tuple(GAVEL_GPU_TYPES))
    names = POLICIES if args.policies is None else tuple(p.strip() for p in args.policies.split(",") if p.strip())
    unknown = [p for p in names if p not in ALL_POLICIES]
    if unknown or not names:
        raise UsageError(f"--policies: unknown {', '.join(unknown) or '(none given)'}; choose from "
                         f"{', '.join(ALL_POLICIES)}")
    if len(set(names)) != len(names):
        raise UsageError("--policies names a policy twice")
    for flag, value in (("--window", args.window), ("--restart-delay", args.restart_delay)):
        if not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{flag} must be a number of seconds >= 0, got {value}")
    try:
        if args.trace is not None:
            if not Path(args.trace).is_file():
                raise UsageError(f"--trace: {args.trace}: no such file")
            trace = read_csv(args.trace)
        elif args.gavel_trace is not None:
            if not Path(args.gavel_trace).is_file():
                raise UsageError(f"--gavel-trace: {args.gavel_trace}: no such file")
            trace = read_gavel(args.gavel_trace)
        else:
            trace = generate(args.jobs, args.rate, args.seed, multi_gpu=not args.single_gpu)
        check_trace(trace, cluster)
        parts = [] if args.measure is None else args.measure.split(",")
        window = (int(parts[0]), int(parts[1])) if len(parts) == 2 and all(v.strip().isdigit() for v in parts) else None
        if args.measure is not None and (window is None or not 0 <= window[0] < window[1] <= len(trace.jobs)):
            raise UsageError(f"--measure: FIRST,LAST job ids with 0 <= FIRST < LAST <= {len(trace.jobs)}, "
                             f"got {args.measure}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(explain_job_type(str(exc))) from None
    show = sys.stderr.isatty() if args.progress is None else args.progress
    options = EngineOptions(window=args.window, restart_delay=args.restart_delay, check=args.check, until=window)

    def report(policy: str, now: float, finished: int, total: int) -> None:
        print(f"\r{policy}: t={now / 3600:.2f} h, {finished}/{total} jobs finished", end="", file=sys.stderr,
              flush=True)

    runs = []
    try:
        for name in names:
            runs.append(simulate(trace, cluster, name, options, progress=report if show else None))
            if show:
                print(file=sys.stderr)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    out = Path(args.output)
    meta = {"trace": trace.source, "jobs": len(trace.jobs), "cluster": args.cluster,
            "accelerators": int(cluster.capacity.sum()), "window": args.window,
            "restart_delay": args.restart_delay, "policies": list(names)}
    summaries = write_report(runs, trace.throughput_matrix(cluster.types), out,
                             title=f"walras simulate: {trace.source} on {args.cluster}", meta=meta,
                             plots=args.plots, window=window)
    print((out / "report.md").read_text(), end="")
    bad = [s.policy for s in summaries if s.violations]
    if bad:
        print(f"walras simulate: invariant violations under {', '.join(bad)} (see report.json)", file=sys.stderr)
        return 1
    return 0
