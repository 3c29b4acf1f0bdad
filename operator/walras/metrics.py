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

Cardinality: the per-job gauges (``walras_job_*``; ``walras_job_replicas`` and ``walras_job_allocation_ratio`` also
per pool the job uses) are exported for at most ``job_metrics_limit`` jobs, those with the highest cost first (ties
broken by namespace/name); ``walras_job_metrics_dropped`` counts the jobs left out. Per-pool series are bounded by
the number of ResourcePools; ``walras_jobs_pending`` and ``walras_replicas_waiting`` have one series per reason of
:data:`WAITING_REASONS` (a fixed set).

No sample is ever ``-Inf``, ``+Inf`` or ``NaN``: a per-job value that is not finite (the log utility of a job that
runs nothing) is left out (its series removed), the others are finite by construction.

``walras_build_info{version, python}`` is 1 while the operator runs (the alert on a missing operator reads it, not a
scrape-job label).

:class:`WalrasMetrics` owns its own :class:`~prometheus_client.CollectorRegistry`, so several instances (tests, the
demo) never collide; :meth:`WalrasMetrics.update` sets every gauge from a plan without touching a cluster.
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from walras import __version__
from walras.planner.model import REASONS, Condition, JobPlan, Plan

__all__ = ["BINDING_ERROR_REASONS", "CONTENT_TYPE_LATEST", "EXTENDER_VERBS", "JOB_LABELS", "WalrasMetrics",
           "binding_reason", "is_invalid"]

disable_created_metrics()

#: Labels of the per-job series: the FungibleJob's namespace and name (see the module docstring).
JOB_LABELS = ("fungiblejob_namespace", "fungiblejob")

#: Buckets of ``walras_job_wait_seconds`` (creation to the first pod Running): 10 s to a day.
_WAIT_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)
#: Values of ``reason`` on ``walras_jobs_pending`` and ``walras_replicas_waiting``: the blocking rules
#: (:data:`walras.planner.status.REASONS`), ``NoAllocation`` (nothing measured blocks it: the market gives it
#: nothing) and ``Starting`` (granted and placed, its pods not Running yet). Every series exists from the start.
WAITING_REASONS = (*REASONS, "NoAllocation", "Starting")
#: Values of ``kind`` on ``walras_pod_disruptions_total``: a running pod evicted (rebalancing, through the Eviction
#: API), deleted to give its place to others (the market shrank the job), or force-deleted on a lost node.
DISRUPTION_KINDS = ("eviction", "preemption", "node_lost")
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


#: The values of ``reason`` on ``walras_pod_creations_refused_total`` (docs/refusals.md): what admission refused a
#: pod creation for, a fixed set read from the API server's answer (:func:`refusal_reason`).
REFUSAL_REASONS = ("PodSecurity", "ResourceQuota", "Webhook", "Invalid", "Other")


def refusal_reason(code: int, message: str) -> str:
    """Which admission refused a pod creation, from the API server's HTTP status ``code`` and ``message``: Pod
    Security admission (403 ``violates PodSecurity``), the ResourceQuota admission (403 ``exceeded quota``, or
    ``failed quota`` when a quota needs a request the pod lacks), an
    admission webhook (``admission webhook "..." denied the request``), the API server's validation (422 ``Invalid``)
    or another 400/403 (:data:`REFUSAL_REASONS`)."""
    if "violates PodSecurity" in message:
        return "PodSecurity"
    if "exceeded quota" in message or "failed quota" in message:
        return "ResourceQuota"
    if "admission webhook" in message:
        return "Webhook"
    if code == 422:
        return "Invalid"
    return "Other"


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
        self.build_info = Gauge("walras_build_info", "Always 1: the version of the running Walras and its Python.",
                                ["version", "python"], registry=r)
        self.build_info.labels(version=__version__, python=platform.python_version()).set(1)
        self.solver_eps = Gauge("walras_solver_duality_gap_tolerance",
                                "The duality gap the last solve was judged converged against (its eps).", registry=r)
        self.jobs_pending = Gauge("walras_jobs_pending",
                                  "Jobs with no pod Running (phase Pending or Unschedulable), by why they wait.",
                                  ["reason"], registry=r)
        self.replicas_waiting = Gauge("walras_replicas_waiting",
                                      "Replicas of all jobs not placed (spec.replicas.count less placed), by why.",
                                      ["reason"], registry=r)
        self.job_wait = Histogram("walras_job_wait_seconds",
                                  "Time from a job's creation to its first pod Running (each job counted once).",
                                  buckets=_WAIT_BUCKETS, registry=r)
        self.disruptions = Counter("walras_pod_disruptions",
                                   "Running pods taken away: evicted, preempted (deleted as a job shrank), lost.",
                                   ["pool", "kind"], registry=r)
        self.creations_refused = Counter(
            "walras_pod_creations_refused",
            "Pod creations the API server refused (Pod Security, ResourceQuota, a webhook: docs/refusals.md), by job "
            "and which admission refused them; a job's series go when it leaves the plan.",
            [*JOB_LABELS, "reason"], registry=r)
        self._refused_series: set[tuple[str, str, str]] = set()
        self.job_replicas = Gauge("walras_job_replicas", "Replicas of the job placed in the pool.",
                                  [*JOB_LABELS, "pool"], registry=r)
        self.job_allocation = Gauge("walras_job_allocation_ratio",
                                    "The job's priced share of the pool's time (004 x_ij, 0..1).",
                                    [*JOB_LABELS, "pool"], registry=r)
        self.job_pending_since = Gauge(
            "walras_job_pending_since_timestamp_seconds",
            "When a job with no pod Running began to wait (its creation if it never ran, else when this operator "
            "first saw it pending), by why it waits; at most job_metrics_limit jobs, the longest waiting first.",
            [*JOB_LABELS, "reason"], registry=r)
        self._pending_since: dict[tuple[str, str], float] = {}
        self._pending_series: set[tuple[str, str, str]] = set()
        for reason in WAITING_REASONS:
            self.jobs_pending.labels(reason=reason).set(0)
            self.replicas_waiting.labels(reason=reason).set(0)
        self._waited: set[tuple[str, str, float]] = set()
        self._disrupted: set[tuple[str, str]] = set()
        self._job_pool_series: set[tuple[str, str, str]] = set()
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
        self.queue = QueueMetrics(r, job_metrics_limit)  # walras_job_queue_position (docs/preemption.md)

    # ------------------------------------------------------------------ updates

    def update(self, plan: Plan, now: float | None = None) -> None:
        """Set every gauge from ``plan``; series of pools and jobs no longer in the plan are removed. ``now``
        (epoch seconds, default the clock) dates a job first seen pending that ran before."""
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
            for kind in DISRUPTION_KINDS:
                self.disruptions.labels(pool=name, kind=kind)
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
            for kind in DISRUPTION_KINDS:
                self._remove(self.disruptions, name, kind)
        self._pool_series = pools

        solver = plan.solver
        self.solver_gap.set(solver.gap)
        self.solver_iterations.set(solver.iterations)
        self.solver_converged.set(1.0 if solver.converged else 0.0)
        self.solver_eps.set(solver.eps if math.isfinite(solver.eps) else 0.0)
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
        per_pool = {(job.namespace, job.name, at) for job in kept for at in {*job.replicas, *job.allocation}}
        for job in kept:
            for at in {*job.replicas, *job.allocation}:
                self.job_replicas.labels(job.namespace, job.name, at).set(job.replicas.get(at, 0))
                self.job_allocation.labels(job.namespace, job.name, at).set(
                    min(max(job.allocation.get(at, 0.0), 0.0), 1.0))
        for labels in self._job_pool_series - per_pool:
            self._remove(self.job_replicas, *labels)
            self._remove(self.job_allocation, *labels)
        self._job_pool_series = per_pool
        for labels in [k for k in self._refused_series if (k[0], k[1]) not in plan.jobs]:
            self._remove(self.creations_refused, *labels)
            self._refused_series.discard(labels)
        self._update_waiting(plan)
        self._update_pending_since(plan, time.time() if now is None else now)

        invalid = {"ResourcePool": 0, "FungibleJob": 0, "ColocationProfile": 0}
        invalid["ResourcePool"] = sum(is_invalid(None, p.conditions) for p in plan.pools.values())
        invalid["FungibleJob"] = sum(is_invalid(j.phase, j.conditions) for j in plan.jobs.values())
        invalid["ColocationProfile"] = sum(is_invalid(None, conds) for conds in plan.profiles.values())
        for kind, count in invalid.items():
            self.invalid_objects.labels(kind=kind).set(count)
        self.budgets.update(plan)
        self.queue.update(plan)

    def _update_pending_since(self, plan: Plan, now: float) -> None:
        """``walras_job_pending_since_timestamp_seconds`` of the jobs with no pod Running (see its help)."""
        since: dict[tuple[str, str], float] = {}
        reasons: dict[tuple[str, str], str] = {}
        for job in plan.jobs.values():
            if job.phase not in ("Pending", "Unschedulable") or not job.count:
                continue
            was = self._pending_since.get(job.key)
            if was is None:
                was = job.created if job.created is not None and job.first_running is None else now
            since[job.key] = min(was, now)
            reasons[job.key] = job.reason if job.reason in WAITING_REASONS else (
                "Starting" if not job.reason else "NoAllocation")
        self._pending_since = since
        kept = sorted(since, key=lambda k: (since[k], k))[: self.job_metrics_limit]
        series = {(ns, name, reasons[(ns, name)]) for ns, name in kept}
        for labels in self._pending_series - series:
            self._remove(self.job_pending_since, *labels)
        for ns, name, reason in series:
            self.job_pending_since.labels(ns, name, reason).set(since[(ns, name)])
        self._pending_series = series

    def _update_waiting(self, plan: Plan) -> None:
        """The waiting gauges (every job counts, whatever the cardinality limit), the wait-time histogram (a job's
        creation to its first pod Running, once per job) and the disruptions counter (once per pod)."""
        pending = dict.fromkeys(WAITING_REASONS, 0)
        waiting = dict.fromkeys(WAITING_REASONS, 0)
        seen: set[tuple[str, str, float]] = set()
        for job in plan.jobs.values():
            if job.phase in ("Invalid", "Complete", "Failed", "Suspended"):
                continue
            reason = job.reason if job.reason in pending else ("Starting" if not job.reason and job.count else
                                                               "NoAllocation")
            if job.phase in ("Pending", "Unschedulable") and job.count:
                pending[reason] += 1
            short = job.count - sum(job.replicas.values())
            if short > 0:
                waiting[reason if job.reason else "NoAllocation"] += short
            elif job.running < job.count and job.count:
                waiting["Starting"] += job.count - job.running
            if job.created is not None and job.first_running is not None:
                once = (job.namespace, job.name, job.created)
                seen.add(once)
                if once not in self._waited:
                    self.job_wait.observe(max(job.first_running - job.created, 0.0))
        self._waited = seen
        for reason in WAITING_REASONS:
            self.jobs_pending.labels(reason=reason).set(pending[reason])
            self.replicas_waiting.labels(reason=reason).set(waiting[reason])
        disrupted: set[tuple[str, str]] = set()
        for pod in plan.pods:
            if pod.action == "evict":
                kind = "eviction"
            elif pod.action == "delete" and pod.exists and pod.node is not None:
                kind = "node_lost" if pod.reason.startswith("NodeLost") else "preemption"
            else:
                continue
            pod_key = (pod.namespace, pod.name)
            disrupted.add(pod_key)
            if pod_key not in self._disrupted and pod.pool in plan.pools:
                self.disruptions.labels(pool=pod.pool, kind=kind).inc()
        self._disrupted = disrupted

    def _set_job(self, job: JobPlan) -> None:
        """The job's gauges; a value that is not finite (the utility of a job that runs nothing: the log of 0) is no
        sample at all (its series is removed), so that no -Inf or NaN is ever exported."""
        labels = (job.namespace, job.name)
        for gauge, value in ((self.job_throughput, job.throughput), (self.job_utility, job.utility),
                             (self.job_cost, job.cost), (self.job_target, job.target)):
            if value is not None and math.isfinite(value):
                gauge.labels(*labels).set(value)
            else:
                self._remove(gauge, *labels)

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

    def creation_refused(self, namespace: str, job: str, code: int, message: str) -> None:
        """Count a pod creation of job ``namespace/job`` that the API server refused (:func:`refusal_reason`)."""
        labels = (namespace, job, refusal_reason(code, message))
        self.creations_refused.labels(*labels).inc()
        self._refused_series.add(labels)

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


class QueueMetrics:
    """``walras_job_queue_position`` (docs/preemption.md): each waiting job's place in the queue (1 first; the order
    of :mod:`walras.planner.queue`: PriorityClass priority, weight, bid, age), for the first ``limit`` positions
    (the cardinality bound of the per-job gauges); the series of a job that no longer waits is removed."""

    def __init__(self, registry: CollectorRegistry, limit: int) -> None:
        self.limit = limit
        self.position = Gauge("walras_job_queue_position",
                              "The waiting job's place in the queue (1 first: PriorityClass priority, then weight, "
                              "then bid, then age); only jobs with fewer replicas placed than they ask for.",
                              JOB_LABELS, registry=registry)
        self._series: set[tuple[str, str]] = set()

    def update(self, plan: Plan) -> None:
        """Set the positions of ``plan``'s waiting jobs; remove the others' series."""
        series = set()
        for job in plan.jobs.values():
            if job.queue_position is not None and job.queue_position <= self.limit:
                series.add(job.key)
                self.position.labels(job.namespace, job.name).set(job.queue_position)
        for key in self._series - series:
            WalrasMetrics._remove(self.position, *key)
        self._series = series
