"""Compiled evaluation of the smoothed PS-DSF level equations (paper 002 Sec. 2.3, Definition 4; eq. 9).

:class:`allocator.fairness.psdsf._levels._Smooth` evaluates, for ``theta = log L`` and temperature ``tau``, the
log-sum-exp smoothing of ``x_n = min(cap_n, max_k L_k phi_n gamma[n, k])`` (softmax split ``w`` over the servers) and
the server loads ``load[k, r] = sum_n d[n, r] x[n, k] / c[k, r]``. In numpy that is a dense ``(n, k)`` pass for the
values and a dense ``(k, n) @ (n, k)`` product for the Newton Jacobian, about 70 ms per Jacobian at 1000 x 500. These
kernels do the same arithmetic in one pass over the eligible pairs (:func:`smooth_forward`) and build the Jacobian from
the support of each user's softmax only (:func:`smooth_jacobian`): at small ``tau`` a user's weight sits on a few
servers, and the entries below ``cut`` contribute at most ``cut / tau`` relative to the diagonal ``1 / tau`` term.
"""

from __future__ import annotations

import math

import numpy as np

from allocator._jit import njit

from .._model import FloatArray


@njit(error_model="numpy")
def smooth_forward(
    start: np.ndarray,
    col: np.ndarray,
    lgv: FloatArray,
    theta: FloatArray,
    tau: float,
    logphi: FloatArray,
    logcap: FloatArray,
    demands: FloatArray,
    cinv: FloatArray,
    x: FloatArray,
    w: FloatArray,
    capped: np.ndarray,
) -> FloatArray:
    """Smoothed flows ``x`` and softmax weights ``w`` (written in place, ``(n, k)``), ``capped`` users, and the
    returned relative loads ``load[k, r]`` (the module docstring).

    The eligible pairs are given row-wise (CSR): user ``n`` may use servers ``col[start[n]:start[n + 1]]``, with
    ``lgv`` the matching ``log gamma[n, k]``. Per user: ``s_k = log gamma[n, k] + theta_k``, ``m = max_k s_k``,
    ``w = softmax(s / tau)``, ``log x_n = log phi_n + m + tau log sum_k exp((s_k - m) / tau)`` (the log-sum-exp
    smoothing of ``max_k``), capped at ``log cap_n``; ``x[n, k] = x_n w[n, k]``; ineligible pairs get ``0``.
    """
    n = x.shape[0]
    k, r = cinv.shape
    load = np.zeros((k, r))
    x[:, :] = 0.0
    w[:, :] = 0.0
    for i in range(n):
        lo, hi = start[i], start[i + 1]
        m = -np.inf
        for p in range(lo, hi):
            v = lgv[p] + theta[col[p]]
            if v > m:
                m = v
        zs = 0.0
        for p in range(lo, hi):
            j = col[p]
            a = (lgv[p] + theta[j] - m) / tau
            if a > -746.0:  # exp underflows to exactly 0 below; skipping it is the same value, without the slow path
                z = math.exp(a)
                w[i, j] = z
                zs += z
        lx = logphi[i] + m + tau * math.log(zs)
        cp = lx > logcap[i]
        capped[i] = cp
        tot = math.exp(logcap[i] if cp else lx)
        inv = 1.0 / zs
        for p in range(lo, hi):
            j = col[p]
            wij = w[i, j] * inv
            w[i, j] = wij
            xij = tot * wij
            x[i, j] = xij
            if xij != 0.0:
                for q in range(r):
                    load[j, q] += xij * demands[i, q]
    for j in range(k):
        for q in range(r):
            load[j, q] *= cinv[j, q]
    return load


@njit(error_model="numpy")
def smooth_jacobian(
    x: FloatArray,
    w: FloatArray,
    capped: np.ndarray,
    rk: np.ndarray,
    lk: FloatArray,
    live: np.ndarray,
    demands: FloatArray,
    cinv: FloatArray,
    tau: float,
    cut: float,
) -> FloatArray:
    """Jacobian of ``F_k = log(load[k, rk_k])`` in ``theta`` plus ``I / tau`` (as :class:`_Smooth.evaluate`).

    ``J[k, k'] = sum_n y[n, k] (g[n, k'] - w[n, k'] / tau) / lk_k + [k = k'] / tau`` with ``y[n, k] = d[n, rk_k]
    x[n, k] / c[k, rk_k]`` and ``g = w`` (``0`` for capped users), rows of dead servers zero but for the diagonal.
    Every pair with ``w[n, k] > 0`` enters as a row term (``y[n, k] / lk_k`` sums to 1 over ``n``, so a tiny weight
    matters on a server whose load is tiny), but only those with ``w[n, k'] > cut`` as a column term: the dropped
    ones change each row by at most ``cut / tau`` (plus ``cut`` from ``g``).
    """
    n, k = w.shape
    jac = np.zeros((k, k))
    rows = np.empty(k, dtype=np.int64)
    cols = np.empty(k, dtype=np.int64)
    for i in range(n):
        s = 0
        t = 0
        for j in range(k):
            if w[i, j] > 0.0:
                rows[s] = j
                s += 1
                if w[i, j] > cut:
                    cols[t] = j
                    t += 1
        cp = capped[i]
        for a in range(s):
            ka = rows[a]
            ya = demands[i, rk[ka]] * x[i, ka] * cinv[ka, rk[ka]]
            if ya == 0.0:
                continue
            for bb in range(t):
                kb = cols[bb]
                wb = w[i, kb]
                g = 0.0 if cp else wb
                jac[ka, kb] += ya * (g - wb / tau)
    for j in range(k):
        if live[j]:
            for jj in range(k):
                jac[j, jj] /= lk[j]  # not times 1 / lk: a denormal load would overflow the reciprocal
        else:
            for jj in range(k):
                jac[j, jj] = 0.0
        jac[j, j] += 1.0 / tau
    return jac
