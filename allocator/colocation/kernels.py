"""The compiled kernels of the colocation package and how they are loaded (a route table,
:class:`allocator._kernel_table.KernelTable`).

The kernels are in :mod:`allocator.colocation._bestors_kernel` (the divide-and-conquer layers of the BestOrS dynamic
programme, paper 001 Sec. 5), :mod:`allocator.colocation._exact_kernel` (the DP over machines of the exact
partition) and :mod:`allocator.colocation._search_kernel` (relocate and swap local search); their callers reach
them through :data:`TABLE` (``TABLE.load().bestors_dc(...)``), so importing :mod:`allocator.colocation` imports no
numba.

Routes, tried in this order (``WALRAS_COLOCATION_KERNELS=aot|jit`` or ``TABLE.load(route)`` forces one):

* ``aot``: the extension module ``allocator.colocation._kernels_aot`` exists and was built from the current kernel
  sources (``python -m allocator.colocation.aot``; ``make install``, ``make wheel`` and the operator image do it);
  numba is not imported.
* ``jit``: otherwise; numba compiles the kernels on first use (or loads them from its on-disk cache) and, on the
  first use after an install, says so on stderr.

Both routes compile the same Python source with the same numba and the same ``error_model``, so they compute the
same values (``tests/test_colocation_aot.py`` compares them). The ahead-of-time functions do not check dtypes or
layouts: the callers pass C-contiguous float64/int64 arrays as in :data:`SIGNATURES`.
"""

from __future__ import annotations

from allocator._kernel_table import Kernels, KernelTable, Source

__all__ = ["ENV", "SIGNATURES", "TABLE", "Kernels", "load"]

#: The environment variable that forces a route.
ENV = "WALRAS_COLOCATION_KERNELS"

_F1, _I1, _F2, _I2 = "float64[::1]", "int64[::1]", "float64[:, ::1]", "int64[:, ::1]"

TABLE = KernelTable(
    package="allocator.colocation",
    what="colocation",
    env=ENV,
    sources=(
        Source("allocator.colocation._bestors_kernel", {
            "bestors_dc": ("bestors_dc",
                           f"Tuple(({_F2}, {_I2}))({_F1}, {_F1}, {_F1}, {_F1}, float64, boolean, int64)"),
        }),
        Source("allocator.colocation._exact_kernel", {
            "dp_layer": ("dp_layer", f"void({_F1}, {_F1}, {_I1}, {_I1}, {_I1}, {_F1})"),
            "dp_backtrack": ("dp_backtrack", f"int64({_F1}, {_F1}, {_I1}, {_I1}, int64, float64)"),
        }),
        Source("allocator.colocation._search_kernel", {
            "local_search": ("local_search",
                             f"{_I1}({_F1}, {_I1}, {_F1}, {_I1}, {_F2}, int64, int64, float64, boolean, {_F1}, {_F1}, "
                             f"int64, int64, int64, {_I1})"),
        }),
    ),
)

#: The numba signature of each kernel called from Python (the ahead-of-time exports).
SIGNATURES = TABLE.signatures()


def load(route: str | None = None) -> Kernels:
    """The colocation kernels of this process (:meth:`allocator._kernel_table.KernelTable.load`)."""
    return TABLE.load(route)
