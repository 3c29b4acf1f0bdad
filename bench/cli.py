"""The ``walras`` command line from a cold start (issue 20): fresh processes as a user runs them, against warm calls
in this process, with the floors that no command can go below (the interpreter, ``import numpy``; ``import torch``
for a command on the torch route).

Usage::

    python -m bench.cli             # 5 fresh processes per row (--runs), full size
    python -m bench.cli --quick     # 10^5 jobs, 500 nodes / 2,000 pods, 3 runs: a smoke run, not judged

Rows (each a median of ``--runs`` fresh processes; wall clock of the whole process and its peak RSS (``os.wait4``),
both measured by a small launcher process, :data:`_LAUNCHER`, not by this large one):

* floors: ``python -c pass``, ``import numpy``, ``import torch``, ``import allocator.pricing``;
* ``walras solve --jobs 1000000 --resources 4 --utility log|target:0.2:1,2 --json``: whole process, the solve's own
  ``seconds``, kernel ``startup_seconds``, ``import_seconds`` (process start to the command), peak RSS; side by side
  the warm ``seconds`` of five solves of the same instance in this process;
* first call at 10^4 jobs in a fresh process after its imports, against its own warm calls;
* ``walras plan -f DIR -o json`` on 5,000 nodes / 1,000 jobs / 20,000 pods (``bench.planner.cluster(5000, 10, 1000,
  20)`` in its steady state: every placed pod of the first plan written back as a running Pod), whole process and
  peak RSS; one fresh process broken into phases; warm in this process; and the YAML decoder against PyYAML's
  ``CSafeLoader`` on the same files.

Writes ``docs/bench/cli.md``. The machine is shared: the load average is printed before and after every section.
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
OUTPUT = ROOT / "docs" / "bench" / "cli.md"
WALRAS = str(Path(sys.executable).with_name("walras"))
PLAN_DIR = Path(os.environ.get("WALRAS_BENCH_CLI_DIR", "/tmp/walras-bench-cli"))


def loadavg() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg())


#: Starts the measured command from a small process and writes its peak RSS (KiB, ``os.wait4``) and its wall time
#: (seconds from just before the fork to its exit) to the file named by its first argument. A process forked from
#: this one (hundreds of MiB once it has built a cluster) starts with this one's resident pages in its peak RSS, which
#: ``exec`` keeps: forked from here, ``walras plan`` "used" 454 MiB where GNU ``time`` gave 302 MiB for the same
#: command.
_LAUNCHER = ("import os, subprocess, sys, time\n"
             "start = time.perf_counter()\n"
             "proc = subprocess.Popen(sys.argv[2:])\n"
             "_, status, usage = os.wait4(proc.pid, 0)\n"
             "wall = time.perf_counter() - start\n"
             "open(sys.argv[1], 'w').write(f'{usage.ru_maxrss} {wall}')\n"
             "sys.exit(os.waitstatus_to_exitcode(status))\n")


def fresh(argv: list[str], env: dict[str, str] | None = None, stdout_file: str | None = None) -> dict[str, Any]:
    """Run ``argv`` as a fresh process, started by a small launcher (:data:`_LAUNCHER`): its wall time (fork to
    exit) and peak RSS in MiB as the launcher measured them, exit status, last stdout line."""
    out_path = stdout_file or os.devnull
    measured = "/tmp/walras-bench-cli.measured"
    with open(out_path if stdout_file else "/tmp/walras-bench-cli.out", "w") as out, \
            open("/tmp/walras-bench-cli.err", "w") as err:  # files, not pipes: a 10 MB output cannot block the child
        proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, measured, *argv], stdout=out, stderr=err, cwd=ROOT,
                                env={**os.environ, **(env or {})})
        _, status, _ = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    rss_text, wall_text = Path(measured).read_text().split()
    rss_kib, wall = int(rss_text), float(wall_text)
    last = ""
    if not stdout_file:
        lines = Path("/tmp/walras-bench-cli.out").read_text().strip().splitlines()
        last = lines[-1] if lines else ""
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: "
                           f"{Path('/tmp/walras-bench-cli.err').read_text()[-2000:]}")
    return {"wall": wall, "rss": rss_kib / 1024.0, "rc": proc.returncode, "out": last}


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def verdict(value: float, limit: float, judged: bool) -> str:
    if not judged:
        return "not judged (--quick)"
    return f"{'met' if value <= limit else 'missed'} ({value:.3g} vs {limit:g})"


# ---------------------------------------------------------------------------------------------------- sections


def floors(runs: int, say: Any) -> dict[str, float]:
    say("### Floors: what every command pays before its own work (fresh processes)\n")
    say(f"Load average before: {loadavg()}.\n")
    say("| process | whole process s (median) | range | peak RSS MiB |")
    say("|---|---|---|---|")
    out = {}
    for label, code in (("python -c pass", "pass"), ("import numpy", "import numpy"),
                        ("import torch", "import torch"), ("import allocator.pricing", "import allocator.pricing"),
                        ("import walras.planner.plan, walras.manifests.schema",
                         "import walras.planner.plan, walras.manifests.schema")):
        recs = [fresh([sys.executable, "-c", code]) for _ in range(runs)]
        walls = [r["wall"] for r in recs]
        out[label] = median(walls)
        say(f"| `{label}` | {median(walls):.3f} | {spread(walls)} | {median([r['rss'] for r in recs]):.0f} |")
    say(f"\nLoad average after: {loadavg()}.\n")
    return out


def solve_rows(runs: int, n: int, judged: bool, floor: dict[str, float], say: Any) -> None:
    import numpy as np
    from walras.cli.solve import synthetic

    from allocator import pricing, utilities

    say(f"### `walras solve --jobs {n} --resources 4 --utility U --json`: cold CLI and warm in-process\n")
    say(f"Load average before: {loadavg()}. Cold: {runs} fresh processes each; whole process = wall time of the "
        "process; `seconds` = the solve's own clock (instance generation and kernel loading are outside it); "
        "`startup_seconds` = kernel loading; `import_seconds` = process start to the command's start. Warm: the "
        f"same instance (`walras.cli.solve.synthetic`, float32) solved {runs} times in this process, median "
        "`seconds`. Kernels: " + pricing.load_kernels().route + ".\n")
    say("| utility | whole process s | `seconds` cold | `seconds` warm | cold / warm | `startup_seconds` | "
        "`import_seconds` | peak RSS MiB | targets (issue 20) |")
    say("|---|---|---|---|---|---|---|---|---|")
    for spec, limit in (("log", 0.25), ("target:0.2:1,2", 0.6)):
        recs = [fresh([WALRAS, "solve", "--jobs", str(n), "--resources", "4", "--utility", spec, "--json"])
                for _ in range(runs)]
        js = [json.loads(r["out"]) for r in recs]
        wall = median([r["wall"] for r in recs])
        sec = median([j["seconds"] for j in js])
        a, r_ = synthetic(n, 4, 0)
        a = a.astype(np.float32)
        util = utilities.from_spec(spec, n, seed=0)
        warm = median([pricing.PriceDiscovery(dtype="float32").solve(a, r_, util).seconds for _ in range(runs)])
        rss = median([r["rss"] for r in recs])
        marks = [f"`seconds` <= {limit}: {verdict(sec, limit, judged)}"]
        if spec == "log":
            marks.append(f"whole <= 1.5 s: {verdict(wall, 1.5, judged)}")
            marks.append(f"RSS <= 450 MiB: {verdict(rss, 450, judged)}")
        say(f"| {spec} | {wall:.2f} ({spread([r['wall'] for r in recs])}) | {sec:.3f} | {warm:.3f} | "
            f"{sec / warm:.2f} | {median([j['startup_seconds'] for j in js]):.4f} | "
            f"{median([j['import_seconds'] or float('nan') for j in js]):.2f} | {rss:.0f} | {'; '.join(marks)} |")
    torch_floor = floor.get("import torch", float("nan"))
    say(f"\nLoad average after: {loadavg()}. `walras solve` on a CPU machine runs the numpy route of "
        "`allocator.pricing` and does not import torch; a process that does (`--device cuda`, or the torch route) "
        f"pays at least `import torch`: {torch_floor:.2f} s median in the table above, measured in the same "
        "minutes.\n")


_FIRST = (
    "import json, sys, time\n"
    "t0 = time.perf_counter()\n"
    "import numpy as np\n"
    "from allocator import pricing, utilities\n"
    "from walras.cli.solve import synthetic\n"
    "t1 = time.perf_counter()\n"
    "n = int(sys.argv[1])\n"
    "a, r = synthetic(n, 4, 0)\n"
    "a = a.astype(np.float32)\n"
    "u = utilities.from_spec('log', n, seed=0)\n"
    "calls = []\n"
    "for _ in range(5):\n"
    "    s = time.perf_counter()\n"
    "    res = pricing.PriceDiscovery(dtype='float32').solve(a, r, u)\n"
    "    calls.append(time.perf_counter() - s)\n"
    "print(json.dumps({'imports': t1 - t0, 'calls': calls}))\n"
)


def first_call(runs: int, judged: bool, say: Any) -> None:
    n = 10_000
    say(f"### First call in a fresh process, n = {n}, log, after imports\n")
    say(f"Load average before: {loadavg()}. {runs} fresh processes; each imports, builds the instance, then calls "
        "`PriceDiscovery(dtype='float32').solve` five times: 'first' is the first call's wall time (kernel "
        "loading, thread setting and every first-touch cost included), 'warm' the median of calls 2-5.\n")
    recs = [json.loads(fresh([sys.executable, "-c", _FIRST, str(n)])["out"]) for _ in range(runs)]
    first = median([r["calls"][0] for r in recs])
    warm = median([c for r in recs for c in r["calls"][1:]])
    say("| imports s | first call ms | range ms | warm ms | first / warm | target |")
    say("|---|---|---|---|---|---|")
    firsts = [r["calls"][0] * 1e3 for r in recs]
    say(f"| {median([r['imports'] for r in recs]):.2f} | {first * 1e3:.1f} | {min(firsts):.1f}-{max(firsts):.1f} | "
        f"{warm * 1e3:.1f} | {first / warm:.2f} | <= 50 ms: {verdict(first * 1e3, 50, judged)} |")
    say(f"\nLoad average after: {loadavg()}.\n")


def write_manifests(n_nodes: int, n_jobs: int, replicas: int) -> tuple[Path, dict[str, int]]:
    """The planner bench's cluster in its steady state, as YAML files in ``PLAN_DIR`` (one per kind)."""
    import yaml
    from walras.kube.decode import cluster_from
    from walras.planner import build_plan

    from bench.planner import cluster, running

    snap = cluster(n_nodes, 10, n_jobs, replicas)
    steady = running(snap, build_plan(cluster_from(snap)))
    if PLAN_DIR.exists():
        shutil.rmtree(PLAN_DIR)
    PLAN_DIR.mkdir(parents=True)
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    counts = {}
    for name, objs in (("nodes", steady.nodes), ("pods", steady.pods), ("pools", steady.pools),
                       ("jobs", steady.jobs), ("profiles", steady.profiles)):
        docs = [{"apiVersion": "v1" if o["kind"] in ("Node", "Pod") else "walras.dev/v1alpha1", **o} for o in objs]
        with open(PLAN_DIR / f"{name}.yaml", "w") as f:
            yaml.dump_all(docs, f, Dumper=dumper, sort_keys=False)
        counts[name] = len(docs)
    return PLAN_DIR, counts


_PHASES = (
    "import gc, json, resource, sys, time\n"
    "gc.disable()\n"  # walras plan runs with the cyclic collector paused (walras.cli.plan.run)
    "t0 = time.perf_counter()\n"
    "from walras.cli.plan import ReadAhead, plan_json\n"
    "ahead = ReadAhead.start([sys.argv[1]], validate=True)\n"
    "from walras.manifests import load_manifests\n"
    "from walras.planner import build_plan\n"
    "from walras.kube.encode import plan_document\n"
    "from walras.kube.decode import cluster_from\n"
    "t1 = time.perf_counter()\n"
    "taken = [0]\n"
    "if ahead is not None:\n"
    "    decode = ahead.decode\n"
    "    ahead.decode = lambda i: (taken.__setitem__(0, taken[0] + 1), decode(i))[1]\n"
    "snap = ahead.result() if ahead is not None else None\n"
    "if snap is None:\n"
    "    snap = load_manifests([sys.argv[1]])\n"
    "pieces = len(ahead.pieces) if ahead is not None else 0\n"
    "if ahead is not None:\n"
    "    ahead.close()\n"
    "t2 = time.perf_counter()\n"
    "plan = build_plan(cluster_from(snap))\n"
    "t3 = time.perf_counter()\n"
    "del snap\n"
    "d = plan_document(plan)\n"
    "t4 = time.perf_counter()\n"
    "import orjson\n"
    "text = orjson.dumps(d)\n"
    "t5 = time.perf_counter()\n"
    "child = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "print(json.dumps({'imports': t1 - t0, 'read': t2 - t1, 'plan': t3 - t2, 'to_dict': t4 - t3, 'dumps': t5 - t4,"
    " 'bytes': len(text), 'read_ahead': ahead is not None, 'child_cpu': child.ru_utime + child.ru_stime,"
    " 'taken': taken[0], 'pieces': pieces}))\n"
)


#: A fresh operator process up to and through its first plans: what `walras run` does before its first plan
#: (imports, ``walras.manifests.preload``), then the same cluster planned five times from scratch (no previous plan,
#: so every plan does the whole work), each with the collector paused as the controller does
#: (``Controller.planned_without_gc``). Reading the manifests is not timed (the operator's informers hold them).
_OPERATOR_FIRST = (
    "import gc, json, sys, time\n"
    "t0 = time.perf_counter()\n"
    "from walras.collector import paused\n"
    "from walras.manifests import load_manifests\n"
    "from walras.manifests.preload import preload\n"
    "from walras.planner import build_plan\n"
    "from walras.kube.decode import cluster_from\n"
    "t1 = time.perf_counter()\n"
    "warmup = preload()\n"
    "snap = load_manifests([sys.argv[1]])\n"
    "plans = []\n"
    "for _ in range(5):\n"
    "    s = time.perf_counter()\n"
    "    with paused():\n"
    "        plan = build_plan(cluster_from(snap))\n"
    "    plans.append(time.perf_counter() - s)\n"
    "    del plan\n"
    "print(json.dumps({'imports': t1 - t0, 'preload': warmup, 'plans': plans}))\n"
)


def operator_first_plan(folder: Path, runs: int, judged: bool, say: Any) -> None:
    """Issue 20: a fresh operator pod's first plan within 1.5x of a warm plan (the same plan later in the process)."""
    say(f"First plan of a fresh operator process, same cluster. Load average before: {loadavg()}. {runs} fresh "
        "processes; each does what `walras run` does before its first plan (imports, `walras.manifests.preload`: "
        "one plan of the embedded example cluster), reads the manifests (not timed), then plans the cluster five "
        "times from scratch (no previous plan: each plan does the whole work) with the collector paused as the "
        "controller does. 'first' is plan 1, 'warm' the median of plans 2-5 of the same process.\n")
    recs = [json.loads(fresh([sys.executable, "-c", _OPERATOR_FIRST, str(folder)])["out"]) for _ in range(runs)]
    firsts = [r["plans"][0] for r in recs]
    warms = [median(r["plans"][1:]) for r in recs]
    ratios = [f / w for f, w in zip(firsts, warms, strict=True)]
    say("| imports s | preload s | first plan s | range | warm plan s | first / warm (median of processes) | "
        "range | target (issue 20) |")
    say("|---|---|---|---|---|---|---|---|")
    say(f"| {median([r['imports'] for r in recs]):.2f} | {median([r['preload'] for r in recs]):.2f} | "
        f"{median(firsts):.2f} | {spread(firsts)} | {median(warms):.2f} | {median(ratios):.2f} | "
        f"{min(ratios):.2f}-{max(ratios):.2f} | <= 1.5x: {verdict(median(ratios), 1.5, judged)} |")
    say(f"\nLoad average after: {loadavg()}.\n")


def plan_rows(runs: int, quick: bool, say: Any) -> None:
    import orjson
    import yaml
    from walras.kube.decode import cluster_from
    from walras.kube.encode import plan_document
    from walras.manifests import load_manifests
    from walras.manifests.reader import load_yaml
    from walras.planner import build_plan

    n_nodes, n_jobs = (500, 100) if quick else (5000, 1000)
    t0 = time.perf_counter()
    folder, counts = write_manifests(n_nodes, n_jobs, 20)
    sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
    say(f"### `walras plan -f DIR -o json`: {counts['nodes']} nodes, {counts['jobs']} jobs, {counts['pods']} pods\n")
    say(f"Manifests: `bench.planner.cluster({n_nodes}, 10, {n_jobs}, 20)` planned once and written back in its steady "
        f"state (every placed pod Running on its node) to `{folder}` ({sum(sizes.values()) / 2**20:.1f} MiB of "
        f"YAML, generated in {time.perf_counter() - t0:.0f} s). Load average before: {loadavg()}.\n")
    argv = [WALRAS, "plan", "-f", str(folder), "-o", "json"]
    recs = [fresh(argv, stdout_file=os.devnull) for _ in range(runs)]
    walls = [r["wall"] for r in recs]
    rss = median([r["rss"] for r in recs])
    judged = not quick
    say("| command | whole process s (median) | range | peak RSS MiB | targets (issue 20) |")
    say("|---|---|---|---|---|")
    say(f"| `walras plan -f DIR -o json > /dev/null` | {median(walls):.2f} | {spread(walls)} | {rss:.0f} | "
        f"<= 3 s: {verdict(median(walls), 3.0, judged)}; <= 400 MiB: {verdict(rss, 400, judged)} |")
    say(f"\nLoad average after: {loadavg()}.\n")

    split = max(2, runs // 2)  # the breakdown explains the whole-process rows above; fewer runs keep the bench short
    say("Where a fresh process spends it (the same steps as `walras plan`, collector paused, timed inside one "
        "fresh process per run, "
        f"median of {split} runs), against the same steps warm in this process (median of runs 2-{split + 1}):\n")
    cold = [json.loads(fresh([sys.executable, "-c", _PHASES, str(folder)])["out"]) for _ in range(split)]
    warm: dict[str, list[float]] = {k: [] for k in ("read", "plan", "to_dict", "dumps")}
    for k in range(split + 1):
        s = time.perf_counter()
        snap = load_manifests([folder])
        s1 = time.perf_counter()
        plan = build_plan(cluster_from(snap))
        s2 = time.perf_counter()
        d = plan_document(plan)
        s3 = time.perf_counter()
        orjson.dumps(d)
        s4 = time.perf_counter()
        if k:
            for key, v in zip(warm, (s1 - s, s2 - s1, s3 - s2, s4 - s3), strict=True):
                warm[key].append(v)
    say("| phase | cold s (fresh process) | warm s (this process) |")
    say("|---|---|---|")
    imports = median([c["imports"] for c in cold])
    ahead = all(c["read_ahead"] for c in cold)
    meanwhile = "; the read-ahead child reads meanwhile" if ahead else ""
    say(f"| imports (walras.planner and its market: numpy, no torch on the CPU){meanwhile} | {imports:.2f} | - |")
    taken = f"{median([c['taken'] for c in cold]):.0f} of {cold[0]['pieces']}"
    names = {"read": (f"read YAML + validate: this process takes pieces from the back of the shared queue ({taken} "
                      "pieces, median), then joins the child's" if ahead else "read YAML + validate (CRD schema, CEL)"),
             "plan": "build_plan", "to_dict": "plan_document", "dumps": "orjson.dumps (compact)"}
    for key, label in names.items():
        say(f"| {label} | {median([c[key] for c in cold]):.2f} | {median(warm[key]):.2f} |")
    child = (f" The read-ahead child (`walras.cli.plan.ReadAhead`: read YAML + validate, overlapping the imports) "
             f"used {median([c['child_cpu'] for c in cold]):.2f} s of CPU; warm, this process reads and validates "
             "itself." if ahead else "")
    say(f"\nJSON output: {cold[0]['bytes'] / 2**20:.1f} MiB compact.{child} Load average after: {loadavg()}.\n")

    operator_first_plan(folder, runs, judged, say)

    data = (folder / "pods.yaml").read_bytes()
    ours_t, theirs_t = [], []
    for _ in range(runs):
        s = time.perf_counter()
        mine = load_yaml(data)
        ours_t.append(time.perf_counter() - s)
        s = time.perf_counter()
        ref = list(yaml.load_all(data, Loader=yaml.CSafeLoader))
        theirs_t.append(time.perf_counter() - s)
    assert mine == ref
    say(f"YAML decoding of `pods.yaml` ({len(data) / 2**20:.1f} MiB, {counts['pods']} documents), same process, "
        f"alternating, median of {runs}: `walras.manifests.reader.load_yaml` {median(ours_t):.2f} s, PyYAML "
        f"`yaml.load_all(Loader=CSafeLoader)` {median(theirs_t):.2f} s ({median(theirs_t) / median(ours_t):.1f}x), "
        f"identical objects. Load average after: {loadavg()}.\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cli", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10^5 jobs, 500 nodes; 3 runs; not judged")
    parser.add_argument("--runs", type=int, default=None, help="fresh processes per row (default 5, --quick 3)")
    parser.add_argument("--only", nargs="+", choices=("floors", "solve", "first", "plan"), default=None)
    args = parser.parse_args(argv)
    runs = args.runs or (3 if args.quick else 5)
    only = set(args.only or ("floors", "solve", "first", "plan"))
    from bench._machine import machine_line, now_utc

    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    command = "python -m bench.cli" + (" --quick" if args.quick else "") + (
        f" --runs {args.runs}" if args.runs else "") + (f" --only {' '.join(args.only)}" if args.only else "")
    say("## The command line from a cold start (`walras solve`, `walras plan`; issue 20)\n")
    say(f"Command: `{command}` · {now_utc()} · {machine_line('PyYAML')} · load average at start {loadavg()} "
        "(1/5/15 min). Whole-process times are wall clock from fork to exit measured by the bench, medians of "
        f"{runs} fresh processes (range in brackets); peak RSS from `os.wait4`; both measured by a small launcher "
        "process, since one forked from the bench inherits its resident pages in its peak. The machine is shared "
        "with other work: the load average is printed around each section, and absolute times grow with it.\n")
    writes = not args.quick and args.only is None

    def flush(left: list[str]) -> None:
        """Write the page so far (after every section: a run cut short on a busy machine keeps what it measured)."""
        if writes:
            tail = [f"*Partial page: the run had not yet measured {', '.join(left)}.*\n"] if left else []
            OUTPUT.write_text("\n".join(lines + tail) + "\n")

    floor: dict[str, float] = {}
    sections = [name for name in ("floors", "solve", "first", "plan") if name in only]
    for k, name in enumerate(sections):
        if name == "floors":
            floor = floors(runs, say)
        elif name == "solve":
            solve_rows(runs, 100_000 if args.quick else 1_000_000, not args.quick, floor, say)
        elif name == "first":
            first_call(runs, not args.quick, say)
        else:
            plan_rows(runs, args.quick, say)
        flush(sections[k + 1:])
    say("Thread policy: CPU solves run on the numpy route, single-threaded (the compiled hull walk and numpy); a "
        "torch-route CPU solve runs on one torch intra-op thread (`allocator.pricing.threads`; the measurements "
        "behind it are in the pricing page's \"Threads\" section).\n")
    flush([])
    if writes:
        print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
