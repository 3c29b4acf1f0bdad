"""Benchmark for ``allocator.pricing`` (paper 004, Agrawal et al., price discovery): issue 2, section 5.

Run ``python -m bench.pricing`` (full) or ``python -m bench.pricing --quick`` (smoke); writes
``docs/bench/pricing.md``. Every timing is the median of 5 runs (``--runs``), float32, ``eps = 1e-3 n``, on the CPU
with torch's default thread count, unless a row says otherwise.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from allocator import pricing, utilities
from bench._machine import cpu_model

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "bench" / "pricing.md"


def section_62(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """004 Sec. 6.2: a_ij from U(0.1,0.3), U(0.1,0.5), U(0.3,0.8), U(0.6,1.0); R = (8e5, 1e5, 1e4, 1e3) n / 1e6."""
    rng = np.random.default_rng(seed)
    a = rng.uniform([0.1, 0.1, 0.3, 0.6], [0.3, 0.5, 0.8, 1.0], (n, 4)).astype(np.float32)
    return a, np.array([8e5, 1e5, 1e4, 1e3]) * n / 1e6


def section_64(n: int, m: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """004 Sec. 6.4-like: pools more efficient on average as j grows, R_j = U(0.1, 1) n / 1.5^j."""
    rng = np.random.default_rng(seed)
    lows = np.linspace(0.1, 0.6, m)
    a = rng.uniform(lows, lows + 0.4, (n, m)).astype(np.float32)
    return a, rng.uniform(0.1, 1.0, m) * n / 1.5 ** np.arange(m)


def median_time(fn: Callable[[], Any], runs: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def median_cpu_one_thread(fn: Callable[[], Any], runs: int) -> float:
    """Median process CPU time of ``fn`` with one torch thread: on a loaded machine this is far less inflated than
    wall time with several threads (their barriers wait for descheduled peers), so it is reported next to it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = []
        for _ in range(runs):
            t0 = time.process_time()
            fn()
            times.append(time.process_time() - t0)
    finally:
        torch.set_num_threads(before)
    return statistics.median(times)


#: Runs argv[1:] as a child of this small process. ``ru_maxrss`` survives fork + exec (Linux keeps the high-water
#: mark of the forked copy of the parent's memory), so a child started straight from this benchmark, which holds a
#: 1e6-job instance, would report the benchmark's own peak; a grandchild started through a fresh launcher does not.
_LAUNCH = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"


def _fresh_process_rss(code: str) -> float:
    """Peak RSS in MiB (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) of a fresh process running ``code``."""
    code += (
        "\nimport resource\n"
        "print('RSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", _LAUNCH, sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
        check=True,
    )
    return float(next(ln for ln in out.stdout.splitlines() if ln.startswith("RSS ")).split()[1])


def rss_subprocess(n: int, spec: str) -> float:
    """Peak RSS (MiB) of a fresh process that builds the Sec. 6.2 instance and solves it once."""
    return _fresh_process_rss(
        "from bench.pricing import section_62\n"
        "from allocator import pricing, utilities\n"
        f"a, r = section_62({n})\n"
        f"res = pricing.solve(a, r, utilities.from_spec({spec!r}, {n}), device='cpu')\n"
    )


def rss_baseline() -> float:
    """Peak RSS (MiB) of a fresh process that only imports numpy, torch and ``allocator.pricing``."""
    return _fresh_process_rss("import numpy, torch\nfrom allocator import pricing, utilities\n")


def verdict(value: float, limit: float) -> str:
    return "met" if value <= limit else "missed"


def cvxpy_subprocess(n: int, timeout: float) -> tuple[float | None, float | None]:
    """Wall time and optimal value of CVXPY + Clarabel on the Sec. 6.2 log instance (None on timeout)."""
    code = (
        "import time, json, cvxpy as cp, numpy as np\n"
        "from bench.pricing import section_62\n"
        f"a, r = section_62({n}); a = a.astype(float)\n"
        "t0 = time.perf_counter()\n"
        "x = cp.Variable(a.shape, nonneg=True)\n"
        "t = cp.sum(cp.multiply(a, x), axis=1)\n"
        "p = cp.Problem(cp.Maximize(cp.sum(cp.log(t))), [cp.sum(x, axis=1) <= 1, cp.sum(x, axis=0) <= r])\n"
        "p.solve(solver=cp.CLARABEL)\n"
        "print(json.dumps([time.perf_counter() - t0, p.value]))\n"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return None, None
    secs, value = json.loads(out.stdout.strip().splitlines()[-1])
    return float(secs), float(value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smoke-sized run")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cvxpy-timeout", type=float, default=150.0)
    args = ap.parse_args(argv)
    quick, runs = args.quick, args.runs
    big = 100_000 if quick else 1_000_000

    def judge(value: float, limit: float) -> str:  # the targets are for n = 1e6
        return "not judged: --quick uses n = 1e5" if quick else verdict(value, limit)

    mid = 20_000 if quick else 100_000
    lines: list[str] = []
    say = lines.append
    cmd = "python -m bench.pricing" + (" --quick" if quick else "")
    say("## Price discovery (`allocator.pricing`, paper 004)\n")
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    say(f"Command: `{cmd}` · date {_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M UTC} · "
        f"`os.cpu_count()` = {os.cpu_count()} · CPU: {cpu_model()} · torch {torch.__version__} "
        f"({torch.get_num_threads()} threads; problems under {pricing.SINGLE_THREAD_BELOW} entries run on 1) · "
        f"numpy {np.__version__} · load average at start {load} (1/5/15 min). Median of {runs} runs, float32, "
        "eps = 1e-3 n, CPU, hull-walk subproblem solver, pure-torch path (no torch.compile). Cold starts of "
        "n >= 5000 jobs are presolved on a seeded sample of min(n/10, 20000) jobs; 'evaluations' counts full-size "
        "dual evaluations, '+ k' the presolve's evaluations on the sample.\n")

    # 1. n = 1e6 (or 1e5 quick), m = 4: log and target-priority.
    say(f"### Sec. 6.2 instance, n = {big:.0e}, m = 4\n")
    say("| utility | median s | 1-thread CPU s | evaluations | gap / n | converged | target (issue 2) | "
        "004 (4-core CPU) |")
    say("|---|---|---|---|---|---|---|---|")
    a, r = section_62(big)
    at = torch.from_numpy(a)
    for spec, target, paper in (("log", "<= 0.5 s", "3.9 s, 11 it."), ("target:0.2:1,2", "<= 1.5 s", "11 s, 21 it.")):
        u = utilities.from_spec(spec, big, seed=0)
        sec, res = median_time(lambda u=u: pricing.solve(at, r, u, device="cpu"), runs)
        cpu1 = median_cpu_one_thread(lambda u=u: pricing.solve(at, r, u, device="cpu"), runs)
        say(f"| {spec} | {sec:.3f} | {cpu1:.3f} | {res.iterations} + {res.presolve_evaluations} | "
            f"{res.gap / big:.2e} | "
            f"{res.converged} | {target} ({judge(sec, float(target.split()[1]))}) | {paper} |")
        if spec == "log":
            x = res.allocation
            two = float(((x > 1e-6).sum(1) == 2).mean())
            slack = float((x.sum(1) < 1 - 1e-3).mean())
            log_res = res
        else:
            reached = float((res.throughputs >= 0.2 * 0.98).mean())
    say(f"\nLog: {two:.1%} of jobs use two pools, {slack:.1%} have slack (004: ~17 %, ~18 %). "
        f"Target-priority: {reached:.1%} of jobs reach 0.2 within 2 % (004: over 95 %).\n")

    # 2. n = 1e4 end to end.
    a4, r4 = section_62(10_000)
    sec4, res4 = median_time(lambda: pricing.solve(a4, r4, utilities.Log(), device="cpu"), max(runs, 5))
    cpu4 = median_cpu_one_thread(lambda: pricing.solve(a4, r4, utilities.Log(), device="cpu"), max(runs, 5))
    say(f"### n = 1e4, m = 4, log, end to end\n\nmedian {sec4 * 1e3:.1f} ms (1-thread CPU time {cpu4 * 1e3:.1f} ms), "
        f"{res4.iterations} + "
        f"{res4.presolve_evaluations} evaluations, gap / n {res4.gap / 10_000:.2e} "
        f"(target <= 20 ms: {verdict(sec4, 0.020)}).\n")

    # 3. m scaling of one dual evaluation at n = 1e5: hull walk vs all pairs.
    say(f"### Time per dual evaluation, n = {mid:.0e}, Sec. 6.4-like instance\n")
    say("| m | hull walk ms | all pairs ms | hull / m ms |")
    say("|---|---|---|---|")
    for m in (2, 4, 8, 16, 32):
        am, rm = section_64(mid, m)
        u = utilities.Log()
        p = pricing.PriceDiscovery(device="cpu")._initial_prices(
            pricing._prepare(am, rm, u, None, torch.device("cpu"), torch.float32), None
        )
        th, _ = median_time(lambda am=am, rm=rm, p=p, u=u: pricing.dual_evaluation(am, rm, u, p, device="cpu"), runs)
        if m <= 16:
            tp, _ = median_time(
                lambda am=am, rm=rm, p=p, u=u: pricing.dual_evaluation(am, rm, u, p, device="cpu", method="pairs"), runs
            )
            tps = f"{tp * 1e3:.1f}"
        else:
            tps = "not run (n x 528 chords)"
        say(f"| {m} | {th * 1e3:.1f} | {tps} | {th * 1e3 / m:.2f} |")
    say("\n(Each dual evaluation includes input validation; the all-pairs solver materialises n x m(m+1)/2 tensors "
        "and evaluates the utility on every chord.)\n")

    # 4. Warm start after perturbing 1 % of the jobs.
    rng = np.random.default_rng(1)
    a_w = a.copy()
    rows = rng.choice(big, big // 100, replace=False)
    a_w[rows] *= rng.uniform(0.8, 1.2, (rows.size, 4)).astype(np.float32)
    a_wt = torch.from_numpy(a_w)
    cold_s, cold = median_time(lambda: pricing.solve(a_wt, r, utilities.Log(), device="cpu"), runs)
    warm_s, warm = median_time(
        lambda: pricing.solve(a_wt, r, utilities.Log(), device="cpu", prices=log_res.prices), runs
    )
    # Incremental re-solve (previous=): each run gets a fresh previous result (its reuse state moves to the new
    # result), built outside the timed call.
    inc_times, inc = [], None
    for _ in range(runs):
        seed = pricing.solve(torch.from_numpy(a), r, utilities.Log(), device="cpu", prices=log_res.prices)
        t0 = time.perf_counter()
        inc = pricing.solve(a_wt, r, utilities.Log(), device="cpu", previous=seed)
        inc_times.append(time.perf_counter() - t0)
    inc_s = statistics.median(inc_times)
    assert inc is not None
    say(f"### Warm start (n = {big:.0e}, log, 1 % of jobs' throughputs perturbed by U(0.8, 1.2))\n")
    say("| re-solve | median s | evaluations | subproblems solved at the first evaluation | share of cold | gap / n |")
    say("|---|---|---|---|---|---|")
    say(f"| cold (presolve on a 10 % sample, then full evaluations) | {cold_s:.3f} | {cold.iterations} + "
        f"{cold.presolve_evaluations} on the sample | {big} | 100 % | {cold.gap / big:.2e} |")
    say(f"| warm from the previous prices (`prices=`) | {warm_s:.3f} | {warm.iterations} | {big} | "
        f"{warm_s / cold_s:.0%} | {warm.gap / big:.2e} |")
    say(f"| incremental from the previous result (`previous=`) | {inc_s:.3f} | {inc.iterations} | "
        f"{inc.resolved_jobs} | {inc_s / cold_s:.0%} | {inc.gap / big:.2e} |")
    say(f"\nTarget (issue 2): <= 3 evaluations and <= 20 % of the cold-start time: price-only warm start "
        f"{verdict(warm_s / cold_s, 0.2)}, incremental {verdict(inc_s / cold_s, 0.2)} (both "
        f"{'<=' if max(warm.iterations, inc.iterations) <= 3 else '>'} 3 evaluations). The price-only warm start "
        "still evaluates every job's subproblem at least once, and the presolve makes a cold start cost only about "
        "three full evaluations, so it cannot reach 20 %; the incremental re-solve solves again only the changed "
        "jobs' subproblems at the previous prices (the others are the previous solve's, exactly, since jobs are "
        "independent at fixed prices) and then checks the gap as usual.\n")

    # 5. Peak RSS.
    rss_all = [rss_subprocess(big, "log") for _ in range(runs)]
    rss = statistics.median(rss_all)
    base = statistics.median(rss_baseline() for _ in range(runs))
    say(f"### Peak memory\n\nmax RSS of a fresh process that builds the instance and solves n = {big:.0e}, m = 4, "
        f"log once: median {rss:.0f} MiB over {runs} processes (min {min(rss_all):.0f}, max {max(rss_all):.0f}; "
        f"`resource.getrusage(RUSAGE_SELF).ru_maxrss`, started through a small launcher so that the benchmark's "
        f"own peak is not inherited); a process that only imports torch and the package: "
        f"{base:.0f} MiB. Target <= 1 GB (1024 MiB) at n = 1e6: {judge(rss, 1024.0)}.\n")

    # 6. CVXPY + Clarabel side by side.
    say("### CVXPY + Clarabel on the same Sec. 6.2 log instances\n")
    say("| n | ours s (median) | CVXPY+Clarabel s (one run) | ratio | our lower bound | Clarabel optimum |")
    say("|---|---|---|---|---|---|")
    for n in ((2_000,) if quick else (10_000, 100_000)):
        an, rn = section_62(n)
        ours, res_n = median_time(lambda an=an, rn=rn: pricing.solve(an, rn, utilities.Log(), device="cpu"), runs)
        csec, cval = cvxpy_subprocess(n, args.cvxpy_timeout)
        if csec is None:
            say(f"| {n} | {ours:.3f} | > {args.cvxpy_timeout:.0f} (timed out once) | > {args.cvxpy_timeout / ours:.0f} "
                f"| {res_n.utility_value:.2f} | - |")
        else:
            say(f"| {n} | {ours:.3f} | {csec:.1f} | {csec / ours:.0f}x | {res_n.utility_value:.2f} | {cval:.2f} |")
    say("")

    # 7. Gavel measured throughputs.
    from allocator.datasets import gavel_throughputs

    g = gavel_throughputs()
    ok = np.isfinite(g.throughput).all(axis=1)
    types = np.nonzero(ok)[0]
    ng = 20_000 if quick else 100_000
    pick = np.random.default_rng(2).choice(types, ng)
    base = np.nan_to_num(g.throughput[pick])
    dg = g.scale_factors[pick].astype(np.float32)
    cap = np.array([1.0, 1.0, 1.0]) * dg.sum() / 3 / 4  # a quarter of the aggregate demand per GPU type
    noise = np.random.default_rng(3).uniform(0.95, 1.05, base.shape)
    say(f"### Gavel measured throughputs ({len(types)} job types with all of {', '.join(g.gpu_types)} measured)\n")
    say(f"n = {ng} jobs sampled uniformly from those types, demand = scale factor (GPUs), capacity per GPU type = "
        "sum(demand) / 12, log utility.\n")
    say("| throughputs | median s | evaluations | gap / n | converged | prices (" + ", ".join(g.gpu_types) + ") |")
    say("|---|---|---|---|---|---|")
    for label, ag, cap_iter in (
        ("measured values, exact copies per type (max_iter 60)", base.astype(np.float32), 60),
        ("measured values x U(0.95, 1.05) per job", (base * noise).astype(np.float32), None),
    ):
        sec_g, res_g = median_time(
            lambda ag=ag, cap_iter=cap_iter: pricing.solve(
                ag, cap, utilities.Log(), demand=dg, device="cpu", max_iter=cap_iter
            ),
            runs,
        )
        say(f"| {label} | {sec_g:.3f} | {res_g.iterations} | {res_g.gap / ng:.2e} | {res_g.converged} | "
            + ", ".join(f"{p:.3g}" for p in res_g.prices) + " |")
    say("\nWith exact copies, ~1200 identical jobs per type switch pools together at the optimal prices, so the "
        "column-scaled allocation of 004 Sec. 5 alone stays far from the capacity-saturating mix. The primal "
        "recovery splits the tied jobs by one LP over *classes* of identical tied jobs (weighted by their sizes; "
        "`allocator._pricing_recovery`), which is how the first row closes its gap; per-job variation of a few "
        "percent (as real jobs have) removes the ties altogether.\n")

    say("Note: the numbers above were produced on the machine described in the header; on a shared machine they "
        "are inflated and noisy (torch's intra-op threads wait at barriers for descheduled peers: wall times with 2 "
        "threads at a load average above 2 can be 10-100x the quiet ones; the 1-thread CPU columns are the steadier "
        "measure there). Verdicts compare the wall-time median with the target. Load average at the end: "
        + " / ".join(f"{v:.2f}" for v in os.getloadavg()) + ".\n")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
