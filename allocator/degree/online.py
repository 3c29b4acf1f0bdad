"""OSEQ (paper 003, Section V): SEQ maintained under client arrivals and departures.

Two implementations that must give the same allocation after every event:

* ``method="naive"`` is Algorithm 2: SEQ recomputed from scratch on the sorted current clients at every round.
* ``method="incremental"`` re-uses the previous round (Section V-C). Every server step of the last run recorded the
  range of list keys ``(value, id)`` whose insertion or removal can change that step (its interval and the neighbour
  on its left, see :mod:`allocator.degree._engine`). The event's client passes unchanged through every server whose
  range does not contain its key (the "change outside ``[l, l + d]``" case of Lemma 5.4), so these servers keep
  their allocation and nothing is computed for them. The first server ``j0`` whose range contains the key is found
  by one scan of the ranges; the list that server sees is rebuilt from the sorted present clients and the
  remainders recorded by the servers before ``j0`` (a merge, ``O(n)``), and SEQ resumes from ``j0`` on. By
  Lemma 5.4 the resumed run stays an augmented version of the old one until a server absorbs the difference, which
  on the Section VI instances (sum of demands = sum of capacities) happens near the end of the server order: the
  work is ``Theta(m)`` as the paper says, most resumed servers really change, and the resumed sweep is a compiled
  kernel (:func:`allocator.degree.numba_kernels.sweep_kernel`). An event that reaches no server changes nothing.

Both versions report ``last_changes``: ``N_j^t`` of Section III-A (new connection, disconnection or changed amount),
at most 4 per server by Theorem 5.5 where its proof applies (Lemma 5.4 takes an interval ``[l, l + d]`` with
``LC(l + 1, l + d) >= b``; at the right end of a server's list that can fail and an event can cost more, see
``tests/test_degree_online.py::test_theorem_5_5_right_end_of_the_list``), and ``last_recomputed``, the number of
servers re-decided (``m - j0``).

Clients are ordered by demand with ties broken by arrival order, in both versions; a split client's remainder goes
after the clients of equal value (see :mod:`allocator.degree._engine`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Literal

import numpy as np

from . import kernels
from ._engine import Records, rebuild_list
from .model import REL_TOL, FloatArray, IntArray, as_instance

__all__ = ["OnlineSeq", "OnlineSeqLeft"]


class OnlineSeq:
    """OSEQ: the allocation of SEQ (Algorithm 1, ``extra_degree`` connections of augmentation) kept up to date.

    ``add(client_id, demand)`` and ``remove(client_id)`` are the rounds of Section III-A; ``allocation()`` returns
    ``{client_id: {server: amount}}``; ``last_changes`` maps each server index with at least one change in the last
    event to its number of changes (servers absent had none); ``last_recomputed`` is the number of servers the last
    event re-ran Algorithm 1 for (``m`` for the naive version, 0 when the event reached no server).
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
        self._total = 0.0  # sum of the present demands
        # client slots (the slot number is the arrival rank that breaks ties)
        self._slot: dict[Hashable, int] = {}
        self._name: list[Hashable] = []
        self._demand = np.zeros(16, dtype=np.float64)
        self._alive = np.zeros(16, dtype=bool)
        self._listed = np.zeros(16, dtype=bool)  # in the sorted list (demand above the tolerance on arrival)
        self._mark = np.zeros(16, dtype=np.int8)  # kernel scratch, zero between calls
        self._scratch = np.zeros(16, dtype=np.float64)
        # present clients sorted by (demand, slot): the first ``_n_g`` entries of these buffers
        self._g_val = np.zeros(16, dtype=np.float64)
        self._g_id = np.zeros(16, dtype=np.int64)
        self._n_g = 0
        # list buffers of the kernel
        self._V = np.zeros(16, dtype=np.float64)
        self._I = np.zeros(16, dtype=np.int64)
        self._P = np.zeros(17, dtype=np.float64)
        # state of the last run
        self._rec = Records.empty(inst.capacities, self._dparam, self._tol)
        self._changes: dict[int, int] | None = {}
        #: servers SEQ was re-run for in the last event (``m`` for the naive version)
        self.last_recomputed = 0

    @property
    def _tol(self) -> float:
        return REL_TOL * max(self._scale, self._total)

    @property
    def last_changes(self) -> dict[int, int]:
        """``N_j^t`` of the last event for every server with at least one change (Section III-A)."""
        if self._changes is None:
            ch = self._rec.changes
            hit = np.flatnonzero(ch)
            self._changes = dict(zip(hit.tolist(), ch[hit].tolist()))
        return self._changes

    # -- slots -------------------------------------------------------------------------------------------------
    def _reserve(self, slots: int, listed: int) -> None:
        """Grow the per-client arrays to ``slots`` entries and the list buffers to ``listed`` clients."""
        if slots > self._demand.shape[0]:
            size = max(slots, 2 * self._demand.shape[0])
            for name, dtype in (("_demand", np.float64), ("_alive", bool), ("_listed", bool), ("_scratch", np.float64)):
                old = getattr(self, name)
                new = np.zeros(size, dtype=dtype)
                new[: old.shape[0]] = old
                setattr(self, name, new)
            self._mark = np.zeros(size, dtype=np.int8)
        if listed > self._V.shape[0]:
            size = max(listed, 2 * self._V.shape[0])
            self._V = np.zeros(size, dtype=np.float64)
            self._I = np.zeros(size, dtype=np.int64)
            self._P = np.zeros(size + 1, dtype=np.float64)
            g_val, g_id = self._g_val, self._g_id
            self._g_val = np.zeros(size, dtype=np.float64)
            self._g_id = np.zeros(size, dtype=np.int64)
            self._g_val[: self._n_g] = g_val[: self._n_g]
            self._g_id[: self._n_g] = g_id[: self._n_g]

    def _check_demand(self, client_id: Hashable, demand: float) -> float:
        x = float(demand)
        if not np.isfinite(x) or x < 0:
            raise ValueError(f"demand of client {client_id!r} must be finite and non-negative, got {demand!r}")
        return x

    # -- runs --------------------------------------------------------------------------------------------------
    def _run(self, key: tuple[float, int] | None) -> None:
        """Re-run Algorithm 1 from the first server the changed client ``key = (demand, slot)`` affects (from
        server 0 for the naive version or ``key=None``), counting ``N_j`` against the previous allocation."""
        rec = self._rec
        self._changes = None
        if key is None or self.method == "naive":
            j0 = 0
        else:
            j0 = kernels.load().first_affected(key[0], key[1], rec.lo_v, rec.lo_r, rec.hi_v, rec.hi_r)
        rec.changes[:j0] = 0
        self.last_recomputed = self.m - j0
        if j0 == self.m:
            return
        tol = self._tol
        n = self._n_g
        e = rebuild_list(
            j0, self._g_val[:n], self._g_id[:n], self._alive, rec, tol, self._V, self._I, self._P, self._mark
        )
        kernels.load().sweep_kernel(
            self._V, self._I, self._P, 0, e, self.capacities, self._dparam, j0, tol, 10 * tol, self._left,
            rec.off, rec.cnt, rec.a_ids, rec.a_amt, rec.lo_v, rec.lo_r, rec.hi_v, rec.hi_r, rec.sp_id, rec.sp_rem,
            rec.changes, self._mark, self._scratch,
        )  # fmt: skip

    def _no_change(self) -> None:
        self._rec.changes[:] = 0
        self._changes = {}
        self.last_recomputed = 0

    # -- public API --------------------------------------------------------------------------------------------
    def add(self, client_id: Hashable, demand: float) -> None:
        """Round where ``client_id`` joins with ``demand`` (> 0 to matter; 0 is accepted and never served)."""
        if client_id in self._slot:
            raise ValueError(f"client {client_id!r} is already present")
        x = self._check_demand(client_id, demand)
        s = len(self._name)
        self._reserve(s + 1, self._n_g + 1)
        self._slot[client_id] = s
        self._name.append(client_id)
        self._demand[s] = x
        self._alive[s] = True
        self._total += x
        if x <= self._tol:
            self._no_change()
            return
        self._listed[s] = True
        kernels.load().list_insert(self._g_val, self._g_id, self._n_g, x, s)
        self._n_g += 1
        self._run((x, s))

    def extend(self, clients: Iterable[tuple[Hashable, float]]) -> None:
        """Add many clients as one round (one SEQ run over all servers); used to load a starting instance."""
        items = list(clients)
        seen: set[Hashable] = set()
        xs = []
        for c, x in items:
            if c in self._slot or c in seen:
                raise ValueError(f"client {c!r} is already present")
            xs.append(self._check_demand(c, x))
            seen.add(c)
        start = len(self._name)
        k = len(items)
        self._reserve(start + k, self._n_g + k)
        self._name.extend(c for c, _ in items)
        for t, (c, _) in enumerate(items):
            self._slot[c] = start + t
        vals = np.asarray(xs, dtype=np.float64)
        self._demand[start : start + k] = vals
        self._alive[start : start + k] = True
        self._total += float(vals.sum())
        keep = vals > self._tol
        self._listed[start : start + k] = keep
        g_val = np.concatenate((self._g_val[: self._n_g], vals[keep]))
        g_id = np.concatenate((self._g_id[: self._n_g], start + np.flatnonzero(keep)))
        order = np.lexsort((g_id, g_val))
        self._n_g = int(order.shape[0])
        self._g_val[: self._n_g] = g_val[order]
        self._g_id[: self._n_g] = g_id[order]
        self._run(None)

    def remove(self, client_id: Hashable) -> None:
        """Round where ``client_id`` leaves."""
        if client_id not in self._slot:
            raise ValueError(f"client {client_id!r} is not present")
        s = self._slot.pop(client_id)
        self._alive[s] = False
        x = float(self._demand[s])
        self._total = max(self._total - x, 0.0)
        if not self._listed[s]:
            self._no_change()
            return
        self._listed[s] = False
        kernels.load().list_delete(self._g_val, self._g_id, self._n_g, x, s)
        self._n_g -= 1
        self._run((x, s))

    def _connections(self) -> tuple[IntArray, IntArray, FloatArray]:
        return self._rec.connections()

    def allocation(self) -> dict[Hashable, dict[int, float]]:
        """``{client_id: {server: amount}}`` for every client with at least one connection."""
        out: dict[Hashable, dict[int, float]] = {}
        ids, servers, amounts = self._connections()
        for s, j, a in zip(ids.tolist(), servers.tolist(), amounts.tolist()):
            out.setdefault(self._name[s], {})[j] = a
        return out

    def allocation_matrix(self, clients: Sequence[Hashable]) -> FloatArray:
        """``w[i, j]`` for the given client ids (rows in that order)."""
        row = np.full(len(self._name), -1, dtype=np.int64)
        for i, c in enumerate(clients):
            row[self._slot[c]] = i
        ids, servers, amounts = self._connections()
        w = np.zeros((len(clients), self.m), dtype=np.float64)
        if ids.shape[0] and int(row[ids].min()) < 0:
            raise ValueError("clients must include every connected client")
        np.add.at(w, (row[ids], servers), amounts)
        return w

    def clients(self) -> list[Hashable]:
        return list(self._slot)

    def throughput(self) -> float:
        return float(self._connections()[2].sum())


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
