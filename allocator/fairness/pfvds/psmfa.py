"""PS-MFA: the centralised PF-VDS(alpha) solver of paper 002, Sec. 5.1 (Algorithm I), as reconstructed here.

The game (see :mod:`allocator.fairness.pfvds`): server ``k`` maximises ``sum_n phi_n U_alpha(x_n / (phi_n gamma[n,
k]))`` over its column. With ``pi[n, k] = lambda[k] . d[n]`` and ``g[n, k] = phi_n^alpha gamma[n, k]^(alpha-1)
x_n^(-alpha)`` its equilibria are the solutions of the nonlinear complementarity problem (NCP, eqs. 28-29)

- ``0 <= lambda[k, r]  _|_  c[k, r] - sum_n x[n, k] d[n, r] >= 0``,
- ``0 <= x[n, k]  _|_  pi[n, k] - g[n, k] >= 0`` on the eligible pairs.

**Reconstruction.** The formulas of 002 Sec. 4.2-4.3 and 5.1 were lost in extraction; only the prose remains. What is
implemented is read from that prose (Sec. 4.2 eqs. 32-34: an NCP written with a complementarity function; Sec. 4.3
eqs. 35-40, Lemma 1, Problem 3: a constrained merit function; Sec. 5.1 eqs. 44-54, Algorithm I: feasible projected
descent on it; Lemma 3: the direction is a strict descent direction; Assumptions 1-2 and Theorem 8: its limit points
solve Problem 1) and from the appendix proofs of Lemmas 3 and 4:

- *Problem 3* (eqs. 37-40): minimise ``Psi(x, lambda) = 1/2 sum over eligible pairs of phi_FB(a[n, k], b[n, k])^2``,
  ``phi_FB(a, b) = a + b - sqrt(a^2 + b^2)`` (Fischer-Burmeister, eqs. 33-36: ``phi_FB = 0`` iff ``a >= 0, b >= 0,
  a b = 0``), subject to (38)-(40): ``x`` feasible (``x >= 0``, capacities), ``lambda >= 0`` and ``lambda[k, r] = 0``
  unless resource ``r`` is saturated at ``k``, so that eq. 28 holds at every iterate. Arguments: ``a = x[n, k] /
  gamma[n, k]`` and ``b = (pi[n, k] - g[n, k]) / g_ref[n, k]`` with ``g_ref`` = ``g`` at a reference point (the start).
  Multiplying each side of a complementarity pair by a positive constant does not change its solution set, so
  ``Psi = 0`` iff ``(x, lambda)`` solves eqs. 28-29 (Lemma 1), as with the paper's unscaled ``(x, pi - g)``.
  *Deviation found by experiment:* the brief's ``b = pi / g - 1`` (scaled by the moving ``1 / g``) stalled at points
  with ``Psi`` far from 0 on about a third of small random instances for alpha in {2, 5}; the constant scaling
  ``1 / g_ref`` keeps ``b`` affine in ``pi`` like the paper's ``pi - g`` and did not. Once some ``x_n`` has moved so far
  that ``g / g_ref`` leaves ``[1/4, 4]``, ``g_ref`` is re-set to the current ``g`` (a new merit *phase*, at most 100).
- *Algorithm I*: from a feasible point, the ``x``-direction of server ``k`` is the Euclidean projection of
  ``-grad_x Psi`` (column ``k``) onto the cone ``T_k`` of eq. 46 (:func:`project_directions`): zero net use of every
  resource with ``lambda[k, r] > 0`` (keeps eq. 40), no net increase of the other saturated resources (eq. 45),
  ``D[n] >= 0`` where ``x[n, k] = 0`` and ``D[n] = 0`` off the eligible pairs. The ``lambda``-direction is eqs. 47-48:
  ``-grad_lambda Psi`` where ``lambda > 0``, ``max(0, -grad_lambda Psi)`` on saturated resources with ``lambda = 0``
  (and 0 there if the ``x``-direction empties the resource: it would leave the saturated set, eq. 40), 0 on
  unsaturated resources. Both are projections of ``-grad Psi`` onto cones, so ``grad . direction = -|direction|^2``
  (Lemma 3). The step (eqs. 51-53) is at most the largest step that keeps ``x >= 0`` and the capacities; ``lambda``
  follows the projected arc ``max(0, lambda + s dlambda)`` (Bertsekas, *Nonlinear Programming*, 2nd ed., Sec. 2.3.1;
  it replaces the paper's bound ``lambda >= 0`` on the step and cannot stall on a tiny multiplier). Armijo
  backtracking ``Psi(z(s)) <= Psi(z) + sigma grad . (z(s) - z)`` from a Barzilai-Borwein trial step keeps every phase
  monotone, which is what Lemma 3's descent argument needs.

Additions to Algorithm I (each keeps feasibility and, within a phase, monotone descent of ``Psi``):

- *Face Gauss-Newton step* (:func:`_subspace_step`): after each projected-gradient step, a Levenberg-Marquardt step on
  ``phi_FB = 0`` restricted to the current face (pairs at 0 stay at 0, saturated resources stay saturated, zero
  multipliers stay zero), by projected conjugate gradients, taken only if the Armijo test accepts it. Plain Algorithm I
  crawled (``Psi`` ~1e-4 after 20,000 iterations on 3 users x 5 nodes); with the face step most small instances
  converge in tens of iterations. The projected-gradient step of every iteration is what the convergence argument
  rests on; the face step can only lower ``Psi`` further.
- *Restarts*: at a stationary point of ``Psi`` that is no solution (the Armijo search fails or the direction vanishes;
  Theorem 8 excludes these only under Assumption 1 or 2), or when ``Psi`` falls by less than 1% over 200 iterations,
  the iteration restarts from the current ``x`` with the start multipliers and ``g_ref`` there (a new phase; at most
  20 restarts). A restart may raise ``Psi``; within a phase ``Psi`` never rises.
- Variables are ``y = x / gamma`` and ``mu = lambda c / s_k`` (per-server units ``s_k``, the median of ``g gamma``
  over the used pairs): the same algorithm in a fixed diagonal metric (scaled gradient projection). ``s_k`` is
  re-estimated when it drifts by more than a factor 4 (``lambda`` and ``Psi`` unchanged; the Barzilai-Borwein memory
  restarts).
- epsilon-active sets against jamming (Bertsekas, *Nonlinear Programming*, Sec. 2.3): a pair with ``x[n, k] <=
  eps_x x_n`` (``eps_x = min(1e-9, 1e-3 tol)``) counts as at its bound (it may only grow); a resource with ``load >=
  c (1 - 1e-10)`` counts as saturated (multipliers may be positive there; the certificate
  :func:`~allocator.fairness.pfvds.kkt_residual` accepts ``1e-7``). A step that reaches a bound puts the entry on it.
- After a step, a column whose load exceeds a capacity by rounding is scaled back into it and ``lambda`` is set to 0
  on resources that are no longer saturated (eq. 40). Both are part of the trial point that the Armijo test
  evaluates, so they never raise ``Psi``: a trial whose clean-up would is rejected like any other.
- Stopping rule: the Fischer-Burmeister residual on the certificate's scale, ``max |phi_FB(x[n, k] / x_n, pi[n, k] /
  g[n, k] - 1)| <= tol / 20`` (``|min(a, b)| <= 1.71 |phi_FB(a, b)|``; the margin covers the certificate re-fitting
  the multipliers), else ``max_iter`` / ``max_seconds`` or restarts exhausted (not converged).
- Task caps couple the servers through a shared constraint and are outside Problem 3: instances with a finite cap are
  refused (``ValueError``).

Known limits (measured): for alpha = 5, 2 of 20 small random instances (3-8 users, 2-5 nodes) end without meeting the
stopping rule (stalls that the restarts do not cure); ``converged`` is then ``False``. At scale it is far too slow:
40 users x 250 nodes x 2 resources and 100 x 50 x 3 (alpha 0.5, 2, 5, 20) are not converged after 120 s (600-2,500
iterations at 50-200 ms each, ``kkt_residual`` 0.13-1); per iteration the exact projection (~100 dual evaluations)
and the face step (~40 conjugate-gradient products) dominate. Use it on small instances or from a near-equilibrium
``x0``; the caller certifies every result with :func:`~allocator.fairness.pfvds.kkt_residual`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from .._model import BoolArray, FloatArray, Instance, usage

_SAT = 1e-10  # relative tolerance of "saturated" (eq. 44); lambda may be positive only there (eq. 40)
_SIGMA = 1e-4  # Armijo constant (step rule of eqs. 51-53)
_MAX_REFERENCES = 100  # re-referencings of g_ref (merit phases) at most; the last phase is one fixed merit
_MAX_CG = 50  # conjugate-gradient iterations of one face Gauss-Newton step
_MAX_RESTARTS = 20  # restarts from a stationary point / stall that is no solution
_STALL_WINDOW = 200  # iterations over which Psi must fall by 1%, else restart


@dataclass(frozen=True)
class PsMfaResult:
    """Outcome of :func:`ps_mfa`.

    Attributes:
        x: ``(n, k)`` tasks, feasible.
        lam: ``(k, r)`` multipliers (0 on unsaturated resources).
        merit: final ``Psi`` (eq. 37).
        iterations: Algorithm I iterations.
        converged: the stopping rule was met (not the :func:`~allocator.fairness.pfvds.kkt_residual` certificate;
            the caller certifies).
    """

    x: FloatArray
    lam: FloatArray
    merit: float
    iterations: int
    converged: bool


def fischer_burmeister(a: FloatArray, b: FloatArray) -> FloatArray:
    """``phi_FB(a, b) = a + b - sqrt(a^2 + b^2)`` (eqs. 33-36): zero iff ``a >= 0, b >= 0, a b = 0``."""
    return np.asarray(a + b - np.hypot(a, b), dtype=np.float64)


@dataclass(frozen=True)
class _Lin:
    """``phi_FB`` per pair and what its Jacobian needs (see :meth:`_Problem.linearise`)."""

    f: FloatArray
    fa: FloatArray
    fb: FloatArray
    kx: FloatArray
    km: FloatArray
    b: FloatArray
    tot: FloatArray


class _Problem:
    """Problem 3 (eqs. 37-40) of one instance in the scaled variables ``y = x / gamma`` and ``mu``.

    ``lambda[k, r] = mu[k, r] exp(log_s[k]) / c[k, r]``, so ``pi / g = P * qs`` with ``P[n, k] = sum_r mu[k, r]
    d[n, r] / c[k, r]`` and ``qs[n, k] = exp(alpha log x_n - log w[n, k] + log_s[k])``, ``w = phi^alpha
    gamma^(alpha - 1)``; ``b = (pi - g) / g_ref = P * qs0 - qs0 / qs`` with ``qs0`` taken at the reference totals
    ``xref`` (``g_ref = g`` there).
    """

    def __init__(self, inst: Instance, alpha: float) -> None:
        self.inst = inst
        self.alpha = alpha
        self.elig: BoolArray = inst.eligible
        self.gamma: FloatArray = np.where(self.elig, inst.gamma, 0.0)
        cap = inst.capacities
        self.rows: BoolArray = cap > 0  # (k, r) resources that can saturate and carry a price
        self.cinv: FloatArray = np.where(self.rows, 1.0 / np.where(self.rows, cap, 1.0), 0.0)
        # dc[n, k, r] = d[n, r] / c[k, r] on eligible pairs; A[n, k, r] = gamma[n, k] dc[n, k, r] <= 1 is the
        # load of resource r at k per unit of y[n, k], as a fraction of c[k, r] (the rows of T_k, eq. 46)
        self.dc: FloatArray = np.where(self.elig[:, :, None], inst.demands[:, None, :] * self.cinv[None, :, :], 0.0)
        self.amat: FloatArray = self.gamma[:, :, None] * self.dc
        with np.errstate(divide="ignore"):
            lg = np.log(np.where(self.elig, inst.gamma, 1.0))
        self.logw: FloatArray = alpha * np.log(inst.weights)[:, None] + (alpha - 1.0) * lg
        self.log_s: FloatArray = np.zeros(inst.k)
        self.xref: FloatArray = np.ones(inst.n)

    # -- the merit function and its gradient ---------------------------------------------------------------------------

    def totals(self, y: FloatArray) -> FloatArray:
        """``x_n = sum_k gamma[n, k] y[n, k]``."""
        return np.asarray((self.gamma * y).sum(axis=1), dtype=np.float64)

    def qs(self, tot: FloatArray) -> FloatArray:
        """``qs[n, k] = s_k x_n^alpha / w[n, k]`` (0 off the eligible pairs)."""
        with np.errstate(over="ignore"):
            e = self.alpha * np.log(tot)[:, None] - self.logw + self.log_s[None, :]
            return np.asarray(np.where(self.elig, np.exp(np.where(self.elig, e, 0.0)), 0.0), dtype=np.float64)

    def ratio(self, y: FloatArray, mu: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """``(b, kx, km, x_n)``: ``b[n, k]`` (second argument of eq. 29, see the class docstring), ``kx = db / d x_n``
        and ``km = db / dP``."""
        tot = self.totals(y)
        qs = self.qs(tot)
        p = np.einsum("nkr,kr->nk", self.dc, mu)
        qs0 = self.qs(self.xref)
        gq = np.where(self.elig, qs0 / np.where(self.elig, qs, 1.0), 0.0)  # g / g_ref
        b = np.where(self.elig, p * qs0 - gq, 0.0)
        return b, self.alpha * gq / tot[:, None], qs0, tot

    def rho(self, y: FloatArray, mu: FloatArray) -> FloatArray:
        """``pi / g - 1`` per eligible pair (scale free; 0 elsewhere), the quantity the certificate measures."""
        qs = self.qs(self.totals(y))
        return np.asarray(np.where(self.elig, np.einsum("nkr,kr->nk", self.dc, mu) * qs - 1.0, 0.0), dtype=np.float64)

    def merit(self, y: FloatArray, mu: FloatArray) -> float:
        """``Psi = 1/2 sum phi_FB(a, b)^2`` over the eligible pairs (eq. 37), ``a = y``."""
        tot = self.totals(y)
        if not np.all(tot > 0):
            return float("inf")
        b = self.ratio(y, mu)[0]
        f = np.where(self.elig, fischer_burmeister(y, b), 0.0)
        val = 0.5 * float((f * f).sum())
        return val if np.isfinite(val) else float("inf")

    def linearise(self, y: FloatArray, mu: FloatArray) -> _Lin:
        """``phi_FB`` and its partials ``1 - a / r``, ``1 - b / r`` (``r = sqrt(a^2 + b^2)``; at ``a = b = 0``
        the element ``1 - 1/sqrt(2)`` of the generalised Jacobian, where ``phi_FB = 0`` so ``Psi`` is C^1 anyway)."""
        b, kx, km, tot = self.ratio(y, mu)
        rad = np.hypot(y, b)
        f = np.where(self.elig, y + b - rad, 0.0)
        safe = np.where(rad > 0, rad, 1.0)
        fa = np.where(self.elig, np.where(rad > 0, 1.0 - y / safe, 1.0 - np.sqrt(0.5)), 0.0)
        fb = np.where(self.elig, np.where(rad > 0, 1.0 - b / safe, 1.0 - np.sqrt(0.5)), 0.0)
        return _Lin(f=f, fa=fa, fb=fb, kx=np.where(self.elig, kx, 0.0), km=km, b=b, tot=tot)

    def jvp(self, lin: _Lin, vy: FloatArray, vm: FloatArray) -> FloatArray:
        """``J (vy, vm)``, ``J`` the Jacobian of ``phi_FB(a, b)`` per pair."""
        dx = (self.gamma * vy).sum(axis=1)
        db = lin.kx * dx[:, None] + lin.km * np.einsum("nkr,kr->nk", self.dc, vm)
        return np.asarray(lin.fa * vy + lin.fb * db, dtype=np.float64)

    def jtvp(self, lin: _Lin, w: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``J^T w``: ``b`` depends on ``y`` only through ``x_n`` (``d x_n / d y[n, k] = gamma[n, k]``) and on ``mu``
        through ``P`` (``d P[n, k] / d mu[k, r] = d[n, r] / c[k, r]``)."""
        wb = lin.fb * w
        t_n = (wb * lin.kx).sum(axis=1)
        wy = np.where(self.elig, lin.fa * w + self.gamma * t_n[:, None], 0.0)
        wm = np.einsum("nk,nkr->kr", wb * lin.km, self.dc)
        return np.asarray(wy, dtype=np.float64), np.asarray(wm, dtype=np.float64)

    def gradient(self, y: FloatArray, mu: FloatArray) -> tuple[float, FloatArray, FloatArray, FloatArray]:
        """``(Psi, dPsi/dy, dPsi/dmu, b)`` by the chain rule, ``grad Psi = J^T phi_FB``: ``dPsi/da = F (1 - a / r)``,
        ``dPsi/db = F (1 - b / r)``; ``d b[n, k'] / d x_n = alpha (g / g_ref)[n, k'] / x_n`` (``kx``)."""
        lin = self.linearise(y, mu)
        gy, gm = self.jtvp(lin, lin.f)
        return 0.5 * float((lin.f * lin.f).sum()), gy, gm, lin.b

    # -- helpers -------------------------------------------------------------------------------------------------------

    def load(self, y: FloatArray) -> FloatArray:
        """``load[k, r] / c[k, r]`` (0 where ``c = 0``)."""
        return np.asarray(np.einsum("nk,nkr->kr", y, self.amat), dtype=np.float64)

    def rescale(self, y: FloatArray, mu: FloatArray) -> FloatArray:
        """Re-estimate ``s_k`` from the current point (median over used eligible pairs of ``gamma / q``) and return
        ``mu`` in the new units (``lambda`` unchanged)."""
        tot = self.totals(y)
        lq = self.alpha * np.log(tot)[:, None] - self.logw  # log q
        with np.errstate(divide="ignore"):
            lgam = np.log(np.where(self.elig, self.gamma, 1.0))
        new = self.log_s.copy()
        for k in range(self.inst.k):
            idx = self.elig[:, k] & (y[:, k] > 0)
            if not idx.any():
                idx = self.elig[:, k]
            if idx.any():
                new[k] = float(np.median(lgam[idx, k] - lq[idx, k]))
        mu = mu * np.exp(self.log_s - new)[:, None]
        self.log_s = new
        return mu

    def start_prices(self, y: FloatArray, sat: BoolArray) -> FloatArray:
        """Multiplier start: per server, NNLS fit of ``g`` on the saturated resources over the used pairs (like
        :func:`~allocator.fairness.pfvds.kkt_residual`), i.e. ``P qs = 1``, clipped ``>= 0``, zero elsewhere."""
        tot = self.totals(y)
        qs = self.qs(tot)
        mu = np.zeros(self.rows.shape)
        for k in range(self.inst.k):
            rows = np.flatnonzero(sat[k])
            used = np.flatnonzero(self.elig[:, k] & (y[:, k] > 0))
            if rows.size == 0 or used.size == 0:
                continue
            mat = self.dc[used][:, k][:, rows] * qs[used, k][:, None]
            mu[k, rows] = np.maximum(nnls(mat, np.ones(used.size))[0], 0.0)
        return mu


def project_directions(
    v: FloatArray,
    amat: FloatArray,
    at_zero: BoolArray,
    constrained: BoolArray,
    inequality: BoolArray,
    *,
    max_iter: int = 100,
) -> tuple[FloatArray, FloatArray]:
    """Euclidean projection of every column ``v[:, k]`` onto the cone of eq. 46, all servers at once.

    ``T_k = {D : sum_n amat[n, k, r] D_n = 0 for constrained r not in inequality; <= 0 for r in inequality;
    D_n >= 0 where at_zero[n, k]}`` (rows of ``amat`` that are zero, e.g. ineligible pairs, are left to the caller).
    Solved exactly through the dual (the projection problem of eq. 54 / the appendix proof of Lemma 3, eq. 108): for
    multipliers ``mu`` the minimiser is ``D(mu) = clip(v - amat mu)`` (clipped at 0 on ``at_zero``), and ``mu``
    minimises the convex, C^1, piecewise-quadratic ``h(mu) = 1/2 |D(mu)|^2`` with ``mu`` free on the equality rows,
    ``>= 0`` on the inequality rows and 0 on unconstrained rows. ``h`` is minimised by Bertsekas' projected Newton
    method (generalised Hessian ``A^T diag(active) A``, epsilon-active bound set, Armijo search on the projected arc),
    batched over servers; on a piecewise-quadratic function it terminates once the active pattern is identified.

    Returns ``(D, mu)``.
    """
    _, k, r = amat.shape
    mu = np.zeros((k, r))
    ineq = inequality & constrained
    vscale = np.sqrt((v * v).sum(axis=0)) + 1e-300
    eye = np.eye(r)

    def evaluate(m: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        u = v - np.einsum("nkr,kr->nk", amat, m)
        act = ~at_zero | (u > 0)
        d = np.where(act, u, 0.0)
        return d, act, 0.5 * (d * d).sum(axis=0)

    d, act, h = evaluate(mu)
    for _ in range(max_iter):
        gr = np.where(constrained, -np.einsum("nkr,nk->kr", amat, d), 0.0)
        pg = np.where(ineq, mu - np.maximum(mu - gr, 0.0), gr)  # projected-gradient residual
        resid = np.abs(pg).max(axis=1)
        todo = resid > 1e-13 * vscale
        if not todo.any():
            break
        eps = np.minimum(1e-12, resid)[:, None]
        bound = ineq & (mu <= eps) & (gr > 0)
        free = constrained & ~bound
        am = amat * act[:, :, None]
        hess = np.einsum("nkr,nks->krs", am, amat)
        ff = free[:, :, None] & free[:, None, :]
        hess = np.where(ff, hess, 0.0)
        tr = np.trace(hess, axis1=1, axis2=2)
        hess = hess + eye[None] * (np.where(free, 1e-13 * np.maximum(tr, 1e-300)[:, None], 1.0))[:, :, None]
        p = -np.linalg.solve(hess, np.where(free, gr, 0.0)[:, :, None])[:, :, 0]
        p = np.where(free, p, 0.0)
        diag = np.maximum(np.einsum("nkr,nkr->kr", amat, amat), 1e-300)
        p = np.where(bound, -gr / diag, p)
        bad = ~np.isfinite(p).all(axis=1) | ((gr * p).sum(axis=1) >= 0)
        p = np.where(bad[:, None], -gr / diag, p)
        p = np.where(todo[:, None], p, 0.0)
        step = np.ones(k)
        new_mu = mu
        new_d, new_act, new_h = d, act, h
        pending = todo.copy()
        for _ls in range(60):
            cand = mu + step[:, None] * p
            cand = np.where(ineq, np.maximum(cand, 0.0), cand)
            cand = np.where(constrained, cand, 0.0)
            cd, cact, ch = evaluate(cand)
            ok = pending & (ch <= h + 1e-4 * (gr * (cand - mu)).sum(axis=1) + 1e-15 * h)
            new_mu = np.where(ok[:, None], cand, new_mu)
            new_d = np.where(ok[None, :], cd, new_d)
            new_act = np.where(ok[None, :], cact, new_act)
            new_h = np.where(ok, ch, new_h)
            pending &= ~ok
            if not pending.any():
                break
            step = np.where(pending, 0.5 * step, step)
        if np.array_equal(new_mu, mu):
            break
        mu, d, act, h = new_mu, new_d, new_act, new_h
    return d, mu


def _face_projector(amat: FloatArray, free_y: BoolArray, rows: BoolArray) -> tuple[FloatArray, FloatArray]:
    """``(A_F, pinv(A_F^T A_F))`` per server: the orthogonal projector ``v -> v - A_F pinv A_F^T v`` onto the columns
    that keep every resource in ``rows`` at its load, with only the ``free_y`` pairs moving."""
    af = amat * free_y[:, :, None] * rows[None, :, :]
    gram = np.einsum("nkr,nks->krs", af, af)
    return af, np.asarray(np.linalg.pinv(gram, rcond=1e-12, hermitian=True), dtype=np.float64)


def _face_direction(
    prob: _Problem,
    lin: _Lin,
    rho: float,
    gy: FloatArray,
    gm: FloatArray,
    free_y: BoolArray,
    free_m: BoolArray,
    keep: BoolArray,
    max_cg: int,
) -> tuple[FloatArray, FloatArray]:
    """Minimiser of the Levenberg-Marquardt model ``grad . d + 1/2 |J d|^2 + rho/2 |d|^2`` over the face directions
    (only ``free_y`` pairs and ``free_m`` multipliers move, resources in ``keep`` keep their load), by conjugate
    gradients on the projected normal equations (inexact: relative residual ``1e-2``, at most ``max_cg`` steps)."""
    af, ginv = _face_projector(prob.amat, free_y, keep)

    def proj(vy: FloatArray, vm: FloatArray) -> tuple[FloatArray, FloatArray]:
        vy = np.where(free_y, vy, 0.0)
        t = np.einsum("krs,ks->kr", ginv, np.einsum("nkr,nk->kr", af, vy))
        vy = np.where(free_y, vy - np.einsum("nkr,kr->nk", af, t), 0.0)
        return vy, np.where(free_m, vm, 0.0)

    def op(vy: FloatArray, vm: FloatArray) -> tuple[FloatArray, FloatArray]:
        wy, wm = prob.jtvp(lin, prob.jvp(lin, vy, vm))
        return proj(wy + rho * vy, wm + rho * vm)

    ry, rm = proj(-gy, -gm)
    r0 = float((ry * ry).sum() + (rm * rm).sum())
    dy, dm = np.zeros_like(gy), np.zeros_like(gm)
    if r0 <= 1e-300:
        return dy, dm
    py, pm = ry, rm
    rr = r0
    for _ in range(max_cg):
        qy, qm = op(py, pm)
        pq = float((py * qy).sum() + (pm * qm).sum())
        if pq <= 0:
            break
        t = rr / pq
        dy, dm = dy + t * py, dm + t * pm
        ry, rm = ry - t * qy, rm - t * qm
        rr_new = float((ry * ry).sum() + (rm * rm).sum())
        if rr_new <= 1e-4 * r0:
            break
        py, pm = ry + (rr_new / rr) * py, rm + (rr_new / rr) * pm
        rr = rr_new
    return proj(dy, dm)


def _subspace_step(
    prob: _Problem,
    y: FloatArray,
    mu: FloatArray,
    psi: float,
    gy: FloatArray,
    gm: FloatArray,
    sat: BoolArray,
    zero: BoolArray,
    max_cg: int,
) -> tuple[FloatArray, FloatArray, float] | None:
    """Gauss-Newton (Levenberg-Marquardt) step on ``phi_FB = 0`` restricted to the current face of the feasible set of
    Problem 3 (pairs at 0 stay at 0, saturated resources stay saturated, zero multipliers stay zero), then the step
    rule of eqs. 51-53 (largest feasible step, Armijo). Returns the new ``(y, mu, Psi)`` or ``None`` when it does not
    decrease ``Psi``."""
    elig = prob.elig
    free_y = elig & ~zero
    free_m = sat & (mu > 0)
    keep = sat.copy()
    lin = prob.linearise(y, mu)
    rho = 1e-3 * min(1.0, float(np.sqrt(2.0 * psi))) + 1e-14
    dy, dm = _face_direction(prob, lin, rho, gy, gm, free_y, free_m, keep, max_cg)
    with np.errstate(divide="ignore", invalid="ignore"):
        neg = free_y & (dy < 0)
        sy = np.where(neg, y / np.where(neg, -dy, 1.0), np.inf)
        dload = np.einsum("nk,nkr->kr", dy, prob.amat)
        up = prob.rows & ~keep & (dload > 0)
        sl = np.where(up, np.maximum(1.0 - prob.load(y), 0.0) / np.where(up, dload, 1.0), np.inf)
    s_max = float(min(sy.min(), sl.min()))
    slope0 = float((gy * dy).sum() + (gm * dm).sum())
    if not slope0 < 0:
        return None
    s = min(1.0, s_max)
    for _ in range(30):
        yn = np.maximum(y + s * dy, 0.0)
        if s >= s_max:
            yn = np.where(neg & (sy <= s_max * (1 + 1e-12)), 0.0, yn)
        yn = np.where(elig, yn, 0.0)
        over = prob.load(yn).max(axis=1)
        yn = np.where(over[None, :] > 1.0, yn / np.maximum(over, 1.0)[None, :], yn)
        mn = np.where(prob.rows & (prob.load(yn) >= 1.0 - _SAT), np.maximum(mu + s * dm, 0.0), 0.0)
        psi_n = prob.merit(yn, mn)
        slope = float((gy * (yn - y)).sum() + (gm * (mn - mu)).sum())
        if psi_n <= psi + _SIGMA * min(slope, 0.0) and psi_n < psi:
            return yn, mn, psi_n
        s *= 0.5
    return None


def _equal_share(inst: Instance) -> FloatArray:
    """Each server split among its eligible users by weight, user ``n`` getting ``phi_n / sum phi`` of its monopoly
    tasks ``gamma[n, k]`` (the start of :func:`~allocator.fairness.pfvds.pf_vds`): feasible, every ``x_n > 0``."""
    wsum = (inst.weights[:, None] * inst.eligible).sum(axis=0)
    frac = np.where(inst.eligible, inst.weights[:, None] / np.where(wsum > 0, wsum, 1.0), 0.0)
    return np.asarray(frac * inst.gamma, dtype=np.float64)


def _feasible_start(inst: Instance, x0: FloatArray | None) -> FloatArray:
    """``x0`` made feasible (clipped at 0 and to the eligible pairs, each column scaled into its capacities), mixed
    1% with the equal share when some user would get nothing; or the equal share."""
    base = _equal_share(inst)
    if x0 is None:
        return base
    x = np.array(x0, dtype=np.float64)
    if x.shape != base.shape or not np.all(np.isfinite(x)):
        raise ValueError(f"x0 must be a finite array of shape {base.shape}")
    x = np.where(inst.eligible, np.maximum(x, 0.0), 0.0)
    cap = np.where(inst.capacities > 0, inst.capacities, np.inf)
    worst = np.max(usage(x, inst) / cap, axis=1)
    x = x / np.maximum(worst, 1.0)[None, :]
    if not np.all(x.sum(axis=1) > 0):
        x = 0.99 * x + 0.01 * base
    return np.asarray(x, dtype=np.float64)


def ps_mfa(
    inst: Instance,
    alpha: float,
    *,
    x0: FloatArray | None = None,
    tol: float = 1e-6,
    max_iter: int = 100_000,
    max_seconds: float | None = None,
) -> PsMfaResult:
    """PF-VDS(alpha) equilibrium by PS-MFA (paper 002, Algorithm I, Sec. 5.1; reconstruction in the module docstring).

    Starts from ``x0`` (made feasible, see :func:`_feasible_start`) or the equal share, with the NNLS price start, and
    iterates eqs. 46-53 (plus the face Gauss-Newton step) until the stopping rule (FB residual on the certificate's
    scale ``<= tol / 4``), a stationary point, ``max_iter`` or ``max_seconds``.

    Raises:
        ValueError: ``alpha`` not positive and finite; a finite task cap (PS-MFA supports uncapped users only);
            a malformed ``x0``.
    """
    return _solve(inst, alpha, x0=x0, tol=tol, max_iter=max_iter, max_seconds=max_seconds, trace=None)


@dataclass(frozen=True)
class _Direction:
    """One projected direction of Algorithm I at the current iterate (eqs. 44-48) and the sets it was built on."""

    dy: FloatArray  # x-direction in units of gamma: the projection onto the cone T_k of eq. 46
    dm: FloatArray  # lambda-direction in the units s_k of mu (eqs. 47-48)
    sat: BoolArray  # saturated resources (eq. 44)
    zero: BoolArray  # eligible pairs at (numerically) zero flow, held at D[n] >= 0
    dload: FloatArray  # change of the loads along dy, as fractions of the capacities
    norm2: float  # |dy|^2 + |dm|^2


class _Descent:
    """The state of one run of Algorithm I (Sec. 5.1) on Problem 3, advanced by the named steps of :func:`_solve`.

    ``y = x / gamma`` and ``mu`` (``lambda`` in the units ``s_k`` of :class:`_Problem`) are the iterate; ``psi``,
    ``gy``, ``gm`` the merit and its gradient there; ``prev`` the previous accepted iterate and gradient (the
    Barzilai-Borwein memory, reset when the merit or the metric changes); ``n_ref`` the merit phases (re-referencings
    of ``g_ref`` and restarts), ``n_restart`` the restarts, ``psi_check`` the merit at the last stall check.
    """

    def __init__(self, inst: Instance, alpha: float, x0: FloatArray | None, tol: float) -> None:
        """The feasible start (:func:`_feasible_start`), ``g_ref`` at it, the units ``s_k`` and the NNLS price start."""
        prob = _Problem(inst, alpha)
        self.prob = prob
        self.alpha = alpha
        gamma_safe = np.where(prob.elig, prob.gamma, 1.0)
        y = np.where(prob.elig, _feasible_start(inst, x0) / gamma_safe, 0.0)
        prob.xref = prob.totals(y)  # g_ref = g at the start (fixed for the run, so Psi is one function)
        prob.rescale(y, np.zeros((inst.k, inst.r)))  # sets the units s_k of mu
        self.y: FloatArray = y
        self.mu: FloatArray = prob.start_prices(y, self.saturated(y))
        self.eps_x = min(1e-9, 1e-3 * tol)
        self.psi, self.gy, self.gm, _ = prob.gradient(self.y, self.mu)
        self.prev: tuple[FloatArray, FloatArray, FloatArray, FloatArray] | None = None
        self.s_prev = 0.0
        self.n_ref = 0
        self.n_restart = 0
        self.psi_check = np.inf

    def saturated(self, yv: FloatArray) -> BoolArray:
        """The resources at their capacity (to the relative tolerance ``_SAT``, eq. 44) at ``yv``."""
        return np.asarray(self.prob.rows & (self.prob.load(yv) >= 1.0 - _SAT), dtype=np.bool_)

    def zero_flows(self, tot: FloatArray) -> BoolArray:
        """The eligible pairs whose flow is below ``eps_x`` of their user's total ``tot``."""
        return np.asarray(self.prob.elig & (self.prob.gamma * self.y <= self.eps_x * tot[:, None]), dtype=np.bool_)

    def regradient(self) -> None:
        """``Psi`` and its gradient at the current iterate."""
        self.psi, self.gy, self.gm, _ = self.prob.gradient(self.y, self.mu)

    def fb_residual(self, tot: FloatArray) -> float:
        """The stopping measure: the largest ``|phi_FB|`` of the flow shares ``x[n, k] / x_n`` and ``pi / g - 1``
        (the certificate's scale, eqs. 28-29)."""
        prob = self.prob
        share = np.where(prob.elig, prob.gamma * self.y / tot[:, None], 0.0)
        return float(np.abs(np.where(prob.elig, fischer_burmeister(share, prob.rho(self.y, self.mu)), 0.0)).max())

    def restart(self) -> None:
        """A stationary point of ``Psi`` that is no solution (or a stall): Algorithm I from the current ``x`` with the
        start multipliers (NNLS fit) and ``g_ref`` re-referenced there, a new merit phase."""
        prob = self.prob
        prob.xref = prob.totals(self.y)
        prob.rescale(self.y, self.mu)
        self.mu = prob.start_prices(self.y, self.saturated(self.y))
        self.prev, self.n_ref, self.psi_check = None, self.n_ref + 1, np.inf
        self.regradient()

    def try_restart(self) -> bool:
        """:meth:`restart` unless ``_MAX_RESTARTS`` were taken; whether it restarted."""
        if self.n_restart < _MAX_RESTARTS:
            self.n_restart += 1
            self.restart()
            return True
        return False

    def maintain(self, it: int, tot: FloatArray) -> None:
        """The merit's upkeep before iteration ``it`` (module docstring): a restart after a stall (``Psi`` fell by
        less than 1% over ``_STALL_WINDOW`` iterations), a new phase when ``g`` left ``[g_ref / 4, 4 g_ref]``, and
        every 20 iterations new units ``s_k`` for ``mu`` when they drifted by more than a factor 4 (``lambda`` and
        ``Psi`` unchanged)."""
        prob = self.prob
        if it % _STALL_WINDOW == 0 and it > 0:
            if self.psi > 0.99 * self.psi_check and self.n_restart < _MAX_RESTARTS:
                self.n_restart += 1
                self.restart()
            self.psi_check = self.psi
        if self.n_ref < _MAX_REFERENCES and self.alpha * np.abs(np.log(tot / prob.xref)).max() > np.log(4.0):
            prob.xref, self.n_ref, self.prev = tot, self.n_ref + 1, None
            self.regradient()
        if it % 20 == 0:
            old_s = prob.log_s
            mu_new = prob.rescale(self.y, self.mu)
            if np.abs(prob.log_s - old_s).max() > np.log(4.0):
                self.mu, self.prev = mu_new, None  # the metric changed: restart the Barzilai-Borwein memory
                self.regradient()
            else:
                prob.log_s = old_s

    def direction(self, tot: FloatArray) -> _Direction:
        """Eqs. 44-48: the saturated resources (E rows with ``lambda > 0`` keep equality, I rows with ``lambda = 0``
        may only empty), ``-grad_x Psi`` projected onto the cone ``T_k`` of eq. 46 (:func:`project_directions`), and
        the ``lambda``-direction ``-grad_lambda Psi`` on the E rows and on the I rows that do not empty."""
        prob, y, mu, gy, gm = self.prob, self.y, self.mu, self.gy, self.gm
        elig = prob.elig
        sat = self.saturated(y)
        ineq = sat & (mu <= 0)
        zero = self.zero_flows(tot)
        dy, _ = project_directions(np.where(elig, -gy, 0.0), prob.amat, zero, sat, ineq)
        dy = np.where(elig, dy, 0.0)
        dy = np.where(zero, np.maximum(dy, 0.0), dy)
        dload = np.einsum("nk,nkr->kr", dy, prob.amat)
        scale_load = np.einsum("nk,nkr->kr", np.abs(dy), prob.amat) + 1e-300
        leaving = ineq & (dload < -1e-12 * scale_load)
        dm = np.where(sat & (mu > 0), -gm, 0.0)
        dm = np.where(ineq & ~leaving, np.maximum(-gm, 0.0), dm)
        norm2 = float((dy * dy).sum() + (dm * dm).sum())
        return _Direction(dy=dy, dm=dm, sat=sat, zero=zero, dload=dload, norm2=norm2)

    def trial(self, d: _Direction, s: float, snap: BoolArray | None) -> tuple[FloatArray, FloatArray]:
        """The point ``z(s)`` of eqs. 49-50 with the clean-up described in the module docstring."""
        prob = self.prob
        yn = np.maximum(self.y + s * d.dy, 0.0)
        if snap is not None:
            yn = np.where(snap, 0.0, yn)
        yn = np.where(prob.elig, yn, 0.0)
        over = prob.load(yn).max(axis=1)
        yn = np.where(over[None, :] > 1.0, yn / np.maximum(over, 1.0)[None, :], yn)
        mn = np.maximum(self.mu + s * d.dm, 0.0)
        mn = np.where(self.saturated(yn), mn, 0.0)
        return yn, mn

    def line_search(self, d: _Direction) -> tuple[FloatArray, FloatArray, float] | None:
        """Eqs. 51-53: from the smaller of the largest step keeping ``y >= 0`` and the loads ``<= c`` and the
        Barzilai-Borwein step, halve (80 times at most) until the Armijo rule holds and ``Psi`` decreases; the
        accepted ``(y, mu, s)``, or ``None``. At the largest step the entries that reach 0 are put on it."""
        prob, y, mu = self.prob, self.y, self.mu
        with np.errstate(divide="ignore", invalid="ignore"):
            neg = prob.elig & ~d.zero & (d.dy < 0)
            sy = np.where(neg, y / np.where(neg, -d.dy, 1.0), np.inf)
            up = prob.rows & ~d.sat & (d.dload > 0)
            sl = np.where(up, np.maximum(1.0 - prob.load(y), 0.0) / np.where(up, d.dload, 1.0), np.inf)
        s_max = float(min(sy.min(), sl.min()))
        if self.prev is not None:
            dz = np.concatenate([(y - self.prev[0]).ravel(), (mu - self.prev[1]).ravel()])
            dg = np.concatenate([(self.gy - self.prev[2]).ravel(), (self.gm - self.prev[3]).ravel()])
            sty = float(dz @ dg)
            s_bb = float(dz @ dz) / sty if sty > 0 else 2.0 * self.s_prev
        else:
            s_bb = 1e-2 / max(np.sqrt(d.norm2), 1e-300)
        s_bb = float(np.clip(s_bb, 1e-20, 1e20))
        s = min(s_max, s_bb)
        for _ls in range(80):
            snap = None
            if s >= s_max:
                snap = neg & (y + s * d.dy <= 1e-14 * np.maximum(y, 1e-300))
                snap = snap | (neg & (sy <= s_max * (1 + 1e-12)))
            yn, mn = self.trial(d, s, snap)
            psi_n = prob.merit(yn, mn)
            slope = float((self.gy * (yn - y)).sum() + (self.gm * (mn - mu)).sum())
            if psi_n <= self.psi + _SIGMA * min(slope, 0.0) and psi_n < self.psi:
                return yn, mn, s
            s *= 0.5
        return None

    def accept(self, yn: FloatArray, mn: FloatArray, s: float) -> None:
        """Move to the line search's point, keeping the previous iterate for the next Barzilai-Borwein step."""
        self.prev = (self.y, self.mu, self.gy, self.gm)
        self.s_prev = s
        self.y, self.mu = yn, mn
        self.regradient()

    def face_step(self) -> bool:
        """The face Gauss-Newton step (:func:`_subspace_step`, module docstring), taken only when it decreases
        ``Psi`` further; whether it was taken."""
        prob = self.prob
        zero = self.zero_flows(prob.totals(self.y))
        got = _subspace_step(prob, self.y, self.mu, self.psi, self.gy, self.gm, self.saturated(self.y), zero, _MAX_CG)
        if got is None:
            return False
        self.y, self.mu, _ = got
        self.regradient()
        return True

    def record(self, trace: list[tuple[FloatArray, FloatArray, float, int]] | None) -> None:
        """Append ``(x, lambda, Psi, phase)`` of the current iterate to ``trace`` (when it is a list)."""
        if trace is not None:
            trace.append((self.prob.gamma * self.y, self.prices(), self.psi, self.n_ref))

    def prices(self) -> FloatArray:
        """``lambda[k, r] = mu[k, r] s_k / c[k, r]``."""
        return np.asarray(self.mu * np.exp(self.prob.log_s)[:, None] * self.prob.cinv, dtype=np.float64)


def _solve(
    inst: Instance,
    alpha: float,
    *,
    x0: FloatArray | None,
    tol: float,
    max_iter: int,
    max_seconds: float | None,
    trace: list[tuple[FloatArray, FloatArray, float, int]] | None,
) -> PsMfaResult:
    """:func:`ps_mfa`; with ``trace`` a list, every accepted iterate is appended as ``(x, lambda, Psi, phase)`` where
    ``phase`` counts the re-referencings of ``g_ref`` (``Psi`` is one function within a phase).

    Each iteration of Algorithm I (Sec. 5.1): the stopping test, the merit's upkeep (:meth:`_Descent.maintain`), the
    projected direction (eqs. 44-48), the step (eqs. 49-53) and the face Gauss-Newton step; a zero direction or a
    failed line search restarts the descent (:meth:`_Descent.restart`) until ``_MAX_RESTARTS``.
    """
    t_start = time.perf_counter()
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a positive finite number, got {alpha}")
    if np.isfinite(inst.max_tasks).any():
        raise ValueError("PS-MFA supports uncapped users only (finite max_tasks couple the servers)")
    run = _Descent(inst, alpha, x0, tol)
    converged = False
    it = 0
    for it in range(max_iter + 1):
        tot = run.prob.totals(run.y)
        if run.fb_residual(tot) <= tol / 20:
            converged = True
            break
        if it == max_iter or (max_seconds is not None and time.perf_counter() - t_start > max_seconds):
            break
        run.maintain(it, tot)
        d = run.direction(tot)
        step = run.line_search(d) if d.norm2 > 1e-30 else None
        if step is None:
            if run.try_restart():
                continue
            break
        run.accept(*step)
        run.record(trace)
        if run.face_step():
            run.record(trace)
    x = np.where(run.prob.elig, run.prob.gamma * run.y, 0.0)
    return PsMfaResult(x=x, lam=run.prices(), merit=float(run.psi), iterations=it, converged=converged)
