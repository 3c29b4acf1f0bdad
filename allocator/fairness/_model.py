"""Validated problem instance for multi-resource fairness on heterogeneous nodes (paper 002, Sec. 2).

Notation follows ``docs`` of paper 002 (Khamse-Ashari et al.) as restated in the project's fairness note:
``d[n, r]`` per-task demand of user (job) ``n``, ``c[k, r]`` capacity of server (node) ``k``, ``E[n, k]`` placement
eligibility, ``phi[n]`` weights, ``gamma[n, k]`` tasks user ``n`` could run with server ``k`` to itself (eq. 8).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]


@dataclass(frozen=True)
class Instance:
    """A validated instance: ``n`` users, ``k`` servers, ``r`` resources.

    Attributes:
        demands: ``(n, r)`` per-task demand ``d``.
        capacities: ``(k, r)`` capacities ``c``.
        eligible: ``(n, k)`` effective eligibility: the caller's mask AND the server has every resource the user needs.
        weights: ``(n,)`` positive weights ``phi``.
        max_tasks: ``(n,)`` caps on total tasks (``inf`` = elastic without limit).
        gamma: ``(n, k)`` monopoly task counts of eq. 8 (0 where not eligible).
    """

    demands: FloatArray
    capacities: FloatArray
    eligible: BoolArray
    weights: FloatArray
    max_tasks: FloatArray
    gamma: FloatArray

    @property
    def n(self) -> int:
        return int(self.demands.shape[0])

    @property
    def k(self) -> int:
        return int(self.capacities.shape[0])

    @property
    def r(self) -> int:
        return int(self.demands.shape[1])


def monopoly_tasks(demands: FloatArray, capacities: FloatArray) -> FloatArray:
    """``gamma0[n, k] = min over r with d[n, r] > 0 of c[k, r] / d[n, r]`` (eq. 8, placement constraints ignored).

    It is 0 exactly when server ``k`` lacks a resource user ``n`` needs.
    """
    d = demands[:, None, :]
    c = capacities[None, :, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(d > 0, c / np.where(d > 0, d, 1.0), np.inf)
    g = ratio.min(axis=2)
    return np.where(np.isfinite(g), g, 0.0)


def make_instance(
    demands: ArrayLike,
    capacities: ArrayLike,
    eligible: ArrayLike | None = None,
    weights: ArrayLike | None = None,
    max_tasks: ArrayLike | None = None,
) -> Instance:
    """Validate inputs and build an :class:`Instance`.

    Raises:
        ValueError: on shape mismatches, non-finite or negative values, a user with an all-zero demand vector,
            non-positive weights, negative caps, or a user that is eligible on no server (after removing servers
            that lack a resource the user needs). Messages name the offending user / node / resource index.
    """
    d = np.array(demands, dtype=np.float64, copy=True)
    c = np.array(capacities, dtype=np.float64, copy=True)
    if d.ndim != 2:
        raise ValueError(f"demands must be a 2-D (users x resources) array, got shape {d.shape}")
    if c.ndim != 2:
        raise ValueError(f"capacities must be a 2-D (nodes x resources) array, got shape {c.shape}")
    n, r = d.shape
    k = c.shape[0]
    if n == 0 or k == 0 or r == 0:
        raise ValueError(f"need at least one user, node and resource, got demands {d.shape}, capacities {c.shape}")
    if c.shape[1] != r:
        raise ValueError(f"capacities have {c.shape[1]} resources but demands have {r}")
    for name, arr in (("demands", d), ("capacities", c)):
        bad = np.argwhere(~np.isfinite(arr))
        if bad.size:
            i, j = bad[0]
            raise ValueError(f"{name}[{i}, {j}] is not finite")
    neg = np.argwhere(d < 0)
    if neg.size:
        raise ValueError(f"user {neg[0][0]} has a negative demand for resource {neg[0][1]}")
    neg = np.argwhere(c < 0)
    if neg.size:
        raise ValueError(f"node {neg[0][0]} has a negative capacity for resource {neg[0][1]}")
    zero = np.flatnonzero(~(d > 0).any(axis=1))
    if zero.size:
        raise ValueError(f"user {zero[0]} has a zero demand vector")
    if weights is None:
        w = np.ones(n)
    else:
        w = np.array(weights, dtype=np.float64).reshape(-1)
        if w.shape != (n,):
            raise ValueError(f"weights must have shape ({n},), got {w.shape}")
        badw = np.flatnonzero(~(np.isfinite(w) & (w > 0)))
        if badw.size:
            raise ValueError(f"user {badw[0]} has a non-positive or non-finite weight {w[badw[0]]}")
    if max_tasks is None:
        cap = np.full(n, np.inf)
    else:
        cap = np.array(max_tasks, dtype=np.float64).reshape(-1)
        if cap.shape == (1,):
            cap = np.full(n, cap[0])
        if cap.shape != (n,):
            raise ValueError(f"max_tasks must have shape ({n},), got {cap.shape}")
        badc = np.flatnonzero(np.isnan(cap) | (cap < 0))
        if badc.size:
            raise ValueError(f"user {badc[0]} has an invalid max_tasks {cap[badc[0]]}")
    if eligible is None:
        e = np.ones((n, k), dtype=bool)
    else:
        e = np.array(eligible, dtype=bool)
        if e.shape != (n, k):
            raise ValueError(f"eligible must have shape ({n}, {k}), got {e.shape}")
    gamma0 = monopoly_tasks(d, c)
    e = e & (gamma0 > 0)
    nowhere = np.flatnonzero(~e.any(axis=1))
    if nowhere.size:
        raise ValueError(
            f"user {nowhere[0]} is eligible on no node (placement constraints, or no node has every resource it needs)"
        )
    gamma = np.where(e, gamma0, 0.0)
    return Instance(demands=d, capacities=c, eligible=e, weights=w, max_tasks=cap, gamma=gamma)


def usage(x: FloatArray, inst: Instance) -> FloatArray:
    """Resource usage per server, ``(k, r)``: ``sum_n x[n, k] d[n, r]`` (left side of eq. 10)."""
    return np.einsum("nk,nr->kr", x, inst.demands)


def log_marginal(inst: Instance, x_tot: FloatArray, alpha: float) -> FloatArray:
    """``log g[n, k] = alpha log phi_n + (alpha - 1) log gamma[n, k] - alpha log x_n``, the log marginal utility of
    PF-VDS(alpha) (paper 002, eq. 59), ``(n, k)``; ``-inf`` where not eligible."""
    with np.errstate(divide="ignore"):
        lg = np.log(np.where(inst.eligible, inst.gamma, 1.0))
        out = alpha * np.log(inst.weights)[:, None] + (alpha - 1.0) * lg - alpha * np.log(x_tot)[:, None]
        return np.asarray(np.where(inst.eligible, out, -np.inf), dtype=np.float64)


def merge_identical_nodes(inst: Instance) -> tuple[Instance, np.ndarray, np.ndarray]:
    """Merge nodes with equal capacity rows and equal eligibility columns.

    Returns ``(merged, group, count)``: ``group[k]`` is the merged index of node ``k``, ``count[g]`` the group size.
    """
    key = np.concatenate([inst.capacities, inst.eligible.T.astype(np.float64)], axis=1)
    _, first, group = np.unique(key, axis=0, return_index=True, return_inverse=True)
    group = group.reshape(-1)
    count = np.bincount(group, minlength=first.size).astype(np.float64)
    caps = inst.capacities[first] * count[:, None]
    merged = Instance(
        demands=inst.demands,
        capacities=caps,
        eligible=inst.eligible[:, first],
        weights=inst.weights,
        max_tasks=inst.max_tasks,
        gamma=inst.gamma[:, first] * count[None, :],
    )
    return merged, group, count
