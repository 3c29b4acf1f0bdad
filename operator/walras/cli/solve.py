"""``walras solve``: price discovery (paper 004) on a synthetic instance or on arrays from an ``.npz`` file.

Synthetic instances (``--jobs N --resources M``): with ``M = 4`` the instance of 004 Sec. 6.2 (throughputs
``U(0.1,0.3), U(0.1,0.5), U(0.3,0.8), U(0.6,1.0)`` per pool, ``R = (8e5, 1e5, 1e4, 1e3) N / 1e6``), otherwise the
instance of Sec. 6.4 (pool ``j``'s throughputs ``U(0, 1)`` scaled so that pools grow more efficient on average,
``R_j = U(0.1, 1) N / 1.5^j``). ``--input`` reads ``throughput``, ``capacity`` and optionally ``demand``,
``target`` and ``weight``; ``--output`` writes ``prices`` and ``allocation`` (plus the bounds).

Timings: ``seconds`` is the solve alone (the clock of :func:`allocator.pricing.solve`); ``startup_seconds`` is what
the process paid before that clock started to load the compiled kernels (``kernel_route``: ``aot`` when the image's
ahead-of-time module is installed, ``jit`` otherwise, see :mod:`allocator.pricing._compiled.kernels`);
``import_seconds`` is the time from the process's start to this command's start (interpreter and imports; Linux only,
else ``null``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

import numpy as np

from allocator import pricing, utilities
from walras.cli.errors import UsageError


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "solve",
        help="discover pool prices and an allocation (price discovery, paper 004)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=100_000, help="number of jobs of a synthetic instance")
    parser.add_argument("--resources", type=int, default=4, help="number of pools of a synthetic instance")
    parser.add_argument(
        "--utility",
        default="log",
        help="log | linear | power:P | alpha:A | target:T[:W1,W2] (weights drawn uniformly from the list)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic instance and of drawn weights")
    parser.add_argument("--input", metavar="FILE.npz", help="read throughput, capacity[, demand, target, weight]")
    parser.add_argument("--output", metavar="FILE.npz", help="write prices and allocation")
    parser.add_argument("--eps", type=float, default=None, help="duality-gap tolerance (default 1e-3 n)")
    parser.add_argument("--max-iter", type=int, default=None, help="limit on dual evaluations (default 200)")
    parser.add_argument("--device", default=None,
                        help="cpu (numpy, no torch), cuda or cuda:N (torch), or auto (default: cuda when the machine "
                             "has an NVIDIA driver and torch sees a device, else cpu)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--plot", metavar="FILE", default=None,
                        help="draw the prices and the duality gap per dual evaluation to FILE (png, pdf, svg)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="report each dual evaluation on stderr (default: when stderr is a terminal)")
    return parser


def check_device(device: str | None) -> None:
    """:class:`UsageError` for a device this machine does not have (``--device cuda`` without CUDA). ``cpu`` and
    ``auto`` (or none) need no check, and torch is imported only where a CUDA device is named and a driver is present
    (:func:`allocator.pricing.cuda_available`), so ``walras solve`` on a CPU machine never imports it."""
    if device is None or device in ("cpu", "auto"):
        return
    if not pricing.cuda_available():
        raise UsageError(f"--device {device}: this machine has no CUDA device (no NVIDIA driver or torch without "
                         "CUDA; use --device cpu)")
    import torch

    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as exc:
        raise UsageError(f"--device {device}: {' '.join(str(exc).split())} (use --device cpu)") from None


def progress_line(record: Any) -> str:
    """One progress line of a dual evaluation: iteration, kind, dual and primal bounds, gap."""
    return (f"walras solve: evaluation {record.iteration:>3} ({record.kind}): dual {record.dual_value:.8g}, "
            f"primal {record.primal_value:.8g}, gap {record.gap:.3g}")


def plot(history: list[Any], path: str, title: str) -> None:
    """Prices per pool and the duality gap (log scale) against the dual evaluations, written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r.iteration for r in history]
    prices = np.array([r.prices for r in history])
    gaps = np.array([max(r.gap, 1e-16) if math.isfinite(r.gap) else np.nan for r in history])
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, constrained_layout=True)
    for j in range(prices.shape[1] if prices.ndim == 2 else 0):
        top.plot(steps, prices[:, j], label=f"pool {j}")
    top.set_ylabel("price")
    top.legend(loc="best", fontsize="small")
    top.set_title(title)
    bottom.semilogy(steps, gaps, color="black")
    bottom.set_xlabel("dual evaluation")
    bottom.set_ylabel("duality gap g(p) - U(X)")
    try:
        fig.savefig(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot write the plot {path}: {exc}") from None
    finally:
        plt.close(fig)


def synthetic(n: int, m: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The 004 Sec. 6.2 instance for ``m = 4``, the Sec. 6.4 instance otherwise: ``(throughput, capacity)``."""
    if n < 1 or m < 1:
        raise ValueError(f"--jobs and --resources must be positive, got {n} and {m}")
    rng = np.random.default_rng(seed)
    if m == 4:
        lo = np.array([0.1, 0.1, 0.3, 0.6])
        hi = np.array([0.3, 0.5, 0.8, 1.0])
        a = rng.uniform(lo, hi, size=(n, 4))
        r = np.array([8e5, 1e5, 1e4, 1e3]) * n / 1e6
        return a, r
    # Sec. 6.4: columns sampled so that pools are ordered from least to most efficient on average; R_j sampled
    # from U(0.1, 1) and scaled by n / 1.5^j.
    lows = np.linspace(0.1, 0.6, m)
    a = rng.uniform(lows, lows + 0.4, size=(n, m))
    r = rng.uniform(0.1, 1.0, m) * n / 1.5 ** np.arange(m)
    return a, r


def _load(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        arrays = {k: np.asarray(data[k]) for k in data.files}
    for key in ("throughput", "capacity"):
        if key not in arrays:
            raise ValueError(f"{path}: missing array {key!r} (have {sorted(arrays)})")
    return arrays


def process_age() -> float | None:
    """Seconds since this process started (``/proc/self/stat`` start time against ``/proc/uptime``), or ``None``
    where ``/proc`` is not available."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, start time in clock ticks after boot
        return max(uptime - ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return None


def run(args: argparse.Namespace) -> int:
    import_seconds = process_age()
    check_device(args.device)
    show = sys.stderr.isatty() if args.progress is None else args.progress
    try:
        demand = None
        if args.input:
            arrays = _load(args.input)
            a, r = arrays["throughput"], arrays["capacity"]
            demand = arrays.get("demand")
            n = int(a.shape[0]) if a.ndim == 2 else 0
            util = utilities.from_spec(
                args.utility, n, weight=arrays.get("weight"), target=arrays.get("target"), seed=args.seed
            )
        else:
            a, r = synthetic(args.jobs, args.resources, args.seed)
            if args.dtype == "float32":
                a = a.astype(np.float32)  # the solve's own rounding, done once here: no float64 copy held meanwhile
            util = utilities.from_spec(args.utility, args.jobs, seed=args.seed)
        t0 = time.perf_counter()
        kernels = pricing.load_kernels()  # a one-time cost of the process, reported apart from the solve
        loading = time.perf_counter() - t0
        report = (lambda record: print(progress_line(record), file=sys.stderr, flush=True)) if show else None
        res = pricing.PriceDiscovery(eps=args.eps, max_iter=args.max_iter, device=args.device, dtype=args.dtype,
                                     on_evaluation=report).solve(a, r, util, demand=demand)
        startup = loading + res.startup_seconds
    except (ValueError, OSError) as err:
        print(f"walras solve: error: {err}", file=sys.stderr)
        return 2
    if args.output:
        np.savez(
            args.output,
            prices=res.prices,
            allocation=res.allocation,
            throughputs=res.throughputs,
            utility_value=res.utility_value,
            dual_value=res.dual_value,
            gap=res.gap,
        )
    n_jobs, n_res = res.allocation.shape
    if args.plot:
        plot(res.history, args.plot, f"price discovery: {n_jobs} jobs, {n_res} pools, utility {args.utility}")
    if args.json:
        out: dict[str, Any] = {"n_jobs": n_jobs, "n_resources": n_res, "utility": args.utility}
        out.update(res.summary())
        out.update(startup_seconds=startup, import_seconds=import_seconds, kernel_route=kernels.route)
        print(json.dumps(out))
    else:
        print(f"price discovery: {n_jobs} jobs, {n_res} pools, utility {args.utility} ({res.device}, {res.dtype})")
        print("  prices:       " + "  ".join(f"{p:.6g}" for p in res.prices))
        print("  usage/cap:    " + "  ".join(f"{u:.4g}/{c:.4g}" for u, c in zip(res.usage, np.asarray(r))))
        print(f"  lower bound:  {res.utility_value:.6g}   (utility of the returned allocation)")
        print(f"  upper bound:  {res.dual_value:.6g}   (dual value at the prices)")
        print(f"  gap:          {res.gap:.4g}   (eps {res.eps:.4g}; {res.gap / max(n_jobs, 1):.3g} per job)")
        print(f"  status:       {res.status}, {res.iterations} dual evaluations, {res.seconds:.3f} s")
        before = "" if import_seconds is None else f"; imports {import_seconds:.3f} s"
        print(f"  start-up:     kernels ({kernels.route}) {startup:.3f} s{before} (not in the solve time)")
        if args.output:
            print(f"  wrote {args.output}")
    return 0 if res.status in ("optimal", "empty") else 1
