"""Assignment algorithms of Lai et al. (paper 000) on top of a super-optimal allocation ``c_hat``.

All of them see the *linearised* curves of Equation (1), ``g_i(x) = f_i(c_hat_i) * min(x, c_hat_i) / c_hat_i``, through
two vectors: ``c_hat`` and ``g_hat = f_i(c_hat_i)``.

- :func:`algorithm1` -- Section V-B, Algorithm 1, ``O(m n^2)`` (here ``O(n (n + m))`` vectorised steps).
- :func:`algorithm2` -- Section VI, Algorithm 2: two sorts and a max-heap over remaining capacity, ``O(n log n)``.
- AANC (Section VII) is :func:`algorithm2` fed with the exact nonconcave super-optimal allocation.
- :func:`baseline` -- Section VIII's heuristics UU, UR, RU, RR.

Tie-breaking (the paper leaves it open): among equal keys the lower thread index comes first (stable sorts). Algorithm
2 always takes the server with the most remaining capacity (its line 6), lowest index first. In Algorithm 1's line 6
every server that can hold ``c_hat_i`` gives the same ``g_i``; ``fit="first"`` (default: the lowest-indexed such
server, the literal argmax over pairs) packs better on average, ``fit="worst"`` (the one with the most remaining
capacity) is the choice under which Theorem V.18's 5/6 instance is realised. The proofs of Section V-C do not depend
on which server a full thread takes, so both keep the ``2(sqrt 2 - 1)`` guarantee.

Heterogeneous capacities (beyond the paper; its Section X lists them as future work): both algorithms run unchanged
with per-server capacities ``C_j`` and ``c_hat`` computed on ``sum_j C_j`` pooled units with each thread capped at
``max_j C_j`` -- "largest remaining capacity first". The ``2(sqrt 2 - 1)`` and ``1/2`` guarantees are proven only for
equal capacities; for unequal ones the ratio is measured, not guaranteed.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from .curves import FloatArray, IntArray
from .search import SearchResult


@dataclass(frozen=True)
class Step:
    """One loop iteration: ``thread`` placed on ``server`` with ``amount`` units; ``full`` when it received its
    super-optimal allocation (the set ``D`` of Section V-C); ``remaining`` = every server's capacity afterwards."""

    thread: int
    server: int
    amount: int
    full: bool
    remaining: tuple[int, ...]


@dataclass(frozen=True)
class Placement:
    """Result of an assignment algorithm: ``server[i]`` (0-based) and ``amount[i]`` units for thread ``i``;
    ``order`` the threads in the order they were placed; ``steps`` the per-iteration trace when requested;
    ``search`` the outcome of the assignment local search when :func:`~allocator.aa.solve` ran it (``None``
    otherwise; its ``server`` is then this placement's ``server``)."""

    server: IntArray
    amount: IntArray
    order: IntArray
    steps: list[Step] = field(default_factory=list)
    search: SearchResult | None = None


def _check_inputs(c_hat: ArrayLike, g_hat: ArrayLike, capacities: ArrayLike) -> tuple[IntArray, FloatArray, IntArray]:
    c = np.asarray(c_hat)
    g = np.asarray(g_hat, dtype=np.float64)
    caps = np.asarray(capacities)
    if c.ndim != 1 or g.shape != c.shape:
        raise ValueError("c_hat and g_hat must be 1-D arrays of the same length")
    if caps.ndim != 1 or caps.size == 0:
        raise ValueError("capacities must be a non-empty 1-D sequence")
    if (c < 0).any() or (c != np.round(c)).any():
        raise ValueError(f"thread {int(np.argmax((c < 0) | (c != np.round(c))))}: c_hat must be a nonnegative integer")
    if not np.isfinite(g).all() or (g < 0).any():
        raise ValueError(f"thread {int(np.argmax(~np.isfinite(g) | (g < 0)))}: g_hat must be finite and >= 0")
    return c.astype(np.int64), g, caps.astype(np.int64)


def algorithm1(
    c_hat: ArrayLike, g_hat: ArrayLike, capacities: ArrayLike, *, trace: bool = False, fit: str = "first"
) -> Placement:
    """Algorithm 1 (Section V-B). While threads remain: if some remaining thread fits its ``c_hat_i`` on some server
    (set ``U`` nonempty), place the one with the largest ``g_i(c_hat_i)`` with ``c_hat_i`` units (lines 4-7) on the
    first (``fit="first"``) or the emptiest (``fit="worst"``) server that holds it; otherwise give the remaining
    thread with the largest ``g_i(C_j)`` all of the best server's remaining ``C_j`` (lines 9-10) -- ``g_i`` is
    nondecreasing, so that is the server with the most remaining capacity.
    """
    if fit not in ("first", "worst"):
        raise ValueError(f"fit must be 'first' or 'worst'; got {fit!r}")
    c, g, rem = _check_inputs(c_hat, g_hat, capacities)
    rem = rem.copy()
    n = c.size
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(c > 0, g / np.maximum(c, 1), 0.0)
    left = np.ones(n, dtype=bool)
    server = np.zeros(n, dtype=np.int64)
    amount = np.zeros(n, dtype=np.int64)
    order = np.zeros(n, dtype=np.int64)
    steps: list[Step] = []
    for it in range(n):
        j = int(np.argmax(rem))
        cmax = int(rem[j])
        feas = left & (c <= cmax)
        if feas.any():
            i = int(np.argmax(np.where(feas, g, -np.inf)))
            a = int(c[i])
            if fit == "first":
                j = int(np.argmax(rem >= a))
            full = True
        else:
            i = int(np.argmax(np.where(left, slope, -np.inf)))
            a = cmax
            full = False
        server[i], amount[i], order[it] = j, a, i
        rem[j] -= a
        left[i] = False
        if trace:
            steps.append(Step(i, j, a, full, tuple(int(r) for r in rem)))
    return Placement(server, amount, order, steps)


def algorithm2_order(c_hat: ArrayLike, g_hat: ArrayLike, m: int) -> IntArray:
    """Lines 1-2 of Algorithm 2: threads by nonincreasing ``g_i(c_hat_i)``; then threads ``m+1..n`` of that order
    re-sorted by nonincreasing slope ``g_i(c_hat_i) / c_hat_i`` (stable; a thread with ``c_hat_i = 0`` has slope
    ``+inf`` if ``g_hat_i > 0`` -- it consumes nothing)."""
    c = np.asarray(c_hat, dtype=np.int64)
    g = np.asarray(g_hat, dtype=np.float64)
    first = np.argsort(-g, kind="stable")
    head, tail = first[:m], first[m:]
    ct, gt = c[tail], g[tail]
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(ct > 0, gt / np.maximum(ct, 1), np.where(gt > 0, np.inf, 0.0))
    return np.concatenate([head, tail[np.argsort(-slope, kind="stable")]]).astype(np.int64)


def algorithm2(c_hat: ArrayLike, g_hat: ArrayLike, capacities: ArrayLike, *, trace: bool = False) -> Placement:
    """Algorithm 2 (Section VI): visit threads in :func:`algorithm2_order`; each goes to the server with the most
    remaining capacity (max-heap ``H``, lines 4 and 6) and receives ``min(c_hat_i, C_j)`` units (line 7).

    Read against the paper line by line: the tail is sorted by *nonincreasing* slope (line 2 and the text before it;
    the analysis' "nondecreasing" in its Lemma V.10 item is a slip -- unfull threads take the current maximum
    remaining capacity, which only shrinks, so Lemma V.10 needs the steepest first); the server is always the one
    with the most remaining capacity (line 6, used by the Lemma V.5 and V.7 items); and capacity a server still has
    after the loop is *not* redistributed (Lemma V.7's proof has ``C_j > 0`` left on the servers holding only full
    threads). :func:`~allocator.aa.superopt.reallocate` (``solve(..., refine=True)``) is that redistribution, beyond
    the paper."""
    c, g, caps = _check_inputs(c_hat, g_hat, capacities)
    n, m = c.size, caps.size
    order = algorithm2_order(c, g, m)
    heap = [(-int(C), j) for j, C in enumerate(caps.tolist())]
    heapq.heapify(heap)
    cl = c.tolist()
    srv = [0] * n
    amt = [0] * n
    steps: list[Step] = []
    rem = caps.copy() if trace else caps
    for i in order.tolist():
        negC, j = heap[0]
        a = cl[i] if cl[i] < -negC else -negC
        heapq.heapreplace(heap, (negC + a, j))
        srv[i] = j
        amt[i] = a
        if trace:
            rem[j] -= a
            steps.append(Step(i, j, a, a == cl[i], tuple(int(r) for r in rem)))
    return Placement(np.asarray(srv, dtype=np.int64), np.asarray(amt, dtype=np.int64), order, steps)


def uniform_split(server: IntArray, capacities: IntArray) -> IntArray:
    """Equal shares: the ``k`` threads on server ``j`` get ``floor(C_j / k)`` units each, and the ``C_j mod k``
    leftover units go one each to its lowest-indexed threads (so the whole server is used)."""
    m = capacities.size
    k = np.bincount(server, minlength=m)
    base = capacities // np.maximum(k, 1)
    extra = capacities - base * k
    # rank of each thread among the threads of its server, by index
    order = np.argsort(server, kind="stable")
    start = np.concatenate([[0], np.cumsum(k)[:-1]])
    rank = np.empty_like(server)
    rank[order] = np.arange(server.size) - start[server[order]]
    return (base[server] + (rank < extra[server])).astype(np.int64)


def random_split(server: IntArray, capacities: IntArray, rng: np.random.Generator) -> IntArray:
    """Random amounts (Section VIII's "R" allocation): the threads of server ``j``, in assignment (index) order, each
    draw an amount uniformly from ``{0, ..., what j still has}``, i.e. ``floor(u * (rest + 1))`` with ``u ~ U[0, 1)``.

    This is the reading Section VIII's text requires: "UR does not achieve optimal utility even for beta = 1, since
    it allocates threads random amounts of resources" -- a thread alone on its server gets a random amount, not the
    whole server, so a random allocation need not use all of a server (an earlier reading, uniformly random
    proportions of the whole server, :func:`random_proportions_split`, made UR optimal at beta = 1). Vectorised over
    servers: one step per rank of a thread on its server."""
    u = rng.uniform(0.0, 1.0, size=server.size)
    return random_split_from_uniforms(server, capacities, u)


def random_split_from_uniforms(server: IntArray, capacities: IntArray, u: FloatArray) -> IntArray:
    """The deterministic core of :func:`random_split` for given uniforms ``u`` in ``[0, 1)``: thread ``i``, the
    ``r``-th thread (by index) on server ``j``, gets ``floor(u_i * (rest + 1))`` units where ``rest`` is what the
    ``r - 1`` threads before it on ``j`` left of ``C_j``."""
    server = np.asarray(server, dtype=np.int64)
    caps = np.asarray(capacities, dtype=np.int64)
    u = np.asarray(u, dtype=np.float64)
    if u.shape != server.shape or (u < 0).any() or (u >= 1).any():
        raise ValueError("u must hold one uniform draw in [0, 1) per thread")
    n, m = server.size, caps.size
    k = np.bincount(server, minlength=m)
    order = np.argsort(server, kind="stable")
    start = np.concatenate([[0], np.cumsum(k)[:-1]])
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - start[server[order]]
    rest = caps.copy()
    amount = np.zeros(n, dtype=np.int64)
    for r in range(int(k.max()) if n else 0):
        idx = np.flatnonzero(rank == r)  # at most one thread per server
        a = np.floor(u[idx] * (rest[server[idx]] + 1)).astype(np.int64)
        a = np.minimum(a, rest[server[idx]])
        amount[idx] = a
        rest[server[idx]] -= a
    return amount


def random_proportions_split(server: IntArray, capacities: IntArray, rng: np.random.Generator) -> IntArray:
    """Alternative random allocation (not the paper's, see :func:`random_split`; kept for the benchmark's
    sensitivity rows): server ``j``'s ``C_j`` units split among its threads in proportions drawn uniformly from the
    simplex (Dirichlet(1)), rounded to integers by largest remainder so the whole server is used."""
    n, m = server.size, capacities.size
    w = rng.exponential(size=n)
    tot = np.bincount(server, weights=w, minlength=m)
    share = w / tot[server] * capacities[server]
    base = np.floor(share).astype(np.int64)
    left = capacities - np.bincount(server, weights=base, minlength=m).astype(np.int64)
    frac = share - base
    order = np.lexsort((-frac, server))
    k = np.bincount(server, minlength=m)
    start = np.concatenate([[0], np.cumsum(k)[:-1]])
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - start[server[order]]
    return base + (rank < left[server])


def baseline(
    kind: str,
    n: int,
    capacities: ArrayLike,
    rng: np.random.Generator | int | None = 0,
    *,
    random_allocation: str = "remaining",
) -> Placement:
    """Section VIII's heuristics. First letter = assignment, second = allocation; ``U`` = uniform (round robin
    ``i mod m`` / equal shares), ``R`` = random (uniform server / random amounts). ``kind`` in ``uu, ur, ru, rr``.

    ``random_allocation``: ``"remaining"`` (default, the paper's reading, :func:`random_split`: each thread a uniformly
    random amount of what its server still has) or ``"proportions"`` (:func:`random_proportions_split`: uniformly
    random proportions of the whole server; not the paper's, kept for comparison)."""
    caps = np.asarray(capacities, dtype=np.int64)
    kind = kind.lower()
    if kind not in ("uu", "ur", "ru", "rr"):
        raise ValueError(f"unknown baseline {kind!r}; expected 'uu', 'ur', 'ru' or 'rr'")
    if random_allocation not in ("remaining", "proportions"):
        raise ValueError(f"random_allocation must be 'remaining' or 'proportions'; got {random_allocation!r}")
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    m = caps.size
    if kind[0] == "u":
        server = np.arange(n, dtype=np.int64) % m
    else:
        server = gen.integers(0, m, size=n).astype(np.int64)
    if kind[1] == "u":
        amount = uniform_split(server, caps)
    elif random_allocation == "remaining":
        amount = random_split(server, caps, gen)
    else:
        amount = random_proportions_split(server, caps, gen)
    return Placement(server, amount, np.arange(n, dtype=np.int64))
