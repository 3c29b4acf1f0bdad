"""Local search on the assignment (beyond paper 000): relocate and swap moves with exact per-server splits.

The paper's algorithms fix the assignment in one greedy pass (Algorithm 2, Section VI; AANC, Section VII), and the
re-split (:func:`~allocator.aa.superopt.reallocate`) only changes amounts within a server. With unequal capacities --
outside the paper's model (Section III assumes one ``C``; Section X lists heterogeneous servers as future work) -- the
"largest remaining capacity first" rule can put a thread on the wrong server; on nonconcave curves even equal
capacities leave a few percent (``docs/bench/aa.md``). :func:`local_search` improves the assignment:

- the value of a server ``j`` holding the set ``S`` is ``F_S(C_j)``, with ``F_S`` the max-plus convolution of the
  curves in ``S`` (``F_S(x) = max_{z <= x} f_i(z) + F_{S - i}(x - z)``: the single-server optimum, Definition V.1 on
  one server, exact for any nondecreasing curves);
- a **relocate** move sends thread ``i`` from server ``a`` to ``b``; its gain is
  ``F_{S_a - i}(C_a) + max_z [f_i(z) + F_{S_b}(C_b - z)] - F_{S_a}(C_a) - F_{S_b}(C_b)``;
- a **swap** exchanges ``i`` on ``a`` and ``k`` on ``b``; its gain is
  ``max_z [f_k(z) + F_{S_a - i}(C_a - z)] + max_z [f_i(z) + F_{S_b - k}(C_b - z)] - F_{S_a}(C_a) - F_{S_b}(C_b)``.

Every pass computes, for all servers at once, the prefix and suffix convolutions along each server's threads, the
leave-one-out functions ``F_{S - i} = prefix_i (+) suffix_i``, and then the gains of *all* relocate and swap moves
as dense numpy blocks; a move counts as improving if it gains more than ``rel_tol`` of the current total. The total
strictly increases, so the search terminates. Each pass applies the best move and then, best first, every further
improving move whose two servers no applied move touched (server values are independent, so the gains add up
exactly); it stops at a local optimum (``status="converged"``: no relocate or
swap move improves) or after ``max_moves`` moves (``status="capped"``).

Cost per pass, with ``W = C_max + 1``: ``O(n W^2)`` for the convolutions (concave curves: sorted marginals instead,
``O(sum_j k_j^2 W)`` with ``k_j`` threads on server ``j``), ``O(n m W)`` for relocations and
``O(n^2 W)`` for swaps (chunked to bounded memory). Route table (:func:`search_route`): instances with
``n^2 W <= SEARCH_MAX_WORK`` and ``n W^2 <= SEARCH_MAX_WORK`` get relocate + swap; larger ones whose ``n m W`` and
``n W^2`` fit get relocate moves only; beyond that no search runs (``status="skipped"``) -- e.g. the paper-scale
``n = 10^5, C = 10^4`` case, where one pass alone would take minutes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import ArrayLike

from .curves import CurveFamily, FloatArray, IntArray

#: Largest per-pass work (``n^2 W`` for swaps, ``n m W`` for relocations, ``n W^2`` for convolutions).
SEARCH_MAX_WORK = 30_000_000
#: Working block of the chunked candidate arrays (float64 entries).
_BLOCK = 2_000_000


@dataclass(frozen=True)
class SearchResult:
    """Outcome of :func:`local_search`: the improved ``server``; ``status`` ``"converged"`` (no improving relocate or
    swap move is left), ``"capped"`` (``max_moves`` reached) or ``"skipped"`` (instance beyond the route table);
    ``route`` ``"relocate+swap"``, ``"relocate"`` or ``"none"``; ``moves`` applied; ``before`` / ``after`` the total
    utility with every server optimally split, before and after."""

    server: IntArray
    status: str
    route: str
    moves: int
    before: float
    after: float


def search_route(n: int, m: int, width: int) -> str:
    """Which moves :func:`local_search` uses for ``n`` threads, ``m`` servers and ``width = C_max + 1`` table
    columns (see the module docstring)."""
    conv = n * width * width
    if conv > SEARCH_MAX_WORK or m < 2:
        return "none"
    if n * n * width <= SEARCH_MAX_WORK:
        return "relocate+swap"
    if n * m * width <= SEARCH_MAX_WORK:
        return "relocate"
    return "none"


def _maxplus(a: FloatArray, b: FloatArray) -> FloatArray:
    """Row-wise max-plus convolution ``c[s, x] = max_{0 <= z <= x} a[s, z] + b[s, x - z]`` (rows of length ``W``)."""
    B, W = a.shape
    out = np.empty((B, W))
    neg = np.full((1, W - 1), -np.inf)
    chunk = max(1, _BLOCK // (W * W))
    for s in range(0, B, chunk):
        bb = b[s : s + chunk]
        padded = np.concatenate([np.repeat(neg, bb.shape[0], axis=0), bb], axis=1)
        win = sliding_window_view(padded, W, axis=1)[:, :, ::-1]  # win[r, x, z] = b[r, x - z]
        out[s : s + chunk] = (win + a[s : s + chunk, None, :]).max(axis=2)
    return out


def _best_insert(T: FloatArray, R: FloatArray) -> FloatArray:
    """``out[k, r] = max_z T[k, z] + R[r, z]`` for every thread ``k`` and row ``r`` (chunked over ``k``)."""
    n, W = T.shape
    out = np.empty((n, R.shape[0]))
    chunk = max(1, _BLOCK // max(1, R.shape[0] * W))
    for s in range(0, n, chunk):
        out[s : s + chunk] = (T[s : s + chunk, None, :] + R[None, :, :]).max(axis=2)
    return out


def _reversed_at(F: FloatArray, cap: IntArray) -> FloatArray:
    """``R[r, z] = F[r, cap[r] - z]`` for ``z <= cap[r]``, ``-inf`` beyond."""
    W = F.shape[1]
    z = np.arange(W)
    idx = cap[:, None] - z[None, :]
    ok = idx >= 0
    return np.where(ok, np.take_along_axis(F, np.maximum(idx, 0), axis=1), -np.inf)


def _server_functions(T: FloatArray, g: IntArray, m: int) -> tuple[FloatArray, FloatArray]:
    """Per-server value functions ``F[j]`` (all threads of ``j``) and leave-one-out functions ``L[i]`` (threads of
    ``g[i]`` except ``i``), by prefix and suffix max-plus convolutions vectorised over servers (one numpy step per
    rank of a thread on its server)."""
    n, W = T.shape
    k = np.bincount(g, minlength=m)
    order = np.argsort(g, kind="stable")
    start = np.concatenate([[0], np.cumsum(k)[:-1]])
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - start[g[order]]
    K = int(k.max()) if n else 0
    pre = np.zeros((n, W))  # value function of the threads before i on its server
    suf = np.zeros((n, W))  # ... after i
    acc = np.zeros((m, W))
    for r in range(K):
        idx = np.flatnonzero(rank == r)
        pre[idx] = acc[g[idx]]
        acc[g[idx]] = _maxplus(acc[g[idx]], T[idx])
    F = acc
    acc = np.zeros((m, W))
    rev = k[g] - 1 - rank
    for r in range(K):
        idx = np.flatnonzero(rev == r)
        suf[idx] = acc[g[idx]]
        acc[g[idx]] = _maxplus(acc[g[idx]], T[idx])
    L = _maxplus(pre, suf)
    return F, L


def _server_functions_concave(T: FloatArray, g: IntArray, m: int) -> tuple[FloatArray, FloatArray]:
    """:func:`_server_functions` for concave curves: a server's optimal value with ``x`` units is its threads'
    utilities at 0 plus the ``x`` largest marginal utilities among them (greedy, exact for concave curves -- the
    single-server problem of [12] in paper 000), so ``F`` and every leave-one-out ``L`` are cumulative sums of
    sorted marginals: one sort and ``O(k^2 W)`` per server with ``k`` threads instead of ``O(k W^2)``."""
    n, W = T.shape
    marg = np.diff(T, axis=1)  # (n, W - 1), nonincreasing along each row
    F = np.zeros((m, W))
    L = np.zeros((n, W))
    order = np.argsort(g, kind="stable")
    bounds = np.searchsorted(g[order], np.arange(m + 1))
    for j in range(m):
        idx = order[bounds[j] : bounds[j + 1]]
        k = idx.size
        if k == 0:
            continue
        base = T[idx, 0]
        flat = marg[idx].ravel()
        owner = np.repeat(np.arange(k), W - 1)
        by = np.argsort(-flat, kind="stable")
        merged, owner = flat[by], owner[by]  # the server's marginals, best first, and whose they are
        top = merged[: W - 1]
        F[j, 0] = base.sum()
        F[j, 1:] = base.sum() + np.cumsum(np.concatenate([top, np.zeros(W - 1 - top.size)]))
        if k == 1:
            continue  # L of the only thread is the empty server's value, 0
        chunk = max(1, _BLOCK // max(1, k * (W - 1)))
        for a in range(0, k, chunk):
            rows = np.arange(a, min(k, a + chunk))
            # the merged list without thread rows[r]'s marginals is still best first
            keep = owner[None, :] != rows[:, None]
            rest = np.broadcast_to(merged, keep.shape)[keep].reshape(rows.size, -1)[:, : W - 1]
            pad = np.zeros((rows.size, W - 1 - rest.shape[1]))
            lb = base.sum() - base[rows]
            L[idx[rows], 0] = lb
            L[idx[rows], 1:] = lb[:, None] + np.cumsum(np.concatenate([rest, pad], axis=1), axis=1)
    return F, L


def local_search(
    curves: CurveFamily,
    server: ArrayLike,
    capacities: ArrayLike,
    *,
    max_moves: int | None = None,
    rel_tol: float = 1e-12,
    route: str | None = None,
) -> SearchResult:
    """Improve an assignment by best-improvement relocate and swap moves, each server split optimally (see the module
    docstring). ``max_moves`` defaults to ``4 n``; ``route`` overrides :func:`search_route` (``"relocate+swap"``,
    ``"relocate"``, ``"none"``). Returns the new assignment; amounts follow from
    :func:`~allocator.aa.superopt.reallocate` on it."""
    caps = np.asarray(capacities, dtype=np.int64)
    g = np.asarray(server, dtype=np.int64).copy()
    n, m = curves.n, caps.size
    W = int(caps.max()) + 1
    chosen = search_route(n, m, W) if route is None else route
    if chosen not in ("relocate+swap", "relocate", "none"):
        raise ValueError(f"route must be 'relocate+swap', 'relocate' or 'none'; got {route!r}")
    if g.shape != (n,) or (g < 0).any() or (g >= m).any():
        raise ValueError("server must hold one server index in [0, m) per thread")
    if chosen == "none":
        return SearchResult(g, "skipped", "none", 0, float("nan"), float("nan"))
    T = curves.with_capacity(W - 1).table()
    values_of = _server_functions_concave if bool(curves.concave().all()) else _server_functions
    budget = 4 * n if max_moves is None else int(max_moves)
    rows = np.arange(n)
    moves = 0
    before = float("nan")
    status = "capped"
    while True:
        F, L = values_of(T, g, m)
        val = F[np.arange(m), caps]  # server values
        total = float(val.sum())
        if moves == 0:
            before = total
        if moves >= budget:
            break
        tol = rel_tol * max(abs(total), 1.0)
        # relocate: thread i (on a) to server b
        ins = _best_insert(T, _reversed_at(F, caps))  # (n, m): value of b with i added
        out_val = L[rows, caps[g]]  # value of a without i
        reloc = out_val[:, None] + ins - val[g][:, None] - val[None, :]
        reloc[rows, g] = -np.inf
        ri, rb = np.nonzero(reloc > tol)
        gains = [reloc[ri, rb]]
        firsts, seconds, kinds = [ri], [rb], [np.zeros(ri.size, dtype=bool)]
        if chosen == "relocate+swap" and n > 1:
            RL = _reversed_at(L, caps[g])  # RL[i, z] = L_i(C_{g_i} - z)
            M = _best_insert(T, RL)  # M[k, i] = value of g_i without i, with k added
            swap = M + M.T - val[g][:, None] - val[g][None, :]
            swap[g[:, None] >= g[None, :]] = -np.inf  # each unordered pair once, servers differ
            si, sk = np.nonzero(swap > tol)
            gains.append(swap[si, sk])
            firsts.append(si)
            seconds.append(sk)
            kinds.append(np.ones(si.size, dtype=bool))
        gain = np.concatenate(gains)
        if gain.size == 0:
            status = "converged"
            break
        first = np.concatenate(firsts)
        second = np.concatenate(seconds)
        is_swap = np.concatenate(kinds)
        # apply the best move, then every next-best move whose two servers no applied move touched: the values of
        # disjoint server pairs are independent, so each applied gain is exact and the total rises by their sum
        used = np.zeros(m, dtype=bool)
        new_g = g.copy()
        for t in np.argsort(-gain, kind="stable").tolist():
            i = int(first[t])
            a = int(g[i])
            b = int(g[second[t]]) if is_swap[t] else int(second[t])
            if used[a] or used[b]:
                continue
            if is_swap[t]:
                k = int(second[t])
                new_g[i], new_g[k] = b, a
            else:
                new_g[i] = b
            used[a] = used[b] = True
            moves += 1
            if moves >= budget:
                break
        g = new_g
    return SearchResult(g, status, chosen, moves, before, total)
