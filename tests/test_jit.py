"""allocator._jit.njit: the compiled kernels keep working where numba can keep no on-disk cache (read-only install,
no home directory: numba's ``cache=True`` raises ``RuntimeError`` at decoration there)."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import pytest

from allocator import _jit


def test_cached_when_a_cache_location_exists() -> None:
    @_jit.njit()
    def double(x: np.ndarray) -> np.ndarray:
        return x * 2

    assert double._cache.__class__.__name__ == "FunctionCache"  # numba's on-disk cache is enabled
    np.testing.assert_array_equal(double(np.arange(3.0)), [0.0, 2.0, 4.0])


def test_falls_back_to_no_cache_when_numba_finds_no_cache_location(monkeypatch: pytest.MonkeyPatch) -> None:
    real = numba.njit
    asked: list[bool] = []

    def njit(*args: Any, cache: bool = False, **kwargs: Any) -> Any:
        asked.append(cache)
        if cache:
            raise RuntimeError("cannot cache function 'f': no locator available for file 'f.py'")
        return real(*args, cache=cache, **kwargs)

    monkeypatch.setattr(_jit.numba, "njit", njit)

    @_jit.njit(nogil=True)
    def triple(x: np.ndarray) -> np.ndarray:
        return x * 3

    assert asked == [True, False]
    np.testing.assert_array_equal(triple(np.arange(3.0)), [0.0, 3.0, 6.0])
