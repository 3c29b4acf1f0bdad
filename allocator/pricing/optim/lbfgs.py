"""Projected L-BFGS on the dual function (004 Sec. 5, Alg. 2 step 3) with best-bound bookkeeping, the stopping rule
``g(p) - U(X) <= eps`` (Alg. 2 step 2) and the stall-triggered primal recovery.

Price steps, by the state of the run:

==================  ==============================================================  ================================
step                when                                                            what
==================  ==============================================================  ================================
``lbfgs``           from the start                                                  projected L-BFGS direction,
                                                                                    Armijo backtracking (Alg. 2)
``cutting-plane``   once L-BFGS stalls on a nonsmooth ``g`` with the gap open: its  the minimiser of the cutting-
                    line search fails, or over :attr:`LBFGSRun.STALL_WINDOW`        plane model of all evaluations
                    evaluations the best dual value fell by less than 1 % of the    over a box around the best
                    gap, 10 % with every line search backtracking, or 30 % over     prices
                    three windows (:meth:`LBFGSRun._dual_stalled`; few jobs: 004    (``optim.bundle``)
                    Sec. 6.2 with 2-30 jobs); for the rest of the run. A float32
                    run that may escalate and stalls at the level of its rounding
                    continues in float64 instead, and takes this step if it
                    stalls again
``subgradient``     the presolve's runs only (:attr:`LBFGSRun.cutting_planes` off)  projected subgradient step of
                    when the line search fails                                      diminishing length
==================  ==============================================================  ================================

A run whose cutting-plane model is minimised at the best prices (the model, a lower bound on ``g``, equals ``g``
there) has optimal prices; it stops stepping and leaves the gap to the primal recovery.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from allocator.pricing.dual.oracle import DualOracle, Evaluation
from allocator.pricing.optim.bundle import CuttingPlanes
from allocator.pricing.primal.recovery import recover
from allocator.pricing.result import IterationRecord

__all__ = ["LBFGSOptions", "LBFGSRun"]


@dataclass(frozen=True)
class LBFGSOptions:
    """What one run of Algorithm 2 takes from the driver's configuration (:class:`~allocator.pricing.PriceDiscovery`
    has the same fields with the same defaults and documents them): the L-BFGS ``memory``, the backtracking trials
    per iteration ``max_line_search``, the Armijo constant ``armijo``, the initial trust region ``max_ratio``, whether
    to keep the per-evaluation history (``record_history``, reported to ``on_evaluation`` as it happens) and whether
    to try the LP recovery of tied jobs (``recover``)."""

    memory: int = 10
    max_line_search: int = 12
    armijo: float = 1e-4
    max_ratio: float = 1.5
    record_history: bool = True
    recover: bool = True
    on_evaluation: Callable[[IterationRecord], None] | None = None


class LBFGSRun:
    """State of one run of Algorithm 2 (projected L-BFGS on the dual, with best-bound bookkeeping)."""

    def __init__(self, cfg: LBFGSOptions, evaluator: DualOracle, eps: float, max_iter: int) -> None:
        self.cfg = cfg
        self.evaluate_fn = evaluator
        self.eps = eps
        self.max_iter = max_iter
        self.evaluations = 0
        self.history: list[IterationRecord] = []
        self.best_dual: tuple[np.ndarray, Evaluation]
        self.best_primal: Evaluation
        self._started = False
        self.cap = evaluator.cap64
        self.warm = False
        self.recoveries = 0
        self.last_recovery = 0  #: evaluation count at the last recovery attempt
        self.gaps: list[float] = []  #: gap after each evaluation
        #: float32 run that may stop on a precision stall (:attr:`PriceDiscovery.escalate`), and whether it did
        self.low_precision = False
        self.precision_stall = False
        #: L-BFGS pairs (s, y) to start from (a presolve's curvature); the last pairs are left here by optimise.
        self.mem_s: list[np.ndarray] = []
        self.mem_y: list[np.ndarray] = []
        #: the cuts of every evaluation (the cutting-plane step's model) and the best dual value after each evaluation
        self.cuts = CuttingPlanes()
        self.best_duals: list[float] = []
        #: the cutting-plane model was minimised at the best prices (the run stopped stepping, see the module doc)
        self.model_stall = False
        #: whether a stalled L-BFGS hands over to the cutting-plane step (off for the presolve, which is wanted for its
        #: approximate prices and L-BFGS curvature pairs, not for an exact optimum of the sample)
        self.cutting_planes = True
        #: evaluation count when a line search last accepted its first trial step
        self.last_full_step = 0

    #: LP recoveries tried per solve; each is one HiGHS solve over the tied jobs, so they are rationed.
    MAX_RECOVERIES = 50

    #: Mid-run recovery needs a stall: the gap has not halved over the last ``STALL_WINDOW`` evaluations, nor since
    #: the previous attempt. While L-BFGS still closes the gap, an LP (seconds for a thousand tied jobs) costs far
    #: more than the few evaluations column scaling needs (n = 4000: 13 s with eager recovery, 18 ms without).
    STALL_WINDOW = 8

    def _stalled(self) -> bool:
        w = self.STALL_WINDOW
        if len(self.gaps) < w or self.evaluations - self.last_recovery < w:
            return False
        return self.gap() > 0.5 * self.gaps[-w]

    def _try_recovery(self, ev: Evaluation) -> None:
        if not self.cfg.recover or self.recoveries >= self.MAX_RECOVERIES:
            return
        self.recoveries += 1
        self.last_recovery = self.evaluations
        if recover(self.evaluate_fn, ev, self.best_dual[1].dual - self.eps) and ev.primal > self.best_primal.primal:
            self.best_primal = ev

    def finish(self) -> None:
        """Last resort when the gap is still open: recover at the best dual prices."""
        if self._started and self.gap() > self.eps:
            self._try_recovery(self.best_dual[1])

    def gap(self) -> float:
        return self.best_dual[1].dual - self.best_primal.primal

    #: Evaluations over which a float32 run's open gap must shrink by 1 % (see :attr:`PriceDiscovery.escalate`).
    PRECISION_WINDOW = 25

    def _precision_stalled(self) -> bool:
        w = self.PRECISION_WINDOW
        if not self.low_precision or len(self.gaps) < w or self.gap() <= self.eps:
            return False
        return self.gap() >= 0.99 * self.gaps[-w]

    def done(self) -> bool:
        if self.gap() <= self.eps or self.evaluations >= self.max_iter:
            return True
        if self._precision_stalled():
            self.precision_stall = True
            return True
        return False

    def evaluate(self, p: np.ndarray, kind: str) -> Evaluation:
        ev = self.evaluate_fn(p)
        self.evaluations += 1
        before = (self.best_dual[1], self.best_primal) if self._started else ()
        if not self._started:
            self.best_dual = (p.copy(), ev)
            self.best_primal = ev
            self._started = True
            if self.warm and self.gap() > self.eps:
                self._try_recovery(ev)  # warm start: the given prices are meant to be (near) optimal
        else:
            previous = self.best_dual[1].dual
            if ev.dual < previous:
                self.best_dual = (p.copy(), ev)
            if ev.primal > self.best_primal.primal:
                self.best_primal = ev
            # The dual has (nearly) stopped improving but the gap is open: the column-scaled allocation is what
            # lags (kinks of g, tied jobs), so split the tied jobs exactly at the best prices.
            if (
                ev.dual <= previous
                and self.gap() > self.eps
                and previous - ev.dual <= 0.1 * self.gap()
                and self._stalled()
            ):
                self._try_recovery(ev)
        # Only the best dual and the best primal evaluations are used later (the result, the reuse state, the last
        # recovery): release the per-job arrays of the others, so that a run holds at most two subsolutions.
        keep = (self.best_dual[1], self.best_primal)
        for old in (*before, ev):
            if not any(old is k for k in keep):
                old.release()
        self.gaps.append(self.gap())
        self.best_duals.append(self.best_dual[1].dual)
        self.cuts.add(p, ev.dual, ev.grad)
        if self.cfg.record_history:
            self.history.append(
                IterationRecord(
                    iteration=self.evaluations,
                    prices=p.copy(),
                    usage=ev.usage.copy(),
                    dual_value=ev.dual,
                    primal_value=ev.primal,
                    gap=self.gap(),
                    kind=kind,
                )
            )
            if self.cfg.on_evaluation is not None:
                self.cfg.on_evaluation(self.history[-1])
        return ev

    def optimise(self, p0: np.ndarray) -> None:
        p = np.maximum(np.asarray(p0, dtype=np.float64), 0.0)
        ev = self.evaluate(p, "init")
        if self.done():
            return
        cap = self.cap
        # Preconditioner diag(p / R): the exact Newton scaling for log utility with one pool (unit price elasticity).
        pscale = p.max() if p.max() > 0 else 1.0
        rscale = cap.max() if cap.max() > 0 else 1.0
        h = np.maximum(p, 1e-3 * pscale) / np.maximum(cap, 1e-3 * rscale)
        mem_s = self.mem_s
        mem_y = self.mem_y
        sub_step = 1.0
        ratio = self.cfg.max_ratio
        while not self.done():
            if self.cutting_planes and self._dual_stalled():
                self._cutting_planes()
                return
            q = ev.grad
            free = ~((p <= 0) & (q > 0))
            direction = -self._two_loop(q * free, mem_s, mem_y, h) * free
            slope = float(direction @ q)
            if not (slope < 0) or not np.all(np.isfinite(direction)):
                mem_s.clear()
                mem_y.clear()
                direction = -h * q * free
                slope = float(direction @ q)
                if not slope < 0:
                    return  # projected gradient is zero: p is optimal up to ties
            step = self._max_step(p, direction, ratio)
            first_step = step
            accepted: tuple[np.ndarray, Evaluation] | None = None
            best_trial: tuple[np.ndarray, Evaluation] | None = None
            for _ in range(self.cfg.max_line_search):
                p_new = np.maximum(p + step * direction, 0.0)
                ev_new = self.evaluate(p_new, "lbfgs")
                if self.done():
                    return
                if best_trial is None or ev_new.dual < best_trial[1].dual:
                    best_trial = (p_new, ev_new)
                decrease = float(q @ (p_new - p))
                if ev_new.dual <= ev.dual + self.cfg.armijo * decrease:
                    accepted = (p_new, ev_new)
                    # Trust-region radius update: widen after a full (bounded) step, narrow after backtracking.
                    ratio = min(ratio * ratio, 1e8) if step == first_step else max(self.cfg.max_ratio, ratio**0.5)
                    if step == first_step:
                        self.last_full_step = self.evaluations
                    break
                # Safeguarded quadratic interpolation of phi(step) = g(p + step d) along the path.
                denom = 2.0 * (ev_new.dual - ev.dual - step * slope)
                cand = -slope * step * step / denom if denom > 0 else 0.5 * step
                step = float(min(max(cand, 0.1 * step), 0.5 * step))
            if accepted is None and self.cutting_planes:
                # Line search failed: g is nonsmooth where the run is, the cutting-plane step takes over.
                self._cutting_planes()
                return
            if accepted is None:
                # (presolve) projected subgradient step with diminishing length
                mem_s.clear()
                mem_y.clear()
                if best_trial is not None and best_trial[1].dual < ev.dual:
                    accepted = best_trial
                else:
                    sub_step *= 0.5
                    p_new = np.maximum(p - sub_step * h * q, 0.0)
                    accepted = (p_new, self.evaluate(p_new, "subgradient"))
                    if self.done():
                        return
            p_new, ev_new = accepted
            s_vec = p_new - p
            y_vec = ev_new.grad - ev.grad
            # g is convex so s.y >= 0; the sign of y is that of the gradient of g, i.e. -(r - R) = q.
            sy = float(s_vec @ y_vec)
            if sy > 1e-12 * float(np.linalg.norm(s_vec) * np.linalg.norm(y_vec)) and sy > 0:
                mem_s.append(s_vec)
                mem_y.append(y_vec)
                if len(mem_s) > self.cfg.memory:
                    mem_s.pop(0)
                    mem_y.pop(0)
            p, ev = p_new, ev_new

    def _dual_stalled(self) -> bool:
        """L-BFGS has stopped lowering ``g`` while the gap is open, measured over windows of :attr:`STALL_WINDOW`
        evaluations: the best dual value fell by less than 1 % of the gap in the last window, or by less than 10 %
        with every line search of the window backtracking, or by less than 30 % in the last three windows. That is a
        quadratic model zig-zagging across the kinks of a nonsmooth ``g``, or crawling with a curvature pair taken
        across one (004 Sec. 6.2 with few jobs: three jobs, linear utility: ``g`` fell by 1e-3 in 100 evaluations,
        15 times less than the distance left to ``U*``; two jobs, target-priority: full steps of 1.7e-4 each, 150
        evaluations for a gap of 0.04). While L-BFGS takes full steps that matter it is making its way: a smooth
        ``g`` whose column-scaled primal lags has a gap much larger than what is left of ``g - U*`` (4000 jobs, 8
        pools: the first rule alone handed over after 17 evaluations and needed 67 instead of 45)."""
        w = self.STALL_WINDOW
        gap = self.gap()
        if len(self.best_duals) <= w or gap <= self.eps:
            return False
        recent = self.best_duals[-w - 1] - self.best_duals[-1]
        if recent < 0.01 * gap:
            return True
        if self.evaluations - self.last_full_step >= w and recent < 0.1 * gap:
            return True
        return len(self.best_duals) > 3 * w and self.best_duals[-3 * w - 1] - self.best_duals[-1] < 0.3 * gap

    #: A float32 stall is taken for rounding noise when the best dual value fell by at most this fraction of the
    #: magnitude of its terms, ``|p^T R| + |g - p^T R|``, over :attr:`STALL_WINDOW` evaluations (~100 float32 ulps).
    NOISE = 1e-5

    def _noise_stall(self) -> bool:
        """A float32 run's stall is rounding noise, not a kink: over the last :attr:`STALL_WINDOW` evaluations the
        best dual value fell by at most :attr:`NOISE` of the magnitude of its terms."""
        w = self.STALL_WINDOW
        p, ev = self.best_dual
        priced = float(np.dot(p, self.cap))
        scale = abs(priced) + abs(ev.dual - priced)
        recent = self.best_duals[-w - 1] - self.best_duals[-1] if len(self.best_duals) > w else 0.0
        return recent <= self.NOISE * scale

    def _cutting_planes(self) -> None:
        """The rest of the run in cutting-plane steps (:mod:`allocator.pricing.optim.bundle`) around the best dual
        prices, until the stopping rule holds, the evaluations run out, or the model is minimised at the best prices.

        A float32 run that may escalate and whose stall is rounding noise (:meth:`_noise_stall`) stops here instead
        (a precision stall): near the optimum its dual values differ by less than their rounding, which stalls
        L-BFGS as a kink does, and its cuts would be as noisy; the float64 continuation
        (:attr:`PriceDiscovery.escalate`) takes the cutting-plane step if it stalls again (004 Sec. 6.4 market,
        20000 jobs on 8 pools, power utility: 29 evaluations instead of 81)."""
        if self.low_precision and self._noise_stall():
            self.precision_stall = True
            return
        cuts = self.cuts
        while not self.done():
            p_hat, ev_hat = self.best_dual
            p_new = cuts.step(p_hat, ev_hat.dual)
            if p_new is None:
                # The model (a lower bound on g, exact at the best prices) is minimised there: the prices are optimal
                # up to the evaluations' precision. A float32 run has met its precision stall (escalation, see
                # :attr:`PriceDiscovery.escalate`); otherwise the open gap is the allocation's (the caller's recovery).
                self.model_stall = True
                self.precision_stall = self.low_precision
                return
            ev_new = self.evaluate(p_new, "cutting-plane")
            cuts.update(ev_hat.dual, ev_new.dual)

    @staticmethod
    def _max_step(p: np.ndarray, direction: np.ndarray, ratio: float) -> float:
        """Largest step <= 1 that changes no positive price by more than a factor ``ratio`` (a trust region in
        relative price terms: prices of scarce and abundant pools differ by orders of magnitude)."""
        step = 1.0
        pos = p > 0
        up = pos & (direction > 0)
        down = pos & (direction < 0)
        if up.any():
            step = min(step, float(np.min((ratio - 1.0) * p[up] / direction[up])))
        if down.any():
            step = min(step, float(np.min((1.0 - 1.0 / ratio) * p[down] / -direction[down])))
        return max(step, 1e-12)

    @staticmethod
    def _two_loop(g: np.ndarray, mem_s: list[np.ndarray], mem_y: list[np.ndarray], h: np.ndarray) -> np.ndarray:
        """L-BFGS two-loop recursion: ``H g`` with initial matrix ``gamma diag(h)``."""
        q = g.copy()
        alphas = []
        rhos = [1.0 / float(s @ y) for s, y in zip(mem_s, mem_y)]
        for s, y, rho in zip(reversed(mem_s), reversed(mem_y), reversed(rhos)):
            alpha = rho * float(s @ q)
            q -= alpha * y
            alphas.append(alpha)
        if mem_s:
            s, y = mem_s[-1], mem_y[-1]
            gamma = float(s @ y) / float(y @ (h * y))
        else:
            gamma = 1.0
        r = gamma * h * q
        for s, y, rho, alpha in zip(mem_s, mem_y, rhos, reversed(alphas)):
            beta = rho * float(y @ r)
            r += s * (alpha - beta)
        return r
