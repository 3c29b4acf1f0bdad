"""Greedy heuristics of paper 003, Section VI-A: LCLS, LCBC and the online OBC.

All take the inputs of :func:`allocator.degree.seq` (``demands, capacities, degrees, *, extra_degree``); a server
may serve at most ``d_j + extra_degree`` clients, so with the default ``extra_degree=1`` they get the same resource
augmentation as SEQ (as in the comparison of Section VI-A).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

import numpy as np

from .model import FloatArray, Instance, IntArray, as_instance, changes_between

__all__ = ["OnlineBestConnection", "lcbc", "lcls", "obc"]


def _greedy(inst: Instance, extra_degree: int, *, per_connection: bool) -> FloatArray:
    if int(extra_degree) != extra_degree or extra_degree < 0:
        raise ValueError(f"extra_degree must be a non-negative integer, got {extra_degree!r}")
    tol = inst.tol
    w = np.zeros((inst.n, inst.m), dtype=np.float64)
    rem_b = inst.capacities.astype(np.float64).copy()
    rem_d = (inst.degrees + int(extra_degree)).astype(np.int64)

    def skey(j: int) -> tuple[float, int]:
        prio = rem_b[j] / rem_d[j] if per_connection else rem_b[j]
        return (-float(prio), j)

    servers = [skey(j) for j in range(inst.m) if rem_b[j] > tol and rem_d[j] > 0]
    heapq.heapify(servers)
    clients = [(-float(inst.demands[i]), i) for i in range(inst.n) if inst.demands[i] > tol]
    heapq.heapify(clients)
    while clients and servers:
        neg_x, i = heapq.heappop(clients)
        _, j = heapq.heappop(servers)
        x = -neg_x
        amount = min(x, float(rem_b[j]))
        w[i, j] += amount
        rem_b[j] -= amount
        rem_d[j] -= 1
        if x - amount > tol:
            heapq.heappush(clients, (-(x - amount), i))  # the remainder goes back in the ordered list
        if rem_b[j] > tol and rem_d[j] > 0:
            heapq.heappush(servers, skey(j))
    return w


def lcls(
    demands: Sequence[float] | FloatArray,
    capacities: Sequence[float] | FloatArray,
    degrees: Sequence[int] | IntArray,
    *,
    extra_degree: int = 1,
) -> FloatArray:
    """LCLS (Largest Client Largest Server): the largest remaining client goes to the server with the largest
    remaining capacity ``b'_j``; a client split by a full server goes back with its remaining demand."""
    return _greedy(as_instance(demands, capacities, degrees), extra_degree, per_connection=False)


def lcbc(
    demands: Sequence[float] | FloatArray,
    capacities: Sequence[float] | FloatArray,
    degrees: Sequence[int] | IntArray,
    *,
    extra_degree: int = 1,
) -> FloatArray:
    """LCBC (Largest Client Best Connection): the largest remaining client goes to the server with the largest
    remaining capacity per remaining connection ``b'_j / d'_j``; split clients go back with their remainder.

    Worst case (Section VI-A): ``m`` servers of capacity ``B`` and degree ``B/2``, ``mB/2`` unit clients and one of
    size ``mB/2`` give ``mB (3/4 + 1/(2B))`` against SEQ's ``mB``.
    """
    return _greedy(as_instance(demands, capacities, degrees), extra_degree, per_connection=True)


class OnlineBestConnection:
    """OBC (Online Best Connection, Section VI-A), the online version of LCBC.

    * Arrival of a client of demand ``x``: it connects to the server (with degree and capacity left) whose capacity
      per connection ``b'_j / d'_j`` is closest to ``x``, taking ``min(x, b'_j)``; any remainder repeats this. If no
      server has a free connection, OBC scans the servers with capacity left but no degree left and swaps the
      newcomer with a smaller connected client, on the server that gives the largest throughput gain
      (``min(x, a + b'_j) - a`` for an evicted connection of size ``a``, largest for the smallest connection);
      this repeats while it gains. Evicted clients lose that connection.
    * Departure of ``X`` from servers ``S``: on each such ``S`` the freed bandwidth is used to fold other connections
      of clients ``Y`` already on ``S``: ``Y``'s share on another server ``S'`` moves to ``S`` (lowering the degree
      of ``S'``), smallest shares first, as many as fit. Then clients left with no connection at all are retried as
      arrivals (largest first).

    ``last_changes`` maps each server to its number of changes (new connection, disconnection, or changed amount)
    caused by the last event; servers without change are absent.
    """

    def __init__(
        self,
        capacities: Sequence[float] | FloatArray,
        degrees: Sequence[int] | IntArray,
        *,
        extra_degree: int = 1,
    ) -> None:
        inst = as_instance([], capacities, degrees)
        if int(extra_degree) != extra_degree or extra_degree < 0:
            raise ValueError(f"extra_degree must be a non-negative integer, got {extra_degree!r}")
        self.m = inst.m
        self.capacities = inst.capacities
        self.degrees = inst.degrees
        self.extra_degree = int(extra_degree)
        self._tol = 1e-12 * max(float(inst.capacities.sum()), 1.0)
        self._rem_b = inst.capacities.copy()
        self._rem_d = (inst.degrees + self.extra_degree).astype(np.int64)
        self._srv: list[dict[Hashable, float]] = [{} for _ in range(self.m)]
        self._cli: dict[Hashable, dict[int, float]] = {}
        self._demand: dict[Hashable, float] = {}
        self._order: dict[Hashable, int] = {}
        self._counter = 0
        self._min_a = np.full(self.m, np.inf)
        self._touched: dict[int, dict[Hashable, float]] = {}
        self.last_changes: dict[int, int] = {}

    # -- bookkeeping -------------------------------------------------------------------------------------------
    def _touch(self, j: int) -> None:
        if j not in self._touched:
            self._touched[j] = dict(self._srv[j])

    def _set(self, c: Hashable, j: int, amount: float) -> None:
        self._touch(j)
        old = self._srv[j].get(c, 0.0)
        if amount > self._tol:
            if old == 0.0:
                self._rem_d[j] -= 1
            self._srv[j][c] = amount
            self._cli[c][j] = amount
        else:
            amount = 0.0
            if old > 0.0:
                self._rem_d[j] += 1
            self._srv[j].pop(c, None)
            self._cli[c].pop(j, None)
        self._rem_b[j] += old - amount
        vals = self._srv[j].values()
        self._min_a[j] = min(vals) if vals else np.inf

    def _served(self, c: Hashable) -> float:
        return float(sum(self._cli[c].values()))

    # -- OBC procedures ----------------------------------------------------------------------------------------
    def _arrive(self, c: Hashable) -> None:
        x = self._demand[c] - self._served(c)
        while x > self._tol:
            free = (self._rem_d > 0) & (self._rem_b > self._tol)
            if c in self._cli:
                for j in self._cli[c]:
                    free[j] = False
            cand = np.flatnonzero(free)
            if cand.size == 0:
                break
            per_conn = self._rem_b[cand] / self._rem_d[cand]
            j = int(cand[int(np.argmin(np.abs(per_conn - x)))])
            amount = min(x, float(self._rem_b[j]))
            self._set(c, j, self._srv[j].get(c, 0.0) + amount)
            x -= amount
        while x > self._tol:
            full = (self._rem_d <= 0) & (self._rem_b > self._tol) & (self._min_a < x)
            for j in self._cli[c]:
                full[j] = False
            cand = np.flatnonzero(full)
            if cand.size == 0:
                break
            gain = np.minimum(x - self._min_a[cand], self._rem_b[cand])
            best = int(np.argmax(gain))
            if gain[best] <= self._tol:
                break
            j = int(cand[best])
            srv = self._srv[j]
            victim = min(srv, key=lambda k: (srv[k], self._order[k]))
            room = srv[victim] + float(self._rem_b[j])
            self._set(victim, j, 0.0)
            amount = min(x, room)
            self._set(c, j, amount)
            x -= amount

    def _depart_fold(self, s: int) -> None:
        moves: list[tuple[float, int, Hashable, int]] = []
        for y in self._srv[s]:
            for s2, a in self._cli[y].items():
                if s2 != s:
                    moves.append((a, self._order[y], y, s2))
        moves.sort(key=lambda t: (t[0], t[1], t[3]))
        for _a, _o, y, s2 in moves:
            a = self._cli[y].get(s2, 0.0)
            if a <= 0.0 or y not in self._srv[s]:
                continue
            if a <= self._rem_b[s] + self._tol:
                self._set(y, s2, 0.0)
                self._set(y, s, self._srv[s][y] + a)

    # -- public API --------------------------------------------------------------------------------------------
    def add(self, client_id: Hashable, demand: float) -> None:
        """A client joins with the given demand (OBC arrival rule)."""
        if client_id in self._demand:
            raise ValueError(f"client {client_id!r} is already present")
        x = float(demand)
        if not np.isfinite(x) or x < 0:
            raise ValueError(f"demand of client {client_id!r} must be finite and non-negative, got {demand!r}")
        self._touched = {}
        self._demand[client_id] = x
        self._order[client_id] = self._counter
        self._counter += 1
        self._cli[client_id] = {}
        self._arrive(client_id)
        self._finish()

    def remove(self, client_id: Hashable) -> None:
        """A client leaves (OBC departure rule)."""
        if client_id not in self._demand:
            raise ValueError(f"client {client_id!r} is not present")
        self._touched = {}
        freed = sorted(self._cli[client_id])
        for j in freed:
            self._set(client_id, j, 0.0)
        del self._cli[client_id], self._demand[client_id], self._order[client_id]
        for j in freed:
            self._depart_fold(j)
        if freed:
            waiting = [c for c in self._demand if not self._cli[c] and self._demand[c] > self._tol]
            waiting.sort(key=lambda c: (-self._demand[c], self._order[c]))
            for c in waiting:
                self._arrive(c)
        self._finish()

    def _finish(self) -> None:
        new = {j: self._srv[j] for j in self._touched}
        self.last_changes = changes_between(self._touched, new, self.m, self._tol)

    def allocation(self) -> dict[Hashable, dict[int, float]]:
        """``{client: {server: amount}}`` for every connected client."""
        return {c: dict(v) for c, v in self._cli.items() if v}

    def throughput(self) -> float:
        return float(self.capacities.sum() - self._rem_b.sum())


def obc(
    demands: Sequence[float] | FloatArray,
    capacities: Sequence[float] | FloatArray,
    degrees: Sequence[int] | IntArray,
    *,
    extra_degree: int = 1,
) -> FloatArray:
    """OBC run offline: clients arrive one by one by decreasing demand (ties by index); returns ``w[i, j]``."""
    inst = as_instance(demands, capacities, degrees)
    on = OnlineBestConnection(inst.capacities, inst.degrees, extra_degree=extra_degree)
    for i in np.lexsort((np.arange(inst.n), -inst.demands)):
        on.add(int(i), float(inst.demands[i]))
    w = np.zeros((inst.n, inst.m), dtype=np.float64)
    for c, row in on.allocation().items():
        for j, a in row.items():
            w[int(c), j] = a  # type: ignore[call-overload]
    return w
