"""What a policy sees of a running simulation, what it answers, and the typed planner view of either.

:class:`SimState` is owned by the engine (:mod:`.engine`); a policy reads it and returns a :class:`Decision`: the
nodes each active job's pods run on until the next re-plan. Every simulated pod holds one accelerator of its node's
type (:mod:`.cluster`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from walras.planner.cluster import PODS, Cluster, Job, Pod
from walras.planner.spec import JobSpec, MigrationSpec, UtilitySpec
from walras.simulate.cluster import GPUS, VirtualCluster
from walras.simulate.trace import Trace

#: Namespace of every simulated job.
NAMESPACE = "sim"


def job_name(job: int) -> str:
    return f"j{job:06d}"


@dataclass
class SimState:
    """The simulation at time ``now``.

    ``throughput[i, j]``: job i's throughput with all its ``pods[i]`` pods on type ``cluster.types[j]``;
    ``active``: ids of the jobs that arrived and have work left, in arrival order; ``placement[i]``: the node index of
    each running pod of job i (absent: not running); ``received[i, j]``: seconds job i has run on type j (weighted by
    the fraction of its pods there); ``progress[i]``: work done.
    """

    trace: Trace
    cluster: VirtualCluster
    throughput: np.ndarray
    pods: np.ndarray
    work: np.ndarray
    now: float = 0.0
    active: list[int] = field(default_factory=list)
    placement: dict[int, np.ndarray] = field(default_factory=dict)
    received: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    progress: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def free(self) -> np.ndarray:
        """(K,) accelerators free on each node under the current placement."""
        size = len(self.cluster.node_names)
        if not self.placement:
            return self.cluster.node_gpus.copy()
        return self.cluster.node_gpus - np.bincount(np.concatenate(list(self.placement.values())), minlength=size)


@dataclass
class Decision:
    """A policy's answer: ``placement[i]`` the node of each pod of active job i that runs from now on (a job absent
    or with an empty array does not run); ``next_replan``: when the policy wants to be asked again even if nothing
    happens (a round's end), or None; ``prices``: per pool, for the market policies; ``violations``: invariant
    violations found on the plan the policy applied (``walras.planner.invariants``), as text."""

    placement: dict[int, np.ndarray]
    next_replan: float | None = None
    prices: dict[str, float] | None = None
    violations: list[str] = field(default_factory=list)


def job_spec(state: SimState, job: int, *, utility: str = "log", migration: MigrationSpec | None = None) -> JobSpec:
    """The FungibleJob the planner sees for trace job ``job``: ``pods[i]`` replicas of one accelerator each (a fixed
    count), its throughput per pool from the trace, the given utility (004 Sec. 2.2) and ``spec.migration``."""
    name = job_name(job)
    row = state.throughput[job]
    return JobSpec(namespace=NAMESPACE, name=name, generation=1,
                   throughput={t: float(v) for t, v in zip(state.cluster.types, row, strict=True) if v > 0},
                   utility=UtilitySpec(type=utility), demand=1.0, replicas=int(state.pods[job]),
                   min_replicas=int(state.pods[job]), elastic=False, resources={}, resource_text={},
                   colocation_type=None, colocation_size=1.0, curve=None, throughput_demand=None, weight=1.0,
                   migration=migration)


def typed_cluster(state: SimState, placement: dict[int, np.ndarray], jobs: dict[int, Job]) -> Cluster:
    """The typed planner cluster of a placement (one Running pod per placed accelerator, named
    ``{job}-{node}-{k}``), for ``walras.planner.invariants.check_cluster``."""
    names = state.cluster.node_names
    types = state.cluster.types
    node_pool = state.cluster.node_pool
    pods: list[Pod] = []
    for i, nodes in placement.items():
        job = job_name(i)
        for k, node in enumerate(nodes.tolist()):
            pods.append(Pod(NAMESPACE, f"{job}-{names[node]}-{k}", names[node], {GPUS: 1.0, PODS: 1.0},
                            phase="Running", job=job, pool=types[int(node_pool[node])]))
    pods.sort(key=lambda p: p.key)
    return Cluster(nodes=state.cluster.typed_nodes, pods=tuple(pods), pools=state.cluster.typed_pools(),
                   jobs=tuple(jobs[i] for i in sorted(jobs)))
