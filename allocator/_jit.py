"""One decorator for the package's compiled kernels: ``numba.njit`` with an on-disk cache where one can be kept.

numba's ``cache=True`` looks for a writable cache directory when a function is decorated (``NUMBA_CACHE_DIR``, the
package's ``__pycache__``, the user's cache directory) and raises ``RuntimeError`` at import when there is none, as
in a container with a read-only root filesystem and no home directory. :func:`njit` then compiles without the cache
(once per process, on first call) instead of failing; the operator image sets ``NUMBA_CACHE_DIR`` to a writable
``/tmp`` directory so that the cache is kept there.

A kernel decorated without a cache entry (the first run after an install, or no cache location) is compiled on its
first call, which can take seconds each and up to a minute for a whole plan on a loaded machine: :func:`njit` says
so on stderr, once per process and package (:func:`announce`; ``WALRAS_COMPILE_NOTICE=0`` silences it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import numba


def njit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(cache=True, **options)``, falling back to ``cache=False`` when no cache location is writable."""

    def wrap(fn: Callable[..., Any]) -> Any:
        try:
            dispatcher = numba.njit(cache=True, **options)(fn)
        except RuntimeError:
            dispatcher = numba.njit(cache=False, **options)(fn)
        if not getattr(numba.config, "DISABLE_JIT", False) and uncached([dispatcher]):
            announce(getattr(fn, "__module__", "") or "")
        return dispatcher

    return wrap


#: The kernel sets :func:`announce` names, by package (``allocator.<package>``).
KERNEL_SETS = {"colocation": "colocation", "fairness": "fairness", "pricing": "price-discovery",
               "degree": "degree (SEQ)"}


def announce(module: str) -> bool:
    """The compile notice (:func:`allocator._aot.notice`, once per process and package) for a kernel of ``module``
    that has no numba cache yet: numba compiles it on its first call. The pricing, degree, colocation and fairness
    kernels, which have an ahead-of-time route, are announced by their route tables (naming the builder) instead."""
    from allocator import _aot

    parts = module.split(".")
    package = parts[1] if len(parts) > 1 and parts[0] == "allocator" else module
    if package in ("pricing", "degree", "colocation", "fairness"):
        return False
    return _aot.notice(KERNEL_SETS.get(package, package))


def uncached(dispatchers: Iterable[Any]) -> list[str]:
    """The names of the numba ``dispatchers`` that have no on-disk cache index yet (numba's ``FunctionCache`` index
    file, ``<module>.<function>-<line>.py311.nbi``), i.e. that numba will compile, not load, on their first call. A
    dispatcher without a file cache (``cache=False``, :func:`njit`'s fallback) counts as uncached."""
    out = []
    for d in dispatchers:
        try:
            cached = os.path.exists(d._cache._cache_file._index_path)
        except AttributeError:  # no file cache (NullCache), or another numba's layout: assume it compiles
            cached = False
        if not cached:
            out.append(getattr(d, "__name__", repr(d)))
    return out
