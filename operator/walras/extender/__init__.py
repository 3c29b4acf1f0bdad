"""The kube-scheduler extender: filter / prioritize / bind / preempt (extender API v1 JSON) from the current plan."""

from walras.extender.server import MAX_EXTENDER_PRIORITY, BadRequest, Binder, Extender, PlanIndex, PlanSource

__all__ = ["MAX_EXTENDER_PRIORITY", "BadRequest", "Binder", "Extender", "PlanIndex", "PlanSource"]
