"""Prometheus metrics of Walras (prometheus-client), updated from a :class:`~walras.planner.model.Plan`.

All names carry the ``walras_`` prefix and follow Prometheus conventions (base units, ``_total`` for counters,
``_seconds`` for durations, ``_ratio`` for 0..1 values). Prices are in the pool's price unit per unit of the priced
resource (the dual variables ``p_j`` of the market-clearing problem, paper 004 Alg. 2); capacity and used are in the
pool's priced resource (GPUs, or CPU cores).

Labels: the per-job gauges (``walras_job_*``) name the FungibleJob with ``fungiblejob`` and its namespace with
``fungiblejob_namespace`` (the kube-state-metrics convention of one label per object kind, lower case), never ``job``
or ``namespace``: Prometheus attaches those two to every scraped series itself (the scrape job and the operator
pod's namespace), so exported ``job``/``namespace`` labels would be renamed ``exported_job``/``exported_namespace``
under the default ``honor_labels: false``. Setting ``honorLabels: true`` instead would let any label the operator
exports override target labels; the chosen names work with every scrape configuration (docs/design-choices.md).

Created series: :func:`prometheus_client.disable_created_metrics` is called on import, so counters and histograms
export no ``*_created`` series (one extra series per label set that no dashboard or alert reads).

Cardinality: the per-job gauges (``walras_job_*``) are exported for at most ``job_metrics_limit`` jobs, those with
the highest cost first (ties broken by namespace/name); ``walras_job_metrics_dropped`` counts the jobs left out.
Per-pool series are bounded by the number of ResourcePools.

:class:`WalrasMetrics` owns its own :class:`~prometheus_client.CollectorRegistry`, so several instances (tests, the
demo) never collide; :meth:`WalrasMetrics.update` sets every gauge from a plan without touching a cluster.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from walras.planner.model import Condition, JobPlan, Plan

__all__ = ["BINDING_ERROR_REASONS", "CONTENT_TYPE_LATEST", "EXTENDER_VERBS", "JOB_LABELS", "WalrasMetrics",
           "binding_reason", "is_invalid"]

disable_created_metrics()

#: Labels of the per-job series: the FungibleJob's namespace and name (see the module docstring).
JOB_LABELS = ("fungiblejob_namespace", "fungiblejob")

_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: The scheduler-extender verbs (kube-scheduler extender v1) whose request series are pre-created.
EXTENDER_VERBS = ("filter", "prioritize", "bind", "preempt")
_EXTENDER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
#: The values of ``reason`` on ``walras_binding_errors_total``: a fixed set (Kubernetes ``Status.reason`` names),
#: so the counter's cardinality is pools x 6 whatever the API server answers; see :func:`binding_reason`.
BINDING_ERROR_REASONS = ("Conflict", "TooManyRequests", "ServerError", "NotFound", "Invalid", "Other")
_REASON_BY_CODE = {409: "Conflict", 429: "TooManyRequests", 404: "NotFound", 400: "Invalid", 422: "Invalid"}
_REASON_BY_NAME = {
    "conflict": "Conflict", "alreadyexists": "Conflict", "toomanyrequests": "TooManyRequests",
    "notfound": "NotFound", "gone": "NotFound", "invalid": "Invalid", "badrequest": "Invalid",
    "unprocessableentity": "Invalid", "internalerror": "ServerError", "internalservererror": "ServerError",
    "serviceunavailable": "ServerError", "servertimeout": "ServerError", "timeout": "ServerError",
    "badgateway": "ServerError", "gatewaytimeout": "ServerError",
}


def binding_reason(reason: str | int | None) -> str:
    """Map an API error (a Kubernetes ``Status.reason`` such as ``Conflict``, an HTTP reason phrase such as
    ``Too Many Requests``, or an HTTP status code) to one of :data:`BINDING_ERROR_REASONS`."""
    if reason is None:
        return "Other"
    text = str(reason).strip()
    if text.isdigit():
        code = int(text)
        return _REASON_BY_CODE.get(code, "ServerError" if 500 <= code <= 599 else "Other")
    return _REASON_BY_NAME.get("".join(text.split()).lower(), "Other")


def is_invalid(phase: str | None, conditions: Iterable[Condition]) -> bool:
    """Whether an object is semantically invalid: phase ``Invalid`` or a ``Valid``/``Ready`` condition saying
    ``False`` with reason ``Invalid...``."""
    if phase == "Invalid":
        return True
    for cond in conditions:
        if cond.type == "Valid" and cond.status == "False":
            return True
        if cond.status == "False" and cond.reason.startswith("Invalid"):
            return True
    return False


class WalrasMetrics:
    """Every Walras metric in one registry; :meth:`update` refreshes the gauges from a plan."""

    def __init__(self, job_metrics_limit: int = 500, registry: CollectorRegistry | None = None) -> None:
        if job_metrics_limit < 0:
            raise ValueError(f"job_metrics_limit must be >= 0, got {job_metrics_limit}")
        self.job_metrics_limit = job_metrics_limit
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.pool_price = Gauge("walras_pool_price", "Market-clearing price of the pool's priced resource (004, p_j).",
                                ["pool", "resource"], registry=r)
        self.pool_capacity = Gauge("walras_pool_capacity", "Capacity of the pool in its priced resource.",
                                   ["pool", "resource"], registry=r)
        self.pool_used = Gauge("walras_pool_used", "Amount of the pool's priced resource allocated by the plan.",
                               ["pool", "resource"], registry=r)
        self.pool_utilisation = Gauge("walras_pool_utilisation_ratio", "Used over capacity of the pool (0..1).",
                                      ["pool"], registry=r)
        self.pool_nodes = Gauge("walras_pool_nodes", "Ready, schedulable nodes in the pool.", ["pool"], registry=r)
        self.pods_planned = Gauge("walras_pods_planned", "Pods the plan places in the pool.", ["pool"], registry=r)
        self.pods_pending = Gauge("walras_pods_pending", "Planned pods of the pool not bound to a node yet.",
                                  ["pool"], registry=r)
        self.pods_bound = Counter("walras_pods_bound", "Pods Walras bound to a node (direct mode or extender).",
                                  ["pool", "mode"], registry=r)
        self.binding_errors = Counter("walras_binding_errors", "Failed binding attempts.", ["pool", "reason"],
                                      registry=r)
        self.solver_gap = Gauge("walras_solver_duality_gap", "Duality gap of the last price-discovery solve.",
                                registry=r)
        self.solver_iterations = Gauge("walras_solver_iterations", "Iterations of the last price-discovery solve.",
                                       registry=r)
        self.solver_converged = Gauge("walras_solver_converged", "1 if the last solve converged, else 0.",
                                      registry=r)
        self.solver_duration = Histogram("walras_solver_duration_seconds", "Duration of the price-discovery solve.",
                                         buckets=_DURATION_BUCKETS, registry=r)
        self.solver_reused = Counter("walras_solver_reused",
                                     "Plans that took the previous plan's solve (equal inputs): no solve ran.",
                                     registry=r)
        self.plan_duration = Histogram("walras_plan_duration_seconds", "Duration of a whole planning pass.",
                                       buckets=_DURATION_BUCKETS, registry=r)
        self.plans = Counter("walras_plans", "Planning passes by result (ok, error).", ["result"], registry=r)
        self.extender_duration = Histogram("walras_extender_request_duration_seconds",
                                           "Scheduler-extender request duration by verb.", ["verb"],
                                           buckets=_EXTENDER_BUCKETS, registry=r)
        self.extender_requests = Counter("walras_extender_requests", "Scheduler-extender requests by verb and code.",
                                         ["verb", "code"], registry=r)
        self.job_throughput = Gauge("walras_job_throughput", "Expected throughput of the job (a_i^T x_i).",
                                    JOB_LABELS, registry=r)
        self.job_target = Gauge("walras_job_target_throughput", "Target throughput of a target-priority job.",
                                JOB_LABELS, registry=r)
        self.job_utility = Gauge("walras_job_utility", "Utility of the job at its allocation.", JOB_LABELS,
                                 registry=r)
        self.job_cost = Gauge("walras_job_cost", "Price the job pays at current prices (sum_j p_j d_ij x_ij).",
                              JOB_LABELS, registry=r)
        self.job_dropped = Gauge("walras_job_metrics_dropped",
                                 "Jobs left out of walras_job_* because of the cardinality limit.", registry=r)
        self.invalid_objects = Gauge("walras_invalid_objects", "Semantically invalid objects by kind.", ["kind"],
                                     registry=r)
        for result in ("ok", "error"):
            self.plans.labels(result=result)
        # Series exist from the start (at 0) so dashboards and rate() see every extender verb before its first
        # request: the duration histogram per verb and the request counter per verb with code 200.
        for verb in EXTENDER_VERBS:
            self.extender_duration.labels(verb=verb)
            self.extender_requests.labels(verb=verb, code="200")
        for kind in ("ResourcePool", "FungibleJob", "ColocationProfile"):
            self.invalid_objects.labels(kind=kind).set(0)
        self._pool_series: set[tuple[str, str]] = set()
        self._job_series: set[tuple[str, str]] = set()
        self.budgets = BudgetMetrics(r)  # walras_budget_* (docs/budgets.md), defined at the end of this module

    # ------------------------------------------------------------------ updates

    def update(self, plan: Plan) -> None:
        """Set every gauge from ``plan``; series of pools and jobs no longer in the plan are removed."""
        pools = set()
        for name, pool in plan.pools.items():
            pools.add((name, pool.resource))
            self.pool_price.labels(name, pool.resource).set(pool.price)
            self.pool_capacity.labels(name, pool.resource).set(pool.capacity)
            self.pool_used.labels(name, pool.resource).set(pool.used)
            self.pool_utilisation.labels(name).set(min(max(pool.utilisation, 0.0), 1.0))
            self.pool_nodes.labels(name).set(pool.node_count)
            for reason in BINDING_ERROR_REASONS:  # the counter's series exist (at 0) from the pool's first plan on
                self.binding_errors.labels(pool=name, reason=reason)
        planned: dict[str, int] = {name: 0 for name in plan.pools}
        pending: dict[str, int] = {name: 0 for name in plan.pools}
        for pod in plan.pods:
            if pod.action == "delete":
                continue
            planned[pod.pool] = planned.get(pod.pool, 0) + 1
            if pod.action in ("create", "bind"):
                pending[pod.pool] = pending.get(pod.pool, 0) + 1
        for name, count in planned.items():
            self.pods_planned.labels(name).set(count)
            self.pods_pending.labels(name).set(pending.get(name, 0))
        for name, resource in self._pool_series - pools:
            self._remove(self.pool_price, name, resource)
            self._remove(self.pool_capacity, name, resource)
            self._remove(self.pool_used, name, resource)
        gone_pools = {n for n, _ in self._pool_series} - {n for n, _ in pools}
        for name in gone_pools:
            for gauge in (self.pool_utilisation, self.pool_nodes, self.pods_planned, self.pods_pending):
                self._remove(gauge, name)
            for reason in BINDING_ERROR_REASONS:
                self._remove(self.binding_errors, name, reason)
        self._pool_series = pools

        solver = plan.solver
        self.solver_gap.set(solver.gap)
        self.solver_iterations.set(solver.iterations)
        self.solver_converged.set(1.0 if solver.converged else 0.0)
        if solver.reused:
            # no solve ran: the gauges above still describe the last solve; a 0 s duration would be a solve that
            # never happened in the histogram
            self.solver_reused.inc()
        else:
            self.solver_duration.observe(max(solver.seconds, 0.0))
        self.plan_duration.observe(max(plan.seconds, 0.0))

        ranked = sorted(plan.jobs.values(), key=lambda j: (-j.cost, j.namespace, j.name))
        kept = ranked[: self.job_metrics_limit]
        self.job_dropped.set(len(ranked) - len(kept))
        series = set()
        for job in kept:
            self._set_job(job)
            series.add(job.key)
        for ns, name in self._job_series - series:
            for gauge in (self.job_throughput, self.job_target, self.job_utility, self.job_cost):
                self._remove(gauge, ns, name)
        self._job_series = series

        invalid = {"ResourcePool": 0, "FungibleJob": 0, "ColocationProfile": 0}
        invalid["ResourcePool"] = sum(is_invalid(None, p.conditions) for p in plan.pools.values())
        invalid["FungibleJob"] = sum(is_invalid(j.phase, j.conditions) for j in plan.jobs.values())
        invalid["ColocationProfile"] = sum(is_invalid(None, conds) for conds in plan.profiles.values())
        for kind, count in invalid.items():
            self.invalid_objects.labels(kind=kind).set(count)
        self.budgets.update(plan)

    def _set_job(self, job: JobPlan) -> None:
        self.job_throughput.labels(job.namespace, job.name).set(job.throughput)
        self.job_utility.labels(job.namespace, job.name).set(job.utility)
        self.job_cost.labels(job.namespace, job.name).set(job.cost)
        if job.target is not None:
            self.job_target.labels(job.namespace, job.name).set(job.target)
        else:
            self._remove(self.job_target, job.namespace, job.name)

    @staticmethod
    def _remove(metric: Gauge | Counter, *labels: str) -> None:
        try:
            metric.remove(*labels)
        except KeyError:
            pass

    def plan_failed(self) -> None:
        """Count a planning pass that raised."""
        self.plans.labels(result="error").inc()

    def plan_succeeded(self, plan: Plan) -> None:
        """Count a successful planning pass and update every gauge from it."""
        self.plans.labels(result="ok").inc()
        self.update(plan)

    def bound(self, pool: str, mode: str) -> None:
        self.pods_bound.labels(pool=pool, mode=mode).inc()

    def binding_error(self, pool: str, reason: str | int | None) -> None:
        """Count a failed binding in ``pool``; ``reason`` is normalised by :func:`binding_reason`."""
        self.binding_errors.labels(pool=pool, reason=binding_reason(reason)).inc()

    def extender_request(self, verb: str, code: int, seconds: float) -> None:
        self.extender_duration.labels(verb=verb).observe(seconds)
        self.extender_requests.labels(verb=verb, code=str(code)).inc()

    def exposition(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


# ---------------------------------------------------------------------------------------------------- budgets


def _finite(value: float) -> float:
    """``value``, or 0 when it is NaN or infinite (no such sample is ever exported)."""
    return float(value) if math.isfinite(value) else 0.0


class BudgetMetrics:
    """``walras_budget_*`` (docs/budgets.md), one series per tenant (label ``budget``: the Budget's name, or
    ``namespace/<name>`` for a namespace no single Budget selects) and, per pool, per tenant and pool. Credits are
    the Budgets' currency (a share is credits per hour); units are the pool's priced resource (GPUs, CPU cores).
    Series of tenants (and pools) no longer in the plan are removed; with tenants off there are none."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.share = Gauge("walras_budget_share_credits_per_hour",
                           "The tenant's budget (Budget spec.share, or the default share), credits per hour.",
                           ["budget"], registry=r)
        self.spend_rate = Gauge("walras_budget_spend_rate_credits_per_hour",
                                "What the tenant's placed pods pay at the pools' prices, credits per hour.",
                                ["budget"], registry=r)
        self.spent = Gauge("walras_budget_spent_credits",
                           "Credits the tenant spent since its Budget was created (Budget status.spent).",
                           ["budget"], registry=r)
        self.units = Gauge("walras_budget_units", "Units of the pool's priced resource the tenant's pods hold.",
                           ["budget", "pool"], registry=r)
        self.pool_share = Gauge("walras_budget_pool_share_ratio",
                                "The tenant's units over the pool's capacity (0..1).", ["budget", "pool"], registry=r)
        self._tenants: set[str] = set()
        self._cells: set[tuple[str, str]] = set()

    def update(self, plan: Plan) -> None:
        """Set the gauges from ``plan.tenants``; remove the series of tenants and pools no longer there."""
        tenants, cells = set(), set()
        for name, tenant in plan.tenants.items():
            tenants.add(name)
            self.share.labels(name).set(_finite(tenant.share))
            self.spend_rate.labels(name).set(_finite(tenant.spend_rate))
            for pool_name, pool in plan.pools.items():
                cells.add((name, pool_name))
                held = _finite(tenant.units.get(pool_name, 0.0))
                self.units.labels(name, pool_name).set(held)
                ratio = held / pool.capacity if pool.capacity > 0 else 0.0
                self.pool_share.labels(name, pool_name).set(min(max(_finite(ratio), 0.0), 1.0))
        for name in self._tenants - tenants:
            for gauge in (self.share, self.spend_rate, self.spent):
                WalrasMetrics._remove(gauge, name)
        for cell in self._cells - cells:
            for gauge in (self.units, self.pool_share):
                WalrasMetrics._remove(gauge, *cell)
        self._tenants, self._cells = tenants, cells

    def spent_total(self, budget: str, credits: float) -> None:
        """Set a Budget's accumulated spend (what its status says, walras.operator.budgets)."""
        self.spent.labels(budget).set(_finite(credits))
