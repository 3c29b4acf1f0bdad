"""Gavel's heterogeneity-aware max-min fairness ("LAS") and its round-based time slicing, for the simulator.

Narayanan, Santhanam, Kazhamiaka, Phanishayee, Zaharia, *Heterogeneity-Aware Cluster Scheduling Policies for Deep
Learning Workloads*, OSDI 2020 ("Gavel"). Written from the paper's formulation (Sec. 3.1, 4.1, 5), not from its code.

Allocation (Sec. 3.1). ``X[i, j]`` is the fraction of wall-clock time job i runs on accelerator type j, holding its
``scale[i]`` accelerators of that type. Constraints: ``X >= 0``; ``sum_j X[i, j] <= 1`` (a job runs on one type at a
time); ``sum_i scale[i] X[i, j] <= capacity[j]`` (accelerator-time of type j). Job i's *effective throughput* is
``throughput[i] . X[i]``.

Policy (Sec. 4.1, the "LAS" / max-min fairness objective). Maximise over X the minimum over jobs of
``throughput[i] . X[i] / (w[i] * throughput[i] . Xeq[i])``, where ``Xeq[i]`` is job i's *equal share*. Exact
normalisation used here: with ``n`` jobs and ``C = sum_j capacity[j]`` accelerators, an equal share gives every job
``C / n`` accelerators' worth of time, spread over the types in proportion to their counts, and never more than the
whole time: ``Xeq[i, j] = (capacity[j] / C) * min(1, C / (n * scale[i]))``. Without the ``min`` this is Gavel's
normaliser (throughput under the equal split over types, multiplied by the scale factor so that a job on ``s``
accelerators gets ``1/s`` of the time of a single-accelerator job): both give the same allocation whenever every job's
equal share is below full time (``n * scale[i] >= C``, a saturated cluster). The ``min`` keeps ``Xeq`` a feasible
allocation, so with unit weights the optimum is at least 1 (every job does at least as well as under its equal share,
Gavel's sharing-incentive argument) and ``objective`` reads as "fraction of the equal-share throughput the worst job
gets". ``w[i]`` (default 1) is job i's weight: a job of weight 2 needs twice the normalised throughput to count as well
served, so at a saturated optimum it gets twice the normalised throughput of a weight-1 job bottlenecked alongside it.

Jobs that cannot run anywhere (zero throughput on every type with enough accelerators for their scale) are left out
of the minimum and get a zero row; a pair (i, j) with ``throughput[i, j] == 0`` or ``scale[i] > capacity[j]`` is fixed
at ``X[i, j] = 0`` (the job cannot hold ``scale[i]`` accelerators of that type).

Choice among optima. The max-min LP is degenerate: only the bottleneck jobs are pinned, the others may take any slack.
A second LP fixes the max-min value (``ratio_i / w_i >= t*`` up to the solver tolerance, ``1e-7`` relative) and
maximises the total normalised throughput ``sum_i throughput[i] . X[i] / throughput[i] . Xeq[i]``, so that capacity the
bottleneck jobs cannot use goes to jobs that can (a one-step version of Gavel's water filling, Sec. 4.3). Both LPs are
solved with HiGHS through :func:`scipy.optimize.linprog` on sparse constraint matrices; HiGHS is deterministic on the
same input, so the allocation is a function of the input.

Mechanism (Sec. 5). Gavel realises X with rounds of :data:`ROUND_SECONDS` (6 minutes): each round, the priority of
job i on type j is ``X[i, j]`` divided by the fraction of time job i has received on type j; pairs are taken in
decreasing priority and a job gets the type if it has not been given one this round and ``scale[i]`` accelerators of
that type are still free. See :func:`time_slice`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

#: Gavel's round length (Sec. 5): allocations are realised by 6-minute leases.
ROUND_SECONDS = 360.0

#: The second LP keeps every job at ``ratio_i / w_i >= t* (1 - _T_SLACK)``: HiGHS's feasibility tolerance is 1e-7, so
#: pinning t exactly at the first LP's optimum can be reported infeasible by a rounding hair.
_T_SLACK = 1e-7


@dataclass(frozen=True)
class FairShare:
    """Gavel's max-min fair allocation.

    ``allocation[i, j]``: fraction of time job i runs on accelerator type j (rows sum to at most 1; ``scale``-weighted
    columns to at most ``capacity``). ``objective``: the LP's max-min value ``min_i ratio_i / w_i`` over the jobs that
    can run (``inf`` when none can: the minimum over an empty set). ``status``: ``"optimal"`` when both LPs solved to
    optimality, else HiGHS's status text of the one that did not (the allocation is then all zeros).
    """

    allocation: np.ndarray
    objective: float
    status: str


def equal_share(scale: np.ndarray, capacity: np.ndarray, n_jobs: int | None = None) -> np.ndarray:
    """``Xeq[i, j] = (capacity[j] / C) * min(1, C / (n * scale[i]))``: job i's equal share of the cluster's time.

    ``n`` defaults to ``len(scale)``. See the module docstring for why this is Gavel's normaliser (Sec. 4.1).
    """
    s = np.asarray(scale, dtype=np.float64)
    c = np.asarray(capacity, dtype=np.float64)
    n = len(s) if n_jobs is None else n_jobs
    total = float(c.sum())
    if n == 0 or total <= 0.0:
        return np.zeros((len(s), len(c)))
    share = np.minimum(1.0, total / (n * s))
    return np.outer(share, c / total)


def max_min_fairness(
    throughput: np.ndarray,
    scale: np.ndarray,
    capacity: np.ndarray,
    weights: np.ndarray | None = None,
) -> FairShare:
    """Gavel's heterogeneity-aware max-min fair allocation (Sec. 4.1), solved with HiGHS.

    ``throughput[i, j]``: job i's throughput (work units per second) on type j with all its ``scale[i]`` accelerators
    (0: cannot run there). ``capacity[j]``: accelerators of type j. ``weights[i] > 0`` (default 1). Solves
    ``max t  s.t.  throughput[i] . X[i] >= t * w[i] * throughput[i] . Xeq[i]`` for every job that can run, the
    allocation constraints of Sec. 3.1, then the tie-breaking LP (maximum total normalised throughput at that t)
    described in the module docstring.
    """
    thr = np.asarray(throughput, dtype=np.float64)
    s = np.asarray(scale, dtype=np.float64)
    cap = np.asarray(capacity, dtype=np.float64)
    n, m = thr.shape
    if s.shape != (n,) or cap.shape != (m,):
        raise ValueError(f"scale must be ({n},) and capacity ({m},); got {s.shape} and {cap.shape}")
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (n,) or np.any(w <= 0):
        raise ValueError("weights must be a positive (n,) vector")
    if np.any(s <= 0) or np.any(cap < 0) or np.any(~np.isfinite(thr)) or np.any(thr < 0):
        raise ValueError("scale must be positive, capacity non-negative, throughput finite and non-negative")

    usable = (thr > 0) & (s[:, None] <= cap[None, :])
    active = usable.any(axis=1)
    allocation = np.zeros((n, m))
    n_active = int(active.sum())
    if n_active == 0:
        return FairShare(allocation, float("inf"), "optimal")

    jobs = np.flatnonzero(active)
    eff_all = np.where(usable, thr, 0.0)[jobs]
    # Identical jobs (same usable throughputs, scale and weight) form one group with one allocation row: averaging
    # the rows of identical jobs in any optimal solution of either LP gives a feasible solution with the same
    # objective values (both LPs are symmetric in identical jobs and linear), so the grouped LP loses nothing.
    key = np.column_stack([eff_all, s[jobs], w[jobs]])
    groups, first_of, member_of, count = np.unique(
        key, axis=0, return_index=True, return_inverse=True, return_counts=True
    )
    member_of = member_of.reshape(-1)
    n_groups = len(groups)
    eff = eff_all[first_of]
    s_g = s[jobs][first_of]
    w_g = w[jobs][first_of]
    xeq = equal_share(s_g, cap, n_active)
    norm = (eff * xeq).sum(axis=1)  # > 0: each active job has a usable type with capacity >= scale > 0
    rows_g, cols_j = np.nonzero(eff > 0)  # variables: one per usable (group, type) pair, row-major
    k = len(rows_g)
    ratio_coef = eff[rows_g, cols_j] / norm[rows_g]  # d ratio_i / d X_ij for a member i of the group
    var = np.arange(k)

    # Rows: [fairness (groups) | time (groups) | capacity (m)]; columns: [X pairs (k) | t].
    fair = sp.csr_matrix(
        (
            np.concatenate([-ratio_coef / w_g[rows_g], np.ones(n_groups)]),
            (np.concatenate([rows_g, np.arange(n_groups)]), np.concatenate([var, np.full(n_groups, k)])),
        ),
        shape=(n_groups, k + 1),
    )
    time = sp.csr_matrix((np.ones(k), (rows_g, var)), shape=(n_groups, k + 1))
    accel = sp.csr_matrix(((count * s_g)[rows_g], (cols_j, var)), shape=(m, k + 1))
    a_ub = sp.vstack([fair, time, accel], format="csr")
    b_ub = np.concatenate([np.zeros(n_groups), np.ones(n_groups), cap])
    bounds = np.column_stack([np.zeros(k + 1), np.append(np.ones(k), np.inf)])

    # The max-min LP is highly degenerate (every bottleneck row is tight at once): the interior-point method (with
    # HiGHS's crossover) solves it several times faster than simplex; the second LP is not, and dual simplex is faster.
    first = linprog(np.append(np.zeros(k), -1.0), A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs-ipm")
    if first.status != 0:
        return FairShare(allocation, float("nan"), str(first.message))
    t_star = float(first.x[k])

    bounds[k, 0] = t_star * (1.0 - _T_SLACK)
    second = linprog(
        np.append(-(count[rows_g] * ratio_coef), 0.0), A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs-ds"
    )
    if second.status != 0:
        return FairShare(allocation, t_star, str(second.message))
    per_group = np.zeros((n_groups, m))
    per_group[rows_g, cols_j] = np.clip(second.x[:k], 0.0, 1.0)
    allocation[jobs] = per_group[member_of]
    return FairShare(allocation, t_star, "optimal")


def time_slice(allocation: np.ndarray, scale: np.ndarray, capacity: np.ndarray, received: np.ndarray) -> np.ndarray:
    """(n,) accelerator type index each job runs on during the next round, or -1 (Gavel Sec. 5).

    ``received[i, j]``: seconds job i has run on type j so far. Gavel's priority of job i on type j is ``X[i, j]``
    over the fraction of time job i has received on j; when every counter covers the same window of ``E`` seconds
    (since the allocation was computed, or since the simulation started) that fraction is ``received[i, j] / E``,
    and the common ``E`` does not change the order, so the priority used is ``X[i, j] / received[i, j]`` (``inf``
    for a pair never run: new jobs first, as in Gavel). When the jobs' windows differ (jobs that arrived at
    different times, counters kept across re-allocations), pass each job's fractions ``seconds / window_i`` instead:
    only the ratios matter, and the priority is then exactly Gavel's. Counters reset at every re-allocation make
    every pair ``inf`` again, and the round degenerates to "largest ``X[i, j]`` first" until the counters grow.
    Pairs with ``X[i, j] == 0`` never run. Pairs are taken in
    decreasing priority, ties by larger ``X[i, j]``, then lower job index, then lower type index; a job takes the
    type if it has none yet this round and ``scale[i]`` accelerators of the type are still free. Never assigns more
    than ``capacity[j]`` accelerators of type j (sum of ``scale`` over the jobs given j).
    """
    x = np.asarray(allocation, dtype=np.float64)
    s = np.asarray(scale, dtype=np.float64)
    left = np.asarray(capacity, dtype=np.float64).copy()
    got = np.asarray(received, dtype=np.float64)
    n = x.shape[0]
    choice = np.full(n, -1, dtype=np.int64)
    rows_i, cols_j = np.nonzero((x > 0) & (s[:, None] <= left[None, :]))
    if len(rows_i) == 0:
        return choice
    xs = x[rows_i, cols_j]
    r = got[rows_i, cols_j]
    with np.errstate(divide="ignore"):
        priority = np.where(r > 0, xs / np.where(r > 0, r, 1.0), np.inf)
    order = np.lexsort((cols_j, rows_i, -xs, -priority))  # last key is the primary one
    smallest = float(s.min())
    free = left.tolist()
    sizes = s.tolist()
    taken = [False] * n
    for i, j in zip(rows_i[order].tolist(), cols_j[order].tolist(), strict=True):
        if taken[i] or sizes[i] > free[j]:
            continue
        taken[i] = True
        choice[i] = j
        free[j] -= sizes[i]
        if max(free) < smallest:
            break
    return choice


def max_min_fairness_as_gavel(throughput: np.ndarray, scale: np.ndarray, capacity: np.ndarray) -> FairShare:
    """Gavel's own ``max_min_fairness_perf`` LP as its code states it (``policies/max_min_fairness.py``,
    ``MaxMinFairnessPolicyWithPerf``; OSDI 2020 Sec. 4.1), for comparing the engines: ``max t`` s.t. ``s_i *
    throughput[i] . X[i] / p_i >= t`` for every job, ``sum_j X[i, j] <= 1``, ``sum_i s_i X[i, j] <= capacity[j]``,
    ``X >= 0``, where ``p_i = throughput[i] . capacity / sum(capacity)`` (its ``ProportionalPolicy``: every row
    ``capacity[j] / n`` scaled to a row sum of 1, which is ``capacity[j] / C`` whatever ``n``). One LP, no
    tie-breaking: Gavel solves it with ECOS, an interior-point method, and uses the point it returns; here HiGHS' IPM
    without crossover, which also stops inside the optimal face instead of at a vertex. Where capacity is spare
    (low load) that point spreads jobs over slower types that :func:`max_min_fairness`'s second LP would not give
    them. Differences kept from Gavel's: none in the model; the interior point reached may differ (another IPM)."""
    import highspy
    from highspy import _core

    thr = np.asarray(throughput, dtype=np.float64)
    s = np.asarray(scale, dtype=np.float64)
    cap = np.asarray(capacity, dtype=np.float64)
    n, m = thr.shape
    allocation = np.zeros((n, m))
    if n == 0:
        return FairShare(allocation, float("inf"), "optimal")
    prop = thr @ (cap / cap.sum())
    rows_i, cols_j = np.nonzero(thr > 0)
    k = len(rows_i)
    coef = s[rows_i] * thr[rows_i, cols_j] / prop[rows_i]
    # rows: fairness (n): coef . x - t >= 0; time (n): sum x <= 1; capacity (m): sum s x <= cap
    starts, index, value = [0], [], []
    for i in range(n):
        cols = np.flatnonzero(rows_i == i)
        index += [*cols.tolist(), k]
        value += [*coef[cols].tolist(), -1.0]
        starts.append(len(index))
    for i in range(n):
        cols = np.flatnonzero(rows_i == i)
        index += cols.tolist()
        value += [1.0] * len(cols)
        starts.append(len(index))
    for j in range(m):
        cols = np.flatnonzero(cols_j == j)
        index += cols.tolist()
        value += s[rows_i[cols]].tolist()
        starts.append(len(index))
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = k + 1, 2 * n + m
    lp.col_cost_ = np.append(np.zeros(k), -1.0)
    lp.col_lower_ = np.zeros(k + 1)
    lp.col_upper_ = np.append(np.ones(k), inf)
    lp.row_lower_ = np.concatenate([np.zeros(n), np.full(n + m, -inf)])
    lp.row_upper_ = np.concatenate([np.full(n, inf), np.ones(n), cap])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = k + 1, 2 * n + m
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(value, dtype=np.float64)
    h = _core._Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("solver", "ipm")
    h.setOptionValue("run_crossover", "off")
    if h.passModel(lp) != highspy.HighsStatus.kOk:
        return FairShare(allocation, float("nan"), "model rejected by HiGHS")
    h.run()
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        return FairShare(allocation, float("nan"), h.modelStatusToString(status))
    x = np.asarray(h.getSolution().col_value, dtype=np.float64)
    allocation[rows_i, cols_j] = np.clip(x[:k], 0.0, 1.0)
    return FairShare(allocation, float(x[k]), "optimal")


#: Gavel's initial time-so-far of every job on every type (``scheduler.py``: ``time_per_iteration / 2``), seconds.
GAVEL_TIME_OFFSET = ROUND_SECONDS / 2.0


def time_slice_as_gavel(allocation: np.ndarray, throughput: np.ndarray, scale: np.ndarray, capacity: np.ndarray,
                        received: np.ndarray, order: list[int], fill: bool = True) -> np.ndarray:
    """(n,) type each job runs on in the next round, or -1, as Gavel's simulator picks them
    (``scheduler.py``: ``_update_priorities``, ``_schedule_jobs_on_workers_helper``), for comparing the engines.

    Priority of job i on type j: 0 where ``X[i, j] == 0``; else ``X[i, j] / f[i, j]`` with ``f[i, j]`` job i's
    share of the time type j has run jobs, each counter starting at :data:`GAVEL_TIME_OFFSET` (``(offset +
    received[i, j]) / sum_k (offset + received[k, j])``). The types are visited in ``order`` (Gavel: V100, P100,
    K80 for its ``*_perf`` policies, shuffled each round for the others); on each type the jobs in decreasing
    priority (ties: larger ``X``, lower index) take it if they have no type yet this round, run there and fit in
    what is left. ``fill``: jobs of priority 0 (no allocation on the type) also take what is left, last (Gavel does
    so for every policy but FIFO): the rounds are work-conserving, whatever the allocation. Differences kept from
    Gavel's: its deficit counters (a tie-breaker) are not modelled."""
    x = np.asarray(allocation, dtype=np.float64)
    thr = np.asarray(throughput, dtype=np.float64)
    got = np.asarray(received, dtype=np.float64) + GAVEL_TIME_OFFSET
    n = x.shape[0]
    choice = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return choice
    share = got / got.sum(axis=0, keepdims=True)
    priority = np.where(x > 0, x / share, 0.0)
    free = np.asarray(capacity, dtype=np.float64).copy()
    sizes = np.asarray(scale, dtype=np.float64)
    for j in order:
        eligible = (thr[:, j] > 0) & ((x[:, j] > 0) | fill)
        rows = np.flatnonzero(eligible)
        ranked = rows[np.lexsort((rows, -x[rows, j], -priority[rows, j]))]
        for i in ranked.tolist():
            if choice[i] >= 0 or sizes[i] > free[j]:
                continue
            choice[i] = j
            free[j] -= sizes[i]
    return choice
