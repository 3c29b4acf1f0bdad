"""Integral task counts (pods) from the divisible allocation of any mechanism of :mod:`allocator.fairness`.

- :mod:`.pods`: :func:`round_allocation` (floor, then hand the remaining pods back by lowest fill ratio) and the Python
  reference of its hand-back loop.
- :mod:`._hand_back_kernel`: the compiled hand-back loop.
"""

from __future__ import annotations

from .pods import round_allocation

__all__ = ["round_allocation"]
