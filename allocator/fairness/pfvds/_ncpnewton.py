"""Exact finish for PF-VDS(alpha), any alpha: a semismooth Newton method on the equilibrium NCP (paper 002, eqs. 28-29).

The equilibrium conditions are a nonlinear complementarity problem in the flows ``x[n, k]`` of the eligible pairs,
the prices ``lambda[k, r]`` and, for users with a task cap, the cap multipliers ``nu_n`` (Sec. 4.2, eq. 32):

- ``0 <= x[n, k]  _|_  (pi[n, k] + nu_n) / g[n, k] - 1 >= 0`` (eq. 29, divided by ``g > 0``),
- ``0 <= lambda[k, r]  _|_  1 - load[k, r] / c[k, r] >= 0`` (eq. 28),
- ``0 <= nu_n  _|_  1 - X_n / M_n >= 0`` (the cap; the shared multiplier of :func:`allocator.fairness.kkt_residual`),

with ``pi[n, k] = lambda[k] . d[n]`` and ``g[n, k] = phi_n^alpha gamma[n, k]^(alpha - 1) X_n^(-alpha)`` (eq. 59).
Dividing each component by a positive number does not change the solution set, so the pairs are written scale free
(flows in units of ``gamma[n, k]``, prices in units fixed at the start). With the Fischer-Burmeister function
``phi_FB(a, b) = a + b - sqrt(a^2 + b^2)`` (eq. 33: ``phi_FB = 0`` iff ``a, b >= 0`` and ``a b = 0``) the NCP is the
square system ``Phi(z) = 0`` (eq. 34), and ``Psi = |Phi|^2 / 2`` is the merit function of Sec. 4.3 (continuously
differentiable although ``Phi`` is not).

:func:`ncp_newton` is the semismooth Newton method of De Luca, Facchinei and Kanzow (Math. Programming 75, 1996):
a Newton step on ``Phi`` with an element of its generalised Jacobian, accepted when it is a sufficient descent
direction of ``Psi``, otherwise the steepest-descent direction ``-grad Psi``; an Armijo search on ``Psi``. Every
limit point is a stationary point of ``Psi`` and, near a solution where the Jacobian is regular, convergence is
quadratic. Stationary points of ``Psi`` solve the NCP when its function is a P0 function, which this game's is not
in general (see :mod:`allocator.fairness.pfvds`), so the caller accepts the result only through
:func:`allocator.fairness.kkt_residual`. It is started from the best-response sweeps' iterate, where it takes the
place of the slow tail of those sweeps. The Jacobian is dense, so it is meant for instances with up to a few thousand
eligible pairs (the node pools of one planning round after identical nodes are merged).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from .._model import FloatArray, Instance, log_marginal


@dataclass(frozen=True)
class NcpNewtonResult:
    """Outcome of :func:`ncp_newton`: feasible flows ``x`` ``(n, k)`` (clipped at 0 and scaled into the
    capacities), the prices ``lam`` ``(k, r)`` of the last iterate (clipped at 0; a witness for
    :func:`allocator.fairness.kkt_residual`), the final merit ``Psi`` and the Newton iterations taken."""

    x: FloatArray
    lam: FloatArray
    merit: float
    iterations: int


def _fb(a: FloatArray, b: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``phi_FB(a, b)`` and its partial derivatives ``1 - a / r``, ``1 - b / r`` (``r = sqrt(a^2 + b^2)``; at
    ``a = b = 0`` the generalised-Jacobian element ``1 - 1 / sqrt(2)`` for both)."""
    r = np.hypot(a, b)
    safe = r > 1e-300
    rs = np.where(safe, r, 1.0)
    da = np.where(safe, 1.0 - a / rs, 1.0 - np.sqrt(0.5))
    db = np.where(safe, 1.0 - b / rs, 1.0 - np.sqrt(0.5))
    return a + b - r, da, db


class _System:
    """``Phi`` and its Jacobian for one instance (module docstring). Unknowns ``z = [u, l, v]``: ``u`` the flows of
    the eligible pairs in units of ``gamma``, ``l`` the prices of the demanded resources in units ``scale``, ``v`` the
    cap multipliers of the capped users in units of their users' start price."""

    def __init__(self, inst: Instance, alpha: float, lam_scale: FloatArray, nu_scale: FloatArray) -> None:
        self.inst, self.alpha = inst, alpha
        e, d, c = inst.eligible, inst.demands, inst.capacities
        self.pn, self.pk = np.nonzero(e)
        self.gam = inst.gamma[self.pn, self.pk]
        self.rk, self.rr = np.nonzero(c > 0)
        self.cq = c[self.rk, self.rr]
        self.lscale = lam_scale
        self.cu = np.flatnonzero(np.isfinite(inst.max_tasks))
        self.vscale = nu_scale
        self.p, self.q, self.m = self.pn.size, self.rk.size, self.cu.size
        with np.errstate(divide="ignore"):
            self.logw = alpha * np.log(inst.weights)[self.pn] + (alpha - 1.0) * np.log(self.gam)
        # D[j, i] = d[n_j, r_i] if pair j is on resource i's server, else 0
        self.dmat = np.where(self.pk[:, None] == self.rk[None, :], d[self.pn][:, self.rr], 0.0)
        self.user = np.zeros((inst.n, self.p))
        self.user[self.pn, np.arange(self.p)] = 1.0
        cpos = np.full(inst.n, -1)
        cpos[self.cu] = np.arange(self.m)
        self.cpos = cpos

    def split(self, z: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        return z[: self.p], z[self.p : self.p + self.q], z[self.p + self.q :]

    def evaluate(self, z: FloatArray, jac: bool) -> tuple[FloatArray, FloatArray | None] | None:
        """``(Phi(z), J(z))`` (``J`` only if ``jac``), or ``None`` where a user's total is not positive."""
        u, lv, vv = self.split(z)
        x = u * self.gam
        tot = self.user @ x
        if not (tot > 0).all():
            return None
        lam = lv * self.lscale
        nu = np.zeros(self.inst.n)
        nu[self.cu] = vv * self.vscale
        inv_g = np.exp(self.alpha * np.log(tot)[self.pn] - self.logw)  # 1 / g[n, k]
        price = self.dmat @ lam + nu[self.pn]
        f_pair = price * inv_g - 1.0
        load = self.dmat.T @ x
        f_res = 1.0 - load / self.cq
        caps = self.inst.max_tasks[self.cu]
        f_cap = 1.0 - tot[self.cu] / caps
        p1, a1, b1 = _fb(u, f_pair)
        p2, a2, b2 = _fb(lv, f_res)
        p3, a3, b3 = _fb(vv, f_cap)
        phi = np.concatenate([p1, p2, p3])
        if not jac:
            return phi, None
        p, q, m = self.p, self.q, self.m
        jm = np.zeros((p + q + m, p + q + m))
        # pair rows: d f_pair[j] / d u[j'] = alpha (f_pair[j] + 1) / X_n gamma[j'] for j' of the same user
        same = self.pn[:, None] == self.pn[None, :]
        dfu = np.where(same, (self.alpha * (f_pair + 1.0) / tot[self.pn])[:, None] * self.gam[None, :], 0.0)
        jm[:p, :p] = b1[:, None] * dfu
        jm[np.arange(p), np.arange(p)] += a1
        jm[:p, p : p + q] = (b1 * inv_g)[:, None] * self.dmat * self.lscale[None, :]
        if m:
            onc = self.cpos[self.pn] >= 0
            rows = np.flatnonzero(onc)
            jm[rows, p + q + self.cpos[self.pn[rows]]] = b1[rows] * inv_g[rows] * self.vscale[self.cpos[self.pn[rows]]]
        # resource rows: d f_res[i] / d u[j] = -D[j, i] gamma[j] / c[i]
        jm[p : p + q, :p] = b2[:, None] * (-(self.dmat * self.gam[:, None]).T / self.cq[:, None])
        jm[np.arange(p, p + q), np.arange(p, p + q)] += a2
        if m:
            # cap rows: d f_cap / d u[j] = -gamma[j] / M_n for the user's pairs
            cu_rows = self.user[self.cu] * self.gam[None, :] / caps[:, None]
            jm[p + q :, :p] = b3[:, None] * (-cu_rows)
            jm[np.arange(p + q, p + q + m), np.arange(p + q, p + q + m)] += a3
        return phi, jm


def _start_prices(inst: Instance, x: FloatArray, alpha: float) -> FloatArray:
    """Per-server NNLS fit of the marginal utilities of the used pairs on the saturated resources (as
    :func:`allocator.fairness.kkt_residual` does), ``(k, r)``."""
    tot = x.sum(axis=1)
    lam = np.zeros(inst.capacities.shape)
    load = x.T @ inst.demands
    lg = log_marginal(inst, tot, alpha)
    for k in range(inst.k):
        idx = np.flatnonzero(inst.eligible[:, k] & (x[:, k] > 1e-6 * tot))
        sat = (inst.capacities[k] > 0) & (load[k] >= inst.capacities[k] * (1 - 1e-6))
        if idx.size == 0 or not sat.any():
            continue
        shift = float(lg[idx, k].max())  # NNLS is homogeneous: fit exp(lg - shift), scale back
        with np.errstate(over="ignore"):
            fit = nnls(inst.demands[idx][:, sat], np.exp(lg[idx, k] - shift))[0] * np.exp(shift)
        lam[k, sat] = np.where(np.isfinite(fit), fit, 0.0)
    return lam


def ncp_newton(
    inst: Instance,
    alpha: float,
    x0: FloatArray,
    *,
    lam0: FloatArray | None = None,
    units: str = "mean",
    tol: float = 1e-24,
    max_iter: int = 80,
) -> NcpNewtonResult:
    """Semismooth Newton (De Luca-Facchinei-Kanzow) on ``Phi = 0`` from ``x0`` (module docstring).

    Prices start at ``lam0`` ``(k, r)`` or at the per-server NNLS fit of the marginal utilities. ``units`` fixes the
    price unit of each resource, i.e. how the complementarity ``lambda _|_ slack`` is scaled: ``"mean"`` (the mean
    ``g[n, k]`` of the server's users over their mean demand; well conditioned, the better global behaviour) or
    ``"min"`` (the smallest ``g[n, k] / d[n, r]``: a price that is small in these units changes every user's
    relative reduced cost ``pi / g - 1`` by as little, which is what the certificate measures; with alpha = 20 the
    users' marginal utilities span orders of magnitude and a mean-unit solution can leave a price that matters to
    the users with the smallest ``g``). Either is a positive rescaling, so the solutions are the same.

    Stops when ``Psi <= tol``, when no step decreases ``Psi`` or after ``max_iter`` iterations. The result is clipped
    at 0, scaled into the task caps and the capacities (rows, then columns: both only shrink it, so it is feasible),
    and a server within 1e-6 of full that serves no capped user is made exactly full; it must be certified by
    :func:`allocator.fairness.kkt_residual`.
    """
    if units not in ("mean", "min"):
        raise ValueError(f"units must be 'mean' or 'min', got {units!r}")
    x0 = np.where(inst.eligible, np.maximum(np.asarray(x0, dtype=np.float64), 0.0), 0.0)
    tot0 = x0.sum(axis=1)
    if not (np.isfinite(x0).all() and (tot0 > 0).all()):
        raise ValueError("ncp_newton needs a finite start where every user has tasks")
    lam_start = _start_prices(inst, x0, alpha) if lam0 is None else np.maximum(lam0, 0.0)
    c = inst.capacities
    rk, rr = np.nonzero(c > 0)
    gmean = np.exp(log_marginal(inst, tot0, alpha))  # 0 where not eligible
    d = inst.demands
    e = inst.eligible
    if units == "mean":
        count = np.maximum(e.sum(axis=0), 1)
        served = np.asarray(e.any(axis=0), dtype=bool)
        g_server = np.where(served, (gmean * e).sum(axis=0) / count, 1.0)
        d_server = np.where(served[:, None], (e.T @ d) / count[:, None], 1.0)
        unit = g_server[:, None] / np.maximum(d_server, 1e-300)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(e[:, :, None] & (d[:, None, :] > 0), gmean[:, :, None] / d[:, None, :], np.inf)
        unit = ratio.min(axis=0)  # (k, r)
    lscale = np.where(np.isfinite(unit[rk, rr]) & (unit[rk, rr] > 0), unit[rk, rr], 1.0)
    cu = np.flatnonzero(np.isfinite(inst.max_tasks))
    vscale = np.array([float(np.mean(gmean[n, inst.eligible[n]])) for n in cu]) if cu.size else np.zeros(0)
    sysm = _System(inst, alpha, lscale, vscale)
    z = np.concatenate(
        [
            x0[sysm.pn, sysm.pk] / sysm.gam,
            lam_start[rk, rr] / lscale,
            np.zeros(cu.size),
        ]
    )
    got = sysm.evaluate(z, jac=True)
    assert got is not None
    phi, jm = got
    psi = 0.5 * float(phi @ phi)
    steps = 0
    while psi > tol and jm is not None and steps < max_iter:
        grad = jm.T @ phi
        try:
            with np.errstate(over="ignore", invalid="ignore"):  # a near-singular Jacobian is caught just below
                step = np.linalg.solve(jm, -phi)
                # DFK's test: the Newton direction must be a sufficient descent direction of Psi
                ok = bool(np.all(np.isfinite(step))) and grad @ step <= -1e-10 * float(step @ step) ** 1.05
        except np.linalg.LinAlgError:
            ok = False
        if not ok:
            step = -grad
        slope = float(grad @ step)
        t = 1.0
        accepted = False
        for _ in range(50):
            cand = z + t * step
            trial = sysm.evaluate(cand, jac=False)
            if trial is not None:
                tphi = trial[0]
                tpsi = 0.5 * float(tphi @ tphi)
                if tpsi <= psi + 1e-4 * t * slope:
                    accepted = True
                    break
            t *= 0.5
        if not accepted:
            break
        steps += 1
        z = cand
        got = sysm.evaluate(z, jac=True)
        assert got is not None
        phi, jm = got
        psi = 0.5 * float(phi @ phi)
    u = np.maximum(z[: sysm.p], 0.0)
    x = np.zeros(x0.shape)
    x[sysm.pn, sysm.pk] = u * sysm.gam
    tot = x.sum(axis=1)
    x = x / np.maximum(tot / inst.max_tasks, 1.0)[:, None]  # a capped user over its cap by rounding is scaled to it
    load = x.T @ inst.demands
    with np.errstate(divide="ignore", invalid="ignore"):
        worst = np.max(np.where(c > 0, load / np.where(c > 0, c, 1.0), 0.0), axis=1)
    # a server within 1e-6 of full is made exactly full (at the equilibrium every server that serves an uncapped
    # user is; the last Newton step leaves ~|Phi| of slack), unless that could push a capped user over its cap
    has_capped = (inst.eligible & np.isfinite(inst.max_tasks)[:, None]).any(axis=0)
    fill = (worst > 1.0) | ((worst > 1.0 - 1e-6) & ~has_capped & (worst > 0))
    x = x / np.where(fill, worst, 1.0)[None, :]
    lam = np.zeros(c.shape)
    lam[rk, rr] = np.maximum(z[sysm.p : sysm.p + sysm.q], 0.0) * lscale
    return NcpNewtonResult(x=x, lam=lam, merit=psi, iterations=steps)
