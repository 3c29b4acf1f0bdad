"""The queue of waiting jobs (docs/preemption.md): one documented order, shared by the status phase (each waiting
job's ``status.queuePosition``, :func:`walras.planner.status.job_statuses`) and the preemption phase (which waiting
job is served first, :mod:`.preemption`).

A job waits while it has fewer replicas placed than it asks for. Waiting jobs are ordered by

1. priority (``Job.priority``, its PriorityClass's value; high first): Kubernetes' PriorityClass order comes before
   the market;
2. ``spec.weight`` (high first), the market's own weight of the job's utility (004 Sec. 2: ``w_i u_i``);
3. bid (high first): the job's largest bid per unit of a priced resource, ``u_i'(t_i) a_ij / (N_i d_i)``, what the
   market compares with the price ``p_j`` (004 Sec. 2.2: at the equilibrium ``u_i'(t_i) a_ij <= p_j N_i d_i``); an
   unbounded bid (a log or power utility with nothing placed) comes first;
4. age (``metadata.creationTimestamp``, the oldest first; a job without one last), then namespace and name.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["QUEUE_ORDER", "queue_key"]

#: The queue order in words (``walras explain`` and the docs say it).
QUEUE_ORDER = "priority (PriorityClass, high first), then spec.weight, then bid (high first), then age (oldest first)"


def queue_key(priority: int, weight: float, bids: Iterable[float | None], created: float | None, namespace: str,
              name: str) -> tuple[float, float, float, float, str, str]:
    """The sort key of one waiting job in the order of the module docstring (smaller first); ``bids`` are its
    per-unit bids (None: unbounded)."""
    best = max((math.inf if b is None else float(b) for b in bids), default=0.0)
    if math.isnan(best):
        best = 0.0
    return (-float(priority), -float(weight), -best, created if created is not None else math.inf, namespace, name)
