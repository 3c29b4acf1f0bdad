"""Linear programs through HiGHS' own Python bindings (``highspy``), for the solves on a plan's path.

``scipy.optimize.linprog(method="highs")`` runs the same solver, but importing ``scipy.optimize`` loads the whole
package (its ``__init__`` pulls in ``scipy.sparse``, ``scipy.linalg`` and every method): 0.5-0.7 s of a fresh process
on this project's 2-core machine, against about 30 ms for ``import highspy`` (docs/bench/cli.md). A cold ``walras
plan`` solves one small LP (the market's recovery split, :mod:`allocator.pricing.primal.recovery`), so that import was a
fifth of its time. This module builds the model from numpy arrays directly (a row-wise sparse matrix, no
``scipy.sparse``) and reads the primal solution back.

HiGHS solves ``minimise c^T x`` subject to ``row_lower <= A x <= row_upper`` and ``col_lower <= x <= col_upper``; an
equality row has equal bounds and a one-sided row an infinite one (``numpy.inf`` is passed as HiGHS' infinity).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LPResult", "solve_lp"]


@dataclass(frozen=True)
class LPResult:
    """``optimal``: HiGHS reports the model optimal; ``x``: the primal solution (``None`` unless optimal);
    ``status``: HiGHS' model status, as text (for messages)."""

    optimal: bool
    x: np.ndarray | None
    status: str


def solve_lp(
    cost: np.ndarray,
    indptr: np.ndarray,
    indices: np.ndarray,
    values: np.ndarray,
    row_lower: np.ndarray,
    row_upper: np.ndarray,
    col_lower: np.ndarray,
    col_upper: np.ndarray,
) -> LPResult:
    """Minimise ``cost^T x`` over ``row_lower <= A x <= row_upper``, ``col_lower <= x <= col_upper`` with HiGHS.

    ``A`` is given row-wise (CSR): row ``r`` holds ``values[indptr[r]:indptr[r+1]]`` in the columns
    ``indices[indptr[r]:indptr[r+1]]``. Infinite bounds are ``-inf``/``inf``. HiGHS runs without presolve (see
    below), with the solver it chooses (dual simplex for these LPs), and prints nothing.
    """
    import highspy
    from highspy import _core

    n_col, n_row = int(cost.size), int(row_lower.size)
    if indptr.size != n_row + 1 or indices.size != values.size or col_lower.size != n_col or col_upper.size != n_col:
        raise ValueError(f"inconsistent LP: {n_row} rows, {n_col} columns, indptr of {indptr.size}, "
                         f"{indices.size} indices, {values.size} values")
    # HiGHS takes 32-bit indices, and a NaN cost sends its simplex (without presolve) into a loop that its own time
    # limit does not end: both are refused here, as scipy's linprog refuses them.
    if max(n_col, n_row, int(indptr[-1]) if indptr.size else 0) >= 2**31 - 1:
        raise ValueError(f"LP too large for HiGHS' 32-bit indices: {n_row} rows, {n_col} columns, "
                         f"{int(indptr[-1])} entries")
    if not (np.isfinite(cost).all() and np.isfinite(values).all()):
        raise ValueError("LP cost and constraint coefficients must be finite")
    if any(np.isnan(b).any() for b in (row_lower, row_upper, col_lower, col_upper)):
        raise ValueError("LP bounds must not be NaN")
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_ = n_col
    lp.num_row_ = n_row
    lp.col_cost_ = np.ascontiguousarray(cost, dtype=np.float64)
    lp.col_lower_ = np.clip(np.asarray(col_lower, dtype=np.float64), -inf, inf)
    lp.col_upper_ = np.clip(np.asarray(col_upper, dtype=np.float64), -inf, inf)
    lp.row_lower_ = np.clip(np.asarray(row_lower, dtype=np.float64), -inf, inf)
    lp.row_upper_ = np.clip(np.asarray(row_upper, dtype=np.float64), -inf, inf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = n_col
    lp.a_matrix_.num_row_ = n_row
    lp.a_matrix_.start_ = np.ascontiguousarray(indptr, dtype=np.int32)
    lp.a_matrix_.index_ = np.ascontiguousarray(indices, dtype=np.int32)
    lp.a_matrix_.value_ = np.ascontiguousarray(values, dtype=np.float64)
    # The core object, not ``highspy.Highs``: that wrapper's constructor prints HiGHS' banner to the process's
    # standard output before any option can be set, which would corrupt ``walras plan -o json``.
    h = _core._Highs()
    h.setOptionValue("output_flag", False)
    # HiGHS 1.16's presolve costs more than it saves on these LPs: the market's recovery split at 5,000 nodes / 1,000
    # jobs (5,677 columns, 694 rows) took 0.12 s with it and 0.028 s without (same optimum; scipy 1.17's bundled
    # HiGHS, presolve on: 0.051 s), measured on this project's 2-core machine.
    h.setOptionValue("presolve", "off")
    if h.passModel(lp) != highspy.HighsStatus.kOk:  # a malformed matrix (indices out of range, duplicates)
        return LPResult(False, None, "model rejected by HiGHS")
    h.run()
    status = h.getModelStatus()
    text = h.modelStatusToString(status)
    if status != highspy.HighsModelStatus.kOptimal:
        return LPResult(False, None, text)
    x = np.asarray(h.getSolution().col_value, dtype=np.float64)
    if not np.isfinite(x).all():
        return LPResult(False, None, f"{text} with a non-finite solution")
    return LPResult(True, x, text)
