"""The dual oracle of price discovery (004 Sec. 3 and 5): at prices ``p``, every job's subproblem is solved
(:mod:`allocator.pricing.subproblem`), giving the dual value ``g(p) = p^T R + sum_i max_x [u_i - (p * d_i)^T x_i]``
(an upper bound on ``U*``), the subgradient ``q = R - r`` (eq. 9), and the utility of the column-scaled feasible
allocation (a lower bound, Sec. 5). :meth:`DualOracle.recover` adds the LP split of tied jobs
(:mod:`allocator.pricing.recovery`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from allocator.pricing.problem import ArrayLike, Problem, prepare, resolve_device, resolve_dtype
from allocator.pricing.recovery import MAX_SCAN, Recovery, recover_allocation, split_jobs
from allocator.pricing.result import Reuse
from allocator.pricing.subproblem import Subsolution, solve_hull, solve_pairs
from allocator.utilities import Utility

__all__ = ["DualOracle", "Evaluation", "dual_evaluation", "usage_weights"]


@dataclass
class Evaluation:
    prices: np.ndarray  # float64 (m,)
    dual: float
    primal: float
    usage: np.ndarray  # float64 (m,)
    grad: np.ndarray  # R - r
    scale: Tensor  # (m + 1,) column scaling of the feasible allocation (last entry: the "none" pool)
    #: the subproblem solutions (``None`` once released: an evaluation that is neither the best dual nor the best
    #: primal one of its run is never used again, and a 10^6-job subsolution holds 44 MB)
    sol: Subsolution | None
    t_feasible: Tensor | None
    recovered: Recovery | None = None  #: set when the LP split of tied jobs beats column scaling
    #: this process's sums at ``prices``: usage per pool (``m + 1``, last: "none"), ``sum_i u_i(t_i) - c_i(t_i)`` and
    #: ``sum_i u_i(t_i)`` of the subproblem solutions (what an incremental re-solve updates row by row)
    r_local: Tensor | None = None
    net_local: float = math.nan
    u_local: float = math.nan

    def subsolution(self) -> Subsolution:
        """The subproblem solutions of this evaluation (``RuntimeError`` after :meth:`release`)."""
        if self.sol is None:
            raise RuntimeError("the subproblem solutions of this evaluation were released")
        return self.sol

    def feasible_throughputs(self) -> Tensor:
        """The column-scaled feasible throughputs (``RuntimeError`` after :meth:`release`)."""
        if self.t_feasible is None:
            raise RuntimeError("the feasible throughputs of this evaluation were released")
        return self.t_feasible

    def release(self) -> None:
        """Drop the per-job arrays; bounds, usage and gradient stay."""
        self.sol = None
        self.t_feasible = None
        self.r_local = None


class DualOracle:
    """Evaluates ``g(p)``, its subgradient and the feasible-allocation utility for a (possibly sharded) problem."""

    def __init__(self, prob: Problem, method: str = "hull", group: Any = None) -> None:
        self.prob = prob
        self.group = group
        self.method = method
        a = prob.a
        self.n, self.m = a.shape
        self._a_pos: Tensor | None = None
        self.cap64 = prob.capacity.detach().double().cpu().numpy()
        self.evaluations = 0
        #: (the previous solve's state, rows to solve again): set by a solve given ``previous=``; used once, by the
        #: first evaluation at exactly the state's prices
        self.reuse: tuple[Reuse, Tensor] | None = None
        self.resolved: int | None = None

    @property
    def a_pos(self) -> Tensor:
        """``a > 0``, computed once when a walk needs it (the compiled walk does not)."""
        if self._a_pos is None:
            self._a_pos = self.prob.a > 0
        return self._a_pos

    def _incremental(self, prices: np.ndarray, c: Tensor) -> tuple[Subsolution, Tensor, Tensor, Tensor] | None:
        """The subproblem solutions and their sums ``(sol, r, net, u)`` at ``prices`` from the previous solve's state,
        when it was evaluated at exactly these prices: only the changed rows are solved again (rows are independent,
        so this is a full solve up to last-bit rounding of vectorised functions), and the sums are updated by the
        changed rows' old and new contributions. ``None`` otherwise (a full evaluation follows)."""
        if self.reuse is None or self.method != "hull" or not np.array_equal(prices, self.reuse[0].prices):
            return None
        state, rows = self.reuse
        self.reuse = None
        self.resolved = int(rows.numel())
        prob = self.prob
        base = state.sol
        sums: tuple[Tensor, Tensor, Tensor] | None = None
        if state.r_local is not None and math.isfinite(state.net_local) and math.isfinite(state.u_local):
            sums = (
                state.r_local.clone(),
                torch.tensor(state.net_local, dtype=torch.float64),
                torch.tensor(state.u_local, dtype=torch.float64),
            )
        if rows.numel():
            fields = ("t", "j_lo", "x_lo", "a_lo", "c_lo", "j_hi", "x_hi", "a_hi", "c_hi")
            old = Subsolution(**{name: getattr(base, name).index_select(0, rows) for name in fields})
            util = prob.utility.take(rows)
            new = solve_hull(prob.a.index_select(0, rows), c.index_select(0, rows), util)
            if sums is not None:
                r, net, u_sum = sums
                old_d = None if state.demand is None else state.demand.index_select(0, rows)
                new_d = None if prob.demand is None else prob.demand.index_select(0, rows)
                parts = (
                    (-1.0, old, old_d, state.utility.take(rows).value(old.t)),
                    (1.0, new, new_d, util.value(new.t)),
                )
                for sign, part, d_rows, u_part in parts:
                    net = net + sign * (u_part - part.cost()).sum(dtype=torch.float64)
                    u_sum = u_sum + sign * u_part.sum(dtype=torch.float64)
                    w_lo, w_hi = usage_weights(part, d_rows, self.m)
                    r.index_add_(0, part.j_lo, sign * w_lo.double())
                    r.index_add_(0, part.j_hi, sign * w_hi.double())
                sums = (r, net, u_sum) if bool(torch.isfinite(net)) and bool(torch.isfinite(u_sum)) else None
            # in place: the previous solve's state is consumed (see ``previous=`` of :func:`solve`)
            for name in fields:
                getattr(base, name).index_copy_(0, rows, getattr(new, name))
        if sums is None:
            sums = self._sums(base)
        return base, sums[0], sums[1], sums[2]

    def _sums(self, sol: Subsolution) -> tuple[Tensor, Tensor, Tensor]:
        """``(r, net, u)``: usage per pool (``m + 1``), ``sum_i u_i(t_i) - c_i(t_i)`` and ``sum_i u_i(t_i)``."""
        u_t = self.prob.utility.value(sol.t)
        net = (u_t - sol.cost()).sum(dtype=torch.float64)
        w_lo, w_hi = self.usage_weights(sol)
        r = torch.zeros(self.m + 1, dtype=torch.float64, device=sol.t.device)
        r.index_add_(0, sol.j_lo, w_lo.double())
        r.index_add_(0, sol.j_hi, w_hi.double())
        return r, net, u_t.sum(dtype=torch.float64)

    def _allreduce(self, values: list[float] | np.ndarray) -> np.ndarray:
        if self.group is None:
            return np.asarray(values, dtype=np.float64)
        buf = torch.tensor(np.asarray(values, dtype=np.float64), dtype=torch.float64)
        if self.group is not None:
            import torch.distributed as dist

            backend = dist.get_backend(self.group)
            dev = self.prob.a.device if backend == "nccl" else torch.device("cpu")
            buf = buf.to(dev)
            dist.all_reduce(buf, group=self.group)
        return buf.cpu().numpy()

    def costs(self, p: Tensor) -> Tensor:
        d = self.prob.demand
        if d is None:
            return p.expand(self.n, self.m)
        if d.ndim == 1:
            return d.unsqueeze(1) * p
        return d * p

    def usage_weights(self, sol: Subsolution) -> tuple[Tensor, Tensor]:
        return usage_weights(sol, self.prob.demand, self.m)

    #: Candidate-pool tolerances tried in turn by :meth:`recover`: exact ties first, then near ties, which lets the
    #: LP reach U* from prices that are only close to optimal (piecewise-linear g: linear and target utilities).
    RECOVERY_RTOLS = (1e-6, 1e-3, 3e-2)

    def recover(self, ev: Evaluation, target: float) -> bool:
        """Try the LP recovery of :mod:`allocator.pricing.recovery` at ``ev``'s prices (single process only), with
        each tolerance of :attr:`RECOVERY_RTOLS` until its utility reaches ``target``; keep the best in ``ev``
        (raising ``ev.primal``) when it beats the column-scaled allocation."""
        if self.group is not None or ev.recovered is not None:
            return False
        if split_jobs(ev.subsolution(), self.m) > MAX_SCAN:
            return False  # a large market of distinct jobs: too many tied jobs to sort into classes
        prob = self.prob
        p = torch.as_tensor(ev.prices, dtype=prob.a.dtype).to(prob.a.device)
        costs = self.costs(p)
        best: Recovery | None = None
        for rtol in self.RECOVERY_RTOLS:
            rec = recover_allocation(
                prob.a, costs, prob.demand, self.cap64, ev.subsolution(), prob.utility, rtol=rtol, target=target
            )
            if rec is not None and (best is None or rec.utility > best.utility):
                best = rec
            if best is not None and best.utility >= target:
                break
        if best is None or not best.utility > ev.primal:
            return False
        ev.recovered = best
        ev.primal = best.utility
        return True

    def __call__(self, prices: np.ndarray) -> Evaluation:
        prob = self.prob
        self.evaluations += 1
        p = torch.as_tensor(prices, dtype=prob.a.dtype).to(prob.a.device)
        c = self.costs(p)
        inc = self._incremental(np.asarray(prices, dtype=np.float64), c)
        if inc is not None:
            sol, r, net, u_sum = inc
        else:
            if self.method == "hull":
                sol = solve_hull(prob.a, c, prob.utility, a_pos=self.a_pos)
            else:
                sol = solve_pairs(prob.a, c, prob.utility)
            r, net, u_sum = self._sums(sol)
        packed = torch.cat([r[: self.m], net.reshape(1)]).cpu().numpy()
        packed = self._allreduce(packed)
        usage = packed[: self.m]
        dual = float(np.dot(prices, self.cap64) + packed[self.m])
        over = usage > self.cap64
        scale64 = np.ones(self.m + 1)
        scale64[: self.m][over] = self.cap64[over] / usage[over]
        scale = torch.as_tensor(scale64, dtype=prob.a.dtype).to(p.device)
        if over.any():
            if sol.t.device.type == "cpu":
                from allocator.pricing.kernels import scaled_throughput

                t_feas = torch.from_numpy(
                    scaled_throughput(
                        sol.a_lo.numpy(),
                        sol.x_lo.numpy(),
                        sol.j_lo.numpy(),
                        sol.a_hi.numpy(),
                        sol.x_hi.numpy(),
                        sol.j_hi.numpy(),
                        scale64,
                    )
                )
            else:
                s_lo, s_hi = scale.index_select(0, sol.j_lo), scale.index_select(0, sol.j_hi)
                t_feas = sol.a_lo * sol.x_lo * s_lo + sol.a_hi * sol.x_hi * s_hi
            primal_local = prob.utility.value(t_feas).sum(dtype=torch.float64)
        else:
            t_feas = sol.t
            primal_local = u_sum
        primal = float(self._allreduce([float(primal_local)])[0])
        if math.isnan(primal):
            primal = -math.inf
        return Evaluation(
            prices=np.asarray(prices, dtype=np.float64),
            dual=dual,
            primal=primal,
            usage=usage,
            grad=self.cap64 - usage,
            scale=scale,
            sol=sol,
            t_feasible=t_feas,
            r_local=r,
            net_local=float(net),
            u_local=float(u_sum),
        )


def usage_weights(sol: Subsolution, demand: Tensor | None, m: int) -> tuple[Tensor, Tensor]:
    """What each job's two pools carry of its demand: ``x_lo d_lo`` and ``x_hi d_hi`` (``demand``: the jobs' rows)."""
    if demand is None:
        return sol.x_lo, sol.x_hi
    if demand.ndim == 1:
        return sol.x_lo * demand, sol.x_hi * demand
    d_lo = demand.gather(1, sol.j_lo.clamp(max=m - 1).unsqueeze(1)).squeeze(1)
    d_hi = demand.gather(1, sol.j_hi.clamp(max=m - 1).unsqueeze(1)).squeeze(1)
    return sol.x_lo * d_lo, sol.x_hi * d_hi


def dual_evaluation(
    throughput: ArrayLike,
    capacity: ArrayLike,
    utility: Utility,
    prices: ArrayLike,
    *,
    demand: ArrayLike | None = None,
    method: str = "hull",
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
) -> tuple[float, np.ndarray, float]:
    """Evaluate the dual function once: ``(g(p), usage r, utility of the column-scaled feasible allocation)``."""
    dev = resolve_device(device, throughput)
    prob = prepare(throughput, capacity, utility, demand, dev, resolve_dtype(dtype))
    ev = DualOracle(prob, method=method)(np.asarray(prices, dtype=np.float64))
    return ev.dual, ev.usage, ev.primal
