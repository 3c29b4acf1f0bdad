"""The exact reference of issue 33 (integral placement): generated clusters of the issue's shape
(:mod:`.clusters`), the exact integral optimum as a HiGHS MILP written from the model, independently of the planner
(:mod:`.placement_milp`), and the issue's measures of a plan against it (:mod:`.metrics`).

API: ``generate(seed) -> Instance``, ``optimum(instance, time_limit=...) -> Reference``, ``evaluate(instance, plan,
reference=None) -> Metrics`` (the optimum computed when not given). Shared by tests/test_placement_reference.py,
tests/test_placement_quality.py and ``python -m bench.placement``.
"""

from tests.reference.clusters import Instance, applied, from_snapshot, generate, snapshot, tiny
from tests.reference.metrics import Metrics, evaluate, fixed_point_actions
from tests.reference.placement_milp import Reference, lexicographic, optimum, throughputs

__all__ = ["Instance", "Metrics", "Reference", "applied", "evaluate", "fixed_point_actions", "from_snapshot",
           "generate", "lexicographic", "optimum", "snapshot", "throughputs", "tiny"]
