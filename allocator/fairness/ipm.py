"""Barrier (interior-point) solver for PF-VDS(1) = weighted proportional fairness (paper 002, Theorem 2).

With alpha = 1 the PF-VDS equilibrium maximises the concave potential ``sum_n phi_n log x_n`` over the per-server
capacity polytope (see :mod:`allocator.fairness.pfvds`). This module solves that convex program by the standard
logarithmic-barrier method (Boyd & Vandenberghe, *Convex Optimization*, Sec. 11.3): for increasing ``t`` maximise
``t sum_n phi_n log x_n + sum_p log x_p + sum_m log s_m`` (``s = c - A x`` the capacity slacks) by damped Newton with
backtracking; it converges globally and the duality gap after centring is ``(#pairs + #rows) / t``.

The Newton system ``H dx = g`` is solved exactly through its structure: ``H = B + A^T S A`` where
``B = diag(1/x^2) + T^T diag(t phi / X^2) T`` is block diagonal per user with rank-one blocks (Sherman-Morrison), and
the capacity term has rank ``#rows = k r`` (Woodbury), so each step costs one dense ``(k r) x (k r)`` Cholesky.
In floating point the Woodbury solve loses accuracy once slacks become tiny (observed near a relative objective gap
of ~1e-7); the method then stops at its current feasible point (a Newton decrement that is not positive is the
signal). The result is a strictly interior, near-optimal point; :func:`allocator.fairness.pfvds.pf_vds` then polishes
it with exact best-response sweeps until the KKT residual meets its tolerance.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from ._model import FloatArray, Instance


def _add_cap_rows(small: FloatArray, a: sp.csr_matrix, x2: FloatArray, n_res: int) -> FloatArray:
    """Recompute the rows/columns of ``A diag(x^2) A^T`` that involve the ``max_tasks`` rows (index >= n_res)."""
    ax2 = a.multiply(x2).tocsr()
    cap_part = (ax2[n_res:] @ a.T).toarray()
    small[n_res:, :] += cap_part
    small[:n_res, n_res:] += cap_part[:, :n_res].T
    return small


def proportional_fair_barrier(
    inst: Instance, *, gap: float = 1e-9, mu: float = 30.0, max_newton: int = 200
) -> FloatArray:
    """Near-optimal interior solution of ``max sum_n phi_n log x_n`` s.t. capacities, placement and ``max_tasks``.

    ``gap`` is the target duality gap relative to ``sum_n phi_n``. Returns ``x`` ``(n, k)``.
    """
    n, k, r = inst.n, inst.k, inst.r
    users, nodes = np.nonzero(inst.eligible)
    p = users.size
    rows = (nodes[:, None] * r + np.arange(r)[None, :]).ravel()
    cols = np.repeat(np.arange(p), r)
    vals = inst.demands[users].ravel()
    keep = vals > 0
    a = sp.csr_matrix((vals[keep], (rows[keep], cols[keep])), shape=(k * r, p))
    cap = inst.capacities.ravel().astype(np.float64)
    used_rows = np.flatnonzero(np.diff(a.indptr) > 0)
    a = a[used_rows]
    cap = cap[used_rows]
    # max_tasks as extra rows sum_k x[n, k] <= M_n.
    capped = np.flatnonzero(np.isfinite(inst.max_tasks))
    if capped.size:
        sel = np.isin(users, capped)
        pos = np.searchsorted(capped, users[sel])
        a_cap = sp.csr_matrix((np.ones(sel.sum()), (pos, np.flatnonzero(sel))), shape=(capped.size, p))
        a = sp.vstack([a, a_cap]).tocsr()
        cap = np.concatenate([cap, inst.max_tasks[capped]])
    m = a.shape[0]
    du = inst.demands[users]
    phi = inst.weights
    # Strictly feasible start: half of the weighted equal-share allocation.
    wsum = (phi[:, None] * inst.eligible).sum(axis=0)
    frac = phi[users] / wsum[nodes]
    x = 0.5 * frac * inst.gamma[users, nodes]
    s = cap - a @ x
    scale = float(np.min(np.where(s > 0, cap / np.maximum(cap - s, 1e-300), np.inf)))
    if not np.all(s > 0):
        x *= 0.5 * min(scale, 1.0)
        s = cap - a @ x
    total_phi = float(phi.sum())
    t = max((p + m) / total_phi, 1e-3)

    def objective(xv: FloatArray, sv: FloatArray, tv: float) -> float:
        if np.any(xv <= 0) or np.any(sv <= 0):
            return -np.inf
        xt = np.bincount(users, weights=xv, minlength=n)
        return float(tv * phi @ np.log(xt) + np.log(xv).sum() + np.log(sv).sum())

    newton = 0
    stalled = False
    while True:
        for _ in range(50):
            newton += 1
            xt = np.bincount(users, weights=x, minlength=n)
            g = t * (phi / xt)[users] + 1.0 / x - a.T @ (1.0 / s)
            x2 = x * x
            w = t * phi / xt**2
            beta = w / (1.0 + w * np.bincount(users, weights=x2, minlength=n))

            def binv(v: FloatArray, x2=x2, beta=beta) -> FloatArray:
                u = x2 * v
                q = np.bincount(users, weights=u, minlength=n)
                return u - beta[users] * x2 * q[users]

            # V = A diag(x^2) T^T: row (k, r), column n holds x[n, k]^2 d[n, r] (dense (k r) x n, built directly).
            v_full = np.zeros((k, r, n))
            v_full[nodes, :, users] = x2[:, None] * inst.demands[users]
            v_mat = v_full.reshape(k * r, n)[used_rows]
            if capped.size:
                v_cap = np.zeros((capped.size, n))
                v_cap[np.arange(capped.size), capped] = np.bincount(users, weights=x2, minlength=n)[capped]
                v_mat = np.vstack([v_mat, v_cap])
            # A diag(x^2) A^T is block diagonal: one r x r block per server.
            blocks = np.zeros((k, r, r))
            for i in range(r):
                for j in range(i, r):
                    blocks[:, i, j] = np.bincount(nodes, weights=x2 * du[:, i] * du[:, j], minlength=k)
                    blocks[:, j, i] = blocks[:, i, j]
            small = -((v_mat * beta) @ v_mat.T)
            bd = np.zeros((k * r, k * r))
            for i in range(r):
                for j in range(r):
                    bd[np.arange(k) * r + i, np.arange(k) * r + j] = blocks[:, i, j]
            nr = used_rows.size
            small[:nr, :nr] += bd[np.ix_(used_rows, used_rows)]
            if capped.size:
                small = _add_cap_rows(small, a, x2, used_rows.size)
            small[np.diag_indices(m)] += s * s
            bg = binv(g)
            try:
                chol = sla.cho_factor(small, lower=True, check_finite=False)
                corr = sla.cho_solve(chol, a @ bg, check_finite=False)
            except np.linalg.LinAlgError:
                corr = np.linalg.lstsq(small, a @ bg, rcond=None)[0]
            dx = bg - binv(a.T @ corr)
            decrement = float(g @ dx)
            if not np.isfinite(decrement) or decrement < 0:
                stalled = True  # the Woodbury solve has lost accuracy: stop at the current (feasible) point
                break
            if decrement / 2 <= 1e-9 or newton >= max_newton:
                break
            ds = -(a @ dx)
            step = 1.0
            neg = dx < 0
            if neg.any():
                step = min(step, 0.99 * float(np.min(-x[neg] / dx[neg])))
            negs = ds < 0
            if negs.any():
                step = min(step, 0.99 * float(np.min(-s[negs] / ds[negs])))
            f0 = objective(x, s, t)
            while objective(x + step * dx, s + step * ds, t) < f0 + 0.25 * step * decrement and step > 1e-12:
                step *= 0.5
            x = x + step * dx
            s = cap - a @ x
        if stalled or (p + m) / t <= gap * total_phi or newton >= max_newton:
            break
        t *= mu
    out = np.zeros((n, k))
    out[users, nodes] = x
    return out
