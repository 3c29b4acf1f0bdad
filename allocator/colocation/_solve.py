"""Public entry points :func:`solve` and :func:`partition`, the method list and the route table of ``"auto"``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ._bestors import _bestors, _bestors_limited
from ._cutjuxtapose import _cutjuxtapose
from ._exact import exact_partition, exact_work
from ._hill import _hill
from ._model import _cost, _Instance, _Limits, _per_machine, _validate
from ._search import DEFAULT_STARTS, compiled_cost, search
from ._special import _dynsize, _equivalent, _independent, _large_influences, _round_sizes

METHODS: tuple[str, ...] = (
    "auto",
    "exact",
    "search",
    "bestors",
    "bestors+hill",
    "one+hill",
    "dedic+hill",
    "cutjuxtapose",
    "dynsize",
    "approx",
    "independent",
    "equivalent",
    "large-influences",
)
#: The methods that accept the hard limits ``capacity=``, ``max_tasks=`` and ``demands=``.
LIMITS_METHODS: tuple[str, ...] = ("auto", "exact", "search", "bestors+hill", "one+hill", "dedic+hill")
_HILL_METHODS = ("bestors+hill", "one+hill", "dedic+hill")
#: The routes ``solve(method="auto")`` can take (see :func:`solve`); ``ColocationResult.route`` names the one taken.
ROUTES: tuple[str, ...] = ("exact-dp", "search", "bestors+hill")
#: Default cost-evaluation budget of HILL and CutJuxtapose (Sec. 8.1.1: 10**6).
DEFAULT_BUDGET = 10**6
#: Default cost-evaluation budget of the multi-start search (``"auto"`` and ``"search"``).
DEFAULT_SEARCH_BUDGET = 1_500_000
#: Largest DP work (:func:`allocator.colocation._exact.exact_work`, transitions) the ``"auto"`` route solves exactly.
DEFAULT_EXACT_LIMIT = 5e6

Status = Literal["certified", "heuristic", "capped"]


@dataclass(frozen=True)
class ColocationResult:
    """What :func:`solve` returns.

    ``assignment[i]``: machine of task i. ``cost``: its total cost. ``evaluations``: cost evaluations used
    (HILL and the search: candidate moves and swaps evaluated; CutJuxtapose: partitions, ``m^2`` per matching;
    DynSize and the exact DP: DP transitions). ``complete``: an exact method finished within its budget (its ``cost``
    is then optimal); False for heuristics and interrupted runs. ``moves``: moves (and swaps) taken. ``route``: how
    the result was produced (for ``"auto"`` one of :data:`ROUTES`, otherwise the method). ``status``:
    ``"certified"`` when ``cost`` is proved optimal (``complete``); ``"capped"`` when the evaluation ``budget`` ran out
    first (the search, HILL, an interrupted CutJuxtapose: best found so far); ``"heuristic"`` otherwise (a local
    optimum or an approximation, no proof). ``starts``: starts the search ran (0 for other routes).
    """

    assignment: np.ndarray
    cost: float
    method: str
    evaluations: int
    complete: bool
    moves: int = 0
    route: str = ""
    status: Status = "heuristic"
    starts: int = 0


def _limits(inst: _Instance, capacity: Any, max_tasks: Any, demands: Any) -> _Limits:
    dem = inst.sizes if demands is None else np.asarray(demands, dtype=np.float64)
    if dem.shape != inst.sizes.shape:
        raise ValueError(f"demands must have one entry per task ({inst.n}), got shape {dem.shape}")
    if np.any(~np.isfinite(dem) | (dem < 0)):
        raise ValueError(f"demands[{int(np.flatnonzero(~(dem >= 0))[0])}] must be finite and >= 0")
    limits = _Limits(
        capacity=np.inf * np.ones(inst.m) if capacity is None else _per_machine(capacity, inst.m, "capacity", False),
        max_tasks=np.inf * np.ones(inst.m) if max_tasks is None else _per_machine(max_tasks, inst.m, "max_tasks", True),
        demands=dem,
    )
    limits.check_obvious(inst.n)
    return limits


def _feasible_start(inst: _Instance, limits: _Limits | None, dp: str) -> tuple[np.ndarray, int, int]:
    """The search's first start: BestOrS; under limits the penalised BestOrS, repaired by HILL if it breaks one."""
    if limits is None:
        return _bestors(inst, dp), 0, 0
    a = _bestors_limited(inst, limits)
    D = np.bincount(a, weights=limits.demands, minlength=inst.m)
    C = np.bincount(a, minlength=inst.m)
    if np.all(D <= limits.capacity * (1 + 1e-12) + 1e-12) and np.all(C <= limits.max_tasks):
        return a, 0, 0
    return _hill(inst, a, DEFAULT_BUDGET, limits)


def solve(
    sizes: Any,
    types: Any,
    alpha: Any,
    n_machines: int,
    *,
    method: str = "auto",
    cost: Any = None,
    budget: int | None = None,
    eps: float = 0.1,
    juxtapose: str = "auto",
    capacity: Any = None,
    max_tasks: Any = None,
    demands: Any = None,
    type_names: Sequence[str] | None = None,
    dp: str = "dc",
    starts: int = DEFAULT_STARTS,
    seed: int = 0,
    exact_limit: float | None = None,
) -> ColocationResult:
    """Partition tasks onto ``n_machines`` machines with ``method`` (see :data:`METHODS` and the package docstring).

    ``method="auto"`` (the default) takes one route of this table (``ColocationResult.route``):

    ================ ================================================================= ===========
    route            taken when                                                        status
    ================ ================================================================= ===========
    ``exact-dp``     the DP over machines needs at most ``exact_limit`` transitions    certified
                     (default ``5e6``, 0.1-0.2 s here; any cost, with or without limits)
    ``search``       otherwise, for the linear cost and ``x**k`` costs                 heuristic,
                                                                                       capped
    ``bestors+hill`` otherwise, for another convex callable (the compiled search       heuristic,
                     evaluates linear and power costs only): HILL of Sec. 8.1.1        capped
    ================ ================================================================= ===========

    ``"exact"`` is the DP alone (``ValueError`` above ``exact_limit``); ``"search"`` the multi-start local search
    alone (:mod:`allocator.colocation._search`: moves and swaps between any machines, zero-gain plateau steps with a
    tabu list, ``starts`` deterministic starts with kicks seeded by ``seed``).

    ``budget`` caps cost evaluations: default ``10**6`` for HILL and CutJuxtapose (Sec. 8.1.1), ``1.5 * 10**6`` for
    the search (it then stays within 3x HILL's time on n = 2000, m = 50, docs/bench/colocation.md); DynSize and
    ApproxScheme raise ``ValueError`` when they would exceed it. ``eps`` is ApproxScheme's epsilon; ``juxtapose``
    chooses CutJuxtapose's juxtaposition (``"matching"``: Hungarian via ``scipy.optimize.linear_sum_assignment``, two
    types, linear cost; ``"enumerate"``: all placements; ``"auto"``: matching for two types when ``m >= 5``). ``dp``
    picks the BestOrS engine (``"dc"`` or ``"quadratic"``).

    Hard limits (:data:`LIMITS_METHODS`): ``capacity`` (allocatable capacity per machine, in the units of
    ``demands``, which default to ``sizes``) and ``max_tasks`` (max tasks / pods per machine); scalars or one value
    per machine. The exact DP enforces them per machine and proves infeasibility (:class:`InfeasibleError`) when no
    partition fits. BestOrS+HILL starts from the BestOrS DP with the limits as a large penalty per layer (machines
    taken in order of decreasing capacity) and never takes a move that breaks a limit; if the start violates a limit
    it is repaired with the same moves first; the search starts from that repaired partition and keeps the limits in
    every move and swap. Obviously infeasible instances (too many tasks, too much demand, a task larger than every
    machine) and instances where the heuristics find no feasible partition raise :class:`InfeasibleError` (a
    ``ValueError``). Effect on the guarantees: with limits the OrS dominance (Lemma 4.1) no longer holds (its exchanges
    can overload a machine), the single-type problem is no longer polynomial (``max_tasks = 3`` with capacities
    encodes 3-PARTITION), so Prop. 5.1 exactness and the ``alpha_max/alpha_min`` bound of Prop. 6.4 are lost: the
    heuristics return a feasible local optimum with no approximation guarantee, and their failing to find a feasible
    partition does not prove that none exists (the exact route's does).
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    inst = _validate(sizes, types, alpha, n_machines, cost, type_names)
    opts = _options(method, budget, eps, juxtapose, dp, starts, seed, exact_limit)
    limits = _method_limits(inst, method, capacity, max_tasks, demands)
    route = _route(inst, opts, limits)
    out = _run_route(route, inst, opts, limits)
    return ColocationResult(
        assignment=out.assignment,
        cost=_cost(inst, out.assignment),
        method=method,
        evaluations=int(out.evaluations),
        complete=bool(out.complete),
        moves=int(out.moves),
        route=route,
        status="certified" if out.complete else "capped" if out.capped else "heuristic",
        starts=int(out.starts),
    )


@dataclass(frozen=True)
class _Options:
    """The checked options of one :func:`solve` call (``budget`` defaulted per method, ``exact_limit`` a float)."""

    method: str
    budget: int
    eps: float
    juxtapose: str
    dp: str
    starts: int
    seed: int
    exact_limit: float


def _options(
    method: str,
    budget: int | None,
    eps: float,
    juxtapose: str,
    dp: str,
    starts: int,
    seed: int,
    exact_limit: float | None,
) -> _Options:
    """:class:`_Options` from :func:`solve`'s keywords: ``budget`` defaults to :data:`DEFAULT_SEARCH_BUDGET` for the
    search routes and :data:`DEFAULT_BUDGET` otherwise and must be a positive integer, as must ``starts``;
    ``exact_limit`` defaults to :data:`DEFAULT_EXACT_LIMIT` and must be ``>= 0`` (``ValueError`` otherwise)."""
    if budget is None:
        budget = DEFAULT_SEARCH_BUDGET if method in ("auto", "search") else DEFAULT_BUDGET
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 1:
        raise ValueError(f"budget must be a positive integer, got {budget!r}")
    if isinstance(starts, bool) or not isinstance(starts, (int, np.integer)) or starts < 1:
        raise ValueError(f"starts must be a positive integer, got {starts!r}")
    limit = DEFAULT_EXACT_LIMIT if exact_limit is None else float(exact_limit)
    if not limit >= 0:
        raise ValueError(f"exact_limit must be >= 0, got {exact_limit!r}")
    return _Options(
        method=method,
        budget=int(budget),
        eps=eps,
        juxtapose=juxtapose,
        dp=dp,
        starts=int(starts),
        seed=int(seed),
        exact_limit=limit,
    )


def _method_limits(inst: _Instance, method: str, capacity: Any, max_tasks: Any, demands: Any) -> _Limits | None:
    """The hard limits of the call (``None`` without ``capacity=`` and ``max_tasks=``), checked against the method
    (:data:`LIMITS_METHODS`), and the method checked against the cost (the Sec. 6 special cases and ApproxScheme are
    defined for the linear cost only); ``ValueError`` otherwise."""
    limited = capacity is not None or max_tasks is not None
    if demands is not None and not limited:
        raise ValueError("demands only matter with capacity= or max_tasks=")
    if limited and method not in LIMITS_METHODS:
        raise ValueError(f"hard limits (capacity, max_tasks) are supported by {LIMITS_METHODS}, not {method!r}")
    if method in ("independent", "equivalent", "large-influences", "approx") and inst.cost is not None:
        raise ValueError(f"method {method!r} is defined for the linear cost only (Sec. 6)")
    return _limits(inst, capacity, max_tasks, demands) if limited else None


def _route(inst: _Instance, opts: _Options, limits: _Limits | None) -> str:
    """The route of the call: for ``"auto"`` the row of :func:`solve`'s table (the exact DP when it needs at most
    ``exact_limit`` transitions, else the search for the costs it compiles, else BestOrS+HILL); ``"exact-dp"`` for
    ``"exact"`` (``ValueError`` above ``exact_limit``); the method itself otherwise."""
    if opts.method == "auto":
        if exact_work(inst, limits) <= opts.exact_limit:
            return "exact-dp"
        if compiled_cost(inst) is not None:
            return "search"
        return "bestors+hill"
    if opts.method == "exact":
        work = exact_work(inst, limits)
        if work > opts.exact_limit:
            raise ValueError(
                f"the exact DP would need {work:.3g} transitions, more than exact_limit={opts.exact_limit:.3g}"
            )
        return "exact-dp"
    return opts.method


@dataclass(frozen=True)
class _Outcome:
    """What one route returns: the assignment, the evaluations and moves it used, the search's starts, ``complete``
    (an exact method finished, its cost is optimal) and ``capped`` (the evaluation budget ran out)."""

    assignment: np.ndarray
    evaluations: int = 0
    complete: bool = False
    moves: int = 0
    starts: int = 0
    capped: bool = False


def _run_route(route: str, inst: _Instance, opts: _Options, limits: _Limits | None) -> _Outcome:
    """Run ``route`` (:func:`_route`) on the instance: the algorithm of the package docstring that it names."""
    budget, dp = opts.budget, opts.dp
    if route == "exact-dp":
        a, evaluations = exact_partition(inst, limits)
        return _Outcome(a, evaluations, complete=True)
    if route == "search":
        start, ev0, mv0 = _feasible_start(inst, limits, dp)
        out = search(inst, start, max(1, budget - ev0), limits, starts=opts.starts, seed=opts.seed)
        evaluations = ev0 + out.evaluations
        return _Outcome(
            out.assignment, evaluations, moves=mv0 + out.moves, starts=out.starts, capped=evaluations >= budget
        )
    if route == "bestors":
        one_type = np.unique(inst.types).size <= 1 or bool(np.all(inst.alpha == inst.alpha.flat[0]))
        return _Outcome(_bestors(inst, dp), complete=inst.cost is None and one_type)
    if route in _HILL_METHODS:
        if route == "bestors+hill":
            start = _bestors(inst, dp) if limits is None else _bestors_limited(inst, limits)
        elif route == "one+hill":
            start = np.zeros(inst.n, dtype=np.int64)
        else:
            start = inst.types % inst.m
        a, evaluations, moves = _hill(inst, start, budget, limits)
        return _Outcome(a, evaluations, moves=moves, capped=evaluations >= budget)
    if route == "cutjuxtapose":
        a, evaluations, finished = _cutjuxtapose(inst, budget, opts.juxtapose)
        return _Outcome(a, evaluations, complete=finished and inst.cost is None, capped=not finished)
    if route == "dynsize":
        a, evaluations = _dynsize(inst, inst.sizes, budget)
        return _Outcome(a, evaluations, complete=True)
    if route == "approx":
        if not (opts.eps > 0 and math.isfinite(opts.eps)):
            raise ValueError(f"eps must be positive, got {opts.eps}")
        a, evaluations = _dynsize(inst, _round_sizes(inst.sizes, opts.eps), budget)
        return _Outcome(a, evaluations)
    if route == "independent":
        return _Outcome(_independent(inst), complete=True)
    if route == "equivalent":
        return _Outcome(_equivalent(inst), complete=True)
    return _Outcome(_large_influences(inst), complete=True)


def partition(
    sizes: Any,
    types: Any,
    alpha: Any,
    n_machines: int,
    *,
    method: str = "auto",
    cost: Any = None,
    budget: int | None = None,
    **options: Any,
) -> np.ndarray:
    """Machine index of every task (shape ``(n,)``, values in ``[0, n_machines)``) minimising the total cost.

    ``cost=None`` is the linear cost of eq. (1); otherwise an increasing convex callable (or a cost name, see
    :func:`cost_function`). Keyword options are those of :func:`solve`: ``capacity=``, ``max_tasks=``, ``demands=``
    (Kubernetes hard limits), ``eps=``, ``juxtapose=``, ``type_names=``, ``dp=``, ``starts=``, ``seed=``,
    ``exact_limit=``.
    """
    allowed = {
        "capacity",
        "max_tasks",
        "demands",
        "eps",
        "juxtapose",
        "type_names",
        "dp",
        "starts",
        "seed",
        "exact_limit",
    }
    unknown = set(options) - allowed
    if unknown:
        raise ValueError(f"unknown option(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    return solve(sizes, types, alpha, n_machines, method=method, cost=cost, budget=budget, **options).assignment
