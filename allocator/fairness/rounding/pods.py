"""Integral task counts (pods) from a divisible allocation, never exceeding any capacity.

Kubernetes runs whole pods, so the divisible solution of any mechanism in :mod:`allocator.fairness` is rounded:
``floor`` every ``x[n, k]`` (feasible, since usage only drops), then hand the remaining fractional tasks back one pod
at a time, always to the user with the lowest fill ratio ``(integral total) / (divisible total)``, on the eligible
server where that user had the largest fractional remainder and the pod still fits. A pod that does not fit now never
fits later (capacity only gets used), so every candidate pair is tried at most once. No pair gets more than
``ceil(x[n, k])`` pods and no user more than ``max_tasks``.
"""

from __future__ import annotations

import heapq

import numpy as np

from .._model import FloatArray, Instance


def round_allocation(x: FloatArray, inst: Instance, *, eps: float = 1e-7, compiled: bool = True) -> FloatArray:
    """Round a feasible divisible allocation to integers without violating capacities (see module docstring).

    ``compiled``: the hand-back loop runs as one compiled call (:mod:`._hand_back_kernel`), else as the Python
    reference loop; both give the same result (``tests/test_fairness.py``)."""
    x = np.where(inst.eligible, np.maximum(x, 0.0), 0.0)
    xi = np.floor(x + eps)
    # floor(x + eps) may round 2.9999999 up to 3: undo any such step that breaks a capacity.
    load = xi.T @ inst.demands
    cap = inst.capacities
    target = x.sum(axis=1)
    frac = x - xi
    for kk in np.flatnonzero((load > cap * (1 + 1e-12)).any(axis=1)):
        for ii in np.flatnonzero(xi[:, kk] > x[:, kk]):
            xi[ii, kk] -= 1
        load[kk] = xi[:, kk] @ inst.demands
    # each user's candidate servers: fractional remainder > eps, largest first, ties by server index
    has = frac > eps
    order = np.argsort(np.where(has, -frac, np.inf), axis=1, kind="stable")
    n_cand = has.sum(axis=1)
    tot = xi.sum(axis=1)
    limit = np.asarray(inst.max_tasks, dtype=np.float64) + eps
    dem = np.ascontiguousarray(inst.demands, dtype=np.float64)
    slack = np.ascontiguousarray(cap * (1 + 1e-12), dtype=np.float64)
    if compiled:
        from allocator.fairness.kernels import load as load_kernels

        load = np.ascontiguousarray(load, dtype=np.float64)
        limits = np.broadcast_to(limit, tot.shape).copy()
        load_kernels().hand_back(xi, load, slack, dem, tot, limits, target, order, n_cand)
    else:
        _hand_back_reference(xi, load, slack, dem, tot, limit, target, order, n_cand)
    return xi


def _hand_back_reference(xi: FloatArray, load: FloatArray, slack: FloatArray, dem: FloatArray, tot: FloatArray,
                         limit: FloatArray, target: FloatArray, order: np.ndarray, n_cand: np.ndarray) -> None:
    """The hand-back loop in Python (the reference of :func:`._hand_back_kernel.hand_back`), in place on ``xi``."""
    n = xi.shape[0]
    cand = [[int(v) for v in order[i, : n_cand[i]]] for i in range(n)]
    heap: list[tuple[float, int]] = [(float(tot[i] / target[i]), i) for i in range(n) if cand[i] and target[i] > 0]
    heapq.heapify(heap)
    # The loop tries up to n x k single pods on r resources: plain Python floats beat numpy calls on r-vectors by
    # an order of magnitude there, and give the same IEEE sums and comparisons.
    load_l: list[list[float]] = load.tolist()
    cap_l: list[list[float]] = slack.tolist()
    dem_l: list[list[float]] = dem.tolist()
    tot_l: list[float] = tot.tolist()
    limit_l = np.broadcast_to(limit, tot.shape).tolist()
    target_l: list[float] = target.tolist()
    nxt = [0] * n  # next untried candidate of each user
    while heap:
        _, i = heapq.heappop(heap)
        if tot_l[i] + 1 > limit_l[i]:
            continue
        d = dem_l[i]
        options = cand[i]
        placed = False
        while nxt[i] < len(options):
            k = options[nxt[i]]
            nxt[i] += 1
            lk, ck = load_l[k], cap_l[k]
            if all(lk[r] + d[r] <= ck[r] for r in range(len(d))):
                xi[i, k] += 1
                for r in range(len(d)):
                    lk[r] += d[r]
                tot_l[i] += 1
                placed = True
                break
        if placed and nxt[i] < len(options):
            heapq.heappush(heap, (tot_l[i] / target_l[i], i))
