"""Issue 33's measures of a walras ``Plan`` against the exact reference (:mod:`tests.reference.placement_milp`),
computed from the plan's pod plans and the :class:`~tests.reference.clusters.Instance` alone (the plan's own status
numbers, ``JobPlan.throughput`` and ``PoolPlan.used``, are not read).

A pod counts as placed when its plan has a node and its action is ``create``, ``bind``, ``keep`` or ``resize``. A
placed pod whose request of its pool's priced resource is below the job's ``demand`` is an *under-demand replica*; it
counts towards the job's throughput as ``amount / demand`` of a replica (a 1-GPU pod of a 2-GPU replica does half a
replica's work at best).

* ``ratio``: the weighted geometric mean over the jobs the reference serves and the plan serves too of
  ``T_plan_i / T_opt_i`` (``exp(sum w_i log(T_plan_i / T_opt_i) / sum w_i)``; log utility: the normalised
  utility gap); a job the reference serves and the plan does not is *starved* and is counted apart (it would make
  the mean 0);
* ``idle_waiting``: priced units idle in pools where some job that may use the pool (``a[i, j] > 0``) *waits*
  (fewer placed replicas than ``N_i``) and its next replica fits on a node of the pool (every resource, pod slots,
  the degree limit) after the plan's pods; 0 when no such pool exists (log utility: every next replica has a
  positive marginal utility, and the generated jobs have no gang, budget, backoff or suspension);
* ``gpus``: priced units the plan's placed pods take; ``violations``: nodes the plan over-commits in the
  instance's model (any resource or the slot limit).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.reference.clusters import RESOURCES, Instance, parse_quantity
from tests.reference.placement_milp import Reference, lexicographic, optimum

__all__ = ["Metrics", "evaluate", "fixed_point_actions", "parse_quantity", "placement"]

PLACED = ("create", "bind", "keep", "resize")
@dataclass(frozen=True)
class Metrics:
    """Issue 33's measures of one plan (module docstring). ``throughput[i]``: the plan's ``T_i``."""

    throughput: np.ndarray
    ratio: float
    starved: int
    under_demand: int
    idle_waiting: float
    waiting_jobs: int  # jobs whose next replica fits in a pool where GPUs are idle
    gpus: float
    gpus_optimum: float
    violations: int
    plan_objective: tuple[int, float]  # lexicographic (served, sum w log(T/r)) of the plan
    optimum_objective: tuple[int, float]


def placement(instance: Instance, plan: Any) -> tuple[np.ndarray, int, np.ndarray]:
    """(replica-equivalents per (job, node), under-demand pods, priced units per (job, node)) of the plan's placed
    pods (module docstring)."""
    job_index = {(instance.namespace_of(i), name): i for i, name in enumerate(instance.jobs)}
    node_index = {name: k for k, name in enumerate(instance.nodes)}
    K = len(instance.nodes)
    reps = np.zeros((instance.n, K))
    units = np.zeros((instance.n, K))
    pods = np.zeros((instance.n, K), dtype=np.int64)
    under = 0
    for pod in plan.pods:
        if pod.action not in PLACED or pod.node is None:
            continue
        i, k = job_index.get((pod.namespace, pod.job)), node_index.get(pod.node)
        if i is None or k is None:
            continue
        j = int(instance.node_pool[k])
        resource = instance.pool_resource[j] if j >= 0 else RESOURCES[0]
        amount = parse_quantity(pod.requests.get(resource, "0"))
        if amount + 1e-9 < instance.demand[i]:
            under += 1
        units[i, k] += amount
        pods[i, k] += 1
        reps[i, k] += min(1.0, amount / instance.demand[i])
    return reps, under, np.concatenate([units[..., None], pods[..., None].astype(float)], axis=2)


def _used(instance: Instance, plan: Any) -> np.ndarray:
    """(K, R) what the plan's placed pods request on each node, over ``RESOURCES`` (the pods' own requests; a pod
    slot each)."""
    node_index = {name: k for k, name in enumerate(instance.nodes)}
    used = np.zeros((len(instance.nodes), len(RESOURCES)))
    for pod in plan.pods:
        if pod.action not in PLACED or pod.node is None:
            continue
        k = node_index.get(pod.node)
        if k is None:
            continue
        for r, name in enumerate(RESOURCES):
            if name == "pods":
                used[k, r] += 1.0
            elif name in pod.requests:
                value = parse_quantity(pod.requests[name])
                used[k, r] += value / 2.0**30 if name == "memory" else value
    return used


def _throughput(instance: Instance, reps: np.ndarray) -> np.ndarray:
    per_pool = np.zeros((instance.n, instance.m))
    for k in range(len(instance.nodes)):
        j = int(instance.node_pool[k])
        if j >= 0:
            per_pool[:, j] += reps[:, k]
    return (instance.a * per_pool).sum(axis=1) / instance.replicas


def idle_while_waiting(instance: Instance, used: np.ndarray, placed: np.ndarray) -> tuple[float, int]:
    """(priced units idle in the pools where a waiting job's next replica fits, the number of such jobs)."""
    free = instance.capacity - used
    pods = RESOURCES.index("pods")
    slots = np.array([instance.slots(k) for k in range(len(instance.nodes))]) - used[:, pods]
    idle = 0.0
    waiting: set[int] = set()
    for j in range(instance.m):
        nodes = np.flatnonzero(instance.node_pool == j)
        priced = RESOURCES.index(instance.pool_resource[j])
        hit = False
        for i in range(instance.n):
            if instance.a[i, j] <= 0 or placed[i] >= instance.replicas[i]:
                continue
            req = instance.request(i, j)
            for k in nodes:
                room = free[k].copy()
                room[pods] = min(room[pods], slots[k])
                if np.all(req <= room + 1e-9):
                    hit = True
                    waiting.add(i)
                    break
        if hit:
            idle += float(np.maximum(free[nodes, priced], 0.0).sum())
    return idle, len(waiting)


def evaluate(instance: Instance, plan: Any, reference: Reference | None = None) -> Metrics:
    """Issue 33's measures of ``plan`` (a walras ``Plan`` of ``instance``'s manifests) against ``reference`` (the
    exact optimum, :func:`tests.reference.optimum` with its default time limit when not given)."""
    if reference is None:
        reference = optimum(instance)
    reps, under, per_pair = placement(instance, plan)
    thr = _throughput(instance, reps)
    opt = reference.throughput
    both = (opt > 0) & (thr > 0)
    starved = int(((opt > 0) & (thr <= 0)).sum())
    w = instance.weight
    ratio = math.exp(float(np.sum(w[both] * np.log(thr[both] / opt[both])) / w[both].sum())) if both.any() else 0.0
    used = _used(instance, plan)
    placed = per_pair[..., 1].sum(axis=1)  # pods, whatever their amount
    idle, waiting = idle_while_waiting(instance, used, placed)
    cap = instance.capacity.copy()
    cap[:, RESOURCES.index("pods")] = [instance.slots(k) for k in range(len(instance.nodes))]
    violations = int(np.any(used > cap + 1e-6, axis=1).sum())
    gpus = float(sum(used[k, RESOURCES.index(instance.pool_resource[instance.node_pool[k]])]
                     for k in range(len(instance.nodes)) if instance.node_pool[k] >= 0))
    return Metrics(thr, ratio, starved, under, idle, waiting, gpus, reference.gpus, violations,
                   lexicographic(instance, thr), (reference.served, reference.objective))


def fixed_point_actions(plan: Any, *, pending: bool = False) -> int:
    """The pod actions of a plan made for the cluster its predecessor produced: every action but ``keep`` for pods
    that run (``pending`` False), every action but ``keep`` and ``bind`` when the same pods are Pending."""
    allowed: Iterable[str] = ("keep", "bind") if pending else ("keep",)
    return sum(1 for pod in plan.pods if pod.action not in allowed)
