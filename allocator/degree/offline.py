"""Offline algorithms of paper 003: SEQ (Algorithm 1), SEQLEFT, the valid approximation, MDGT, and the pool rule.

Section references are to Beaumont, Eyraud-Dubois, Rejeb and Thraves, "Heterogeneous Resource Allocation under
Degree Constraints". ``extra_degree`` everywhere counts the connections a server may use *beyond* its degree: an
algorithm run with ``extra_degree = a`` serves at most ``d_j + a`` clients on server ``j``. SEQ in the paper is the
case ``a = 1`` (Algorithm 1 with degree ``d_j`` uses at most ``d_j + 1`` connections); ``a = 0`` runs Algorithm 1 with
degree ``d_j - 1`` and therefore respects the hard limit ``d_j``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ._engine import run_sweep
from .model import FloatArray, Instance, IntArray, as_instance

__all__ = [
    "SparseAllocation",
    "drop_excess",
    "mdgt",
    "min_extra_degree",
    "plan_pool",
    "seq",
    "seq_left",
    "seq_sparse",
    "valid_seq",
]


@dataclass(frozen=True)
class SparseAllocation:
    """The nonzero entries ``w[rows[k], cols[k]] = amounts[k]`` of an ``(n, m)`` allocation (one per connection)."""

    rows: IntArray
    cols: IntArray
    amounts: FloatArray
    shape: tuple[int, int]

    def to_dense(self) -> FloatArray:
        w = np.zeros(self.shape, dtype=np.float64)
        np.add.at(w, (self.rows, self.cols), self.amounts)
        return w

    @property
    def throughput(self) -> float:
        return float(self.amounts.sum())


def _check_extra(extra_degree: int) -> int:
    if int(extra_degree) != extra_degree or extra_degree < 0:
        raise ValueError(f"extra_degree must be a non-negative integer, got {extra_degree!r}")
    return int(extra_degree)


def _run(inst: Instance, extra_degree: int, *, left: bool) -> SparseAllocation:
    extra = _check_extra(extra_degree)
    idx = np.flatnonzero(inst.demands > inst.tol)
    order = idx[np.lexsort((idx, inst.demands[idx]))]
    dparam = inst.degrees + (extra - 1)
    rec, _, _ = run_sweep(inst.demands[order], order.astype(np.int64), inst.capacities, dparam, inst.tol, left=left)
    rows, cols, amounts = rec.connections()
    return SparseAllocation(rows=rows, cols=cols, amounts=amounts, shape=(inst.n, inst.m))


def seq_sparse(
    demands: Sequence[float] | FloatArray,
    capacities: Sequence[float] | FloatArray,
    degrees: Sequence[int] | IntArray,
    *,
    extra_degree: int = 1,
) -> SparseAllocation:
    """SEQ (Algorithm 1) returning only the connections; see :func:`seq`. Use this for large ``n * m``."""
    return _run(as_instance(demands, capacities, degrees), extra_degree, left=False)


def seq(
    demands: Sequence[float] | FloatArray,
    capacities: Sequence[float] | FloatArray,
    degrees: Sequence[int] | IntArray,
    *,
    extra_degree: int = 1,
) -> FloatArray:
    """Algorithm SEQ (Section IV-A, Algorithm 1) with ``extra_degree`` connections of resource augmentation.

    Clients are sorted by increasing demand (ties by index) and servers are taken in the given order. For server
    ``j`` Algorithm 1 runs with degree ``d = d_j + extra_degree - 1``:

    * case 1 (lines 4-8): if some interval of ``d + 1`` consecutive clients has ``LC(l, l+d-1) < b_j <= LC(l, l+d)``,
      the *rightmost* one is chosen, its first ``d`` clients are served fully and the last one partially; the
      remainder keeps its place in the sorted list (ordering property) or, at the right end of the list where no
      interval ``[l+1, l+d+1]`` exists, is re-inserted at its sorted place;
    * case 2 (lines 10-14): if the ``d`` smallest clients already reach ``b_j``, the smallest prefix reaching
      ``b_j`` is served (its last client split);
    * case 3 (lines 16-18): if the ``d + 1`` largest clients stay below ``b_j``, the ``d`` largest are served.

    Each server therefore has at most ``d_j + extra_degree`` connections; with the default ``extra_degree=1`` the
    throughput is at least the optimum of MTBD with degrees ``d_j`` (Theorem 4.4). ``extra_degree=0`` on a server of
    degree 1 runs Algorithm 1 with degree 0, which serves that server only in case 1 (a client of at least ``b_j``);
    :func:`plan_pool` covers that situation. Returns the ``(n, m)`` matrix
    ``w[i, j]``. Raises ``ValueError`` for negative demands/capacities, degrees below 1 or a negative
    ``extra_degree``.
    """
    return seq_sparse(demands, capacities, degrees, extra_degree=extra_degree).to_dense()


def seq_left(
    demands: Sequence[float] | FloatArray,
    capacities: Sequence[float] | FloatArray,
    degrees: Sequence[int] | IntArray,
    *,
    extra_degree: int = 1,
) -> FloatArray:
    """SEQLEFT (Section VI-C): SEQ choosing the *leftmost* suitable interval, remainder re-inserted in sorted order.

    Same inputs, output and degree use as :func:`seq`; it has the same offline throughput guarantee in practice but
    no bound on the number of changes online.
    """
    return _run(as_instance(demands, capacities, degrees), extra_degree, left=True).to_dense()


def drop_excess(w: FloatArray, degrees: Sequence[int] | IntArray, tol: float = 0.0) -> FloatArray:
    """Section IV-C: on every server with more than ``d_j`` connections, disconnect the smallest ones.

    For SEQ's output (at most ``d_j + 1`` connections) this removes one client per over-degree server; removing the
    smallest connection keeps at least ``d_j / (d_j + 1)`` of that server's throughput.
    """
    w = np.array(w, dtype=np.float64)
    d = np.asarray(degrees, dtype=np.int64)
    for j in range(w.shape[1]):
        col = w[:, j]
        nz = np.flatnonzero(col > tol)
        excess = nz.shape[0] - int(d[j])
        if excess > 0:
            order = nz[np.lexsort((nz, col[nz]))]
            col[order[:excess]] = 0.0
    return w


def valid_seq(
    demands: Sequence[float] | FloatArray,
    capacities: Sequence[float] | FloatArray,
    degrees: Sequence[int] | IntArray,
) -> FloatArray:
    """The valid approximation of Section IV-C: SEQ with one extra connection, then :func:`drop_excess`.

    The result satisfies constraints (1)-(3) with degrees ``d_j`` and reaches at least ``d_min / (d_min + 1)`` of
    the optimal throughput (since SEQ's throughput is at least the optimum by Theorem 4.4).
    """
    inst = as_instance(demands, capacities, degrees)
    return drop_excess(seq_sparse(inst.demands, inst.capacities, inst.degrees).to_dense(), inst.degrees, inst.tol)


def plan_pool(
    demands: Sequence[float] | FloatArray,
    capacities: Sequence[float] | FloatArray,
    max_pods: Sequence[int] | IntArray,
    *,
    extra_pod_allowed: bool = False,
) -> FloatArray:
    """The degree policy's entry point for the planner: split job demands over nodes under hard pod limits.

    Inputs: ``demands[i]`` the splittable throughput a job wants (``w_i``), ``capacities[j]`` a node's capacity
    (``b_j``) and ``max_pods[j]`` its configured degree (kubelet max-pods or a licence limit). Returns the ``(n, m)``
    matrix ``w[i, j]``; each nonzero entry is one pod of job ``i`` on node ``j`` with that share.

    **Kubernetes rule.** SEQ (Algorithm 1) may use ``d + 1`` connections on a server of degree ``d``, but max-pods
    is a hard limit. Therefore the pool's configured degree is passed to SEQ *minus one* (``seq(..., max_pods,
    extra_degree=0)``), so that no node ever gets more than ``max_pods[j]`` pods; by Theorem 4.4 this reaches at
    least the optimum achievable with ``max_pods - 1`` pods per node. When the pool declares that one extra pod is
    allowed (``extra_pod_allowed=True``), the configured degree is passed unchanged (``extra_degree=1``) and a node
    may get ``max_pods[j] + 1`` pods, which reaches at least the optimum with ``max_pods`` pods per node.

    Without the extra pod, the valid approximation of Section IV-C (SEQ with the configured degree, then the
    smallest pod dropped on each over-limit node; ratio ``d_min / (d_min + 1)`` of the optimum with ``max_pods``)
    also respects the limit; the one with the larger total throughput is returned (ties: the degree-minus-one
    SEQ). This matters most for ``max_pods = 1``, where SEQ with degree 0 can only give each node its largest job.
    Both candidates are deterministic functions of the inputs.
    """
    inst = as_instance(demands, capacities, max_pods)
    if extra_pod_allowed:
        return seq_sparse(inst.demands, inst.capacities, inst.degrees, extra_degree=1).to_dense()
    a = seq_sparse(inst.demands, inst.capacities, inst.degrees, extra_degree=0).to_dense()
    b = valid_seq(inst.demands, inst.capacities, inst.degrees)
    return b if b.sum() > a.sum() + inst.tol else a


Algorithm = Callable[..., FloatArray]


def min_extra_degree(
    algorithm: Algorithm,
    demands: Sequence[float] | FloatArray,
    capacities: Sequence[float] | FloatArray,
    degrees: Sequence[int] | IntArray,
    target: float | None = None,
    *,
    rtol: float = 1e-9,
) -> int:
    """Dichotomic search (Section IV-C) for the smallest ``a >= 0`` with ``algorithm(..., extra_degree=a)`` reaching
    ``target`` (default: the bound ``min(sum b, sum w)``), i.e. the ``alpha*`` of Section VI-C.

    Exponential search for an upper bracket, then bisection; exact for SEQ, whose throughput is non-decreasing in
    the degree (SEQ with ``a`` is valid for degrees ``d + a + 1``, which SEQ with ``a + 1`` beats by Theorem 4.4).
    For heuristics it returns the threshold found under the same monotonicity assumption.
    """
    inst = as_instance(demands, capacities, degrees)
    bound = min(float(inst.capacities.sum()), float(inst.demands.sum()))
    goal = bound if target is None else float(target)
    if goal > bound * (1 + rtol) + inst.tol:
        raise ValueError(f"target {goal} exceeds the upper bound min(sum b, sum w) = {bound}")
    need = goal - rtol * max(goal, 1.0)

    def ok(a: int) -> bool:
        return float(algorithm(inst.demands, inst.capacities, inst.degrees, extra_degree=a).sum()) >= need

    if ok(0):
        return 0
    hi = 1
    cap = max(inst.n, 1) + 1  # with more connections than clients every algorithm here reaches the bound
    while not ok(hi):
        if hi >= cap:
            raise ValueError("the algorithm does not reach the target even with unbounded degree")
        hi = min(2 * hi, cap)
    lo = hi // 2  # ok(lo) is False (lo = 0 or a failed previous bracket)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def mdgt(
    demands: Sequence[float] | FloatArray,
    capacities: Sequence[float] | FloatArray,
    degrees: Sequence[int] | IntArray,
    target: float,
) -> int:
    """MDGT (Minimize Degree for a Given Throughput), Section IV-C: the smallest uniform augmentation ``alpha`` such
    that SEQ uses at most ``d_j + alpha`` connections per server and reaches throughput ``target``.

    ``alpha_SEQ <= alpha* + 1`` where ``alpha*`` is the optimal augmentation of any valid solution.
    """
    return min_extra_degree(seq, demands, capacities, degrees, target)
