"""The compiled CPU kernels of price discovery: :mod:`~allocator.pricing._compiled.numba_kernels` (their source: the
hull walk of 004 Sec. 4 / Alg. 1 and three one-pass helpers), :mod:`~allocator.pricing._compiled.kernels` (the route
table that loads them, ahead of time or just in time, and the wrappers the solver calls) and
:mod:`~allocator.pricing._compiled.aot` (the ahead-of-time build, ``python -m allocator.pricing._compiled.aot``).

The lowest layer of :mod:`allocator.pricing`: it imports nothing of the rest of the package (an import contract)."""
