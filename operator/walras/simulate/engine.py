"""The discrete-event loop: jobs arrive, run at the throughput of the accelerators they hold, finish when their
work is done; the policy re-plans on events.

Events are arrivals, completions and the re-plan times a policy asks for (the end of a round). Between events a
running job's progress grows linearly: ``rate_i = sum over its pods of throughput[i, type(pod)] / pods_i`` (the
planner's throughput model, 004 Sec. 2.1: a job with all its pods on type j runs at the measured throughput of j;
each pod contributes its share). Completion times are computed exactly from the rates, so progress accounting is
exact between events (floating point aside); a finished job's progress is set to its work.

Re-plans. An event-driven policy (``fifo``, ``kueue``, ``walras``, ``walras-migrate``) is asked again after every
arrival or completion; a round-based one (``Decision.next_replan`` set) only at its round ends, and on an arrival
when it has no round scheduled (an idle cluster). Coalescing: events less than ``window`` seconds after the first
event of a batch are processed (completions at their own times, arrivals queued) and the policy is asked once, at
the last of them. Accelerators freed by a completion inside a batch stay idle until that re-plan, and an arrival
waits at most ``window`` seconds for it: the price of fewer re-plans on big traces (``window=0``: one re-plan per
distinct event time).

Restarts. When a re-plan stops some pods of a job that still has work (moved elsewhere, or the job is paused), those
pods count as moved; a job that keeps running after losing a pod, or that resumes after a pause, makes no progress for
``restart_delay`` seconds (checkpoint and restore). Adding pods to a job that keeps all of its pods, and a job's first
start, cost nothing.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from walras.planner.cluster import Job
from walras.planner.invariants import check_cluster
from walras.simulate.cluster import VirtualCluster
from walras.simulate.policies import Policy, QueuePolicy, RoundPolicy, WalrasPolicy, make_policy
from walras.simulate.state import NAMESPACE, Decision, SimState, job_name, job_spec, typed_cluster
from walras.simulate.trace import Trace

#: Two times closer than this (seconds) are the same event time.
TIME_TOLERANCE = 1e-9


@dataclass(frozen=True)
class EngineOptions:
    """``window``: coalescing window (s); ``restart_delay``: seconds without progress after a move or a resume;
    ``check``: run :mod:`walras.planner.invariants` on the state after every re-plan; ``record``: keep every job's
    progress segments (for the property tests); ``horizon``: stop at this time (None: when every job finished)."""

    window: float = 60.0
    restart_delay: float = 30.0
    check: bool = True
    record: bool = False
    horizon: float | None = None


@dataclass
class PolicyRun:
    """What one policy did to one trace. Times in seconds from the trace's start; ``finish[i]`` NaN for a job that
    did not finish (horizon reached). ``usage``: (time, accelerators in use per pool) after every change;
    ``active``: (time, jobs in the system); ``prices``: (time, price per pool) of each re-plan that priced;
    ``segments``: (job, from, to, rate) of every stretch of progress, when recorded."""

    policy: str
    types: tuple[str, ...]
    capacity: np.ndarray
    arrival: np.ndarray
    work: np.ndarray
    pods: np.ndarray
    best_rate: np.ndarray
    start: np.ndarray
    finish: np.ndarray
    progress: np.ndarray
    end: float = 0.0
    pods_moved: int = 0
    migrations: int = 0
    preemptions: int = 0
    replans: int = 0
    decide_seconds: float = 0.0
    wall_seconds: float = 0.0
    usage: list[tuple[float, np.ndarray]] = field(default_factory=list)
    active: list[tuple[float, int]] = field(default_factory=list)
    prices: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    segments: list[tuple[int, float, float, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def finished(self) -> np.ndarray:
        return np.isfinite(self.finish)

    @property
    def jct(self) -> np.ndarray:
        """Job completion times of the finished jobs (finish - arrival), in job order."""
        done = self.finished
        return self.finish[done] - self.arrival[done]


def check_trace(trace: Trace, cluster: VirtualCluster) -> None:
    """``ValueError`` naming the first job ``cluster`` cannot run: no type it runs on, or fewer accelerators of
    every such type than its pods."""
    throughput = trace.throughput_matrix(cluster.types)
    capacity = cluster.capacity
    for job in trace.jobs:
        runs = throughput[job.id] > 0
        if not runs.any():
            raise ValueError(f"job {job.id} ({job.job_type}) runs on none of the cluster's types "
                             f"{', '.join(cluster.types)}")
        if not np.any(runs & (capacity >= job.pods)):
            raise ValueError(f"job {job.id} ({job.job_type}) needs {job.pods} accelerators of one type it runs on; "
                             f"the cluster has at most {int(capacity[runs].max())}")


def simulate(trace: Trace, cluster: VirtualCluster, policy: Policy | str,
             options: EngineOptions | None = None,
             progress: Callable[[str, float, int, int], None] | None = None) -> PolicyRun:
    """Run ``policy`` (a :class:`~.policies.Policy` or a name of :data:`~.policies.POLICIES`) on ``trace`` over
    ``cluster``; see the module docstring for the model. ``progress(policy, now, finished, jobs)`` is called after
    every re-plan. ``ValueError`` for a trace a cluster cannot run (a job with no type, or too many pods)."""
    started_wall = time.perf_counter()
    opts = options or EngineOptions()
    if isinstance(policy, str):
        policy = make_policy(policy, check=opts.check, restart_seconds=opts.restart_delay)
    n, m = len(trace.jobs), len(cluster.types)
    throughput = trace.throughput_matrix(cluster.types)
    check_trace(trace, cluster)
    pods = np.array([j.pods for j in trace.jobs], dtype=np.int64)
    work = np.array([j.work for j in trace.jobs], dtype=np.float64)
    arrival = np.array([j.arrival for j in trace.jobs], dtype=np.float64)
    order = np.argsort(arrival, kind="stable")
    state = SimState(trace, cluster, throughput, pods, work, received=np.zeros((n, m)), progress=np.zeros(n))
    run = PolicyRun(policy.name, cluster.types, cluster.capacity, arrival, work, pods,
                    np.where(throughput.max(axis=1) > 0, throughput.max(axis=1), 0.0),
                    np.full(n, np.nan), np.full(n, np.nan), state.progress)
    if isinstance(policy, WalrasPolicy) and policy.migration is not None:
        from walras.simulate.policies import migration_available

        if not migration_available():
            run.notes.append("walras.planner.migration is not present: walras-migrate planned as walras")
    event_driven = isinstance(policy, QueuePolicy | WalrasPolicy)
    node_pool = cluster.node_pool
    rate = np.zeros(n)
    share = np.zeros((n, m))
    delay_until = np.full(n, -math.inf)
    finish_at = np.full(n, math.inf)
    seg_from = np.zeros(n)
    jobs_typed: dict[int, Job] = {}
    next_replan: float | None = None
    now = 0.0
    a = 0  # next arrival in ``order``
    finished = 0

    def running() -> np.ndarray:
        return np.fromiter(state.placement.keys(), dtype=np.int64, count=len(state.placement))

    def advance(to: float) -> None:
        nonlocal now
        r = running()
        if r.size and to > now:
            effective = np.clip(to - np.maximum(now, delay_until[r]), 0.0, None)
            state.progress[r] = np.minimum(state.progress[r] + rate[r] * effective, work[r])
            state.received[r] += effective[:, None] * share[r]
        now = to
        state.now = to

    def close_segment(i: int, to: float) -> None:
        if opts.record and rate[i] > 0:
            begin = max(seg_from[i], delay_until[i])
            if to > begin:
                run.segments.append((i, float(begin), float(to), float(rate[i])))

    def record_usage() -> None:
        if state.placement:
            held = node_pool[np.concatenate(list(state.placement.values()))]
            run.usage.append((now, np.bincount(held, minlength=m).astype(np.int64)))
        else:
            run.usage.append((now, np.zeros(m, dtype=np.int64)))

    def complete(at: float) -> bool:
        nonlocal finished
        r = running()
        if not r.size:
            return False
        done = r[finish_at[r] <= at + TIME_TOLERANCE]
        for i in done.tolist():
            close_segment(i, float(finish_at[i]))
            state.progress[i] = work[i]
            run.finish[i] = finish_at[i]
            del state.placement[i]
            state.active.remove(i)
            jobs_typed.pop(i, None)
            rate[i] = 0.0
            share[i] = 0.0
            finish_at[i] = math.inf
            finished += 1
        return bool(done.size)

    def apply(decision: Decision) -> None:
        active = set(state.active)
        size = len(cluster.node_names)
        new: dict[int, np.ndarray] = {}
        placed = [nodes for nodes in decision.placement.values() if nodes.size]
        everything = np.concatenate(placed) if placed else np.zeros(0, dtype=np.int64)
        in_range = not everything.size or (int(everything.min()) >= 0 and int(everything.max()) < size)
        for i, nodes in decision.placement.items():
            if nodes.size == 0:
                continue
            if i not in active or nodes.size > pods[i] or (
                    not in_range and (nodes.min() < 0 or nodes.max() >= size)):
                run.violations.append(f"{policy.name}: job {i} placed on {nodes.tolist()} (active={i in active}, "
                                      f"pods={int(pods[i])})")
                continue
            current = state.placement.get(i)
            new[i] = current if nodes is current else np.sort(nodes)  # a kept placement is the same array
        if new:
            used = np.bincount(np.concatenate(list(new.values())), minlength=size)
            for k in np.flatnonzero(used > cluster.node_gpus).tolist():
                run.violations.append(f"OverCommitted: Node/{cluster.node_names[k]}: {int(used[k])} pods > "
                                      f"{int(cluster.node_gpus[k])} accelerators")
        run.violations.extend(decision.violations)
        changed = [i for i, nodes in new.items() if nodes is not state.placement.get(i)]
        changed += [i for i in state.placement if i not in new]
        for i in sorted(changed):
            old = state.placement.get(i)
            target = new.get(i)
            if old is not None and target is not None and np.array_equal(old, target):
                state.placement[i] = target
                continue
            close_segment(i, now)
            seg_from[i] = now
            stopped = 0
            if old is not None:
                kept = Counter(old.tolist()) & Counter(target.tolist() if target is not None else [])
                stopped = int(old.size) - sum(kept.values())
                run.pods_moved += stopped
                if target is not None:
                    run.migrations += stopped
                else:
                    run.preemptions += stopped
            if target is None:
                state.placement.pop(i, None)
                rate[i] = 0.0
                share[i] = 0.0
                finish_at[i] = math.inf
                continue
            if (old is not None and stopped > 0) or (old is None and state.progress[i] > 0):
                delay_until[i] = now + opts.restart_delay
            if math.isnan(run.start[i]):
                run.start[i] = now
            state.placement[i] = target
            counts = np.bincount(node_pool[target], minlength=m)
            share[i] = counts / pods[i]
            rate[i] = float(throughput[i] @ counts) / pods[i]
            left = work[i] - state.progress[i]
            finish_at[i] = max(now, delay_until[i]) + left / rate[i] if rate[i] > 0 else math.inf
        if opts.check:
            for i in state.active:
                if i not in jobs_typed:
                    jobs_typed[i] = Job(NAMESPACE, job_name(i), 1, job_spec(state, i))
            run.violations.extend(f"{policy.name} at {now:.3f}: {v}"
                                  for v in check_cluster(typed_cluster(state, state.placement, jobs_typed)))
        if decision.prices is not None:
            run.prices.append((now, dict(decision.prices)))
        record_usage()

    run.usage.append((0.0, np.zeros(m, dtype=np.int64)))
    while True:
        t_arrival = arrival[order[a]] if a < n else math.inf
        r = running()
        t_done = float(finish_at[r].min()) if r.size else math.inf
        t_round = next_replan if next_replan is not None and state.active else math.inf
        first = min(t_arrival, t_done, t_round)
        if math.isinf(first):
            break
        if opts.horizon is not None and first > opts.horizon:
            advance(opts.horizon)
            break
        replan = False
        t = first
        while True:
            advance(t)
            if complete(t):
                record_usage()
                replan |= event_driven
            arrived = False
            while a < n and arrival[order[a]] <= t + TIME_TOLERANCE:
                state.active.append(int(order[a]))
                a += 1
                arrived = True
            replan |= arrived and (event_driven or next_replan is None)
            if next_replan is not None and next_replan <= t + TIME_TOLERANCE:
                replan = True
            run.active.append((t, len(state.active)))
            t_arrival = arrival[order[a]] if a < n else math.inf
            r = running()
            t_done = float(finish_at[r].min()) if r.size else math.inf
            due = next_replan is not None and state.active and not replan
            t_round = next_replan if due and next_replan is not None else math.inf
            t_next = min(t_arrival, t_done, t_round)
            if t_next <= first + opts.window and not math.isinf(t_next) and (
                    opts.horizon is None or t_next <= opts.horizon):
                t = t_next
                continue
            break
        if not replan:
            continue
        tick = time.perf_counter()
        decision = policy.decide(state)
        run.decide_seconds += time.perf_counter() - tick
        run.replans += 1
        apply(decision)
        next_replan = decision.next_replan if state.active else None
        if progress is not None:
            progress(policy.name, now, finished, n)
    for i in list(state.placement):
        close_segment(i, now)
    run.end = now
    run.wall_seconds = time.perf_counter() - started_wall
    return run


__all__ = ["EngineOptions", "PolicyRun", "RoundPolicy", "check_trace", "simulate"]
