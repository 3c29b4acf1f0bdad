"""Walras numerics: price discovery and placement mechanisms, free of any Kubernetes dependency.

Modules, one per mechanism:

- :mod:`allocator.utilities` -- vectorised utility families (paper 004, Sec. 2-3).
- :mod:`allocator.pricing` -- dual-decomposition price discovery across pools (paper 004, Alg. 1-2).
- :mod:`allocator.aa` -- utility-optimal assign-and-allocate of pods to nodes (paper 000).
- :mod:`allocator.colocation` -- colocation with side effects (paper 001).
- :mod:`allocator.degree` -- throughput under per-node degree limits (paper 003).
- :mod:`allocator.fairness` -- multi-resource fairness on heterogeneous nodes (paper 002).

The five mechanisms are independent: none imports another (an import-linter contract in ``pyproject.toml``); what
they share lives in :mod:`allocator.utilities` and the private modules here (such as :mod:`allocator._jit`, the compiled
kernels' decorator; :mod:`allocator._aot`, the ahead-of-time route; :mod:`allocator.datasets`, the shipped data).
"""

__all__ = ["aa", "colocation", "degree", "fairness", "pricing", "utilities"]
