"""Placement policies inside one ResourcePool behind one interface.

The market (004, Alg. 2) decides how many replicas of each job go to each pool; a pool's policy then decides on which
node each new pod lands and how much of the pool's priced resource it gets. Every policy implements
:class:`PlacementPolicy` (``place(request) -> PlacementResult``) and is registered under the name a ResourcePool's
``spec.policy.type`` uses:

* ``utility`` -- assign-and-allocate (paper 000, Alg. 2), :mod:`allocator.aa`;
* ``colocation`` -- interference-aware partition (paper 001), :mod:`allocator.colocation`;
* ``throughput`` -- degree-limited SEQ (paper 003), :mod:`allocator.degree`;
* ``fair`` -- PS-DSF / PF-VDS(alpha) (paper 002), :mod:`allocator.fairness`;
* ``spread`` -- most-free-node first, the fallback when a policy cannot place (no allocator module involved).

Pods that already run never move: the request only holds the pods still to place and the free capacity and degree
slots that the running pods leave on each node.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from walras.planner.replicas import largest_remainder
from walras.planner.spec import CurveSpec, JobSpec, PoolSpec, ProfileSpec

#: Slots of a node without a degree limit (larger than any pod count a node can hold).
UNLIMITED = 1 << 30
#: Cost-evaluation budget of the colocation policy's HILL search (see :class:`ColocationPolicy`).
COLOCATION_BUDGET = 200_000


@dataclass
class PlacementRequest:
    """What a policy needs to place the new pods of one pool.

    ``free[k]`` is node k's free amount of the pool's priced resource, ``slots[k]`` how many more Walras pods it may
    run (degree limit minus running Walras pods), ``node_resources[k, r]`` its free amount of ``resource_names[r]``
    (the priced resource first). ``pod_job[q]`` is the index in ``jobs`` of pod q; every job has
    ``job_pods[i]`` pods to place and throughput ``job_throughput[i]`` in this pool (its a_ij, 004 Sec. 2.1).
    """

    pool: PoolSpec
    node_names: list[str]
    free: np.ndarray
    slots: np.ndarray
    resource_names: list[str]
    node_resources: np.ndarray
    jobs: list[JobSpec]
    job_pods: np.ndarray
    job_throughput: np.ndarray
    job_replicas_total: np.ndarray
    pod_job: np.ndarray
    profile: ProfileSpec | None = None
    #: Per job, the most units of the priced resource one of its pods may get (``inf``: no bound; a tenant's Budget
    #: cap, :attr:`walras.planner.spec.JobSpec.pod_caps`); None: no job is bounded
    job_max_amount: np.ndarray | None = None

    @property
    def n_pods(self) -> int:
        return int(self.pod_job.shape[0])

    def demand(self) -> np.ndarray:
        """Nominal amount of the priced resource per pod (its job's demand per replica)."""
        per_job = np.array([job.demand for job in self.jobs], dtype=np.float64)
        return per_job[self.pod_job] if self.n_pods else np.zeros(0)

    def job_resource_vectors(self) -> np.ndarray:
        """``(n_jobs, n_resources)`` per-task demand vectors; the priced resource defaults to the job's demand."""
        out = np.zeros((len(self.jobs), len(self.resource_names)))
        for i, job in enumerate(self.jobs):
            for r, name in enumerate(self.resource_names):
                out[i, r] = job.resources.get(name, job.demand if r == 0 else 0.0)
            out[i, 0] = job.resources.get(self.resource_names[0], job.demand)
        return out


@dataclass
class PlacementResult:
    """``node[q]`` is the index (into the request's nodes) of pod q, or -1 if it stays unplaced; ``amount[q]`` is the
    amount of the priced resource it requests (and is limited to)."""

    node: np.ndarray
    amount: np.ndarray
    notes: list[str] = field(default_factory=list)


class PlacementPolicy(Protocol):
    """A placement policy: ``place`` must be deterministic and respect ``free`` and ``slots``."""

    name: str

    def place(self, request: PlacementRequest) -> PlacementResult: ...


def check_result(request: PlacementRequest, result: PlacementResult, *, slack: float = 1e-6) -> None:
    """Raise ``ValueError`` if ``result`` overfills a node's priced resource or degree slots, or has a bad shape."""
    n = request.n_pods
    if result.node.shape != (n,) or result.amount.shape != (n,):
        raise ValueError(f"placement must return {n} nodes and amounts, got {result.node.shape}/{result.amount.shape}")
    k = len(request.node_names)
    placed = result.node >= 0
    if np.any(result.node >= k):
        raise ValueError("placement returned a node index out of range")
    if np.any(result.amount[placed] <= 0):
        raise ValueError("placement gave a placed pod no resource")
    load = np.bincount(result.node[placed], weights=result.amount[placed], minlength=k)
    over = np.flatnonzero(load > request.free + slack)
    if over.size:
        j = int(over[0])
        raise ValueError(f"placement overfills node {request.node_names[j]}: {load[j]:g} > {request.free[j]:g}")
    count = np.bincount(result.node[placed], minlength=k)
    over = np.flatnonzero(count > request.slots)
    if over.size:
        j = int(over[0])
        raise ValueError(f"placement exceeds the degree limit on node {request.node_names[j]}")


class SpreadPolicy:
    """Most-free-node first: pods in decreasing demand, each on the node with the most free priced resource.

    A max-heap on free capacity gives O(P log K) for P pods on K nodes. Processing pods in decreasing size means that
    when the most-free node cannot hold a pod, no node can (first-fit decreasing on the emptiest node).
    """

    name = "spread"

    def place(self, request: PlacementRequest) -> PlacementResult:
        demand = request.demand()
        node = np.full(request.n_pods, -1, dtype=np.int64)
        free = request.free.astype(np.float64).copy()
        slots = request.slots.astype(np.int64).copy()
        heap = [(-free[k], k) for k in range(len(free)) if slots[k] > 0 and free[k] > 0]
        heapq.heapify(heap)
        order = np.lexsort((np.arange(request.n_pods), -demand))
        for q in order:
            if not heap:
                break
            neg, k = heap[0]
            if -neg + 1e-9 < demand[q]:
                continue
            heapq.heappop(heap)
            node[q] = k
            free[k] -= demand[q]
            slots[k] -= 1
            if slots[k] > 0 and free[k] > 1e-9:
                heapq.heappush(heap, (-free[k], k))
        return PlacementResult(node=node, amount=np.where(node >= 0, demand, 0.0))


def curve_values(curve: CurveSpec | None, demand: float, capacity: int) -> np.ndarray:
    """Values of a pod's utility curve at integer amounts ``0..capacity`` (AA's value table row, paper 000 Sec. 3).

    Without a curve a pod values each unit linearly up to its nominal demand and nothing beyond it.
    """
    amounts = np.arange(capacity + 1, dtype=np.float64)
    if curve is None:
        return np.minimum(amounts, demand)
    if curve.points:
        xs = np.array([p[0] for p in curve.points])
        ys = np.array([p[1] for p in curve.points])
        values = np.interp(amounts, xs, ys, left=ys[0], right=ys[-1])
        return values - values[0]
    if curve.type == "linear":
        cap = curve.saturation if curve.saturation is not None else demand
        return curve.scale * np.minimum(amounts, cap)
    if curve.type == "log":
        return curve.scale * np.log1p(amounts)
    if curve.type == "power":
        return curve.scale * amounts**curve.exponent
    middle = curve.saturation if curve.saturation is not None else demand
    values = curve.scale / (1.0 + np.exp(-(amounts - middle)))
    return values - values[0]


class UtilityPolicy:
    """Assign-and-allocate (paper 000, Alg. 2 by default): each pod gets a node and an integral amount of the priced
    resource maximising the sum of the pods' utility curves (:func:`allocator.aa.assign_and_allocate`)."""

    name = "utility"

    def place(self, request: PlacementRequest) -> PlacementResult:
        from allocator import aa

        n = request.n_pods
        node = np.full(n, -1, dtype=np.int64)
        amount = np.zeros(n)
        usable = np.flatnonzero((request.slots > 0) & (np.floor(request.free + 1e-9) >= 1))
        if n == 0 or usable.size == 0:
            return PlacementResult(node=node, amount=amount)
        capacities = np.floor(request.free[usable] + 1e-9).astype(np.int64)
        top = int(capacities.max())
        table = np.zeros((len(request.jobs), top + 1))
        for i, job in enumerate(request.jobs):
            table[i] = curve_values(job.curve, job.demand, top)
            bound = request.job_max_amount[i] if request.job_max_amount is not None else np.inf
            if bound < top:  # a Budget cap's per-pod bound: the value table is flat beyond it
                table[i, int(np.floor(bound + 1e-9)) + 1:] = table[i, int(np.floor(bound + 1e-9))]
        values = table[request.pod_job]
        # Degree limit: AA assigns any number of threads to a server, so pods beyond a node's slots are evicted
        # (smallest amounts first); the units they free go back to the pods left on their node by the same optimal
        # per-node split that follows the algorithm (allocator.aa.reallocate, never worse than what they had).
        server, got = aa.assign_and_allocate(values, capacities, method=request.pool.aa_method)
        server = np.asarray(server, dtype=np.int64)
        got = np.asarray(got, dtype=np.float64)
        ok = (server >= 0) & (got > 0)
        node[ok] = usable[server[ok]]
        amount[ok] = got[ok]
        _enforce_slots(node, amount, request.slots)
        kept = np.flatnonzero(node >= 0)
        if 0 < kept.size < int(ok.sum()):
            split = aa.reallocate(
                aa.as_curves(values[kept], top), server[kept], capacities, current=amount[kept].astype(np.int64)
            )
            amount[kept] = np.asarray(split, dtype=np.float64)
        return PlacementResult(node=node, amount=amount)


def _enforce_slots(node: np.ndarray, amount: np.ndarray, slots: np.ndarray) -> None:
    """Unplace pods beyond each node's slots, keeping the pods with the largest amounts (in place)."""
    placed = np.flatnonzero(node >= 0)
    if placed.size == 0:
        return
    order = placed[np.lexsort((placed, -amount[placed], node[placed]))]
    nodes_sorted = node[order]
    starts = np.searchsorted(nodes_sorted, nodes_sorted, side="left")
    rank = np.arange(order.size) - starts
    drop = order[rank >= slots[nodes_sorted]]
    node[drop] = -1
    amount[drop] = 0.0


class ColocationPolicy:
    """Interference-aware partition of the pool's pods onto its nodes (paper 001; by default ``auto``: the exact DP
    over machines where it is small enough, else the multi-start swap/plateau search, :mod:`allocator.colocation`).

    Task sizes and types come from each job's ``spec.colocation``; the interference matrix alpha and the cost from the
    pool's ColocationProfile (:func:`allocator.colocation.partition`).
    """

    name = "colocation"

    def place(self, request: PlacementRequest) -> PlacementResult:
        from allocator import colocation

        profile = request.profile
        if profile is None:
            raise ValueError(f"pool {request.pool.name}: colocation policy needs a ColocationProfile")
        n = request.n_pods
        node = np.full(n, -1, dtype=np.int64)
        demand = request.demand()
        usable = np.flatnonzero((request.slots > 0) & (request.free > 0))
        if n == 0 or usable.size == 0:
            return PlacementResult(node=node, amount=np.zeros(n))
        type_index = {t: k for k, t in enumerate(profile.types)}
        sizes = np.array([request.jobs[i].colocation_size for i in request.pod_job], dtype=np.float64)
        types = np.array([type_index[request.jobs[i].colocation_type or ""] for i in request.pod_job], dtype=np.int64)
        alpha = np.array(profile.interference, dtype=np.float64)
        machines = usable.size if request.pool.machines is None else min(request.pool.machines, usable.size)
        # Machines are the usable nodes with the most free resource first (the order BestOrS+HILL fills them in).
        ranked = usable[np.lexsort((usable, -request.free[usable]))][:machines]
        method = request.pool.colocation_method
        # HILL's budget of cost evaluations (001 Sec. 8.1.1 uses 10**6): 2 * 10**5 keeps a 1,400-pod pool near 1 s on
        # a busy 2-core machine (2.4 s with 10**6) for a cost 0.4 % higher on that instance.
        options: dict[str, Any] = {"type_names": list(profile.types), "budget": COLOCATION_BUDGET}
        if method in colocation_limits_methods():
            # Kubernetes hard limits (001 Sec. 3 with the allocator's capacity/max_tasks extension): a node's free
            # priced resource, in the units of the pods' demands, and its free Walras pod slots.
            options.update(
                capacity=request.free[ranked].astype(np.float64),
                max_tasks=np.minimum(request.slots[ranked], n).astype(np.int64),
                demands=demand.astype(np.float64),
            )
        cost = colocation_cost(profile)
        try:
            assignment = colocation.partition(sizes, types, alpha, machines, method=method, cost=cost, **options)
        except colocation.InfeasibleError:
            # No partition within the limits was found: partition without them and let _fit leave the pods that do
            # not fit unplaced (they are reported as unplaceable, not over-committed).
            assignment = colocation.partition(
                sizes,
                types,
                alpha,
                machines,
                method=method,
                cost=cost,
                budget=COLOCATION_BUDGET,
                type_names=list(profile.types),
            )
        assignment = np.asarray(assignment, dtype=np.int64)
        # The partition respects the limits when they were passed; _fit re-checks them (pods that do not fit stay
        # unplaced) for the methods without hard limits.
        node = _fit(ranked[assignment], demand, request.free, request.slots)
        return PlacementResult(node=node, amount=np.where(node >= 0, demand, 0.0))


def colocation_cost(profile: ProfileSpec) -> str:
    """The ``cost=`` name of :func:`allocator.colocation.cost_function` for a profile's cost (001 Sec. 7: an increasing
    convex ``f``): ``linear`` -> ``"linear"``, convex with exponent 2 -> ``"quadratic"``, else ``"power:k"``."""
    if profile.cost == "linear" or profile.exponent == 1.0:
        return "linear"
    if profile.exponent == 2.0:
        return "quadratic"
    return f"power:{profile.exponent:g}"


def colocation_limits_methods() -> tuple[str, ...]:
    """The partition methods that accept hard limits (``capacity``, ``max_tasks``, ``demands``)."""
    from allocator import colocation

    return tuple(colocation.LIMITS_METHODS)


def _fit(proposed: np.ndarray, demand: np.ndarray, free: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """Keep each proposed node while it has room (priced resource and slots), in pod order; unplace the rest."""
    node = np.full(proposed.shape[0], -1, dtype=np.int64)
    left = free.astype(np.float64).copy()
    room = slots.astype(np.int64).copy()
    for q in range(proposed.shape[0]):
        k = int(proposed[q])
        if k >= 0 and room[k] > 0 and left[k] + 1e-9 >= demand[q]:
            node[q] = k
            left[k] -= demand[q]
            room[k] -= 1
    return node


class ThroughputPolicy:
    """Degree-limited allocation (paper 003, SEQ, Sec. IV-A, Thm. 4.4): each job's splittable demand is split over
    few nodes so that every node serves at most ``degreeLimit`` jobs (one more with ``extraDegree``), maximising the
    throughput served (:func:`allocator.degree.plan_pool`). A job's share ``w[i, k]`` on node k becomes pods by
    largest remainder of ``w[i, k] / demand``; pods beyond a node's free resource or its degree slots (max Walras
    pods per node, a hard limit) stay unplaced."""

    name = "throughput"

    def place(self, request: PlacementRequest) -> PlacementResult:
        from allocator import degree

        n = request.n_pods
        node = np.full(n, -1, dtype=np.int64)
        demand_pod = request.demand()
        usable = np.flatnonzero((request.slots > 0) & (request.free > 0))
        if n == 0 or usable.size == 0:
            return PlacementResult(node=node, amount=np.zeros(n))
        per_job = np.array([job.demand for job in request.jobs])
        need = request.job_pods * per_job
        for i, job in enumerate(request.jobs):
            # Splittable throughput demand (003 Sec. 2): the job needs no more resource than brings its target.
            if job.throughput_demand is not None and request.job_throughput[i] > 0:
                per_unit = request.job_throughput[i] / (request.job_replicas_total[i] * job.demand)
                need[i] = min(need[i], job.throughput_demand / per_unit)
        active = np.flatnonzero(need > 0)
        if active.size == 0:
            return PlacementResult(node=node, amount=np.zeros(n))
        degrees = np.minimum(request.slots[usable], max(1, active.size)).astype(np.int64)
        w = degree.plan_pool(need[active], request.free[usable], degrees, extra_pod_allowed=request.pool.extra_degree)
        w = np.asarray(w, dtype=np.float64)
        proposed = np.full(n, -1, dtype=np.int64)
        for row, i in enumerate(active.tolist()):
            pods = np.flatnonzero(request.pod_job == i)
            total = int(min(pods.size, round(float(w[row].sum() / per_job[i]))))
            if total == 0:
                continue
            counts = largest_remainder(w[row] / per_job[i], total)
            targets = np.repeat(usable, counts)
            proposed[pods[: targets.size]] = targets
        node = _fit(proposed, demand_pod, request.free, request.slots)
        return PlacementResult(node=node, amount=np.where(node >= 0, demand_pod, 0.0))


class FairPolicy:
    """Multi-resource fair allocation across the pool's heterogeneous nodes (paper 002: PS-DSF, or PF-VDS(alpha);
    DRFH and TSF as the paper's baselines).

    Each job's per-task vector (its ``spec.resources``, with the priced resource defaulting to its demand) and weight
    go to :func:`allocator.fairness.allocate`, which returns the number of tasks of each job on each node; a job never
    gets more pods than it is offered in this pool (``max_tasks``): the market's replicas for a fixed-size job, up to
    ``spec.replicas.max`` for an elastic one, so that the fair allocation decides an elastic job's replica count
    (:mod:`walras.planner.plan`)."""

    name = "fair"

    def place(self, request: PlacementRequest) -> PlacementResult:
        from allocator import fairness

        n = request.n_pods
        node = np.full(n, -1, dtype=np.int64)
        demand_pod = request.demand()
        usable = np.flatnonzero(request.slots > 0)
        if n == 0 or usable.size == 0:
            return PlacementResult(node=node, amount=np.zeros(n))
        vectors = request.job_resource_vectors()
        caps = request.node_resources[usable]
        # A job none of whose nodes has room left in every resource it needs (a full pool) gets no task here; the
        # mechanism is run on the others (allocator.fairness rejects a user eligible nowhere).
        fits = np.any(np.all((caps[None, :, :] > 0) | (vectors[:, None, :] <= 0), axis=2), axis=1)
        tasks = np.zeros((len(request.jobs), usable.size), dtype=np.int64)
        notes: list[str] = []
        if fits.any():
            kwargs: dict[str, Any] = {
                "weights": np.array([job.weight for job in request.jobs])[fits],
                "mechanism": request.pool.fair_mechanism,
                "integral": True,
                "max_tasks": request.job_pods.astype(np.float64)[fits],
            }
            if request.pool.fair_mechanism == "pf-vds" and request.pool.fair_alpha is not None:
                kwargs["alpha"] = request.pool.fair_alpha
            got = fairness.allocate(vectors[fits], caps, **kwargs)
            tasks[fits] = np.floor(np.asarray(got.tasks, dtype=np.float64) + 1e-9).astype(np.int64)
            if got.status == "capped":
                notes.append(f"{request.pool.fair_mechanism} stopped at its cap uncertified ({got.method}, residual "
                             f"{got.residual:.3g}): {got.message}")
        proposed = np.full(n, -1, dtype=np.int64)
        for i in range(len(request.jobs)):
            pods = np.flatnonzero(request.pod_job == i)
            targets = np.repeat(usable, tasks[i])[: pods.size]
            proposed[pods[: targets.size]] = targets
        node = _fit(proposed, demand_pod, request.free, request.slots)
        return PlacementResult(node=node, amount=np.where(node >= 0, demand_pod, 0.0), notes=notes)


PolicyFactory = Callable[[], PlacementPolicy]

#: Registry of placement policies by ``spec.policy.type`` (plus ``spread``, the fallback).
REGISTRY: dict[str, PolicyFactory] = {
    "utility": UtilityPolicy,
    "colocation": ColocationPolicy,
    "throughput": ThroughputPolicy,
    "fair": FairPolicy,
    "spread": SpreadPolicy,
}


def get_policy(name: str) -> PlacementPolicy:
    """The registered policy called ``name`` (``ValueError`` for an unknown name)."""
    try:
        return REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}; known: {', '.join(sorted(REGISTRY))}") from None
