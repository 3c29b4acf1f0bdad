"""The primal side of price discovery: feasible allocations better than the column scaling of 004 Sec. 5 at given
prices: the exact LP split of tied jobs (:mod:`~allocator.pricing.primal.recovery`), the per-pool shed of
over-used pools (:mod:`~allocator.pricing.primal.repair`) and the SLSQP polish of small markets with the projection
onto the constraints of (4) (:mod:`~allocator.pricing.primal.polish`).

Builds on :mod:`allocator.pricing.dual`; imports nothing of the price iterations (an import contract)."""
