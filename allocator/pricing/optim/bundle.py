"""The cutting-plane price step of price discovery for nonsmooth duals (a trust-region bundle step, Kelley's method).

The dual function ``g`` of 004 Sec. 3 is convex, and every evaluation at prices ``p_k`` gives a cut: ``g(p) >= g_k +
q_k^T (p - p_k)`` with ``q_k = R - r_k`` (eq. 9). With few jobs, ``g`` is strongly nonsmooth: each job's subproblem
solution (Sec. 4.1) jumps between hull vertices as prices move, so ``g`` is (nearly) piecewise linear with kinks of
size ``O(1)`` per job, its minimiser sits on a kink, and the L-BFGS model of Alg. 2 (a quadratic) has nothing to fit:
its directions zig-zag across the kink and the line search accepts ever shorter steps (measured on 004 Sec. 6.2, three
jobs, linear utility: ``g - U*`` stayed at 1.4e-2 after 200 evaluations, ``eps = 3e-3``).

For such ``g`` the piecewise-linear model ``max_k (g_k + q_k^T (p - p_k))`` is the right one: it is exact on the
pieces already seen, and its minimiser over a box around the best prices (a linear program in ``m + 1`` variables)
is the next trial. A trial that lowers ``g`` by a tenth of the model's predicted decrease becomes the new centre
(a serious step; the box grows when the step reached its edge); otherwise its cut refines the model (a null step;
the box shrinks when the trial's value was above the centre's by more than the predicted decrease, i.e. the model
was far off). On a polyhedral ``g`` this terminates once the cuts of the pieces around the minimiser are in the
model; on a smooth ``g`` it is slower than L-BFGS, which is why :class:`allocator.pricing.optim.lbfgs.LBFGSRun` switches
to it only when L-BFGS stalls.

The box is relative: pool ``j`` may move by ``radius * s_j`` with ``s_j = max(p_j, 1e-3 max_k p_k)`` (prices of
scarce and abundant pools differ by orders of magnitude, the same scaling as Alg. 2's trust region). The LP is solved
by HiGHS (scipy, imported on first use).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["CuttingPlanes"]


@dataclass
class CuttingPlanes:
    """The cuts ``(p_k, g_k, q_k)`` of a run and the trust region of the next step (see module doc)."""

    #: cuts kept (the oldest are dropped first; the centre's own cut is always kept)
    capacity: int = 100
    #: relative half-width of the box around the centre
    radius: float = 0.05
    min_radius: float = 1e-7
    max_radius: float = 4.0
    points: list[np.ndarray] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    slopes: list[np.ndarray] = field(default_factory=list)
    #: the last trial: its predicted value and whether it lay on the box's edge
    predicted: float = np.nan
    on_edge: bool = False

    def add(self, p: np.ndarray, value: float, slope: np.ndarray) -> None:
        """Add the cut of an evaluation (``value = g(p)``, ``slope = R - r``); non-finite evaluations are skipped."""
        if not (np.isfinite(value) and np.all(np.isfinite(slope)) and np.all(np.isfinite(p))):
            return
        self.points.append(np.asarray(p, dtype=np.float64).copy())
        self.values.append(float(value))
        self.slopes.append(np.asarray(slope, dtype=np.float64).copy())
        if len(self.points) > self.capacity:
            drop = int(np.argmax(self.values[: len(self.values) - 1]))  # the worst older cut point goes first
            for store in (self.points, self.values, self.slopes):
                store.pop(drop)

    def model(self, p: np.ndarray) -> float:
        """The cutting-plane model at ``p``: ``max_k g_k + q_k^T (p - p_k)`` (a lower bound on ``g(p)``)."""
        if not self.points:
            return -np.inf
        pts, q = np.asarray(self.points), np.asarray(self.slopes)
        return float(np.max(np.asarray(self.values) + np.einsum("kj,kj->k", q, p[None, :] - pts)))

    def step(self, centre: np.ndarray, centre_value: float) -> np.ndarray | None:
        """The minimiser of the model over ``p >= 0`` and the box around ``centre``; ``None`` when the LP fails or the
        model predicts no decrease (the centre minimises the model on the box)."""
        import scipy.optimize

        m = centre.size
        top = float(np.max(centre)) if centre.size else 0.0
        scale = np.maximum(centre, max(1e-3 * top, 1e-12))
        lo = np.maximum(centre - self.radius * scale, 0.0)
        hi = centre + self.radius * scale
        pts, q, g = np.asarray(self.points), np.asarray(self.slopes), np.asarray(self.values)
        # variables (p, z): minimise z subject to q_k^T p - z <= q_k^T p_k - g_k for every cut
        a_ub = np.hstack([q, -np.ones((q.shape[0], 1))])
        b_ub = np.einsum("kj,kj->k", q, pts) - g
        # z is bounded below by the model at the centre minus what the box allows: a finite bound keeps HiGHS away
        # from unbounded rays when the cuts do not yet bound the box
        reach = float(np.abs(q).max(initial=0.0) * (hi - lo).sum())
        z_lo = self.model(centre) - reach - 1.0
        bounds = [(float(lo[j]), float(hi[j])) for j in range(m)] + [(z_lo, None)]
        c = np.zeros(m + 1)
        c[m] = 1.0
        try:
            res = scipy.optimize.linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
        except ValueError:
            return None
        if res.status != 0 or res.x is None:
            return None
        p = np.clip(res.x[:m], lo, hi)
        self.predicted = float(res.x[m])
        if not self.predicted < centre_value:
            return None
        span = np.maximum(hi - lo, 1e-300)
        self.on_edge = bool(np.any(np.minimum(p - lo, hi - p) <= 1e-6 * span) & np.any(hi - lo > 0))
        return p

    def update(self, centre_value: float, trial_value: float) -> bool:
        """Adapt the box after the trial of :meth:`step` was evaluated; True for a serious step (the trial becomes the
        centre: it lowered ``g`` by at least a tenth of the predicted decrease)."""
        predicted = centre_value - self.predicted
        serious = trial_value <= centre_value - 0.1 * predicted
        if serious:
            if self.on_edge:
                self.radius = min(2.0 * self.radius, self.max_radius)
        elif trial_value - centre_value > predicted:
            self.radius = max(0.5 * self.radius, self.min_radius)
        return serious
