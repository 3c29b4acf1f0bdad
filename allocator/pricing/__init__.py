"""Price discovery for fungible resources across node pools (paper 004, Sec. 3-5, Alg. 2, vector demands of Sec. 7.1).

The problem (eq. 4 with demands)::

    maximise    sum_i u_i(a_i^T x_i)
    subject to  x_i >= 0,  1^T x_i <= 1,           i = 1..n
                sum_i d_i * x_i <= R                (elementwise; d_i a scalar or an m-vector)

``a_ij`` is job ``i``'s throughput on pool ``j``, ``R_j`` the pool's capacity, ``x_ij`` the fraction of time job
``i`` runs on pool ``j`` and ``u_i`` a concave nondecreasing utility (:mod:`allocator.utilities`).

Method (Alg. 2): the dual function ``g(p) = p^T R + sum_i max_{x_i} [u_i(a_i^T x_i) - (p * d_i)^T x_i]`` (Sec. 3)
splits into one small problem per job, solved analytically and vectorised over all jobs
(Sec. 4 / Alg. 1). ``q = R - r`` is a subgradient (eq. 9). Prices are updated by
a projected L-BFGS on ``p >= 0`` (memory 10, Armijo backtracking along the projected path, preconditioned by the
unit-elasticity scaling ``diag(p / R)``); where L-BFGS stalls on a nonsmooth ``g`` (few jobs: each job's solution
jumps between hull vertices) a trust-region cutting-plane step takes over (:mod:`~allocator.pricing.optim.lbfgs` has the
route table). Every evaluation also yields a feasible allocation, by scaling down the columns of over-used pools
(Sec. 5), whose utility is a lower bound; the method stops when ``g(p) - U(X_feasible) <= eps`` (default ``eps =
1e-3 n``, scaled by the utility's range for target-priority: :func:`default_eps`). Initial prices are eq. (17)
(:func:`allocator.utilities.initial_prices`), or the given ``prices`` (warm start); cold starts of at least 5000
jobs first solve a seeded random sample of the jobs from eq. (17) and start from its prices and L-BFGS curvature
(:class:`PriceDiscovery`, "presolve"), which leaves two to four full-size evaluations on 004 Sec. 6.2 instead of 13.
The thread policy of CPU solves is :mod:`allocator.pricing.threads`.

Routes (:func:`~allocator.pricing.problem.resolve_route`): CPU solves run on numpy arrays and never import torch;
CUDA devices, torch tensor inputs, ``backend="torch"`` and distributed solves run on torch tensors. The array code is
written once for both (:mod:`allocator._xp`); the numpy route exists because importing torch (3.2-3.8 s on this
project's 2-core machine) costs more than a 10^6-job solve.

Scale-out: the dual function is a sum over jobs, so :func:`solve_distributed` shards jobs over the processes of a
``torch.distributed`` group and all-reduces resource usage, dual and primal sums every evaluation; the price update
is replicated identically on every rank.

Packages and modules, one job each (layers, bottom up; kept by import contracts):

- :mod:`~allocator.pricing._compiled`: the compiled CPU kernels (:mod:`~allocator.pricing._compiled.numba_kernels`
  is their source), their loading routes (:mod:`~allocator.pricing._compiled.kernels`: ahead of time or just in
  time) and the AOT build (:mod:`~allocator.pricing._compiled.aot`); imports nothing of the rest;
- :mod:`~allocator.pricing.problem`: the route table, the problem's data, input validation and conversion;
  :mod:`~allocator.pricing.threads`: torch threads of a torch-route CPU solve;
- :mod:`~allocator.pricing.dual`: the per-job subproblem (:mod:`~allocator.pricing.dual.subproblem`: hull walk,
  all-pairs reference, Sec. 4), the dual oracle (:mod:`~allocator.pricing.dual.oracle`: ``g(p)``, its subgradient
  and the column-scaled feasible allocation, Sec. 3, 5) and the reuse state of incremental re-solves with its change
  detection (:mod:`~allocator.pricing.dual.reuse`);
- :mod:`~allocator.pricing.primal`: the exact LP split of tied jobs (:mod:`~allocator.pricing.primal.recovery`;
  imports the LP solver when used; a job may span three pools or more where the market's optimum needs it), the
  per-pool shed that makes the final allocation feasible where a pool is over-used
  (:mod:`~allocator.pricing.primal.repair`, instead of scaling its whole column, Sec. 5) and the SLSQP polish of
  small markets (:mod:`~allocator.pricing.primal.polish`);
- :mod:`~allocator.pricing.result`: the result types;
- :mod:`~allocator.pricing.optim`: the projected L-BFGS price update and stopping rule
  (:mod:`~allocator.pricing.optim.lbfgs`, Alg. 2), the cutting-plane price step for nonsmooth duals
  (:mod:`~allocator.pricing.optim.bundle`) and the driver (:mod:`~allocator.pricing.optim.discovery`: presolve,
  escalation, incremental re-solves) with the entry points.

``import allocator.pricing`` loads numpy, not torch, scipy or numba: the kernels load on the first solve (outside
its clock) or when :func:`load_kernels` is called, the LP solver when a recovery first needs it.
"""

from __future__ import annotations

from allocator.pricing._compiled.kernels import load as load_kernels
from allocator.pricing.dual.oracle import dual_evaluation
from allocator.pricing.optim.discovery import PriceDiscovery, default_eps, solve, solve_distributed
from allocator.pricing.problem import Route, cuda_available, resolve_device, resolve_dtype, resolve_route
from allocator.pricing.result import IterationRecord, PricingResult

__all__ = [
    "IterationRecord",
    "PriceDiscovery",
    "PricingResult",
    "Route",
    "cuda_available",
    "default_eps",
    "dual_evaluation",
    "load_kernels",
    "resolve_device",
    "resolve_dtype",
    "resolve_route",
    "solve",
    "solve_distributed",
]
