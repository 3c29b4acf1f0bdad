"""OSEQ (paper 003, Section V): SEQ maintained under client arrivals and departures.

Two implementations that must give the same allocation after every event:

* ``method="naive"`` is Algorithm 2: SEQ recomputed from scratch on the sorted current clients at every round.
* ``method="incremental"`` re-uses the previous round (Section V-C). Every server step of the last run recorded the
  range of list keys ``(value, rank)`` whose insertion or removal can change that step (its interval and the
  neighbour on its left, see :mod:`allocator.degree._engine`). The event's client passes unchanged through every
  server whose range does not contain its key (the "change outside ``[l, l + d]``" case of Lemma 5.4), so these
  servers keep their allocation and nothing is computed for them: the first server ``j0`` whose range contains the
  key is found by one vectorised comparison over all ``m`` servers. From ``j0`` on, the difference between the old
  and the new input list is carried from server to server: an affected server in case 1 is re-decided on a recorded
  segment of its list (Lemma 5.4: the new interval starts at ``l`` or next to it) for at most ``local_budget``
  servers, and otherwise SEQ resumes from that server on the list rebuilt from the remaining clients and what the
  later servers took (``O(n)``). An event that reaches no server only updates the remaining list.
  ``local_budget=0`` (default) resumes at ``j0`` directly; in CPython it is the faster choice on the Section VI
  instances, because the difference reaches a large share of the servers (the paper's ``Theta(m)``) and a local
  re-decision costs about as much interpreter time as a resumed SEQ step (see ``docs/bench/degree.md``).

Both versions report ``last_changes``: ``N_j^t`` of Section III-A (new connection, disconnection or changed amount),
at most 4 per server by Theorem 5.5, and ``last_recomputed``, the number of servers re-decided.

Clients are ordered by demand with ties broken by arrival order, in both versions.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Literal

import numpy as np

from ._engine import MARGIN, Segment, SweepResult, sweep
from .model import REL_TOL, FloatArray, IntArray, as_instance

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
        local_budget: int = 0,
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
        self._seg: list[Segment | None] = [None] * self.m
        self.last_changes: dict[int, int] = {}
        #: most servers re-decided locally per event before SEQ simply resumes (both give the same allocation)
        self.local_budget = local_budget
        #: servers re-decided on their recorded segment (Lemma 5.4) in the last event
        self.last_local = 0
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

    def _next_affected(self, delta: dict[int, tuple[float, float]], start: int) -> int:
        """First server ``>= start`` whose recorded key range ``[lo, hi]`` meets the key of a changed client.

        A changed client spans the keys from its old to its new value (both when it is in both lists); a boundary
        with the same rank is the same client (its stored value may differ by rounding), which counts as a hit.
        """
        lo_v, lo_r = self._lo_v[start:], self._lo_r[start:]
        hi_v, hi_r = self._hi_v[start:], self._hi_r[start:]
        hit = np.zeros(self.m - start, dtype=bool)
        for c, (old, new) in delta.items():
            r = float(self._rank[c])
            present = [v for v in (old, new) if v > 0.0]
            if not present:
                continue
            vmin, vmax = min(present), max(present)
            below_hi = (vmin < hi_v) | ((vmin == hi_v) & (r <= hi_r))
            above_lo = (vmax > lo_v) | ((vmax == lo_v) & (r >= lo_r))
            hit |= (below_hi & above_lo) | (r == lo_r) | (r == hi_r)
        idx = np.flatnonzero(hit)
        return start + int(idx[0]) if idx.size else self.m

    # -- runs --------------------------------------------------------------------------------------------------
    def _resume(self, start: int, changes: dict[int, int] | None = None) -> None:
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
        # slots are numbered in arrival order, so ``idx`` is already sorted by rank: a stable sort by value gives
        # the (value, rank) order
        order = idx[np.argsort(vals[idx], kind="stable")]
        res = sweep(
            vals[order],
            order.astype(np.int64),
            self._rank,
            self.capacities,
            self._dparam,
            start,
            tol,
            left=self._left,
            segments=self.local_budget > 0,
        )
        self._install(start, res, changes)

    def _install(self, start: int, res: SweepResult, changes: dict[int, int] | None = None) -> None:
        tol = self._tol
        self.last_changes = dict(changes or {})
        self.last_changes.update(self._diff(start, res.alloc_ids, res.alloc_amounts, 10 * tol))
        self._seg[start:] = res.seg
        self._ids[start:] = res.alloc_ids
        self._amt[start:] = res.alloc_amounts
        self._lo_v[start:] = res.lo_v
        self._lo_r[start:] = res.lo_r
        self._hi_v[start:] = res.hi_v
        self._hi_r[start:] = res.hi_r
        self._left_vals = res.left_vals
        self._left_ids = res.left_ids
        self.last_recomputed = self.m - start

    def _propagate(self, delta: dict[int, tuple[float, float]]) -> None:
        """Section V-C: carry the difference between the old and the new input list from server to server.

        ``delta`` maps a client slot to its (old, new) value in the list a server sees (0 = absent). Servers whose
        key range misses every changed client keep their step and pass the difference on unchanged (Lemma 5.4,
        change outside the interval). An affected server in case 1 is re-decided on its recorded segment of the list
        with the difference applied (:meth:`_local_step`), which yields the next difference (an augmented list again,
        Lemma 5.4); any other affected server (cases 2, 3, short list, right end of the list, or a segment too short
        to certify the rightmost interval) makes SEQ resume from it on the rebuilt list.
        """
        tol = self._tol
        changes: dict[int, int] = {}
        j = 0
        touched = 0
        while delta:
            j = self._next_affected(delta, j)
            if j == self.m:
                break
            nxt = self._local_step(j, delta, tol, changes) if touched < self.local_budget else None
            if nxt is None:
                self._resume(j, changes)
                self.last_recomputed = touched + (self.m - j)
                self.last_local = touched
                return
            delta = nxt
            touched += 1
            j += 1
        for c, (old, new) in delta.items():
            if old > 0.0:
                keep = self._left_ids != c
                self._left_vals = self._left_vals[keep]
                self._left_ids = self._left_ids[keep]
            if new > tol:
                rk = float(self._rank[c])
                pos = int(np.searchsorted(self._left_vals, new, side="left"))
                while (
                    pos < self._left_vals.shape[0]
                    and self._left_vals[pos] == new
                    and self._rank[self._left_ids[pos]] < rk
                ):
                    pos += 1
                self._left_vals = np.insert(self._left_vals, pos, new)
                self._left_ids = np.insert(self._left_ids, pos, c)
        self.last_changes = changes
        self.last_recomputed = touched
        self.last_local = touched

    def _local_step(
        self, j: int, delta: dict[int, tuple[float, float]], tol: float, changes: dict[int, int]
    ) -> dict[int, tuple[float, float]] | None:
        """Re-run server ``j``'s step of Algorithm 1 on its recorded segment with ``delta`` applied.

        The segment is a contiguous piece of the server's input list; if it holds a start ``s`` with
        ``LC(s, s+d-1) < b <= LC(s+1, s+d)`` and one more client after the interval, ``s`` is the rightmost
        suitable interval of the whole list (window sums are monotone) and away from its right end, so the step is
        exactly SEQ's case 1. Returns the difference for the next server, or ``None`` when this cannot be certified.
        """
        seg = self._seg[j]
        if seg is None:
            return None
        seg_ids, seg_vals, at_start, at_end = seg
        b = float(self.capacities[j])
        D = int(self._dparam[j])
        lo_v, lo_r, hi_v, hi_r = self._lo_v[j], self._lo_r[j], self._hi_v[j], self._hi_r[j]
        before: dict[int, float] = dict(zip(seg_ids.tolist(), seg_vals.tolist()))  # LC^j on the segment
        local: dict[int, float] = dict(before)
        for c, (_old, new) in delta.items():
            local.pop(c, None)
            if new > 0.0:
                r = float(self._rank[c])
                if ((new > lo_v) or (new == lo_v and r >= lo_r)) and ((new < hi_v) or (new == hi_v and r <= hi_r)):
                    local[c] = new
        ids = np.fromiter(local.keys(), dtype=np.int64, count=len(local))
        vals = np.fromiter(local.values(), dtype=np.float64, count=len(local))
        order = np.lexsort((self._rank[ids], vals))
        ids, vals = ids[order], vals[order]
        L = vals.shape[0]
        if D < 1 or L < D + 2:
            return None
        P = np.empty(L + 1)
        P[0] = 0.0
        np.cumsum(vals, out=P[1:])
        W = P[D:] - P[:-D]  # W[s] = LC(s, s + d - 1), s = 0 .. L - D
        cand = np.flatnonzero((W[:-1] < b) & (W[1:] >= b))
        if cand.size == 0:
            return None
        l = int(cand[-1])
        if l + D + 1 > L - 1 or (l == 0 and not at_start):
            return None
        inner = float(P[l + D] - P[l])
        rem = float(P[l + D + 1] - P[l] - b)
        a_ids = ids[l : l + D + 1].copy()
        a_amt = vals[l : l + D + 1].copy()
        if rem <= tol:
            rem = 0.0
        else:
            a_amt[D] = b - inner
            if a_amt[D] <= tol:
                a_amt = a_amt[:D]
                a_ids = a_ids[:D]
        old_alloc = self._as_dict(self._ids[j], self._amt[j])
        new_alloc = self._as_dict(a_ids, a_amt)
        n_changes = sum(
            1
            for c in old_alloc.keys() | new_alloc.keys()
            if abs(old_alloc.get(c, 0.0) - new_alloc.get(c, 0.0)) > 10 * tol
        )
        if n_changes:
            changes[j] = n_changes
        # the next difference: LC^{j+1} = LC^j - old allocation, R^{j+1} = R^j - new allocation
        nxt: dict[int, tuple[float, float]] = {}
        for c in delta.keys() | old_alloc.keys() | new_alloc.keys():
            if c in delta:
                o, n = delta[c]
            else:
                o = before.get(c, 0.0)
                n = local.get(c, o)
            o -= old_alloc.get(c, 0.0)
            n -= new_alloc.get(c, 0.0)
            o = o if o > tol else 0.0
            n = n if n > tol else 0.0
            if abs(o - n) > tol:
                nxt[c] = (o, n)
        # record the new step: allocation, segment of R^j around the interval, key range
        self._ids[j] = a_ids
        self._amt[j] = a_amt
        s0 = max(0, l - MARGIN)
        s1 = min(L, l + D + 2 + MARGIN)
        new_start = at_start and s0 == 0
        new_end = at_end and s1 == L
        self._seg[j] = (ids[s0:s1].copy(), vals[s0:s1].copy(), new_start, new_end)
        if new_start:
            self._lo_v[j], self._lo_r[j] = -np.inf, -1.0
        else:
            self._lo_v[j], self._lo_r[j] = float(vals[s0]), float(self._rank[ids[s0]])
        if new_end:
            self._hi_v[j], self._hi_r[j] = np.inf, -1.0
        else:
            self._hi_v[j], self._hi_r[j] = float(vals[s1 - 1]), float(self._rank[ids[s1 - 1]])
        return nxt

    def _diff(self, start: int, ids: list[IntArray], amt: list[FloatArray], tol: float) -> dict[int, int]:
        """``N_j`` for servers ``start..m-1`` between the stored allocation and ``(ids, amt)``, vectorised."""
        k = self.m - start
        sizes_o = [a.shape[0] for a in self._ids[start:]]
        sizes_n = [a.shape[0] for a in ids]
        if not sum(sizes_o) and not sum(sizes_n):
            return {}
        cols = np.concatenate(
            (np.repeat(np.arange(k, dtype=np.int64), sizes_o), np.repeat(np.arange(k, dtype=np.int64), sizes_n))
        )
        who = np.concatenate((*self._ids[start:], *ids, np.zeros(0, dtype=np.int64))).astype(np.int64)
        val = np.concatenate((*self._amt[start:], *amt, np.zeros(0)))
        val[sum(sizes_o) :] *= -1.0
        keys = cols * (len(self._name) + 1) + who
        uniq, inv = np.unique(keys, return_inverse=True)
        net = np.bincount(inv, weights=val, minlength=uniq.shape[0])
        changed = uniq[np.abs(net) > tol] // (len(self._name) + 1)
        counts = np.bincount(changed, minlength=k)
        hit = np.flatnonzero(counts)
        return {start + int(t): int(counts[t]) for t in hit}

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
        self._propagate({s: (0.0, x)})

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
        self._propagate({s: (x, 0.0)})

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
