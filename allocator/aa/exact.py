"""Exact assign-and-allocate by mixed-integer programming (HiGHS through :func:`scipy.optimize.milp`).

The AA problem of Section III of Lai et al. (paper 000) is a multiple-choice multiple-knapsack problem (Section II):
every thread picks one (server, amount) option and every server's chosen amounts fit its capacity. With
``x[i, j, c] = 1`` when thread ``i`` runs on server ``j`` with ``c >= 1`` units,

    maximise    sum_i f_i(0) + sum_{i, j, c} (f_i(c) - f_i(0)) x[i, j, c]
    subject to  sum_{j, c} x[i, j, c] <= 1                 (each thread takes at most one option; none = 0 units)
                sum_{i, c} c x[i, j, c] <= C_j             (server capacity, any C_j: heterogeneous servers allowed)
                x binary.

A thread choosing no option gets 0 units; it is reported on the server with the largest capacity (any server is
feasible for it). Options ``c > C_j`` are not generated, so per-server capacities are exact. Options whose gain is
dominated by a smaller amount on the same server (``f_i(c) <= f_i(c')`` with ``c' < c``, i.e. flat stretches of a
nondecreasing curve) are dropped: an optimum never needs them.

This is the reference the tests and ``bench/aa.py`` compare the heuristics against; it is exponential in the worst
case and meant for small instances (``n * m * C`` up to a few tens of thousands of binaries).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_array

from .curves import IntArray, as_curves

#: Largest number of binaries :func:`exact_optimum` builds.
MILP_MAX_COLUMNS = 2_000_000


@dataclass(frozen=True)
class ExactResult:
    """Result of :func:`exact_optimum`.

    ``status`` is ``"certified"`` when HiGHS proved optimality (``bound`` equals ``utility`` up to its gap tolerance)
    and ``"capped"`` when the time limit stopped it with a feasible assignment (``bound`` is then HiGHS's dual bound,
    an upper bound on the optimum). ``server`` / ``amount`` are the chosen assignment, ``utility`` its exact value
    recomputed from the curves, ``columns`` the number of binaries, ``wall`` the solve time in seconds."""

    status: str
    server: IntArray
    amount: IntArray
    utility: float
    bound: float
    columns: int
    wall: float


def exact_optimum(
    values: Any, capacities: ArrayLike, *, time_limit: float | None = None, mip_rel_gap: float = 1e-9
) -> ExactResult:
    """Solve AA exactly (see the module docstring for the MILP). ``values`` as :func:`~allocator.aa.as_curves`
    accepts (dense table or curve family; evaluated densely); ``capacities`` one nonnegative integer per server.

    ``time_limit`` (seconds, optional) caps HiGHS; a stop with a feasible point returns ``status="capped"``, one
    without raises ``RuntimeError``. ``ValueError`` when the MILP would have more than ``MILP_MAX_COLUMNS`` binaries.
    """
    caps = np.asarray(capacities)
    if caps.ndim != 1 or caps.size == 0 or (caps < 0).any() or (caps != np.round(caps)).any():
        raise ValueError("capacities must be a non-empty 1-D sequence of nonnegative integers")
    caps = caps.astype(np.int64)
    curves = as_curves(values, int(caps.max()))
    table = curves.table()
    n, m = curves.n, caps.size
    base = table[:, 0]
    gain = table - base[:, None]  # (n, Cmax + 1), nondecreasing in c
    # option (i, c) is useful only where the curve strictly rises at c (else c - 1 is as good and uses less)
    rises = np.zeros_like(gain, dtype=bool)
    rises[:, 1:] = np.diff(table, axis=1) > 0
    ii, cc = np.nonzero(rises)
    # replicate over servers that can hold c units
    jj = np.repeat(np.arange(m)[None, :], ii.size, axis=0).reshape(-1)
    ii = np.repeat(ii, m)
    cc = np.repeat(cc, m)
    keep = cc <= caps[jj]
    ii, jj, cc = ii[keep], jj[keep], cc[keep]
    N = int(ii.size)
    if N > MILP_MAX_COLUMNS:
        raise ValueError(f"the MILP would have {N} binaries (limit {MILP_MAX_COLUMNS}); instance too large")
    t0 = time.perf_counter()
    server = np.full(n, int(np.argmax(caps)), dtype=np.int64)
    amount = np.zeros(n, dtype=np.int64)
    if N == 0:
        u = float(base.sum())
        return ExactResult("certified", server, amount, u, u, 0, time.perf_counter() - t0)
    cols = np.arange(N)
    A_thread = csr_array((np.ones(N), (ii, cols)), shape=(n, N))
    A_server = csr_array((cc.astype(np.float64), (jj, cols)), shape=(m, N))
    options: dict[str, Any] = {"mip_rel_gap": mip_rel_gap}
    if time_limit is not None:
        options["time_limit"] = float(time_limit)
    res = milp(
        -gain[ii, cc],
        constraints=[
            LinearConstraint(A_thread, -np.inf, np.ones(n)),
            LinearConstraint(A_server, -np.inf, caps.astype(np.float64)),
        ],
        integrality=np.ones(N),
        bounds=Bounds(0, 1),
        options=options,
    )
    wall = time.perf_counter() - t0
    if res.x is None:
        raise RuntimeError(f"HiGHS returned no feasible point: {res.message}")
    if res.status == 0:
        status = "certified"
    elif res.status == 1:
        status = "capped"
    else:
        raise RuntimeError(f"HiGHS failed: {res.message}")
    chosen = np.flatnonzero(res.x > 0.5)
    server[ii[chosen]] = jj[chosen]
    amount[ii[chosen]] = cc[chosen]
    utility = float(table[np.arange(n), amount].sum())
    dual = getattr(res, "mip_dual_bound", None)
    bound = float(base.sum() - dual) if dual is not None and np.isfinite(dual) else utility
    if status == "certified":
        bound = max(bound, utility)
    return ExactResult(status, server, amount, utility, bound, N, wall)
