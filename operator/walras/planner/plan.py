"""``build_plan(cluster, previous) -> Plan``: the planning pass, as named phases (kube-scheduler's framework over a
Kueue-style snapshot). Each phase is a module with one entry function, testable alone:

====================  ===============================================================================================
translate             raw API objects -> the typed :class:`~.cluster.Cluster` (:mod:`.translate`; skipped when a
                      Cluster is passed)
lifecycle (pre)       lost pods force-deleted; each job's state over time (complete, failed pods and their
                      backoff, backoff limit, suspended) as the replicas the market may plan (:mod:`.lifecycle`)
capacity              per-node allocatable and requested vectors over every resource (:mod:`.capacity`)
objects               valid profiles, pools (their nodes) and jobs (their pools) (:mod:`.objects`)
observe               each job's running and pending pods per pool; pods no job wants (:mod:`.observe`)
resize                running pods whose planned requests changed (:mod:`.resize`)
market/replicas/      prices and time fractions, integral replicas, pods on nodes, re-priced while placement cannot
placement             realise the market's allocation (:mod:`.rounds`, :mod:`.market`, :mod:`.replicas`,
                      :mod:`.placement`, :mod:`.policies`)
reconcile             desired vs observed -> pod actions, within the churn budget (:mod:`.reconcile`)
migration             running pods of opted-in jobs moved towards the market's split when the utility gain pays,
                      within the churn budgets (:mod:`.migration`)
status                job and pool statuses and events from what was placed (:mod:`.status`)
lifecycle (post)      phases Complete/Failed/Suspended, failure and migration counters, the lifecycle's deletions
                      (:mod:`.lifecycle`)
====================  ===============================================================================================

Time enters only through ``PlanOptions.now`` (docs/lifecycle.md). Pure and deterministic: no I/O, no process-global
state (the market restores any torch setting it touches), objects in name order, ties broken by index. ``previous``
warm-starts the prices, lends its per-pool placement proposals to pools whose request is unchanged
(:mod:`.placement`), its pod translations to pods whose uid and resourceVersion are unchanged
(:mod:`.translate`), and each phase's result to the phase whose inputs are unchanged (:mod:`.reuse`; the reuse table
of docs/planner.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from walras.planner.assume import overlay
from walras.planner.capacity import node_table
from walras.planner.cluster import Cluster, Constraints, Pod
from walras.planner.lifecycle import NODE_LOSS_GRACE, conclude, prepare
from walras.planner.migration import migrate
from walras.planner.model import Plan, PlanEvent, Snapshot, SolverStats
from walras.planner.objects import build_objects
from walras.planner.observe import observe
from walras.planner.reconcile import reconcile
from walras.planner.resize import plan_resizes
from walras.planner.rounds import run_rounds
from walras.planner.status import job_statuses, pool_statuses
from walras.planner.translate import cluster_from

_name = attrgetter("name")


@dataclass(frozen=True)
class PlanOptions:
    """Knobs of one plan. ``max_rounds``: market/placement rounds; ``max_deletes``: running pods one plan may delete
    (the churn budget; None = no bound); ``market_iterations``: dual evaluations per market solve; ``now``: the plan's
    clock in epoch seconds, for the time-dependent rules (backoff of failed pods, node-loss grace, minimum run time
    and cooldown of migrations); None means no clock: no node is lost by time, no backoff is measured, nothing
    migrates. ``max_migrations``: pods all migrating jobs together may move in one plan. ``node_loss_grace``: seconds
    a node may be NotReady before its pods are force-deleted and re-planned. ``reuse``: reuse ``previous``'s
    memoised work for what did not change (translations, each phase's result whose inputs are unchanged, kept pods'
    plans; see the module docstring); False recomputes it all and gives an equal plan (tests/test_planner_reuse.py
    compares the two)."""

    device: str = "cpu"
    max_rounds: int = 3
    max_deletes: int | None = None
    market_iterations: int = 60
    now: float | None = None
    max_migrations: int = 10
    node_loss_grace: float = NODE_LOSS_GRACE
    reuse: bool = True


def build_plan(source: Snapshot | Cluster, previous: Plan | None = None, *, device: str = "cpu",
               options: PlanOptions | None = None, assumed: Sequence[Pod] = ()) -> Plan:
    """Plan prices, allocations and pod placements for ``source`` (a snapshot of raw objects, or a typed cluster),
    warm-started from ``previous``, counting the operator's ``assumed`` pods (:mod:`.cache`) where the source does
    not show them yet. See the module docstring for the phases."""
    started = time.perf_counter()
    opts = options or PlanOptions(device=device)
    plan = Plan()
    if isinstance(source, Cluster):
        cluster = source
    else:
        memo = previous._pod_memo if previous is not None and opts.reuse else None
        sequences = previous._sequences if previous is not None and opts.reuse else None
        cluster = cluster_from(source, memo, plan._pod_memo, sequences, plan._sequences)
    phases = previous._phases if previous is not None and opts.reuse else None
    record = plan._phases
    life = prepare(overlay(cluster, assumed), previous, now=opts.now, grace=opts.node_loss_grace, memo=phases,
                   record=record)
    cluster = life.cluster
    table = node_table(cluster, phases, record)
    objects = build_objects(cluster, table, plan)
    observed = observe(cluster, objects, table, phases, record)
    resizes = plan_resizes(objects, observed, table, phases, record)
    templates = [info.job.template for info in objects.jobs]
    masks: dict[Constraints, np.ndarray] = {}
    for template in templates:
        if template.constraints not in masks:
            masks[template.constraints] = table.admitted(template.constraints)
    admitted = [masks[t.constraints] for t in templates]

    def warn(kind: str, namespace: str, name: str, reason: str, message: str) -> None:
        plan.events.append(PlanEvent(kind, namespace, name, "Warning", reason, message))

    outcome = run_rounds(objects, observed, templates, admitted, table, previous, plan, warn,
                         device=opts.device, max_rounds=opts.max_rounds, market_iterations=opts.market_iterations,
                         memo=phases, record=record)
    actions = reconcile(objects, observed, outcome, resizes, outcome.table, max_deletes=opts.max_deletes,
                        memo=previous._kept if previous is not None and opts.reuse else None, record=plan._kept)
    moved = migrate(objects, observed, outcome, actions, templates, admitted, previous, plan, now=opts.now,
                    budget=opts.max_migrations, held=life.held)
    market = outcome.market
    plan.solver = SolverStats(market.iterations, market.gap, market.primal, market.dual, market.converged,
                              market.seconds, market.device, outcome.rounds, market.eps, market.reused)
    counted = job_statuses(objects, outcome, actions, resizes, plan, previous,
                           memo=previous._statuses if previous is not None and opts.reuse else None,
                           record=plan._statuses)
    pool_statuses(objects, outcome, actions, plan, previous, counted)
    conclude(life, objects, actions, moved, plan, previous)
    for key, plans in actions.pods.items():  # pods of invalid, unschedulable or deleted jobs
        job = plan.jobs.get(key)
        if job is not None and not job.pods:
            job.pods = sorted(plans, key=_name)
    for key in sorted(actions.pods):
        plans = actions.pods[key]
        job = plan.jobs.get(key)
        # a valid job's pods are listed in name order already (the status phase sorted them, lifecycle.conclude
        # re-sorted those it added to)
        in_order = job is not None and key in counted and len(job.pods) == len(plans)
        plan.pods.extend(job.pods if in_order and job is not None else sorted(plans, key=_name))
    plan.seconds = time.perf_counter() - started
    return plan
