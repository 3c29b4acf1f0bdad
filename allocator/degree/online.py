"""OSEQ (paper 003, Section V): SEQ maintained under client arrivals and departures.

Two implementations that must give the same allocation after every event:

* ``method="naive"`` is Algorithm 2: SEQ recomputed from scratch on the sorted current clients at every round.
* ``method="incremental"`` re-uses the previous round (Section V-C). Every server step of the last run recorded the
  range of list keys ``(value, rank)`` whose insertion or removal can change that step (its interval plus the
  neighbour on the left, see :mod:`allocator.degree._engine`). A client that joins or leaves passes unchanged through
  every server whose range does not contain its key (the "change outside ``[l, l + d]``" case of Lemma 5.4), so
  these servers keep their allocation and nothing is computed for them: the first server ``j0`` whose range contains
  the key is found by one vectorised comparison over all ``m`` servers. The list seen by ``j0`` is rebuilt from the
  final remaining list plus what servers ``j0..m-1`` took (``O(n)``), and SEQ resumes from ``j0``. An event that
  reaches no server only updates the remaining list. Both versions report ``last_changes``: ``N_j^t`` of
  Section III-A (new connection, disconnection or changed amount), at most 4 per server by Theorem 5.5.

Clients are ordered by demand with ties broken by arrival order, in both versions.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Literal

import numpy as np

from ._engine import SweepResult, sweep
from .model import REL_TOL, FloatArray, IntArray, as_instance, changes_between

__all__ = ["OnlineSeq", "OnlineSeqLeft"]


class OnlineSeq:
    """OSEQ: the allocation of SEQ (Algorithm 1, ``extra_degree`` connections of augmentation) kept up to date.

    ``add(client_id, demand)`` and ``remove(client_id)`` are the rounds of Section III-A; ``allocation()`` returns
    ``{client_id: {server: amount}}``; ``last_changes`` maps each server index with at least one change in the last
    event to its number of changes (servers absent had none).
    """

    _left = False

    def __init__(
        self,
        capacities: Sequence[float] | FloatArray,
        degrees: Sequence[int] | IntArray,
        *,
        extra_degree: int = 1,
        method: Literal["incremental", "naive"] = "incremental",
    ) -> None:
        inst = as_instance([], capacities, degrees)
        if int(extra_degree) != extra_degree or extra_degree < 0:
            raise ValueError(f"extra_degree must be a non-negative integer, got {extra_degree!r}")
        if method not in ("incremental", "naive"):
            raise ValueError(f"method must be 'incremental' or 'naive', got {method!r}")
        self.method = method
        self.m = inst.m
        self.capacities = inst.capacities
        self.degrees = inst.degrees
        self.extra_degree = int(extra_degree)
        self._dparam = inst.degrees + (self.extra_degree - 1)
        self._scale = max(float(inst.capacities.sum()), 1.0)
        # client slots
        self._slot: dict[Hashable, int] = {}
        self._name: list[Hashable] = []
        self._demand = np.zeros(0, dtype=np.float64)
        self._rank = np.zeros(0, dtype=np.float64)
        self._alive = np.zeros(0, dtype=bool)
        self._counter = 0
        # state of the last run
        empty_i = np.zeros(0, dtype=np.int64)
        empty_f = np.zeros(0, dtype=np.float64)
        self._ids: list[IntArray] = [empty_i] * self.m
        self._amt: list[FloatArray] = [empty_f] * self.m
        positive = inst.capacities > self._tol
        self._lo_v = np.where(positive, -np.inf, np.inf)
        self._lo_r = np.full(self.m, -1.0)
        self._hi_v = np.where(positive, np.inf, -np.inf)
        self._hi_r = np.full(self.m, -1.0)
        self._left_vals = empty_f
        self._left_ids = empty_i
        self.last_changes: dict[int, int] = {}
        #: servers SEQ was re-run for in the last event (``m`` for the naive version)
        self.last_recomputed = 0

    @property
    def _tol(self) -> float:
        total = float(self._demand[self._alive].sum()) if hasattr(self, "_alive") else 0.0
        return REL_TOL * max(self._scale, total)

    # -- slots -------------------------------------------------------------------------------------------------
    def _new_slot(self, client_id: Hashable, demand: float) -> int:
        s = len(self._name)
        self._slot[client_id] = s
        self._name.append(client_id)
        self._demand = np.append(self._demand, demand)
        self._rank = np.append(self._rank, float(self._counter))
        self._alive = np.append(self._alive, True)
        self._counter += 1
        return s

    def _first_affected(self, v: float, r: float) -> int:
        # A boundary with the same rank is the same client (its stored value may differ by rounding).
        gt = (r != self._lo_r) & ((v > self._lo_v) | ((v == self._lo_v) & (r > self._lo_r)))
        le = (r == self._hi_r) | (v < self._hi_v) | ((v == self._hi_v) & (r < self._hi_r))
        hit = np.flatnonzero(gt & le)
        return int(hit[0]) if hit.size else self.m

    # -- runs --------------------------------------------------------------------------------------------------
    def _resume(self, start: int) -> None:
        """Rebuild the list seen by server ``start`` and run SEQ for servers ``start..m-1``."""
        n_slots = len(self._name)
        tol = self._tol
        if start == 0 or self.method == "naive":
            start = 0
            vals = np.where(self._alive, self._demand, 0.0)
        else:
            # remaining demand before server ``start``: untouched clients keep their exact demand
            ids_before = self._ids[:start]
            if any(a.shape[0] for a in ids_before):
                taken = np.asarray(
                    np.bincount(
                        np.concatenate(ids_before), weights=np.concatenate(self._amt[:start]), minlength=n_slots
                    ),
                    dtype=np.float64,
                )
            else:
                taken = np.zeros(n_slots, dtype=np.float64)
            vals = np.where(taken > 0.0, self._demand - taken, self._demand)
            vals = np.where(self._alive, vals, 0.0)
        idx = np.flatnonzero(vals > tol)
        order = idx[np.lexsort((self._rank[idx], vals[idx]))]
        res = sweep(
            vals[order], order.astype(np.int64), self._rank, self.capacities, self._dparam, start, tol, left=self._left
        )
        self._install(start, res)

    def _install(self, start: int, res: SweepResult) -> None:
        tol = self._tol
        old = {j: self._as_dict(self._ids[j], self._amt[j]) for j in range(start, self.m)}
        new = {j: self._as_dict(res.alloc_ids[j - start], res.alloc_amounts[j - start]) for j in range(start, self.m)}
        self.last_changes = changes_between(old, new, self.m, 10 * tol)
        self._ids[start:] = res.alloc_ids
        self._amt[start:] = res.alloc_amounts
        self._lo_v[start:] = res.lo_v
        self._lo_r[start:] = res.lo_r
        self._hi_v[start:] = res.hi_v
        self._hi_r[start:] = res.hi_r
        self._left_vals = res.left_vals
        self._left_ids = res.left_ids
        self.last_recomputed = self.m - start

    @staticmethod
    def _as_dict(ids: IntArray, amt: FloatArray) -> dict[int, float]:
        return dict(zip(ids.tolist(), amt.tolist()))

    # -- public API --------------------------------------------------------------------------------------------
    def add(self, client_id: Hashable, demand: float) -> None:
        """Round where ``client_id`` joins with ``demand`` (> 0 to matter; 0 is accepted and never served)."""
        if client_id in self._slot:
            raise ValueError(f"client {client_id!r} is already present")
        x = float(demand)
        if not np.isfinite(x) or x < 0:
            raise ValueError(f"demand of client {client_id!r} must be finite and non-negative, got {demand!r}")
        s = self._new_slot(client_id, x)
        if x <= self._tol:
            self.last_changes = {}
            self.last_recomputed = 0
            return
        if self.method == "naive":
            self._resume(0)
            return
        j0 = self._first_affected(x, float(self._rank[s]))
        if j0 == self.m:
            pos = int(np.searchsorted(self._left_vals, x, side="left"))
            while pos < self._left_vals.shape[0] and self._left_vals[pos] == x:
                pos += 1  # equal demands: the newcomer has the largest rank
            self._left_vals = np.insert(self._left_vals, pos, x)
            self._left_ids = np.insert(self._left_ids, pos, s)
            self.last_changes = {}
            self.last_recomputed = 0
            return
        self._resume(j0)

    def extend(self, clients: Iterable[tuple[Hashable, float]]) -> None:
        """Add many clients as one round (one SEQ run over all servers); used to load a starting instance."""
        items = list(clients)
        seen: set[Hashable] = set()
        for c, x in items:
            if c in self._slot or c in seen:
                raise ValueError(f"client {c!r} is already present")
            if not np.isfinite(float(x)) or float(x) < 0:
                raise ValueError(f"demand of client {c!r} must be finite and non-negative, got {x!r}")
            seen.add(c)
        start = len(self._name)
        k = len(items)
        self._name.extend(c for c, _ in items)
        for t, (c, _) in enumerate(items):
            self._slot[c] = start + t
        self._demand = np.concatenate((self._demand, np.array([float(x) for _, x in items], dtype=np.float64)))
        self._rank = np.concatenate((self._rank, self._counter + np.arange(k, dtype=np.float64)))
        self._alive = np.concatenate((self._alive, np.ones(k, dtype=bool)))
        self._counter += k
        self._resume(0)

    def remove(self, client_id: Hashable) -> None:
        """Round where ``client_id`` leaves."""
        if client_id not in self._slot:
            raise ValueError(f"client {client_id!r} is not present")
        s = self._slot.pop(client_id)
        self._alive[s] = False
        x = float(self._demand[s])
        if x <= self._tol:
            self.last_changes = {}
            self.last_recomputed = 0
            return
        if self.method == "naive":
            self._resume(0)
            return
        j0 = self._first_affected(x, float(self._rank[s]))
        if j0 == self.m:
            keep = self._left_ids != s
            self._left_vals = self._left_vals[keep]
            self._left_ids = self._left_ids[keep]
            self.last_changes = {}
            self.last_recomputed = 0
            return
        self._resume(j0)

    def allocation(self) -> dict[Hashable, dict[int, float]]:
        """``{client_id: {server: amount}}`` for every client with at least one connection."""
        out: dict[Hashable, dict[int, float]] = {}
        for j in range(self.m):
            for s, a in zip(self._ids[j].tolist(), self._amt[j].tolist()):
                out.setdefault(self._name[s], {})[j] = a
        return out

    def allocation_matrix(self, clients: Sequence[Hashable]) -> FloatArray:
        """``w[i, j]`` for the given client ids (rows in that order)."""
        row = {c: i for i, c in enumerate(clients)}
        w = np.zeros((len(clients), self.m), dtype=np.float64)
        for j in range(self.m):
            for s, a in zip(self._ids[j].tolist(), self._amt[j].tolist()):
                w[row[self._name[s]], j] += a
        return w

    def clients(self) -> list[Hashable]:
        return list(self._slot)

    def throughput(self) -> float:
        return float(sum(float(a.sum()) for a in self._amt))


class OnlineSeqLeft(OnlineSeq):
    """SEQLEFT recomputed at every round (Section VI-C): the leftmost suitable interval; no bound on changes."""

    _left = True

    def __init__(
        self,
        capacities: Sequence[float] | FloatArray,
        degrees: Sequence[int] | IntArray,
        *,
        extra_degree: int = 1,
    ) -> None:
        super().__init__(capacities, degrees, extra_degree=extra_degree, method="naive")
