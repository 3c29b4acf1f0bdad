"""Per-Server Dominant-Share Fairness (PS-DSF, paper 002 Sec. 2.3, Definitions 3-4) and DRF on one server.

PS-DSF: every server ``k`` runs weighted max-min fairness on the virtual dominant shares (eq. 9)
``s[n, k] / phi_n = x_n / (phi_n gamma[n, k])`` of its eligible users, where ``x_n`` counts the user's tasks on *all*
servers. For one server, given the other servers' columns (``o_n = x_n - x[n, k]``), that max-min column is computed
exactly by :func:`fill_server`, a multi-resource progressive filling in the common level ``t``: an unfrozen user holds
``y_n = clip(t phi_n gamma[n, k] - o_n, 0, cap_n)``; when a resource saturates, every unfrozen user that needs it is
frozen (it cannot grow without taking from a user of lower-or-equal VDS); the others keep rising (this is what makes the
column non-wasteful). Each event is found in closed form from the sorted breakpoints of the piecewise-linear usage.

A PS-DSF allocation is exactly a fixed point of these per-server fillings (Definition 4 read server by server), so
:func:`ps_dsf` sweeps Gauss-Seidel over the servers until no column moves by more than ``tol`` (relative). The
fixed-point residual is returned; with one server one filling is exact and PS-DSF is DRF (Sec. 2.3). Every iterate is
feasible and non-wasteful column by column. Convergence of the sweeps is observed (linear, often slow: hundreds of
sweeps on instances with hundreds of servers), not proven here; ``converged`` says whether ``tol`` was met and
:func:`allocator.fairness.allocate` returns ``status="capped"`` when it was not. Slow phases are shortcut by
extrapolating along the sweep moves (:func:`_extrapolation_step`), which changes where the sweeps restart, never the
stopping test.

Non-divisible (time-shared) servers, Problem 2 (eqs. 17-21): the capacity of server ``k`` becomes the single constraint
``sum_n x[n, k] / gamma[n, k] <= 1``. By Theorem 5 the solution of Problem 2 is PS-DSF under that constraint for every
strictly concave increasing utility, so :func:`ps_dsf` with ``time_shared=True`` solves it with the same filling, using
a one-resource server whose per-user demand is ``1 / gamma[n, k]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .._model import FloatArray, Instance
from ..kernels import load as load_kernels
from ._levels import applicable, consistent, level_candidates, pivot


def _first_crossing(b: FloatArray, o: FloatArray, u: FloatArray, dem: FloatArray, rem: FloatArray) -> FloatArray:
    """Smallest ``t`` with ``sum_n dem[n, r] clip(t b_n - o_n, 0, u_n) >= rem[r]``, per resource (``inf`` if never).

    The left side is piecewise linear and non-decreasing in ``t`` with breakpoints ``o_n / b_n`` (the user starts
    receiving) and ``(o_n + u_n) / b_n`` (it reaches its cap).
    """
    r = dem.shape[1]
    start = o / b
    finite_cap = np.isfinite(u)
    end = np.where(finite_cap, (o + np.where(finite_cap, u, 0.0)) / b, np.inf)
    fin = np.flatnonzero(finite_cap)
    times = np.concatenate([start, end[fin]])
    dslope = np.concatenate([dem * b[:, None], -(dem[fin] * b[fin, None])])
    dinter = np.concatenate([dem * o[:, None], -(dem[fin] * (o[fin] + u[fin])[:, None])])
    order = np.argsort(times, kind="stable")
    times = times[order]
    slope = np.cumsum(dslope[order], axis=0)
    inter = np.cumsum(dinter[order], axis=0)
    value = times[:, None] * slope - inter  # usage just after each breakpoint (continuous)
    out = np.full(r, np.inf)
    reached = value >= rem[None, :] * (1 - 1e-13)
    any_reached = reached.any(axis=0)
    j = np.argmax(reached, axis=0)
    for q in range(r):
        if rem[q] <= 0:
            # Saturated already: blocks from the moment a user that needs it would start receiving.
            users = dem[:, q] > 0
            out[q] = start[users].min() if users.any() else np.inf
            continue
        if any_reached[q]:
            jj = j[q]
            if jj == 0:
                out[q] = times[0]
            else:
                s = slope[jj - 1, q]
                out[q] = (rem[q] + inter[jj - 1, q]) / s if s > 0 else times[jj]
                out[q] = min(max(out[q], times[jj - 1]), times[jj])
        else:
            s = slope[-1, q]
            if s > 0:
                out[q] = max((rem[q] + inter[-1, q]) / s, times[-1])
    return out


def fill_server(b: FloatArray, o: FloatArray, u: FloatArray, dem: FloatArray, cap: FloatArray) -> FloatArray:
    """Weighted max-min column of one server on the levels ``(o_n + y_n) / b_n`` (exact progressive filling).

    Args:
        b: ``(m,)`` positive level-to-task rates (``phi_n gamma[n, k]`` for PS-DSF, eq. 9).
        o: ``(m,)`` tasks the users already hold elsewhere (``>= 0``).
        u: ``(m,)`` extra tasks each user may still take (``inf`` = no cap).
        dem: ``(m, r)`` per-task demand on this server.
        cap: ``(r,)`` capacity.

    Returns:
        ``y`` ``(m,)``: tasks given on this server. Feasible (``dem.T @ y <= cap``) and non-wasteful: every user that
        ends below its cap needs at least one saturated resource.
    """
    m = b.size
    y = np.zeros(m)
    active = (u > 0) & (dem > 0).any(axis=1)
    used = np.zeros(cap.size)
    while active.any():
        a = np.flatnonzero(active)
        rem = np.maximum(cap - used, 0.0)
        need = (dem[a] > 0).any(axis=0)
        t_r = np.full(cap.size, np.inf)
        t_r[need] = _first_crossing(b[a], o[a], u[a], dem[a][:, need], rem[need])
        t_star = t_r.min()
        if not np.isfinite(t_star):
            y[a] = u[a]  # every active user reaches its cap before any resource saturates
            break
        ya = np.clip(t_star * b[a] - o[a], 0.0, u[a])
        y[a] = ya
        sat = t_r <= t_star * (1 + 1e-12) + 1e-300
        freeze = (dem[a][:, sat] > 0).any(axis=1) | (ya >= u[a])
        if not freeze.any():  # numerical guard: freeze the users of the first saturating resource
            freeze = dem[a][:, int(np.argmin(t_r))] > 0
        used = used + dem[a[freeze]].T @ ya[freeze]
        active[a[freeze]] = False
    # Remove round-off overshoot so the column is feasible.
    load = dem.T @ y
    with np.errstate(divide="ignore", invalid="ignore"):
        over = np.where(cap > 0, load / np.where(cap > 0, cap, 1.0), np.where(load > 0, np.inf, 0.0))
    worst = over.max() if over.size else 0.0
    if worst > 1.0:
        y = y / worst
    return y


@dataclass(frozen=True)
class PsDsfResult:
    """Outcome of :func:`ps_dsf`.

    Attributes:
        x: ``(n, k)`` tasks.
        sweeps: Gauss-Seidel sweeps used.
        residual: largest change of any column in the last sweep, relative to the user's total (fixed-point residual).
        converged: ``residual <= tol``.
        start: ``"levels"`` when the result is a certified level-solve point (:mod:`allocator.fairness.psdsf._levels`),
            ``"sweeps"`` when it is the output of the plain Gauss-Seidel sweeps.
    """

    x: FloatArray
    sweeps: int
    residual: float
    converged: bool
    start: str = "sweeps"


def _server_problem(inst: Instance, k: int, time_shared: bool) -> tuple[np.ndarray, FloatArray, FloatArray]:
    idx = np.flatnonzero(inst.eligible[:, k])
    if time_shared:
        dem = (1.0 / inst.gamma[idx, k])[:, None]
        cap = np.ones(1)
    else:
        dem = inst.demands[idx]
        cap = inst.capacities[k]
    return idx, dem, cap


def _extrapolation_step(x: FloatArray, move: FloatArray, prev_move: FloatArray) -> float:
    """Length ``a`` of the jump ``x + a * move`` along the last sweep's move (0: no jump).

    Observed structure of the sweeps: the sweep map is piecewise affine, and in long phases it moves a user from one
    server to another by the same amount every sweep (the residual stays flat until the pair drains). When two
    successive moves are parallel (cosine >= 0.99) and of equal length the jump goes straight to the first
    breakpoint on the ray, where some pair reaches 0; when they are parallel and shrink by ``rho < 1`` it is
    Aitken's ``rho / (1 - rho)``, capped at the same breakpoint. Jumps shorter than one sweep's move are skipped.
    """
    n0 = float(np.linalg.norm(prev_move))
    n1 = float(np.linalg.norm(move))
    if n0 <= 0 or n1 <= 0 or float((prev_move * move).sum()) < 0.99 * n0 * n1:
        return 0.0
    rho = n1 / n0
    a = 1e6 if rho >= 0.999 else rho / (1.0 - rho)
    neg = move < 0
    if neg.any():
        a = min(a, float(np.min(x[neg] / -move[neg])))
    return a if a > 1.0 else 0.0


def _sweep(
    x: FloatArray,
    tot: FloatArray,
    probs: list[tuple[np.ndarray, FloatArray, FloatArray]],
    b_all: FloatArray,
    inst: Instance,
) -> float:
    """One Gauss-Seidel sweep of exact fillings, in place; returns the fixed-point residual (largest relative move).

    Each filling is :func:`fill_server`'s, computed by its compiled twin
    :func:`allocator.fairness.psdsf._fill_kernels.fill_column` (1000 x 500 x 3, seed 11: ``ps_dsf`` median 1.83 s ->
    1.43 s, the certifying sweep was a quarter of the solve in interpreter overhead)."""
    residual = 0.0
    for j, (idx, dem, cap) in enumerate(probs):
        if idx.size == 0:
            continue
        old = x[idx, j]
        o = np.maximum(tot[idx] - old, 0.0)
        u = np.maximum(inst.max_tasks[idx] - o, 0.0)
        y = load_kernels().fill_column(b_all[idx, j], o, u, dem, cap)  # compiled fill_server
        diff = np.abs(y - old)
        scale = np.maximum(tot[idx] - old + y, 1e-300)
        residual = max(residual, float((diff / scale).max()))
        tot[idx] += y - old
        x[idx, j] = y
    return residual


#: last temperature of the level continuation (:func:`allocator.fairness.psdsf._levels.level_candidates`)
_TAU_MIN = 1e-6
#: pivots are only tried from a stage whose active set (pairs with softmax weight above the threshold) differs from the
#: previous stage's in at most this many pairs, or from the last stage. Measured with OPENBLAS_NUM_THREADS=1 on
#: random-node instances (200 x 100, 400 x 200, 1000 x 500 seed 11; 400 x 200 seed 3; 1000 x 500 seed 4): at
#: 1000 x 500 every pivot run from a stage that changed 7-600 pairs failed, at 0.02-0.2 s each (about 0.9 s in all for
#: seed 11), and the certified point came from a stage that changed 3 pairs (tau 4.6e-6); at 200 x 100 a stage that
#: changed 14 pairs already gave one, and with the gate a later stage gives it (0.1 s either way at that size).
_SETTLED = 4


def _from_levels(
    inst: Instance,
    probs: list[tuple[np.ndarray, FloatArray, FloatArray]],
    b_all: FloatArray,
    tol: float,
    deadline: float | None,
    max_sweeps: int,
) -> tuple[PsDsfResult | None, FloatArray | None, int]:
    """Certified start points from the smoothed levels (:mod:`allocator.fairness.psdsf._levels`).

    Pivots (:func:`allocator.fairness.psdsf._levels.pivot`) run from a stage only once its active set has settled
    (``_SETTLED``), first with the softmax-weight threshold ``1e-3`` (the one that certified at 400 x 200 and
    1000 x 500), then ``1e-2``; every candidate still has to pass the exact certificate sweep.

    Returns ``(result, x, sweeps)``: ``result`` when a polished point passed the certificate sweep (residual
    ``<= tol``), else ``None`` with a start for the plain sweeps ``x`` (the last certificate sweep's output, else the
    last smoothed flows, else ``None``) and the number of certificate sweeps spent (at most ``max_sweeps``).
    """
    sweeps = 0
    last: FloatArray | None = None
    smooth: FloatArray | None = None
    thresholds = (1e-3, 1e-2)
    prev: dict[float, np.ndarray] = {}
    for state in level_candidates(inst, tau_min=_TAU_MIN):
        smooth = state.x
        if deadline is not None and time.perf_counter() > deadline:
            break
        changed = {}
        for threshold in thresholds:
            act = state.w > threshold
            changed[threshold] = int((act != prev[threshold]).sum()) if threshold in prev else act.size
            prev[threshold] = act
        if state.tau > 1.5e-3:
            continue
        for threshold in thresholds:
            if changed[threshold] > _SETTLED and state.tau > _TAU_MIN * 1.01:
                continue  # the active set still moves from stage to stage: pivots from it were seen to fail
            try:
                for xp in pivot(inst, state, threshold):
                    if sweeps >= max_sweeps:
                        return None, last, sweeps
                    if not consistent(inst, xp):
                        continue
                    x = np.maximum(xp, 0.0)
                    tot = x.sum(axis=1)
                    residual = _sweep(x, tot, probs, b_all, inst)
                    sweeps += 1
                    last = x
                    if residual <= tol:
                        result = PsDsfResult(x=x, sweeps=sweeps, residual=residual, converged=True, start="levels")
                        return result, x, sweeps
            except (RuntimeError, np.linalg.LinAlgError, ValueError):
                continue
    return None, (last if last is not None else smooth), sweeps


def ps_dsf(
    inst: Instance,
    *,
    time_shared: bool = False,
    tol: float = 1e-9,
    max_sweeps: int = 500,
    x0: FloatArray | None = None,
    extrapolate: bool = True,
    max_seconds: float | None = None,
    levels: bool = True,
) -> PsDsfResult:
    """PS-DSF allocation (Definition 4) by Gauss-Seidel sweeps of exact per-server max-min fillings.

    Each server ``k`` in turn replaces its column by :func:`fill_server` with ``b_n = phi_n gamma[n, k]`` given the
    other columns; a sweep that moves no column by more than ``tol`` times the user's total ends the iteration.
    With ``extrapolate`` (default) the iterate jumps along the last move when two successive sweeps moved it the same
    way (:func:`_extrapolation_step`); the jumped point is only a new start for the sweeps, the stopping test is the
    same, so a returned ``converged`` result is a fixed point of the fillings to ``tol`` either way. On random
    instances this roughly halves the sweeps (60 users x 30 nodes: 85 instead of 179 to ``1e-9``); the fixed point
    reached may differ when PS-DSF is not unique (observed: two allocations 1.8e-4 apart in relative totals, both
    meeting Definition 4 to 1e-9).

    With ``levels`` (default), no ``x0``, divisible servers and every user needing every resource
    (:func:`allocator.fairness.psdsf._levels.applicable`), candidate points are first computed from the per-server
    levels (smoothed Newton continuation + exact active-set solve with pivots,
    :func:`allocator.fairness.psdsf._levels.pivot`); a candidate is accepted
    only when one exact sweep from it moves no column by more than ``tol`` -- the same certificate as the plain
    sweeps, so ``residual`` means the same thing on both paths (``start`` says which one produced the result).
    Otherwise the plain sweeps run, started from the best point the level solve produced (on 1000 users x 500 random
    nodes the smoothed flows are a far better start than zero: residual 1.3e-5 after 10 sweeps instead of 9e-2).

    ``max_seconds`` ends the iteration after the first sweep that finishes past that wall-clock budget (``converged``
    still tells whether ``tol`` was met). The result then depends on the machine, so it is meant for benchmarks that
    report time-to-tolerance, not for allocation.
    """
    t_start = time.perf_counter()
    n, k = inst.n, inst.k
    probs = [_server_problem(inst, j, time_shared) for j in range(k)]
    b_all = inst.weights[:, None] * inst.gamma
    used = 0
    if levels and x0 is None and not time_shared and applicable(inst):
        deadline = None if max_seconds is None else t_start + max_seconds
        found, x0, used = _from_levels(inst, probs, b_all, tol, deadline, max_sweeps)
        if found is not None:
            return found
    x = np.zeros((n, k)) if x0 is None else np.array(x0, dtype=np.float64)
    tot = x.sum(axis=1)
    residual = np.inf
    sweeps = used
    prev_move: FloatArray | None = None
    while sweeps < max(max_sweeps, used + 1):
        sweeps += 1
        before = x.copy() if extrapolate else None
        residual = _sweep(x, tot, probs, b_all, inst)
        if residual <= tol:
            break
        if max_seconds is not None and time.perf_counter() - t_start > max_seconds:
            break
        if before is None or sweeps >= max_sweeps:
            continue
        move = x - before
        a = _extrapolation_step(x, move, prev_move) if prev_move is not None else 0.0
        if a > 0:
            x = np.maximum(x + a * move, 0.0)
            tot = x.sum(axis=1)
            prev_move = None
        else:
            prev_move = move
    return PsDsfResult(x=x, sweeps=sweeps, residual=residual, converged=residual <= tol)


def drf(inst: Instance) -> FloatArray:
    """DRF on a single server (Definition 1): one exact progressive filling on weighted dominant shares.

    ``b_n = phi_n / max_r (d[n, r] / c[r]) = phi_n gamma[n, 0]`` (eqs. 2-3).
    """
    if inst.k != 1:
        raise ValueError(f"mechanism 'drf' needs exactly one node (pool), got {inst.k}; use 'drfh', 'tsf' or 'ps-dsf'")
    idx = np.flatnonzero(inst.eligible[:, 0])
    x = np.zeros((inst.n, 1))
    x[idx, 0] = fill_server(
        inst.weights[idx] * inst.gamma[idx, 0],
        np.zeros(idx.size),
        inst.max_tasks[idx],
        inst.demands[idx],
        inst.capacities[0],
    )
    return x
