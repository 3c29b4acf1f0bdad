"""The planner: a pure function from a cluster snapshot to a plan (no Kubernetes client, no I/O).

``build_plan`` is imported on first use (PEP 562): it brings the market, numpy, the compiled kernels and the
placement policies (about 0.5 s), while the model does not, so the manifest reader (:mod:`walras.manifests`, which
the planner never imports) loads without them (``walras plan`` starts reading its manifests in a child process
while the parent imports the planner, see :class:`walras.cli.plan.ReadAhead`). On a CPU machine neither imports
torch (:mod:`allocator.pricing`'s route table).
"""

from typing import TYPE_CHECKING, Any

from walras.planner.model import (
    Condition,
    JobPlan,
    Plan,
    PlanEvent,
    PodPlan,
    PoolPlan,
    Snapshot,
    SolverStats,
)

if TYPE_CHECKING:
    from walras.planner.plan import build_plan

__all__ = [
    "Condition",
    "JobPlan",
    "Plan",
    "PlanEvent",
    "PodPlan",
    "PoolPlan",
    "Snapshot",
    "SolverStats",
    "build_plan",
]


def __getattr__(name: str) -> Any:
    if name == "build_plan":
        from walras.planner.plan import build_plan

        return build_plan
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
