"""PF-VDS(alpha): alpha-proportional fairness on virtual dominant shares (paper 002, Problem 1, Sec. 3.2, 4, 5).

- :mod:`.equilibrium`: the game's best responses (Sec. 4), the KKT certificate :func:`kkt_residual` (eqs. 28-29), the
  centralised solver :func:`pf_vds` with its route table (:func:`pf_vds_route`) and the distributed sweeps
  :func:`pf_vds_distributed`.
- :mod:`.ipm` (with the compiled :mod:`._ipm_kernels`): the primal-dual interior-point method of PF-VDS(1), a convex
  program by Theorem 2.
- :mod:`._pfpolish`: the exact active-set KKT finish of PF-VDS(1) from the interior point.
- :mod:`._ncpnewton`: the semismooth Newton finish of PF-VDS(alpha), any alpha, on the equilibrium NCP (eq. 32).
- :mod:`.psmfa`: the paper's PS-MFA (Sec. 5.1, Algorithm I, reconstructed); not on a route of :func:`pf_vds`, imported
  only by its callers.
"""

from __future__ import annotations

from .equilibrium import PfVdsResult, best_response, kkt_residual, pf_vds, pf_vds_distributed, pf_vds_route

__all__ = ["PfVdsResult", "best_response", "kkt_residual", "pf_vds", "pf_vds_distributed", "pf_vds_route"]
