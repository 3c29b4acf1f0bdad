"""Per-job subproblem of price discovery, solved analytically and vectorised over jobs (paper 004, Sec. 4, Alg. 1).

For prices ``p`` and job ``i`` with throughputs ``a_ij`` and demands ``d_ij`` the subproblem (eq. 10) is

    maximise u_i(t) - c_i(t),    c_i(t) = min { sum_j p_j d_ij x_j : x >= 0, 1^T x <= 1, a_i^T x = t },

and ``c_i`` is the lower convex hull of the points ``(0, 0)`` and ``(a_ij, c_ij)`` with ``c_ij = p_j d_ij``
(Sec. 4.1; the demand multiplies the price as in Sec. 7.1). Two solvers live here:

:func:`solve_hull`
    walks the hull from ``(0, 0)`` to the right, one vertex per step (gift wrapping: the next vertex is the point
    right of the current one with the smallest slope, ties resolved to any of them, which only splits a collinear
    segment). On each segment ``c`` is affine with slope ``alpha`` and the utility's ``argmax`` gives the best ``t``
    there (eq. 15/16). Because ``u - c`` is concave, the first segment whose maximiser lies left of its right end
    holds a global maximiser; a job stops walking there, and the walk continues only on the jobs still climbing
    (compacted each step). Memory: a few ``n x m`` temporaries; work: at most ``m`` steps of ``O(m)`` per job, and
    in practice most jobs stop after one or two steps.
:func:`solve_pairs`
    the enumeration of Alg. 1 step 1: every chord between two of the ``m + 1`` points is an upper bound of ``c`` on
    its interval, and the hull segments are among them, so the best chord-restricted maximiser over all
    ``m (m + 1) / 2`` chords solves the subproblem. It materialises ``n x m(m+1)/2`` tensors and evaluates the
    utility on every chord; kept as an independent reference and for the hull-vs-pairs benchmark.

On CPU, for the built-in utility families, :func:`solve_hull` runs the same walk compiled, one job at a time
(:mod:`allocator.pricing._compiled.kernels`): the vectorised walk costs a few dozen array operations per evaluation
whatever ``n`` is, which dominates small markets (10^4 jobs: about 3.5x slower than the compiled walk on this project's
2-core machine, 1 thread). The vectorised walk (numpy or torch, :mod:`allocator._xp`) remains the path on CUDA and for
user-defined utilities, and the reference the compiled walk is tested against.

Both return a :class:`Subsolution`: the optimal ``t`` and the (at most two, Sec. 4.1) pools used, as a left and a
right vertex of the active segment with their time fractions (pool index ``m`` stands for "none": the origin or the
slack), so resource usage and the feasible-allocation utility are computed without an ``n x m`` allocation matrix.
"""

from __future__ import annotations

import numpy as np

from allocator._xp import (
    Array,
    arange,
    as_numpy,
    asarray_like,
    copy,
    device_of,
    flatnonzero,
    full,
    is_tensor,
    namespace,
    numel,
    pick,
    repeat,
)
from allocator._xp import torch as _torch
from allocator.utilities import Utility

__all__ = ["Subsolution", "compiled_args", "solve_hull", "solve_pairs"]


class _End:
    """An end value of a :class:`Subsolution` (``a_lo``, ``c_lo``, ``a_hi``, ``c_hi``), held in the slot of the same
    name with a leading underscore and gathered from ``ends`` on first read."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, obj: Subsolution | None, owner: type | None = None) -> Array:
        if obj is None:
            return self
        if getattr(obj, self.slot) is None:
            obj._gather()
        return getattr(obj, self.slot)


class Subsolution:
    """Optimal solutions of all job subproblems at one price vector (all arrays have shape ``(n,)``, numpy arrays or
    torch tensors as the problem's).

    Job ``i`` runs a fraction ``x_lo[i]`` of its time on pool ``j_lo[i]`` and ``x_hi[i]`` on pool ``j_hi[i]``
    (index ``m`` = unused, fraction 0); ``a_*`` and ``c_*`` are the throughputs and costs ``p_j d_ij`` of those
    pools, so ``t = a_lo x_lo + a_hi x_hi`` and ``c(t) = c_lo x_lo + c_hi x_hi``.

    The four end values ``a_lo``, ``c_lo``, ``a_hi``, ``c_hi`` may be left out (``None``) with ``ends=(a, c)``, the
    ``n x m`` throughputs and the costs (``n`` rows, or one row shared by all jobs) they are gathered from on first
    use: the compiled walk of a dual evaluation writes only ``t``, the pools and the fractions, since on the common
    path (log utility, no recovery or repair) nothing reads the ends, and every byte a fresh process writes first
    costs a page fault (about 1.1 ms per MB on this project's machine: 16 MB per evaluation at 10^6 jobs). ``a``
    and ``c`` must not change while this subsolution lives (:meth:`rebind_ends` points them at a private copy).
    """

    FIELDS = ("t", "j_lo", "x_lo", "a_lo", "c_lo", "j_hi", "x_hi", "a_hi", "c_hi")
    __slots__ = ("_a_hi", "_a_lo", "_c_hi", "_c_lo", "_ends", "j_hi", "j_lo", "t", "x_hi", "x_lo")

    def __init__(
        self,
        t: Array,
        j_lo: Array,
        x_lo: Array,
        a_lo: Array | None,
        c_lo: Array | None,
        j_hi: Array,
        x_hi: Array,
        a_hi: Array | None,
        c_hi: Array | None,
        ends: tuple[Array, Array] | None = None,
    ) -> None:
        self.t, self.j_lo, self.x_lo, self.j_hi, self.x_hi = t, j_lo, x_lo, j_hi, x_hi
        self._a_lo, self._c_lo, self._a_hi, self._c_hi = a_lo, c_lo, a_hi, c_hi
        given = [v is not None for v in (a_lo, c_lo, a_hi, c_hi)]
        if not all(given) and (any(given) or ends is None):
            raise ValueError("give all four end values, or none of them and ends=(a, c) to gather them from")
        self._ends = None if all(given) else ends

    def _ends_of(self, index: np.ndarray | None) -> list[Array]:
        """``[a_lo, c_lo, a_hi, c_hi]`` of the jobs ``index`` (all with ``None``) gathered from ``ends``, as the
        compiled walk writes them: ``a[i, j]`` and ``c[i, j]``, 0 for pool ``m``."""
        assert self._ends is not None
        a, c = (as_numpy(v) for v in self._ends)
        j_lo, j_hi = as_numpy(self.j_lo), as_numpy(self.j_hi)
        n, m = a.shape
        rows = np.arange(n) if index is None else index
        c_rows = rows if c.shape[0] == n else np.zeros(rows.shape[0], dtype=np.int64)
        out = []
        for j in (j_lo, j_hi):
            j = j[rows]
            ok = j < m
            idx = np.minimum(j, m - 1)
            out.append(np.where(ok, a[rows, idx], a.dtype.type(0)))
            out.append(np.where(ok, c[c_rows, idx], c.dtype.type(0)))
        if is_tensor(self.t):
            out = [_torch().from_numpy(v) for v in out]
        return out

    def _gather(self) -> None:
        self._a_lo, self._c_lo, self._a_hi, self._c_hi = self._ends_of(None)
        self._ends = None

    @property
    def pending(self) -> bool:
        """Whether the end values are still to be gathered (from ``ends``)."""
        return self._ends is not None

    a_lo = _End()
    c_lo = _End()
    a_hi = _End()
    c_hi = _End()

    def rebind_ends(self, a: Array) -> None:
        """Gather the end throughputs from ``a`` from now on: an array equal to the one given on every entry the walk
        could pick (a private copy kept after the caller's may change; it may hold throughputs of closed pools the
        walk's copy had masked to 0, never picked); a no-op when the ends are already gathered."""
        if self._ends is not None:
            self._ends = (a, self._ends[1])

    def patched(self, rows: Array, new: Subsolution, a: Array) -> Subsolution:
        """A new subsolution: this one with the solutions of the jobs ``rows`` replaced by ``new``'s (in that order;
        the rows of an incremental re-solve, 004 Sec. 3: the jobs' subproblems are independent at fixed prices). Its
        arrays are copies where rows change; this subsolution is left as it is. End values still pending stay so, to
        be gathered from ``a`` (the throughputs with those rows updated) and the same costs."""
        pending = self._ends is not None
        names = ("t", "j_lo", "x_lo", "j_hi", "x_hi") if pending else self.FIELDS
        values: dict[str, Array] = {}
        for name in names:
            value = getattr(self, name)
            if numel(rows):
                value = copy(value)
                value[rows] = getattr(new, name)
            values[name] = value
        if not pending:
            return Subsolution(*(values[name] for name in self.FIELDS))
        assert self._ends is not None
        v = values
        return Subsolution(
            v["t"], v["j_lo"], v["x_lo"], None, None, v["j_hi"], v["x_hi"], None, None, ends=(a, self._ends[1])
        )

    def with_fractions(self, x_lo: Array, x_hi: Array) -> Subsolution:
        """The same pools and ends with other time fractions (``t`` is kept as given; a repaired allocation)."""
        if self._ends is not None:
            return Subsolution(self.t, self.j_lo, x_lo, None, None, self.j_hi, x_hi, None, None, ends=self._ends)
        return Subsolution(self.t, self.j_lo, x_lo, self._a_lo, self._c_lo, self.j_hi, x_hi, self._a_hi, self._c_hi)

    def cost(self) -> Array:
        """``c_i(t_i)``: what each job pays at the prices of this evaluation."""
        return self.x_lo * self.c_lo + self.x_hi * self.c_hi

    def rows(self, index: Array) -> Subsolution:
        """The solutions of the jobs ``index``, in that order (end values gathered for those jobs only)."""
        if self._ends is not None:
            a_lo, c_lo, a_hi, c_hi = self._ends_of(np.asarray(as_numpy(index), dtype=np.int64))
            return Subsolution(self.t[index], self.j_lo[index], self.x_lo[index], a_lo, c_lo, self.j_hi[index],
                               self.x_hi[index], a_hi, c_hi)
        return Subsolution(*(getattr(self, name)[index] for name in self.FIELDS))

    def dense(self, m: int, scale: Array | None = None) -> Array:
        """The allocation as an ``n x m`` matrix, each column multiplied by ``scale`` (``(m,)``) when given."""
        n = self.t.shape[0]
        if device_of(self.t) == "cpu":
            from allocator.pricing._compiled.kernels import dense_fill

            s = np.ones(m) if scale is None else as_numpy(scale).astype(np.float64)
            x_lo = as_numpy(self.x_lo)
            out = dense_fill(as_numpy(self.j_lo), x_lo, as_numpy(self.j_hi), as_numpy(self.x_hi), s, m, x_lo.dtype)
            return _torch().from_numpy(out) if is_tensor(self.t) else out
        x = _torch().zeros((n, m + 1), dtype=self.t.dtype, device=self.t.device)
        x.scatter_add_(1, self.j_lo.unsqueeze(1), self.x_lo.unsqueeze(1))
        x.scatter_add_(1, self.j_hi.unsqueeze(1), self.x_hi.unsqueeze(1))
        return x[:, :m] if scale is None else x[:, :m] * asarray_like(as_numpy(scale)[:m], x)


def _assemble(a: Array, c: Array, t: Array, j_lo: Array, j_hi: Array) -> Subsolution:
    """The full :class:`Subsolution` from each job's optimal ``t`` and the two ends ``j_lo``, ``j_hi`` of its active
    segment (index ``m``: the origin or none). Throughputs and costs of the ends are gathered once here, so the hull
    walk only carries three ``(n,)`` arrays; ``x_hi = (t - a_lo) / (a_hi - a_lo)``, ``x_lo = 1 - x_hi`` when the left
    end is a pool (Sec. 4.1: a point of the segment is a convex combination of its ends)."""
    xp = namespace(a)
    m = a.shape[1]
    if c.shape[0] != a.shape[0]:
        c = xp.broadcast_to(c, a.shape)
    lo_ok = j_lo < m
    hi_ok = j_hi < m
    lo_idx = xp.clip(j_lo, None, m - 1)
    hi_idx = xp.clip(j_hi, None, m - 1)
    a_lo = xp.where(lo_ok, pick(a, lo_idx), 0.0)
    c_lo = xp.where(lo_ok, pick(c, lo_idx), 0.0)
    a_hi = xp.where(hi_ok, pick(a, hi_idx), 0.0)
    c_hi = xp.where(hi_ok, pick(c, hi_idx), 0.0)
    span = a_hi - a_lo
    with np.errstate(divide="ignore", invalid="ignore"):
        x_hi = xp.where(hi_ok & (span > 0), (t - a_lo) / xp.where(span > 0, span, 1.0), 0.0)
    x_lo = xp.where(lo_ok, 1 - x_hi, 0.0)
    return Subsolution(t=t, j_lo=j_lo, x_lo=x_lo, a_lo=a_lo, c_lo=c_lo, j_hi=j_hi, x_hi=x_hi, a_hi=a_hi, c_hi=c_hi)


def compiled_args(
    a: Array, c: Array, utility: Utility
) -> tuple[np.ndarray, np.ndarray, int, np.ndarray, np.ndarray] | None:
    """The arguments of the compiled walk (:func:`allocator.pricing._compiled.kernels.walk`): ``(a, c, family,
    w, q)`` as C-contiguous numpy arrays in ``a``'s dtype (``c`` one shared row for unit demands), or ``None`` where
    the compiled walk does not apply (arrays on a GPU, a utility without ``kernel_spec``)."""
    if device_of(a) != "cpu":
        return None
    spec = getattr(utility, "kernel_spec", None)
    fast = spec() if spec is not None else None
    if fast is None:
        return None
    an = np.ascontiguousarray(as_numpy(a))
    cn = as_numpy(c).astype(an.dtype, copy=False)
    if cn.shape[0] > 1 and cn.strides[0] == 0:
        cn = cn[:1]  # the same costs for every job (unit demands): one row, not an n x m copy
    if not (cn.flags.c_contiguous and cn.flags.writeable):
        # a broadcast view is read-only, and the JIT route compiles a separate signature for read-only
        # arrays (seconds, inside the solve): the kernels take writable C-contiguous arrays only
        cn = np.array(cn, order="C")
    family, w, q = fast
    # parameters in the working dtype, as the vectorised walk uses them (a float32 quotient w / alpha rounds
    # as it does there, so a job at a vertex is reported at the same vertex)
    return an, cn, family, w.astype(an.dtype), q.astype(an.dtype)


def solve_hull(
    a: Array, c: Array, utility: Utility, *, a_pos: Array | None = None, compiled: bool | None = None
) -> Subsolution:
    """Solve every job's subproblem by walking the lower convex hull of ``(0,0), (a_ij, c_ij)`` (see module doc).

    ``a`` and ``c`` are ``n x m`` (throughputs and costs ``p_j d_ij``; ``c`` may have one row shared by all jobs),
    ``utility`` describes the ``n`` jobs. ``a_pos`` (optional, ``a > 0``) can be passed precomputed since it does not
    depend on the prices. The walk records only ``t`` and the segment ends per job; :func:`_assemble` derives the rest
    once at the end.

    On CPU (numpy arrays, or CPU tensors), for the built-in utility families (``utility.kernel_spec()``), the same
    walk runs compiled, one job at a time (:mod:`allocator.pricing._compiled.kernels`), unless ``compiled=False``;
    ``compiled=True`` requires it. The vectorised walk below is the path everywhere else (CUDA, user-defined
    utilities).
    """
    if compiled is not False:
        args = compiled_args(a, c, utility)
        if args is not None:
            from allocator.pricing._compiled.kernels import walk

            walked, _, _ = walk(*args)
            fields: list[Array] = [v for v in walked if v is not None]  # every field: the walk wrote the ends
            if is_tensor(a):
                fields = [_torch().from_numpy(v) for v in fields]
            return Subsolution(*fields)
    if compiled:
        raise ValueError("compiled=True needs CPU arrays and a utility with a compiled form (kernel_spec)")
    xp = namespace(a)
    n, m = a.shape
    if c.shape[0] != n:
        c = xp.broadcast_to(c, (n, m))
    inf = float("inf")
    if a_pos is None:
        a_pos = a > 0
    # Step 0 from the origin: the most efficient pool, slope c/a (pools with a = 0 are never used).
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = xp.where(a_pos, c / a, inf)
    k = xp.argmin(slope, axis=1)
    s = pick(slope, k)
    del slope
    has = s < inf
    na = pick(a, k)
    # Rows that cannot run anywhere (all a = 0): alpha = inf makes every argmax return gamma = 0.
    t = utility.argmax(s, xp.zeros_like(s), xp.where(has, na, 0.0))
    done = (~has) | (t < na)
    j_lo = full((n,), m, like=k)
    j_hi = xp.where(has, k, j_lo)
    if m == 1 or bool(done.all()):
        return _assemble(a, c, t, j_lo, j_hi)
    t_out = t
    # Continue with the jobs still climbing: their current vertex is the pool just reached.
    keep = flatnonzero(~done)
    active = keep
    a_act = a[keep]
    c_act = c[keep]
    cur_a = na[keep]
    cur_j = k[keep]
    cur_c = pick(c_act, cur_j)
    util = utility.take(keep)
    for _ in range(1, m):
        da = a_act - cur_a[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = xp.where(da > 0, (c_act - cur_c[:, None]) / da, inf)
        del da
        k = xp.argmin(slope, axis=1)
        s = pick(slope, k)
        del slope
        has = s < inf
        na = xp.where(has, pick(a_act, k), cur_a)
        t = util.argmax(xp.where(has, s, 0.0), cur_a, na)
        t = xp.where(has, t, cur_a)
        done = (~has) | (t < na)
        # Jobs at their last vertex use that pool fully; otherwise the segment (cur, next) is active.
        t_out[active] = t
        j_lo[active] = xp.where(has, cur_j, m)
        j_hi[active] = xp.where(has, k, cur_j)
        if bool(done.all()):
            break
        sel = flatnonzero(~done)
        active = active[sel]
        a_act = a_act[sel]
        c_act = c_act[sel]
        cur_a = na[sel]
        cur_j = k[sel]
        cur_c = pick(c_act, cur_j)
        util = util.take(sel)
    return _assemble(a, c, t_out, j_lo, j_hi)


def pair_indices(m: int, like: Array) -> tuple[Array, Array]:
    """Index pairs ``(v, w)`` over points ``0..m`` where ``m`` is the origin: all ``m (m + 1) / 2`` chords (row-major
    order), in ``like``'s library and device."""
    if is_tensor(like):
        lo, hi = _torch().triu_indices(m + 1, m + 1, offset=1, device=like.device)
        return lo, hi
    lo_np, hi_np = np.triu_indices(m + 1, k=1)
    return lo_np.astype(np.int64), hi_np.astype(np.int64)


def solve_pairs(a: Array, c: Array, utility: Utility) -> Subsolution:
    """Solve every job's subproblem by enumerating all ``m (m + 1) / 2`` chords (Alg. 1 as written, see module doc)."""
    xp = namespace(a)
    n, m = a.shape
    if c.shape[0] != n:
        c = xp.broadcast_to(c, (n, m))
    zcol = xp.zeros_like(a[:, :1])
    a1 = xp.concat([a, zcol], axis=1)  # point m is the origin
    c1 = xp.concat([c, zcol], axis=1)
    lo, hi = pair_indices(m, a)
    av, aw = a1[:, lo], a1[:, hi]
    cv, cw = c1[:, lo], c1[:, hi]
    swap = av > aw
    a_l, a_r = xp.where(swap, aw, av), xp.where(swap, av, aw)
    c_l, c_r = xp.where(swap, cw, cv), xp.where(swap, cv, cw)
    npairs = lo.shape[0]
    j_l = xp.where(swap, xp.broadcast_to(hi, (n, npairs)), xp.broadcast_to(lo, (n, npairs)))
    j_r = xp.where(swap, xp.broadcast_to(lo, (n, npairs)), xp.broadcast_to(hi, (n, npairs)))
    valid = a_r > a_l
    span = xp.where(valid, a_r - a_l, 1.0)
    slope = xp.where(valid, (c_r - c_l) / span, 0.0)
    flat = repeat(arange(n, like=a), npairs)
    util = utility.take(flat) if utility.n_jobs is not None else utility
    t = util.argmax(slope.reshape(-1), a_l.reshape(-1), a_r.reshape(-1)).reshape(n, npairs)
    with np.errstate(invalid="ignore"):
        net = util.value(t.reshape(-1)).reshape(n, npairs) - (c_l + slope * (t - a_l))
    net = xp.where(valid, xp.nan_to_num(net, nan=-np.inf), -np.inf)
    best = xp.argmax(net, axis=1)
    anyv = xp.any(valid, axis=1)

    def choose(x: Array) -> Array:
        return pick(x, best)

    tb, al, ar, cl, cr = choose(t), choose(a_l), choose(a_r), choose(c_l), choose(c_r)
    jl, jr = choose(j_l), choose(j_r)
    frac_hi = xp.where(anyv, (tb - al) / choose(span), 0.0)
    frac_lo = xp.where(anyv & (jl < m), 1 - frac_hi, 0.0)
    return Subsolution(
        t=xp.where(anyv, tb, 0.0),
        j_lo=xp.where(anyv, jl, m),
        x_lo=frac_lo,
        a_lo=xp.where(anyv & (jl < m), al, 0.0),
        c_lo=xp.where(anyv & (jl < m), cl, 0.0),
        j_hi=xp.where(anyv, jr, m),
        x_hi=frac_hi,
        a_hi=xp.where(anyv, ar, 0.0),
        c_hi=xp.where(anyv, cr, 0.0),
    )
