"""The process owner's use of Python's cyclic garbage collector around work that allocates much and frees little.

A plan of 5,000 nodes / 20,000 pods allocates ~10^5-10^6 container objects, which set off generation-2 collections
inside it that walk everything alive; a plan makes little cyclic garbage (``tests/test_planner_gc.py``), so the
collections find almost nothing. :func:`paused` holds the collector off for such a stretch (the operator's controller
around each plan, ``walras plan`` for its whole run, the planner bench around each timed plan). The planner itself
never touches the collector: only the owner of the process does.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused"]


@contextmanager
def paused() -> Iterator[None]:
    """The cyclic collector off inside the block and back as it was after it (also when the block raises; a
    collector that was off stays off)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
