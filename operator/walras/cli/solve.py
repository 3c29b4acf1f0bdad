"""``walras solve``: price discovery on a synthetic instance or on arrays from an ``.npz`` file (plain text: this
docstring is the command's --help).

(The --help text is :data:`DESCRIPTION`; the method is paper 004, "Price discovery for heterogeneous clusters",
Sec. 4-6; the synthetic instances are those of its Sec. 6.2 and 6.4.)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from walras.cli.errors import UsageError

if TYPE_CHECKING:
    import numpy as np

DESCRIPTION = """\
Discover a price for each pool and an allocation of jobs to pools that maximises the jobs' total utility within
the pools' capacities (a market: each job buys the pool with the best throughput per price).

Instance: either synthetic (--jobs N --resources M; with M = 4 throughputs drawn from U(0.1,0.3), U(0.1,0.5),
U(0.3,0.8), U(0.6,1.0) per pool and capacities (8e5, 1e5, 1e4, 1e3) * N / 1e6; otherwise pool j's throughputs
from U(0.1 + 0.5 j/(M-1), 0.5 + 0.5 j/(M-1)) and capacities U(0.1, 1) * N / 1.5^j), or read from --input FILE.npz,
a numpy archive (numpy.savez) with the arrays:

  throughput  float, shape (N, M)  required  work per unit of time of job i on one unit of pool j (>= 0)
  capacity    float, shape (M,)    required  units of each pool (>= 0; a pool with capacity 0 is reported
                                             as such and left out of the market, not priced)
  demand      float, shape (N,) or (N, M)    units one replica of job i takes (default 1)
  weight      float, shape (N,)              weight of job i in the utility (default 1)
  target      float, shape (N,)              targets of a target:T utility (T is then ignored)

--output FILE.npz writes prices (M,), allocation (N, M), throughputs (N,), utility_value, dual_value and gap.

Utilities (--utility): log (proportional fairness), linear (total throughput), power:P, alpha:A (alpha-fair),
target:T[:W1,W2] (a target throughput T with weights drawn from the list).

Exit status: 0 when the solve converged, 1 when it stopped at --max-iter with the gap still open, 2 on bad input.

Distributed (--distributed): run under torchrun, for example
  torchrun --standalone --nproc-per-node 2 -m walras solve --distributed --jobs 1000000
Every process builds or reads the same instance and solves its share of the jobs; prices and bounds are
all-reduced each step (gloo on the CPU, nccl with --device cuda), so all processes reach the same prices as one
process would. Process 0 prints the result and writes --output. Needs torch: pip install 'walras[torch]'.
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "solve",
        help="discover pool prices and an allocation (price discovery)",
        description=DESCRIPTION,
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
    parser.add_argument("--input", metavar="FILE.npz",
                        help="read throughput, capacity[, demand, weight, target] (format above)")
    parser.add_argument("--output", metavar="FILE.npz", help="write prices and allocation (format above)")
    parser.add_argument("--eps", type=float, default=None,
                        help="duality-gap tolerance (default: 1e-3 times the number of jobs)")
    parser.add_argument("--max-iter", type=int, default=None, help="limit on dual evaluations (default: 200)")
    parser.add_argument("--device", default=None,
                        help="cpu (numpy, no torch), cuda or cuda:N (needs torch), or auto (default: cuda when the "
                             "machine has an NVIDIA driver and torch sees a device, else cpu)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                        help="floating-point precision of the solve")
    parser.add_argument("--distributed", action="store_true",
                        help="shard the jobs over the processes started by torchrun (see above; needs torch)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--plot", metavar="FILE", default=None,
                        help="draw the prices and the duality gap per dual evaluation to FILE (png, pdf, svg)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="report each dual evaluation on stderr (default: when stderr is a terminal; not with "
                             "--distributed)")
    return parser


def check_device(device: str | None) -> None:
    """:class:`UsageError` for a device this machine does not have (``--device cuda`` without CUDA). ``cpu`` and
    ``auto`` (or none) need no check, and torch is imported only where a CUDA device is named and a driver is present
    (:func:`allocator.pricing.cuda_available`), so ``walras solve`` on a CPU machine never imports it."""
    if device is None or device in ("cpu", "auto"):
        return
    from allocator import pricing

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
    import numpy as np

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
    import numpy as np

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
    import numpy as np

    with np.load(path) as data:
        arrays = {k: np.asarray(data[k]) for k in data.files}
    for key in ("throughput", "capacity"):
        if key not in arrays:
            raise ValueError(f"{path}: missing array {key!r} (have {sorted(arrays)}; see walras solve --help)")
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


def open_pools(capacity: np.ndarray) -> np.ndarray:
    """The indices of the pools with a positive capacity: the market prices only these. A pool with no capacity
    offers nothing to buy (every job's allocation there is 0), so it has no market price; left in, the solver would
    raise its price without bound (issue 29: the highest price, 169, for an empty pool). ``ValueError`` when no
    pool has capacity."""
    import numpy as np

    cap = np.asarray(capacity, dtype=np.float64).reshape(-1)
    keep = np.flatnonzero(cap != 0)  # a negative or NaN capacity stays in: the solver's checks name it
    if cap.size and keep.size == 0:
        raise ValueError("every pool has capacity 0: nothing to price")
    return keep


def init_distributed(device: str | None) -> tuple[int, int]:
    """Join the process group torchrun describes in the environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``): gloo on the CPU, nccl on CUDA. ``(rank, world size)``; :class:`UsageError` when torch is not
    installed or the process was not started by torchrun."""
    try:
        import torch.distributed as dist
    except ImportError:
        raise UsageError("--distributed needs torch: pip install 'walras[torch]'") from None
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise UsageError("--distributed runs under torchrun, for example: torchrun --standalone --nproc-per-node 2 "
                         "-m walras solve --distributed")
    if not dist.is_initialized():
        backend = "nccl" if device is not None and device.startswith("cuda") else "gloo"
        dist.init_process_group(backend)
    return int(dist.get_rank()), int(dist.get_world_size())


def gather_rows(part: np.ndarray, rank: int) -> np.ndarray | None:
    """The rows of every process's ``part`` stacked in rank order on process 0 (``None`` on the others)."""
    import numpy as np
    import torch.distributed as dist

    parts: list[Any] = [None] * dist.get_world_size() if rank == 0 else []
    dist.gather_object(np.asarray(part), parts if rank == 0 else None, dst=0)
    return np.concatenate(parts, axis=0) if rank == 0 else None


def run(args: argparse.Namespace) -> int:
    """Solve, print and write what ``args`` ask for; the exit status (module docstring). Under ``--distributed`` every
    process leaves the group together once process 0 has printed (a process that exits while another still talks to
    it aborts the run: gloo's "terminate called without an active exception")."""
    import_seconds = process_age()
    check_device(args.device)
    if not args.distributed:
        return solve_and_report(args, 0, 1, import_seconds)
    rank, world = init_distributed(args.device)
    import torch.distributed as dist

    try:
        return solve_and_report(args, rank, world, import_seconds)
    finally:
        dist.barrier()
        dist.destroy_process_group()


def solve_and_report(args: argparse.Namespace, rank: int, world: int, import_seconds: float | None) -> int:
    """The solve of :func:`run` as process ``rank`` of ``world`` (0 of 1 without ``--distributed``)."""
    import numpy as np

    from allocator import pricing, utilities

    show = (sys.stderr.isatty() if args.progress is None else args.progress) and rank == 0
    try:
        demand = None
        if args.input:
            arrays = _load(args.input)
            a, r = np.asarray(arrays["throughput"]), np.asarray(arrays["capacity"])
            demand = arrays.get("demand")
            if a.ndim != 2 or r.ndim != 1 or a.shape[1] != r.shape[0]:
                raise ValueError(f"{args.input}: throughput has shape {a.shape} and capacity {r.shape}: expected "
                                 "(N, M) and (M,)")
            n = int(a.shape[0])
            util = utilities.from_spec(
                args.utility, n, weight=arrays.get("weight"), target=arrays.get("target"), seed=args.seed
            )
        else:
            a, r = synthetic(args.jobs, args.resources, args.seed)
            if args.dtype == "float32":
                a = a.astype(np.float32)  # the solve's own rounding, done once here: no float64 copy held meanwhile
            n = args.jobs
            util = utilities.from_spec(args.utility, args.jobs, seed=args.seed)
        m_all = int(np.asarray(r).shape[0])
        pools = open_pools(r)
        closed = np.setdiff1d(np.arange(m_all), pools)
        if closed.size:
            a = np.ascontiguousarray(a[:, pools])
            r = np.asarray(r)[pools]
            if demand is not None and np.ndim(demand) == 2:
                demand = np.ascontiguousarray(np.asarray(demand)[:, pools])
        rows = np.array_split(np.arange(n), world)[rank] if world > 1 else None
        if rows is not None:
            a = np.ascontiguousarray(a[rows])
            util = util.take(rows)
            demand = None if demand is None else np.ascontiguousarray(np.asarray(demand)[rows])
        t0 = time.perf_counter()
        kernels = pricing.load_kernels()  # a one-time cost of the process, reported apart from the solve
        loading = time.perf_counter() - t0
        report = (lambda record: print(progress_line(record), file=sys.stderr, flush=True)) if show else None
        if args.distributed:
            res = pricing.solve_distributed(a, r, util, demand=demand, eps=args.eps, max_iter=args.max_iter,
                                            device=args.device, dtype=args.dtype)
        else:
            res = pricing.PriceDiscovery(eps=args.eps, max_iter=args.max_iter, device=args.device, dtype=args.dtype,
                                         on_evaluation=report).solve(a, r, util, demand=demand)
        startup = loading + res.startup_seconds
    except (ValueError, OSError) as err:
        print(f"walras solve: error: {err}", file=sys.stderr)
        return 2
    allocation: np.ndarray | None = res.allocation
    throughputs: np.ndarray | None = res.throughputs
    if world > 1:
        allocation, throughputs = gather_rows(res.allocation, rank), gather_rows(res.throughputs, rank)
    status = 0 if res.status in ("optimal", "empty") else 1
    if rank != 0:
        return status
    assert allocation is not None and throughputs is not None
    # every pool back in the user's order: a pool without capacity has no price (NaN) and no allocation
    prices = np.full(m_all, np.nan)
    prices[pools] = res.prices
    usage = np.zeros(m_all)
    usage[pools] = res.usage
    full = np.zeros((allocation.shape[0], m_all), dtype=allocation.dtype)
    full[:, pools] = allocation
    capacity = np.zeros(m_all)
    capacity[pools] = r
    if args.output:
        np.savez(args.output, prices=prices, allocation=full, throughputs=throughputs,
                 utility_value=res.utility_value, dual_value=res.dual_value, gap=res.gap)
    n_jobs = int(full.shape[0])
    if args.plot:
        plot(res.history, args.plot, f"price discovery: {n_jobs} jobs, {len(pools)} pools, utility {args.utility}")
    if args.json:
        out: dict[str, Any] = {"n_jobs": n_jobs, "n_resources": m_all, "utility": args.utility}
        out.update(res.summary())
        out["prices"] = [None if not math.isfinite(p) else float(p) for p in prices]
        out.update(zero_capacity_pools=[int(j) for j in closed], startup_seconds=startup,
                   import_seconds=import_seconds, kernel_route=kernels.route, processes=world)
        print(json.dumps(out))
    else:
        where = f"{res.device}, {res.dtype}" + (f", {world} processes" if world > 1 else "")
        print(f"price discovery: {n_jobs} jobs, {m_all} pools, utility {args.utility} ({where})")
        print("  prices:       " + "  ".join("-" if not math.isfinite(p) else f"{p:.6g}" for p in prices))
        print("  usage/cap:    " + "  ".join(f"{u:.4g}/{c:.4g}" for u, c in zip(usage, capacity)))
        if closed.size:
            print(f"  no capacity:  pool{'s' if closed.size > 1 else ''} {', '.join(str(j) for j in closed)} "
                  "(capacity 0: left out of the market, not priced)")
        print(f"  lower bound:  {res.utility_value:.6g}   (utility of the returned allocation)")
        print(f"  upper bound:  {res.dual_value:.6g}   (dual value at the prices)")
        print(f"  gap:          {res.gap:.4g}   (eps {res.eps:.4g}; {res.gap / max(n_jobs, 1):.3g} per job)")
        print(f"  status:       {res.status}, {res.iterations} dual evaluations, {res.seconds:.3f} s")
        before = "" if import_seconds is None else f"; imports {import_seconds:.3f} s"
        print(f"  start-up:     loading the compiled kernels {startup:.3f} s{before} (not in the solve time)")
        if args.output:
            print(f"  wrote {args.output}")
    return status
