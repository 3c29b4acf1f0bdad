"""Primal-dual interior-point method for PF-VDS(1) = weighted proportional fairness (paper 002, Theorem 2).

With alpha = 1 the PF-VDS equilibrium maximises ``sum_n phi_n log X_n`` with ``X_n = sum_k x[n, k]`` over the
eligible pairs, subject to the server capacities ``sum_n d[n, r] x[n, k] <= c[k, r]`` (eq. 28's constraints), the task
caps ``X_n <= M_n`` and ``x >= 0`` (see :mod:`allocator.fairness.pfvds`). This module solves that convex program by
Mehrotra's predictor-corrector primal-dual method (Nocedal & Wright, *Numerical Optimization*, 2nd ed., Sec. 14.2 and
19.3), with slacks ``s`` (capacities) and ``t`` (caps) and multipliers ``lambda`` (the prices of eqs. 27-29), ``nu`` and
``z`` (of ``x >= 0``). Stationarity is ``phi_n / X_n - pi[n, k] - nu_n + z[n, k] = 0`` with ``pi[n, k] = sum_r d[n, r]
lambda[k, r]``: at the solution ``z[n, k] = pi[n, k] + nu_n - phi_n / X_n`` is the pair's reduced cost, zero where the
user runs tasks (eq. 29).

The Newton system is solved through its structure. Eliminating ``dz``, ``ds``, ``dt`` and ``dnu`` leaves
``(D + E Phi E^T) dx + A^T dlambda = g1``, ``A dx - S / Lambda dlambda = g2`` with ``D = z / x`` (diagonal over pairs),
``E`` the pair-to-user incidence, ``Phi = phi / X^2 + nu / t`` per user and ``A`` the capacity rows. With ``y = Phi E^T
dx`` the remaining unknowns ``(y, dlambda)`` satisfy ``[[G, U^T], [U, B]]``, where ``G = E^T D^-1 E + Phi^-1`` is
diagonal (one entry per user), ``B = A D^-1 A^T + S / Lambda`` is block diagonal (one ``R x R`` block per server) and
``U = A D^-1 E`` is ``(K R) x N``. Eliminating ``dlambda`` gives the dense ``N x N`` system
``(G - U^T B^-1 U) y = ...``: one symmetric product and one Cholesky factorisation per iteration, both reused by the
corrector.

The iteration stops at a relative duality measure ``tol`` (default ``1e-9``); the result is a strictly interior,
near-optimal point whose ``x / z`` and ``lambda / s`` ratios identify the active set for the exact finish of
:mod:`allocator.fairness.pfvds._pfpolish`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.linalg as sla

from .._model import FloatArray, Instance
from ..kernels import load as load_kernels


@dataclass(frozen=True)
class IpmResult:
    """Interior point after :func:`proportional_fair_ipm`: flows ``x`` ``(N, K)`` and reduced costs ``z`` (0 off the
    eligible pairs), prices ``lam`` and capacity slacks ``s`` ``(K, R)`` (0 for resources no eligible user needs),
    cap multipliers ``nu`` ``(N,)``, iterations, the final duality measure relative to ``mean(phi)`` and the largest
    relative primal/dual residual."""

    x: FloatArray
    z: FloatArray
    lam: FloatArray
    s: FloatArray
    nu: FloatArray
    iterations: int
    gap: float
    infeasibility: float


def symmetric_solver(mat: FloatArray, *, lower: bool) -> Callable[[FloatArray], FloatArray]:
    """``v -> mat^-1 v`` for a symmetric matrix given by its ``lower`` (or upper) triangle: Cholesky, or LU of the
    full matrix in double precision when Cholesky fails or loses the last pivot (a nearly singular system)."""
    try:
        fac = sla.cho_factor(mat, lower=lower, check_finite=False)
        if not np.isfinite(fac[0][-1, -1]):
            raise np.linalg.LinAlgError("factor lost")
    except np.linalg.LinAlgError:
        tri = np.tril(mat) if lower else np.triu(mat)
        lu = sla.lu_factor((tri + tri.T - np.diag(np.diag(mat))).astype(np.float64), check_finite=False)
        return lambda v: np.asarray(sla.lu_solve(lu, v, check_finite=False), dtype=np.float64)
    return lambda v: np.asarray(sla.cho_solve(fac, v.astype(fac[0].dtype), check_finite=False), dtype=np.float64)


class _Structure:
    """Index arrays of one instance: eligible pairs ``(pn, pk)``, needed resources, task caps."""

    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        self.n, self.k, self.r = inst.n, inst.k, inst.r
        self.pn, self.pk = np.nonzero(inst.eligible)
        self.dp = inst.demands[self.pn]  # (P, R)
        self.c = inst.capacities
        self.need = (inst.eligible.T.astype(np.float64) @ (inst.demands > 0).astype(np.float64)) > 0
        self.capped = np.isfinite(inst.max_tasks)
        self.m = np.where(self.capped, inst.max_tasks, 1.0)
        self.phi = inst.weights

    def tot(self, x: FloatArray) -> FloatArray:
        return np.asarray(load_kernels().user_sum(self.pn, np.ascontiguousarray(x), self.n))

    def load(self, x: FloatArray) -> FloatArray:
        """``A x`` as ``(K, R)``."""
        return np.asarray(load_kernels().pair_load(self.pk, self.dp, np.ascontiguousarray(x), self.k))

    def price(self, lam: FloatArray) -> FloatArray:
        """``A^T lambda``: ``pi[n, k]`` per pair."""
        return np.asarray(load_kernels().pair_price(self.pk, self.dp, np.ascontiguousarray(lam)))


@dataclass
class _Point:
    """Primal ``x`` (pairs), ``s`` (capacity slacks), ``t`` (cap slacks) and dual ``z`` (pairs), ``lam`` (prices),
    ``nu`` (caps) of one iterate, or a direction in the same variables."""

    x: FloatArray
    s: FloatArray
    t: FloatArray
    z: FloatArray
    lam: FloatArray
    nu: FloatArray


class _Newton:
    """The Newton system of one iterate (module docstring), factorised once for the predictor and the corrector."""

    def __init__(
        self,
        st: _Structure,
        p: _Point,
        tot: FloatArray,
        rd: FloatArray,
        rp: FloatArray,
        ru: FloatArray,
        gap: float,
        reg: float,
        refine: int,
    ) -> None:
        self.st, self.p = st, p
        self.rd, self.rp, self.ru = rd, rp, ru
        self.refine = refine if gap < 1e-6 else 0
        n, k, r = st.n, st.k, st.r
        need, capped = st.need, st.capped
        self.phiu = st.phi / tot**2 + np.where(capped, p.nu / p.t, 0.0)
        # primal regularisation: D + reg * Phi keeps the directions in which users could trade tasks around a cycle
        # (flat for the objective and the constraints) bounded; refinement is against the unregularised system
        self.dinv = 1.0 / (p.z / p.x + reg * self.phiu[st.pn])
        # B = A D^-1 A^T + S / Lambda (blocks), U = A D^-1 E ((K R) x N), G = E^T D^-1 E + 1 / Phi
        blocks = load_kernels().server_blocks(st.pk, st.dp, self.dinv, k)
        self.sl = np.where(need, p.s / np.where(need, p.lam, 1.0), 0.0)
        blocks[:, np.arange(r), np.arange(r)] += self.sl + np.where(need, 0.0, 1.0)
        self.binv = np.linalg.inv(blocks)
        # U^T B^-1 U = W^T W with W = C^-1 U, B = C C^T per server: one symmetric rank-k update (half a product)
        wmat = load_kernels().scaled_coupling(st.pn, st.pk, st.dp, self.dinv, np.linalg.cholesky(blocks), n).T
        # far from the solution single precision is enough for the direction (and twice as fast), unless a task cap
        # is close to binding: its slack enters K only through the small 1 / Phi term, which single precision loses
        # against the large D^-1 terms it is added to (observed: the iteration then leaves the cap, then stalls)
        if gap > 1e-4 and not capped.any():
            kmat = -sla.blas.ssyrk(1.0, wmat.astype(np.float32), trans=1)
        else:
            kmat = -sla.blas.dsyrk(1.0, wmat, trans=1)  # upper triangle of W^T W
        kmat[np.diag_indices(n)] += st.tot(self.dinv) + 1.0 / self.phiu
        self._ksolve = symmetric_solver(kmat, lower=False)

    def _bsolve(self, v: FloatArray) -> FloatArray:
        return np.einsum("kab,kb->ka", self.binv, v.reshape(self.st.k, self.st.r))

    def _reduced(self, g1: FloatArray, g2: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Solve ``(D + E Phi E^T) dx + A^T dlam = g1``, ``A dx - S / Lambda dlam = g2`` (module docstring)."""
        st, dinv = self.st, self.dinv
        h1, h2 = load_kernels().user_and_load(st.pn, st.pk, st.dp, dinv * g1, st.n, st.k)
        h2 -= g2
        b_h2 = self._bsolve(h2)
        y = self._ksolve(h1 - load_kernels().coupling_t(st.pn, st.pk, st.dp, dinv, b_h2, st.n))
        dlam = np.where(st.need, self._bsolve(h2 - load_kernels().coupling(st.pn, st.pk, st.dp, dinv, y, st.k)), 0.0)
        return load_kernels().pair_step(st.pn, st.pk, st.dp, dinv, g1, y, dlam), dlam

    def direction(self, rxz: FloatArray, rsl: FloatArray, rtn: FloatArray) -> _Point:
        """Newton direction for the complementarity right-hand sides of ``x z``, ``s lambda`` and ``t nu``."""
        st, p = self.st, self.p
        need, capped, pn = st.need, st.capped, st.pn
        g2 = np.where(need, self.rp - rsl / np.where(need, p.lam, 1.0), 0.0)
        g3 = np.where(capped, self.ru - rtn / np.where(capped, p.nu, 1.0), 0.0)
        g1 = self.rd + rxz / p.x + np.where(capped, p.nu / p.t * g3, 0.0)[pn]
        dx, dlam = self._reduced(g1, g2)
        for _ in range(self.refine):
            # iterative refinement against the unreduced equations (the Schur complement cancels digits)
            e1 = g1 - (p.z / p.x) * dx - (self.phiu * st.tot(dx))[pn] - st.price(dlam)
            e2 = np.where(need, g2 - st.load(dx) + self.sl * dlam, 0.0)
            ddx, ddl = self._reduced(e1, e2)
            dx, dlam = dx + ddx, dlam + ddl
        dt = np.where(capped, self.ru - st.tot(dx), 0.0)
        return _Point(
            x=dx,
            s=np.where(need, (rsl - p.s * dlam) / np.where(need, p.lam, 1.0), 0.0),
            t=dt,
            z=(rxz - p.z * dx) / p.x,
            lam=dlam,
            nu=np.where(capped, (rtn - p.nu * dt) / p.t, 0.0),
        )

    def steps(self, d: _Point) -> tuple[float, float]:
        """Largest primal and dual steps in ``[0, 1]`` keeping every positive variable non-negative."""
        p, need, capped = self.p, self.st.need, self.st.capped

        def most(pairs: list[tuple[FloatArray, FloatArray]]) -> float:
            max_step = load_kernels().max_step
            return min([1.0] + [float(max_step(np.ascontiguousarray(v), np.ascontiguousarray(w))) for v, w in pairs])

        primal = most([(p.x, d.x), (p.s[need], d.s[need]), (p.t[capped], d.t[capped])])
        dual = most([(p.z, d.z), (p.lam[need], d.lam[need]), (p.nu[capped], d.nu[capped])])
        return primal, dual

    def moved(self, d: _Point, ap: float, ad: float) -> _Point:
        p, need, capped = self.p, self.st.need, self.st.capped
        return _Point(
            x=p.x + ap * d.x,
            s=np.where(need, p.s + ap * d.s, 1.0),
            t=np.where(capped, p.t + ap * d.t, 1.0),
            z=p.z + ad * d.z,
            lam=np.where(need, p.lam + ad * d.lam, 0.0),
            nu=np.where(capped, p.nu + ad * d.nu, 0.0),
        )


def _complementarity(p: _Point, need: np.ndarray, capped: np.ndarray) -> float:
    return float(p.x @ p.z) + float((p.s * p.lam)[need].sum()) + float((p.t * p.nu)[capped].sum())


STALL_ITERATIONS = 10
""":func:`proportional_fair_ipm` stops after this many iterations without a new best iterate once ``max(gap,
residual)`` is below ``1e-9``, and after this many without halving ``max(gap, residual)`` once the duality measure
alone is below its tolerance."""


def proportional_fair_ipm(
    inst: Instance,
    *,
    tol: float = 1e-9,
    max_iter: int = 100,
    refine: int | None = None,
    reg: float = 1e-8,
) -> IpmResult:
    """Mehrotra predictor-corrector on ``max sum_n phi_n log X_n`` s.t. capacities, placement, ``max_tasks``.

    Stops when the duality measure ``mean(x z, s lambda, t nu) / mean(phi)`` is below ``tol`` and the relative
    residuals below ``10 tol``, or when rounding takes over (below ``1e-6``, the larger of the two grows a
    thousandfold over the best seen; or it stalls, see :data:`STALL_ITERATIONS`); returns
    the best iterate (smallest ``max(gap, residual)``). ``reg`` is the relative primal regularisation and ``refine``
    the number of iterative-refinement steps per direction once the measure is below ``1e-6``; by default 2 on
    instances with task caps (a cap's slack enters the reduced system only through the small ``1 / Phi`` term, whose
    digits the Schur complement cancels: without refinement a binding cap stalled the iteration at a residual of
    4e-6) and 0 otherwise (measured at 1000 x 500 x 3 without caps: the same iterations to a duality measure of
    1e-14 with or without it, and refinement adds a quarter to each iteration's time).
    """
    st = _Structure(inst)
    if refine is None:
        refine = 2 if st.capped.any() else 0
    n, k = st.n, st.k
    pn, pk = st.pn, st.pk
    need, capped, phi = st.need, st.capped, st.phi
    c = np.where(need, st.c, 1.0)
    nrow = int(need.sum())
    npair = pn.size
    count = npair + nrow + int(capped.sum())
    phibar = float(phi.mean())
    # start: half the weighted equal share (strictly feasible), at most half of each task cap
    wsum = np.bincount(pk, weights=phi[pn], minlength=k)
    x = 0.5 * phi[pn] / wsum[pk] * inst.gamma[pn, pk]
    tot = st.tot(x)
    if capped.any():  # users over half their cap are scaled down to it (the others keep their share)
        over = np.maximum(np.where(capped, tot / (0.5 * st.m), 0.0), 1.0)
        x = x / over[pn]
        tot = st.tot(x)
    s = np.where(need, c - st.load(x), 1.0)
    t = np.where(capped, st.m - tot, 1.0)
    # prices proportional to 1 / c, scaled so every pair costs at least twice its user's marginal utility: then
    # z = pi - phi / X > 0 makes the start dual feasible
    lam = np.where(need, 1.0 / c, 0.0)
    lam = lam * (2.0 * float(np.max((phi / tot)[pn] / st.price(lam))) if npair else 1.0)
    nu = np.where(capped, float(np.mean(s[need] * lam[need])) / t if nrow else phibar / t, 0.0)
    cur = _Point(x=x, s=s, t=t, z=st.price(lam) + nu[pn] - (phi / tot)[pn], lam=lam, nu=nu)
    it = 0
    best: tuple[float, int, float, float, _Point] = (np.inf, 0, np.inf, np.inf, cur)
    halved = (np.inf, 0)  # last iterate whose max(gap, residual) was below half the previous such value
    for it in range(1, max_iter + 1):
        tot = st.tot(cur.x)
        pi = st.price(cur.lam)
        rd = (phi / tot)[pn] - pi - cur.nu[pn] + cur.z  # stationarity residual (0 at the solution)
        rp = np.where(need, c - st.load(cur.x) - cur.s, 0.0)
        ru = np.where(capped, st.m - tot - cur.t, 0.0)
        mu = _complementarity(cur, need, capped) / count
        gap = mu / phibar
        infeas = max(
            float(np.abs(rd / np.maximum(pi + cur.nu[pn], 1e-300)).max()) if npair else 0.0,
            float(np.abs(rp / c).max()) if nrow else 0.0,
            float(np.abs(ru / st.m).max()) if capped.any() else 0.0,
        )
        if max(gap, infeas) < best[0]:
            best = (max(gap, infeas), it, gap, infeas, cur)
        if max(gap, infeas) < 0.5 * halved[0]:
            halved = (max(gap, infeas), it)
        if gap <= tol and infeas <= 10 * tol:
            break
        if best[0] < 1e-6 and max(gap, infeas) > 1e3 * best[0]:
            break  # rounding has taken over (the Schur complement loses accuracy once x z is tiny)
        if best[0] < 1e-9 and it - best[1] >= STALL_ITERATIONS:
            break  # no progress below 1e-9 for a while: the tolerance is below what rounding allows here
        if gap <= tol and it - halved[1] >= STALL_ITERATIONS:
            break  # the duality measure is done but a residual stalls (observed under a binding task cap)
        newton = _Newton(st, cur, tot, rd, rp, ru, gap, reg, refine)
        # predictor (affine scaling)
        aff = newton.direction(-cur.x * cur.z, -cur.s * cur.lam, -cur.t * cur.nu)
        mu_aff = _complementarity(newton.moved(aff, *newton.steps(aff)), need, capped) / count
        sigma = min(1.0, (mu_aff / mu) ** 3)
        # corrector (centring + second-order term)
        cor = newton.direction(
            sigma * mu - cur.x * cur.z - aff.x * aff.z,
            np.where(need, sigma * mu - cur.s * cur.lam - aff.s * aff.lam, 0.0),
            np.where(capped, sigma * mu - cur.t * cur.nu - aff.t * aff.nu, 0.0),
        )
        alpha = min(newton.steps(cor))
        # no user's total may change by more than itself: phi log X is self-concordant, and its linearisation
        # phi / X - phi / X^2 dX (in the dual residual) is only trusted inside that Dikin interval
        dtot = np.abs(st.tot(cor.x))
        big = dtot > 0
        if big.any():
            alpha = min(alpha, float(np.min(tot[big] / dtot[big])))
        # one step length for all variables: the objective is not linear, so the dual residual's linearisation
        # holds only when primal and dual move together
        a = min(1.0, 0.995 * alpha)
        cur = newton.moved(cor, a, a)
    _, it, gap, infeas, cur = best
    xf = np.zeros((n, k))
    xf[pn, pk] = cur.x
    zf = np.zeros((n, k))
    zf[pn, pk] = cur.z
    return IpmResult(
        x=xf,
        z=zf,
        lam=cur.lam,
        s=np.where(need, cur.s, 0.0),
        nu=cur.nu,
        iterations=it,
        gap=gap,
        infeasibility=infeas,
    )
