"""The SEQ sweep of Algorithm 1 (paper 003, Section IV-A) as compiled kernels on flat numpy arrays.

The remaining clients form one list sorted by value, held in the slice ``V[s:e]`` / ``I[s:e]`` of a buffer, with
absolute prefix sums ``P`` (``P[i + 1] - P[i] = V[i]``) so that every window sum ``LC(l, l + k - 1) = P[l + k] -
P[l]`` is O(1) and the window Algorithm 1 needs is found by binary search (window sums of a sorted list are monotone
in ``l``). Nothing is reallocated per server: case 2 moves ``s`` past the served prefix, case 3 moves ``e`` before
the served suffix, and case 1 closes the gap of the ``d`` fully served clients by moving the shorter side of the list
(with its prefix sums shifted by ``b``), the split client's remainder keeping its place (ordering property, Section
IV-A).

Ties in value are ordered as follows, which is total and reproducible: clients not yet served by arrival rank (their
id), and after them the remainders by the server that left them. The starting list is sorted by ``(value, id)``; a
case-1 remainder keeping its place lies after every client of equal value (it is at least its left neighbour and
strictly below its right one), and a remainder re-inserted at its sorted place (SEQLEFT, or the right end of the
list) is put after the clients of equal value too; a case-2 remainder is strictly the smallest value.

Both variants of Section VI-C are here: ``left=False`` is SEQ (rightmost suitable interval) and ``left=True`` is
SEQLEFT (leftmost suitable interval, the remainder re-inserted at its sorted place).

The kernels are in :mod:`allocator.degree.numba_kernels` and are loaded through the route table of
:mod:`allocator.degree.kernels` (compiled ahead of time when the extension module is built, else by numba just in
time with an on-disk cache); this module holds their Python side. Everything they touch is a preallocated array:

* allocation slots: server ``j`` owns ``a_ids[off[j] : off[j] + dparam[j] + 1]`` (Algorithm 1 with degree ``d``
  serves at most ``d + 1`` clients) of which the first ``cnt[j]`` are in use, with the amounts in ``a_amt``;
* per server, for the incremental OSEQ (Section V-C): the inclusive range ``[lo, hi]`` of the list (values and ids
  of its two boundary clients) in which the insertion or removal of a client can change the server's step (outside
  it the step is unchanged, the "change outside ``[l, l + d]``" case of Lemma 5.4), and the client whose remainder
  the step left in the list with that remainder's value (``sp_id = -1`` when none), from which the list seen by any
  server can be rebuilt;
* per server, ``changes[j] = N_j^t`` (Section III-A): the clients whose amount on ``j`` differs by more than
  ``ctol`` between the allocation the slot held before the sweep and the new one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from . import kernels

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
Int8Array = NDArray[np.int8]

_INF = np.inf


@dataclass
class Records:
    """Per-server state of the last sweep (arrays of length ``m``, except ``off`` (``m + 1``) and the slots)."""

    off: IntArray  # first slot of each server (length m + 1)
    cnt: IntArray  # slots in use
    a_ids: IntArray  # client ids served, slot by slot
    a_amt: FloatArray  # amounts w_i^j
    lo_v: FloatArray  # affect range lower key (inclusive): value part
    lo_r: IntArray  # ... id part (-1 with an infinite value)
    hi_v: FloatArray  # affect range upper key (inclusive): value part
    hi_r: IntArray
    sp_id: IntArray  # client whose remainder the step left in the list (-1: none)
    sp_rem: FloatArray  # that remainder
    changes: IntArray  # N_j of the last sweep

    @classmethod
    def empty(cls, capacities: FloatArray, dparam: IntArray, tol: float) -> Records:
        m = int(capacities.shape[0])
        off = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(dparam + 1, out=off[1:])
        total = int(off[-1])
        positive = capacities > tol
        return cls(
            off=off,
            cnt=np.zeros(m, dtype=np.int64),
            a_ids=np.zeros(total, dtype=np.int64),
            a_amt=np.zeros(total, dtype=np.float64),
            lo_v=np.where(positive, -_INF, _INF),
            lo_r=np.full(m, -1, dtype=np.int64),
            hi_v=np.where(positive, _INF, -_INF),
            hi_r=np.full(m, -1, dtype=np.int64),
            sp_id=np.full(m, -1, dtype=np.int64),
            sp_rem=np.zeros(m, dtype=np.float64),
            changes=np.zeros(m, dtype=np.int64),
        )

    def in_use(self) -> tuple[IntArray, NDArray[np.bool_]]:
        """The server of every slot, and which slots hold a connection."""
        size = np.diff(self.off)
        server = np.repeat(np.arange(size.shape[0], dtype=np.int64), size)
        pos = np.arange(self.a_ids.shape[0], dtype=np.int64) - self.off[server]
        return server, pos < self.cnt[server]

    def connections(self) -> tuple[IntArray, IntArray, FloatArray]:
        """Every connection as ``(client id, server, amount)``, servers in order."""
        server, used = self.in_use()
        return self.a_ids[used], server[used], self.a_amt[used]

    def served(self, j: int) -> tuple[IntArray, FloatArray]:
        """Client ids and amounts of server ``j``, in list order."""
        o, k = int(self.off[j]), int(self.cnt[j])
        return self.a_ids[o : o + k], self.a_amt[o : o + k]


def rebuild_list(
    j0: int,
    g_val: FloatArray,
    g_id: IntArray,
    alive: NDArray[np.bool_],
    rec: Records,
    tol: float,
    V: FloatArray,
    I: IntArray,
    P: FloatArray,
    mark: Int8Array,
) -> int:
    """The list seen by server ``j0`` in the last sweep, with the current clients, into ``V[0:e]``, ``I``, ``P``.

    ``(g_val, g_id)`` are the present clients sorted by ``(demand, id)``. A client untouched by servers ``< j0`` is
    in the list with its demand; one that a server ``< j0`` served is there with the remainder the last such server
    left (``sp_rem``), or not at all. The order is the sweep's: by value, then untouched clients by id, then
    remainders by the server that left them. Values at most ``tol`` are left out. Returns ``e``. ``mark`` (zeros,
    one per client id) is scratch. ``O(n)`` plus a sort of the remainders.
    """
    k = kernels.load()
    touched, rid, rval = k.touched_before(j0, alive, rec.off, rec.cnt, rec.a_ids, rec.sp_id, rec.sp_rem, tol, mark)
    order = np.argsort(rval, kind="stable")  # by value, then by the server that left the remainder
    return int(k.merge_list(g_val, g_id, rid[order], rval[order], touched, tol, V, I, P, mark))


def run_sweep(
    vals: FloatArray, ids: IntArray, caps: FloatArray, dparam: IntArray, tol: float, *, left: bool = False
) -> tuple[Records, FloatArray, IntArray]:
    """Run Algorithm 1 for every server on the list ``(vals, ids)`` (positive, sorted by ``(value, id)``).

    ``dparam[j]`` is the degree ``d`` handed to Algorithm 1 for server ``j``. Returns the per-server records of the
    kernel and the clients left after the last server (values, ids; sorted).
    """
    caps = np.ascontiguousarray(caps, dtype=np.float64)
    dparam = np.ascontiguousarray(dparam, dtype=np.int64)
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    rec = Records.empty(caps, dparam, tol)
    V = np.array(vals, dtype=np.float64)
    I = ids.copy()
    P = np.zeros(V.shape[0] + 1, dtype=np.float64)
    np.cumsum(V, out=P[1:])
    n_ids = int(ids.max()) + 1 if ids.shape[0] else 0
    mark = np.zeros(n_ids, dtype=np.int8)
    mark_amt = np.zeros(n_ids, dtype=np.float64)
    s, e = kernels.load().sweep_kernel(
        V, I, P, 0, V.shape[0], caps, dparam, 0, tol, tol, left, rec.off, rec.cnt, rec.a_ids, rec.a_amt,
        rec.lo_v, rec.lo_r, rec.hi_v, rec.hi_r, rec.sp_id, rec.sp_rem, rec.changes, mark, mark_amt,
    )  # fmt: skip
    return rec, V[s:e].copy(), I[s:e].copy()
