"""Multiple resource types (Lai et al., Section IX): DPSOPT and AAMR (Algorithm 3).

Each thread has a ``d``-dimensional utility table ``values[i, x_1, ..., x_d]`` (nondecreasing along every axis) and
each server ``j`` offers ``C_{j,k}`` units of type-``k`` resource.

- :func:`dpsopt` -- the multi-resource super-optimal allocation (Definition IX.1) by the dynamic programme
  ``F_k(x) = max_{z <= min(x, C)} f_k(z) + F_{k-1}(x - z)`` over the ``d``-dimensional pooled capacities; time
  ``O(n * prod_k (mC_k + 1) * prod_k (C_k + 1))`` (the paper's ``O(n C^{2d})``), memory ``O(n prod_k (mC_k + 1))``.
- :func:`aamr` -- Algorithm 3: like Algorithm 1 but on the original (not linearised) functions.
- :func:`reallocate_multi` -- beyond the paper: for AAMR's assignment, the optimal split of every server's units
  among its threads (exact DP over the server's ``d``-dimensional capacity grid); on by default in the entry point.
- :func:`assign_and_allocate_multi` -- the entry point, with the UU/UR/RU/RR baselines applied per resource type.
"""

from __future__ import annotations

import itertools

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import ArrayLike

from .algorithms import random_proportions_split, random_split, uniform_split
from .curves import REL_TOL, FloatArray, IntArray

#: Largest number of DP transitions ``n * prod(T_k + 1) * prod(C_k + 1)`` accepted by :func:`dpsopt`.
DPSOPT_MAX_WORK = 3_000_000_000
#: Largest ``G^2`` (``G`` = capacity grid points of one server) for which :func:`reallocate_multi` builds its dense
#: ``G x G`` difference table (int64, 8 bytes per entry); above it, :func:`dpsopt` per server.
REFINE_DENSE_MAX = 16_000_000


def check_tables(values: ArrayLike) -> FloatArray:
    """Validate ``d``-dimensional utility tables ``(n, C_1+1, ..., C_d+1)``: finite, nonnegative and nondecreasing
    along every resource axis; ``ValueError`` names the first offending thread."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim < 2 or v.shape[0] == 0 or min(v.shape[1:]) < 1:
        raise ValueError(f"multi-resource tables must have shape (n, C_1+1, ..., C_d+1); got {v.shape}")
    axes = tuple(range(1, v.ndim))
    bad = ~np.isfinite(v).all(axis=axes)
    if bad.any():
        raise ValueError(f"thread {int(np.argmax(bad))}: utility table contains NaN or infinite values")
    bad = (v < 0).any(axis=axes)
    if bad.any():
        raise ValueError(f"thread {int(np.argmax(bad))}: utility table has negative values")
    scale = np.maximum(np.abs(v).reshape(v.shape[0], -1).max(axis=1), 1.0)
    for ax in axes:
        if v.shape[ax] < 2:
            continue
        dec = (np.diff(v, axis=ax) < -REL_TOL * scale.reshape((-1,) + (1,) * (v.ndim - 1))).any(axis=axes)
        if dec.any():
            raise ValueError(
                f"thread {int(np.argmax(dec))}: utility table decreases along resource {ax - 1} "
                "(utilities must be nondecreasing)"
            )
    return v


def _capacities(capacities: ArrayLike, d: int) -> IntArray:
    caps = np.asarray(capacities)
    if caps.ndim == 1 and d == 1:
        caps = caps[:, None]
    if caps.ndim != 2 or caps.shape[1] != d or caps.shape[0] == 0:
        raise ValueError(f"capacities must have shape (m, {d}); got {caps.shape}")
    if (caps < 0).any() or (caps != np.round(caps)).any():
        raise ValueError(
            f"server {int(np.argmax(((caps < 0) | (caps != np.round(caps))).any(axis=1)))}: "
            "capacities must be nonnegative integers"
        )
    return caps.astype(np.int64)


def _fit_tables(v: FloatArray, cmax: IntArray) -> FloatArray:
    """Pad tables (flat) up to ``cmax + 1`` points per axis; a table longer than ``cmax + 1`` is an error."""
    pads = []
    for k, c in enumerate(cmax.tolist()):
        ext = v.shape[k + 1]
        if ext > c + 1:
            raise ValueError(f"thread 0: table covers {ext - 1} units of resource {k}, beyond the largest capacity {c}")
        pads.append((0, c + 1 - ext))
    if any(p[1] for p in pads):
        v = np.pad(v, [(0, 0), *pads], mode="edge")
    return v


def dpsopt(values: ArrayLike, totals: ArrayLike) -> tuple[IntArray, float]:
    """DPSOPT (Section IX): optimal split of the pooled ``totals[k]`` units of each type among ``n`` threads, thread
    ``i`` taking ``z <= C`` (the table extent) of each type. Returns ``(c_hat (n, d), F_hat)``. Exact; ties prefer
    lexicographically smaller allocations."""
    v = check_tables(values)
    n, d = v.shape[0], v.ndim - 1
    cap = np.asarray(v.shape[1:], dtype=np.int64) - 1
    tot = np.asarray(totals, dtype=np.int64).reshape(-1)
    if tot.size != d or (tot < 0).any():
        raise ValueError(f"totals must be {d} nonnegative integers")
    T = np.minimum(tot, n * cap)
    work = n * int(np.prod(T + 1)) * int(np.prod(cap + 1))
    if work > DPSOPT_MAX_WORK:
        raise ValueError(f"DPSOPT needs {work:.3g} transitions (limit {DPSOPT_MAX_WORK:.1g}); reduce units or types")
    shape = tuple(int(t) + 1 for t in T)
    F = np.zeros(shape)
    choice = np.zeros((n, *shape), dtype=np.int64)
    Cd = int(cap[-1])
    box = tuple(int(c) + 1 for c in cap)
    for k in range(n):
        f = v[k]
        best = np.full(shape, -np.inf)
        arg = np.zeros(shape, dtype=np.int64)
        for zp in itertools.product(*[range(int(c) + 1) for c in cap[:-1]]):
            if any(z > t for z, t in zip(zp, T[:-1])):
                continue
            src = F[tuple(slice(0, shape[j] - z) for j, z in enumerate(zp))]
            padded = np.concatenate([np.full((*src.shape[:-1], Cd), -np.inf), src], axis=-1)
            win = sliding_window_view(padded, Cd + 1, axis=-1)[..., ::-1]
            cand = win + f[zp]
            zd = np.argmax(cand, axis=-1)
            val = np.take_along_axis(cand, zd[..., None], axis=-1)[..., 0]
            dst = tuple(slice(z, None) for z in zp)
            cur = best[dst]
            better = val > cur
            best[dst] = np.where(better, val, cur)
            flat = np.ravel_multi_index((*[np.full(zd.shape, z) for z in zp], zd), box)
            arg[dst] = np.where(better, flat, arg[dst])
        F = best
        choice[k] = arg
    amount = np.zeros((n, d), dtype=np.int64)
    x = np.asarray(T, dtype=np.int64).copy()
    for k in range(n - 1, -1, -1):
        z = np.asarray(np.unravel_index(int(choice[k][tuple(x)]), box), dtype=np.int64)
        amount[k] = z
        x -= z
    util = float(v[(np.arange(n), *amount.T)].sum())
    return amount, util


def aamr(values: ArrayLike, c_hat: ArrayLike, capacities: ArrayLike) -> tuple[IntArray, IntArray]:
    """AAMR, Algorithm 3 (Section IX). While threads remain: if some thread's whole ``c_hat_i`` fits on some server
    (set ``U``), place the one with the largest ``f_i(c_hat_i)`` there (lines 5-8); otherwise place the (thread,
    server) pair maximising ``f_i(min(C_j, c_hat_i))`` with that allocation (lines 10-11). Ties go to the lowest
    (thread, server) indices -- the literal argmax over pairs; in line 7 this is first fit, which packed better than
    choosing the emptiest server on Section IX's instances. Returns ``(server (n,), amount (n, d))``."""
    v = check_tables(values)
    n, d = v.shape[0], v.ndim - 1
    rem = _capacities(capacities, d).copy()
    ch = np.asarray(c_hat, dtype=np.int64)
    if ch.shape != (n, d):
        raise ValueError(f"c_hat must have shape ({n}, {d})")
    idx = np.arange(n)
    fhat = v[(idx, *ch.T)]
    left = np.ones(n, dtype=bool)
    server = np.zeros(n, dtype=np.int64)
    amount = np.zeros((n, d), dtype=np.int64)
    m = rem.shape[0]
    for _ in range(n):
        fit = (ch[:, None, :] <= rem[None, :, :]).all(axis=2) & left[:, None]
        if fit.any():
            i = int(np.argmax(np.where(fit.any(axis=1), fhat, -np.inf)))
            j = int(np.argmax(fit[i]))
            a = ch[i]
        else:
            alloc = np.minimum(ch[:, None, :], rem[None, :, :])
            val = v[(idx[:, None], *np.moveaxis(alloc, 2, 0))]
            val = np.where(left[:, None], val, -np.inf)
            flat = int(np.argmax(val))
            i, j = divmod(flat, m)
            a = alloc[i, j]
        server[i] = j
        amount[i] = a
        rem[j] -= a
        left[i] = False
    return server, amount


def _grid_differences(cmax: IntArray) -> IntArray:
    """``diff[x, z]`` = flat index of ``x - z`` on the grid ``prod_k (cmax_k + 1)`` when ``z <= x`` componentwise,
    else ``G`` (the grid size, a sentinel); ``x`` and ``z`` are flat (C-order) grid indices."""
    box = tuple(int(c) + 1 for c in cmax)
    G = int(np.prod(box))
    coords = np.stack(np.unravel_index(np.arange(G), box), axis=1)  # (G, d)
    diff = coords[:, None, :] - coords[None, :, :]
    ok = (diff >= 0).all(axis=2)
    flat = np.ravel_multi_index(tuple(np.maximum(diff, 0).transpose(2, 0, 1)), box)
    return np.where(ok, flat, G).astype(np.int64)


def reallocate_multi(
    values: ArrayLike, server: ArrayLike, capacities: ArrayLike, *, current: ArrayLike | None = None
) -> IntArray:
    """Optimal ``d``-resource split for a *fixed* assignment (beyond the paper: Algorithm 3 keeps what a server has
    left). On server ``j`` with threads ``i_1 < ... < i_k``: ``F_r(x) = max_{z <= x} f_{i_r}(z) + F_{r-1}(x - z)``
    over the server's capacity grid ``x <= C_j`` (componentwise), ``F_0 = 0``, split recovered from back-pointers at
    ``x = C_j`` -- DPSOPT (Definition IX.1) restricted to one server. Exact for any nondecreasing tables; ties prefer
    the lexicographically smallest amount for the later thread.

    Vectorised with numpy: with ``G = prod_k (C_max,k + 1)`` grid points (``C_max`` the largest capacity per type),
    step ``r`` updates all servers' value functions with their ``r``-th thread at once through a ``G x G`` table of
    flat ``x - z`` indices (``(servers, G, G)`` candidate blocks, chunked). Time ``O(n G^2)``: for Section IX's
    ``C = (40, 20)``, ``G = 861``, ~7.4e5 transitions per thread. When ``G^2`` exceeds ``REFINE_DENSE_MAX`` it runs
    :func:`dpsopt` on each server instead (same optimum, memory ``O(G C_d)``).

    ``current`` (optional): the amounts Algorithm 3 gave; per server the new split replaces them only if it is not
    worse. Returns ``amount (n, d)``."""
    v = check_tables(values)
    n, d = v.shape[0], v.ndim - 1
    caps = _capacities(capacities, d)
    v = _fit_tables(v, caps.max(axis=0))
    g = np.asarray(server, dtype=np.int64)
    m = caps.shape[0]
    if g.shape != (n,) or (g < 0).any() or (g >= m).any():
        raise ValueError("server must hold one server index in [0, m) per thread")
    cmax = np.asarray(v.shape[1:], dtype=np.int64) - 1
    box = tuple(int(c) + 1 for c in cmax)
    G = int(np.prod(box))
    amount = np.zeros((n, d), dtype=np.int64)
    if G * G > REFINE_DENSE_MAX:
        for j in range(m):
            idx = np.flatnonzero(g == j)
            if idx.size:
                amount[idx], _ = dpsopt(v[idx], caps[j])
    else:
        diff = _grid_differences(cmax)
        flatv = v.reshape(n, G)
        k = np.bincount(g, minlength=m)
        order = np.argsort(g, kind="stable")
        start = np.concatenate([[0], np.cumsum(k)[:-1]])
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n) - start[g[order]]
        F = np.zeros((m, G + 1))
        F[:, G] = -np.inf  # sentinel for z > x
        choice = np.zeros((n, G), dtype=np.int32)
        chunk = max(1, 4_000_000 // (G * G))
        for r in range(int(k.max()) if n else 0):
            idx_r = np.flatnonzero(rank == r)  # at most one thread per server
            for a in range(0, idx_r.size, chunk):
                idx = idx_r[a : a + chunk]
                srv = g[idx]
                cand = F[srv][:, diff] + flatv[idx][:, None, :]  # cand[s, x, z] = F[x - z] + f(z)
                z = np.argmax(cand, axis=2)
                choice[idx] = z
                F[srv, :G] = np.take_along_axis(cand, z[:, :, None], axis=2)[:, :, 0]
        x = np.asarray(np.ravel_multi_index(tuple(caps.T), box), dtype=np.int64)
        xc = caps.copy()
        for r in range(int(k.max()) - 1 if n else -1, -1, -1):
            idx = np.flatnonzero(rank == r)
            z = choice[idx, x[g[idx]]].astype(np.int64)
            zc = np.stack(np.unravel_index(z, box), axis=1)
            amount[idx] = zc
            xc[g[idx]] -= zc
            x[g[idx]] = np.ravel_multi_index(tuple(xc[g[idx]].T), box)
    if current is not None:
        cur = np.asarray(current, dtype=np.int64)
        if cur.shape != (n, d) or (cur < 0).any() or (cur > cmax[None, :]).any():
            raise ValueError(f"current must hold one amount vector in [0, C] per thread, shape ({n}, {d})")
        for t in range(d):
            over = np.bincount(g, weights=cur[:, t], minlength=m) > caps[:, t]
            if over.any():
                raise ValueError(f"server {int(np.argmax(over))}: current amounts exceed its capacity of resource {t}")
        rows = np.arange(n)
        u_new = np.bincount(g, weights=v[(rows, *amount.T)], minlength=m)
        u_old = np.bincount(g, weights=v[(rows, *cur.T)], minlength=m)
        amount = np.where((u_new < u_old)[g][:, None], cur, amount)
    return amount


def assign_and_allocate_multi(
    values: ArrayLike, capacities: ArrayLike, *, method: str = "aamr", refine: bool = True
) -> tuple[IntArray, IntArray]:
    """Assign-and-allocate with ``d`` resource types (Section IX).

    ``values``: ``(n, C_1+1, ..., C_d+1)`` utility tables (padded flat up to the largest capacity per type);
    ``capacities``: ``(m, d)`` integer capacities per server; ``method`` in ``aamr`` (DPSOPT + Algorithm 3) or the
    baselines ``uu, ur, ru, rr`` (applied to every resource type independently, random ones with seed 0).
    ``refine`` (default ``True``, what Walras ships): after AAMR, each server's units of every type are re-split
    optimally among the threads assigned to it (:func:`reallocate_multi`, beyond the paper; the assignment is
    Algorithm 3's and no server's utility is lowered). ``refine=False``: Algorithm 3 exactly as its pseudocode
    reads. The baselines ignore it. Returns ``(server (n,), amount (n, d))`` integer arrays.
    """
    v = check_tables(values)
    d = v.ndim - 1
    caps = _capacities(capacities, d)
    v = _fit_tables(v, caps.max(axis=0))
    n = v.shape[0]
    if method == "aamr":
        c_hat, _ = dpsopt(v, caps.sum(axis=0))
        server, amount = aamr(v, c_hat, caps)
        if refine:
            amount = reallocate_multi(v, server, caps, current=amount)
        return server, amount
    if method in ("uu", "ur", "ru", "rr"):
        rng = np.random.default_rng(0)
        return multi_baseline(method, n, caps, rng)
    raise ValueError(f"unknown method {method!r}; expected 'aamr', 'uu', 'ur', 'ru' or 'rr'")


def multi_baseline(
    kind: str, n: int, capacities: ArrayLike, rng: np.random.Generator, *, random_allocation: str = "remaining"
) -> tuple[IntArray, IntArray]:
    """UU/UR/RU/RR for ``d`` resource types: round-robin or uniformly random servers; equal shares or random amounts
    of each resource type on each server (the single-resource rules of Section VIII applied per type;
    ``random_allocation`` as in :func:`~allocator.aa.algorithms.baseline`)."""
    if random_allocation not in ("remaining", "proportions"):
        raise ValueError(f"random_allocation must be 'remaining' or 'proportions'; got {random_allocation!r}")
    split = random_split if random_allocation == "remaining" else random_proportions_split
    caps = np.asarray(capacities, dtype=np.int64)
    m, d = caps.shape
    server = np.arange(n, dtype=np.int64) % m if kind[0] == "u" else rng.integers(0, m, size=n).astype(np.int64)
    amount = np.zeros((n, d), dtype=np.int64)
    for k in range(d):
        amount[:, k] = uniform_split(server, caps[:, k]) if kind[1] == "u" else split(server, caps[:, k], rng)
    return server, amount
