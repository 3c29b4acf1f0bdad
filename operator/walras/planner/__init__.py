"""The planner: a pure function from a cluster snapshot to a plan (no Kubernetes client, no I/O)."""

from walras.planner.model import (
    Condition,
    JobPlan,
    Plan,
    PlanEvent,
    PodPlan,
    PoolPlan,
    SolverStats,
    Snapshot,
)

__all__ = ["Condition", "JobPlan", "Plan", "PlanEvent", "PodPlan", "PoolPlan", "Snapshot", "SolverStats"]
