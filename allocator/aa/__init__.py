"""Utility-optimal assign-and-allocate (AA) of pods ("threads") to nodes ("servers").

Implements Lai, Fan, Zhang, Zhang, Liu, Zhou, *Utility Optimal Thread Assignment and Resource Allocation in
Multi-Server Systems* (paper 000): each pod has a nondecreasing utility curve of the units of one divisible resource it
gets; AA decides the node of every pod and its amount, maximising total utility (NP-hard, Theorem IV.1).

Entry points:

- :func:`assign_and_allocate` -- ``(server, amount)`` for one resource type; methods ``alg1`` (Algorithm 1),
  ``alg2`` (Algorithm 2, default), ``aanc`` (Section VII), baselines ``uu``, ``ur``, ``ru``, ``rr`` (Section VIII).
- :func:`assign_and_allocate_multi` -- ``d`` resource types: DPSOPT + AAMR (Section IX).
- Curve builders: :func:`curves_from_points` (profiled points: PCHIP when concave, piecewise-linear otherwise, or
  always linear for a compact family), :func:`parametric_curves` (``x^beta``, ``log(1+x/s)``, ``min(x, c)``),
  :func:`as_curves` (dense tables), :func:`concat_curves` (stack families of different kinds).
- Building blocks: :func:`super_optimal` (Definition V.1), :func:`reallocate` (optimal per-node split for a
  fixed assignment), :func:`algorithm1`, :func:`algorithm2`, :func:`baseline`, :func:`dpsopt`, :func:`aamr`,
  :func:`reallocate_multi`, :func:`total_utility`.

Shipped vs paper-literal: by default (``refine=True``) both entry points run the paper's algorithm and then re-split
every node's units optimally among the pods it received (:func:`reallocate`, :func:`reallocate_multi`; beyond the
paper, whose pseudocode leaves a node's remaining units unused). The assignment is the paper's; the re-split never
lowers any node's utility. ``refine=False`` gives the algorithms exactly as their pseudocode reads, which is what the
paper-reproduction tests and figures use.

Guarantees (equal capacities only, as in the paper): Algorithms 1 and 2 reach ``2(sqrt 2 - 1) > 0.828`` of the
optimum on concave curves (Theorems V.17 and VI.1); AANC reaches ``1/2`` on nonconcave curves (Theorem VII.3). These
are proven for the literal algorithms and carry over to the refined output, which is never worse.

Unequal node capacities (outside the paper's model; its Section X leaves them open): the same algorithms run
("largest remaining capacity first", super-optimal step on the total capacity), and then, by default
(``search="auto"``), :func:`local_search` improves the assignment by relocate and swap moves between nodes, each node
split optimally. No ratio is proven; :func:`exact_optimum` (HiGHS MILP) is the exact reference the tests and
``bench/aa.py`` measure it against (``docs/bench/aa.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .algorithms import Placement, Step, algorithm1, algorithm2, algorithm2_order, baseline
from .curves import (
    ConcatCurves,
    CurveFamily,
    FloatArray,
    IntArray,
    ParametricCurves,
    PiecewiseLinearCurves,
    TableCurves,
    as_curves,
    concat_curves,
    curves_from_points,
    parametric_curves,
    pchip_table,
)
from .exact import ExactResult, exact_optimum
from .multi import aamr, assign_and_allocate_multi, check_tables, dpsopt, multi_baseline, reallocate_multi
from .search import SearchResult, local_search, search_route
from .superopt import (
    SuperOptimal,
    reallocate,
    reallocate_dp,
    super_optimal,
    super_optimal_concave,
    super_optimal_dp,
)

__all__ = [
    "ConcatCurves",
    "CurveFamily",
    "ExactResult",
    "FloatArray",
    "IntArray",
    "ParametricCurves",
    "PiecewiseLinearCurves",
    "Placement",
    "SearchResult",
    "Step",
    "SuperOptimal",
    "TableCurves",
    "aamr",
    "algorithm1",
    "algorithm2",
    "algorithm2_order",
    "as_curves",
    "assign_and_allocate",
    "assign_and_allocate_multi",
    "baseline",
    "check_tables",
    "concat_curves",
    "curves_from_points",
    "dpsopt",
    "exact_optimum",
    "local_search",
    "multi_baseline",
    "parametric_curves",
    "pchip_table",
    "reallocate",
    "reallocate_dp",
    "reallocate_multi",
    "search_route",
    "solve",
    "super_optimal",
    "super_optimal_concave",
    "super_optimal_dp",
    "total_utility",
]

METHODS = ("alg1", "alg2", "aanc", "uu", "ur", "ru", "rr")


def _capacities(capacities: Sequence[int] | ArrayLike) -> IntArray:
    caps = np.asarray(capacities)
    if caps.ndim != 1 or caps.size == 0:
        raise ValueError("capacities must be a non-empty 1-D sequence of integers")
    if not np.issubdtype(caps.dtype, np.number):
        raise ValueError("capacities must be integers")
    bad = ~np.isfinite(caps.astype(np.float64)) | (caps < 0) | (caps != np.round(caps))
    if bad.any():
        raise ValueError(f"server {int(np.argmax(bad))}: capacity must be a nonnegative integer; got {caps[bad][0]}")
    return caps.astype(np.int64)


def total_utility(values: Any, amount: ArrayLike, capacity: int | None = None) -> float:
    """``sum_i f_i(amount_i)`` -- the AA objective of Section III."""
    a = np.asarray(amount, dtype=np.int64)
    if capacity is None:
        capacity = values.capacity if isinstance(values, CurveFamily) else int(np.max(a))
        if not isinstance(values, CurveFamily):
            capacity = max(capacity, np.asarray(values).shape[-1] - 1)
    curves = as_curves(values, int(capacity))
    return float(curves.evaluate(a).sum())


def _search_enabled(search: bool | str, refine: bool, caps: IntArray) -> bool:
    """Route of the assignment local search (``search`` argument of :func:`solve`):

    - ``"auto"`` (default): on when the capacities are unequal and ``refine`` is on. Equal capacities are the
      paper's model, where Algorithms 1/2 and AANC carry their guarantees and reach >= 0.99 of SO on Section VIII's
      instances after the re-split; unequal ones are outside it, and there the paper's "largest remaining capacity
      first" rule measurably misplaces threads (``docs/bench/aa.md``, heterogeneous section).
    - ``True``: on (needs ``refine=True``: the search evaluates every server optimally split).
    - ``False``: off.

    When on, :func:`~allocator.aa.search.search_route` still picks the moves by size, and skips instances too large
    for one pass."""
    if search == "auto":
        return refine and bool((caps != caps[0]).any())
    if search is True:
        if not refine:
            raise ValueError("search=True needs refine=True (the search evaluates optimally split servers)")
        return True
    if search is False:
        return False
    raise ValueError(f"search must be True, False or 'auto'; got {search!r}")


def solve(
    values: Any,
    capacities: Sequence[int] | ArrayLike,
    *,
    method: str = "alg2",
    trace: bool = False,
    refine: bool = True,
    search: bool | str = "auto",
) -> tuple[Placement, SuperOptimal | None]:
    """:func:`assign_and_allocate` with its by-products: the :class:`Placement` (with the step trace when ``trace``,
    and the :class:`~allocator.aa.search.SearchResult` when the local search ran) and the super-optimal allocation
    used (``None`` for the baselines).

    ``refine`` and ``search`` have the same meaning and defaults as in :func:`assign_and_allocate`. ``refine=False``
    returns the paper's algorithm as its pseudocode reads. The baselines ignore both. ``placement.steps`` always
    traces the algorithm's own loop (Tables II and III); ``placement.order`` is the algorithm's placement order."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    caps = _capacities(capacities)
    curves = as_curves(values, int(caps.max()))
    total = int(caps.sum())
    if method in ("uu", "ur", "ru", "rr"):
        return baseline(method, curves.n, caps, np.random.default_rng(0)), None
    use_search = _search_enabled(search, refine, caps)
    so = super_optimal(curves, total, method="dp" if method == "aanc" else "auto")
    g_hat = curves.evaluate(so.amount)
    place = algorithm1 if method == "alg1" else algorithm2
    p = place(so.amount, g_hat, caps, trace=trace)
    if refine:
        p = Placement(p.server, reallocate(curves, p.server, caps, current=p.amount), p.order, p.steps)
    if use_search:
        found = local_search(curves, p.server, caps)
        amount = p.amount if found.moves == 0 else reallocate(curves, found.server, caps)
        p = Placement(found.server, amount, p.order, p.steps, found)
    return p, so


def assign_and_allocate(
    values: Any,
    capacities: Sequence[int] | ArrayLike,
    *,
    method: str = "alg2",
    refine: bool = True,
    search: bool | str = "auto",
) -> tuple[IntArray, IntArray]:
    """Assign every thread (pod) to a server (node) and give it an integer amount of the server's resource.

    Parameters
    ----------
    values:
        Either a dense ``(n, C+1)`` array with ``values[i, c]`` = utility of thread ``i`` given ``c`` units
        (``C`` = the largest capacity; shorter tables, or a list of per-thread 1-D tables, are extended flat), or a
        compact :class:`CurveFamily` (from :func:`curves_from_points`, :func:`parametric_curves`, or
        :class:`PiecewiseLinearCurves` directly) for large ``n`` and ``C``. Curves must be finite, nonnegative and
        nondecreasing, and no longer than the largest capacity; otherwise ``ValueError`` names the thread.
    capacities:
        Length-``m`` integer capacities, one per server. The paper's guarantees assume they are equal.
    method:
        ``"alg2"`` (Algorithm 2, Section VI), ``"alg1"`` (Algorithm 1, Section V), ``"aanc"`` (Section VII: Algorithm
        2 on the exact DP super-optimal allocation), or the baselines ``"uu"``, ``"ur"``, ``"ru"``, ``"rr"`` (Section
        VIII; random ones seeded with 0). With ``alg1``/``alg2`` the super-optimal step is Galil's bisection when every
        curve is concave and the exact DP otherwise -- so ``alg2`` on nonconcave curves *is* AANC (ratio 1/2).
    refine:
        ``True`` (default, what Walras ships): after ``alg1``/``alg2``/``aanc``, each server's units are re-split
        optimally among the threads assigned to it (:func:`reallocate`; the server assignment is unchanged). The
        paper's pseudocode never hands out what a server has left (Lemma V.7 keeps it); a scheduler should not leave
        units of a node idle when a pod on it would gain from them. The re-split never lowers a server's utility, so
        the guarantees, proven for the literal algorithms, hold for it too. ``False``: the paper's algorithm exactly
        as its pseudocode reads (to reproduce Tables II and III and Section VIII's figures). Ignored by the
        baselines, which stay as Section VIII defines them.
    search:
        Local search on the assignment after the re-split (:func:`~allocator.aa.search.local_search`, beyond the
        paper): best-improvement relocate and swap moves between servers, each server split optimally, until no move
        improves. ``"auto"`` (default): on when the capacities are unequal (outside the paper's model, where its
        assignment rule has no guarantee and measurably misplaces threads) and ``refine`` is on; ``True``: on
        (needs ``refine=True``); ``False``: off. Size limits: :func:`~allocator.aa.search.search_route`. It only
        accepts improving moves, so the result is never worse than without it.

    Returns
    -------
    (server, amount):
        ``int64`` arrays of length ``n``: 0-based server index and units per thread; per server the amounts sum to at
        most its capacity.
    """
    placement, _ = solve(values, capacities, method=method, refine=refine, search=search)
    return placement.server, placement.amount
