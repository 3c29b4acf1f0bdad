"""``build_plan(cluster, previous, cache=...) -> Plan``: the planning pass, as named phases (kube-scheduler's
framework over a Kueue-style snapshot). Each phase is a module with one entry function, testable alone:

====================  ===============================================================================================
decode (caller)       raw API objects -> the typed :class:`~.cluster.Cluster` (:mod:`walras.kube.decode`; the caller
                      runs it before ``build_plan``, with its own :class:`~walras.kube.decode.TranslationCache`)
lifecycle (pre)       lost pods force-deleted; each job's state over time (complete, failed pods and their
                      backoff, backoff limit, suspended) as the replicas the market may plan (:mod:`.lifecycle`)
admission             ResourceQuotas and the API server's refusals cap each job's replicas (:mod:`.quota`)
capacity              per-node allocatable and requested vectors over every resource, nominated pods reserved
                      (:mod:`.capacity`)
objects               valid profiles, pools (their nodes) and jobs (their pools) (:mod:`.objects`)
observe               each job's running and pending pods per pool; pods no job wants (:mod:`.observe`)
resize                running pods whose planned requests changed (:mod:`.resize`)
market/replicas/      prices and time fractions, integral replicas, pods on nodes, re-priced while placement cannot
placement             realise the market's allocation (:mod:`.rounds`, :mod:`.market`, :mod:`.replicas`,
                      :mod:`.placement`, :mod:`.policies`)
reconcile             desired vs observed -> pod actions, within the churn budget (:mod:`.reconcile`)
migration             running pods of opted-in jobs moved towards the market's split when the utility gain pays,
                      within the churn budgets (:mod:`.migration`)
preemption            waiting jobs in the queue's order take running pods (through the Eviction API) or this plan's
                      new pods by the pools' preemption rules, within their budgets (:mod:`.preemption`)
gang                  a gang job keeps, binds or creates 0 or N pods, never 0 < k < N: else it is released
                      whole (:mod:`.gang`)
status                job and pool statuses and events from what was placed (:mod:`.status`)
lifecycle (post)      phases Complete/Failed/Suspended, failure and migration counters, the lifecycle's deletions
                      (:mod:`.lifecycle`)
====================  ===============================================================================================

Time enters only through ``PlanOptions.now`` (docs/lifecycle.md). Pure and deterministic: no I/O, no process-global
state (the market restores any torch setting it touches), objects in name order, ties broken by index. ``previous``
warm-starts the prices and carries the jobs' counters; the caller's :class:`~.reuse.PlanCache` lends each phase's
recorded result to the phase whose inputs are unchanged, the per-pool placement proposals to pools whose request is
unchanged (:mod:`.placement`) and the kept pods' plans (:mod:`.reconcile`) (:mod:`.reuse`; the reuse table of
docs/planner.md). The phases read a :class:`~.results.PlanContext` and return their results
(:mod:`.results`) with the conditions and events they raised; ``build_plan`` assembles the plan from them (the
events in the order the phases ran, each phase's in the order it raised them).

**One job's numbers never stop the plan** (issue 30 item 7). Values the schema and the decoder admit can still make
a solver raise (a ``power`` utility with exponent -100 at a throughput of 1e-9 overflows a float). When a plan raises
an arithmetic error (:data:`SOLVER_ERRORS`), :func:`build_plan` finds the jobs whose presence makes it fail, by
bisection over the valid jobs (each trial a plan without reuse of the cluster with only some jobs; a failure that
appears only with several jobs together isolates the smallest group found), plans the cluster again with those
jobs made invalid (their pods frozen, as for any invalid spec: kept as they are, counted on their nodes) and gives
each the condition ``Valid=False`` with reason ``SolverFailed`` and the solver's error. The other jobs' plan is the
plan of the cluster with the failing jobs invalid. An error no job explains is raised as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from operator import attrgetter

import numpy as np

from walras.planner.assume import overlay
from walras.planner.capacity import node_table, nominations
from walras.planner.cluster import Cluster, Constraints, Job, Pod
from walras.planner.gang import enforce as enforce_gangs
from walras.planner.gang import gang_sizes
from walras.planner.lifecycle import conclude, prepare
from walras.planner.migration import migrate
from walras.planner.model import Condition, JobPlan, ObjectKey, Plan, PodPlan, SolverStats, evolve
from walras.planner.objects import build_objects
from walras.planner.observe import observe
from walras.planner.preemption import preempt
from walras.planner.quota import admit, annotate
from walras.planner.reconcile import reconcile
from walras.planner.resize import plan_resizes
from walras.planner.results import Actions, PlanContext, PlanOptions
from walras.planner.reuse import PlanCache, Reuse
from walras.planner.rounds import run_rounds
from walras.planner.status import PoolCounts, job_statuses, pool_statuses
from walras.planner.tenants import apply_tenants, tenant_plans, with_tenants

__all__ = ["SOLVER_ERRORS", "PlanCache", "PlanOptions", "build_plan"]

_name = attrgetter("name")
#: What a solver raises on numbers it cannot handle (OverflowError, ZeroDivisionError, FloatingPointError are
#: ArithmeticErrors; numpy's LinAlgError; ValueError for a non-finite value met by a check).
SOLVER_ERRORS: tuple[type[Exception], ...] = (ArithmeticError, ValueError, np.linalg.LinAlgError)
#: Rounds of isolation before an error no job explains is raised.
_ISOLATION_ROUNDS = 3


def build_plan(cluster: Cluster, previous: Plan | None = None, *, cache: PlanCache | None = None,
               options: PlanOptions | None = None, device: str = "cpu", assumed: Sequence[Pod] = ()) -> Plan:
    """:func:`plan_phases`, with a job whose numbers make a solver raise isolated (module docstring): the failing
    jobs are planned as invalid with ``Valid=False SolverFailed``, the others as usual."""
    try:
        return plan_phases(cluster, previous, cache=cache, options=options, device=device, assumed=assumed)
    except SOLVER_ERRORS as exc:
        error: Exception = exc
    failed: dict[ObjectKey, str] = {}
    for _ in range(_ISOLATION_ROUNDS):
        def fails(jobs: Sequence[Job], base: Cluster = cluster) -> bool:
            trial = replace(base, jobs=tuple(j for j in base.jobs if j.spec is None or j in jobs))
            try:
                plan_phases(_invalid(trial, failed), previous, options=options, device=device, assumed=assumed)
            except SOLVER_ERRORS:
                return True
            return False

        candidates = [j for j in cluster.jobs if j.spec is not None and j.key not in failed]
        found = _culprits(candidates, fails)
        if not found:
            raise error
        message = f"{type(error).__name__}: {error}"[:500]
        failed.update({key: message for key in found})
        try:
            plan = plan_phases(_invalid(cluster, failed), previous, cache=cache, options=options, device=device,
                               assumed=assumed)
        except SOLVER_ERRORS as exc:
            error = exc
            continue
        return _solver_failed(plan, failed)
    raise error


def _culprits(jobs: Sequence[Job], fails: Callable[[Sequence[Job]], bool]) -> list[ObjectKey]:
    """The keys of the jobs of ``jobs`` whose presence makes ``fails`` true, by bisection: none when ``jobs`` do not
    fail; a failing single job; else the culprits of each half, or the whole group when neither half fails alone."""
    if not jobs or not fails(jobs):
        return []
    if len(jobs) == 1:
        return [jobs[0].key]
    half = len(jobs) // 2
    found = _culprits(jobs[:half], fails) + _culprits(jobs[half:], fails)
    return found or [j.key for j in jobs]


def _invalid(cluster: Cluster, failed: Mapping[ObjectKey, str]) -> Cluster:
    """``cluster`` with the jobs of ``failed`` made invalid (their pods are then frozen by the observe phase)."""
    if not failed:
        return cluster
    return replace(cluster, jobs=tuple(
        replace(j, spec=None, error=f"the market's solver failed on this job's numbers: {failed[j.key]}")
        if j.key in failed else j for j in cluster.jobs))


def _solver_failed(plan: Plan, failed: Mapping[ObjectKey, str]) -> Plan:
    """``plan`` with each isolated job's ``Valid`` condition and ``InvalidSpec`` event reasoned ``SolverFailed``."""
    jobs = dict(plan.jobs)
    for key, message in failed.items():
        jp = jobs.get(key)
        if jp is None:
            continue
        text = (f"the market's solver failed on this job's numbers ({message}); the job is left out of the plan, "
                "every other job is planned: bring its throughputs, weight or utility parameters into a smaller range")
        conditions = tuple(c for c in jp.conditions if c.type != "Valid")
        jobs[key] = evolve(jp, conditions=(Condition("Valid", "False", "SolverFailed", text), *conditions))
    events = tuple(replace(e, reason="SolverFailed") if e.kind == "FungibleJob" and e.reason == "InvalidSpec"
                   and (e.namespace, e.name) in failed else e for e in plan.events)
    return replace(plan, jobs=jobs, events=events)


def plan_phases(cluster: Cluster, previous: Plan | None = None, *, cache: PlanCache | None = None,
                options: PlanOptions | None = None, device: str = "cpu", assumed: Sequence[Pod] = ()) -> Plan:
    """Plan prices, allocations and pod placements for the typed ``cluster`` (a raw snapshot is translated first,
    :func:`walras.kube.decode.cluster_from`), after ``previous`` (its prices warm-start the market, its
    counters and evictions carry over), counting the operator's ``assumed`` pods (:mod:`.cache`) where the cluster
    does not show them yet. With ``cache`` (the caller's :class:`PlanCache`, and ``options.reuse``) each phase whose
    inputs are unchanged reuses what the cache recorded, and the cache then holds this plan's records; without one,
    or with ``reuse=False`` (which still records), everything is computed, to an equal plan. See the module
    docstring for the phases."""
    started = time.perf_counter()
    opts = options or PlanOptions(device=device)
    reuse = Reuse(cache, read=opts.reuse) if cache is not None else Reuse.off()
    given = overlay(cluster, assumed)
    sizes = gang_sizes(given)  # each gang's declared size N (docs/gangs.md)
    life = prepare(given, previous, now=opts.now, grace=opts.node_loss_grace, reuse=reuse)
    # quotas and refused pods cap what is held (docs/refusals.md); after a restart the refusals the status carries
    admission = admit(life.cluster, opts.now, restarted=previous is None)
    cluster, tenancy = apply_tenants(admission.cluster, opts.tenants, reuse)  # Budgets' Fisher market (docs/budgets.md)
    held = nominations(cluster, previous.nominations if previous is not None else None, opts.now)
    table = node_table(cluster, reuse, nominated=held)  # nominated pods reserved (docs/refusals.md)
    objects, reported = build_objects(cluster, table)
    pools, jobs = dict(reported.pools), dict(reported.jobs)
    templates = tuple(info.job.template for info in objects.jobs)
    masks: dict[Constraints, np.ndarray] = {}
    for template in templates:
        if template.constraints not in masks:
            masks[template.constraints] = table.admitted(template.constraints)
    ctx = PlanContext(opts, cluster, table, objects, templates, tuple(masks[t.constraints] for t in templates),
                      previous, reuse)
    observed = observe(ctx)
    resizes = plan_resizes(ctx, observed)
    if resizes.table is not None:  # the resized pods' increases are reserved in the table the later phases read
        ctx = replace(ctx, table=resizes.table)
    outcome = run_rounds(ctx, observed)
    for name, conditions in outcome.pool_conditions.items():
        pools[name] = replace(pools[name], conditions=pools[name].conditions + conditions)
    actions = reconcile(ctx, observed, outcome, resizes)
    migrated = migrate(ctx, observed, outcome, actions, held=life.held)
    outcome, actions = migrated.outcome, migrated.actions
    preempted = preempt(ctx, observed, outcome, actions, held=life.held)  # docs/preemption.md
    outcome, actions = preempted.outcome, preempted.actions
    actions = enforce_gangs(ctx, outcome, actions, sizes).actions  # a gang runs whole or not at all (docs/gangs.md)
    market = outcome.market
    solver = SolverStats(market.iterations, market.gap, market.primal, market.dual, market.converged,
                         market.seconds, market.device, outcome.rounds, market.eps, market.reused,
                         outcome.integral.route, outcome.integral.gap)
    statuses = job_statuses(ctx, outcome, actions, resizes, jobs, tenancy if opts.tenants is not None else None)
    jobs.update(statuses.jobs)
    priced = pool_statuses(ctx, outcome, actions, pools, statuses.counted)
    pools.update(priced.pools)
    for name, times in preempted.history.items():  # the pools' preemptions of the last hour (maxPerHour)
        if name in pools:
            pools[name] = replace(pools[name], preemptions=times)
    concluded = conclude(life, ctx, actions, migrated.moved, jobs)
    jobs.update(concluded.jobs)
    jobs.update(annotate(jobs, admission))
    pods = _listed(jobs, concluded.actions, statuses.counted)
    if opts.tenants is not None:
        jobs = with_tenants(tenancy, jobs)
    reuse.commit()
    # the events in the order the phases raised them
    events = (*reported.events, *outcome.events, *migrated.events, *preempted.events, *statuses.events,
              *priced.events, *concluded.events)
    return Plan(pools=pools, jobs=jobs, pods=tuple(pods), profiles=dict(reported.profiles), events=events,
                solver=solver, seconds=time.perf_counter() - started,
                tenants=tenant_plans(tenancy, pools, jobs, pods) if opts.tenants is not None else {}, nominations=held,
                market_weights=outcome.market_weights)


def _listed(jobs: dict[tuple[str, str], JobPlan], actions: Actions,
            counted: Mapping[tuple[str, str], PoolCounts]) -> list[PodPlan]:
    """Every pod plan, job by job in key order, each job's in name order (and listed on its job: a job that lists
    none yet gets its plan in ``jobs`` replaced by one that lists them)."""
    for key, plans in actions.pods.items():  # pods of invalid, unschedulable or deleted jobs
        job = jobs.get(key)
        if job is not None and not job.pods:
            jobs[key] = replace(job, pods=tuple(sorted(plans, key=_name)))
    pods: list[PodPlan] = []
    for key in sorted(actions.pods):
        plans = actions.pods[key]
        job = jobs.get(key)
        # a valid job's pods are listed in name order already (the status phase sorted them, lifecycle.conclude
        # re-sorted those it added to)
        in_order = job is not None and key in counted and len(job.pods) == len(plans)
        pods.extend(job.pods if in_order and job is not None else sorted(plans, key=_name))
    return pods
