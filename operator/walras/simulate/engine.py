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
    progress segments (for the property tests); ``horizon``: stop at this time (None: when every job finished);
    ``until``: a window ``(first, last)`` of job ids (``last`` excluded): stop as soon as every job of it finished,
    as Gavel's simulator does with its measurement window (``-s``/``-e``; the jobs after it keep arriving until
    then)."""

    window: float = 60.0
    restart_delay: float = 30.0
    check: bool = True
    record: bool = False
    horizon: float | None = None
    until: tuple[int, int] | None = None


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
    check_trace(trace, cluster)
    engine = _Engine.start(trace, cluster, policy, opts, progress)
    engine.loop()
    for i in list(engine.state.placement):
        engine.close_segment(i, engine.now)
    engine.run.end = engine.now
    engine.run.wall_seconds = time.perf_counter() - started_wall
    return engine.run


@dataclass
class _Engine:
    """The simulation of one policy on one trace while it runs: the policy's view (``state``), the record
    (``run``) and the per-job rates the event loop advances: ``rate`` (work per second), ``share`` (the fraction
    of its pods on each pool), ``delay_until`` (no progress before: a restart), ``finish_at`` (the exact
    completion time at the current rate), ``seg_from`` (start of the current progress segment)."""

    policy: Policy
    opts: EngineOptions
    cluster: VirtualCluster
    state: SimState
    run: PolicyRun
    throughput: np.ndarray
    pods: np.ndarray
    work: np.ndarray
    arrival: np.ndarray
    order: np.ndarray
    report: Callable[[str, float, int, int], None] | None  # simulate's ``progress``
    event_driven: bool
    rate: np.ndarray
    share: np.ndarray
    delay_until: np.ndarray
    finish_at: np.ndarray
    seg_from: np.ndarray
    jobs_typed: dict[int, Job] = field(default_factory=dict)
    next_replan: float | None = None
    now: float = 0.0
    next_arrival: int = 0  # index in ``order`` of the next job to arrive
    finished: int = 0
    window_left: int = -1  # jobs of ``opts.until`` not finished (-1: no window)

    @classmethod
    def start(cls, trace: Trace, cluster: VirtualCluster, policy: Policy, opts: EngineOptions,
              progress: Callable[[str, float, int, int], None] | None) -> _Engine:
        """The engine at time 0: no job arrived, nothing placed (the trace already checked)."""
        n, m = len(trace.jobs), len(cluster.types)
        throughput = trace.throughput_matrix(cluster.types)
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
        window_left = -1
        if opts.until is not None:
            first, last = opts.until
            if not 0 <= first < last <= n:
                raise ValueError(f"the window of jobs [{first}, {last}) is not inside the trace's {n} jobs")
            window_left = last - first
        return cls(policy, opts, cluster, state, run, throughput, pods, work, arrival, order, progress,
                   event_driven=isinstance(policy, QueuePolicy | WalrasPolicy), rate=np.zeros(n),
                   share=np.zeros((n, m)), delay_until=np.full(n, -math.inf), finish_at=np.full(n, math.inf),
                   seg_from=np.zeros(n), window_left=window_left)

    def running(self) -> np.ndarray:
        """The placed jobs, in placement order."""
        placement = self.state.placement
        return np.fromiter(placement.keys(), dtype=np.int64, count=len(placement))

    def advance(self, to: float) -> None:
        """Move the clock to ``to``: every running job progresses at its rate from its restart on."""
        r = self.running()
        if r.size and to > self.now:
            state = self.state
            effective = np.clip(to - np.maximum(self.now, self.delay_until[r]), 0.0, None)
            state.progress[r] = np.minimum(state.progress[r] + self.rate[r] * effective, self.work[r])
            state.received[r] += effective[:, None] * self.share[r]
        self.now = to
        self.state.now = to

    def close_segment(self, i: int, to: float) -> None:
        """Record job ``i``'s progress segment up to ``to`` (when recording)."""
        if self.opts.record and self.rate[i] > 0:
            begin = max(self.seg_from[i], self.delay_until[i])
            if to > begin:
                self.run.segments.append((i, float(begin), float(to), float(self.rate[i])))

    def record_usage(self) -> None:
        """Append the accelerators in use per pool, now."""
        m = len(self.cluster.types)
        if self.state.placement:
            held = self.cluster.node_pool[np.concatenate(list(self.state.placement.values()))]
            self.run.usage.append((self.now, np.bincount(held, minlength=m).astype(np.int64)))
        else:
            self.run.usage.append((self.now, np.zeros(m, dtype=np.int64)))

    def complete(self, at: float) -> bool:
        """Finish the running jobs whose completion time is ``at`` or before; whether any did."""
        r = self.running()
        if not r.size:
            return False
        state, run = self.state, self.run
        done = r[self.finish_at[r] <= at + TIME_TOLERANCE]
        for i in done.tolist():
            self.close_segment(i, float(self.finish_at[i]))
            state.progress[i] = self.work[i]
            run.finish[i] = self.finish_at[i]
            del state.placement[i]
            state.active.remove(i)
            self.jobs_typed.pop(i, None)
            self.rate[i] = 0.0
            self.share[i] = 0.0
            self.finish_at[i] = math.inf
            self.finished += 1
            until = self.opts.until
            if until is not None and until[0] <= i < until[1]:
                self.window_left -= 1
        return bool(done.size)

    def accepted(self, decision: Decision) -> dict[int, np.ndarray]:
        """The placements of ``decision`` the engine applies (sorted node indices; a kept placement is the same
        array): a placement of a job not in the system, with more pods than the job, or on nodes that do not exist
        is refused as a violation, and so is every node the accepted placements over-commit."""
        cluster, pods, run = self.cluster, self.pods, self.run
        active = set(self.state.active)
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
                run.violations.append(f"{self.policy.name}: job {i} placed on {nodes.tolist()} "
                                      f"(active={i in active}, pods={int(pods[i])})")
                continue
            current = self.state.placement.get(i)
            new[i] = current if nodes is current else np.sort(nodes)  # a kept placement is the same array
        if new:
            used = np.bincount(np.concatenate(list(new.values())), minlength=size)
            for k in np.flatnonzero(used > cluster.node_gpus).tolist():
                run.violations.append(f"OverCommitted: Node/{cluster.node_names[k]}: {int(used[k])} pods > "
                                      f"{int(cluster.node_gpus[k])} accelerators")
        return new

    def move(self, i: int, target: np.ndarray | None) -> None:
        """Put job ``i`` on the nodes ``target`` (None: pause it) now: count the pods stopped (migrated or
        preempted), start the restart delay where the job loses pods or resumes, and set its new rate, shares and
        completion time."""
        state, run, now = self.state, self.run, self.now
        old = state.placement.get(i)
        if old is not None and target is not None and np.array_equal(old, target):
            state.placement[i] = target
            return
        self.close_segment(i, now)
        self.seg_from[i] = now
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
            self.rate[i] = 0.0
            self.share[i] = 0.0
            self.finish_at[i] = math.inf
            return
        if (old is not None and stopped > 0) or (old is None and state.progress[i] > 0):
            self.delay_until[i] = now + self.opts.restart_delay
        if math.isnan(run.start[i]):
            run.start[i] = now
        state.placement[i] = target
        counts = np.bincount(self.cluster.node_pool[target], minlength=len(self.cluster.types))
        self.share[i] = counts / self.pods[i]
        self.rate[i] = float(self.throughput[i] @ counts) / self.pods[i]
        left = self.work[i] - state.progress[i]
        self.finish_at[i] = max(now, self.delay_until[i]) + left / self.rate[i] if self.rate[i] > 0 else math.inf

    def apply(self, decision: Decision) -> None:
        """Apply one re-plan's ``decision`` now: the accepted placements (:meth:`accepted`) replace the current ones
        job by job (:meth:`move`), then the invariants (``check``), the prices and the usage are recorded."""
        state, run = self.state, self.run
        new = self.accepted(decision)
        run.violations.extend(decision.violations)
        changed = [i for i, nodes in new.items() if nodes is not state.placement.get(i)]
        changed += [i for i in state.placement if i not in new]
        for i in sorted(changed):
            self.move(i, new.get(i))
        if self.opts.check:
            for i in state.active:
                if i not in self.jobs_typed:
                    self.jobs_typed[i] = Job(NAMESPACE, job_name(i), 1, job_spec(state, i))
            run.violations.extend(f"{self.policy.name} at {self.now:.3f}: {v}"
                                  for v in check_cluster(typed_cluster(state, state.placement, self.jobs_typed)))
        if decision.prices is not None:
            run.prices.append((self.now, dict(decision.prices)))
        self.record_usage()

    def next_event(self, replan: bool) -> float:
        """The time of the next event: an arrival, a completion, or (unless a re-plan is already due, ``replan``)
        the next round end while jobs are in the system; infinite when there is none."""
        n = len(self.arrival)
        t_arrival = self.arrival[self.order[self.next_arrival]] if self.next_arrival < n else math.inf
        r = self.running()
        t_done = float(self.finish_at[r].min()) if r.size else math.inf
        due = self.next_replan is not None and self.state.active and not replan
        t_round = self.next_replan if due and self.next_replan is not None else math.inf
        return min(t_arrival, t_done, t_round)

    def batch(self, first: float) -> bool:
        """Process the events from ``first`` on that fall within the coalescing window (completions at their own
        times, arrivals queued); whether the policy is to re-plan after them."""
        opts, state, n = self.opts, self.state, len(self.arrival)
        replan = False
        t = first
        while True:
            self.advance(t)
            if self.complete(t):
                self.record_usage()
                replan |= self.event_driven
            arrived = False
            while self.next_arrival < n and self.arrival[self.order[self.next_arrival]] <= t + TIME_TOLERANCE:
                state.active.append(int(self.order[self.next_arrival]))
                self.next_arrival += 1
                arrived = True
            replan |= arrived and (self.event_driven or self.next_replan is None)
            if self.next_replan is not None and self.next_replan <= t + TIME_TOLERANCE:
                replan = True
            self.run.active.append((t, len(state.active)))
            t_next = self.next_event(replan)
            if t_next <= first + opts.window and not math.isinf(t_next) and (
                    opts.horizon is None or t_next <= opts.horizon):
                t = t_next
                continue
            return replan

    def replan(self) -> None:
        """Ask the policy for a decision now and apply it; schedule its next round."""
        tick = time.perf_counter()
        decision = self.policy.decide(self.state)
        self.run.decide_seconds += time.perf_counter() - tick
        self.run.replans += 1
        self.apply(decision)
        self.next_replan = decision.next_replan if self.state.active else None
        if self.report is not None:
            self.report(self.policy.name, self.now, self.finished, len(self.arrival))

    def loop(self) -> None:
        """Run the event loop until no event is left or the horizon is reached."""
        self.run.usage.append((0.0, np.zeros(len(self.cluster.types), dtype=np.int64)))
        while True:
            first = self.next_event(False)
            if math.isinf(first):
                if self.state.active:
                    self.run.notes.append(
                        f"stalled at {self.now / 3600:.2f} h: {len(self.state.active)} job(s) in the system, "
                        f"{len(self.state.placement)} running, and the policy asked for no re-plan: the rest never "
                        "finish")
                break
            if self.opts.horizon is not None and first > self.opts.horizon:
                self.advance(self.opts.horizon)
                break
            if self.batch(first):
                self.replan()
            if self.window_left == 0:
                break


__all__ = ["EngineOptions", "PolicyRun", "RoundPolicy", "check_trace", "simulate"]
