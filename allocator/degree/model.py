"""The MTBD model of paper 003 (Beaumont, Eyraud-Dubois, Rejeb, Thraves), Section I and III-A.

Servers ``S_j`` have a capacity ``b_j`` and a degree ``d_j`` (the most clients they may serve at once); clients
``C_i`` have a demand ``w_i``. An allocation is a non-negative matrix ``w[i, j]`` (written ``w_i^j`` in the paper)
and it is *valid* when

* (1) ``sum_i w[i, j] <= b_j`` for every server (capacity constraint),
* (2) ``card{i : w[i, j] > 0} <= d_j`` for every server (degree constraint),
* (3) ``sum_j w[i, j] <= w_i`` for every client (demand constraint).

MTBD (Maximize-Throughput-Bounded-Degree) maximises ``sum_ij w[i, j]`` under (1)-(3); it is strongly NP-complete
(Lemma 4.1), which is why SEQ works with one extra connection per server (resource augmentation, Theorem 4.4).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

__all__ = [
    "Instance",
    "ValidationReport",
    "as_instance",
    "changes_between",
    "connections",
    "throughput",
    "upper_bound",
    "validate_allocation",
]

#: Allocations smaller than this fraction of the instance's scale are treated as zero (floating-point dust left by
#: repeated subtraction); such amounts never create a connection.
REL_TOL = 1e-12


@dataclass(frozen=True)
class Instance:
    """A validated MTBD instance: demands ``w`` (n,), capacities ``b`` (m,), degrees ``d`` (m,) (integers >= 1)."""

    demands: FloatArray
    capacities: FloatArray
    degrees: IntArray

    @property
    def n(self) -> int:
        return int(self.demands.shape[0])

    @property
    def m(self) -> int:
        return int(self.capacities.shape[0])

    @property
    def scale(self) -> float:
        """A magnitude used for the zero tolerance: the largest of the total demand, total capacity and 1."""
        return float(max(self.demands.sum(initial=0.0), self.capacities.sum(initial=0.0), 1.0))

    @property
    def tol(self) -> float:
        return REL_TOL * self.scale


def _as_float_vector(values: Sequence[float] | FloatArray, name: str) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence, got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(f"{name}[{int(bad[0])}] = {arr[bad[0]]!r} is not finite")
    neg = np.flatnonzero(arr < 0)
    if neg.size:
        raise ValueError(f"{name}[{int(neg[0])}] = {arr[neg[0]]!r} is negative")
    return np.ascontiguousarray(arr)  # the compiled kernels take C-contiguous arrays


def as_instance(
    demands: Sequence[float] | FloatArray,
    capacities: Sequence[float] | FloatArray,
    degrees: Sequence[int] | IntArray,
    *,
    min_degree: int = 1,
) -> Instance:
    """Check and convert the three inputs of MTBD.

    Raises ``ValueError`` naming the offending index for a negative or non-finite demand or capacity, a non-integer
    degree, a degree below ``min_degree`` (1 for the paper's model), or mismatched lengths of capacities and degrees.
    """
    w = _as_float_vector(demands, "demands")
    b = _as_float_vector(capacities, "capacities")
    d_raw = np.asarray(degrees)
    if d_raw.ndim != 1:
        raise ValueError(f"degrees must be a 1-D sequence, got shape {d_raw.shape}")
    if d_raw.shape[0] != b.shape[0]:
        raise ValueError(f"capacities has {b.shape[0]} servers but degrees has {d_raw.shape[0]}")
    d_float = d_raw.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(d_float) | (d_float != np.round(d_float)))
    if bad.size:
        raise ValueError(f"degrees[{int(bad[0])}] = {d_raw[bad[0]]!r} is not an integer")
    d = d_float.astype(np.int64)
    low = np.flatnonzero(d < min_degree)
    if low.size:
        raise ValueError(f"degrees[{int(low[0])}] = {int(d[low[0]])} is below {min_degree}")
    return Instance(demands=w, capacities=b, degrees=d)


def throughput(w: FloatArray) -> float:
    """Objective of MTBD: ``sum_i sum_j w[i, j]``."""
    return float(np.asarray(w, dtype=np.float64).sum())


def upper_bound(demands: Sequence[float] | FloatArray, capacities: Sequence[float] | FloatArray) -> float:
    """The trivial bound ``min(sum_j b_j, sum_i w_i)`` used to normalise throughputs in Section VI."""
    return float(min(np.sum(np.asarray(capacities, dtype=np.float64)), np.sum(np.asarray(demands, dtype=np.float64))))


def connections(w: FloatArray, tol: float = 0.0) -> IntArray:
    """Number of clients connected to each server: ``card{i : w[i, j] > tol}`` (left-hand side of constraint (2))."""
    return np.asarray((np.asarray(w) > tol).sum(axis=0), dtype=np.int64)


@dataclass(frozen=True)
class ValidationReport:
    """Largest violations of constraints (1)-(3) of an allocation, and the degree excess per server."""

    capacity_excess: float  # max_j sum_i w[i,j] - b_j (<= tol when (1) holds)
    demand_excess: float  # max_i sum_j w[i,j] - w_i (<= tol when (3) holds)
    degree_excess: int  # max_j card{i: w[i,j] > 0} - d_j (<= 0 when (2) holds)
    negative: float  # most negative entry (>= -tol)

    def ok(self, tol: float, extra_degree: int = 0) -> bool:
        return (
            self.capacity_excess <= tol
            and self.demand_excess <= tol
            and self.negative >= -tol
            and self.degree_excess <= extra_degree
        )


def validate_allocation(
    w: FloatArray,
    demands: Sequence[float] | FloatArray,
    capacities: Sequence[float] | FloatArray,
    degrees: Sequence[int] | IntArray,
    *,
    tol: float | None = None,
) -> ValidationReport:
    """Measure how far ``w`` is from satisfying constraints (1), (2) and (3) of the paper.

    Entries at most ``tol`` (default: the instance's zero tolerance) do not count as connections.
    """
    inst = as_instance(demands, capacities, degrees)
    w = np.asarray(w, dtype=np.float64)
    if w.shape != (inst.n, inst.m):
        raise ValueError(f"allocation has shape {w.shape}, expected ({inst.n}, {inst.m})")
    t = inst.tol if tol is None else tol
    cap = float(np.max(w.sum(axis=0) - inst.capacities, initial=-np.inf))
    dem = float(np.max(w.sum(axis=1) - inst.demands, initial=-np.inf))
    deg = int(np.max(connections(w, t) - inst.degrees, initial=-(10**9)))
    neg = float(np.min(w, initial=0.0))
    return ValidationReport(capacity_excess=cap, demand_excess=dem, degree_excess=deg, negative=neg)


def changes_between(
    old: Mapping[int, Mapping[Any, float]], new: Mapping[int, Mapping[Any, float]], m: int, tol: float
) -> dict[int, int]:
    """``N_j^t`` of Section III-A for every server with at least one change.

    ``old`` and ``new`` map a server index to ``{client: amount}``. A change at server ``j`` is a client whose amount
    differs by more than ``tol`` (new connection, disconnection, or change in the allocation).
    """
    out: dict[int, int] = {}
    for j in range(m):
        a = old.get(j, {})
        b = new.get(j, {})
        if not a and not b:
            continue
        count = 0
        for c in a.keys() | b.keys():
            if abs(a.get(c, 0.0) - b.get(c, 0.0)) > tol:
                count += 1
        if count:
            out[j] = count
    return out
