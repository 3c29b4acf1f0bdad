"""Throughput under per-node degree limits (paper 003: Beaumont, Eyraud-Dubois, Rejeb, Thraves,
"Heterogeneous Resource Allocation under Degree Constraints").

Servers (nodes) have a capacity ``b_j`` and a degree ``d_j`` (most clients/pods they may host); clients (jobs) have a
splittable demand ``w_i``. An allocation ``w[i, j]`` must satisfy constraints (1)-(3) of the paper (see
:mod:`allocator.degree.model`); every nonzero ``w[i, j]`` is one connection (one pod).

**Planner entry point:** :func:`plan_pool` (hard per-node pod limits; documents the Kubernetes degree rule).

Offline: :func:`seq` (Algorithm 1, Theorem 4.4), :func:`seq_sparse`, :func:`seq_left` (SEQLEFT), :func:`valid_seq`
(Section IV-C), :func:`mdgt` / :func:`min_extra_degree` (dichotomic search), heuristics :func:`lcls`, :func:`lcbc`,
:func:`obc` (Section VI-A). Online: :class:`OnlineSeq` (OSEQ, naive and incremental, Section V),
:class:`OnlineSeqLeft`, :class:`OnlineBestConnection` (OBC).

The compiled kernels of SEQ and OSEQ are loaded on first use, not on import, through the route table of
:mod:`allocator.degree.kernels` (an extension module compiled ahead of time by ``python -m allocator.degree.aot``,
else numba just in time).
"""

from .heuristics import OnlineBestConnection, lcbc, lcls, obc
from .model import (
    Instance,
    ValidationReport,
    as_instance,
    changes_between,
    connections,
    throughput,
    upper_bound,
    validate_allocation,
)
from .offline import (
    SparseAllocation,
    drop_excess,
    mdgt,
    min_extra_degree,
    plan_pool,
    seq,
    seq_left,
    seq_sparse,
    valid_seq,
)
from .online import OnlineSeq, OnlineSeqLeft

__all__ = [
    "Instance",
    "OnlineBestConnection",
    "OnlineSeq",
    "OnlineSeqLeft",
    "SparseAllocation",
    "ValidationReport",
    "as_instance",
    "changes_between",
    "connections",
    "drop_excess",
    "lcbc",
    "lcls",
    "mdgt",
    "min_extra_degree",
    "obc",
    "plan_pool",
    "seq",
    "seq_left",
    "seq_sparse",
    "throughput",
    "upper_bound",
    "valid_seq",
    "validate_allocation",
]
