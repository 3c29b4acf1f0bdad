"""Utility curves over integer resource units ``0..C`` (Lai et al., paper 000, Sections III and VII).

A *curve family* holds the utility functions ``f_i : {0, ..., C} -> R>=0`` of ``n`` threads (pods) at once, vectorised
over threads. Section III requires every ``f_i`` to be nonnegative and nondecreasing; Section V additionally needs
concavity, and Section VII allows nonconcave curves made of ``s`` concave or convex segments. Four families:

- :class:`TableCurves` -- a dense ``(n, C+1)`` table (raw tables, or PCHIP/linear interpolants sampled on the grid).
- :class:`PiecewiseLinearCurves` -- compact: at most ``K`` breakpoints per thread, ``O(nK)`` memory whatever ``C``;
  this is what makes the ``n = 1e5, C = 1e4`` case fit (a dense table would need 8 GB).
- :class:`ParametricCurves` -- compact ``w * x**beta`` and ``w * log(1 + x/s)``; ``w * min(x, c)`` is built as a
  piecewise-linear family.

Public builders for callers such as the planner: :func:`curves_from_points`, :func:`parametric_curves`,
:func:`as_curves`.

Every family answers the same vectorised questions used by the algorithms: ``evaluate(c, rows)`` (utility at integer
allocations), ``demand(lam)`` (for concave curves: how many units have marginal utility ``>= lam``, the inner step of
Galil's bisection [12]), ``concave()`` and ``segments()`` (the ``s`` of Section VII), and ``table()`` (dense form for
the exact dynamic programme).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

#: Relative tolerance used to accept floating-point noise in monotonicity and concavity checks.
REL_TOL = 1e-9
#: Largest dense table (n * (C + 1) entries) a builder creates implicitly.
MAX_DENSE_ENTRIES = 50_000_000


def _segments_from_second_differences(d2: FloatArray, tol: FloatArray) -> IntArray:
    """Number of maximal concave/convex pieces per row, from second differences (or slope changes) ``d2``.

    A kink with ``d2 < -tol`` is concave, ``d2 > tol`` convex, anything else neutral. A curve whose kinks are all of
    one sign (or none) has ``s = 1``; every alternation of sign between consecutive non-neutral kinks starts a new
    segment (Section VII's ``0 = b_0 < b_1 < ... < b_k = C``).
    """
    sign = np.where(d2 < -tol, -1, np.where(d2 > tol, 1, 0)).astype(np.int64)
    n = sign.shape[0]
    out = np.ones(n, dtype=np.int64)
    if sign.shape[1] == 0:
        return out
    # carry the last nonzero sign forward, then count changes between consecutive nonzero signs
    idx = np.where(sign != 0, np.arange(sign.shape[1])[None, :], -1)
    last = np.maximum.accumulate(idx, axis=1)
    filled = np.where(last >= 0, np.take_along_axis(sign, np.maximum(last, 0), axis=1), 0)
    changes = (filled[:, 1:] != filled[:, :-1]) & (filled[:, :-1] != 0) & (filled[:, 1:] != 0)
    return out + changes.sum(axis=1).astype(np.int64)


class CurveFamily(ABC):
    """``n`` nondecreasing, nonnegative utility curves on the integer grid ``0..capacity``."""

    n: int
    capacity: int

    @abstractmethod
    def evaluate(self, c: ArrayLike, rows: ArrayLike | None = None) -> FloatArray:
        """``f_rows[k](c[k])`` for integer ``c`` in ``[0, capacity]``; ``rows=None`` means all threads in order."""

    @abstractmethod
    def concave(self) -> NDArray[np.bool_]:
        """Per thread: is the curve concave on the integer grid (marginals nonincreasing)?"""

    @abstractmethod
    def segments(self) -> IntArray:
        """Per thread: the number ``s`` of maximal concave or convex segments (Section VII); 1 for concave curves."""

    @abstractmethod
    def with_capacity(self, capacity: int) -> CurveFamily:
        """The same curves on ``0..capacity``: tables and point curves stay flat beyond their last point (``ValueError``
        naming the first thread whose curve is longer than ``capacity``); parametric formulas simply extend."""

    def table(self) -> FloatArray:
        """Dense ``(n, capacity+1)`` table ``values[i, c] = f_i(c)``."""
        entries = self.n * (self.capacity + 1)
        if entries > 4 * MAX_DENSE_ENTRIES:
            raise ValueError(f"dense table of {self.n} x {self.capacity + 1} entries is too large")
        grid = np.arange(self.capacity + 1, dtype=np.int64)
        rows = np.repeat(np.arange(self.n, dtype=np.int64), self.capacity + 1)
        return self.evaluate(np.tile(grid, self.n), rows).reshape(self.n, self.capacity + 1)

    def max_first_marginal(self) -> float:
        """``max_i f_i(1) - f_i(0)``: the largest marginal utility of any unit for concave curves."""
        if self.capacity == 0 or self.n == 0:
            return 0.0
        one = np.ones(self.n, dtype=np.int64)
        return float(np.max(self.evaluate(one) - self.evaluate(0 * one)))

    def demand(self, lam: float | FloatArray, *, strict: bool = False) -> IntArray:
        """Units each (concave) thread takes at marginal price ``lam``: the largest ``c`` in ``[0, C]`` with
        ``f_i(c) - f_i(c-1) >= lam`` (``> lam`` when ``strict``), 0 when there is none. ``lam`` is a scalar or one
        price per thread.

        For concave curves the marginals are nonincreasing, so this is a prefix length; this generic version is a
        vectorised binary search over ``c`` (``O(n log C)`` evaluations). Subclasses override it in closed form.
        """
        lo = np.zeros(self.n, dtype=np.int64)
        hi = np.full(self.n, self.capacity, dtype=np.int64)
        rows = np.arange(self.n, dtype=np.int64)
        lamv = np.broadcast_to(np.asarray(lam, dtype=np.float64), (self.n,))
        while True:
            active = lo < hi
            if not active.any():
                return lo
            r = rows[active]
            mid = (lo[active] + hi[active] + 1) // 2
            marg = self.evaluate(mid, r) - self.evaluate(mid - 1, r)
            ok = marg > lamv[r] if strict else marg >= lamv[r]
            lo[r] = np.where(ok, mid, lo[r])
            hi[r] = np.where(ok, hi[r], mid - 1)


def _check_rows_values(values: FloatArray, what: str = "curve") -> None:
    """Finite, nonnegative, nondecreasing rows; ``ValueError`` naming the first offending thread (Section III)."""
    bad = ~np.isfinite(values).all(axis=1)
    if bad.any():
        raise ValueError(f"thread {int(np.argmax(bad))}: {what} contains NaN or infinite values")
    neg = (values < 0).any(axis=1)
    if neg.any():
        raise ValueError(f"thread {int(np.argmax(neg))}: {what} has negative utility values")
    if values.shape[1] > 1:
        scale = np.maximum(np.abs(values).max(axis=1), 1.0)
        dec = (np.diff(values, axis=1) < -REL_TOL * scale[:, None]).any(axis=1)
        if dec.any():
            raise ValueError(f"thread {int(np.argmax(dec))}: {what} is decreasing (utilities must be nondecreasing)")


@dataclass
class TableCurves(CurveFamily):
    """Dense table: ``values[i, c]`` is the utility of thread ``i`` given ``c`` units, ``c = 0..C``.

    Any nondecreasing nonnegative table is accepted (raw profiled tables, Section VIII's sampled PCHIP curves, the
    nonconcave curves of Section VII).
    """

    values: FloatArray
    n: int = field(init=False)
    capacity: int = field(init=False)

    def __post_init__(self) -> None:
        v = np.asarray(self.values, dtype=np.float64)
        if v.ndim != 2 or v.shape[1] < 1:
            raise ValueError(f"a utility table must have shape (n, C+1); got {v.shape}")
        _check_rows_values(v)
        # absorb sub-tolerance noise so that the stored curves are exactly nondecreasing
        self.values = np.maximum.accumulate(v, axis=1)
        self.n = int(v.shape[0])
        self.capacity = int(v.shape[1] - 1)

    def evaluate(self, c: ArrayLike, rows: ArrayLike | None = None) -> FloatArray:
        cc = np.asarray(c, dtype=np.int64)
        r = np.arange(self.n) if rows is None else np.asarray(rows, dtype=np.int64)
        return self.values[r, cc]

    def _tol(self) -> FloatArray:
        return REL_TOL * np.maximum(np.abs(self.values).max(axis=1), 1.0)

    def concave(self) -> NDArray[np.bool_]:
        if self.capacity < 2:
            return np.ones(self.n, dtype=bool)
        d2 = np.diff(self.values, n=2, axis=1)
        return np.asarray((d2 <= self._tol()[:, None]).all(axis=1))

    def segments(self) -> IntArray:
        if self.capacity < 2:
            return np.ones(self.n, dtype=np.int64)
        return _segments_from_second_differences(np.diff(self.values, n=2, axis=1), self._tol()[:, None])

    def with_capacity(self, capacity: int) -> TableCurves:
        width = self.values.shape[1]
        if width > capacity + 1:
            raise ValueError(
                f"thread 0: curve has {width} points (0..{width - 1}) but the largest capacity is {capacity}"
            )
        if width == capacity + 1:
            return self
        pad = np.repeat(self.values[:, -1:], capacity + 1 - width, axis=1)
        return TableCurves(np.concatenate([self.values, pad], axis=1))

    def demand(self, lam: float | FloatArray, *, strict: bool = False) -> IntArray:
        if self.n * self.capacity > 4_000_000:
            return super().demand(lam, strict=strict)
        marg = np.diff(self.values, axis=1)
        lv = np.broadcast_to(np.asarray(lam, dtype=np.float64), (self.n,))[:, None]
        ok = marg > lv if strict else marg >= lv
        # concave rows: a prefix; counting works, and equals the prefix length
        return ok.sum(axis=1).astype(np.int64)


@dataclass
class PiecewiseLinearCurves(CurveFamily):
    """Compact piecewise-linear curves: ``f_i`` interpolates ``(x[i, k], y[i, k])`` linearly, flat after its last
    breakpoint. ``x[i, 0] = 0``, ``x`` strictly increasing per row over the first ``counts[i]`` entries.

    Memory ``O(nK)``; :meth:`demand` is closed-form (``O(nK)`` per call), which is what Galil's bisection needs on
    ``n = 1e5`` threads with ``C = 1e4`` units. Breakpoints need not be integers: utilities are evaluated exactly on
    the integer grid.
    """

    x: FloatArray
    y: FloatArray
    capacity: int
    counts: IntArray | None = None
    n: int = field(init=False)

    def __post_init__(self) -> None:
        x = np.atleast_2d(np.asarray(self.x, dtype=np.float64))
        y = np.atleast_2d(np.asarray(self.y, dtype=np.float64))
        if x.shape != y.shape or x.ndim != 2 or x.shape[1] < 1:
            raise ValueError(f"breakpoints x and values y must have the same shape (n, K); got {x.shape}, {y.shape}")
        n, K = x.shape
        cap = int(self.capacity)
        if cap < 0:
            raise ValueError(f"capacity must be >= 0; got {cap}")
        counts = np.full(n, K, dtype=np.int64) if self.counts is None else np.asarray(self.counts, dtype=np.int64)
        if counts.shape != (n,) or (counts < 1).any() or (counts > K).any():
            raise ValueError("counts must give, per thread, a number of breakpoints in 1..K")
        valid = np.arange(K)[None, :] < counts[:, None]
        # pad unused slots with the last valid point so that checks below see a flat continuation
        last = counts - 1
        xl = x[np.arange(n), last]
        yl = y[np.arange(n), last]
        x = np.where(valid, x, xl[:, None])
        y = np.where(valid, y, yl[:, None])
        _check_rows_values(y)
        bad = ~np.isfinite(x).all(axis=1)
        if bad.any():
            raise ValueError(f"thread {int(np.argmax(bad))}: breakpoints contain NaN or infinite values")
        bad = x[:, 0] != 0
        if bad.any():
            raise ValueError(f"thread {int(np.argmax(bad))}: the first breakpoint must be at 0 units")
        inc = np.diff(x, axis=1)
        bad = ((inc <= 0) & valid[:, 1:]).any(axis=1)
        if bad.any():
            raise ValueError(f"thread {int(np.argmax(bad))}: breakpoints must be strictly increasing")
        bad = xl > cap
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"thread {i}: curve extends to {xl[i]:g} units, beyond the largest capacity {cap}")
        # internal form: one extra flat segment to (cap + 1) so that every c in [0, cap] falls inside a segment;
        # padded slots become zero-length-free by spacing them beyond cap.
        pad_x = np.where(valid, x, cap + 1.0 + np.arange(K)[None, :])
        self._x = np.concatenate([pad_x, np.full((n, 1), cap + 1.0 + K)], axis=1)
        self._y = np.concatenate([y, yl[:, None]], axis=1)
        self._slope = np.diff(self._y, axis=1) / np.diff(self._x, axis=1)
        self._integral = bool(np.all(pad_x == np.round(pad_x)))
        self.x, self.y, self.counts, self.capacity, self.n = x, y, counts, cap, n

    def evaluate(self, c: ArrayLike, rows: ArrayLike | None = None) -> FloatArray:
        cc = np.asarray(c, dtype=np.float64)
        if rows is None:
            xs, ys, sl = self._x, self._y, self._slope
        else:
            r = np.asarray(rows, dtype=np.int64)
            xs, ys, sl = self._x[r], self._y[r], self._slope[r]
        k = (xs[:, 1:-1] <= cc[:, None]).sum(axis=1)
        x0 = np.take_along_axis(xs, k[:, None], axis=1)[:, 0]
        y0 = np.take_along_axis(ys, k[:, None], axis=1)[:, 0]
        s0 = np.take_along_axis(sl, k[:, None], axis=1)[:, 0]
        return np.asarray(y0 + s0 * (cc - x0))

    def _tol(self) -> FloatArray:
        return REL_TOL * np.maximum(np.abs(self._slope).max(axis=1), 1e-300)

    def concave(self) -> NDArray[np.bool_]:
        return np.asarray((np.diff(self._slope, axis=1) <= self._tol()[:, None]).all(axis=1))

    def segments(self) -> IntArray:
        return _segments_from_second_differences(np.diff(self._slope, axis=1), self._tol()[:, None])

    def with_capacity(self, capacity: int) -> PiecewiseLinearCurves:
        if capacity == self.capacity:
            return self
        return PiecewiseLinearCurves(self.x, self.y, capacity, self.counts)

    def demand(self, lam: float | FloatArray, *, strict: bool = False) -> IntArray:
        """Closed form for concave piecewise-linear curves: with ``k`` the number of leading segments whose slope is
        ``>= lam``, every unit left of breakpoint ``x_k`` has marginal ``>= lam`` and every unit right of it less;
        only the unit straddling a non-integer ``x_k`` needs an evaluation."""
        lv = np.asarray(lam, dtype=np.float64)
        lv2 = lv[:, None] if lv.ndim == 1 else lv
        ok = self._slope > lv2 if strict else self._slope >= lv2
        k = ok.sum(axis=1)
        xk = np.minimum(np.take_along_axis(self._x, k[:, None], axis=1)[:, 0], self.capacity)
        u = np.floor(xk).astype(np.int64)
        if self._integral:
            return u
        cand = np.flatnonzero(u < self.capacity)
        if cand.size:
            m = self.evaluate(u[cand] + 1, cand) - self.evaluate(u[cand], cand)
            lc = lv[cand] if lv.ndim == 1 else lv
            take = m > lc if strict else m >= lc
            u[cand[take]] += 1
        return u


_PARAMETRIC_KINDS = ("power", "log")


@dataclass
class ParametricCurves(CurveFamily):
    """Compact parametric curves, one parameter vector per thread (broadcast from scalars):

    - ``kind="power"``: ``f_i(x) = weight_i * x**beta_i`` (concave for ``beta <= 1``, convex for ``beta > 1``;
      Section I's ``x^beta`` example).
    - ``kind="log"``: ``f_i(x) = weight_i * log(1 + x / scale_i)`` (concave).
    """

    kind: str
    weight: FloatArray
    shape: FloatArray
    capacity: int
    n: int = field(init=False)

    def __post_init__(self) -> None:
        if self.kind not in _PARAMETRIC_KINDS:
            raise ValueError(f"unknown parametric kind {self.kind!r}; expected one of {_PARAMETRIC_KINDS} or 'min'")
        w, s = np.broadcast_arrays(np.asarray(self.weight, dtype=np.float64), np.asarray(self.shape, dtype=np.float64))
        w, s = np.atleast_1d(w).astype(np.float64), np.atleast_1d(s).astype(np.float64)
        label = "beta" if self.kind == "power" else "scale"
        for name, arr in (("weight", w), (label, s)):
            bad = ~np.isfinite(arr)
            if bad.any():
                raise ValueError(f"thread {int(np.argmax(bad))}: {name} is NaN or infinite")
        bad = w < 0
        if bad.any():
            raise ValueError(f"thread {int(np.argmax(bad))}: weight must be >= 0 (utilities are nonnegative)")
        bad = s <= 0
        if bad.any():
            raise ValueError(f"thread {int(np.argmax(bad))}: {label} must be > 0")
        if int(self.capacity) < 0:
            raise ValueError(f"capacity must be >= 0; got {self.capacity}")
        self.weight, self.shape, self.capacity, self.n = w, s, int(self.capacity), int(w.shape[0])

    def evaluate(self, c: ArrayLike, rows: ArrayLike | None = None) -> FloatArray:
        cc = np.asarray(c, dtype=np.float64)
        w = self.weight if rows is None else self.weight[np.asarray(rows, dtype=np.int64)]
        s = self.shape if rows is None else self.shape[np.asarray(rows, dtype=np.int64)]
        if self.kind == "power":
            return np.asarray(w * np.power(cc, s))
        return np.asarray(w * np.log1p(cc / s))

    def concave(self) -> NDArray[np.bool_]:
        if self.kind == "power":
            return np.asarray((self.shape <= 1.0) | (self.weight == 0) | (self.capacity < 2))
        return np.ones(self.n, dtype=bool)

    def segments(self) -> IntArray:
        return np.ones(self.n, dtype=np.int64)

    def with_capacity(self, capacity: int) -> ParametricCurves:
        return ParametricCurves(self.kind, self.weight, self.shape, capacity)


# ----------------------------------------------------------------------------------------------------------------------
# builders


def _pchip_slopes(x: FloatArray, y: FloatArray) -> FloatArray:
    """Fritsch-Carlson (PCHIP) derivatives at the knots, vectorised over rows with a common number of knots ``K``:
    interior knots take the weighted harmonic mean of the adjacent secant slopes (0 at a local extremum or a flat
    secant); end knots the shape-preserving three-point formula. Monotone data give a monotone interpolant."""
    h = np.diff(x, axis=1)
    delta = np.diff(y, axis=1) / h
    n, K = x.shape
    d = np.zeros((n, K))
    if K == 2:
        d[:, 0] = d[:, 1] = delta[:, 0]
        return d
    h0, h1 = h[:, :-1], h[:, 1:]
    d0, d1 = delta[:, :-1], delta[:, 1:]
    w1, w2 = 2 * h1 + h0, h1 + 2 * h0
    same = (d0 * d1) > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        hm = (w1 + w2) / (w1 / d0 + w2 / d1)
    d[:, 1:-1] = np.where(same, hm, 0.0)

    def end(hA: FloatArray, hB: FloatArray, dA: FloatArray, dB: FloatArray) -> FloatArray:
        e = ((2 * hA + hB) * dA - hA * dB) / (hA + hB)
        e = np.where(np.sign(e) != np.sign(dA), 0.0, e)
        return np.where((np.sign(dA) != np.sign(dB)) & (np.abs(e) > 3 * np.abs(dA)), 3 * dA, e)

    d[:, 0] = end(h[:, 0], h[:, 1], delta[:, 0], delta[:, 1])
    d[:, -1] = end(h[:, -1], h[:, -2], delta[:, -1], delta[:, -2])
    return d


def pchip_table(x: ArrayLike, y: ArrayLike, capacity: int) -> FloatArray:
    """Sample the PCHIP interpolant of each row's points ``(x[i, k], y[i, k])`` on ``0..capacity`` (flat after the
    last point). Rows share the number of points ``K >= 2``; ``x[:, 0] = 0``. This is the interpolation Section VIII
    applies (Matlab's ``pchip``) to its three generated points."""
    X = np.atleast_2d(np.asarray(x, dtype=np.float64))
    Y = np.atleast_2d(np.asarray(y, dtype=np.float64))
    n, K = X.shape
    d = _pchip_slopes(X, Y)
    grid = np.arange(capacity + 1, dtype=np.float64)
    out = np.empty((n, capacity + 1))
    chunk = max(1, 2_000_000 // max(1, (capacity + 1) * K))
    for a in range(0, n, chunk):
        xs, ys, ds = X[a : a + chunk], Y[a : a + chunk], d[a : a + chunk]
        g = np.broadcast_to(grid, (xs.shape[0], capacity + 1))
        k = np.clip((xs[:, None, 1:-1] <= g[:, :, None]).sum(axis=2), 0, K - 2)
        x0 = np.take_along_axis(xs, k, axis=1)
        x1 = np.take_along_axis(xs, k + 1, axis=1)
        y0 = np.take_along_axis(ys, k, axis=1)
        y1 = np.take_along_axis(ys, k + 1, axis=1)
        m0 = np.take_along_axis(ds, k, axis=1)
        m1 = np.take_along_axis(ds, k + 1, axis=1)
        hh = x1 - x0
        t = np.clip((g - x0) / hh, 0.0, 1.0)
        t2, t3 = t * t, t * t * t
        val = (2 * t3 - 3 * t2 + 1) * y0 + (t3 - 2 * t2 + t) * hh * m0 + (-2 * t3 + 3 * t2) * y1 + (t3 - t2) * hh * m1
        out[a : a + chunk] = np.where(g > xs[:, -1:], ys[:, -1:], val)
    return out


def _points_concave(x: FloatArray, y: FloatArray) -> bool:
    if x.size < 3:
        return True
    s = np.diff(y) / np.diff(x)
    return bool(np.all(np.diff(s) <= REL_TOL * max(float(np.abs(s).max()), 1e-300)))


def curves_from_points(
    points: Sequence[ArrayLike], capacity: int, *, interpolation: str = "auto", clip: bool = False
) -> PiecewiseLinearCurves | TableCurves:
    """Build a curve family from per-thread profiled points ``[(x0, y0), (x1, y1), ...]`` in resource units.

    ``points[i]`` is an array-like of shape ``(k_i, 2)`` with ``x`` strictly increasing; a missing ``(0, y)`` point is
    added as ``(0, 0)`` (Section VIII's convention: no resource, no utility). The curve is flat after its last point,
    which must lie within ``capacity``.

    ``interpolation``:

    - ``"linear"``: piecewise-linear, returned compact (:class:`PiecewiseLinearCurves`, ``O(sum k_i)`` memory).
    - ``"pchip"``: monotone PCHIP for every thread, sampled into a :class:`TableCurves` (needs ``n*(C+1)`` floats).
    - ``"auto"`` (default): PCHIP for threads whose points are concave and whose PCHIP samples stay concave, linear
      for the others (linear interpolation of concave points is concave, of nonconcave points keeps their shape);
      compact if every thread ends up linear, else a dense table.

    ``clip=True`` cuts curves profiled beyond ``capacity`` at ``capacity`` (the interpolant is built on all points,
    then restricted), for pods whose declared curve reaches past what a node offers; by default such points raise.

    ``ValueError`` names the thread for malformed, decreasing, negative or NaN points, or points beyond ``capacity``
    (unless ``clip``).
    """
    if clip:
        reach = max(
            (float(np.asarray(p, dtype=np.float64).reshape(-1, 2)[:, 0].max(initial=0.0)) for p in points), default=0.0
        )
        wide = int(np.ceil(max(reach, float(capacity))))
        if wide > int(capacity):
            return _restrict(curves_from_points(points, wide, interpolation=interpolation), int(capacity))
    if interpolation not in ("auto", "linear", "pchip"):
        raise ValueError(f"interpolation must be 'auto', 'linear' or 'pchip'; got {interpolation!r}")
    cap = int(capacity)
    xs: list[FloatArray] = []
    ys: list[FloatArray] = []
    for i, p in enumerate(points):
        arr = np.asarray(p, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[1] != 2 or arr.shape[0] < 1:
            raise ValueError(f"thread {i}: points must have shape (k, 2); got {arr.shape}")
        if not np.isfinite(arr).all():
            raise ValueError(f"thread {i}: points contain NaN or infinite values")
        x, y = arr[:, 0], arr[:, 1]
        if x[0] < 0:
            raise ValueError(f"thread {i}: resource amounts must be >= 0")
        if x[0] > 0:
            x, y = np.concatenate([[0.0], x]), np.concatenate([[0.0], y])
        if (np.diff(x) <= 0).any():
            raise ValueError(f"thread {i}: point resource amounts must be strictly increasing")
        if (y < 0).any():
            raise ValueError(f"thread {i}: utility values must be >= 0")
        if (np.diff(y) < 0).any():
            raise ValueError(f"thread {i}: utility values are decreasing (utilities must be nondecreasing)")
        if x[-1] > cap:
            raise ValueError(f"thread {i}: curve extends to {x[-1]:g} units, beyond the capacity {cap}")
        xs.append(x)
        ys.append(y)
    n = len(xs)
    if n == 0:
        raise ValueError("no curves given")
    K = max(len(x) for x in xs)
    X = np.zeros((n, K))
    Y = np.zeros((n, K))
    counts = np.array([len(x) for x in xs], dtype=np.int64)
    for i, (x, y) in enumerate(zip(xs, ys)):
        X[i, : len(x)], Y[i, : len(x)] = x, y
        X[i, len(x) :], Y[i, len(x) :] = x[-1], y[-1]
    linear = PiecewiseLinearCurves(X, Y, cap, counts)
    if interpolation == "linear":
        return linear
    use_pchip = np.array([interpolation == "pchip" or _points_concave(x, y) for x, y in zip(xs, ys)]) & (counts >= 2)
    if not use_pchip.any():
        return linear
    if n * (cap + 1) > MAX_DENSE_ENTRIES:
        raise ValueError(
            f"PCHIP curves are sampled into a dense table of {n} x {cap + 1} entries; use interpolation='linear' "
            "(compact) for sizes this large"
        )
    table = linear.table()
    for k in np.unique(counts[use_pchip]):
        rows = np.flatnonzero(use_pchip & (counts == k))
        t = pchip_table(X[rows, :k], Y[rows, :k], cap)
        if interpolation == "auto":
            tc = TableCurves(t)
            keep = tc.concave()
            rows, t = rows[keep], t[keep]
        table[rows] = t
    return TableCurves(table)


def _restrict(fam: PiecewiseLinearCurves | TableCurves, capacity: int) -> PiecewiseLinearCurves | TableCurves:
    """The same curves on ``0..capacity`` only (cut, not extended)."""
    if isinstance(fam, TableCurves):
        return TableCurves(fam.values[:, : capacity + 1])
    n, K = fam.x.shape
    x = np.minimum(fam.x, float(capacity))
    y_cut = fam.evaluate(np.full(n, capacity), np.arange(n))
    beyond = fam.x > capacity
    y = np.where(beyond, y_cut[:, None], fam.y)
    # keep the first point at or beyond the cut (now at `capacity`), drop the rest
    first_beyond = np.where(beyond.any(axis=1), np.argmax(beyond, axis=1), K)
    prev_x = fam.x[np.arange(n), np.maximum(first_beyond - 1, 0)]
    cut_needed = prev_x < capacity  # else a point already sits exactly at `capacity`
    have = np.full(n, K, dtype=np.int64) if fam.counts is None else fam.counts
    counts = np.minimum(have, np.where(cut_needed, first_beyond + 1, first_beyond)).astype(np.int64)
    keep = np.arange(K)[None, :] < counts[:, None]
    last = counts - 1
    x = np.where(keep, x, x[np.arange(n), last][:, None])
    y = np.where(keep, y, y[np.arange(n), last][:, None])
    return PiecewiseLinearCurves(x, y, capacity, counts)


def parametric_curves(kind: str, params: Mapping[str, ArrayLike], capacity: int) -> CurveFamily:
    """Build a parametric curve family; each parameter is a scalar or a length-``n`` array (broadcast).

    - ``"power"``: ``weight * x**beta`` -- params ``beta`` (required, ``> 0``), ``weight`` (default 1).
    - ``"log"``: ``weight * log(1 + x / scale)`` -- params ``weight`` (default 1), ``scale`` (default 1).
    - ``"min"`` (alias ``"saturating"``): ``weight * min(x, cap)`` -- params ``cap`` (required, ``>= 0``; clipped to
      ``capacity``), ``weight`` (default 1); returned as a compact :class:`PiecewiseLinearCurves`.

    Set ``n`` explicitly by passing any parameter as an array; all-scalar parameters give one thread.
    """
    p: dict[str, Any] = dict(params)
    unknown = set(p) - {"weight", "beta", "scale", "cap"}
    if unknown:
        raise ValueError(f"unknown parameters {sorted(unknown)} for parametric curves")
    weight = p.get("weight", 1.0)
    if kind == "power":
        if "beta" not in p:
            raise ValueError("parametric kind 'power' needs parameter 'beta'")
        return ParametricCurves("power", np.asarray(weight), np.asarray(p["beta"]), capacity)
    if kind == "log":
        return ParametricCurves("log", np.asarray(weight), np.asarray(p.get("scale", 1.0)), capacity)
    if kind in ("min", "saturating"):
        if "cap" not in p:
            raise ValueError(f"parametric kind {kind!r} needs parameter 'cap'")
        w, c = np.broadcast_arrays(np.asarray(weight, dtype=np.float64), np.asarray(p["cap"], dtype=np.float64))
        w, c = np.atleast_1d(w).astype(np.float64), np.atleast_1d(c).astype(np.float64)
        for name, arr in (("weight", w), ("cap", c)):
            bad = ~np.isfinite(arr) | (arr < 0)
            if bad.any():
                raise ValueError(f"thread {int(np.argmax(bad))}: {name} must be finite and >= 0")
        c = np.minimum(c, float(capacity))
        n = w.shape[0]
        pos = c > 0
        x = np.stack([np.zeros(n), np.where(pos, c, 0.0)], axis=1)
        y = np.stack([np.zeros(n), w * c], axis=1)
        counts = np.where(pos, 2, 1).astype(np.int64)
        return PiecewiseLinearCurves(x, y, capacity, counts)
    raise ValueError(f"unknown parametric kind {kind!r}; expected 'power', 'log', 'min' or 'saturating'")


def as_curves(values: Any, capacity: int) -> CurveFamily:
    """Normalise ``values`` to a curve family on ``0..capacity``.

    Accepts a :class:`CurveFamily`, a dense ``(n, C+1)`` array, or a sequence of 1-D per-thread tables of possibly
    different lengths (each extended flat to ``capacity``). A curve with more than ``capacity + 1`` points raises
    ``ValueError`` naming the thread.
    """
    if isinstance(values, CurveFamily):
        return values.with_capacity(capacity)
    if isinstance(values, np.ndarray) and values.ndim == 2:
        if values.shape[0] == 0:
            raise ValueError("no curves given")
        if values.shape[1] > capacity + 1:
            raise ValueError(
                f"thread 0: curve has {values.shape[1]} points (0..{values.shape[1] - 1}) but the largest capacity "
                f"is {capacity}"
            )
        return TableCurves(values).with_capacity(capacity)
    rows = list(values)
    if not rows:
        raise ValueError("no curves given")
    table = np.empty((len(rows), capacity + 1))
    for i, r in enumerate(rows):
        a = np.asarray(r, dtype=np.float64)
        if a.ndim != 1 or a.size == 0:
            raise ValueError(f"thread {i}: a utility table row must be a non-empty 1-D sequence")
        if a.size > capacity + 1:
            raise ValueError(
                f"thread {i}: curve has {a.size} points (0..{a.size - 1}) but the largest capacity is {capacity}"
            )
        table[i, : a.size] = a
        table[i, a.size :] = a[-1]
    return TableCurves(table)


class ConcatCurves(CurveFamily):
    """Several curve families stacked into one (threads of ``parts[0]`` first), e.g. pods whose jobs declare
    different curve kinds (profiled points for some, ``x^beta`` or ``log`` for others). Every question is answered
    part by part, so compact parts stay compact."""

    def __init__(self, parts: Sequence[CurveFamily]) -> None:
        if not parts:
            raise ValueError("no curve families given")
        cap = max(p.capacity for p in parts)
        self.parts = [p.with_capacity(cap) for p in parts]
        self.capacity = cap
        self.offsets = np.cumsum([0] + [p.n for p in self.parts]).astype(np.int64)
        self.n = int(self.offsets[-1])

    def _split(self, rows: IntArray) -> list[tuple[int, NDArray[np.bool_]]]:
        part = np.searchsorted(self.offsets, rows, side="right") - 1
        return [(k, part == k) for k in range(len(self.parts))]

    def evaluate(self, c: ArrayLike, rows: ArrayLike | None = None) -> FloatArray:
        r = np.arange(self.n, dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        cc = np.broadcast_to(np.asarray(c, dtype=np.int64), r.shape)
        out = np.empty(r.shape, dtype=np.float64)
        for k, sel in self._split(r):
            if sel.any():
                out[sel] = self.parts[k].evaluate(cc[sel], r[sel] - self.offsets[k])
        return out

    def demand(self, lam: float | FloatArray, *, strict: bool = False) -> IntArray:
        lv = np.broadcast_to(np.asarray(lam, dtype=np.float64), (self.n,))
        return np.concatenate(
            [p.demand(lv[self.offsets[k] : self.offsets[k + 1]], strict=strict) for k, p in enumerate(self.parts)]
        )

    def concave(self) -> NDArray[np.bool_]:
        return np.concatenate([p.concave() for p in self.parts])

    def segments(self) -> IntArray:
        return np.concatenate([p.segments() for p in self.parts])

    def with_capacity(self, capacity: int) -> ConcatCurves:
        return ConcatCurves([p.with_capacity(capacity) for p in self.parts])

    def table(self) -> FloatArray:
        return np.concatenate([p.table() for p in self.parts], axis=0)


def concat_curves(families: Sequence[CurveFamily]) -> CurveFamily:
    """Stack curve families (threads in order) into one family on the largest of their capacities; a single family
    is returned as is. Use it to mix pods whose utility curves come from different builders."""
    if len(families) == 1:
        return families[0]
    return ConcatCurves(families)
