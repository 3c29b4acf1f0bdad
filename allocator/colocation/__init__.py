"""Colocation with side effects (paper 001: Pascual & Rzadca, *Colocating tasks in data centers using a side-effects
performance model*).

Model (Sec. 2)
--------------
``n`` tasks with sizes ``p_i >= 0`` and types ``t_i in {0..T-1}`` go onto ``m`` identical machines. The interference
matrix ``alpha[t, u] >= 0`` is the impact of a unit of load of type ``t`` on a task of type ``u`` (row = influencer,
column = victim; not symmetric). A task's cost is eq. (1)::

    c_i = sum_{j on i's machine (i included)} p_j * alpha[t_j, t_i]

and the objective is ``C(P) = sum_i c_i``. Per machine ``k`` with per-type loads ``L[k, t]`` and counts ``N[k, t]``
this is ``sum_k L[k] @ alpha @ N[k]``. With a convex cost (Sec. 7) a task costs ``f(c_i)`` for an increasing convex
``f``; for one type with ``alpha = 1`` this is the paper's ``f(L_M)``.

Algorithms (``method=`` of :func:`partition` / :func:`solve`)
------------------------------------------------------------
``"bestors"``            Sec. 5 / 6.4: the single-type DP of eqs. (5)-(6) on all tasks (types ignored); exact for
                         one type, ``alpha_max/alpha_min``-approximate in general (Prop. 6.4), ``Delta``-approximate
                         for convex costs (Prop. 7.3). Two exact DP engines: ``"quadratic"`` (eq. (5) as written,
                         O(n^2 m)) and ``"dc"`` (default): the segment cost ``w(j, x) = (x - j)(S_x - S_j)`` satisfies
                         the quadrangle inequality (``w(a,d) + w(b,c) - w(a,c) - w(b,d) = |A| W_C + |C| W_A >= 0``),
                         so optimal split points are monotone and divide-and-conquer gives O(m n log n).
``"independent"``        Sec. 6: ``alpha`` diagonal; BestOrS separately for every type (exact).
``"equivalent"``         Sec. 6: all ``alpha`` equal; BestOrS once (exact).
``"large-influences"``   Sec. 6: types never share machines; enumerate the ``C(m-1, T-1)`` configurations
                         (machines per type) over per-type BestOrS tables (exact when the condition holds).
``"dynsize"``            Sec. 6.1, eqs. (7)-(8): DP over per-(type, size) counts; exact, also for convex costs.
``"approx"``             Sec. 6.2, ApproxScheme(eps): round sizes up to powers of ``1 + eps``, run DynSize;
                         ``(1 + eps)``-approximate for linear costs (Prop. 6.2).
``"cutjuxtapose"``       Sec. 6.3: all OrS partitions (cuts per type x juxtapositions); exact for linear costs
                         (Prop. 6.3) when it finishes within ``budget`` evaluations, best-so-far otherwise. For two
                         types the juxtaposition can be a min-cost bipartite matching (``juxtapose="matching"``).
``"bestors+hill"``, ``"one+hill"``, ``"dedic+hill"``
                         Sec. 8.1.1: best-improvement hill climbing over the four OrS-preserving moves, started from
                         BestOrS, from all tasks on one machine, or from type ``t`` on machine ``t mod m``.
``"exact"``              Not in the paper: DynSize's recursion with one layer per machine on (type, size, demand)
                         classes (:mod:`._exact`); exact for every cost and under hard limits, exponential in the
                         number of classes.
``"search"``             Not in the paper: multi-start local search with moves and swaps between any two machines and
                         zero-gain plateau steps with a tabu list (:mod:`._search`); HILL stops where no single OrS
                         move strictly improves, up to 2x the optimum on small instances (docs/bench/colocation.md).
``"auto"`` (default)     Route table of :func:`solve`: the exact DP when it needs at most ``exact_limit`` transitions
                         (result ``status="certified"``), else the search (linear and ``x**k`` costs) or HILL (other
                         convex callables), both ``"heuristic"``; ``ColocationResult.route`` says which.

:func:`rearrange` (not a ``method=``): HILL's best-improvement moves (Sec. 8.1.1) of a few movable tasks among fixed
ones from a feasible start, every single-task move a candidate, under per-task request vectors, free room and pod
slots per machine (:mod:`._arrange`); the planner's integral fill arranges its replicas in a colocation pool with it.

:func:`lower_bound` is Sec. 8.1.3. Convex costs: Lemma 4.1 (OrS dominance) is proved for linear costs only and fails
for convex ones (sizes 5, 4, 3, 2 on two machines with ``f(x) = x^2``: the optimum {5, 2}, {4, 3} is not OrS), so
CutJuxtapose and HILL are heuristics there; DynSize stays exact.

Kubernetes hard limits (not in the paper)
-----------------------------------------
The methods in :data:`LIMITS_METHODS` accept ``capacity=`` (allocatable capacity per machine, in the units of
``demands=``, which defaults to ``sizes``) and ``max_tasks=`` (max pods per node), each a scalar or a per-machine
array. See :func:`solve` for what they do to the guarantees.
"""

from __future__ import annotations

from ._arrange import Arrangement, rearrange
from ._bestors import OrSTable, bestors_table, lower_bound
from ._gavel import GavelInterference, gavel_alpha
from ._model import InfeasibleError, PowerCost, cost_function, machine_costs, machine_loads, total_cost
from ._solve import LIMITS_METHODS, METHODS, ROUTES, ColocationResult, partition, solve
from ._special import large_influence_condition

__all__ = [
    "LIMITS_METHODS",
    "METHODS",
    "ROUTES",
    "Arrangement",
    "ColocationResult",
    "GavelInterference",
    "InfeasibleError",
    "OrSTable",
    "PowerCost",
    "bestors_table",
    "cost_function",
    "gavel_alpha",
    "large_influence_condition",
    "lower_bound",
    "machine_costs",
    "machine_loads",
    "partition",
    "rearrange",
    "solve",
    "total_cost",
]
