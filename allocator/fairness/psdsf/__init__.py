"""PS-DSF: per-server dominant-share fairness (paper 002 Sec. 2.3, Definitions 3-4; eq. 9), DRF on one server (Sec.
2.1), and the refill stage after it.

- :mod:`.filling`: the exact progressive filling of one server (:func:`fill_server`), the Gauss-Seidel fixed point of
  those fillings (:func:`ps_dsf`, also Problem 2's time-shared servers, Theorem 5) and DRF (:func:`drf`).
- :mod:`._levels` (with the compiled :mod:`._levels_kernels`): certified start points of :func:`ps_dsf` from the
  per-server levels (smoothed Newton continuation, exact active-set solve, pivots).
- :mod:`._fill_kernels`: the compiled :func:`fill_server` the sweeps call.
- :mod:`.refill`: leftover capacity given away after PS-DSF without breaking sharing incentive or envy-freeness.
"""

from __future__ import annotations

from .filling import PsDsfResult, drf, fill_server, ps_dsf
from .refill import RefillResult, envy_coefficients, refill

__all__ = ["PsDsfResult", "RefillResult", "drf", "envy_coefficients", "fill_server", "ps_dsf", "refill"]
