"""Weighted max-min fairness on a global linear share: DRF, DRFH and TSF (paper 002, Sec. 2.1-2.2).

Each mechanism gives user ``n`` a scalar share that is linear in its total task count ``x_n = sum_k x[n, k]``:

- DRF (one server, eq. 3 / Definition 1): ``s_n = x_n max_r d[n, r] / c[r]``.
- DRFH (eq. 5): ``G_n = x_n max_r d[n, r] / C[r]`` with ``C[r] = sum_k c[k, r]`` (all servers concatenated).
- TSF: ``t_n = x_n / gamma_n`` with ``gamma_n = sum_k gamma0[n, k]`` (eq. 8 ignoring placement constraints).

Weighted max-min fairness on ``share_n / phi_n`` is computed by progressive filling: all unfrozen users grow at a common
level ``t`` (``x_n = t * rate_n``, ``rate_n = phi_n / (share_n / x_n)``) until no further simultaneous increase is
feasible; then every user that cannot grow on its own is frozen. With several servers the feasibility of a level is an
LP over the per-server split ``x[n, k]`` (capacities, eq. 10, and placement constraints), solved exactly with HiGHS.
On one server the filling is closed-form (:func:`allocator.fairness.psdsf.fill_server`).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from ._model import FloatArray, Instance, monopoly_tasks

_TOL = 1e-9


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


class _LinearMaxMin:
    """Progressive filling for weighted max-min on ``x_n / rate_n`` with per-server feasibility (LPs via HiGHS)."""

    def __init__(self, inst: Instance, rate: FloatArray) -> None:
        self.inst = inst
        self.rate = rate
        users, nodes = np.nonzero(inst.eligible)
        self.users, self.nodes = users, nodes
        p = users.size
        self.p = p
        n, k, r = inst.n, inst.k, inst.r
        # Capacity rows (k*r) x pairs.
        rows = (nodes[:, None] * r + np.arange(r)[None, :]).ravel()
        cols = np.repeat(np.arange(p), r)
        vals = inst.demands[users].ravel()
        keep = vals > 0
        self.cap_a = sp.csr_matrix((vals[keep], (rows[keep], cols[keep])), shape=(k * r, p))
        self.cap_b = inst.capacities.ravel()
        self.tot = sp.csr_matrix((np.ones(p), (users, np.arange(p))), shape=(n, p))
        self.capped = np.flatnonzero(np.isfinite(inst.max_tasks))

    def _solve(self, c: FloatArray, a_ub: sp.spmatrix, b_ub: FloatArray, a_eq=None, b_eq=None) -> FloatArray:
        res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=(0, None), method="highs")
        if res.status != 0:
            raise RuntimeError(f"HiGHS failed in max-min progressive filling: {res.message}")
        return np.asarray(res.x, dtype=np.float64)

    def _common_rows(self, n_extra: int, lower: FloatArray, mask: np.ndarray) -> tuple[sp.spmatrix, FloatArray]:
        """Capacity rows, caps and ``x_n >= lower_n`` for users in ``mask``, padded with ``n_extra`` zero columns."""
        blocks = [sp.hstack([self.cap_a, sp.csr_matrix((self.cap_a.shape[0], n_extra))])]
        rhs = [self.cap_b]
        if self.capped.size:
            blocks.append(sp.hstack([self.tot[self.capped], sp.csr_matrix((self.capped.size, n_extra))]))
            rhs.append(self.inst.max_tasks[self.capped])
        idx = np.flatnonzero(mask)
        if idx.size:
            blocks.append(sp.hstack([-self.tot[idx], sp.csr_matrix((idx.size, n_extra))]))
            rhs.append(-lower[idx])
        return sp.vstack(blocks).tocsr(), np.concatenate(rhs)

    def run(self) -> FloatArray:
        inst, rate, p = self.inst, self.rate, self.p
        n = inst.n
        active = np.ones(n, dtype=bool)
        level_tasks = np.zeros(n)  # frozen totals
        # Users capped at zero are frozen immediately.
        zero_cap = inst.max_tasks <= 0
        active[zero_cap] = False
        while active.any():
            act = np.flatnonzero(active)
            # (1) max t: x_n >= t * rate_n for active users, frozen users keep their totals.
            frozen_lb = level_tasks * (1 - _TOL)
            a_com, b_com = self._common_rows(1, frozen_lb, ~active)
            a_t = sp.hstack([-self.tot[act], sp.csr_matrix(rate[act][:, None])])
            a_ub = sp.vstack([a_com, a_t]).tocsr()
            b_ub = np.concatenate([b_com, np.zeros(act.size)])
            c = np.zeros(p + 1)
            c[-1] = -1.0
            t_star = self._solve(c, a_ub, b_ub)[-1]
            # (2) find the active users that cannot grow on their own while everyone else keeps >= its level.
            lower = np.where(active, t_star * rate * (1 - _TOL), frozen_lb)
            cand = act.copy()
            while cand.size:
                m = cand.size
                is_cand = np.zeros(n, dtype=bool)
                is_cand[cand] = True
                a_com, b_com = self._common_rows(m, lower, ~is_cand)
                # x_n - e_n >= t* rate_n, 0 <= e_n <= rate_n (normalised headroom).
                a_e = sp.hstack([-self.tot[cand], sp.identity(m, format="csr")])
                a_box = sp.hstack([sp.csr_matrix((m, p)), sp.identity(m, format="csr")])
                a_ub = sp.vstack([a_com, a_e, a_box]).tocsr()
                b_ub = np.concatenate([b_com, -t_star * rate[cand], rate[cand]])
                c = np.concatenate([np.zeros(p), -1.0 / rate[cand]])
                sol = self._solve(c, a_ub, b_ub)
                e = sol[p:] / rate[cand]
                grow = e > 1e-7
                if not grow.any():
                    break
                cand = cand[~grow]
            if cand.size == 0:  # numerical safety: t* was maximal, so someone must be blocked
                cand = act[:1]
            active[cand] = False
            level_tasks[cand] = t_star * rate[cand]
        # (3) a feasible split with exactly the max-min totals.
        a_ub = sp.vstack([self.cap_a]).tocsr()
        sol = self._solve(np.zeros(p), a_ub, self.cap_b, a_eq=self.tot.tocsr(), b_eq=level_tasks * (1 - _TOL))
        x = np.zeros((n, inst.k))
        x[self.users, self.nodes] = sol
        return x


def linear_maxmin(inst: Instance, rate: FloatArray) -> FloatArray:
    """Weighted max-min fair allocation on the share ``x_n / rate_n`` subject to eq. 10 and placement constraints.

    Returns ``x`` of shape ``(n, k)``. Exact up to HiGHS tolerances (relative ~1e-9).
    """
    return _LinearMaxMin(inst, np.asarray(rate, dtype=np.float64)).run()


def drfh(inst: Instance) -> FloatArray:
    """DRFH: weighted max-min fairness on global dominant shares (eq. 5), per-server feasible."""
    return linear_maxmin(inst, drfh_rate(inst))


def tsf(inst: Instance) -> FloatArray:
    """TSF: weighted max-min fairness on task shares ``x_n / gamma_n``, per-server feasible."""
    return linear_maxmin(inst, tsf_rate(inst))
