"""Exact finish for PF-VDS(1): the KKT equations on the active set, solved by Newton's method, with pivots.

The interior point of :mod:`allocator.fairness.pfvds.ipm` is near-optimal but not exact: every eligible pair carries a
little flow and every resource a little slack. At the optimum (paper 002, eqs. 27-29 with alpha = 1) a user ``n``
pays one price ``mu_n`` on every server it uses and no less elsewhere, and a priced resource is full. On the active
set, the used pairs ``(n, k)`` and the priced resources ``(k, r)``, these conditions are square equations:

- ``sum_r d[n, r] lambda[k, r] = mu_n`` for each used pair (eq. 29 with ``x[n, k] > 0``),
- ``sum_n d[n, r] x[n, k] = c[k, r]`` for each priced resource (eq. 28 with ``lambda[k, r] > 0``),
- ``mu_n X_n = phi_n`` for each user below its cap (the marginal utility ``phi_n / X_n`` equals the price),
  ``X_n = M_n`` for a capped one.

:class:`_ActiveKkt` solves them by Newton's method; the flows are not unique when users can trade tasks between
servers in a cycle, and the Newton steps then take the proximal (minimum-change) solution. :func:`polish` reads the
active set from the interior point by the usual indicators (a pair is used when its share of the user's tasks exceeds
its relative reduced cost, a resource priced when its relative price exceeds its relative slack) and corrects it by
pivots. Its result is accepted by :func:`allocator.fairness.pfvds.pf_vds` only after the independent certificate
:func:`allocator.fairness.pfvds.kkt_residual`.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import scipy.sparse as sp

from .._model import FloatArray, Instance
from .ipm import IpmResult, symmetric_solver


class _ActiveKkt:
    """The KKT equations of the module docstring on one active set: used pairs ``(pn, pk)`` (row-major, so a
    user's pairs are contiguous), priced resources ``(qk, qr)`` and capped users ``cu``.

    Unknowns are the flows ``x`` of the used pairs, the prices ``lambda`` of the priced resources and every user's
    price ``mu``. :meth:`newton_step` eliminates ``d mu`` of the users below their cap (from ``mu_n X_n = phi_n``),
    leaving the symmetric saddle-point system ``[[W, A^T], [A, 0]] [dx; dy] = [r1; r2]`` with ``W`` one rank-one
    block ``(mu_n / X_n) 1 1^T`` per such user and ``A`` the capacity rows of the priced resources plus one
    ``sum_k x[n, k]`` row per capped user (``dy = [d lambda; -d mu_capped]``). It is solved in scaled variables by the
    regularised (quasi-definite) system ``[[W + delta I, A^T], [A, -delta I]]``, whose ``x`` block is diagonal plus
    rank one per user (Sherman-Morrison), so only the dense Schur complement in ``dy`` is factorised; iterative
    refinement against the unregularised system then converges to its solution when it is consistent (and to the
    proximal, minimum-change one in the directions where it is singular: flows that users can trade in a cycle).
    """

    def __init__(self, inst: Instance, act: np.ndarray, pri: np.ndarray, capped: np.ndarray) -> None:
        self.inst = inst
        d = inst.demands
        n, _ = act.shape
        r = d.shape[1]
        self.pn, self.pk = np.nonzero(act)
        self.qk, self.qr = np.nonzero(pri)
        self.capped = capped & np.isfinite(inst.max_tasks)
        self.cu = np.flatnonzero(self.capped)
        p, q, nc = self.pn.size, self.qk.size, self.cu.size
        self.p, self.q, self.n = p, q, n
        qidx = -np.ones(pri.shape, dtype=np.int64)
        qidx[self.qk, self.qr] = np.arange(q)
        cidx = -np.ones(n, dtype=np.int64)
        cidx[self.cu] = np.arange(nc)
        rr = np.repeat(np.arange(p), r)
        res = np.tile(np.arange(r), p)
        row = qidx[self.pk[rr], res]
        vals = d[self.pn[rr], res]
        ok = (row >= 0) & (vals > 0)
        cap_pairs = np.flatnonzero(cidx[self.pn] >= 0)
        self.a = sp.csr_matrix(
            (
                np.concatenate([vals[ok], np.ones(cap_pairs.size)]),
                (np.concatenate([row[ok], q + cidx[self.pn[cap_pairs]]]), np.concatenate([rr[ok], cap_pairs])),
            ),
            shape=(q + nc, p),
        )
        self.dp = d[self.pn]
        self.cq = inst.capacities[self.qk, self.qr]

    def residual(self, x: FloatArray, lam: FloatArray, mu: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """``(F1, F2, F3)``: ties per pair, capacity per priced resource, budget (or cap) per user."""
        lamf = np.zeros(self.inst.capacities.shape)
        lamf[self.qk, self.qr] = lam
        f1 = (self.dp * lamf[self.pk]).sum(axis=1) - mu[self.pn]
        f2 = self.a[: self.q] @ x - self.cq
        tot = np.bincount(self.pn, weights=x, minlength=self.n)
        f3 = np.where(self.capped, tot - self.inst.max_tasks, mu * tot - self.inst.weights)
        return f1, f2, f3

    def error(self, x: FloatArray, lam: FloatArray, mu: FloatArray) -> float:
        """Largest residual, each relative to its natural scale (``mu_n``, ``c[k, r]``, ``phi_n`` or ``M_n``)."""
        f1, f2, f3 = self.residual(x, lam, mu)
        s3 = np.where(self.capped, self.inst.max_tasks, self.inst.weights)
        parts = [np.abs(f1) / np.maximum(np.abs(mu[self.pn]), 1e-300), np.abs(f2) / self.cq, np.abs(f3) / s3]
        return float(max((float(v.max()) for v in parts if v.size), default=0.0))

    def newton_step(
        self, x: FloatArray, lam: FloatArray, mu: FloatArray, refine: int = 8
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """One Newton step on the equations (class docstring); returns the corrections ``(dx, dlam, dmu)``."""
        pn, p, q, n = self.pn, self.p, self.q, self.n
        f1, f2, f3 = self.residual(x, lam, mu)
        tot = np.bincount(pn, weights=x, minlength=n)
        unc = ~self.capped
        with np.errstate(divide="ignore", invalid="ignore"):
            omega = np.where(unc, mu / tot, 0.0)
            r1 = -f1 - np.where(unc, f3 / tot, 0.0)[pn]
        r2 = np.concatenate([-f2, -f3[self.cu]])
        ys = np.concatenate([lam, mu[self.cu]])
        sx = np.maximum(np.abs(x), 1e-9 * max(float(np.abs(x).max()), 1e-300))
        sy = np.maximum(np.abs(ys), 1e-9 * max(float(np.abs(ys).max()), 1e-300))
        a = sp.diags(sy) @ self.a @ sp.diags(sx)
        b1, b2 = sx * r1, sy * r2
        ss = np.bincount(pn, weights=sx * sx, minlength=n)
        scale = max(float(abs(a).max()) if a.nnz else 1.0, float((omega * ss).max()) if n else 1.0, 1e-300)
        delta = 1e-8 * scale
        beta = omega / (delta + omega * ss)
        sel = sp.csr_matrix((sx, (np.arange(p), pn)), shape=(p, n))
        vt = (a @ sel).toarray()  # (q + nc) x n: column n is A' s_n
        schur = (a @ a.T).toarray() - (vt * beta) @ vt.T
        schur /= delta
        schur[np.diag_indices_from(schur)] += delta
        ssolve = symmetric_solver(schur, lower=True)

        def g_apply(v: FloatArray) -> FloatArray:
            dot = np.bincount(pn, weights=sx * v, minlength=n)
            return (v - (beta * dot)[pn] * sx) / delta

        def w_apply(v: FloatArray) -> FloatArray:
            dot = np.bincount(pn, weights=sx * v, minlength=n)
            return np.asarray((omega * dot)[pn] * sx, dtype=np.float64)

        u = np.zeros(p)
        w = np.zeros(q + self.cu.size)
        bnorm = max(float(np.abs(b1).max()) if p else 0.0, float(np.abs(b2).max()) if b2.size else 0.0, 1e-300)
        for _ in range(refine):
            e1 = b1 - w_apply(u) - a.T @ w
            e2 = b2 - a @ u
            if max(float(np.abs(e1).max()) if p else 0.0, float(np.abs(e2).max()) if e2.size else 0.0) <= 1e-14 * bnorm:
                break
            dv = ssolve(a @ g_apply(e1) - e2)
            u, w = u + g_apply(e1 - a.T @ dv), w + dv
        dx = sx * u
        dy = sy * w
        dmu = np.zeros(n)
        dmu[self.cu] = -dy[q:]
        dtot = np.bincount(pn, weights=dx, minlength=n)
        with np.errstate(divide="ignore", invalid="ignore"):
            dmu = np.where(unc, (-f3 - mu * dtot) / tot, dmu)
        return dx, dy[:q], dmu


def _kkt_newton(
    inst: Instance,
    act: np.ndarray,
    pri: np.ndarray,
    capped: np.ndarray,
    x0: FloatArray,
    lam0: FloatArray,
    mu0: FloatArray,
    iters: int = 10,
    rtol: float = 1e-12,
) -> tuple[FloatArray, FloatArray, FloatArray, float, FloatArray]:
    """Newton's method on :class:`_ActiveKkt` from ``(x0, lam0, mu0)``; returns flows ``(N, K)``, prices ``(K, R)``,
    user prices, the final relative residual and each used pair's relative tie residual ``(N, K)``."""
    kkt = _ActiveKkt(inst, act, pri, capped)
    x = x0[kkt.pn, kkt.pk].copy()
    lam = lam0[kkt.qk, kkt.qr].copy()
    mu = mu0.copy()
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # a diverging solve is detected below
        err = kkt.error(x, lam, mu)
        for i in range(iters):
            if not err > rtol:
                break
            dx, dlam, dmu = kkt.newton_step(x, lam, mu)
            if not (np.isfinite(dx).all() and np.isfinite(dlam).all() and np.isfinite(dmu).all()):
                break
            x, lam, mu = x + dx, lam + dlam, mu + dmu
            new = kkt.error(x, lam, mu)
            # Newton converges quadratically on a consistent active set, not on an inconsistent one
            stalled = i >= 2 and new > 0.5 * err
            err = new
            if stalled:
                break
    xf = np.zeros(act.shape)
    xf[kkt.pn, kkt.pk] = x
    lf = np.zeros(pri.shape)
    lf[kkt.qk, kkt.qr] = lam
    ties = np.zeros(act.shape)
    if kkt.p:
        with np.errstate(over="ignore", invalid="ignore"):
            f1 = kkt.residual(x, lam, mu)[0]
            ties[kkt.pn, kkt.pk] = np.abs(f1) / np.maximum(np.abs(mu[kkt.pn]), 1e-300)
    return xf, lf, mu, err, ties


def polish(
    inst: Instance,
    ip: IpmResult,
    *,
    margin: float = 10.0,
    accept: float = 1e-7,
    max_pivots: int = 6,
    rtol: float = 1e-9,
) -> Iterator[FloatArray]:
    """Exact PF-VDS(1) allocations from the interior point ``ip`` (module docstring), best first.

    A pair is taken as used when its share of the user's tasks exceeds ``margin`` times its reduced cost relative to
    its price (at an interior point both are positive and their product is about the duality measure); a pair taken
    for a tie that is not one makes the tie equations inconsistent, so the margin errs on the side of leaving pairs
    out. A resource is taken as priced when its price, in units of the equal-share price, exceeds its relative slack,
    or when it is full to ``1e-7``: a full resource wrongly taken as priced only gets a price near 0.

    After each Newton solve (accepted when every equation holds to ``accept``, relative): pairs with a negative flow
    and resources with a negative price leave; resources loaded above capacity and users over their cap enter;
    capped users whose price exceeds ``phi_n / M_n`` leave the cap. A solve that needs none of these changes is
    yielded; if the caller wants more (its certificate failed), eligible unused pairs cheaper than their user's price
    (``pi[n, k] < mu_n (1 - accept)``) enter and the pivots go on. A solve whose equations cannot be met drops the
    pairs whose tie residual exceeds a tenth of the largest. Stops after ``max_pivots`` solves, when a solve diverges
    or when it asks for many changes (more than ``max(16, 2 %)`` of the used pairs).
    """
    e, d, c = inst.eligible, inst.demands, inst.capacities
    tot = ip.x.sum(axis=1)
    if not (tot > 0).all():
        return
    pi0 = d @ ip.lam.T
    with np.errstate(divide="ignore", invalid="ignore"):
        share = ip.x / tot[:, None]
        rel_cost = ip.z / np.where(e, pi0, 1.0)
        act = e & (share > margin * rel_cost)
        cpos = np.where(c > 0, c, 1.0)
        unit = float(inst.weights.sum()) / max(int((ip.lam > 0).sum()), 1)
        pri = (ip.lam > 0) & ((ip.lam * cpos / unit > ip.s / cpos) | (ip.s < 1e-7 * cpos))
        capped = (
            np.isfinite(inst.max_tasks)
            & (ip.nu * np.where(np.isfinite(inst.max_tasks), inst.max_tasks, 0.0) > inst.weights * 1e-3)
            & (tot >= inst.max_tasks * (1 - 1e-3))
        )
    x0, lam0 = ip.x, ip.lam
    mu0 = inst.weights / tot - ip.nu
    for _ in range(max_pivots):
        if not pri.any() or not act.any():
            return
        x, lam, mu, err, ties = _kkt_newton(inst, act, pri, capped, x0, lam0, mu0)
        if not np.isfinite(err) or err > 1e-2:
            return
        if err > accept:
            act = act & (ties <= 0.1 * ties.max())  # the worst-fitting ties are near-ties: they leave in a batch
            continue
        xt = x.sum(axis=1)
        neg = act & (x < -rtol * np.maximum(xt[:, None], 1e-300))
        negp = pri & (lam < -rtol * np.maximum(np.abs(lam).max(), 1e-300))
        load = np.maximum(x, 0.0).T @ d
        over = ~pri & (load > c * (1 + rtol))
        with np.errstate(divide="ignore"):
            uncap = capped & (mu > inst.weights / inst.max_tasks * (1 + rtol))
        recap = ~capped & (xt > inst.max_tasks * (1 + rtol))
        changes = int(neg.sum() + negp.sum() + over.sum() + uncap.sum() + recap.sum())
        enter = np.zeros_like(act)
        if changes == 0:
            yield np.where(act, np.maximum(x, 0.0), 0.0)
            enter = e & ~act & (d @ lam.T < mu[:, None] * (1 - accept))
            if not enter.any():
                return
        if changes + int(enter.sum()) > max(16, int(0.02 * act.sum())):
            return
        act = (act & ~neg) | enter
        pri = (pri & ~negp) | over
        capped = (capped & ~uncap) | recap
        x0 = np.where(act, np.maximum(x, 0.0), 0.0)
        lam0 = np.maximum(lam, 0.0)
        mu0 = np.where(mu > 0, mu, mu0)
