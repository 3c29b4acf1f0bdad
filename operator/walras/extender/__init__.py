"""The kube-scheduler extender: filter / prioritize / bind / preempt (extender API v1) from the current plan."""

from walras.extender.server import (
    DEFAULT_HOST,
    MAX_EXTENDER_PRIORITY,
    RUNNER_OPTIONS,
    Binder,
    Decision,
    Extender,
    LeaderCheck,
    Limits,
    PlanIndex,
    PlanSource,
    server_tls,
    start_site,
)
from walras.extender.wire import MAX_BODY_BYTES, BadRequest, BodyTimeout, BodyTooLarge, RequestError

__all__ = ["DEFAULT_HOST", "MAX_BODY_BYTES", "MAX_EXTENDER_PRIORITY", "RUNNER_OPTIONS", "BadRequest", "Binder",
           "BodyTimeout", "BodyTooLarge", "Decision", "Extender", "LeaderCheck", "Limits", "PlanIndex", "PlanSource",
           "RequestError", "server_tls", "start_site"]
