"""Multi-resource fairness on heterogeneous nodes (paper 002: Khamse-Ashari et al., PS-DSF / PF-VDS).

Public entry point :func:`allocate`: how many tasks (pods) each elastic job runs on each node.

Mechanisms (``mechanism=``):

- ``"drf"``: DRF on a single node / pool (Sec. 2.1).
- ``"drfh"``: weighted max-min on global dominant shares (eq. 5), per-node feasible.
- ``"tsf"``: weighted max-min on task shares ``x_n / gamma_n`` (Sec. 2.2).
- ``"ps-dsf"``: per-server max-min on virtual dominant shares (Sec. 2.3, Definition 4).
- ``"pf-vds"``: alpha-proportional fairness on VDS (Problem 1), ``alpha`` in (0, inf), default 1.

Non-divisible (time-shared) nodes, Problem 2: :func:`allocate_time_shared`. Integral pods: ``integral=True``
(:mod:`allocator.fairness.rounding`). Identical nodes with identical eligibility are merged before solving and the
result is split equally among them (:func:`merge_identical_nodes`); this is exact for every mechanism here (``gamma``
of the merged node is the sum, VDS are rescaled by a common factor on that node, DRFH/TSF totals are unchanged).

Layout, one folder per algorithm of the paper, all on the shared instance of :mod:`._model`:

- :mod:`.maxmin`: DRFH and TSF, weighted max-min on a global linear share (Sec. 2.1-2.2), by progressive LPs.
- :mod:`.psdsf`: PS-DSF (Sec. 2.3, Definition 4), DRF on one server, the level start and the refill stage.
- :mod:`.pfvds`: PF-VDS(alpha) (Problem 1, Sec. 3-5): best responses, certificate, interior point, exact finishes,
  PS-MFA.
- :mod:`.rounding`: whole pods from any divisible result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from ._model import FloatArray, Instance, make_instance, merge_identical_nodes, monopoly_tasks, usage
from .maxmin import MaxMinResult, drfh, drfh_result, linear_maxmin, tsf, tsf_result
from .pfvds import PfVdsResult, best_response, kkt_residual, pf_vds, pf_vds_distributed
from .psdsf import PsDsfResult, RefillResult, drf, envy_coefficients, fill_server, ps_dsf, refill
from .rounding import round_allocation

Mechanism = Literal["drf", "drfh", "tsf", "ps-dsf", "pf-vds"]
MECHANISMS: tuple[str, ...] = ("drf", "drfh", "tsf", "ps-dsf", "pf-vds")
Status = Literal["certified", "converged", "capped"]


@dataclass(frozen=True)
class FairAllocation:
    """Outcome of :func:`allocate`.

    Attributes:
        tasks: ``(n, k)`` tasks of each user on each node (fractional unless ``integral=True``).
        status: ``"certified"``: the mechanism's defining conditions were checked on the result and hold to the
            solver's tolerance -- DRF: one exact closed-form filling (Definition 1); DRFH / TSF: every progressive
            filling LP solved to optimality by HiGHS and the final split checked against the capacities and the
            max-min levels (``residual``); PS-DSF: one exact Gauss-Seidel sweep of per-server fillings from the result
            moves no column by more than ``1e-9`` of its user's total (Definition 4 checked server by server);
            PF-VDS: :func:`kkt_residual` ``<= 1e-6`` (eqs. 28-29). ``"converged"``: the method met its own stopping
            rule without an independent certificate (no mechanism of :func:`allocate` ends there today; kept for
            callers that pass results of other solvers). ``"capped"``: an iteration or time cap was reached before
            the certificate held; ``tasks`` is the best feasible iterate and ``residual`` says how far it is.
        residual: the certificate's value: PF-VDS :func:`kkt_residual`; PS-DSF fixed-point residual (largest
            relative column move of the last sweep); DRFH / TSF largest relative violation of a capacity or of a
            user's max-min level by the final split; ``nan`` for DRF (exact closed form, nothing to measure).
        method: the route taken: ``"drf"``, ``"drfh-lp"``, ``"tsf-lp"``, ``"ps-dsf/levels"`` or
            ``"ps-dsf/sweeps"``, ``"pf-vds/<route>"`` (:attr:`PfVdsResult.method`).
        message: one line for humans (sweeps, iterations, tolerance).

    With ``integral=True``, ``status``, ``residual`` and ``method`` describe the divisible solve that was rounded.
    """

    tasks: FloatArray
    status: Status
    residual: float
    method: str
    message: str


__all__ = [
    "MECHANISMS",
    "FairAllocation",
    "Instance",
    "MaxMinResult",
    "PfVdsResult",
    "PsDsfResult",
    "RefillResult",
    "Status",
    "allocate",
    "allocate_time_shared",
    "best_response",
    "drf",
    "drfh",
    "drfh_result",
    "envy_coefficients",
    "fill_server",
    "kkt_residual",
    "linear_maxmin",
    "make_instance",
    "merge_identical_nodes",
    "monopoly_tasks",
    "pf_vds",
    "pf_vds_distributed",
    "ps_dsf",
    "refill",
    "round_allocation",
    "tsf",
    "tsf_result",
    "usage",
]


def _solve(inst: Instance, mechanism: str, alpha: float | None) -> tuple[FloatArray, Status, float, str, str]:
    """Run one mechanism on a (merged) instance; returns ``(x, status, residual, method, message)``."""
    if mechanism == "drf":
        return drf(inst), "certified", math.nan, "drf", "exact progressive filling on one node (Definition 1)"
    if mechanism in ("drfh", "tsf"):
        res = drfh_result(inst) if mechanism == "drfh" else tsf_result(inst)
        msg = f"{res.stages} filling stage(s), {res.lps} HiGHS LPs; split within {res.residual:.1e} of caps and levels"
        return res.x, "certified", res.residual, f"{mechanism}-lp", msg
    if mechanism == "ps-dsf":
        ps = ps_dsf(inst)
        ps_status: Status = "certified" if ps.converged else "capped"
        verb = "fixed point to 1e-9" if ps.converged else "stopped at the sweep cap"
        msg = f"{ps.sweeps} sweep(s), {verb}, fixed-point residual {ps.residual:.1e}"
        return ps.x, ps_status, ps.residual, f"ps-dsf/{ps.start}", msg
    a = 1.0 if alpha is None else float(alpha)
    pf = pf_vds(inst, a)
    pf_status: Status = "certified" if pf.converged else "capped"
    verb = "KKT certified to 1e-6" if pf.converged else "stopped uncertified at its caps"
    msg = f"PF-VDS({a:g}) {verb}: residual {pf.residual:.1e}, {pf.iterations} sweep(s), {pf.ipm_iterations} IPM iter."
    return pf.x, pf_status, pf.residual, f"pf-vds/{pf.method}", msg


def allocate(
    demands: ArrayLike,
    capacities: ArrayLike,
    *,
    eligible: ArrayLike | None = None,
    weights: ArrayLike | None = None,
    mechanism: Mechanism | str = "ps-dsf",
    alpha: float | None = None,
    integral: bool = False,
    max_tasks: ArrayLike | None = None,
) -> FairAllocation:
    """Tasks ``x`` ``(n, k)`` of each user on each node under a multi-resource fairness mechanism, with the status of
    the solve (:class:`FairAllocation`; nothing is warned: an uncertified result has ``status="capped"``).

    Args:
        demands: ``(n, r)`` per-task demand of each user (job).
        capacities: ``(k, r)`` capacity of each node.
        eligible: ``(n, k)`` placement constraints (default: all nodes). Nodes lacking a needed resource are dropped.
        weights: ``(n,)`` positive weights ``phi`` (default 1).
        mechanism: one of ``"drf"``, ``"drfh"``, ``"tsf"``, ``"ps-dsf"``, ``"pf-vds"``.
        alpha: PF-VDS parameter in (0, inf) (default 1, proportional fairness); only for ``"pf-vds"``.
        integral: round to whole tasks without exceeding any capacity (:func:`round_allocation`).
        max_tasks: ``(n,)`` (or scalar) cap on each user's total tasks, e.g. a job's max replicas (default none).

    Raises:
        ValueError: invalid input (zero demand vector, negative capacity, user eligible on no node, ...), unknown
            mechanism, ``alpha`` given for another mechanism or not in (0, inf), ``"drf"`` with several nodes.
    """
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown mechanism {mechanism!r}; expected one of {MECHANISMS}")
    if alpha is not None:
        if mechanism != "pf-vds":
            raise ValueError(f"alpha is only meaningful for mechanism 'pf-vds', not {mechanism!r}")
        if not (np.isfinite(alpha) and alpha > 0):
            raise ValueError(f"alpha must be in (0, inf), got {alpha}")
    inst = make_instance(demands, capacities, eligible, weights, max_tasks)
    if mechanism == "drf" and inst.k != 1:
        raise ValueError(f"mechanism 'drf' needs exactly one node (pool), got {inst.k}; use 'drfh', 'tsf' or 'ps-dsf'")
    merged, group, count = merge_identical_nodes(inst)
    xm, status, residual, method, message = _solve(merged, mechanism, alpha)
    x = xm[:, group] / count[group][None, :]
    x = np.where(inst.eligible, np.maximum(x, 0.0), 0.0)
    if integral:
        x = round_allocation(x, inst)
        message += "; rounded to whole tasks"
    return FairAllocation(tasks=x, status=status, residual=float(residual), method=method, message=message)


def allocate_time_shared(
    demands: ArrayLike,
    capacities: ArrayLike,
    *,
    eligible: ArrayLike | None = None,
    weights: ArrayLike | None = None,
    max_tasks: ArrayLike | None = None,
) -> FloatArray:
    """Problem 2 (non-divisible, time-shared nodes): node ``k`` obeys ``sum_n x[n, k] / gamma[n, k] <= 1`` (eq. 17).

    By Theorem 5 the solution is the same for every strictly concave increasing utility (PS-DSF, every PF-VDS alpha,
    proportional fairness); it is computed by :func:`ps_dsf` with ``time_shared=True``. ``x[n, k]`` is the average
    number of tasks per unit time.
    """
    inst = make_instance(demands, capacities, eligible, weights, max_tasks)
    merged, group, count = merge_identical_nodes(inst)
    xm = ps_dsf(merged, time_shared=True).x
    x = xm[:, group] / count[group][None, :]
    return np.where(inst.eligible, np.maximum(x, 0.0), 0.0)
