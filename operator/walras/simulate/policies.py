"""Scheduling policies the simulator compares, behind one protocol: given the state, the nodes of each active job.

==================  ===============================================================================================
``fifo``            heterogeneity-agnostic FIFO: running jobs keep their accelerators; waiting jobs, in arrival
                    order, take accelerators of the type with the most free ones that can hold the whole job (the
                    choice ignores throughput); a job that does not fit waits and later jobs may start
                    (Kueue's BestEffortFIFO, no head-of-line blocking); never preempts.
``kueue``           ordered type fallback, as Kueue's flavor fungibility (``whenCanBorrow``/``whenCanPreempt`` off):
                    one cluster-wide order of the types, fastest first (median over the trace's jobs of the type's
                    throughput relative to the job's best type); a waiting job takes the first type in that order
                    with room for all its pods; otherwise as ``fifo``.
``walras``          :func:`walras.planner.build_plan` on the typed cluster at each re-plan, warm-started from the
                    previous plan; its pod actions are applied (create, keep, delete; running pods of jobs without
                    ``spec.migration`` are never moved by the planner).
``walras-migrate``  the same with every job carrying ``spec.migration`` (:class:`walras.planner.spec.MigrationSpec`
                    defaults, ``restartSeconds`` = the engine's restart delay) and reporting its remaining work at
                    each re-plan, so the planner's migration phase may evict and re-create pods (bounded churn)
                    when a move finishes the job sooner, restart included.
``walras-timeslice`` the market allocation of :func:`build_plan` (``JobPlan.allocation``: fraction of time per pool)
                    realised by Gavel's time-sliced rounds (:func:`walras.simulate.gavel.time_slice`).
``gavel``           Gavel's heterogeneity-aware max-min fairness (:func:`walras.simulate.gavel.max_min_fairness`,
                    HiGHS) realised by the same rounds.
``gavel-fifo``      Gavel's own FIFO baseline as its code behaves (:class:`GavelFifoAllocation`), realised by the
                    rounds as Gavel picks them for FIFO (:func:`walras.simulate.gavel.time_slice_as_gavel`: types
                    shuffled each round, no fill): the yardstick to compare the engines with
                    (``bench/gavel_baseline.py``).
``gavel-las``       Gavel's ``max_min_fairness_perf`` LP exactly as its code states it, one interior-point solve and
                    no tie-breaking (:func:`walras.simulate.gavel.max_min_fairness_as_gavel`), by rounds as Gavel
                    picks them for it (V100, P100, K80 in turn, work-conserving).
==================  ===============================================================================================

Every policy runs a job's pods on one accelerator each; ``fifo``, ``kueue`` and the round-based policies run a job
only with all its pods on one type (a gang, as Gavel does). Placement on nodes of a type is consolidated first fit
(:func:`fit`): the fullest node that holds the whole job, else the nodes with the most free accelerators first. The
round-based policies keep a job on the nodes it holds when the round gives it the same type again.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from walras.planner.cluster import PODS, Cluster, Job, Pod, ReportedStatus
from walras.planner.invariants import check_plan
from walras.planner.model import Plan
from walras.planner.plan import PlanCache, PlanOptions, build_plan
from walras.planner.quantity import parse_quantity
from walras.planner.queue import CLAIM
from walras.planner.spec import MigrationSpec
from walras.simulate.cluster import GPUS
from walras.simulate.gavel import (
    ROUND_SECONDS,
    max_min_fairness,
    max_min_fairness_as_gavel,
    time_slice,
    time_slice_as_gavel,
)
from walras.simulate.state import NAMESPACE, Decision, SimState, job_name, job_spec

#: Gavel's ``minimum_time_between_allocation_resets`` (``scheduler.py``), seconds.
GAVEL_RESET_SECONDS = 1920.0

POLICIES: tuple[str, ...] = ("fifo", "kueue", "gavel", "walras", "walras-migrate", "walras-timeslice")
#: Policies run only when named (``--policies``): baselines for comparing the engine with Gavel's.
BASELINES: tuple[str, ...] = ("gavel-fifo", "gavel-las")
ALL_POLICIES: tuple[str, ...] = POLICIES + BASELINES


class Policy(Protocol):
    """A scheduling policy: ``decide(state)`` returns where every active job runs from ``state.now`` on."""

    name: str

    def decide(self, state: SimState) -> Decision: ...


def fit(free: np.ndarray, nodes: np.ndarray, count: int) -> np.ndarray | None:
    """Node of each of ``count`` one-accelerator pods among ``nodes`` (consolidated first fit), or None when their
    free accelerators are fewer than ``count``. Decrements ``free`` in place."""
    room = free[nodes]
    if int(room.sum()) < count:
        return None
    whole = np.flatnonzero(room >= count)
    if whole.size:
        k = int(nodes[whole[int(np.argmin(room[whole]))]])  # the fullest node that holds it all
        free[k] -= count
        return np.full(count, k, dtype=np.int64)
    order = np.argsort(-room, kind="stable")
    out: list[int] = []
    for idx in order.tolist():
        k = int(nodes[idx])
        take = min(int(free[k]), count - len(out))
        out.extend([k] * take)
        free[k] -= take
        if len(out) == count:
            break
    return np.array(out, dtype=np.int64)


def _type_nodes(state: SimState) -> list[np.ndarray]:
    return [np.flatnonzero(state.cluster.node_pool == j) for j in range(len(state.cluster.types))]


@dataclass
class QueuePolicy:
    """``fifo`` (``order=None``: the type with the most free accelerators) or ``kueue`` (a fixed type order)."""

    name: str
    ordered: bool = False
    _order: list[int] | None = field(default=None, init=False)
    _runs: list[list[bool]] | None = field(default=None, init=False)  # throughput > 0, per job and type

    def _type_order(self, state: SimState) -> list[int]:
        if self._order is None:
            thr = state.throughput
            best = thr.max(axis=1, keepdims=True)
            rel = np.where(best > 0, thr / np.where(best > 0, best, 1.0), 0.0)
            score = np.median(rel, axis=0) if rel.shape[0] else np.zeros(thr.shape[1])
            self._order = [int(j) for j in np.argsort(-score, kind="stable")]
        return self._order

    def decide(self, state: SimState) -> Decision:
        free = state.free()
        placement = {i: state.placement[i] for i in state.active if i in state.placement}
        type_nodes = _type_nodes(state)
        room = [int(free[nodes].sum()) for nodes in type_nodes]
        if self._runs is None or len(self._runs) != state.throughput.shape[0]:
            self._runs = (state.throughput > 0).tolist()
        runs_on = self._runs
        for i in state.active:
            if max(room, default=0) < 1:
                break  # every pod asks one accelerator: nobody else can start
            if i in placement:
                continue
            need = int(state.pods[i])
            runs = runs_on[i]
            if self.ordered:
                candidates = [j for j in self._type_order(state) if runs[j]]
            else:  # most free first, ties in cluster order
                candidates = [j for j in sorted(range(len(room)), key=lambda j: -room[j]) if runs[j]]
            for j in candidates:
                if room[j] < need:
                    continue
                nodes = fit(free, type_nodes[j], need)
                if nodes is not None:
                    placement[i] = nodes
                    room[j] -= need
                    break
        return Decision(placement)


@dataclass
class RoundPolicy:
    """Time-sliced rounds of :data:`ROUND_SECONDS` realising a fractional allocation (``gavel`` or
    ``walras-timeslice``); ``allocate(state, jobs)`` returns the (len(jobs), m) allocation, recomputed only when the
    set of active jobs changed. ``received`` counts from the last recomputation, as Gavel's priorities do."""

    name: str
    allocate: Callable[[SimState, list[int]], tuple[np.ndarray, dict[str, float] | None]]
    #: None: :func:`time_slice`, the allocation recomputed whenever the set of jobs changes; else Gavel's own round
    #: picking (:func:`time_slice_as_gavel`): "perf" (types V100, P100, K80, work-conserving, as its ``*_perf``
    #: policies) or "fifo" (types shuffled each round, no fill), and Gavel's recomputation rule: on a change of the
    #: jobs only once :data:`GAVEL_RESET_SECONDS` passed since the last one (a job that arrived since has no
    #: allocation until then).
    gavel_rounds: str | None = None
    seed: int = 0
    _key: tuple[int, ...] = field(default=(), init=False)
    _allocation: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)), init=False)
    _prices: dict[str, float] | None = field(default=None, init=False)
    _since: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)), init=False)
    _rng: np.random.Generator | None = field(default=None, init=False)
    _reset_at: float = field(default=-math.inf, init=False)
    _rows: dict[int, np.ndarray] = field(default_factory=dict, init=False)

    def decide(self, state: SimState) -> Decision:
        jobs = list(state.active)
        if not jobs:
            return Decision({})
        key = tuple(jobs)
        if key != self._key:
            if self.gavel_rounds is None or state.now - self._reset_at >= GAVEL_RESET_SECONDS or not self._rows:
                self._allocation, self._prices = self.allocate(state, jobs)
                self._since = state.received.copy()
                self._reset_at = state.now
                self._rows = dict(zip(jobs, self._allocation, strict=True))
            else:  # Gavel: no new allocation before the reset interval; a job that arrived since has none
                zero = np.zeros(len(state.cluster.types))
                self._allocation = np.array([self._rows.get(i, zero) for i in jobs])
            self._key = key
        capacity = state.cluster.capacity
        received = (state.received - self._since)[jobs]
        if self.gavel_rounds is None:
            chosen = time_slice(self._allocation, state.pods[jobs], capacity, received)
        else:
            names = state.cluster.types
            order = [names.index(t) for t in ("v100", "p100", "k80") if t in names]
            order += [j for j in range(len(names)) if j not in order]
            if self.gavel_rounds == "fifo":
                if self._rng is None:
                    self._rng = np.random.default_rng(self.seed)
                order = [order[k] for k in self._rng.permutation(len(order))]
            chosen = time_slice_as_gavel(self._allocation, state.throughput[jobs], state.pods[jobs], capacity,
                                         received, order, fill=self.gavel_rounds != "fifo")
        node_pool = state.cluster.node_pool
        free = state.cluster.node_gpus.copy()
        placement: dict[int, np.ndarray] = {}
        for i, j in zip(jobs, chosen.tolist(), strict=True):  # stay where the round keeps the type
            nodes = state.placement.get(i)
            if j >= 0 and nodes is not None and nodes.size == state.pods[i] and np.all(node_pool[nodes] == j):
                placement[i] = nodes
                np.subtract.at(free, nodes, 1)
        type_nodes = _type_nodes(state)
        for i, j in zip(jobs, chosen.tolist(), strict=True):
            if j >= 0 and i not in placement:
                nodes = fit(free, type_nodes[j], int(state.pods[i]))
                if nodes is None:  # time_slice never gives a type more than its capacity
                    raise AssertionError(f"round gave job {i} type {j} without room")
                placement[i] = nodes
        return Decision(placement, next_replan=state.now + ROUND_SECONDS, prices=self._prices)


def gavel_allocation(state: SimState, jobs: list[int]) -> tuple[np.ndarray, dict[str, float] | None]:
    """Gavel's max-min fair allocation of the active jobs (its LP through HiGHS)."""
    share = max_min_fairness(state.throughput[jobs], state.pods[jobs].astype(np.float64),
                             state.cluster.capacity.astype(np.float64))
    if share.status != "optimal":
        raise RuntimeError(f"Gavel's LP did not solve: {share.status}")
    return share.allocation, None


def gavel_las_allocation(state: SimState, jobs: list[int]) -> tuple[np.ndarray, dict[str, float] | None]:
    """Gavel's own max-min LP of the active jobs (:func:`walras.simulate.gavel.max_min_fairness_as_gavel`)."""
    share = max_min_fairness_as_gavel(state.throughput[jobs], state.pods[jobs].astype(np.float64),
                                      state.cluster.capacity.astype(np.float64))
    if share.status != "optimal":
        raise RuntimeError(f"Gavel's LP did not solve: {share.status}")
    return share.allocation, None


@dataclass
class GavelFifoAllocation:
    """The allocation of Gavel's FIFO policy (stanford-futuredata/gavel ``scheduler/policies/fifo.py``,
    ``FIFOPolicy`` in its default ``base`` mode, the paper's "FIFO" baseline) as its code computes it, for the same
    time-sliced rounds as ``gavel`` (Gavel runs every policy through its rounds).

    Kept across calls: the type each admitted job was given (``X[i, type] = 1``). At each call, in job-id order: a
    job that left hands its type to the head of the queue (the oldest job without a type) when the head fits in what
    is left of that type and runs there; the others' pods are subtracted from their type's capacity. Then, while
    jobs wait and some type has an accelerator left (types in name order: k80, p100, v100): the head leaves the
    queue; if no type has room for all its pods the pass stops (head-of-line blocking); otherwise it is given the
    *last* type of that list, whether or not that type has room (Gavel's code draws a random type with room but
    assigns the loop variable left at the last type: verified by calling Gavel's ``FIFOPolicy.get_allocation`` on 6
    one-GPU jobs and 2 K80 + 2 P100 + 2 V100, which gives all six jobs V100), unless it does not run there; the type
    leaves the list only when exactly used up (the random draw's entry). So V100 is over-subscribed while it has a
    free accelerator and the rounds time-share it, then P100, then K80."""

    seed: int = 0
    _assigned: dict[int, int] = field(default_factory=dict, init=False)
    _rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0), init=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def __call__(self, state: SimState, jobs: list[int]) -> tuple[np.ndarray, dict[str, float] | None]:
        types = state.cluster.types
        pods, thr = state.pods, state.throughput
        available = [int(c) for c in state.cluster.capacity]
        active = set(jobs)
        queue = sorted(i for i in jobs if i not in self._assigned)
        for i in sorted(self._assigned):
            j = self._assigned[i]
            if i in active:
                available[j] -= int(pods[i])
                continue
            del self._assigned[i]
            if queue and int(pods[queue[0]]) <= available[j] and thr[queue[0], j] > 0:
                head = queue.pop(0)
                self._assigned[head] = j
                available[j] -= int(pods[head])
        listed = [j for j in sorted(range(len(types)), key=lambda j: types[j]) if available[j] > 0]
        while queue and listed:
            head = queue.pop(0)
            need = int(pods[head])
            fitting = [k for k, j in enumerate(listed) if available[j] >= need]
            if not fitting:
                break
            pick = fitting[int(self._rng.integers(len(fitting)))]
            j = listed[-1]
            if thr[head, j] > 0:
                self._assigned[head] = j
                available[j] -= need
                if available[j] == 0:
                    listed.pop(pick)
        out = np.zeros((len(jobs), len(types)))
        for row, i in enumerate(jobs):
            if i in self._assigned:
                out[row, self._assigned[i]] = 1.0
        return out, None


@dataclass
class MarketAllocation:
    """Walras's market allocation of the active jobs: :func:`build_plan` on the cluster without pods (the whole
    capacity for sale), warm-started from the previous plan; ``JobPlan.allocation`` is job i's time fraction per
    pool (004, x_ij)."""

    utility: str = "log"
    previous: Plan | None = None
    cache: PlanCache = field(default_factory=PlanCache)  # the planner's reuse from one plan to the next

    def __call__(self, state: SimState, jobs: list[int]) -> tuple[np.ndarray, dict[str, float] | None]:
        specs = tuple(Job(NAMESPACE, job_name(i), 1, job_spec(state, i, utility=self.utility)) for i in jobs)
        cluster = Cluster(nodes=state.cluster.typed_nodes, pools=state.cluster.typed_pools(), jobs=specs)
        plan = build_plan(cluster, self.previous, cache=self.cache, options=PlanOptions(now=state.now))
        self.previous = plan
        types = state.cluster.types
        out = np.zeros((len(jobs), len(types)))
        for row, i in enumerate(jobs):
            jp = plan.jobs.get((NAMESPACE, job_name(i)))
            if jp is not None:
                out[row] = [jp.allocation.get(t, 0.0) for t in types]
        return out, plan.prices


@dataclass
class WalrasPolicy:
    """``walras`` / ``walras-migrate``: the planner's pod actions applied to the simulated pods (module docstring).

    ``migration``: the ``spec.migration`` every job carries (None: never moved). ``remaining_work``: with
    ``migration``, every job reports the work it has left at each re-plan (``JobSpec.remaining_work``, the
    annotation ``walras.dev/remaining-work`` of a real job; the simulator knows it exactly), so the migration phase
    moves a pod only when that finishes the job sooner, restart included (rule (f) of
    :mod:`walras.planner.migration`). ``check``: run :func:`walras.planner.invariants.check_plan` on every plan."""

    name: str
    utility: str = "log"
    migration: MigrationSpec | None = None
    remaining_work: bool = True
    max_migrations: int = 10
    check: bool = True
    #: Seconds after a plan with a preemption's claim (a pod created without a node, waiting for its victims) at
    #: which the policy asks to plan again, as the operator plans again when the victims' pods are gone (its watch
    #: sees them deleted); without it the claim waited for the next arrival or completion.
    claim_replan_seconds: float = 60.0
    previous: Plan | None = field(default=None, init=False)
    cache: PlanCache = field(default_factory=PlanCache, init=False)  # the planner's reuse from one plan to the next
    _pods: dict[str, Pod] = field(default_factory=dict, init=False)
    _jobs: dict[int, Job] = field(default_factory=dict, init=False)
    _serial: int = field(default=0, init=False)

    def decide(self, state: SimState) -> Decision:
        active = set(state.active)
        for i in [i for i in self._jobs if i not in active]:
            del self._jobs[i]
        for i in state.active:
            if i not in self._jobs:
                self._jobs[i] = Job(NAMESPACE, job_name(i), 1, job_spec(state, i, utility=self.utility,
                                                                       migration=self.migration))
            if self.remaining_work and self.migration is not None:  # the annotation a training job keeps current
                job = self._jobs[i]
                assert job.spec is not None
                left = float(state.work[i] - state.progress[i])
                if job.spec.remaining_work != left:
                    self._jobs[i] = dataclasses.replace(job, spec=dataclasses.replace(job.spec, remaining_work=left))
        live = {job_name(i) for i in active}
        self._pods = {name: pod for name, pod in self._pods.items() if pod.job in live}
        cluster = Cluster(nodes=state.cluster.typed_nodes, pods=tuple(sorted(self._pods.values(), key=lambda p: p.key)),
                          pools=state.cluster.typed_pools(), jobs=tuple(self._jobs[i] for i in sorted(self._jobs)))
        plan = build_plan(cluster, self.previous, cache=self.cache,
                          options=PlanOptions(now=state.now, max_migrations=self.max_migrations))
        self.previous = plan
        violations = [str(v) for v in check_plan(cluster, plan)] if self.check else []
        index = {name: k for k, name in enumerate(state.cluster.node_names)}
        evicted: dict[str, int] = {}
        for p in plan.pods:
            if p.action in ("delete", "evict"):
                self._pods.pop(p.name, None)
                if p.action == "evict":
                    evicted[p.job] = evicted.get(p.job, 0) + 1
            elif p.action == "create" and p.node is None and p.name not in self._pods:
                # a preemption's claim (walras.planner.preemption): a pod that waits, unbound, for its victims
                requests = {k: parse_quantity(v) for k, v in p.requests.items()}
                self._pods[p.name] = Pod(NAMESPACE, p.name, None, {**requests, PODS: 1.0}, phase="Pending",
                                         job=p.job, pool=p.pool, uid=f"c{p.name}")
            elif p.action in ("create", "bind") and p.node is not None:
                self._serial += 1
                requests = {k: parse_quantity(v) for k, v in p.requests.items()}
                requests[PODS] = 1.0
                old = self._pods.get(p.name)
                started = old.started if old is not None and p.action == "bind" else state.now
                self._pods[p.name] = Pod(NAMESPACE, p.name, p.node, requests, phase="Running", job=p.job,
                                         pool=p.pool, uid=f"u{self._serial}", started=started)
        for i, job in list(self._jobs.items()):
            moved = evicted.get(job.name, 0)
            if moved:
                r = job.reported
                self._jobs[i] = Job(job.namespace, job.name, job.generation, job.spec, job.error, job.template,
                                    ReportedStatus(r.replicas, r.phase, r.observed_generation, r.failures,
                                                   r.last_failure, r.migrations + moved, state.now))
        by_job: dict[str, list[int]] = {}
        for pod in self._pods.values():
            if pod.node is None and pod.phase == "Pending":
                continue  # a claim that waits for its victims (no GPU yet)
            if pod.requests.get(GPUS, 0.0) != 1.0 or pod.node is None:
                violations.append(f"Pod/{pod.namespace}/{pod.name}: requests {pod.requests.get(GPUS, 0.0):g} "
                                  f"{GPUS}, the simulator models one per pod")
                continue
            by_job.setdefault(str(pod.job), []).append(index[pod.node])
        placement = {i: np.array(sorted(by_job[job_name(i)]), dtype=np.int64)
                     for i in state.active if job_name(i) in by_job}
        waits = any(p.node is None and CLAIM.search(p.reason) is not None for p in plan.pods)
        return Decision(placement, next_replan=state.now + self.claim_replan_seconds if waits else None,
                        prices=plan.prices, violations=violations)


def migration_available() -> bool:
    """Whether the planner has its migration phase (``walras.planner.migration``); without it ``walras-migrate``
    plans exactly as ``walras``."""
    return importlib.util.find_spec("walras.planner.migration") is not None


def make_policy(name: str, *, utility: str = "log", check: bool = True,
                migration: MigrationSpec | None = None, restart_seconds: float | None = None) -> Policy:
    """The policy called ``name`` (one of :data:`ALL_POLICIES`; ``ValueError`` otherwise). ``walras-migrate`` uses
    ``migration`` (default :class:`MigrationSpec` with ``restart_seconds``: the engine's restart delay, the real cost
    of a move in the simulation)."""
    if name == "fifo":
        return QueuePolicy("fifo")
    if name == "kueue":
        return QueuePolicy("kueue", ordered=True)
    if name == "gavel":
        return RoundPolicy("gavel", gavel_allocation)
    if name == "walras":
        return WalrasPolicy("walras", utility=utility, check=check)
    if name == "walras-migrate":
        return WalrasPolicy("walras-migrate", utility=utility, check=check,
                            migration=migration if migration is not None
                            else MigrationSpec(restart_seconds=restart_seconds))
    if name == "walras-timeslice":
        return RoundPolicy("walras-timeslice", MarketAllocation(utility))
    if name == "gavel-fifo":
        return RoundPolicy("gavel-fifo", GavelFifoAllocation(), gavel_rounds="fifo")
    if name == "gavel-las":
        return RoundPolicy("gavel-las", gavel_las_allocation, gavel_rounds="perf")
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(ALL_POLICIES)}")
