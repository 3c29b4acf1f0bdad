"""Re-arranging a few movable tasks among fixed ones: HILL's best-improvement moves (paper 001, Sec. 8.1.1) from a
given feasible start, under per-task Kubernetes hard limits (not in the paper).

The planner's integral fill (``walras.planner.integral``) decides *how many* replicas each job adds to a pool; the
utility of a plan does not depend on which node of the pool holds them, but the side effects of eq. (1) do. In a
colocation pool the nodes already hold tasks that do not move (running pods, the pods the pool's policy placed in this
plan): their per-machine, per-type loads ``L0[k, t]`` and counts ``N0[k, t]`` enter every machine's cost. The fill's
tasks start where the fill put them (a feasible arrangement: every task fits its node on every resource and slot) and
move one at a time, always by the single move that lowers the total cost ``C(P) = sum_k L[k] @ alpha @ N[k]`` (eq. 1;
``sum_u N[k, u] f((L[k] @ alpha)[u])`` with a convex ``f``, Sec. 7) the most, until no move lowers it. A move is
allowed only to a machine the task may use (``allowed``) with room for its whole request vector and a free pod slot,
so every intermediate arrangement is feasible and the result never costs more than the start.

HILL as the paper states it restricts moves to those that keep the OrS order (Sec. 4: Lemma 4.1, linear costs); here
the fixed tasks and the hard limits break the premise of that lemma, so every single-task move between machines is a
candidate (the paper's four moves are among them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._model import machine_costs

__all__ = ["Arrangement", "rearrange"]

#: A move must lower the total cost by more than this (relative to the cost's scale) to be taken.
REL_TOL = 1e-12


@dataclass(frozen=True)
class Arrangement:
    """``assignment[i]``: the machine of movable task ``i``; the total cost (fixed tasks included) of the start and of
    the result; ``moves``: how many moves were taken; ``evaluations``: candidate moves whose cost was evaluated;
    ``status``: ``"local-optimum"`` (no single move lowers the cost) or ``"budget"`` (stopped by ``budget``)."""

    assignment: np.ndarray
    start_cost: float
    cost: float
    moves: int
    evaluations: int
    status: str


def rearrange(
    fixed_loads: Any,
    fixed_counts: Any,
    sizes: Any,
    types: Any,
    alpha: Any,
    start: Any,
    *,
    need: Any,
    room: Any,
    slots: Any,
    allowed: Any,
    cost: Any = None,
    budget: int = 200_000,
) -> Arrangement:
    """Best-improvement single-task moves (module docstring) of the movable tasks, from ``start``.

    Shapes: ``fixed_loads``, ``fixed_counts`` ``(m, T)``; ``sizes``, ``types``, ``start`` ``(n,)``; ``need`` ``(n, R)``
    (each task's request vector); ``room`` ``(m, R)`` (each machine's free vector with the movable tasks *not* on it);
    ``slots`` ``(m,)`` (free pod slots without them); ``allowed`` ``(n, m)`` bool. ``cost``: ``None`` (eq. 1) or an
    increasing convex callable (Sec. 7, e.g. :func:`allocator.colocation.cost_function`'s). ``ValueError`` if the
    start does not fit. Deterministic: of equal moves the lowest task index, then the lowest machine, is taken.
    """
    L0 = np.asarray(fixed_loads, dtype=np.float64)
    N0 = np.asarray(fixed_counts, dtype=np.float64)
    p = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(types, dtype=np.int64)
    a = np.asarray(alpha, dtype=np.float64)
    assign = np.asarray(start, dtype=np.int64).copy()
    need_ = np.asarray(need, dtype=np.float64)
    free = np.asarray(room, dtype=np.float64).copy()
    slot = np.asarray(slots, dtype=np.float64).copy()
    ok = np.asarray(allowed, dtype=bool)
    m, T = L0.shape
    n = p.shape[0]
    if N0.shape != (m, T) or a.shape != (T, T) or t.shape != (n,) or assign.shape != (n,) or ok.shape != (n, m):
        raise ValueError("rearrange: inconsistent shapes")
    if need_.shape[0] != n or free.shape != (m, need_.shape[1]) or slot.shape != (m,):
        raise ValueError("rearrange: inconsistent shapes of need, room or slots")
    if n and (assign.min() < 0 or assign.max() >= m or t.min() < 0 or t.max() >= T):
        raise ValueError("rearrange: start or types out of range")
    L, N = L0.copy(), N0.copy()
    np.add.at(L, (assign, t), p)
    np.add.at(N, (assign, t), 1.0)
    np.subtract.at(free, assign, need_)
    np.subtract.at(slot, assign, 1.0)
    slack = 1e-9 * np.maximum(1.0, np.abs(np.asarray(room, dtype=np.float64)))  # per machine and resource
    if (free < -slack).any() or (slot < 0).any() or (n and not ok[np.arange(n), assign].all()):
        raise ValueError("rearrange: the start does not fit its machines")
    per = machine_costs(L, N, a, cost)
    start_cost = float(per.sum())
    unit = np.eye(T)
    moves = evaluations = 0
    status = "local-optimum"
    while n:
        if evaluations + n * m > budget:
            status = "budget"
            break
        # cost of every machine with task i added (n, m) and of its own machine with task i removed (n,)
        add = machine_costs(L[None] + p[:, None, None] * unit[t][:, None, :],
                            N[None] + unit[t][:, None, :], a, cost) - per[None, :]
        rem = machine_costs(L[assign] - p[:, None] * unit[t], N[assign] - unit[t], a, cost) - per[assign]
        delta = add + rem[:, None]
        fits = ok & (slot[None, :] >= 1.0) & (free[None, :, :] + slack[None, :, :] >= need_[:, None, :]).all(axis=2)
        fits[np.arange(n), assign] = False
        evaluations += n * m
        delta = np.where(fits, delta, np.inf)
        flat = int(np.argmin(delta))
        best = float(delta.flat[flat])
        if not best < -REL_TOL * max(1.0, abs(float(per.sum()))):
            break
        i, b = divmod(flat, m)
        src = int(assign[i])
        L[src, t[i]] -= p[i]
        N[src, t[i]] -= 1.0
        L[b, t[i]] += p[i]
        N[b, t[i]] += 1.0
        free[src] += need_[i]
        free[b] -= need_[i]
        slot[src] += 1.0
        slot[b] -= 1.0
        assign[i] = b
        per[[src, b]] = machine_costs(L[[src, b]], N[[src, b]], a, cost)
        moves += 1
    return Arrangement(assign, start_cost, float(per.sum()), moves, evaluations, status)
