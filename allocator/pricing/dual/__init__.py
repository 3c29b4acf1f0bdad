"""The dual side of price discovery (004 Sec. 3-5): the per-job subproblem and its solvers
(:mod:`~allocator.pricing.dual.subproblem`, Sec. 4 / Alg. 1), the dual oracle that evaluates ``g(p)``, its
subgradient and the column-scaled feasible allocation (:mod:`~allocator.pricing.dual.oracle`, Sec. 3 and 5), and
the state an incremental re-solve reuses (:mod:`~allocator.pricing.dual.reuse`).

Imports neither the primal recovery nor the price iterations (import contracts)."""
