"""Workloads that call every kernel of the colocation and fairness route tables (:mod:`allocator.colocation.kernels`,
:mod:`allocator.fairness.kernels`) through the public solvers, for tests/test_kernel_tables_aot.py: each returns
every number the solvers computed (as lists, so that a fresh interpreter can print them as JSON; floats keep their
exact value through ``json``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from allocator import colocation, fairness
from allocator.fairness import kernels as fairness_kernels
from allocator.fairness.psdsf._levels import _Smooth

SEEDS = (0, 1, 2)


def _colocation_case(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    n, k, m = 9 + 3 * seed, 3, 3 + seed
    sizes = rng.integers(1, 3, n).astype(np.float64)  # few distinct (type, size) classes: a small exact DP
    types = rng.integers(0, k, n)
    alpha = rng.uniform(0.0, 0.5, (k, k))
    alpha = (alpha + alpha.T) / 2
    cap = np.full(m, sizes.sum() / m * 1.6)
    out: dict[str, Any] = {}
    for method in ("bestors", "exact", "search"):
        r = colocation.solve(sizes, types, alpha, m, method=method)
        out[method] = [r.assignment.tolist(), r.cost, r.evaluations, r.moves]
    for method in ("exact", "search"):
        r = colocation.solve(sizes, types, alpha, m, method=method, capacity=cap, max_tasks=n // m + 2)
        out[f"{method}-limits"] = [r.assignment.tolist(), r.cost, r.evaluations, r.moves]
    desc = np.sort(sizes)[::-1].copy()
    t = colocation.bestors_table(desc, m, algorithm="dc", capacity=cap, max_tasks=np.full(m, n // m + 2))
    out["bestors-limits"] = [t.costs.tolist(), t.choice.tolist()]
    return out


def _fairness_case(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    n, k, r = 12 + 4 * seed, 6, 3
    d = rng.uniform(0.1, 1.0, (n, r))
    c = rng.uniform(10.0, 100.0, (k, r))
    e = rng.random((n, k)) < 0.6
    e[:, 0] = True
    inst = fairness.make_instance(d, c, e)
    out: dict[str, Any] = {}
    ps = fairness.ps_dsf(inst)
    out["ps_dsf"] = [ps.x.tolist(), ps.residual, ps.sweeps, ps.start]
    pf = fairness.pf_vds(inst, 1.0, tol=1e-8)
    out["pf_vds"] = [pf.x.tolist(), pf.residual, pf.iterations, pf.method]
    out["rounded"] = fairness.round_allocation(ps.x, inst).tolist()
    sm = _Smooth(inst)  # the smoothed levels at a point, and their sparse Jacobian (the level start of PS-DSF)
    tau = 0.05
    pt = sm.evaluate(rng.normal(size=k), tau)
    jac = fairness_kernels.load().smooth_jacobian(
        pt.x, pt.w, pt.capped, pt.rk, pt.lk, sm.live, sm.demands, sm.cinv, tau, sm.cut
    )
    out["levels"] = [pt.f.tolist(), pt.x.tolist(), np.asarray(jac).tolist()]
    # a server no user may use (b = 0 for every user: PS-DSF's breakpoints o / b divide by zero, error_model="numpy")
    b = np.zeros(n)
    col = fairness_kernels.load().fill_column(b, np.zeros(n), np.full(n, 5.0), np.ascontiguousarray(d), c[0].copy())
    out["fill_zero_rates"] = np.asarray(col).tolist()
    return out


def run(package: str) -> dict[str, Any]:
    """Every result of the workload of ``package`` (``"colocation"`` or ``"fairness"``), by seed and solver."""
    case = {"colocation": _colocation_case, "fairness": _fairness_case}[package]
    return {str(seed): case(seed) for seed in SEEDS}
