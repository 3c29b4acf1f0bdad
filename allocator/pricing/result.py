"""Results of price discovery: :class:`PricingResult` (bounds, allocation, status, timings) and the per-evaluation
:class:`IterationRecord`. A result keeps the state of an incremental re-solve (``previous=``), a
:class:`allocator.pricing.dual.reuse.Reuse`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from allocator.pricing.dual.reuse import Reuse

__all__ = ["IterationRecord", "PricingResult", "Status"]

ArrayLike = Any
Status = Literal["optimal", "max_iter", "stalled", "infeasible", "empty"]


@dataclass
class IterationRecord:
    """One evaluation of the dual function (one entry of the optional history)."""

    iteration: int
    prices: np.ndarray
    usage: np.ndarray  #: resource usage ``r`` of the subproblem solutions (may exceed capacity)
    dual_value: float  #: ``g(p)``, an upper bound on the optimum
    primal_value: float  #: utility of the column-scaled feasible allocation, a lower bound
    gap: float  #: best upper bound minus best lower bound so far
    kind: str  #: "init", "lbfgs", "subgradient"


@dataclass
class PricingResult:
    """Outcome of price discovery.

    ``utility_value`` (a lower bound on the optimum ``U*``, the utility of ``allocation``) and ``dual_value`` (an upper
    bound, ``g(prices)``) bracket ``U*``; ``gap = dual_value - utility_value``. ``converged`` is true when
    ``gap <= eps``. ``status`` is ``"optimal"`` (converged), ``"max_iter"`` (stopped by the iteration limit; the bounds
    still hold), ``"stalled"`` (stopped before the limit with the gap open: no price step is left in the
    cutting-plane model of ``g``, or a float32 run stalled at its rounding level; the bounds still hold),
    ``"infeasible"`` (some job has utility ``-inf`` at zero throughput, e.g. log utility, and no pool
    with positive throughput and capacity: ``infeasible_jobs`` lists them, they get nothing, and the prices and
    allocation are optimal for the other jobs) or ``"empty"`` (no jobs).
    """

    prices: np.ndarray  #: (m,) optimal prices (the price vector with the smallest dual value seen)
    allocation: np.ndarray  #: (n, m) feasible allocation X: time fractions, rows sum to <= 1, usage <= capacity
    throughputs: np.ndarray  #: (n,) t_i = a_i^T x_i of ``allocation``
    usage: np.ndarray  #: (m,) sum_i d_i * x_i of ``allocation``
    utility_value: float  #: U(X), lower bound
    dual_value: float  #: g(prices), upper bound
    gap: float
    eps: float
    iterations: int  #: dual-function evaluations, line-search trials included
    converged: bool
    status: Status
    message: str
    seconds: float  #: wall-clock time of the solve (validation, presolve, evaluations, recovery, allocation)
    device: str
    dtype: str
    infeasible_jobs: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    history: list[IterationRecord] = field(default_factory=list)
    #: dual evaluations of the presolve on a job sample (cheaper, not counted in ``iterations``; 0 without presolve)
    presolve_evaluations: int = 0
    #: jobs whose subproblem was solved again at the first evaluation of a solve given ``previous=`` (the others
    #: reused the previous solve's solutions); ``None`` when nothing was reused
    resolved_jobs: int | None = None
    #: one-time costs of the process paid by this call before its clock started (loading or compiling the CPU
    #: kernels, :func:`allocator.pricing.load_kernels`); 0 once they are loaded. ``seconds`` excludes them.
    startup_seconds: float = 0.0
    _reuse: Reuse | None = field(default=None, repr=False, compare=False)
    _precision_stall: bool = field(default=False, repr=False, compare=False)

    @property
    def X(self) -> np.ndarray:
        return self.allocation

    @property
    def n_jobs(self) -> int:
        return int(self.allocation.shape[0])

    @property
    def n_resources(self) -> int:
        return int(self.prices.shape[0])

    def summary(self) -> dict[str, Any]:
        """A JSON-serialisable digest (what ``walras solve --json`` prints, minus the problem description)."""
        return {
            "prices": [float(v) for v in self.prices],
            "utility_value": _finite_or_str(self.utility_value),
            "dual_value": _finite_or_str(self.dual_value),
            "gap": _finite_or_str(self.gap),
            "iterations": self.iterations,
            "converged": self.converged,
            "status": self.status,
            "seconds": self.seconds,
            "startup_seconds": self.startup_seconds,
            "device": self.device,
        }


def _finite_or_str(v: float) -> float | str:
    return float(v) if math.isfinite(v) else str(v)
