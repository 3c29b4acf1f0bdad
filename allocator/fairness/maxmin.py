"""Weighted max-min fairness on a global linear share: DRF, DRFH and TSF (paper 002, Sec. 2.1-2.2).

Each mechanism gives user ``n`` a scalar share that is linear in its total task count ``x_n = sum_k x[n, k]``:

- DRF (one server, eq. 3 / Definition 1): ``s_n = x_n max_r d[n, r] / c[r]``.
- DRFH (eq. 5): ``G_n = x_n max_r d[n, r] / C[r]`` with ``C[r] = sum_k c[k, r]`` (all servers concatenated).
- TSF: ``t_n = x_n / gamma_n`` with ``gamma_n = sum_k gamma0[n, k]`` (eq. 8 ignoring placement constraints).

Weighted max-min fairness on ``share_n / phi_n`` is computed by progressive filling (002 Sec. 2.2, the water-filling
behind Definitions 1 and 3): all unfrozen users grow at a common level ``t`` (``x_n >= t * rate_n``) until no further
simultaneous increase is feasible; the users that cannot grow on their own are frozen at that level and the others
keep rising. With several servers the level of a stage is an LP over the per-server split ``x[n, k]`` (capacities,
eq. 10, placement constraints, task caps), solved with HiGHS (dual simplex). Each stage is made robust by construction:

- **Frozen levels are those of an exactly feasible witness.** After each stage the LP's split is scaled per server into
  the capacities and per user under its task cap (HiGHS meets constraints only to its primal feasibility tolerance,
  1e-7), and the frozen users keep the totals of that scaled split. The next stage's LP is then feasible in exact
  arithmetic (the witness with ``t = min over active users of x_n / rate_n``), so HiGHS cannot report it infeasible;
  the fixed levels lose at most the solver's tolerance (reported as ``residual``). Fixing the exact ``t* rate_n`` of the
  previous stage instead made about 1 in 20 random 10 x 5 x 3 instances infeasible (issue 19).
- **Who freezes is read from the LP's duals.** The dual of ``max t`` has ``sum_n mu_n rate_n = 1`` over the active
  users' rows; by complementary slackness a user with ``mu_n > 0`` in some dual optimum has ``x_n = t* rate_n`` in every
  primal optimum, i.e. it cannot grow while the others keep ``t*``. So every stage freezes at least one user (the
  largest ``mu_n rate_n``) with one LP; a blocked user whose dual happens to be 0 stays active and freezes at the same
  level in the next stage. At most ``n`` LPs in all, instead of one LP per candidate test.

On one server the filling is closed-form (:func:`allocator.fairness.psdsf.fill_server`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from ._model import FloatArray, Instance, monopoly_tasks

#: a user freezes when its share of the stage LP's dual, ``mu_n rate_n`` (they sum to 1), is at least this; HiGHS's dual
#: feasibility tolerance is 1e-7, so smaller values are not told apart from 0 (such a user freezes a stage later).
_DUAL_FREEZE = 1e-6
#: the witness is scaled to ``(1 - _INSIDE)`` of each capacity so float rounding in the next LP's rows cannot make it
#: infeasible
_INSIDE = 1e-12


def drfh_rate(inst: Instance) -> FloatArray:
    """Tasks per unit of weighted global dominant share (DRFH, eq. 5): ``phi_n / max_r (d[n, r] / C[r])``."""
    total = inst.capacities.sum(axis=0)
    with np.errstate(divide="ignore"):
        share = np.where(inst.demands > 0, inst.demands / np.where(total > 0, total, 1.0), 0.0).max(axis=1)
    return np.asarray(inst.weights / share, dtype=np.float64)


def tsf_rate(inst: Instance) -> FloatArray:
    """Tasks per unit of weighted task share (TSF): ``phi_n * gamma_n``, ``gamma_n`` ignoring placement constraints."""
    gamma_n = monopoly_tasks(inst.demands, inst.capacities).sum(axis=1)
    return np.asarray(inst.weights * gamma_n, dtype=np.float64)


@dataclass(frozen=True)
class MaxMinResult:
    """Outcome of :func:`linear_maxmin`.

    Attributes:
        x: ``(n, k)`` tasks; within every capacity and task cap (exactly, after scaling).
        levels: ``(n,)`` the max-min levels ``t*_s rate_n`` of the stage ``s`` in which each user froze (the cap for a
            user frozen at its cap).
        stages: progressive-filling stages (LPs for the levels).
        lps: HiGHS LPs solved (one per stage).
        residual: largest relative shortfall of a user's total below its level, or excess of a capacity or cap,
            ``max(max_n (levels_n - x_n) / levels_n, max_{k,r} (load - c) / c)``: what the scaling of the witnesses
            cost (about the solver's feasibility tolerance).
    """

    x: FloatArray
    levels: FloatArray
    stages: int
    lps: int
    residual: float


class _LinearMaxMin:
    """Progressive filling for weighted max-min on ``x_n / rate_n`` with per-server feasibility (one LP per stage)."""

    #: stage LPs with at most this many matrix entries (rows x columns) are passed to HiGHS as dense arrays (cheaper to
    #: build and check for the small pools of a planning round), larger ones as CSR
    dense_max = 200_000

    def __init__(self, inst: Instance, rate: FloatArray) -> None:
        self.inst = inst
        self.rate = rate
        users, nodes = np.nonzero(inst.eligible)
        self.users, self.nodes = users, nodes
        p = users.size
        self.p = p
        r = inst.r
        # capacity rows (k*r, only those some eligible pair uses) as COO triplets over the pair columns
        rows = (nodes[:, None] * r + np.arange(r)[None, :]).ravel()
        cols = np.repeat(np.arange(p), r)
        vals = inst.demands[users].ravel()
        keep = vals > 0
        live, rows = np.unique(rows[keep], return_inverse=True)
        self.cap_coo = (rows.reshape(-1), cols[keep], vals[keep])
        self.cap_rows = live.size
        self.cap_b = inst.capacities.ravel()[live]
        self.capped = np.flatnonzero(np.isfinite(inst.max_tasks))
        self.lps = 0

    def _user_rows(self, which: np.ndarray, sign: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """COO triplets of ``sign * x_n`` (sum of user ``n``'s pair columns), one row per user in ``which``."""
        pos = np.full(self.inst.n, -1)
        pos[which] = np.arange(which.size)
        sel = pos[self.users] >= 0
        cols = np.flatnonzero(sel)
        return pos[self.users[sel]], cols, np.full(cols.size, sign)

    def _witness(self, flows: FloatArray) -> FloatArray:
        """``flows`` (pairs) scaled per server into ``(1 - _INSIDE)`` of its capacities and per user under its cap."""
        inst = self.inst
        x = np.zeros((inst.n, inst.k))
        x[self.users, self.nodes] = np.maximum(flows, 0.0)
        load = x.T @ inst.demands
        cap = inst.capacities * (1 - _INSIDE)
        with np.errstate(divide="ignore", invalid="ignore"):
            over = np.where(load > cap, load / np.where(cap > 0, cap, 1.0), 1.0)
        x = x / np.where(np.isfinite(over), over, np.inf).max(axis=1)[None, :]
        tot = x.sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            shrink = np.where(tot > inst.max_tasks, inst.max_tasks / tot, 1.0)
        return np.asarray(x * shrink[:, None], dtype=np.float64)

    def _stage(self, active: np.ndarray, lower: FloatArray) -> tuple[float, FloatArray, FloatArray]:
        """``max t`` s.t. capacities, caps, ``x_n >= lower_n`` (frozen), ``x_n >= t rate_n`` (active).

        Returns ``(t*, pair flows, mu_n rate_n of the active users)``."""
        p = self.p
        act = np.flatnonzero(active)
        frz = np.flatnonzero(~active & (lower > 0))
        parts = [self.cap_coo, self._user_rows(self.capped, 1.0), self._user_rows(frz, -1.0)]
        parts.append(self._user_rows(act, -1.0))
        heights = [self.cap_rows, self.capped.size, frz.size, act.size]
        offs = np.concatenate([[0], np.cumsum(heights)])
        rows = np.concatenate(
            [pr[0] + o for pr, o in zip(parts, offs[:-1], strict=True)] + [offs[3] + np.arange(act.size)]
        )
        cols = np.concatenate([pr[1] for pr in parts] + [np.full(act.size, p)])
        vals = np.concatenate([pr[2] for pr in parts] + [self.rate[act]])
        b_ub = np.concatenate([self.cap_b, self.inst.max_tasks[self.capped], -lower[frz], np.zeros(act.size)])
        shape = (int(offs[-1]), p + 1)
        if shape[0] * shape[1] <= self.dense_max:
            a_ub: np.ndarray | sp.csr_matrix = np.zeros(shape)
            np.add.at(a_ub, (rows, cols), vals)
        else:
            a_ub = sp.csr_matrix((vals, (rows, cols)), shape=shape)
        c = np.zeros(p + 1)
        c[-1] = -1.0
        res = linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs-ds")
        self.lps += 1
        if res.status != 0:
            raise RuntimeError(f"HiGHS failed in max-min progressive filling: {res.message}")
        mu = -np.asarray(res.ineqlin.marginals, dtype=np.float64)[-act.size :]
        return float(res.x[-1]), np.asarray(res.x[:p], dtype=np.float64), mu * self.rate[act]

    def run(self) -> MaxMinResult:
        inst, rate = self.inst, self.rate
        n = inst.n
        active = inst.max_tasks > 0  # users capped at zero are frozen at 0 from the start
        lower = np.zeros(n)  # frozen totals of the current witness
        levels = np.zeros(n)
        x = np.zeros((n, inst.k))
        stages = 0
        while active.any():
            act = np.flatnonzero(active)
            t_star, flows, share = self._stage(active, lower)
            stages += 1
            x = self._witness(flows)
            tot = x.sum(axis=1)
            freeze = share >= _DUAL_FREEZE
            freeze[int(np.argmax(share))] = True
            # a user whose level reached its cap cannot grow either (its dual may sit on the cap row instead)
            freeze |= t_star * rate[act] >= inst.max_tasks[act] * (1 - 1e-9)
            newly = act[freeze]
            levels[newly] = np.minimum(t_star * rate[newly], inst.max_tasks[newly])
            active[newly] = False
            lower = np.where(active, 0.0, np.minimum(tot, levels))
        load = x.T @ inst.demands
        c = inst.capacities
        with np.errstate(divide="ignore", invalid="ignore"):
            short = np.where(levels > 0, (levels - x.sum(axis=1)) / np.where(levels > 0, levels, 1.0), 0.0)
            excess = np.where(c > 0, (load - c) / np.where(c > 0, c, 1.0), np.where(load > 0, np.inf, 0.0))
        residual = max(float(short.max(initial=0.0)), float(excess.max(initial=0.0)), 0.0)
        return MaxMinResult(x=x, levels=levels, stages=stages, lps=self.lps, residual=residual)


def linear_maxmin(inst: Instance, rate: FloatArray) -> MaxMinResult:
    """Weighted max-min fair allocation on the share ``x_n / rate_n`` subject to eq. 10, placement constraints and task
    caps (module docstring). Exact up to HiGHS tolerances (``residual``, relative, about 1e-7 or better)."""
    return _LinearMaxMin(inst, np.asarray(rate, dtype=np.float64)).run()


def drfh_result(inst: Instance) -> MaxMinResult:
    """DRFH: weighted max-min fairness on global dominant shares (eq. 5), per-server feasible."""
    return linear_maxmin(inst, drfh_rate(inst))


def tsf_result(inst: Instance) -> MaxMinResult:
    """TSF: weighted max-min fairness on task shares ``x_n / gamma_n`` (Sec. 2.2), per-server feasible."""
    return linear_maxmin(inst, tsf_rate(inst))


def drfh(inst: Instance) -> FloatArray:
    """Tasks ``(n, k)`` of :func:`drfh_result`."""
    return drfh_result(inst).x


def tsf(inst: Instance) -> FloatArray:
    """Tasks ``(n, k)`` of :func:`tsf_result`."""
    return tsf_result(inst).x
