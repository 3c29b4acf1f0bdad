"""Keys of the previous plan's phase results (the incremental snapshot; the reuse table of docs/planner.md).

A phase may take its result from the previous plan only where every input it reads is unchanged. The planner's
inputs are values, but comparing them by value would cost as much as recomputing; instead the translation memo
(:mod:`.translate`) gives an object whose uid and resourceVersion did not change the *same* Python object, so "the
same objects in the same order" means "the same content" and is a C-level pass of identity tests
(:func:`same_items`). Arrays are compared by their bytes (:func:`array_key`). Each phase records its result with the
inputs it read in :attr:`walras.planner.model.Plan._phases` under its own name (:func:`recorded`), and treats what it
finds there as read-only: a plan never changes the previous one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import is_
from typing import Any

import numpy as np


def same_items(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether ``a`` and ``b`` hold the same objects (identity) in the same order."""
    return a is b or (len(a) == len(b) and all(map(is_, a, b)))


def array_key(array: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    """An array's dtype, shape and bytes: equal keys mean equal arrays (element by element, NaN bit patterns aside)."""
    return (array.dtype.str, array.shape, array.tobytes())


def recorded(memo: Mapping[str, Any] | None, phase: str) -> Any:
    """What the previous plan's ``phase`` recorded (None without a previous plan, with reuse off, or when it recorded
    nothing)."""
    return memo.get(phase) if memo is not None else None


def frozen(array: np.ndarray) -> np.ndarray:
    """``array`` marked read-only (it is shared with the next plan)."""
    array.setflags(write=False)
    return array
