"""Metrics of simulated runs, as a markdown table, JSON and plots.

Per policy, over the finished jobs (JCT = finish - arrival):

* average, median and p99 JCT (hours; p99 by linear interpolation, ``numpy.percentile``);
* makespan: the last finish time (hours from the trace's start);
* utilisation per pool: accelerator-seconds held by pods / (accelerators x makespan);
* pods moved per job-hour: pods stopped while their job still had work (moved by a re-plan, or paused by a round),
  over the hours jobs spent in the system (arrival to finish, summed over jobs);
* finish-time fairness ``rho`` (Mahajan et al., *Themis*, NSDI 2020, Sec. 3.1; Narayanan et al., *Gavel*, OSDI 2020,
  Sec. 4.2, "finish-time fairness", ``rho_T(m, X) = (t_m + steps_m / throughput(m, X)) / (t_m^isolated + steps_m /
  throughput(m, X^isolated))``, the ratio of the job's finish time under the policy to its finish time on ``1/n`` of
  the cluster, ``n`` the number of jobs sharing it). For a finished job (no steps left) this is ``rho_i = JCT_i /
  T_i`` (:func:`fairness`): ``T_i = work_i / (throughput_i . Xeq_i)`` is the time job i takes on Gavel's equal share
  ``X^isolated = Xeq`` (:func:`walras.simulate.gavel.equal_share`: ``Xeq[i, j] = (C_j / C) min(1, C / (n_i s_i))``, a
  ``1/n_i`` time share of every type, capped by the job's ``s_i`` pods) with ``n_i`` the time-averaged number of jobs
  in the system over job i's life, arrival to finish (itself included; Themis's "average number of contending
  apps" over the app's lifetime). ``rho_i <= 1``: the job did at least as well as under its equal share. Reported:
  mean, median, p99 (linear interpolation) and max, and the fraction of jobs with ``rho > 1``;
* prices (the market policies): per pool, at each re-plan that priced.

Steady state (:func:`steady_state`, issue 31), measured as Gavel measures its continuous traces (Narayanan et al.,
OSDI 2020, Sec. 7.2: the average JCT of jobs 4,000-5,000 of a long Poisson trace): over a window ``[first, last)``
of job ids, the average, median and p99 JCT of the window's jobs, their finish-time fairness (median, p99), the jobs
in the system when the window's first job arrives and when its last one arrives, the average JCT of the window's
first and second halves (``growing``: the jobs in the system rise by more than ``max(5, 25 %)`` over the window *and*
the second half's average JCT exceeds the first's by more than 15 %: the queue builds and waits lengthen, the rate is
past saturation; a rise alone is also what a trace still warming up shows, its long jobs accumulating towards
``rate x JCT`` by Little's law), the makespan (the run's end:
with ``EngineOptions.until`` the last finish of a window job, as in Gavel) and the pods moved per job-hour over the
run.

Plots (matplotlib, Agg backend, imported only when plots are written): ``jct_cdf.png`` (JCT CDF per policy),
``utilisation.png`` (accelerators in use over time, per policy), ``prices.png`` (price per pool over time),
``in_system.png`` (jobs in the system over time, with a steady-state window).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from walras.simulate.engine import PolicyRun


@dataclass(frozen=True)
class Summary:
    """One policy's metrics (module docstring); times in hours."""

    policy: str
    jobs: int
    finished: int
    avg_jct: float
    median_jct: float
    p99_jct: float
    makespan: float
    utilisation: dict[str, float]
    pods_moved: int
    moves_per_job_hour: float
    rho_mean: float
    rho_median: float
    rho_p99: float
    rho_max: float
    rho_unfair: float
    replans: int
    decide_seconds: float
    wall_seconds: float
    violations: int
    final_prices: dict[str, float] | None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in self.__dict__.items() if k != "notes"} | {"notes": list(self.notes)}


def _step_integral(points: list[tuple[float, Any]], end: float) -> tuple[np.ndarray, np.ndarray]:
    """Times and cumulative integrals of a right-continuous step function given as (time, value) changes."""
    times = np.array([t for t, _ in points] + [end], dtype=np.float64)
    values = np.array([np.asarray(v, dtype=np.float64) for _, v in points])
    widths = np.clip(np.diff(times), 0.0, None)
    cumulative = np.concatenate([np.zeros((1, *values.shape[1:])), np.cumsum(values * widths.reshape(
        (-1,) + (1,) * (values.ndim - 1)), axis=0)])
    return times, cumulative


def equal_rows(scale: np.ndarray, capacity: np.ndarray, n_jobs: np.ndarray) -> np.ndarray:
    """Gavel's equal share (:func:`walras.simulate.gavel.equal_share`) with a number of jobs per row:
    ``Xeq[i, j] = (capacity[j] / C) * min(1, C / (n_i * scale[i]))``."""
    total = float(capacity.sum())
    share = np.minimum(1.0, total / (np.asarray(n_jobs, dtype=np.float64) * scale))
    return share[:, None] * (capacity / total)[None, :]


def fairness(run: PolicyRun, throughput: np.ndarray) -> np.ndarray:
    """``rho_i = JCT_i / T_i`` of every finished job, in job order (module docstring: Themis Sec. 3.1, Gavel Sec. 4.2):
    ``n_i`` is the integral of ``run.active`` (jobs in the system, a step function) over [arrival, finish] divided
    by the job's JCT; ``T_i`` the job's work over its throughput on the equal share of :func:`equal_rows`."""
    done = np.flatnonzero(run.finished)
    if done.size == 0:
        return np.zeros(0)
    times, cum = _step_integral([(t, c) for t, c in run.active], run.end)
    start, stop = run.arrival[done], run.finish[done]
    mean_n = np.maximum(1.0, (np.interp(stop, times, cum) - np.interp(start, times, cum))
                        / np.maximum(stop - start, 1e-12))
    cap = run.capacity.astype(np.float64)
    xeq = equal_rows(run.pods[done], cap, mean_n)
    rate = (throughput[done] * xeq).sum(axis=1)
    isolated = run.work[done] / np.where(rate > 0, rate, np.nan)
    return (stop - start) / isolated


def summarise(run: PolicyRun, throughput: np.ndarray) -> Summary:
    """The metrics of ``run``; ``throughput`` is the trace's (n, m) matrix over the cluster's types."""
    jct = run.jct / 3600.0
    finished = run.finished
    makespan_s = float(np.nanmax(run.finish)) if finished.any() else run.end
    times, cum = _step_integral(run.usage, max(run.end, makespan_s))
    held = np.array([np.interp(makespan_s, times, cum[:, j]) for j in range(len(run.types))])
    utilisation = {t: float(held[j] / (run.capacity[j] * makespan_s)) if makespan_s > 0 else 0.0
                   for j, t in enumerate(run.types)}
    in_system = np.where(finished, run.finish, run.end) - run.arrival
    job_hours = float(np.clip(in_system, 0.0, None).sum()) / 3600.0
    rho = fairness(run, throughput)
    nan = float("nan")
    return Summary(
        policy=run.policy, jobs=len(run.arrival), finished=int(finished.sum()),
        avg_jct=float(jct.mean()) if jct.size else nan, median_jct=float(np.median(jct)) if jct.size else nan,
        p99_jct=float(np.percentile(jct, 99)) if jct.size else nan, makespan=makespan_s / 3600.0,
        utilisation=utilisation, pods_moved=run.pods_moved,
        moves_per_job_hour=run.pods_moved / job_hours if job_hours > 0 else 0.0,
        rho_mean=float(np.mean(rho)) if rho.size else nan, rho_median=float(np.median(rho)) if rho.size else nan,
        rho_p99=float(np.percentile(rho, 99)) if rho.size else nan, rho_max=float(np.max(rho)) if rho.size else nan,
        rho_unfair=float(np.mean(rho > 1.0)) if rho.size else nan, replans=run.replans,
        decide_seconds=run.decide_seconds, wall_seconds=run.wall_seconds, violations=len(run.violations),
        final_prices=dict(run.prices[-1][1]) if run.prices else None, notes=tuple(run.notes))


@dataclass(frozen=True)
class SteadyState:
    """One policy's steady-state metrics over the window of jobs ``[first, last)`` (module docstring); hours."""

    policy: str
    first: int
    last: int
    finished: int
    avg_jct: float
    median_jct: float
    p99_jct: float
    rho_median: float
    rho_p99: float
    in_system_start: int
    in_system_end: int
    jct_first_half: float
    jct_second_half: float
    growing: bool
    makespan: float
    moves_per_job_hour: float

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in self.__dict__.items()}


def in_system(run: PolicyRun, at: float) -> int:
    """Jobs in the system (arrived, not finished) at time ``at``, from the run's record."""
    arrived = run.arrival <= at
    gone = np.isfinite(run.finish) & (run.finish <= at)
    return int(np.sum(arrived & ~gone))


def steady_state(run: PolicyRun, throughput: np.ndarray, first: int, last: int) -> SteadyState:
    """The steady-state metrics of ``run`` over the jobs ``first..last-1`` (module docstring); ``throughput`` the
    trace's (n, m) matrix over the cluster's types."""
    if not 0 <= first < last <= len(run.arrival):
        raise ValueError(f"the window [{first}, {last}) is not inside the run's {len(run.arrival)} jobs")
    ids = np.arange(first, last)
    done = ids[np.isfinite(run.finish[ids])]
    jct = (run.finish[done] - run.arrival[done]) / 3600.0
    finished_ids = np.flatnonzero(run.finished)
    rho_all = fairness(run, throughput)
    rho = rho_all[np.isin(finished_ids, done)]
    start = in_system(run, float(run.arrival[first]))
    end = in_system(run, float(run.arrival[last - 1]))
    middle = (first + last) // 2
    halves = []
    for lo, hi in ((first, middle), (middle, last)):
        part = ids[(ids >= lo) & (ids < hi)]
        part = part[np.isfinite(run.finish[part])]
        halves.append(float(np.mean(run.finish[part] - run.arrival[part])) / 3600.0 if part.size else float("nan"))
    rising = end - start > max(5.0, 0.25 * start)
    slower = not np.isfinite(halves[0]) or not np.isfinite(halves[1]) or halves[1] > 1.15 * halves[0]
    in_sys = np.where(run.finished, run.finish, run.end) - run.arrival
    job_hours = float(np.clip(in_sys, 0.0, None).sum()) / 3600.0
    nan = float("nan")
    return SteadyState(
        policy=run.policy, first=first, last=last, finished=int(done.size),
        avg_jct=float(jct.mean()) if jct.size else nan, median_jct=float(np.median(jct)) if jct.size else nan,
        p99_jct=float(np.percentile(jct, 99)) if jct.size else nan,
        rho_median=float(np.median(rho)) if rho.size else nan,
        rho_p99=float(np.percentile(rho, 99)) if rho.size else nan,
        in_system_start=start, in_system_end=end, jct_first_half=halves[0], jct_second_half=halves[1],
        growing=bool(rising and slower),
        makespan=run.end / 3600.0, moves_per_job_hour=run.pods_moved / job_hours if job_hours > 0 else 0.0)


def steady_markdown(rows: list[SteadyState], title: str) -> str:
    """The steady-state table, one row per policy."""
    head = ["policy", "window", "finished", "avg JCT (h)", "median JCT (h)", "p99 JCT (h)", "rho p50", "rho p99",
            "in system at start", "at end", "JCT 1st / 2nd half (h)", "steady?", "makespan (h)", "moves/job-h"]
    lines = [f"# {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join([
            r.policy, f"{r.first}-{r.last - 1}", f"{r.finished}/{r.last - r.first}", f"{r.avg_jct:.2f}",
            f"{r.median_jct:.2f}", f"{r.p99_jct:.2f}", f"{r.rho_median:.3f}", f"{r.rho_p99:.3f}",
            str(r.in_system_start), str(r.in_system_end), f"{r.jct_first_half:.2f} / {r.jct_second_half:.2f}",
            "growing" if r.growing else "steady", f"{r.makespan:.1f}",
            f"{r.moves_per_job_hour:.3f}"]) + " |")
    return "\n".join(lines) + "\n"


def markdown(summaries: list[Summary], title: str) -> str:
    """The comparison table (one row per policy) with the utilisation and price columns per pool."""
    types = list(summaries[0].utilisation) if summaries else []
    head = (["policy", "finished", "avg JCT (h)", "median JCT (h)", "p99 JCT (h)", "makespan (h)"]
            + [f"util {t}" for t in types]
            + ["pods moved", "moves/job-h", "rho mean", "rho median", "rho p99", "rho>1", "re-plans", "sim s",
               "violations"])
    lines = [f"# {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        row = ([s.policy, f"{s.finished}/{s.jobs}", f"{s.avg_jct:.3f}", f"{s.median_jct:.3f}", f"{s.p99_jct:.3f}",
                f"{s.makespan:.3f}"] + [f"{100 * s.utilisation[t]:.1f}%" for t in types]
               + [str(s.pods_moved), f"{s.moves_per_job_hour:.3f}", f"{s.rho_mean:.3f}", f"{s.rho_median:.3f}",
                  f"{s.rho_p99:.3f}",
                  f"{100 * s.rho_unfair:.0f}%", str(s.replans), f"{s.wall_seconds:.1f}", str(s.violations)])
        lines.append("| " + " | ".join(row) + " |")
    notes = [f"- {s.policy}: {note}" for s in summaries for note in s.notes]
    priced = [s for s in summaries if s.final_prices]
    if priced:
        lines += ["", "Last prices: " + "; ".join(
            f"{s.policy} " + ", ".join(f"{k}={v:.4g}" for k, v in sorted((s.final_prices or {}).items()))
            for s in priced)]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines) + "\n"


def write_report(runs: list[PolicyRun], throughput: np.ndarray, out: Path, *, title: str,
                 meta: dict[str, Any], plots: bool = True,
                 window: tuple[int, int] | None = None) -> list[Summary]:
    """Write ``report.md``, ``report.json`` and (``plots``) the PNGs into ``out``; return the summaries. ``window``:
    also the steady-state table of the jobs ``[first, last)`` (:func:`steady_state`) and, with plots,
    ``in_system.png``."""
    out.mkdir(parents=True, exist_ok=True)
    summaries = [summarise(r, throughput) for r in runs]
    text = markdown(summaries, title)
    steady = [steady_state(r, throughput, *window) for r in runs] if window is not None else []
    if steady:
        text += "\n" + steady_markdown(steady, f"Steady state: jobs {steady[0].first}-{steady[0].last - 1}")[2:]
    (out / "report.md").write_text(text)
    body = {"meta": meta, "policies": [s.to_dict() for s in summaries],
            "steady_state": [s.to_dict() for s in steady],
            "prices": {r.policy: [{"time": t, **p} for t, p in r.prices] for r in runs if r.prices},
            "violations": {r.policy: r.violations[:100] for r in runs if r.violations}}
    (out / "report.json").write_text(json.dumps(body, indent=1, allow_nan=False, default=_json_default))
    if plots:
        write_plots(runs, out)
        if window is not None:
            plot_in_system(runs, out / "in_system.png", window)
    return summaries


def plot_in_system(runs: list[PolicyRun], path: Path, window: tuple[int, int] | None = None) -> Path:
    """Jobs in the system over time per policy (steady or growing), the window's arrivals shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        ax.step([t / 3600.0 for t, _ in run.active], [c for _, c in run.active], where="post", label=run.policy)
    if window is not None and runs:
        ax.axvspan(runs[0].arrival[window[0]] / 3600.0, runs[0].arrival[window[1] - 1] / 3600.0, color="grey",
                   alpha=0.15, label=f"arrivals of jobs {window[0]}-{window[1] - 1}")
    ax.set_xlabel("time (h)")
    ax.set_ylabel("jobs in the system")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def write_plots(runs: list[PolicyRun], out: Path) -> list[Path]:
    """``jct_cdf.png``, ``utilisation.png`` and (when a policy priced) ``prices.png`` in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        jct = np.sort(run.jct) / 3600.0
        if jct.size:
            ax.step(jct, np.arange(1, jct.size + 1) / jct.size, where="post", label=run.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of jobs")
    ax.legend()
    ax.grid(alpha=0.3)
    paths.append(out / "jct_cdf.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        t = np.array([u[0] for u in run.usage]) / 3600.0
        used = np.array([u[1].sum() for u in run.usage]) / max(int(run.capacity.sum()), 1)
        ax.step(t, used, where="post", label=run.policy)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("accelerators in use (fraction)")
    ax.legend()
    ax.grid(alpha=0.3)
    paths.append(out / "utilisation.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    priced = [r for r in runs if r.prices]
    if priced:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for run in priced:
            t = np.array([p[0] for p in run.prices]) / 3600.0
            for pool in sorted(run.prices[0][1]):
                ax.step(t, [p[1].get(pool, np.nan) for p in run.prices], where="post", label=f"{run.policy} {pool}")
        ax.set_xlabel("time (h)")
        ax.set_ylabel("price")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        paths.append(out / "prices.png")
        fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
        plt.close(fig)
    return paths
