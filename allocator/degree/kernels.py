"""The compiled kernels of the SEQ sweep and how they are loaded (a route table).

The kernels (Algorithm 1 of paper 003 on flat arrays, Section IV-A, and the list edits of the incremental OSEQ,
Section V-C) are in :mod:`allocator.degree.numba_kernels`; :mod:`allocator.degree._engine` and
:mod:`allocator.degree.online` call them through :func:`load`. Importing :mod:`allocator.degree` loads none of them:
the first SEQ run (or the first :class:`~allocator.degree.OnlineSeq`) of a process does.

Routes, tried in this order (``WALRAS_DEGREE_KERNELS=aot|jit`` or :func:`load` ``route=`` forces one):

========  ==========================================================  =============================================
route     when                                                        cost of the first SEQ call in a process
========  ==========================================================  =============================================
``aot``   the extension module ``allocator.degree._kernels_aot``      importing a shared library: the first
          exists and was built from the current kernel source         ``plan_pool`` call took 0.002 s; numba is
          (:func:`source_tag`): ``python -m allocator.degree.aot``    not imported
          (``make install`` and the operator image do it)
``jit``   otherwise (a source checkout, an installed wheel)           importing numba (0.3-0.5 s) and loading the
                                                                      kernels from numba's on-disk cache: the first
                                                                      ``plan_pool`` call took 1.04 s; 5.5-5.9 s
                                                                      with no cache (compilation)
========  ==========================================================  =============================================

Measured on this project's 2-core machine (load average 1.5-1.8): a fresh process imports ``allocator.degree``
(0.2 s on either route) and times its first ``plan_pool`` call on a 5-job, 3-node instance; medians of 5 processes
(3 for the compilation). On the 5,000-node bench cluster a fresh ``walras plan`` took 4.13 s with the extension and
4.64 s without it (medians of 5 alternating runs, load average 1.3; docs/bench/degree.md).

Both routes compile the same Python source with the same numba, so they compute the same values (the tests compare
them element by element). The ahead-of-time functions do not check their arguments' dtypes: the callers pass
C-contiguous arrays of the dtypes in :data:`allocator.degree.numba_kernels.SIGNATURES`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from allocator import _aot

__all__ = ["AOT_MODULE", "ENV", "KERNELS", "Kernels", "load", "loaded", "source_tag"]

#: The ahead-of-time extension module (built by :mod:`allocator.degree.aot`).
AOT_MODULE = "allocator.degree._kernels_aot"
#: The environment variable that forces a route.
ENV = "WALRAS_DEGREE_KERNELS"
#: The kernels called from Python (each exported by the extension module under its name).
KERNELS = ("sweep_kernel", "list_insert", "list_delete", "first_affected", "touched_before", "merge_list")

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "numba_kernels.py")


@dataclass(frozen=True)
class Kernels:
    """The loaded kernels of one route (``"aot"`` or ``"jit"``) and the seconds spent loading them (the import of
    the extension module, or of numba and the kernel module; the JIT route loads each kernel's machine code from
    numba's cache, or compiles it, on its first call)."""

    route: str
    seconds: float
    sweep_kernel: Callable[..., Any]
    list_insert: Callable[..., Any]
    list_delete: Callable[..., Any]
    first_affected: Callable[..., Any]
    touched_before: Callable[..., Any]
    merge_list: Callable[..., Any]


_loaded: Kernels | None = None


def loaded() -> Kernels | None:
    """The kernels of this process if :func:`load` has run, else ``None``."""
    return _loaded


def source_tag() -> str:
    """A digest of the kernels' source (:mod:`allocator.degree.numba_kernels`, read as a file, not imported). The
    ahead-of-time module exports a function named ``source_<tag>``; a module built from another source is stale."""
    return _aot.source_tag(_SOURCE)


def _module(route: str) -> Any:
    if route == "aot":
        return _aot.load(AOT_MODULE, source_tag(), "allocator/degree/numba_kernels.py")
    from allocator._jit import uncached
    from allocator.degree import numba_kernels

    # all uncached: the first use after an install (a run that used only some kernels caches those; the others,
    # compiled on their own first call, take a second or two and go unannounced)
    if len(uncached(getattr(numba_kernels, name) for name in KERNELS)) == len(KERNELS):
        _aot.notice("degree (SEQ)", "allocator.degree.aot")
    return numba_kernels


def load(route: str | None = None) -> Kernels:
    """Load the kernels once per process (see the route table in the module docstring) and return them.

    ``route=None`` takes ``WALRAS_DEGREE_KERNELS`` when set, else ``"aot"`` when the extension module imports and
    matches the source, else ``"jit"``. A forced route that cannot load raises ``ImportError``. Later calls return
    the loaded kernels; a call naming another route than the loaded one loads that route instead (tests and
    benchmarks compare them).
    """
    global _loaded
    want = _aot.requested(route, ENV)
    if _loaded is not None and (want is None or want == _loaded.route):
        return _loaded
    start = time.perf_counter()
    name, mod = _aot.choose(want, lambda: _module("aot"), lambda: _module("jit"))
    fns = {k: getattr(mod, k) for k in KERNELS}
    _loaded = Kernels(route=name, seconds=time.perf_counter() - start, **fns)
    return _loaded
