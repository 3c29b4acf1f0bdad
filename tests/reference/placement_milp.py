"""The exact integral optimum of an :class:`~tests.reference.clusters.Instance`: a HiGHS MILP (``highspy``), written
from the model alone (paper 004's throughput model, Sec. 2.1, over whole replicas on real nodes; issue 33's
"exact reference"), independently of the planner: nothing here imports or copies ``walras.planner``.

Variables and constraints:

* ``y[i, k]`` integer >= 0: replicas of job i on node k (only where job i is usable in node k's pool, ``a[i, j] >
  0``, and one replica fits the empty node); each replica takes exactly ``demand[i]`` of the pool's priced resource
  on that node, its ``base`` cpu and memory, and one pod slot;
* per node and resource: ``sum_i req[i, r] y[i, k] <= capacity[k, r]``; the pod row's right-hand side is the
  smaller of the node's pod slots and its pool's degree limit (the most Walras pods one node may run);
* per job: ``sum_k y[i, k] <= N_i`` and a binary ``s[i]`` = "job i has at least one replica" (``s_i <= sum_k
  y[i, k] <= N_i s_i``);
* ``T_i = sum_k a[i, pool(k)] y[i, k] / N_i``, the job's throughput.

**How a job with zero throughput counts** (``log 0 = -inf``): lexicographically. First the number of served jobs
(``sum_i s_i``) is maximised; then, among the allocations that serve that many, the objective is ``sum over served
jobs of w_i log(T_i / r_i)`` with ``r_i = max_j a[i, j]`` (the job's throughput with all its replicas in its best
pool). For a fixed set of served jobs that is ``sum_i w_i log T_i`` less a constant, so it orders those allocations
exactly as the log utility does; the normaliser only decides which jobs to leave out when not every job can get a
replica, and it does so independently of the throughput's unit (the ``-inf`` of an unserved job is replaced by 0,
the most a served job can contribute).

**Exactness of the log.** ``t_i <= w_i log(T_i / r_i)`` is imposed by tangent cuts (the outer approximation of a
concave function): ``t_i <= w_i (log(x / r_i) + T_i / x - 1) + w_i M_x (1 - s_i)`` for x on a geometric grid from
``min_j a_ij / N_i`` to ``r_i`` (ratio :data:`GRID_RATIO`), ``M_x = 1 - log(x / r_i)`` switching a cut off for an
unserved job (whose ``t_i`` is then 0). The MILP's value is therefore an upper bound on the true optimum. The
incumbent's exact objective (the log evaluated at its ``T_i``) is a lower bound; where the two differ by more than
the tolerance, tangents at the incumbent's throughputs are added and the MILP solved again (at most
``refinements`` times: a tangent at a lattice value makes the cuts exact there). :class:`Reference` reports both:
``objective`` (exact, of the solution returned), ``bound`` (the smallest of HiGHS' dual bounds of the MILPs: no
allocation serving ``served`` jobs does better) and ``gap = bound - objective`` (certified).

**Other utility families** (004 Sec. 2.2; the examples mix them): the objective is ``sum_i (u_i(T_i) - u_i(r_i))``.
Alpha-fair with ``alpha >= 1`` has ``u(0) = -inf`` and counts in the served count as log does; linear and
target-priority (``w min(T - target, 0)``) are concave piecewise linear and get their exact pieces as cuts; power
and alpha-fair get tangent grids as log does; a job whose ``u(0)`` is finite gets ``t_i <= u(0) - u(r_i)`` while it
has no replica (its tangents alone would overestimate ``u(0)`` for power).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from tests.reference.clusters import RESOURCES, Instance

__all__ = ["GRID_RATIO", "Reference", "infinite_at_zero", "lexicographic", "optimum", "throughputs", "utility"]

#: Ratio between consecutive tangent points: the cut envelope overestimates log by at most ~(log ratio)^2 / 8
#: between two points (about 5e-5 per job at 1.02).
GRID_RATIO = 1.02
TOLERANCE = 1e-7


@dataclass(frozen=True)
class Reference:
    """The exact integral optimum (module docstring). ``replicas[i, k]`` of job i on node k; ``throughput[i]`` the
    job's ``T_i``; ``served`` the maximum number of jobs with ``u(0) = -inf`` that get a replica; ``objective`` the
    exact value of this solution (:func:`lexicographic`: ``sum over served of w_i log(T_i / r_i)`` for log jobs);
    ``bound`` an upper bound on it over all solutions serving ``served`` jobs; ``gap = bound - objective`` (>= 0);
    ``status``: ``optimal`` (the gap is at most HiGHS' MIP tolerance plus the cuts' tolerance) or ``time limit`` (a
    feasible solution and its certified gap); ``seconds`` of solving; ``gpus`` the priced units it uses."""

    replicas: np.ndarray
    throughput: np.ndarray
    served: int
    objective: float
    bound: float
    gap: float
    status: str
    seconds: float
    gpus: float  # priced units the solution uses (replicas x demand)


def utility(instance: Instance, i: int, t: float) -> float:
    """``u_i(t)`` of 004's families (eq. 1, eq. 2, Sec. 2.2), with the job's weight; ``-inf`` at ``log 0``."""
    kind, param = instance.utility_of(i)
    w = float(instance.weight[i])
    if kind == "linear":
        return w * t
    if kind == "target":
        return w * min(t - param, 0.0)
    if kind == "power":
        return w * t**param
    if kind == "log" or (kind == "alpha" and param == 1.0):
        return w * math.log(t) if t > 0 else -math.inf
    if kind == "alpha":
        if t <= 0:
            return -math.inf if param > 1 else 0.0
        return w * t ** (1 - param) / (1 - param)
    raise ValueError(f"unknown utility family {kind!r}")


def _derivative(instance: Instance, i: int, t: float) -> float:
    kind, param = instance.utility_of(i)
    w = float(instance.weight[i])
    if kind == "power":
        return w * param * t ** (param - 1)
    if kind == "log" or (kind == "alpha" and param == 1.0):
        return w / t
    if kind == "alpha":
        return w * t ** (-param)
    raise ValueError(f"no tangent grid for {kind!r}")


def infinite_at_zero(instance: Instance, i: int) -> bool:
    """Whether ``u_i(0) = -inf`` (log, alpha-fair with alpha >= 1): such a job counts in the served count."""
    kind, param = instance.utility_of(i)
    return kind == "log" or (kind == "alpha" and param >= 1.0)


def lexicographic(instance: Instance, throughput: np.ndarray) -> tuple[int, float]:
    """(jobs with ``u(0) = -inf`` served, ``sum_i (u_i(T_i) - u_i(r_i))`` with an unserved such job counting 0) of
    per-job throughputs ``throughput``: the order the reference maximises (module docstring)."""
    r = instance.a.max(axis=1)
    served, value = 0, 0.0
    for i in range(instance.n):
        if r[i] <= 0:
            continue
        if infinite_at_zero(instance, i):
            if throughput[i] <= 0:
                continue
            served += 1
        value += utility(instance, i, float(throughput[i])) - utility(instance, i, float(r[i]))
    return served, value


def _pairs(instance: Instance) -> tuple[list[tuple[int, int]], np.ndarray, np.ndarray]:
    """The (job, node) pairs a replica may use, their upper bounds, and each pair's request vector."""
    pairs, upper, reqs = [], [], []
    for i in range(instance.n):
        for k in range(len(instance.nodes)):
            j = int(instance.node_pool[k])
            if j < 0 or instance.a[i, j] <= 0:
                continue
            req = instance.request(i, j)
            cap = instance.capacity[k].copy()
            cap[RESOURCES.index("pods")] = instance.slots(k)
            with np.errstate(divide="ignore", invalid="ignore"):
                fit = np.where(req > 0, np.floor(cap / np.where(req > 0, req, 1.0) + 1e-9), np.inf)
            bound = min(float(instance.replicas[i]), float(fit.min()))
            if bound >= 1:
                pairs.append((i, k))
                upper.append(bound)
                reqs.append(req)
    return pairs, np.array(upper), np.array(reqs).reshape(len(pairs), len(RESOURCES))


def _grid(lo: float, hi: float) -> list[float]:
    count = max(1, math.ceil(math.log(hi / lo) / math.log(GRID_RATIO)))
    return [float(v) for v in np.geomspace(lo, hi, count + 1)]


class _Solver:
    """The MILP of the module docstring over ``y`` (one column per pair), ``t`` (n) and ``s`` (n), built as rows
    that the stages add to."""

    def __init__(self, instance: Instance) -> None:
        self.inst = instance
        self.pairs, self.upper, self.reqs = _pairs(instance)
        n, P = instance.n, len(self.pairs)
        self.P = P
        self.t0, self.s0 = P, P + n
        self.n_cols = P + 2 * n
        self.rows: list[tuple[dict[int, float], float, float]] = []
        self.r = instance.a.max(axis=1)
        self.tmin = np.array([instance.a[i][instance.a[i] > 0].min() / instance.replicas[i] if self.r[i] > 0
                              else 1.0 for i in range(n)])
        self.cuts: list[set[float]] = [set() for _ in range(n)]
        for k in range(len(instance.nodes)):
            cap = instance.capacity[k].copy()
            cap[RESOURCES.index("pods")] = instance.slots(k)
            for r in range(len(RESOURCES)):
                row = {c: float(self.reqs[c, r]) for c, (_, kk) in enumerate(self.pairs) if kk == k
                       and self.reqs[c, r] > 0}
                if row:
                    self.rows.append((row, -math.inf, float(cap[r])))
        for i in range(n):
            cols = [c for c, (ii, _) in enumerate(self.pairs) if ii == i]
            upper = {c: 1.0 for c in cols}
            self.rows.append(({**upper, self.s0 + i: -float(instance.replicas[i])}, -math.inf, 0.0))
            self.rows.append(({**upper, self.s0 + i: -1.0}, 0.0, math.inf))

    def add_cut(self, i: int, x: float) -> None:
        """The tangent of ``u_i - u_i(r_i)`` at ``T = x`` as a cut on ``t_i``, switched off by ``s_i = 0`` for a
        family with ``u(0) = -inf`` (``M = -(tangent at 0)``, so the cut reads ``t_i <= 0`` then): for log,
        ``t_i <= w (log(x/r) + T_i/x - 1) + w (1 - log(x/r)) (1 - s_i)``."""
        if x in self.cuts[i]:
            return
        self.cuts[i].add(x)
        inst, r = self.inst, float(self.r[i])
        kind, param = inst.utility_of(i)
        if kind == "linear":
            value, slope = utility(inst, i, x), float(inst.weight[i])
        elif kind == "target":
            slope = float(inst.weight[i]) if x < param else 0.0
            value = utility(inst, i, x)
        else:
            value, slope = utility(inst, i, x), _derivative(inst, i, x)
        at_zero = value - utility(inst, i, r) - slope * x  # the cut's right-hand side at T = 0
        big = max(0.0, -at_zero) if infinite_at_zero(inst, i) else 0.0
        row = {self.t0 + i: 1.0}
        if big > 0:
            row[self.s0 + i] = big
        for c, (ii, k) in enumerate(self.pairs):
            if ii == i:
                row[c] = -slope * float(inst.a[i, inst.node_pool[k]]) / float(inst.replicas[i])
        self.rows.append((row, -math.inf, at_zero + big))

    def add_cuts(self, i: int) -> None:
        """The first cuts of job i: exact pieces for linear and target-priority, a geometric grid of tangents
        otherwise; and ``t_i <= u(0) - u(r)`` while unserved for a family with a finite ``u(0)``."""
        kind, param = self.inst.utility_of(i)
        r = float(self.r[i])
        if kind == "linear":
            self.add_cut(i, r)
        elif kind == "target":
            self.add_cut(i, min(r, param) / 2.0)
            if r > param:
                self.add_cut(i, r)
        else:
            for x in _grid(float(self.tmin[i]), r):
                self.add_cut(i, x)
        if not infinite_at_zero(self.inst, i):
            drop = utility(self.inst, i, r) - utility(self.inst, i, 0.0)
            if drop > 0:
                self.rows.append(({self.t0 + i: 1.0, self.s0 + i: -drop}, -math.inf, -drop))

    def solve(self, objective: dict[int, float], time_limit: float, extra: list[tuple[dict[int, float], float, float]]
              ) -> tuple[str, np.ndarray | None, float, float]:
        """Maximise ``objective`` over the rows (and ``extra``); (status, x, objective value, dual bound)."""
        import highspy
        from highspy import _core

        inst, n = self.inst, self.inst.n
        inf = highspy.kHighsInf
        lp = highspy.HighsLp()
        lp.num_col_ = self.n_cols
        rows = self.rows + extra
        lp.num_row_ = len(rows)
        cost = np.zeros(self.n_cols)
        for c, v in objective.items():
            cost[c] = v
        lo = np.zeros(self.n_cols)
        hi = np.zeros(self.n_cols)
        hi[: self.P] = self.upper
        for i in range(n):
            floor = utility(inst, i, float(self.tmin[i])) if infinite_at_zero(inst, i) else utility(inst, i, 0.0)
            lo[self.t0 + i] = floor - utility(inst, i, float(self.r[i])) - 1.0
            hi[self.t0 + i] = 0.0
            hi[self.s0 + i] = 1.0 if self.r[i] > 0 else 0.0
        lp.col_cost_ = cost
        lp.col_lower_ = lo
        lp.col_upper_ = hi
        lp.row_lower_ = np.array([max(-inf, r[1]) for r in rows], dtype=np.float64)
        lp.row_upper_ = np.array([min(inf, r[2]) for r in rows], dtype=np.float64)
        lp.sense_ = highspy.ObjSense.kMaximize
        start, index, value = [0], [], []
        for coeffs, _, _ in rows:
            for c in sorted(coeffs):
                index.append(c)
                value.append(coeffs[c])
            start.append(len(index))
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.num_col_ = self.n_cols
        lp.a_matrix_.num_row_ = len(rows)
        lp.a_matrix_.start_ = np.array(start, dtype=np.int32)
        lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
        lp.a_matrix_.value_ = np.array(value, dtype=np.float64)
        integrality = [highspy.HighsVarType.kInteger] * self.n_cols
        for i in range(n):
            integrality[self.t0 + i] = highspy.HighsVarType.kContinuous
        lp.integrality_ = integrality
        h = _core._Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", float(max(time_limit, 0.01)))
        h.setOptionValue("mip_rel_gap", 1e-9)
        h.setOptionValue("mip_abs_gap", 1e-9)
        h.setOptionValue("random_seed", 0)
        if h.passModel(lp) != highspy.HighsStatus.kOk:
            raise ValueError("the reference MILP was rejected by HiGHS")
        h.run()
        status = h.getModelStatus()
        info = h.getInfo()
        if status == highspy.HighsModelStatus.kOptimal:
            text = "optimal"
        elif status == highspy.HighsModelStatus.kTimeLimit:
            text = "time limit"
        else:
            text = h.modelStatusToString(status)
        if info.primal_solution_status != 2:  # kSolutionStatusFeasible
            return text, None, math.nan, math.nan
        x = np.asarray(h.getSolution().col_value, dtype=np.float64)
        return text, x, float(info.objective_function_value), float(info.mip_dual_bound)

    def replicas(self, x: np.ndarray) -> np.ndarray:
        out = np.zeros((self.inst.n, len(self.inst.nodes)), dtype=np.int64)
        for c, (i, k) in enumerate(self.pairs):
            out[i, k] = round(float(x[c]))
        return out


def throughputs(instance: Instance, replicas: np.ndarray) -> np.ndarray:
    """``T_i = sum_k a[i, pool(k)] y[i, k] / N_i`` of a replica matrix (n, K)."""
    per_pool = np.zeros((instance.n, instance.m))
    for k in range(len(instance.nodes)):
        j = int(instance.node_pool[k])
        if j >= 0:
            per_pool[:, j] += replicas[:, k]
    return (instance.a * per_pool).sum(axis=1) / instance.replicas


def optimum(instance: Instance, time_limit: float = 20.0, refinements: int = 4) -> Reference:
    """The lexicographic integral optimum of ``instance`` (module docstring) within ``time_limit`` seconds in all;
    see :class:`Reference` for what is returned."""
    started = time.perf_counter()
    solver = _Solver(instance)
    n = instance.n
    deadline = started + time_limit
    # stage 1: the most jobs served
    counted = [i for i in range(n) if infinite_at_zero(instance, i) and solver.r[i] > 0]
    status1, x1, best1, _ = solver.solve({solver.s0 + i: 1.0 for i in counted}, deadline - time.perf_counter(), [])
    if x1 is None:
        raise RuntimeError(f"reference stage 1 found no solution ({status1})")
    served = round(best1 if status1 == "optimal" else float(sum(x1[solver.s0 + i] for i in counted)))
    for i in range(n):
        if solver.r[i] > 0:
            solver.add_cuts(i)
    count_row = ({solver.s0 + i: 1.0 for i in counted}, float(served), math.inf)
    objective = {solver.t0 + i: 1.0 for i in range(n)}
    best: tuple[np.ndarray, float] | None = None
    bound = math.inf
    status = "optimal" if status1 == "optimal" else "time limit"
    for _ in range(refinements + 1):
        text, x, _, dual = solver.solve(objective, deadline - time.perf_counter(), [count_row])
        if x is None:
            status = text
            break
        bound = min(bound, dual)
        reps = solver.replicas(x)
        thr = throughputs(instance, reps)
        value = lexicographic(instance, thr)[1]
        if best is None or value > best[1]:
            best = (reps, value)
        if text != "optimal":
            status = "time limit"
            break
        if bound - best[1] <= TOLERANCE * max(1.0, abs(best[1])):
            break
        for i in range(n):
            if thr[i] > 0 and instance.utility_of(i)[0] not in ("linear", "target"):
                solver.add_cut(i, float(thr[i]))
    if best is None:
        raise RuntimeError(f"reference stage 2 found no solution ({status})")
    reps, value = best
    thr = throughputs(instance, reps)
    gap = max(0.0, bound - value)
    if status == "optimal" and gap > 1e-6 * max(1.0, abs(value)):
        status = "refinements exhausted"
    return Reference(reps, thr, served, value, bound, gap, status, time.perf_counter() - started,
                     float((reps.sum(axis=1) * instance.demand).sum()))
