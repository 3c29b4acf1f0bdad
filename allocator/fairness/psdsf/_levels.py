"""Start points for PS-DSF from the per-server levels (paper 002 Sec. 2.3, Definition 4; eq. 9).

When every user needs every resource (``d[n, r] > 0``), the exact filling of a server freezes *all* its users at the
first resource that saturates, so a PS-DSF allocation is described by one level ``L_k`` per server: a user that runs
on ``k`` has weighted VDS ``x_n / (phi_n gamma[n, k]) = L_k`` and a user that does not has ``x_n >= L_k phi_n
gamma[n, k]``. Hence ``x_n = min(cap_n, max_k L_k phi_n gamma[n, k])`` and every server ``k`` has
``max_r sum_n d[n, r] x[n, k] / c[k, r] = 1``. The split of ``x_n`` over the servers attaining the max is what makes the
problem hard (Gauss-Seidel sweeps move it slowly, one pair at a time).

:func:`level_candidates` smooths the max by a log-sum-exp of temperature ``tau`` (the split becomes a softmax), solves
the ``K`` smooth equations ``log(max_r load[k, r] / c[k, r]) = 0`` in ``theta = log L`` by damped Newton steps, and
follows ``tau`` down (with a linear predictor in ``tau``: ``theta(tau)`` is asymptotically affine in ``tau``). From each
small ``tau`` it reads the active set (pairs with softmax weight above a threshold, the saturated resource of each
server) and solves the exact piecewise-linear equations on it (:func:`polish`):

- for each used pair ``(n, k)``: ``sum_k' x[n, k'] - phi_n gamma[n, k] L_k = 0`` (the user's weighted VDS at ``k`` is
  the level at which it froze there);
- for each server ``k`` and its saturated resource ``r_k``: ``sum_n d[n, r_k] x[n, k] = c[k, r_k]``.

The system is singular when servers are degenerate (two users with the same dominant resource on two servers can trade
tasks freely), so it is solved for the minimum-norm correction of the smoothed point (a regularised augmented system
with iterative refinement). :func:`pivot` corrects the active set from there (resource switches, entering and leaving
pairs, one pair dropped from a cycle whose equations have no exact solution). A candidate is only a start point:
:func:`allocator.fairness.psdsf.ps_dsf` certifies it with an exact Gauss-Seidel sweep of
:func:`allocator.fairness.psdsf.fill_server`, the same residual as without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from .._model import FloatArray, Instance
from ..kernels import load as load_kernels


@dataclass(frozen=True)
class SmoothState:
    """Smoothed solution at temperature ``tau``: flows ``x`` ``(n, k)``, softmax weights ``w`` ``(n, k)``, saturated
    resource ``rk`` per server, users at their task cap, and the residual ``max_k |log load_k|``."""

    tau: float
    x: FloatArray
    w: FloatArray
    rk: np.ndarray
    capped: np.ndarray
    residual: float


def applicable(inst: Instance) -> bool:
    """The one-level-per-server description holds: every user needs every resource, and there are several servers."""
    return inst.k > 1 and bool((inst.demands > 0).all())


@dataclass(frozen=True)
class _Point:
    """One evaluation of the smoothed equations: ``F_k = log lk_k`` (``lk_k = max_r load[k, r]``, ``1`` for a server
    nobody may use), flows ``x``, softmax weights ``w``, saturated resource ``rk`` per server, capped users."""

    f: FloatArray
    x: FloatArray
    w: FloatArray
    rk: np.ndarray
    capped: np.ndarray
    lk: FloatArray


class _Smooth:
    """The smoothed level equations of one instance (module docstring).

    :meth:`evaluate` runs the compiled kernels of :mod:`allocator.fairness.psdsf._levels_kernels` (one pass over the
    eligible pairs; the Newton Jacobian from the support of each user's softmax, or the dense product when the
    supports are wide); :meth:`evaluate_dense` is the plain numpy evaluation they replace, kept as the reference.
    """

    #: softmax weights at or below this enter the sparse Jacobian only as row terms (see :func:`smooth_jacobian`)
    cut = 1e-15

    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        e = inst.eligible
        with np.errstate(divide="ignore"):
            self.lg = np.where(e, np.log(np.where(e, inst.gamma, 1.0)), -np.inf)
        self.logphi = np.log(inst.weights)
        with np.errstate(divide="ignore"):
            self.logcap = np.log(inst.max_tasks)
        self.cinv = np.where(inst.capacities > 0, 1.0 / np.where(inst.capacities > 0, inst.capacities, 1.0), 0.0)
        self.ar = np.arange(inst.k)
        self.live: np.ndarray = np.asarray(e.any(axis=0))  # a server nobody may use has no equation
        pn, pk = np.nonzero(e)  # row-major: the eligible pairs of a user are contiguous
        self.start = np.searchsorted(pn, np.arange(inst.n + 1)).astype(np.int64)
        self.col = pk.astype(np.int64)
        self.lgv = np.ascontiguousarray(self.lg[pn, pk])
        self.demands = np.ascontiguousarray(inst.demands, dtype=np.float64)

    def evaluate(self, theta: FloatArray, tau: float) -> _Point:
        """The smoothed flows and ``F`` at ``theta`` (as :meth:`evaluate_dense`), from :func:`smooth_forward`."""
        n, k = self.inst.n, self.inst.k
        x = np.empty((n, k))
        w = np.empty((n, k))
        capped = np.empty(n, dtype=np.bool_)
        theta = np.ascontiguousarray(theta, dtype=np.float64)
        load = load_kernels().smooth_forward(
            self.start, self.col, self.lgv, theta, tau, self.logphi, self.logcap, self.demands, self.cinv, x, w, capped
        )
        rk = load.argmax(axis=1)
        lk = np.where(self.live, load[self.ar, rk], 1.0)
        with np.errstate(divide="ignore"):
            f = np.log(lk)
        return _Point(f=f, x=x, w=w, rk=rk, capped=capped, lk=lk)

    def jacobian(self, pt: _Point, tau: float) -> FloatArray:
        """``dF / dtheta + I / tau`` at ``pt``: :func:`smooth_jacobian` on the softmax supports, or the dense product
        (as :meth:`evaluate_dense`) when the supports are so wide that BLAS is cheaper."""
        n, k = pt.w.shape
        rows = np.count_nonzero(pt.w > 0.0, axis=1)
        cols = np.count_nonzero(pt.w > self.cut, axis=1)
        if float(rows @ cols) > n * k * k / 10:  # ~10x the dense BLAS flop rate per scattered update, measured
            return self._dense_jacobian(pt.x, pt.w, pt.rk, pt.capped, pt.lk, tau)
        return load_kernels().smooth_jacobian(
            pt.x, pt.w, pt.capped, pt.rk, pt.lk, self.live, self.demands, self.cinv, tau, self.cut
        )

    def _dense_jacobian(
        self, x: FloatArray, w: FloatArray, rk: np.ndarray, capped: np.ndarray, lk: FloatArray, tau: float
    ) -> FloatArray:
        y = self.inst.demands[:, rk] * x * self.cinv[self.ar, rk][None, :]
        g = np.where(capped[:, None], 0.0, w)
        with np.errstate(divide="ignore", invalid="ignore"):
            jac = np.where(self.live[:, None], (y.T @ (g - w / tau)) / lk[:, None], 0.0)
        return jac + np.eye(self.inst.k) / tau

    def evaluate_dense(self, theta: FloatArray, tau: float, jacobian: bool):
        """The numpy evaluation (reference for :meth:`evaluate`): smoothed flows and weights, ``F_k = log(max_r
        load[k, r])`` and, with ``jacobian``, ``dF / dtheta + I / tau``."""
        s = self.lg + theta[None, :]
        m = s.max(axis=1, keepdims=True)
        z = np.exp((s - m) / tau)
        zs = z.sum(axis=1, keepdims=True)
        w = z / zs
        lx = self.logphi + m[:, 0] + tau * np.log(zs[:, 0])
        capped = lx > self.logcap
        tot = np.exp(np.minimum(lx, self.logcap))
        x = tot[:, None] * w
        load = (x.T @ self.inst.demands) * self.cinv
        rk = load.argmax(axis=1)
        lk = np.where(self.live, load[self.ar, rk], 1.0)
        with np.errstate(divide="ignore"):
            f = np.log(lk)
        if not jacobian:
            return f, x, w, rk, capped, None
        return f, x, w, rk, capped, self._dense_jacobian(x, w, rk, capped, lk, tau)


def level_candidates(
    inst: Instance,
    *,
    tau_min: float = 1e-6,
    stages_per_decade: int = 3,
    newton_tol: float = 1e-3,
    tau_coarse: float = 1e-2,
    coarse_per_decade: int = 1,
) -> Iterator[SmoothState]:
    """Follow the smoothed PS-DSF levels from ``tau = 1`` down to ``tau_min``; yield the state after each stage.

    Stages are geometric in ``tau``: ``coarse_per_decade`` per decade down to ``tau_coarse``, then
    ``stages_per_decade``. Above ``tau_coarse = 1e-2`` the softmax is dense (the Jacobian is the dense product, about
    20 ms at 1000 x 500) and the path is easy to follow: one stage per decade there gave the same certified results
    as three on 23 random instances (100 x 50 to 1000 x 500) and cut 0.2 s at 1000 x 500; one stage per decade down to
    ``1e-3`` lost the path (plain sweeps took over on 4 of 5).

    Each stage runs at most 8 damped Newton steps (Armijo on ``max |F|``) and stops early when ``max |F| <
    newton_tol``: the states only need to reveal the active set, which :func:`polish` then solves exactly. With
    ``newton_tol = 1e-2`` the path was lost below ``tau ~ 2e-5`` on 1000 users x 500 nodes (``max |F|`` grew to 6e2);
    ``1e-3`` tracks it down to ``1e-6`` there, and its smoothed flows are the better start for the plain sweeps.
    """
    sm = _Smooth(inst)
    theta = -np.log(np.maximum(inst.eligible.sum(axis=0), 1.0))
    tau_coarse = min(max(tau_coarse, tau_min), 1.0)
    n_coarse = round(-float(np.log10(tau_coarse)) * coarse_per_decade) + 1
    n_fine = round(float(np.log10(tau_coarse / tau_min)) * stages_per_decade) + 1
    taus = np.concatenate([np.geomspace(1.0, tau_coarse, n_coarse), np.geomspace(tau_coarse, tau_min, n_fine)[1:]])
    hist: list[tuple[float, FloatArray]] = []
    for tau in taus:
        if len(hist) >= 2:
            (t1, th1), (t2, th2) = hist[-2], hist[-1]
            theta = th2 + (tau - t2) * (th2 - th1) / (t2 - t1)
        pt = sm.evaluate(theta, float(tau))
        for _ in range(8):
            nf = float(np.abs(pt.f).max())
            if not np.isfinite(nf) or nf < newton_tol:
                break
            try:
                step = np.linalg.solve(sm.jacobian(pt, float(tau)), -pt.f)
            except np.linalg.LinAlgError:
                return
            a = 1.0
            while a > 1e-4:
                trial = sm.evaluate(theta + a * step, float(tau))
                if float(np.abs(trial.f).max()) < (1 - 1e-4 * a) * nf:
                    break
                a /= 2
            theta = theta + a * step
            pt = trial if a > 1e-4 else sm.evaluate(theta, float(tau))
        nf = float(np.abs(pt.f).max())
        if not np.isfinite(nf):
            return
        hist.append((float(tau), theta.copy()))
        yield SmoothState(tau=float(tau), x=pt.x, w=pt.w, rk=pt.rk, capped=pt.capped, residual=nf)


def polish(
    inst: Instance, state: SmoothState, threshold: float, saturation: float, *, mu: float = 1e-12, refine: int = 6
) -> FloatArray:
    """Exact solve of the PS-DSF level equations on the active set of ``state`` (module docstring).

    Pairs with softmax weight ``> threshold`` are used; a resource of server ``k`` is taken as saturated when its
    smoothed load is within ``saturation`` (relative) of the largest one (a server may saturate two resources at the
    level where it freezes its users; each saturated resource adds a capacity equation and the active set then has
    one more pair). Users at their task cap keep their smoothed flows as constants. Returns the flows, possibly with
    negative entries when the active set is wrong (the caller checks with :func:`consistent`).
    """
    act = (state.w > threshold) & ~state.capped[:, None] & inst.eligible
    load = (state.x.T @ inst.demands) * _cinv(inst)
    sk, sr = np.nonzero(load >= load.max(axis=1, keepdims=True) * (1 - saturation))
    return _solve_active(inst, state, act, sk, sr, mu, refine)[0]


def _cinv(inst: Instance) -> FloatArray:
    c = inst.capacities
    return np.where(c > 0, 1.0 / np.where(c > 0, c, 1.0), 0.0)


def _solve_active(
    inst: Instance,
    state: SmoothState,
    act: np.ndarray,
    sk: np.ndarray,
    sr: np.ndarray,
    mu: float = 1e-12,
    refine: int = 6,
) -> tuple[FloatArray, FloatArray]:
    """Flows and levels ``(x, L)`` solving the level equations on the active pairs ``act`` and the saturated
    ``(server, resource)`` pairs ``(sk, sr)``, as the minimum-norm correction of ``state.x`` (module docstring)."""
    n, k = state.x.shape
    b = inst.weights[:, None] * inst.gamma
    d, c = inst.demands, inst.capacities
    capped = state.capped
    pn, pk = np.nonzero(act)  # row-major: pairs of one user are contiguous
    p = pn.size
    start = np.searchsorted(pn, np.arange(n + 1))
    rep = np.diff(start)[pn]
    r1 = np.repeat(np.arange(p), rep)
    offs = np.arange(rep.sum()) - np.repeat(np.cumsum(rep) - rep, rep)
    c1 = start[pn][r1] + offs
    q = sk.size
    # capacity rows: one per saturated (k, r), entries d[n, r] for every active pair (n, k)
    order = np.argsort(pk, kind="stable")
    kstart = np.searchsorted(pk[order], np.arange(k + 1))
    cnt = (kstart[sk + 1] - kstart[sk]).astype(np.int64)
    row_c = np.repeat(np.arange(q), cnt)
    offs_c = np.arange(cnt.sum()) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    col_c = order[np.repeat(kstart[sk], cnt) + offs_c]
    rows = np.concatenate([r1, np.arange(p), p + row_c])
    cols = np.concatenate([c1, p + pk, col_c])
    vals = np.concatenate([np.ones(r1.size), -b[pn, pk], d[pn[col_c], np.repeat(sr, cnt)]])
    m = sp.csr_matrix((vals, (rows, cols)), shape=(p + q, p + k))
    const = (np.where(capped[:, None], state.x, 0.0).T @ d)[sk, sr]
    rhs = np.concatenate([np.zeros(p), c[sk, sr] - const])
    tot = state.x.sum(axis=1)
    lam0 = np.zeros(k)
    np.maximum.at(lam0, pk, tot[pn] / b[pn, pk])
    z0 = np.concatenate([np.maximum(state.x[pn, pk], 0.0), lam0])
    scale = np.maximum(np.abs(z0), 1e-12 * max(float(np.abs(z0).max()), 1e-300))
    ms = m @ sp.diags(scale)
    rowsc = 1.0 / np.maximum(abs(ms).max(axis=1).toarray().ravel(), 1e-300)
    ms = sp.diags(rowsc) @ ms
    size, eqs = p + k, p + q
    aug = sp.bmat([[sp.identity(size), ms.T], [ms, -mu * sp.identity(eqs)]], format="csc")
    lu = spla.splu(aug)
    v = np.zeros(size)
    for _ in range(refine):
        r = rowsc * (rhs - m @ (z0 + scale * v))
        v = v + lu.solve(np.concatenate([np.zeros(size), r]))[:size]
    z = z0 + scale * v
    x = np.where(capped[:, None], state.x, 0.0)
    x[pn, pk] = z[:p]
    return x, z[p:]


def pivot(
    inst: Instance,
    state: SmoothState,
    threshold: float,
    *,
    max_pivots: int = 8,
    max_changes: float = 0.01,
    rtol: float = 1e-9,
) -> Iterator[FloatArray]:
    """Active-set pivots on the exact level equations, from the active set of ``state`` (pairs with softmax weight
    ``> threshold``, one saturated resource per server: the most loaded one);
    yields the first solve that is consistent with all pair equations exact.

    After each solve of :func:`_solve_active` (a user frozen at server ``k`` has weighted VDS ``L_k``, eq. 9 and
    Definition 4; its server's saturated resource is at capacity):

    - a server whose flows overload another resource switches its saturated resource to the most loaded one (with
      every user needing every resource, the exact filling freezes all users of ``k`` at the *first* resource to
      saturate, so the binding resource is the most loaded one);
    - pairs with negative flow leave; eligible unused pairs whose weighted VDS would be below their server's level
      (``phi_n gamma[n, k] L_k > x_n``) enter;
    - when the point is consistent but a user's active servers disagree (``phi_n gamma[n, k] L_k`` below the user's
      largest one: the active pairs form a cycle whose equations have no exact solution, so the minimum-norm solve
      leaves a residual), the single pair with the largest relative gap leaves -- at the fixed point that user is
      above the level of that server, where the exact filling gives it nothing.

    Yields nothing after ``max_pivots`` solves or when one solve asks for more than ``max(8, max_changes * pairs)``
    changes (the smoothed active set is far off; a wholesale change was observed to blow up, 2.4e3 entering pairs
    after one step), or yields once and stops when a consistent solve has all pair equations exact to ``rtol``.
    Observed on the 1000 x 500 x 3 benchmark instance: one resource switch (2 servers) then one pair drop give a
    point the exact sweep certifies to 1e-15, where the plain polish stalled at 3e-6.
    """
    b = inst.weights[:, None] * inst.gamma
    cinv = _cinv(inst)
    free = ~state.capped[:, None] & inst.eligible
    act = (state.w > threshold) & free
    rk = ((state.x.T @ inst.demands) * cinv).argmax(axis=1)
    sk = np.flatnonzero(inst.eligible.any(axis=0))
    for _ in range(max_pivots):
        x, lev = _solve_active(inst, state, act, sk, rk[sk])
        if not np.isfinite(x).all():
            return
        tot = x.sum(axis=1)
        neg = act & (x < -1e-12 * np.maximum(tot[:, None], 1e-300))
        load = (np.maximum(x, 0.0).T @ inst.demands) * cinv
        over = load.max(axis=1) > 1 + rtol
        bl = b * lev[None, :]
        enter = free & ~act & (bl > tot[:, None] * (1 + rtol))
        changes = int(neg.sum() + over.sum() + enter.sum())
        if changes > max(8, int(max_changes * act.sum())):
            return  # the active set is far off: this state is not close enough to the fixed point
        if changes:
            rk = np.where(over, load.argmax(axis=1), rk)
            act = (act & ~neg) | enter
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            top = np.where(act, bl, -np.inf).max(axis=1)
            gap = np.where(act, 1.0 - bl / top[:, None], 0.0)
        if not float(gap.max()) > rtol:
            yield x
            return
        u, kk = np.unravel_index(int(np.argmax(gap)), gap.shape)
        act[u, kk] = False


def consistent(inst: Instance, x: FloatArray, rtol: float = 1e-9) -> bool:
    """Cheap necessary test of a polished point before the exact certificate sweep: finite, non-negative, within
    every capacity, and no eligible unused pair whose weighted VDS would be below the level of its server."""
    if not np.isfinite(x).all():
        return False
    tot = x.sum(axis=1)
    if (x < -rtol * np.maximum(tot[:, None], 1e-300)).any():
        return False
    x = np.maximum(x, 0.0)
    load = x.T @ inst.demands
    if (load > inst.capacities * (1 + rtol) + 1e-300).any():
        return False
    b = inst.weights[:, None] * inst.gamma
    used = x > rtol * tot[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        lev = np.where(used, tot[:, None] / np.where(used, b, 1.0), np.inf).min(axis=0)
    free = inst.eligible & ~used & (tot < inst.max_tasks * (1 - rtol))[:, None]
    with np.errstate(invalid="ignore"):
        wants = free & (b * lev[None, :] > tot[:, None] * (1 + 1e-7))
    return not bool(wants.any())
