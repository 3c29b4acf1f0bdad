"""Multi-start local search beyond HILL: moves and swaps between any two machines, zero-gain plateau steps with a tabu
list, and several deterministic starts (paper 001 model; the paper's HILL of Sec. 8.1.1 moves one task at a time, only
along the OrS order, and stops at the first point with no strict improvement).

Why HILL gets stuck and what gets out: four unit tasks, types ``[0, 1, 1, 0]``, ``alpha = [[1, .5], [.5, 1]]``, two
machines. BestOrS (Sec. 6.4) returns the types dedicated to machines (cost 8); every single move from there costs 8
too, so HILL stops; a swap of a type-0 and a type-1 task reaches the mixed optimum (cost 6), and so do two moves if
the first, zero-gain one is allowed. The kernel (:mod:`allocator.colocation._search_kernel`) has both.

Starts (deterministic; ``seed`` fixes the kicks): 1. the given start (BestOrS, or BestOrS under the hard limits after
HILL's repair), 2. DEDIC (type ``t`` on machine ``t mod m``, Sec. 8.1.1) when it respects the limits, 3.. iterated
local search: the best partition so far with ``max(2, share * n)`` random tasks sent to random other machines that
can take them, ``share`` cycling over :data:`KICKS` (``numpy.random.default_rng((seed, s))``). Every start runs the
kernel until its descent and plateau steps end or the shared evaluation ``budget`` is spent; the best partition over
all starts is returned. No guarantee: a local optimum of moves, swaps and plateau steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._model import PowerCost, _cost, _Instance, _Limits
from .kernels import load as load_kernels

#: Default number of starts of :func:`search`.
DEFAULT_STARTS = 32
#: Share of the tasks a kick moves, in turn over the starts.
KICKS = (0.1, 0.2, 0.3)
#: Zero-gain plateau steps allowed since the last new best, per start.
DEFAULT_PLATEAU = 50
#: Plateau steps a moved task stays tabu.
DEFAULT_TENURE = 7


@dataclass(frozen=True)
class SearchOutcome:
    """Best partition over the starts, cost evaluations, steps (moves and swaps) taken, starts run."""

    assignment: np.ndarray
    evaluations: int
    moves: int
    starts: int


def compiled_cost(inst: _Instance) -> tuple[int, float] | None:
    """``(kind, exponent)`` of the kernel for ``inst.cost``: 0 linear, 1 power ``x**e``; None for other callables."""
    if inst.cost is None:
        return 0, 1.0
    if isinstance(inst.cost, PowerCost):
        return 1, float(inst.cost.exponent)
    return None


def _fits(assign: np.ndarray, limits: _Limits | None, m: int) -> bool:
    if limits is None:
        return True
    D = np.bincount(assign, weights=limits.demands, minlength=m)
    C = np.bincount(assign, minlength=m)
    return bool(np.all(D <= limits.capacity * (1 + 1e-12) + 1e-12) and np.all(C <= limits.max_tasks))


def _kick(
    best: np.ndarray, inst: _Instance, limits: _Limits | None, rng: np.random.Generator, share: float = 0.1
) -> np.ndarray:
    """``max(2, share * n)`` random tasks of ``best``, each to a random other machine with room under ``limits``.

    The random draws do not depend on ``limits`` while they leave every machine room, so limits that never bind
    give the same kicks as no limits.
    """
    a = best.copy()
    n, m = inst.n, inst.m
    r = min(n, max(2, int(share * n)))
    dem = limits.demands if limits is not None else np.zeros(n)
    cap = limits.capacity if limits is not None else np.full(m, np.inf)
    mt = limits.max_tasks if limits is not None else np.full(m, np.inf)
    D = np.bincount(a, weights=dem, minlength=m)
    C = np.bincount(a, minlength=m).astype(np.float64)
    for i in rng.choice(n, size=r, replace=False):
        room = (D + dem[i] <= cap * (1 + 1e-12) + 1e-12) & (C + 1 <= mt)
        room[a[i]] = False
        ks = np.flatnonzero(room)
        if ks.size == 0:
            continue
        k = int(ks[rng.integers(ks.size)])
        D[a[i]] -= dem[i]
        C[a[i]] -= 1
        D[k] += dem[i]
        C[k] += 1
        a[i] = k
    return a


def search(
    inst: _Instance,
    start: np.ndarray,
    budget: int,
    limits: _Limits | None = None,
    *,
    starts: int = DEFAULT_STARTS,
    seed: int = 0,
    plateau: int = DEFAULT_PLATEAU,
    tenure: int = DEFAULT_TENURE,
) -> SearchOutcome:
    """Best partition found by the multi-start local search (module docstring) from ``start``.

    ``start`` must respect ``limits``; every step keeps them. ``budget`` caps the candidate evaluations over all
    starts. Linear and power costs only (:func:`compiled_cost`).
    """
    spec = compiled_cost(inst)
    if spec is None:
        raise ValueError("the compiled local search evaluates the linear cost and x**k costs only")
    if starts < 1:
        raise ValueError(f"starts must be >= 1, got {starts}")
    kind, expo = spec
    n, m = inst.n, inst.m
    if n == 0:
        return SearchOutcome(np.zeros(0, dtype=np.int64), 0, 0, 0)
    sizes = np.ascontiguousarray(inst.sizes, dtype=np.float64)
    types = np.ascontiguousarray(inst.types, dtype=np.int64)
    alpha = np.ascontiguousarray(inst.alpha, dtype=np.float64)
    dem = np.ascontiguousarray(limits.demands if limits is not None else np.zeros(n), dtype=np.float64)
    cap = np.ascontiguousarray(limits.capacity if limits is not None else np.full(m, np.inf), dtype=np.float64)
    mt = np.ascontiguousarray(limits.max_tasks if limits is not None else np.full(m, np.inf), dtype=np.float64)
    out = np.zeros(3, dtype=np.int64)
    best: np.ndarray | None = None
    best_cost = math.inf
    evaluations = moves = run = 0
    for s in range(starts):
        left = budget - evaluations
        if left <= 0:
            break
        if s == 0:
            a0 = np.asarray(start, dtype=np.int64).copy()
        elif s == 1:
            a0 = inst.types % m
            if not _fits(a0, limits, m):
                continue
        else:
            assert best is not None
            a0 = _kick(best, inst, limits, np.random.default_rng((seed, s)), KICKS[s % len(KICKS)])
        a = load_kernels().local_search(
            sizes, types, dem, a0, alpha, m, kind, expo, limits is not None, cap, mt, left, plateau, tenure, out
        )
        evaluations += int(out[0])
        moves += int(out[1])
        run += 1
        c = _cost(inst, a)
        if c < best_cost - 1e-12 * max(1.0, abs(best_cost)) or best is None:
            best, best_cost = a, c
    assert best is not None
    return SearchOutcome(best, evaluations, moves, run)
