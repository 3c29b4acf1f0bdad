"""When would a waiting job start? The simulator (:mod:`.engine`, the engine of ``walras simulate``) run forward
from a plan, over the plan's own jobs and the work they have left (``walras explain``, issue 28).

The pools and jobs connected to the waiting job (the pools it may use, the jobs that may use one of them, their pools,
and so on) become a trace and a virtual cluster of :mod:`.engine`'s model: each pool one accelerator type of identical
nodes (``nodes x units per node`` of its priced resource on its usable nodes, :class:`PlanCluster`, carrying the
pool's ``spec.preemption``), each job ``spec.replicas`` pods of one unit with its ``spec.throughput`` per pool. The
jobs that have replicas placed in the plan arrive at time 0 (the plan's moment), the waiting ones (in queue order)
:data:`ARRIVAL` seconds later; a job's work is what it has left (``walras.dev/remaining-work``, in its throughput's
unit times seconds); the job asked about gets a vanishing amount of work, so that the engine stops (``until``) as
soon as it has run. The policy is ``walras`` (the planner itself, one re-plan per event: ``window=0``), within a
bounded horizon (:data:`HORIZON`). The estimate is the engine's start time of the job.

The estimate is given only where the engine's model is the plan's (otherwise :attr:`StartEstimate.seconds` is None
and :attr:`StartEstimate.note` says why, naming the first objects that do not fit it): every job of the component
reports its remaining work (the job asked about excepted), asks for one unit per replica, a fixed count (not
elastic, not a gang), a log utility of weight 1, priority weight 1 and PriorityClass priority 0 (the engine's jobs);
every pool has identical usable nodes with a whole number of units, no ``spec.capacity``, no ``degreeLimit`` below its
units per node, and no capacity held by pods Walras does not manage; tenants (Budgets) are off; and the engine's
first plan (time 0) runs every job that runs in the plan at the plan's throughput (``JobPlan.throughput``: the
engine's rate is the same ``sum_j a_ij n_ij / N_i``). cpu and memory requests are not in the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from walras.planner.cluster import Cluster, Job, Pool
from walras.planner.model import JobPlan, Plan
from walras.planner.spec import PreemptionSpec
from walras.simulate.cluster import PoolShape, VirtualCluster
from walras.simulate.engine import EngineOptions, simulate
from walras.simulate.trace import Trace, TraceJob

#: The simulated time (seconds) after which the estimate gives up: a week.
HORIZON = 7 * 86400.0
#: The waiting jobs arrive this long (seconds) after the running ones: the engine's first plan places only what runs.
ARRIVAL = 1e-3
#: At most this many jobs in the component (each event is one plan): beyond, no estimate.
MAX_JOBS = 100
#: The work of the job asked about, in seconds at its rate: it finishes as soon as it starts.
_INSTANT = 1e-6


@dataclass(frozen=True)
class StartEstimate:
    """``seconds``: from the plan's moment until the simulated job starts (None: no estimate, ``note`` says why);
    ``note``: how it was obtained, or why there is none; ``jobs``: jobs simulated; ``replans``: the engine's
    re-plans; ``horizon``: the simulated time bound (seconds)."""

    seconds: float | None
    note: str
    jobs: int = 0
    replans: int = 0
    horizon: float = HORIZON

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "note": self.note, "jobs": self.jobs, "replans": self.replans,
                "horizonSeconds": self.horizon}


@dataclass(frozen=True)
class PlanCluster(VirtualCluster):
    """The virtual cluster of a plan's pools: :class:`~.cluster.VirtualCluster` with each pool's own
    ``spec.preemption`` (whether running pods yield to a waiting job, docs/preemption.md), in ``pools`` order."""

    preemption: tuple[PreemptionSpec, ...] = ()

    def typed_pools(self, policy: str = "utility") -> tuple[Pool, ...]:
        rules = dict(zip(self.types, self.preemption, strict=True))
        return tuple(replace(p, spec=replace(p.spec, preemption=rules[p.name])) if p.spec is not None else p
                     for p in super().typed_pools(policy))


def _component(jobs: dict[tuple[str, str], Job], key: tuple[str, str], pools: set[str]) -> tuple[list[str], list]:
    """The pools and job keys connected to ``key`` through pools they may use (throughput above 0)."""
    def uses(job: Job) -> set[str]:
        assert job.spec is not None
        return {p for p, a in job.spec.throughput.items() if a > 0 and p in pools}

    seen_pools: set[str] = set()
    seen_jobs = {key}
    frontier = uses(jobs[key])
    while frontier:
        seen_pools |= frontier
        new = [k for k, job in jobs.items() if k not in seen_jobs and uses(job) & frontier]
        seen_jobs.update(new)
        frontier = set().union(*(uses(jobs[k]) for k in new)) - seen_pools if new else set()
    return sorted(seen_pools), sorted(seen_jobs)


def _unmodelled_job(job: Job, jp: JobPlan, asked: bool) -> str | None:
    """Why the engine cannot run ``job`` as the plan does (None: it can)."""
    spec = job.spec
    assert spec is not None
    name = f"{job.namespace}/{job.name}"
    if spec.gang or spec.elastic:
        return f"{name} is {'a gang' if spec.gang else 'elastic'}; the simulator's jobs have a fixed count"
    if spec.demand != 1.0:
        return f"{name} asks for {spec.demand:g} units per replica; the simulator's pods hold one"
    if spec.utility.type != "log" or spec.utility.weight != 1.0 or spec.weight != 1.0:
        return (f"{name} has a {spec.utility.type} utility (weight {spec.utility.weight:g}, priority weight "
                f"{spec.weight:g}); the simulator prices log utilities of weight 1")
    if job.priority != 0 or not job.preemptible:
        return f"{name} has priority {job.priority} (preemptible {job.preemptible}); the simulator's jobs have 0"
    if not asked and spec.remaining_work is None:
        return f"the remaining work of {name} is unknown (annotation walras.dev/remaining-work)"
    return None


def _shape(cluster: Cluster, plan: Plan, name: str) -> PoolShape | str:
    """Pool ``name`` as ``nodes x units`` of identical nodes, or why it is not one."""
    pool = next((p for p in cluster.pools if p.name == name), None)
    pp = plan.pools.get(name)
    if pool is None or pool.spec is None or pp is None or not pp.nodes:
        return f"pool {name!r} has no usable node"
    nodes = {n.name: n for n in cluster.nodes}
    units = {nodes[n].allocatable.get(pool.spec.resource, 0.0) for n in pp.nodes if n in nodes}
    if len(units) != 1:
        return f"the nodes of pool {name!r} differ in {pool.spec.resource} ({', '.join(f'{u:g}' for u in units)})"
    (each,) = units
    if each < 1 or each != math.floor(each):
        return f"the nodes of pool {name!r} have {each:g} {pool.spec.resource}; the simulator counts whole units"
    if pool.spec.capacity is not None or (pool.spec.degree_limit is not None and pool.spec.degree_limit < each):
        return f"pool {name!r} has a spec.capacity or a degreeLimit below its units per node"
    on = set(pp.nodes)
    foreign = sum(p.requests.get(pool.spec.resource, 0.0) for p in cluster.pods
                  if p.job is None and p.node in on and not p.terminal)
    if foreign > 0:
        return f"{foreign:g} {pool.spec.resource} of pool {name!r} are held by pods Walras does not manage"
    return PoolShape(name, len(pp.nodes), int(each))


def estimate_start(cluster: Cluster, plan: Plan, key: tuple[str, str], *, tenants: bool = False,
                   horizon: float = HORIZON) -> StartEstimate:
    """The simulated start of waiting job ``key`` of ``plan`` (planned from ``cluster``; see the module docstring),
    in seconds from the plan's moment, or why there is none."""
    jp = plan.jobs.get(key)
    if jp is None or sum(jp.replicas.values()) > 0:
        return StartEstimate(None, "the job has replicas placed: it has started")
    if tenants:
        return StartEstimate(None, "tenants (Budgets) are on; the simulator has none")
    live = ("Pending", "Running")
    jobs = {j.key: j for j in cluster.jobs if j.spec is not None and j.key in plan.jobs
            and plan.jobs[j.key].phase in live and not (j.spec.remaining_work == 0 and j.key != key)}
    if key not in jobs:
        return StartEstimate(None, f"the job is {jp.phase}")
    names, keys = _component(jobs, key, set(plan.pools))
    if not names:
        return StartEstimate(None, "the job may use no pool")
    if len(keys) > MAX_JOBS:
        return StartEstimate(None, f"{len(keys)} jobs share its pools; the estimate simulates at most {MAX_JOBS}")
    for k in keys:
        why = _unmodelled_job(jobs[k], plan.jobs[k], k == key)
        if why is not None:
            return StartEstimate(None, why)
    shapes = []
    for name in names:
        shape = _shape(cluster, plan, name)
        if isinstance(shape, str):
            return StartEstimate(None, shape)
        shapes.append(shape)
    return _simulate(cluster, plan, key, names, keys, shapes, horizon)


def _rates_now(cluster: Cluster, specs: dict[tuple[str, str], Any]) -> dict[tuple[str, str], float]:
    """Per job of ``specs`` with pods on a node now (Walras's, not terminal): their throughput
    ``sum_j a_ij n_ij / N_i``, what the engine's first plan must reproduce."""
    out: dict[tuple[str, str], float] = {}
    for pod in cluster.pods:
        key = (pod.namespace, pod.job or "")
        spec = specs.get(key)
        if pod.job is not None and pod.node is not None and not pod.terminal and spec is not None:
            out[key] = out.get(key, 0.0) + spec.throughput.get(pod.pool or "", 0.0) / max(spec.replicas, 1)
    return out


def _simulate(cluster: Cluster, plan: Plan, key: tuple[str, str], names: list[str], keys: list[tuple[str, str]],
              shapes: list[PoolShape], horizon: float) -> StartEstimate:
    """Run the engine over the component (checked by :func:`estimate_start`) and read the job's start."""
    specs = {j.key: j.spec for j in cluster.jobs if j.key in set(keys)}
    now = _rates_now(cluster, specs)
    running = [k for k in keys if plan.jobs[k].replicas or k in now]
    waiting = sorted((k for k in keys if k not in set(running)),
                     key=lambda k: (plan.jobs[k].queue_position or 1 << 30, k))
    order = running + waiting
    trace_jobs = []
    for q, k in enumerate(order):
        spec = specs[k]
        assert spec is not None
        row = tuple(float(spec.throughput.get(p, 0.0)) for p in names)
        work = _INSTANT * max(row) if k == key else float(spec.remaining_work or 0.0)
        trace_jobs.append(TraceJob(q, 0.0 if k in running else ARRIVAL, f"{k[0]}/{k[1]}", spec.replicas, work, row))
    pools = {p.name: p for p in cluster.pools}
    vc = PlanCluster(tuple(shapes), tuple(pools[n].spec.preemption for n in names))  # type: ignore[union-attr]
    target = order.index(key)
    try:
        run = simulate(Trace(tuple(trace_jobs), tuple(names), "plan"), vc, "walras",
                       EngineOptions(window=0.0, check=False, record=True, horizon=horizon,
                                     until=(target, target + 1)))
    except ValueError as exc:  # a job the virtual cluster cannot hold (more pods than a pool's units)
        return StartEstimate(None, f"the simulator cannot run the component: {exc}")
    first: dict[int, tuple[float, float]] = {}
    for i, begin, _end, rate in sorted(run.segments, key=lambda s: (s[0], s[1])):
        first.setdefault(i, (begin, rate))
    for q, k in enumerate(running):
        begin, rate = first.get(q, (math.inf, 0.0))
        expected = now.get(k, plan.jobs[k].throughput)
        if begin > 0 or not math.isclose(rate, expected, rel_tol=1e-6, abs_tol=1e-12):
            return StartEstimate(None, f"the simulator's first plan runs {k[0]}/{k[1]} at {rate:.4g} where its pods "
                                       f"run at {expected:.4g}", len(order), run.replans, horizon)
    start = float(run.start[target])
    if not np.isfinite(start):
        return StartEstimate(None, f"it does not start within the {horizon / 3600:g} h the simulation covers",
                             len(order), run.replans, horizon)
    return StartEstimate(start, f"simulated: {len(order)} job(s) over pool(s) {', '.join(names)} with their "
                                f"remaining work, {run.replans} re-plan(s) of the walras policy",
                         len(order), run.replans, horizon)
