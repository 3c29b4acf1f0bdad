"""The planner: a pure function from a cluster snapshot to a plan (no Kubernetes client, no I/O)."""

from walras.planner.manifests import load_manifests
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
    "load_manifests",
]
