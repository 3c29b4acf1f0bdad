"""The price iterations of price discovery (004 Alg. 2) and their driver: the projected L-BFGS run with its stopping
rule (:mod:`~allocator.pricing.optim.lbfgs`), the cutting-plane step for nonsmooth duals
(:mod:`~allocator.pricing.optim.bundle`) and :class:`~allocator.pricing.optim.discovery.PriceDiscovery` with the
entry points (:mod:`~allocator.pricing.optim.discovery`). The top layer of :mod:`allocator.pricing`."""
