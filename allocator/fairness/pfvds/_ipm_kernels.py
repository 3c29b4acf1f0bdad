"""Compiled pair loops of the PF-VDS(1) interior-point method (:mod:`allocator.fairness.pfvds.ipm`).

The method keeps one entry per eligible pair ``(pn[i], pk[i])`` (about 250,000 at 1,000 users x 500 nodes with 50 %
eligibility) and applies the constraint matrix ``A`` (``sum_n d[n, r] x[n, k]``) and its transpose (``pi[n, k] = sum_r
d[n, r] lambda[k, r]``) several times per iteration; in numpy each application is a gather, a product and a reduction
over ``P x R`` temporaries (about 10 ms). These kernels do each in one pass.
"""

from __future__ import annotations

import numpy as np

from allocator._jit import njit

from .._model import FloatArray


@njit(inline="always")
def _row_price(dp: FloatArray, i: int, lam: FloatArray, k: int) -> float:
    """``sum_r dp[i, r] lam[k, r]``: the price of pair ``i`` on server ``k``."""
    acc = 0.0
    for j in range(dp.shape[1]):
        acc += dp[i, j] * lam[k, j]
    return acc


@njit()
def pair_price(pk: np.ndarray, dp: FloatArray, lam: FloatArray) -> FloatArray:
    """``A^T lambda``: ``out[i] = sum_r dp[i, r] lam[pk[i], r]``."""
    out = np.empty(dp.shape[0])
    for i in range(dp.shape[0]):
        out[i] = _row_price(dp, i, lam, pk[i])
    return out


@njit()
def pair_load(pk: np.ndarray, dp: FloatArray, x: FloatArray, k: int) -> FloatArray:
    """``A x`` as ``(K, R)``: ``out[k, r] = sum_{i: pk[i] = k} dp[i, r] x[i]``."""
    npair, r = dp.shape
    out = np.zeros((k, r))
    for i in range(npair):
        kk = pk[i]
        for j in range(r):
            out[kk, j] += dp[i, j] * x[i]
    return out


@njit()
def server_blocks(pk: np.ndarray, dp: FloatArray, w: FloatArray, k: int) -> FloatArray:
    """``A diag(w) A^T`` restricted to one server: ``out[k] = sum_{i: pk[i] = k} w[i] dp[i] dp[i]^T``."""
    npair, r = dp.shape
    out = np.zeros((k, r, r))
    for i in range(npair):
        kk = pk[i]
        for a in range(r):
            v = w[i] * dp[i, a]
            for b in range(r):
                out[kk, a, b] += v * dp[i, b]
    return out


@njit()
def scaled_coupling(
    pn: np.ndarray, pk: np.ndarray, dp: FloatArray, w: FloatArray, low: FloatArray, n: int
) -> FloatArray:
    """``W^T`` as ``(N, K R)`` for ``W = C^-1 A diag(w) E`` ``(K R, N)``, with ``C`` ``(K, R, R)`` the lower Cholesky
    factor of each server's block (``B_k = C_k C_k^T``, so ``U^T B^-1 U = W^T W``): row ``pn[i]``, columns of server
    ``pk[i]``, accumulates ``w[i] C_k^-1 dp[i]`` (forward substitution). Returned transposed so that ``W`` itself is
    a Fortran-ordered view, the layout BLAS ``syrk`` reads fastest."""
    npair, r = dp.shape
    k = low.shape[0]
    out = np.zeros((n, k * r))
    v = np.empty(r)
    for i in range(npair):
        kk = pk[i]
        nn = pn[i]
        for a in range(r):
            acc = dp[i, a]
            for b in range(a):
                acc -= low[kk, a, b] * v[b]
            v[a] = acc / low[kk, a, a]
            out[nn, kk * r + a] += w[i] * v[a]
    return out


@njit()
def user_and_load(pn: np.ndarray, pk: np.ndarray, dp: FloatArray, v: FloatArray, n: int, k: int) -> tuple:
    """``(E^T v, A v)``: per-user sums ``(N,)`` and server loads ``(K, R)`` of the pair vector ``v`` in one pass."""
    npair, r = dp.shape
    users = np.zeros(n)
    load = np.zeros((k, r))
    for i in range(npair):
        users[pn[i]] += v[i]
        kk = pk[i]
        for j in range(r):
            load[kk, j] += dp[i, j] * v[i]
    return users, load


@njit()
def coupling_t(pn: np.ndarray, pk: np.ndarray, dp: FloatArray, w: FloatArray, v: FloatArray, n: int) -> FloatArray:
    """``E^T diag(w) A^T v``: ``out[n] = sum_{i: pn[i] = n} w[i] sum_r dp[i, r] v[pk[i], r]``."""
    out = np.zeros(n)
    for i in range(dp.shape[0]):
        out[pn[i]] += w[i] * _row_price(dp, i, v, pk[i])
    return out


@njit()
def coupling(pn: np.ndarray, pk: np.ndarray, dp: FloatArray, w: FloatArray, y: FloatArray, k: int) -> FloatArray:
    """``A diag(w) E y`` as ``(K, R)``: ``out[k, r] = sum_{i: pk[i] = k} w[i] dp[i, r] y[pn[i]]``."""
    npair, r = dp.shape
    out = np.zeros((k, r))
    for i in range(npair):
        kk = pk[i]
        v = w[i] * y[pn[i]]
        for j in range(r):
            out[kk, j] += dp[i, j] * v
    return out


@njit()
def pair_step(
    pn: np.ndarray, pk: np.ndarray, dp: FloatArray, w: FloatArray, g: FloatArray, y: FloatArray, lam: FloatArray
) -> FloatArray:
    """``w * (g - y[pn] - A^T lam)`` per pair."""
    out = np.empty(dp.shape[0])
    for i in range(dp.shape[0]):
        out[i] = w[i] * (g[i] - y[pn[i]] - _row_price(dp, i, lam, pk[i]))
    return out


@njit()
def user_sum(pn: np.ndarray, v: FloatArray, n: int) -> FloatArray:
    """``E^T v``: per-user sums of the pair vector ``v``."""
    out = np.zeros(n)
    for i in range(pn.size):
        out[pn[i]] += v[i]
    return out


@njit()
def max_step(v: FloatArray, dv: FloatArray) -> float:
    """Largest ``a`` with ``v + a dv >= 0`` (``inf`` when no entry of ``dv`` is negative)."""
    best = np.inf
    for i in range(v.size):
        if dv[i] < 0.0:
            a = -v[i] / dv[i]
            if a < best:
                best = a
    return best
