"""The compiled CPU kernels of price discovery and how they are loaded (a route table).

The kernels themselves (the per-job hull walk of 004 Sec. 4 / Alg. 1, and three one-pass helpers) are in
:mod:`allocator.pricing._compiled.numba_kernels`. Loading them is a one-time cost of a process, kept out of every
solve's clock: :func:`load` is called by :meth:`allocator.pricing.PriceDiscovery.solve` before its timer starts and
reports what it paid (``PricingResult.startup_seconds``); a long-running process (the operator) calls it at start-up.

Routes, tried in this order (``WALRAS_PRICING_KERNELS=aot|jit`` or :func:`load` ``route=`` forces one):

========  ==========================================================  =============================================
route     when                                                        cost of the first call in a process
========  ==========================================================  =============================================
``aot``   the extension module                                        importing a shared library (milliseconds);
          ``allocator.pricing._compiled._kernels_aot`` exists and     numba is not imported
          was built from the current kernel source (:func:`source_tag`):
          ``python -m allocator.pricing._compiled.aot`` (the operator
          image does it at build time)
``jit``   otherwise (a source checkout, an installed wheel)           importing numba (0.3-0.5 s) and loading the
                                                                      kernels from numba's on-disk cache (0.5-0.7
                                                                      s), or compiling them when there is no cache
                                                                      (3 s), on this project's 2-core machine
========  ==========================================================  =============================================

Both routes compile the same Python source with the same numba, so they compute the same values (the tests compare
them element by element). The wrappers below allocate the outputs and pick the kernel of the input's dtype.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from allocator import _aot as _aot_route

__all__ = [
    "AOT_MODULE",
    "Kernels",
    "dense_fill",
    "load",
    "loaded",
    "rows_differ",
    "scaled_throughput",
    "source_tag",
    "walk",
]

#: The ahead-of-time extension module (built by :mod:`allocator.pricing._compiled.aot`).
AOT_MODULE = "allocator.pricing._compiled._kernels_aot"

_SUFFIX = {np.dtype(np.float32): "f4", np.dtype(np.float64): "f8"}


@dataclass(frozen=True)
class Kernels:
    """The loaded kernels: ``route`` (``"aot"`` or ``"jit"``), ``seconds`` spent loading them (imports, cache loads,
    compilation), and a lookup of kernel ``name`` for a dtype."""

    route: str
    seconds: float
    _get: Callable[[str, np.dtype], Callable[..., Any]]

    def get(self, name: str, dtype: np.dtype) -> Callable[..., Any]:
        return self._get(name, np.dtype(dtype))


_loaded: Kernels | None = None


def loaded() -> Kernels | None:
    """The kernels of this process if :func:`load` has run, else ``None``."""
    return _loaded


_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "numba_kernels.py")


def source_tag() -> str:
    """A digest of the kernels' source (:mod:`allocator.pricing._compiled.numba_kernels`, read as a file, not imported).
    The ahead-of-time module exports a function named ``source_<tag>``; a module built from another source is stale."""
    return _aot_route.source_tag(_SOURCE)


def _aot() -> Callable[[str, np.dtype], Callable[..., Any]]:
    mod = _aot_route.load(AOT_MODULE, source_tag(), "allocator/pricing/_compiled/numba_kernels.py")

    def get(name: str, dtype: np.dtype) -> Callable[..., Any]:
        fn: Callable[..., Any] = getattr(mod, f"{name}_{_SUFFIX[dtype]}")
        return fn

    return get


def _jit() -> Callable[[str, np.dtype], Callable[..., Any]]:
    from allocator._jit import uncached
    from allocator.pricing._compiled import numba_kernels

    def get(name: str, dtype: np.dtype) -> Callable[..., Any]:
        fn: Callable[..., Any] = getattr(numba_kernels, name)
        return fn

    if uncached(getattr(numba_kernels, name) for name in numba_kernels.SIGNATURES):  # _warm compiles them all
        _aot_route.notice("price-discovery", "allocator.pricing._compiled.aot")
    # Dispatch once per signature now (a cache load or a compilation), not inside the first solve.
    for dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        _warm(get, dtype)
    return get


def _warm(get: Callable[[str, np.dtype], Callable[..., Any]], dtype: np.dtype) -> None:
    """Call every kernel once on two jobs of ``dtype``: the JIT route compiles or loads each signature here."""
    n, m = 2, 2
    a = np.array([[0.5, 1.0], [1.0, 0.0]], dtype=dtype)
    t = np.empty(n, dtype=dtype)
    j = np.empty(n, dtype=np.int64)
    one = np.ones(1, dtype=dtype)
    get("hull_walk", dtype)(
        a, a, 1, one, one, dtype == np.float32, np.ones((1, 1), dtype), True, t, j, j.copy(),
        *(t.copy() for _ in range(6)),
        np.zeros(m + 1), np.zeros(m + 1), np.zeros(1),
    )
    get("dense_fill_kernel", dtype)(j * 0, t, j * 0 + 1, t, np.ones(m + 1, dtype=dtype), np.zeros((n, m), dtype))
    get("rows_differ_kernel", dtype)(a, a.copy(), np.zeros(n, dtype=np.bool_))
    get("scaled_throughput_kernel", dtype)(a, j * 0, t, j * 0 + 1, t, np.ones(m + 1, dtype=dtype), t.copy())


def load(route: str | None = None) -> Kernels:
    """Load the kernels once per process (see the route table in the module docstring) and return them.

    ``route=None`` takes ``WALRAS_PRICING_KERNELS`` when set, else ``"aot"`` when the extension module imports and
    matches the source, else ``"jit"``. A forced route that cannot load raises ``ImportError``. Later calls return
    the loaded kernels; a call naming another route than the loaded one loads that route instead (tests and
    benchmarks compare them).
    """
    global _loaded
    want = _aot_route.requested(route, "WALRAS_PRICING_KERNELS")
    if _loaded is not None and (want is None or want == _loaded.route):
        return _loaded
    start = time.perf_counter()
    name, get = _aot_route.choose(want, _aot, _jit)
    _loaded = Kernels(route=name, seconds=time.perf_counter() - start, _get=get)
    return _loaded


def _kernel(name: str, dtype: np.dtype) -> Callable[..., Any]:
    return load().get(name, dtype)


def walk(
    a: np.ndarray,
    c: np.ndarray,
    family: int,
    w: np.ndarray,
    q: np.ndarray,
    demand: np.ndarray | None = None,
    *,
    ends: bool = True,
) -> tuple[tuple[np.ndarray | None, ...], np.ndarray, float]:
    """The hull walk on C-contiguous ``a``, ``c`` (same float dtype; ``c`` with ``n`` rows or one row shared by all
    jobs; ``w``, ``q`` of length ``n`` or 1 in that dtype) and, in the same pass over the jobs, the sums of a dual
    evaluation other than the utilities: ``(fields, r, cost)`` with ``fields = (t, j_lo, x_lo, a_lo, c_lo, j_hi,
    x_hi, a_hi, c_hi)`` as new arrays (floats in ``a``'s dtype, indices int64), ``r`` the usage per pool (float64,
    length ``m + 1``, the last entry for "no pool"; the values ``numpy.bincount`` gives) and ``cost = sum_i
    c_i(t_i)`` (float64). ``demand`` is ``None`` (unit demands), per job ``(n,)`` or per job and pool ``(n, m)``.
    With ``ends=False`` the end values ``a_lo``, ``c_lo``, ``a_hi``, ``c_hi`` are not written and returned as
    ``None`` (:class:`~allocator.pricing.dual.subproblem.Subsolution` gathers them when they are read)."""
    n, m = a.shape
    dt = a.dtype
    t, x_lo, x_hi = (np.empty(n, dtype=dt) for _ in range(3))
    k = n if ends else 0
    a_lo, c_lo, a_hi, c_hi = (np.empty(k, dtype=dt) for _ in range(4))
    j_lo = np.empty(n, dtype=np.int64)
    j_hi = np.empty(n, dtype=np.int64)
    if demand is None:
        d = np.ones((1, 1), dtype=dt)
    else:
        d = np.ascontiguousarray(demand[:, None] if demand.ndim == 1 else demand, dtype=dt)
        if d.shape not in ((n, 1), (n, m)):  # the kernel reads d[i, j] unchecked
            raise ValueError(f"demand has shape {demand.shape}: expected ({n},) or ({n}, {m})")
    r_lo = np.zeros(m + 1)
    r_hi = np.zeros(m + 1)
    cost = np.zeros(1)
    args = (np.ascontiguousarray(w, dtype=dt), np.ascontiguousarray(q, dtype=dt))
    _kernel("hull_walk", dt)(
        a, c, int(family), *args, bool(dt == np.float32), d, bool(ends),
        t, j_lo, j_hi, x_lo, a_lo, c_lo, x_hi, a_hi, c_hi, r_lo, r_hi, cost,
    )  # fmt: skip
    if not ends:
        return (t, j_lo, x_lo, None, None, j_hi, x_hi, None, None), r_lo + r_hi, float(cost[0])
    return (t, j_lo, x_lo, a_lo, c_lo, j_hi, x_hi, a_hi, c_hi), r_lo + r_hi, float(cost[0])


def dense_fill(
    j_lo: np.ndarray, x_lo: np.ndarray, j_hi: np.ndarray, x_hi: np.ndarray, scale: np.ndarray, m: int, dtype: np.dtype
) -> np.ndarray:
    """The ``n x m`` allocation of a subsolution (pool ``m`` = none), column ``j`` scaled by ``scale[j]`` (``scale``
    of length ``m`` or ``m + 1``): one pass over the jobs instead of an ``n x (m + 1)`` scatter and a scaled copy."""
    dt = np.dtype(dtype)
    out = np.zeros((j_lo.shape[0], m), dtype=dt)
    s = np.ones(m + 1, dtype=dt)
    s[: min(m, scale.shape[0])] = scale[:m]
    _kernel("dense_fill_kernel", dt)(j_lo, x_lo.astype(dt, copy=False), j_hi, x_hi.astype(dt, copy=False), s, out)
    return out


def rows_differ(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(a != b).any(axis=1)`` for two C-contiguous float matrices of one shape and dtype, in one pass without the
    ``n x m`` temporary (the change detection of an incremental re-solve)."""
    out = np.zeros(a.shape[0], dtype=np.bool_)
    _kernel("rows_differ_kernel", a.dtype)(a, b, out)
    return out


def scaled_throughput(
    a: np.ndarray,
    j_lo: np.ndarray,
    x_lo: np.ndarray,
    j_hi: np.ndarray,
    x_hi: np.ndarray,
    scale: np.ndarray,
) -> np.ndarray:
    """Each job's throughput after column scaling (004 Sec. 5): ``a[i, j_lo] x_lo s[j_lo] + a[i, j_hi] x_hi
    s[j_hi]`` with ``a`` the C-contiguous ``n x m`` throughputs and ``scale`` of length ``m + 1`` (the last entry, for
    "no pool", is 1), in ``a``'s dtype."""
    dt = a.dtype
    out = np.empty(a.shape[0], dtype=dt)
    xs = (x_lo.astype(dt, copy=False), x_hi.astype(dt, copy=False))
    _kernel("scaled_throughput_kernel", dt)(a, j_lo, xs[0], j_hi, xs[1], scale.astype(dt), out)
    return out
