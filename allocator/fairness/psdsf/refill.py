"""Second stage after PS-DSF: give leftover capacity away without breaking sharing incentive or envy-freeness.

PS-DSF (paper 002 Sec. 2.3, Definition 4) satisfies sharing incentive, envy-freeness and bottleneck fairness but not
Pareto optimality (Sec. 2.3): a server's filling freezes every user of a saturated resource, so other resources can be
left idle. :func:`refill` solves one LP over the per-server split ``x'[n, k]`` that keeps every user's total at least
its PS-DSF total (so sharing incentive, a lower bound on each total, still holds) and keeps envy-freeness, and among
those allocations maximises the sum of relative gains ``sum_n x'_n / x_n``.

Envy-freeness with placement constraints (Sec. 2.1, as the property tests of ``tests/test_fairness_properties.py`` state
it): user ``n`` does not prefer user ``m``'s allocation, counting only servers ``n`` may use. With ``m``'s tasks
``x'[m, k]`` on server ``k`` user ``n`` could run ``x'[m, k] min_{r: d[n, r] > 0} d[m, r] / d[n, r]`` tasks, and weights
scale entitlements, so the condition is linear in ``x'``:

    ``sum_{k in E_n} a[n, m] x'[m, k] <= x'_n``,  ``a[n, m] = (phi_n / phi_m) min_{r: d[n, r] > 0} d[m, r] / d[n, r]``.

The LP is feasible by construction: the PS-DSF point itself satisfies every row (a row it violates by round-off gets
that violation as slack). What the stage does **not** guarantee is Pareto optimality over all allocations: it is Pareto
optimal among the envy-free allocations that dominate PS-DSF (the LP optimum with positive weights), and a Pareto
improvement beyond it may create envy. PF-VDS(1) (Sec. 3.3) is the mechanism with all of SI, EF and PO.

Size: one envy row per ordered pair of users that share a server, ``O(n^2)`` rows; meant for a planning round's pools
(tens to hundreds of jobs), not for 1000-job instances.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from .._model import FloatArray, Instance, merge_identical_nodes


def envy_coefficients(inst: Instance) -> FloatArray:
    """``a[n, m] = (phi_n / phi_m) min_{r: d[n, r] > 0} d[m, r] / d[n, r]``, ``(n, n)``: tasks user ``n`` could run per
    task of user ``m`` on a server it may use (0 on the diagonal)."""
    d = inst.demands
    need = d > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(need[:, None, :], d[None, :, :] / np.where(need, d, 1.0)[:, None, :], np.inf)
    a = ratio.min(axis=2) * (inst.weights[:, None] / inst.weights[None, :])
    np.fill_diagonal(a, 0.0)
    return np.asarray(a, dtype=np.float64)


@dataclass(frozen=True)
class RefillResult:
    """Outcome of :func:`refill`: tasks ``x`` ``(n, k)``, the relative gain of each user's total over the input, and
    the number of envy rows of the LP."""

    x: FloatArray
    gain: FloatArray
    envy_rows: int


def refill(inst: Instance, x: FloatArray) -> RefillResult:
    """Second stage from an envy-free allocation ``x`` (e.g. PS-DSF's): the LP of the module docstring.

    Identical nodes (equal capacities and eligibility columns) are merged first and the result split equally among
    them: the LP's rows are sums over a node's pairs, so this is exact (the same argument as for
    :func:`allocator.fairness._model.merge_identical_nodes`).

    Raises:
        RuntimeError: HiGHS did not solve the LP (it is feasible by construction, so this is a solver failure).
    """
    x = np.where(inst.eligible, np.maximum(np.asarray(x, dtype=np.float64), 0.0), 0.0)
    merged, group, count = merge_identical_nodes(inst)
    xm = np.zeros((inst.n, merged.k))
    np.add.at(xm.T, group, x.T)
    res = _refill(merged, xm)
    out = res.x[:, group] / count[group][None, :]
    return RefillResult(x=out, gain=res.gain, envy_rows=res.envy_rows)


def _refill(inst: Instance, x: FloatArray) -> RefillResult:
    n, k, r = inst.n, inst.k, inst.r
    tot = x.sum(axis=1)
    users, nodes = np.nonzero(inst.eligible)
    p = users.size
    # capacity rows
    rows = (nodes[:, None] * r + np.arange(r)[None, :]).ravel()
    cols = np.repeat(np.arange(p), r)
    vals = inst.demands[users].ravel()
    keep = vals > 0
    cap = sp.csr_matrix((vals[keep], (rows[keep], cols[keep])), shape=(k * r, p))
    tmat = sp.csr_matrix((np.ones(p), (users, np.arange(p))), shape=(n, p))
    # envy rows: for each ordered pair (a, b) sharing a server, a[a, b] * x'[b, k in E_a] - x'_a <= slack
    coef = envy_coefficients(inst)
    pa, pb = np.nonzero((inst.eligible.astype(np.int64) @ inst.eligible.T.astype(np.int64) > 0) & (coef > 0))
    # pair j = (users[j], nodes[j]) enters row (a, b) when users[j] == b and nodes[j] is eligible for a
    row_of_b = [np.flatnonzero(pb == b) for b in range(n)]
    er, ec, ev = [], [], []
    for j in range(p):
        rws = row_of_b[users[j]]
        rws = rws[inst.eligible[pa[rws], nodes[j]]]
        er.append(rws)
        ec.append(np.full(rws.size, j))
        ev.append(coef[pa[rws], pb[rws]])
    q = pa.size
    envy = sp.csr_matrix(
        (
            np.concatenate([*ev, np.array([])]),
            (np.concatenate([*er, np.array([], int)]), np.concatenate([*ec, np.array([], int)])),
        ),
        shape=(q, p),
    )
    envy = envy - tmat[pa]
    slack = np.maximum(envy @ x[users, nodes], 0.0)  # round-off of the input's envy-freeness
    capped = np.flatnonzero(np.isfinite(inst.max_tasks))
    a_ub = sp.vstack([cap, -tmat, tmat[capped], envy]).tocsr()
    b_ub = np.concatenate([inst.capacities.ravel() * (1 + 1e-12), -tot, inst.max_tasks[capped] * (1 + 1e-12), slack])
    obj = -(1.0 / np.maximum(tot, 1e-12 * max(float(tot.max()), 1e-300)))[users]
    res = linprog(obj, A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs-ds")
    if res.status != 0:
        raise RuntimeError(f"HiGHS failed in the refill LP: {res.message}")
    out = np.zeros((n, k))
    out[users, nodes] = np.maximum(res.x, 0.0)
    # scale each server into its capacities (HiGHS meets rows to its feasibility tolerance)
    load = out.T @ inst.demands
    c = inst.capacities
    with np.errstate(divide="ignore", invalid="ignore"):
        over = np.where(load > c, load / np.where(c > 0, c, 1.0), 1.0)
    out = out / np.where(np.isfinite(over), over, np.inf).max(axis=1)[None, :]
    new_tot = out.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.where(tot > 0, new_tot / np.where(tot > 0, tot, 1.0) - 1.0, 0.0)
    return RefillResult(x=out, gain=np.asarray(gain, dtype=np.float64), envy_rows=q)
