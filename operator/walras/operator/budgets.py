"""The Budget status writer (docs/budgets.md): each Budget's units per pool, spend rate and accumulated spend, and its
conditions, from a plan's :class:`~walras.planner.model.TenantPlan`.

**Accumulated spend survives a restart.** The status keeps the three numbers it needs: ``spent`` (credits since
the Budget was created), ``spendRate`` (credits per hour, in effect since) and ``spentUpdated`` (when ``spent`` was
last brought up to date). Each write first brings ``spent`` up to date with the rate the status *reported*:

    spent(now) = spent + spendRate * max(0, now - spentUpdated) / 3600                                   (T5)

and then reports the plan's new rate from ``now``. Nothing is kept in the operator's memory that a restart could
lose: a new operator reads the three numbers back (:func:`walras.kube.decode.budget_from`) and continues; ``spent``
never decreases (the rate is >= 0 and the elapsed time is clamped at 0, so a clock that steps back adds nothing).
The writer does remember its own last write per Budget (with the object's resourceVersion), so that a plan made
before the watch shows that write integrates from it and not from the older status.

**An unchanged cluster writes nothing**: a Budget's status is written when anything but the spend's bookkeeping
(``spent``, ``spentText``, ``spentUpdated``) differs (its units, rate, namespaces, conditions, generation), or when
it was never written; never because time passed (issue 32: a quiet cluster's Budgets were rewritten every 300 s).
Between writes the total is exact all the same: (T5) integrates the constant rate in effect since the last write,
and ``walras_budget_spent_credits`` exports it at every plan. ``BudgetWriter.refresh`` (seconds, None by default:
never) brings an unchanged status's total up to date after that long, for a caller that wants it.

With tenants off (``PlanOptions.tenants=None``: a plan without tenants) no Budget status is written.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from walras.kube.client import KubeClient
from walras.kube.decode import budget_from
from walras.kube.encode import conditions_body, stamp_conditions, status_patch
from walras.kube.errors import NotFound
from walras.metrics import BudgetMetrics
from walras.planner.cluster import Budget, BudgetReported
from walras.planner.model import API_VERSION, Condition, Plan, Snapshot, TenantPlan

__all__ = ["BOOKKEEPING", "BudgetWriter", "accrued", "budget_status"]

JSON = dict[str, Any]

#: The status keys that change with time alone (not a reason to write before ``REFRESH``).
BOOKKEEPING = ("spent", "spentText", "spentUpdated")


def accrued(reported: BudgetReported, now: float) -> float:
    """(T5): the credits spent up to ``now``, from what the status reported (its total, its rate, their time)."""
    if reported.updated is None:
        return reported.spent
    return reported.spent + reported.rate * max(0.0, now - reported.updated) / 3600.0


def _time(epoch: float) -> str:
    """RFC 3339 with microseconds, as ``spentUpdated`` is written (read back by :func:`decode.timestamp`)."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def budget_status(budget: Budget, tenant: TenantPlan | None, now: float) -> JSON:
    """The ``status`` of ``budget`` at ``now`` for the plan's ``tenant`` (None: the Budget is invalid): units per
    pool, the spend rate of the placed pods, the spend accrued by (T5) and the conditions."""
    spent = accrued(budget.reported, now)
    if tenant is None:
        reason = budget.error or "not planned"
        units: Mapping[str, float] = {}
        rate = 0.0
        namespaces: tuple[str, ...] = ()
        conditions: tuple[Condition, ...] = (Condition("Valid", "False", "InvalidSpec", reason),)
    else:
        units, rate, namespaces, conditions = tenant.units, tenant.spend_rate, tenant.namespaces, tenant.conditions
    out: JSON = {
        "units": {k: float(v) for k, v in units.items()},
        "unitsText": ",".join(f"{k}={v:.4g}" for k, v in units.items()),
        "spendRate": float(rate),
        "spendRateText": f"{rate:.4g}",
        "spent": float(spent),
        "spentText": f"{spent:.4g}",
        "spentUpdated": _time(now),
        "namespaces": list(namespaces),
        "conditions": conditions_body(conditions),
    }
    if budget.generation is not None:
        out["observedGeneration"] = budget.generation
    return out


def _without(status: Mapping[str, Any] | None) -> JSON:
    return {k: v for k, v in (status or {}).items() if k not in BOOKKEEPING}


@dataclass
class BudgetWriter:
    """Writes each Budget's status (module docstring) as a merge patch on ``budgets/status``."""

    client: KubeClient
    #: seconds after which an unchanged status's ``spent`` is written anyway; None (the default): never, so a plan of
    #: an unchanged cluster writes nothing
    refresh: float | None = None
    #: where each Budget's accrued spend is exported (``walras_budget_spent_credits``), when given
    metrics: BudgetMetrics | None = None
    #: Budget name -> (the object's resourceVersion when we wrote, the status we wrote)
    _written: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    def status_calls(self, plan: Plan, snapshot: Snapshot, now: float) -> Iterable[Awaitable[None]]:
        """The status writes of ``plan`` at ``now`` for the Budgets of ``snapshot`` (none with tenants off)."""
        if not plan.tenants:
            return
        for obj in snapshot.budgets:
            meta = obj.get("metadata") or {}
            name = str(meta.get("name") or "")
            current = obj.get("status")
            written = self._written.get(name)
            if written is not None and written[0] == meta.get("resourceVersion"):
                current = written[1]  # our last write is newer than the watched object
            budget = budget_from({**obj, "status": current or {}})
            tenant = plan.tenants.get(name) if budget.spec is not None else None
            if tenant is not None and tenant.budget != name:
                tenant = None
            desired = stamp_conditions(current, budget_status(budget, tenant, now), budget.generation)
            if self.metrics is not None and tenant is not None:
                self.metrics.spent_total(name, desired["spent"])
            fresh = budget.reported.updated is not None and (
                self.refresh is None or now - budget.reported.updated < self.refresh)
            if fresh and status_patch(_without(current), _without(desired)) is None:
                continue
            patch = status_patch(current, desired)
            if patch is not None:
                yield self._write(name, meta.get("resourceVersion"), patch)

    async def _write(self, name: str, version: Any, patch: JSON) -> None:
        try:
            result = await self.client.patch_status(f"/apis/{API_VERSION}/budgets/{name}", patch)
        except NotFound:
            return
        self._written[name] = (version, result.get("status"))
