"""One decorator for the package's compiled kernels: ``numba.njit`` with an on-disk cache where one can be kept.

numba's ``cache=True`` looks for a writable cache directory when a function is decorated (``NUMBA_CACHE_DIR``, the
package's ``__pycache__``, the user's cache directory) and raises ``RuntimeError`` at import when there is none, as
in a container with a read-only root filesystem and no home directory. :func:`njit` then compiles without the cache
(once per process, on first call) instead of failing; the operator image sets ``NUMBA_CACHE_DIR`` to a writable
``/tmp`` directory so that the cache is kept there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba


def njit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(cache=True, **options)``, falling back to ``cache=False`` when no cache location is writable."""

    def wrap(fn: Callable[..., Any]) -> Any:
        try:
            return numba.njit(cache=True, **options)(fn)
        except RuntimeError:
            return numba.njit(cache=False, **options)(fn)

    return wrap
