"""PF-VDS(alpha): alpha-proportional fairness on virtual dominant shares (paper 002, Problem 1, Sec. 3.2, 4, 5).

Server ``k`` chooses its column to maximise ``sum_{n in N_k} phi_n U_alpha(x_n / (phi_n gamma[n, k]))`` subject to its
capacities (eqs. 12-15), ``U_alpha(y) = y^(1-alpha)/(1-alpha)`` (``log y`` for alpha = 1), taking the other columns as
given; the solution concept is the Nash equilibrium of this concave game. Its KKT conditions (eqs. 23-29) are, with
``pi[n, k] = sum_r lambda[k, r] d[n, r]`` and the marginal utility ``g[n, k] = phi_n^alpha gamma[n, k]^(alpha-1)
x_n^(-alpha)`` (eq. 59):

- ``0 <= lambda[k, r]  _|_  c[k, r] - sum_n x[n, k] d[n, r] >= 0`` (eq. 28),
- ``0 <= x[n, k]  _|_  pi[n, k] - g[n, k] >= 0`` (eq. 29).

:func:`kkt_residual` measures these conditions for any allocation, recovering ``lambda`` per server by non-negative
least squares on the saturated resources, so it checks the solvers below independently of their internals.

Centralised solver (:func:`pf_vds`): one method per instance class, chosen up front by :func:`pf_vds_route` (not a
chain of fallbacks); whatever the route, the result is reported ``converged`` only if :func:`kkt_residual` certifies it.

================================  ======================  ==========================================================
instance class                    route (``method``)      why
================================  ======================  ==========================================================
alpha = 1, no start ``x0``        ``"ipm"``:              the equilibrium maximises ``sum_n phi_n log x_n`` over the
                                  interior point, then    capacities (Theorem 2), a convex program; the primal-dual
                                  its exact active-set    interior point (:mod:`.ipm`, Mehrotra) reaches a duality
                                  finish (``"ipm"``,      measure of :data:`IPM_TOL` in 30-110 iterations up to
                                  ``"ipm+kkt"``)          1000 x 500 and its point meets the certificate there
                                                          (``"ipm"``). Under a binding task cap its stationarity can
                                                          stall at ~4e-6; the exact KKT equations on the active set
                                                          its indicators reveal (:mod:`._pfpolish`) then certify
                                                          (``"ipm+kkt"``). Both read the same interior point.
alpha != 1 (or a start ``x0``),   ``"sweeps+newton"``:    no convergence proof for the sweeps in general (below), but
NCP unknowns <=                   best-response sweeps    they find the region; the equilibrium NCP (eqs. 28-29,
:data:`NEWTON_MAX_UNKNOWNS`       + semismooth Newton     Fischer-Burmeister form of Sec. 4.2, :mod:`._ncpnewton`) is
(a planning round's pools)        from their iterates     locally quadratic from there. A dense Newton step of this
                                  (``"sweeps"``,          order costs at most ~0.1 s. Newton starts after the sweep
                                  ``"sweeps+newton"``,    counts :data:`NEWTON_AFTER`; when the sweeps drift (same
                                  ``"sweeps+drift+        step every sweep, residual flat) on at most
                                  newton"``)              :data:`DRIFT_MAX_UNKNOWNS` unknowns also from points down
                                                          the drift (:func:`_along`), where Newton from the iterate
                                                          was seen to stall. 200 of 200 sampled instances certified
                                                          (``docs/bench/fairness.md``).
alpha != 1 (or ``x0``), larger    ``"sweeps"``:           a dense Newton step would be too large; the sweeps
                                  best-response sweeps    converge where the game is a (weighted) potential game
                                  alone                   (alpha = 1, or ``gamma`` factorising: below) and are
                                                          otherwise reported ``capped`` if not certified after
                                                          ``max_sweeps``.
================================  ======================  ==========================================================

PS-MFA (:func:`allocator.fairness.pfvds.psmfa.ps_mfa`, Sec. 5.1, Algorithm I), the method that carries the convergence
theorem, is not a route: measured, it is first order and slow (minutes at 40 x 250), and none of the 200 sampled
instances needed it; it stays available as a function. Until 2026-11-25 :func:`pf_vds` tried up to eight stages in turn
(interior point, two active-set margins, sweeps from the interior point, Newton, drift Newton, PS-MFA).

Why the best-response sweeps converge:

- alpha = 1: server ``k``'s objective equals ``Phi(x) = sum_n phi_n log x_n`` up to a constant independent of its
  column, so the game is an exact potential game and the iteration is block-coordinate ascent on the concave,
  continuously differentiable ``Phi`` over a product of compact convex sets (one polytope per server). Each block
  maximiser is unique because ``Phi`` is strictly concave in the column (one strictly concave term per user). By
  Bertsekas, *Nonlinear Programming* (2nd ed.), Prop. 2.7.1, every limit point is a maximiser of ``Phi``, i.e. the
  weighted proportionally fair allocation, which by Theorem 2 is the PF-VDS(1) equilibrium. Iterates stay in the
  level set ``{Phi >= Phi(x0)}`` where every ``x_n`` is bounded away from 0, so ``Phi`` is smooth there.
- alpha != 1 with a factorising ``gamma[n, k] = a_n b_k`` on the eligible pairs (one resource; or one resource that is
  every user's dominant resource on every node, the bottleneck setting of Theorem 4): server ``k``'s objective is
  ``b_k^(alpha-1)`` times the common concave potential ``sum_n phi_n^alpha a_n^(alpha-1) U_alpha(x_n)``, so the game is
  a weighted potential game and the argument for alpha = 1 applies verbatim: best response converges.
- alpha != 1 in general: **no convergence proof for the method implemented here.** The pseudo-gradient of the game is
  ``F[n, k] = -w[n, k] x_n^(-alpha)`` with ``w[n, k] = phi_n^alpha gamma[n, k]^(alpha-1)``; for one user its Jacobian
  block is ``alpha x_n^(-alpha-1) w[n, .] 1^T``, whose symmetric part ``(w 1^T + 1 w^T) / 2`` has the negative
  eigenvalue ``(w . 1 - |w| |1|) / 2`` unless ``w[n, .]`` is constant over the user's nodes. So the variational
  inequality is not monotone, Rosen's diagonal strict concavity fails (rescaling server ``k`` by ``r_k`` cannot make
  ``r_k w[n, k]`` constant in ``k`` for every ``n`` unless ``gamma`` factorises as above), and neither best response
  nor projection/extragradient methods come with a guarantee. The provably convergent method is the paper's PS-MFA
  (Sec. 5.1, Algorithm I): a feasible descent on the constrained merit function of Problem 3 (eqs. 37-40, a
  Fischer-Burmeister complementarity function, eqs. 44-54); Lemma 3 makes every step a strict descent and
  Theorem 8 shows that its limit points solve Problem 1 under Assumption 1 (non-degenerate termination) or
  Assumption 2 (every node/resource is needed by some eligible user). PS-MFA is implemented in :mod:`.psmfa` (as
  reconstructed from the prose, the formulas being lost; see its docstring); measured, it is slow (first order:
  minutes at 40 x 250) and does not meet its stopping rule on 2 of 20 tiny random instances at alpha = 5, so it is a
  guarantee in the limit rather than the practical route. The practical route is sweeps + Newton; whatever the
  route, the result is reported ``converged`` only if :func:`kkt_residual` certifies it, and ``converged=False``
  otherwise (:func:`allocator.fairness.allocate` then returns ``status="capped"``).

Distributed heuristic (:func:`pf_vds_distributed`, Sec. 5.2): every server updates only its own column, from its own
capacities and the users' totals, along eqs. 55-56 with the multipliers replaced by the quadratic-penalty estimate of
eq. 57; convergence is only observed numerically, and the residual is reported.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.optimize import nnls

from .._model import FloatArray, Instance, log_marginal, usage
from ._ncpnewton import NcpNewtonResult, ncp_newton
from ._pfpolish import polish
from .ipm import IpmResult, proportional_fair_ipm


def _util(qv: FloatArray, z: FloatArray, alpha: float) -> FloatArray:
    """``W(z) = w U_alpha(z)`` with ``w = q^alpha``, written as ``q (z/q)^(1-alpha)/(1-alpha)`` to avoid overflow."""
    with np.errstate(divide="ignore", over="ignore"):
        if alpha == 1.0:
            return np.asarray(qv * np.log(z), dtype=np.float64)
        return np.asarray(qv * (z / qv) ** (1.0 - alpha) / (1.0 - alpha), dtype=np.float64)


def best_response(
    qv: FloatArray,
    o: FloatArray,
    u: FloatArray,
    dem: FloatArray,
    cap: FloatArray,
    alpha: float,
    lam0: FloatArray | None = None,
    tol: float = 1e-12,
    max_iter: int = 100,
) -> tuple[FloatArray, FloatArray]:
    """Exact maximiser of ``sum_n q_n^alpha U_alpha(o_n + y_n)`` s.t. ``dem.T @ y <= cap``, ``0 <= y <= u``.

    ``q_n = phi_n gamma[n, k]^(1 - 1/alpha)``, so this is server ``k``'s problem in Problem 1 (eq. 12 up to a positive
    constant). Solved on the dual: for prices ``lambda >= 0`` the maximiser is
    ``y_n = clip(q_n (lambda . d_n)^(-1/alpha) - o_n, 0, u_n)`` (eq. 27), and the convex dual
    ``lambda . cap + sum_n max_y [W(o_n + y) - (lambda . d_n) y]`` is minimised by projected Newton with an Armijo
    search, from ``lam0`` (the previous sweep's prices) if it is usable, and again from a cold start if that search
    stalls. Returns ``(y, lambda)``.
    """
    m, r = dem.shape
    need = (dem > 0).any(axis=0)

    def primal(lam: FloatArray) -> tuple[FloatArray, FloatArray, np.ndarray]:
        pi = dem @ lam
        with np.errstate(divide="ignore", over="ignore"):
            z = qv * pi ** (-1.0 / alpha)
        y = np.clip(z - o, 0.0, u)
        inner = (z - o > 0) & (z - o < u)
        return y, pi, inner

    def dual(lam: FloatArray) -> float:
        y, pi, _ = primal(lam)
        if not np.all(np.isfinite(y)):
            return np.inf  # a user's price is 0 (or its demand overflows): no finite allocation answers it
        with np.errstate(invalid="ignore"):
            val = float(lam @ cap + (_util(qv, o + y, alpha) - pi * y).sum())
        return val if np.isfinite(val) else np.inf

    if np.isfinite(u).all() and (dem.T @ u <= cap * (1 + 1e-12)).all():
        return u.copy(), np.zeros(r)

    def cold_start() -> FloatArray:
        with np.errstate(divide="ignore"):
            share = np.where(dem > 0, cap[None, :] / (np.where(dem > 0, dem, 1.0) * m), np.inf).min(axis=1)
        target = np.log(qv) - np.log(o + share)
        target = np.exp(alpha * (target - target.max()))
        lam_c = np.maximum(nnls(dem, target)[0], 1e-6 * target.max() / np.maximum(dem.max(axis=0), 1e-300))
        lam_c = np.where(need, lam_c, 0.0)
        # Rescale so the shift used above disappears: choose the scale that makes usage match capacity in total.
        lo, hi = 1e-300, 1e300
        for _ in range(200):
            s = np.sqrt(lo * hi) if hi / lo > 4 else 0.5 * (lo + hi)
            y, _, _ = primal(lam_c * s)
            if ((dem.T @ y) > cap).any():
                lo = s
            else:
                hi = s
            if hi / lo < 1 + 1e-3:
                break
        return np.asarray(lam_c * hi, dtype=np.float64)

    def newton(lam: FloatArray, g_val: float) -> tuple[FloatArray, float, bool]:
        """Projected Newton on the dual from ``lam`` (dual value ``g_val``); returns the prices, their dual value
        and whether they met ``tol``."""
        for _ in range(max_iter):
            y, pi, inner = primal(lam)
            grad = cap - dem.T @ y
            scale = np.maximum(cap, 1e-300)
            viol = np.where(lam > 0, np.abs(grad), np.maximum(-grad, 0.0)) / scale
            if viol.max() <= tol:
                return lam, g_val, True
            bind = (lam <= 0) & (grad > 0)
            free = ~bind & need
            h = (dem[inner].T * (qv[inner] * pi[inner] ** (-1.0 / alpha - 1.0) / alpha)) @ dem[inner]
            p = np.zeros(r)
            fi = np.flatnonzero(free)
            hf = h[np.ix_(fi, fi)]
            try:
                ridge = 1e-12 * max(np.trace(hf), 1e-300)
                p[fi] = -np.linalg.solve(hf + ridge * np.eye(fi.size), grad[fi])
            except np.linalg.LinAlgError:
                p[fi] = -grad[fi] * lam[fi] / scale[fi]
            if not np.all(np.isfinite(p)) or grad @ p >= 0:
                p = np.where(free, -grad * np.maximum(lam, 1e-300) / scale, 0.0)
            step = 1.0
            for _ in range(60):
                cand = np.maximum(lam + step * p, 0.0)
                g_new = dual(cand)
                if g_new <= g_val + 1e-4 * grad @ (cand - lam) + 1e-15 * abs(g_val):
                    break
                step *= 0.5
            else:
                return lam, g_val, False  # no step of the search decreases the dual: keep the last accepted prices
            lam, g_val = cand, g_new
        return lam, g_val, False

    def from_cold() -> tuple[FloatArray, float, bool]:
        lam_c = cold_start()
        return newton(lam_c, dual(lam_c))

    g_warm = dual(lam0) if lam0 is not None and np.all(np.isfinite(lam0)) and (dem @ lam0 > 0).all() else np.inf
    if np.isfinite(g_warm):
        lam, g_val, done = newton(np.array(lam0, dtype=np.float64), g_warm)
        if not done:
            # a warm start from the previous sweep's prices can be far off (at large alpha the marginal utilities
            # move by orders of magnitude with the totals) and the search then stalls: start again from the cold start
            lam_c, g_c, done_c = from_cold()
            if done_c or g_c < g_val:
                lam = lam_c
    else:
        lam, _, _ = from_cold()
    y, _, _ = primal(lam)
    load = dem.T @ y
    worst = float(np.max(load / np.maximum(cap, 1e-300)))
    if worst > 1.0:
        y = y / worst
    return y, lam


@dataclass(frozen=True)
class PfVdsResult:
    """Outcome of a PF-VDS solver.

    Attributes:
        x: ``(n, k)`` tasks.
        iterations: best-response sweeps (:func:`pf_vds`) or update steps (:func:`pf_vds_distributed`).
        residual: :func:`kkt_residual` of ``x`` (with ``lam`` as the second witness where there is one).
        converged: ``residual <= tol``.
        method: how ``x`` was found (route table of the module docstring): ``"ipm"`` (alpha = 1: the interior point
            itself, cleaned and scaled into the capacities), ``"ipm+kkt"`` (alpha = 1: the exact KKT solve on the
            interior point's active set), ``"sweeps"`` (best-response sweeps from the equal share or a given start),
            ``"sweeps+newton"`` / ``"sweeps+drift+newton"`` (the semismooth Newton solve from the sweeps' iterate /
            from a point down their drift, :func:`_along`) or ``"distributed"``.
        ipm_iterations: interior-point iterations (alpha = 1), else 0.
        lam: ``(k, r)`` prices the solver passed to :func:`kkt_residual` as its second witness (the servers'
            best-response prices or Newton's), so ``residual == kkt_residual(x, inst, alpha, lam=lam)``;
            ``None`` where only the certificate's own fit was used.
    """

    x: FloatArray
    iterations: int
    residual: float
    converged: bool
    method: str = "sweeps"
    ipm_iterations: int = 0
    lam: FloatArray | None = None


def kkt_residual(x: FloatArray, inst: Instance, alpha: float, lam: FloatArray | None = None) -> float:
    """Largest violation of the PF-VDS equilibrium conditions (eqs. 28-29), scale free.

    Per server the multipliers ``lambda[k]`` are fitted by NNLS to the marginal utilities ``g[n, k]`` of the users it
    serves that are below their ``max_tasks`` cap, using only saturated resources (complementarity of eq. 28); this
    gives every eligible pair its price ``pi[n, k]`` and ratio ``rho[n, k] = pi[n, k] / g[n, k] - 1``. A user at its
    cap has one multiplier ``nu_n >= 0`` of the cap shared by all servers (the variational equilibrium of the game
    with the shared cap constraint; for alpha = 1 the optimum of Theorem 2): eq. 29 becomes ``pi + nu = g`` where it
    runs tasks and ``pi + nu >= g`` elsewhere, i.e. ``rho = -nu / g`` on its used pairs. ``nu_n / g`` is taken as the
    midpoint of ``-rho`` over the used pairs (clipped at 0), and the used pairs' deviation from it is a violation.
    Reported is the max of: relative capacity excess; ``|min(x[n, k] / x_n, rho[n, k] + nu_n / g[n, k])|`` over
    eligible pairs (eq. 29 as a min-complementarity function; ``nu_n = 0`` below the cap); the capped users' spread;
    and, for an unsaturated server with an eligible user below its cap, 1 (the column would not be optimal).

    The fit can only over-report: it is one choice of multipliers, and the conditions hold if any choice satisfies
    them. It is not unique when a server has more saturated resources than used pairs, and a saturated server used
    only by capped users gets no fitted prices (``lambda = 0``; an eligible user below its cap then sees a free
    server). A solver's own multipliers ``lam`` ``(k, r)`` may therefore be passed as a second witness: the same
    conditions are then also measured with them (restricted to the saturated resources, as the fit is) and the smaller
    of the two residuals is reported. Both are complete certificates, so this never accepts what the conditions do not.
    """
    x = np.where(inst.eligible, np.maximum(x, 0.0), 0.0)
    tot = x.sum(axis=1)
    if (tot <= 0).any():
        return float("inf")
    load = usage(x, inst)
    cap = inst.capacities
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = np.where(cap > 0, load / np.where(cap > 0, cap, 1.0) - 1.0, np.where(load > 0, np.inf, 0.0))
    res = max(0.0, float(excess.max()))
    lg = log_marginal(inst, tot, alpha)
    at_cap = tot >= inst.max_tasks * (1 - 1e-9)
    share = x / tot[:, None]
    used = inst.eligible & (share > 1e-6)  # pairs that carry a material share; tiny ones enter via min() below
    sat_all = load >= cap * (1 - 1e-7)
    witnesses = [None] if lam is None else [None, np.where(sat_all, np.maximum(lam, 0.0), 0.0)]
    return max(res, min(_pair_residual(inst, lg, share, used, at_cap, sat_all, w) for w in witnesses))


def _pair_residual(
    inst: Instance,
    lg: FloatArray,
    share: FloatArray,
    used: np.ndarray,
    at_cap: np.ndarray,
    sat_all: np.ndarray,
    witness: FloatArray | None,
) -> float:
    """Eq. 29 part of :func:`kkt_residual` with the NNLS-fitted multipliers (``witness=None``) or the given ones."""
    res = 0.0
    ratio = np.zeros(share.shape)
    for k in range(inst.k):
        idx = np.flatnonzero(inst.eligible[:, k])
        if idx.size == 0:
            continue
        sat = sat_all[k]
        if not sat.any():
            if (~at_cap[idx]).any():
                return 1.0
            ratio[idx, k] = -1.0  # no resource is full: every price is 0
            continue
        sup = used[idx, k]
        shift = lg[idx, k][sup].max() if sup.any() else lg[idx, k].max()
        target = np.exp(lg[idx, k] - shift)
        dem = inst.demands[idx][:, sat]
        if witness is None:
            fit_rows = sup & ~at_cap[idx]
            lam_k = nnls(dem[fit_rows], target[fit_rows])[0] if fit_rows.any() else np.zeros(int(sat.sum()))
        else:
            with np.errstate(over="ignore"):
                lam_k = witness[k, sat] * np.exp(-shift)
        ratio[idx, k] = (dem @ lam_k) / target - 1.0
    nu = np.zeros(inst.n)
    for n in np.flatnonzero(at_cap):
        r_used = ratio[n, used[n]]
        if r_used.size:
            lo, hi = float(r_used.min()), float(r_used.max())
            nu[n] = max(0.0, -(lo + hi) / 2)
            res = max(res, float(np.abs(r_used + nu[n]).max()))
    shifted = np.where(inst.eligible, ratio + nu[:, None], 0.0)
    res = max(res, float(np.abs(np.minimum(np.where(inst.eligible, share, 0.0), shifted)).max()))
    return res


def _into_capacities(x: FloatArray, inst: Instance) -> FloatArray:
    """``x`` with each server's column scaled down just enough to fit all its capacities (unchanged if it fits)."""
    cap = np.where(inst.capacities > 0, inst.capacities, np.inf)
    worst = np.max(usage(x, inst) / cap, axis=1)
    return np.asarray(x / np.maximum(worst, 1.0)[None, :], dtype=np.float64)


def _interior_start(inst: Instance, ip: IpmResult) -> FloatArray | None:
    """The interior point as a start for the sweeps: feasible (:func:`_into_capacities`) and without the pairs that
    carry less than ``1e-9`` of their user's tasks; ``None`` if it is not finite and positive."""
    x = ip.x
    tot = x.sum(axis=1)
    if not (np.all(np.isfinite(x)) and np.all(tot > 0)):
        return None
    return _into_capacities(np.where(x > 1e-9 * tot[:, None], x, 0.0), inst)


NEWTON_MAX_UNKNOWNS = 2500
"""Largest NCP (eligible pairs + demanded resources + capped users) on which :func:`pf_vds` tries the dense
semismooth Newton finish of :mod:`._ncpnewton` (one dense factorisation of this order per Newton iteration)."""

NEWTON_AFTER = frozenset({5, 10, 20, 50, 100, 200, 500, 1000})
"""Sweep counts after which :func:`pf_vds` tries the Newton finish (and after its last sweep)."""


DRIFT_MAX_UNKNOWNS = 500
"""Largest NCP (see :data:`NEWTON_MAX_UNKNOWNS`) on which :func:`pf_vds` tries the Newton finish along a drift of the
sweeps (:func:`_along`)."""


def _newton_finish(
    inst: Instance, alpha: float, x: FloatArray, tol: float, max_iter: int = 80
) -> tuple[NcpNewtonResult, float]:
    """:func:`ncp_newton` from ``x`` and its :func:`kkt_residual`; a solve that converged in the mean units without
    being certified is finished in the certificate's units (``units="min"``, see :func:`ncp_newton`)."""
    nr = ncp_newton(inst, alpha, x, max_iter=max_iter)
    res_n = kkt_residual(nr.x, inst, alpha, lam=nr.lam)
    if res_n > tol and nr.merit <= 1e-12:
        nr = ncp_newton(inst, alpha, nr.x, lam0=nr.lam, units="min", max_iter=max_iter)
        res_n = kkt_residual(nr.x, inst, alpha, lam=nr.lam)
    return nr, res_n


def _along(inst: Instance, x: FloatArray, step: FloatArray) -> Iterator[FloatArray]:
    """Starts ``x + t step`` for ``t = 16, 32, 64, ...`` while every entry stays positive, then the last ``t`` at
    which one reaches 0; each clipped at 0 and scaled into the capacities.

    Used when the sweeps *drift*: every sweep moves ``x`` by the same ``step`` (to 1 %) without lowering the
    residual. Measured on a 6 x 5 x 3 instance at alpha = 5: users 0, 2 and 5 trade tasks between two nearly identical
    servers, 3.5e-5 tasks per sweep, along a direction that keeps their totals and both servers' saturated loads, with
    the residual constant at 3.8e-5; the equilibrium lies about 25,000 sweeps down that line. Newton from the sweeps'
    iterate stalls at a non-solution (merit 1.8e-9, residual 0.35), from any point past the equilibrium on the line
    it converges quadratically (23 iterations, residual 1e-13)."""
    neg = step < 0
    with np.errstate(divide="ignore", invalid="ignore"):
        t_max = float(np.min(x[neg] / -step[neg])) if neg.any() else np.inf
    t = 16.0
    while t < min(t_max, 2.0**40):
        xs = np.maximum(x + t * step, 0.0)
        if (xs.sum(axis=1) > 0).all():
            yield _into_capacities(xs, inst)
        t *= 2.0
    if np.isfinite(t_max):
        xs = np.maximum(x + t_max * step, 0.0)
        if (xs.sum(axis=1) > 0).all():
            yield _into_capacities(xs, inst)


def _ncp_size(inst: Instance) -> int:
    """Unknowns of the equilibrium NCP: eligible pairs, demanded resources (positive capacity), capped users."""
    return int(inst.eligible.sum() + (inst.capacities > 0).sum() + np.isfinite(inst.max_tasks).sum())


IPM_TOL = 1e-14
"""Duality measure to which :func:`pf_vds` runs the interior point (alpha = 1). For a pair, share ``x / X_n`` times
relative reduced cost ``z X_n / phi_n`` is ``x z / phi_n``, about the duality measure (times ``mean(phi) / phi_n``)
on a centred path, so the min-complementarity term of :func:`kkt_residual` is at most about its square root: 1e-7
at 1e-14, well inside the default tolerance 1e-6, also where the optimum is so degenerate that the exact active-set
solve does not find its face. Near the optimum the method converges superlinearly (measured at 1000 x 500 x 3,
seeds 22 and 24: from 1e-9 to below 1e-14 in 3-6 iterations of about 0.1 s)."""


def _ipm_candidates(
    inst: Instance, ip: IpmResult, x0: FloatArray | None, tol: float
) -> Iterator[tuple[FloatArray, str]]:
    """PF-VDS(1) allocations from the interior point ``ip``, in the order :func:`pf_vds` tries them: the interior
    point itself ``x0`` (one certificate, about 0.1 s at 1000 x 500), then the exact active-set solves with indicator
    margin 10 and then 100 (at most 3 solves each; 1-2 s each at 1000 x 500)."""
    if x0 is not None:
        yield x0, "ipm"
    for margin in (10.0, 100.0):
        for xp in polish(inst, ip, margin=margin, accept=0.3 * tol, max_pivots=3):
            yield xp, "ipm+kkt"


Route = Literal["ipm", "sweeps+newton", "sweeps"]


def pf_vds_route(inst: Instance, alpha: float, x0: FloatArray | None = None) -> Route:
    """The method :func:`pf_vds` uses for this instance class (route table of the module docstring).

    ``"ipm"`` for alpha = 1 without a start (a convex program: the interior point, finished exactly on its active set);
    ``"sweeps+newton"`` for alpha != 1 (or a given start) when the equilibrium NCP has at most
    :data:`NEWTON_MAX_UNKNOWNS` unknowns (a dense Newton step is affordable); ``"sweeps"`` otherwise.
    """
    if x0 is None and alpha == 1.0:
        return "ipm"
    return "sweeps+newton" if _ncp_size(inst) <= NEWTON_MAX_UNKNOWNS else "sweeps"


def _pf_vds_ipm(inst: Instance, tol: float) -> PfVdsResult:
    """Route ``"ipm"``: interior point to :data:`IPM_TOL`, then its candidates (:func:`_ipm_candidates`); the first
    with :func:`kkt_residual` ``<= tol`` is returned, else the best one, uncertified."""
    ip = proportional_fair_ipm(inst, tol=IPM_TOL, max_iter=200)
    best: tuple[float, FloatArray, str] | None = None
    for xp, how in _ipm_candidates(inst, ip, _interior_start(inst, ip), tol):
        res = kkt_residual(xp, inst, 1.0)
        if res <= tol:
            return PfVdsResult(xp, 0, res, True, how, ip.iterations)
        if best is None or res < best[0]:
            best = (res, xp, how)
    if best is None:  # the interior point is not finite and positive, and no active-set solve came out
        x = _into_capacities(np.where(np.isfinite(ip.x), np.maximum(ip.x, 0.0), 0.0), inst)
        return PfVdsResult(x, 0, kkt_residual(x, inst, 1.0), False, "ipm", ip.iterations)
    return PfVdsResult(best[1], 0, best[0], False, best[2], ip.iterations)


def pf_vds(
    inst: Instance,
    alpha: float,
    *,
    tol: float = 1e-6,
    max_sweeps: int = 2000,
    x0: FloatArray | None = None,
    max_seconds: float | None = None,
) -> PfVdsResult:
    """Centralised PF-VDS(alpha) equilibrium by the method :func:`pf_vds_route` picks for the instance (route table in
    the module docstring); the result is ``converged`` only if :func:`kkt_residual` ``<= tol``.

    Route ``"ipm"`` (alpha = 1, no ``x0``): the primal-dual interior-point method of :mod:`allocator.fairness.pfvds.ipm`
    run to a duality measure of :data:`IPM_TOL` (at most 200 iterations); its point, cleaned and scaled into the
    capacities (``method="ipm"``), then the exact KKT equations on the active set its indicators reveal
    (:func:`allocator.fairness.pfvds._pfpolish.polish`, indicator margin 10, then 100, at most 3 solves each;
    ``method="ipm+kkt"``); ``iterations=0``.

    Routes ``"sweeps+newton"`` and ``"sweeps"``: Gauss-Seidel best-response sweeps from ``x0`` or the equal-share
    allocation (each server split among its eligible users by weight, a feasible point with every ``x_n > 0``), the
    certificate checked every 5 sweeps. On ``"sweeps+newton"`` the semismooth Newton method of :mod:`._ncpnewton` is
    started from the sweeps' iterate after the sweep counts in :data:`NEWTON_AFTER` and after the last (``method``
    ``"sweeps+newton"``); where the sweeps drift (the last two sweeps moved ``x`` by the same step, to 1 %) on an
    instance of at most :data:`DRIFT_MAX_UNKNOWNS` unknowns, also from points down the drift (:func:`_along`;
    ``"sweeps+drift+newton"``). The result is the first certified point, else the best iterate by
    :func:`kkt_residual` after ``max_sweeps``. ``max_seconds`` (benchmarks only: the result then depends on the
    machine) ends the sweeps after the first one that finishes past that wall-clock budget.
    """
    t_start = time.perf_counter()
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a positive finite number, got {alpha}")
    route = pf_vds_route(inst, alpha, x0)
    if route == "ipm":
        return _pf_vds_ipm(inst, tol)
    k = inst.k
    method = "sweeps"
    if x0 is None:
        wsum = (inst.weights[:, None] * inst.eligible).sum(axis=0)
        frac = np.where(inst.eligible, inst.weights[:, None] / np.where(wsum > 0, wsum, 1.0), 0.0)
        x = frac * inst.gamma
        over = x.sum(axis=1) / np.minimum(inst.max_tasks, np.inf)
        x = np.where(over[:, None] > 1, x / np.maximum(over, 1.0)[:, None], x)
    else:
        x = np.array(x0, dtype=np.float64)
    tot = x.sum(axis=1)
    idxs = [np.flatnonzero(inst.eligible[:, j]) for j in range(k)]
    with np.errstate(divide="ignore"):
        qall = inst.weights[:, None] * inst.gamma ** (1.0 - 1.0 / alpha)
    lams: list[FloatArray | None] = [None] * k
    residual = np.inf
    witness: FloatArray | None = None
    sweeps = 0
    newton = route == "sweeps+newton"
    track = newton and _ncp_size(inst) <= DRIFT_MAX_UNKNOWNS  # watch for a drift of the sweeps (see _along)
    best: tuple[float, FloatArray, FloatArray | None] = (np.inf, x.copy(), None)
    before, step, drifting = x.copy(), np.zeros_like(x), False
    for sweeps in range(1, max_sweeps + 1):
        for j in range(k):
            idx = idxs[j]
            if idx.size == 0:
                continue
            old = x[idx, j]
            o = np.maximum(tot[idx] - old, 0.0)
            u = np.maximum(inst.max_tasks[idx] - o, 0.0)
            y, lams[j] = best_response(qall[idx, j], o, u, inst.demands[idx], inst.capacities[j], alpha, lams[j])
            tot[idx] += y - old
            x[idx, j] = y
        out_of_time = max_seconds is not None and time.perf_counter() - t_start > max_seconds
        if sweeps % 5 == 0 or sweeps == max_sweeps or out_of_time:
            # the servers' own best-response prices are a second witness (see kkt_residual)
            witness = np.array([np.zeros(inst.r) if lk is None else lk for lk in lams])
            residual = kkt_residual(x, inst, alpha, lam=witness)
            if residual < best[0]:
                best = (residual, x.copy(), witness)
            if residual <= tol or out_of_time:
                break
        if track:
            step, last_step, before = x - before, step, x.copy()
            drifting = bool(np.abs(step).max() > 0 and np.abs(step - last_step).max() <= 0.01 * np.abs(step).max())
        if newton and (sweeps in NEWTON_AFTER or sweeps == max_sweeps) and np.isfinite(x).all() and (tot > 0).all():
            nr, res_n = _newton_finish(inst, alpha, x, tol)
            if res_n <= tol:
                return PfVdsResult(nr.x, sweeps, res_n, True, method + "+newton", 0, nr.lam)
            if drifting:
                for xs in _along(inst, x, step):
                    nr, res_n = _newton_finish(inst, alpha, xs, tol, max_iter=40)
                    if res_n <= tol:
                        return PfVdsResult(nr.x, sweeps, res_n, True, method + "+drift+newton", 0, nr.lam)
    if residual <= tol or (max_seconds is not None and time.perf_counter() - t_start > max_seconds):
        return PfVdsResult(x, sweeps, residual, residual <= tol, method, 0, witness)
    return PfVdsResult(best[1], sweeps, best[0], best[0] <= tol, method, 0, best[2])


def pf_vds_distributed(
    inst: Instance,
    alpha: float,
    *,
    penalty: float = 100.0,
    step: float = 5.0,
    iterations: int = 20000,
    tol: float = 1e-4,
) -> PfVdsResult:
    """Distributed heuristic of Sec. 5.2: each server moves its own column along eqs. 55-56, all servers in parallel.

    Server ``k`` only reads its own capacities and the users' totals ``x_n``. Its multipliers are the penalty
    estimate of eq. 57, ``lambda[k, r] = penalty * max(0, load[k, r] / c[k, r] - 1)``, in units where the marginal
    utility is normalised by the largest one the server sees; the update is
    ``x[n, k] <- max(0, x[n, k] + eta_k * gamma[n, k] * (g[n, k] - pi[n, k]))`` (projected on ``x >= 0``, eq. 56)
    with the server's own step ``eta_k = step / (penalty * |N_k|)``.
    Capacities may be exceeded by ``O(1/penalty)`` during the iteration, so the returned ``x`` is finally scaled per
    server to be feasible; the reported residual is :func:`kkt_residual` of that feasible allocation.
    """
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a positive finite number, got {alpha}")
    e = inst.eligible
    wsum = (inst.weights[:, None] * e).sum(axis=0)
    x = np.where(e, inst.weights[:, None] / np.where(wsum > 0, wsum, 1.0), 0.0) * inst.gamma
    cap = np.where(inst.capacities > 0, inst.capacities, np.inf)
    dn = inst.demands
    eta = step / (penalty * np.maximum(e.sum(axis=0), 1))
    gbar = np.where(e, inst.gamma, 0.0).sum(axis=0) / np.maximum(e.sum(axis=0), 1)  # server-local task scale
    it = 0
    for it in range(1, iterations + 1):
        tot = np.maximum(x.sum(axis=1), 1e-300)
        lg = log_marginal(inst, tot, alpha)
        lg = np.where(e, lg, -np.inf)
        gmax = lg.max(axis=0)
        g = np.exp(lg - gmax[None, :])  # per-server normalised marginal (local information only)
        over = np.maximum(usage(x, inst) / cap - 1.0, 0.0)
        pi = (dn @ (penalty * over / cap).T) * gbar[None, :]  # eq. 57, in the server's own task units
        direction = g - pi
        x = np.where(e, np.maximum(x + eta[None, :] * inst.gamma * direction, 0.0), 0.0)
        x = np.minimum(x, np.maximum(inst.max_tasks[:, None], 0.0))
        if it % 200 == 0 and np.abs(np.where(x > 0, direction, np.maximum(direction, 0.0))).max() < 1e-9:
            break
    x = _into_capacities(x, inst)
    res = kkt_residual(x, inst, alpha)
    return PfVdsResult(x, it, res, res <= tol, "distributed")
