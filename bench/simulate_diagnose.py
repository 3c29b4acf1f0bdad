"""Two checks behind the hand-written analysis of ``docs/bench/simulate.md`` (same cluster, trace and seed as
``bench.simulate``)::

    python -m bench.simulate_diagnose last 3.5      # the job that sets the makespan: its segments per policy
    python -m bench.simulate_diagnose fractions 4.5 # Gavel with counters since arrival (fractions of each job's age)
    python -m bench.simulate_diagnose jobs 4.5      # walras-migrate against gavel, job by job

``last``: for walras-migrate, gavel and walras, the last job to finish, its arrival, isolated time on its best type
and every stretch of progress (from, to, rate relative to its best type), from the engine's recorded segments.
``fractions``: the engine's ``gavel`` policy against a variant whose round priorities use the time received since
each job's arrival divided by its age (Gavel's "fraction of time received") instead of counters reset at every
re-allocation.
``jobs``: each job's JCT under walras-migrate minus under gavel: the jobs with the largest differences (and their
progress segments under walras-migrate: from h, to h, rate relative to the job's best type), how many are faster or
slower, and the mean and sum of the differences by the job's time alone on its best type (< 1, 1-5, 5-20, >= 20 h).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from bench.simulate import CLUSTER, JOBS, SEED


def last(rate: float) -> None:
    from walras.simulate.cluster import parse_cluster
    from walras.simulate.engine import EngineOptions, simulate
    from walras.simulate.trace import generate

    cluster = parse_cluster(CLUSTER)
    trace = generate(JOBS, rate, seed=SEED)
    thr = trace.throughput_matrix(cluster.types)
    for policy in ("walras-migrate", "gavel", "walras"):
        run = simulate(trace, cluster, policy, EngineOptions(check=False, record=True))
        k = int(np.nanargmax(run.finish))
        job = trace.jobs[k]
        segments = [
            (round(a / 3600, 1), round(b / 3600, 1), round(float(r / thr[k].max()), 2))
            for i, a, b, r in run.segments
            if i == k
        ]
        print(
            f"{policy}: last job {k} {job.job_type} x{job.pods}, arrival {job.arrival / 3600:.1f} h, finish "
            f"{run.finish[k] / 3600:.1f} h, alone on its best type {job.work / thr[k].max() / 3600:.1f} h; "
            f"{len(segments)} segment(s) (from h, to h, rate/best): {segments[:10]}; pods moved {run.pods_moved}",
            flush=True,
        )


def fractions(rate: float) -> None:
    from walras.simulate import policies as P
    from walras.simulate.cluster import parse_cluster
    from walras.simulate.engine import EngineOptions, simulate
    from walras.simulate.state import Decision, SimState
    from walras.simulate.trace import generate

    class SinceArrival(P.RoundPolicy):
        def decide(self, state: SimState) -> Decision:
            jobs = list(state.active)
            if not jobs:
                return Decision({})
            if tuple(jobs) != self._key:
                self._key = tuple(jobs)
                self._allocation, self._prices = self.allocate(state, jobs)
            arrival = np.array([state.trace.jobs[i].arrival for i in jobs])
            received = state.received[jobs] / np.maximum(state.now - arrival, 1.0)[:, None]
            self._since = state.received.copy()  # the parent's own counters (unused: replaced just below)
            original = P.time_slice
            P.time_slice = lambda a, s, c, _r: original(a, s, c, received)  # type: ignore[assignment]
            try:
                return P.RoundPolicy.decide(self, state)
            finally:
                P.time_slice = original

    cluster = parse_cluster(CLUSTER)
    trace = generate(JOBS, rate, seed=SEED)
    for name, policy in (
        ("gavel (engine)", P.make_policy("gavel")),
        ("gavel (fractions since arrival)", SinceArrival("gavel", P.gavel_allocation)),
    ):
        run = simulate(trace, cluster, policy, EngineOptions(check=False))
        jct = run.jct / 3600
        print(
            f"{rate:g} jobs/h {name}: avg JCT {jct.mean():.2f} h, makespan {run.end / 3600:.1f} h, "
            f"pods moved per job-hour {run.pods_moved / jct.sum():.3f}",
            flush=True,
        )


def jobs(rate: float) -> None:
    from walras.simulate.cluster import parse_cluster
    from walras.simulate.engine import EngineOptions, simulate
    from walras.simulate.trace import generate

    cluster = parse_cluster(CLUSTER)
    trace = generate(JOBS, rate, seed=SEED)
    thr = trace.throughput_matrix(cluster.types)
    w, g = (simulate(trace, cluster, p, EngineOptions(check=False, record=True)) for p in ("walras-migrate", "gavel"))
    diff = (w.finish - g.finish) / 3600.0
    alone = np.array([j.work / thr[j.id].max() / 3600.0 for j in trace.jobs])
    print(f"{rate:g} jobs/h: walras-migrate - gavel JCT summed over jobs {diff.sum():+.2f} h (mean {diff.mean():+.3f})")
    for k in np.argsort(-np.abs(diff))[:10].tolist():
        job = trace.jobs[k]
        segments = [(round(a / 3600, 1), round(b / 3600, 1), round(float(r / thr[k].max()), 2))
                    for i, a, b, r in w.segments if i == k]
        print(f"  job {k} {job.job_type} x{job.pods}: arrival {job.arrival / 3600:.1f} h, alone {alone[k]:.1f} h, "
              f"JCT {(w.finish[k] - job.arrival) / 3600:.2f} vs {(g.finish[k] - job.arrival) / 3600:.2f} h "
              f"({diff[k]:+.2f}); walras-migrate segments {segments[:6]}")
    print(f"  faster under walras-migrate: {int((diff < -0.01).sum())} jobs, slower: {int((diff > 0.01).sum())}")
    for low, high in ((0, 1), (1, 5), (5, 20), (20, np.inf)):
        mask = (alone >= low) & (alone < high)
        print(f"  alone in [{low}, {high}) h: {int(mask.sum())} jobs, mean {diff[mask].mean():+.3f} h, "
              f"sum {diff[mask].sum():+.2f} h")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simulate_diagnose", description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=("last", "fractions", "jobs"))
    parser.add_argument("rate", type=float)
    args = parser.parse_args(argv)
    {"last": last, "fractions": fractions, "jobs": jobs}[args.check](args.rate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
