"""The compiled kernels of the fairness package and how they are loaded (a route table,
:class:`allocator._kernel_table.KernelTable`).

The kernels are in :mod:`allocator.fairness.psdsf._fill_kernels` (the PS-DSF water filling of one server),
:mod:`allocator.fairness.psdsf._levels_kernels` (the smoothed levels and their sparse Jacobian),
:mod:`allocator.fairness.rounding._hand_back_kernel` (the hand-back loop of the pod rounding) and
:mod:`allocator.fairness.pfvds._ipm_kernels` (the structured products of the PF-VDS interior-point method); their
callers reach them through :data:`TABLE` (``TABLE.load().fill_column(...)``), so importing
:mod:`allocator.fairness` imports no numba.

Routes, tried in this order (``WALRAS_FAIRNESS_KERNELS=aot|jit`` or ``TABLE.load(route)`` forces one):

* ``aot``: the extension module ``allocator.fairness._kernels_aot`` exists and was built from the current kernel
  sources (``python -m allocator.fairness.aot``; ``make install``, ``make wheel`` and the operator image do it);
  numba is not imported.
* ``jit``: otherwise; numba compiles the kernels on first use (or loads them from its on-disk cache) and, on the
  first use after an install, says so on stderr.

Both routes compile the same Python source with the same numba and the same ``error_model`` (``"numpy"`` for the
PS-DSF kernels), so they compute the same values (``tests/test_fairness_aot.py`` compares them). The ahead-of-time
functions do not check dtypes or layouts: the callers pass arrays of the dtypes and layouts in :data:`SIGNATURES`
(``int64[:]``: any layout; ``[::1]``: C-contiguous).
"""

from __future__ import annotations

from allocator._kernel_table import Kernels, KernelTable, Source

__all__ = ["ENV", "SIGNATURES", "TABLE", "Kernels", "load"]

#: The environment variable that forces a route.
ENV = "WALRAS_FAIRNESS_KERNELS"

_F1, _I1, _B1 = "float64[::1]", "int64[::1]", "boolean[::1]"
_F2, _I2, _F3 = "float64[:, ::1]", "int64[:, ::1]", "float64[:, :, ::1]"
_IA = "int64[:]"  # the interior point's index arrays: contiguous or sliced

TABLE = KernelTable(
    package="allocator.fairness",
    what="fairness",
    env=ENV,
    sources=(
        Source("allocator.fairness.psdsf._fill_kernels", {
            "fill_column": ("fill_column", f"{_F1}({_F1}, {_F1}, {_F1}, {_F2}, {_F1})"),
        }),
        Source("allocator.fairness.psdsf._levels_kernels", {
            "smooth_forward": ("smooth_forward",
                               f"{_F2}({_I1}, {_I1}, {_F1}, {_F1}, float64, {_F1}, {_F1}, {_F2}, {_F2}, {_F2}, {_F2}, "
                               f"{_B1})"),
            "smooth_jacobian": ("smooth_jacobian",
                                f"{_F2}({_F2}, {_F2}, {_B1}, {_I1}, {_F1}, {_B1}, {_F2}, {_F2}, float64, float64)"),
        }),
        Source("allocator.fairness.rounding._hand_back_kernel", {
            "hand_back": ("hand_back", f"void({_F2}, {_F2}, {_F2}, {_F2}, {_F1}, {_F1}, {_F1}, {_I2}, {_I1})"),
        }),
        Source("allocator.fairness.pfvds._ipm_kernels", {
            "pair_price": ("pair_price", f"{_F1}({_IA}, {_F2}, {_F2})"),
            "pair_load": ("pair_load", f"{_F2}({_IA}, {_F2}, {_F1}, int64)"),
            "server_blocks": ("server_blocks", f"{_F3}({_IA}, {_F2}, {_F1}, int64)"),
            "scaled_coupling": ("scaled_coupling", f"{_F2}({_IA}, {_IA}, {_F2}, {_F1}, {_F3}, int64)"),
            "user_and_load": ("user_and_load", f"Tuple(({_F1}, {_F2}))({_IA}, {_IA}, {_F2}, {_F1}, int64, int64)"),
            "coupling_t": ("coupling_t", f"{_F1}({_IA}, {_IA}, {_F2}, {_F1}, {_F2}, int64)"),
            "coupling": ("coupling", f"{_F2}({_IA}, {_IA}, {_F2}, {_F1}, {_F1}, int64)"),
            "pair_step": ("pair_step", f"{_F1}({_IA}, {_IA}, {_F2}, {_F1}, {_F1}, {_F1}, {_F2})"),
            "user_sum": ("user_sum", f"{_F1}({_IA}, {_F1}, int64)"),
            "max_step": ("max_step", f"float64({_F1}, {_F1})"),
        }),
    ),
)

#: The numba signature of each kernel called from Python (the ahead-of-time exports).
SIGNATURES = TABLE.signatures()


def load(route: str | None = None) -> Kernels:
    """The fairness kernels of this process (:meth:`allocator._kernel_table.KernelTable.load`)."""
    return TABLE.load(route)
