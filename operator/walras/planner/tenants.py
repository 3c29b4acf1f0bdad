"""Pre-market step *tenants*: Budgets turn the market into a Fisher market (docs/budgets.md).

A **tenant** is a set of namespaces with a budget. Every Budget whose spec is valid is one tenant: the namespaces it
lists and those whose labels match its selector. A namespace that no Budget selects is a tenant of its own with the
default share (:class:`~.cluster.TenantOptions`); a namespace that two or more Budgets select is planned as a tenant
of its own with the default share too (under neither Budget's extra share), and each of those Budgets reports it.

**The market with budgets** (Fisher's market; Eisenberg and Gale 1959). Tenant ``t`` has budget ``B_t`` (its
``spec.share``, in credits per hour). Job ``i`` of tenant ``t`` with weight ``w_i`` (``spec.utility.weight`` times
``spec.weight``) gets the part

    b_i = B_t * w_i / sum_{k in t} w_k                                                               (T1)

of its tenant's budget, and enters the market of paper 004 (Sec. 2, problem (4)) as a buyer with the log utility
``b_i log t_i`` (004 eq. 1), ``t_i = a_i^T x_i``. The market then solves the Eisenberg-Gale program

    maximise  sum_i b_i log(a_i^T x_i)
    s.t.      sum_i d_ij x_ij <= R_j  (every pool j),   x_i >= 0,  1^T x_i <= 1  (every job i)     (T2)

with 004's dual decomposition unchanged. At prices ``p``, job i's subproblem (004 eq. 5) is
``max b_i log(a_i^T x) - sum_j p_j d_ij x_j``; along the best ray ``x = s e`` its optimum has
``d/ds = b_i / s - p^T D_i e = 0``, so the job **spends exactly** ``sum_j p_j d_ij x_ij = b_i`` unless the time cap
``1^T x_i <= 1`` binds first, when it spends less:

    spend_i = sum_j p_j d_ij x_ij <= b_i,     spend_t = sum_{i in t} spend_i <= B_t                  (T3)

Prices are then credits per unit of a pool's priced resource per hour, and ``p_j * units`` a spend rate. The
market does not stop at (T3): it computes the budget-constrained equilibrium (T6, docs/budgets.md;
:func:`walras.planner.market.budget_equilibrium`), in which a job whose time cap binds still spends its budget
(unless it is satiated), so every job gets at least the throughput of its proportional slice under its cap.

**Accuracy** (docs/budgets.md). 004's stopping rule ``g(p) - U(X) <= 1e-3 n`` (Sec. 5) is sized for unit-weight
log jobs; the b_i sum to ``sum_t B_t`` instead, and a relative gap ``delta`` moves a tenant's spend by about
``sqrt(2 delta)`` of its share. With tenants the market runs with ``eps = gap * sum_i b_i`` (T4,
:func:`market_eps`, ``TenantOptions.gap = 1e-5``): spend within 1 % of the share and splitting gain within 1 %.

**Other utility families.** A linear, power, alpha-fair or target-priority utility is an increasing function of the
job's throughput ``t_i``, so it orders a job's bundles exactly as ``t_i`` does; what the family adds is *cardinal*:
how much one job's throughput is worth against another's. That cardinal part is what a tenant could inflate (a linear
job with throughputs times 1e9 outbids every log job). With tenants on, every job is therefore priced as the buyer of
(T2), ``b_i log t_i``: its family keeps its ordinal meaning (more throughput is better), its budget decides its
purchasing power. For linear utilities (T2) is exactly Eisenberg-Gale's program of the linear Fisher market; for
power ``t^p`` and alpha-fair it is the program of the degree-one representation ``t`` of the same preferences. The
one loss: a target-priority job buys throughput past its target (its target no longer caps what it buys); the
TENANTS table names the jobs priced this way (:attr:`Tenancy.repriced`).

**Caps** (``spec.caps``: the most units of a pool's priced resource the tenant's pods may hold). They are enforced in
what the market and placement see, before the rounds: for a tenant whose jobs could together exceed a cap in pool j
(the sum of ``replicas_i * demand_i`` over its jobs that may use j), its jobs are admitted to pool j one by one
(jobs already running there first, then by weight, then by name) while their full demand fits what is left of the
cap; a job that runs only in pool j and does not fit whole gets the replicas that fit (``floor(left / demand)``);
any other job that does not fit loses pool j (its throughput there is set to 0). Whatever the market prices and
placement places, the tenant's pods in pool j then hold at most the cap: no job of it can have more than
``replicas_i`` pods of ``demand_i`` units there. This is conservative (a multi-pool job that does not fit whole is
not given a part of the cap), and exact for single-pool jobs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from walras.planner.cluster import Budget, Cluster, Job, TenantOptions
from walras.planner.model import Condition, JobPlan, PodPlan, PoolPlan, TenantPlan
from walras.planner.quantity import parse_quantity
from walras.planner.reuse import Inputs, Reuse, Same
from walras.planner.spec import JobSpec, UtilitySpec

__all__ = ["Tenancy", "Tenant", "TenantsEntry", "apply_tenants", "default_tenant", "job_weight", "market_eps",
           "tenancy", "tenant_plans", "with_tenants"]

#: Pod actions whose pod holds its pool's resource after the plan (a pod to delete or evict holds nothing).
HOLDING = frozenset({"create", "bind", "keep", "resize"})


@dataclass(frozen=True)
class Tenant:
    """One tenant: its name (the Budget's, or :func:`default_tenant` of a namespace), its share ``B_t``, its
    namespaces, the Budget it comes from (None: a default tenant) and its caps per pool (units)."""

    name: str
    share: float
    namespaces: tuple[str, ...]
    budget: str | None = None
    caps: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Tenancy:
    """The tenants of a cluster and what the step did to its jobs: ``of_namespace`` maps a namespace to its tenant's
    name; ``overlaps`` maps a Budget to the namespaces another Budget selects as well; ``budgets`` is each priced
    job's ``b_i`` (T1); ``repriced`` the jobs whose family was not log (priced as log, see the module docstring);
    ``capped`` the pools a cap took from a job; ``reduced`` the replicas a cap left a single-pool job; ``cap_room``
    per (job, pool) that a cap capped or reduced: the cap, the units of it left when the job's turn came, and the
    replicas the job asked for (what ``walras explain`` reports, :mod:`.status`)."""

    tenants: tuple[Tenant, ...] = ()
    of_namespace: Mapping[str, str] = field(default_factory=dict)
    overlaps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    budgets: Mapping[tuple[str, str], float] = field(default_factory=dict)
    repriced: tuple[tuple[str, str], ...] = ()
    capped: Mapping[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    reduced: Mapping[tuple[str, str], int] = field(default_factory=dict)
    cap_room: Mapping[tuple[str, str, str], tuple[float, float, int]] = field(default_factory=dict)

    def tenant(self, name: str) -> Tenant | None:
        """The tenant called ``name`` (None when there is none)."""
        return next((t for t in self.tenants if t.name == name), None)


def default_tenant(namespace: str) -> str:
    """The name of the tenant of a namespace that no single Budget selects (``namespace/<name>``; a Budget's name
    has no ``/``, so the two can never meet)."""
    return f"namespace/{namespace}"


def job_weight(spec: JobSpec) -> float:
    """``w_i`` of (T1): the job's utility weight times its priority weight."""
    return float(spec.utility.weight) * float(spec.weight)


def _namespaces(cluster: Cluster) -> list[str]:
    names = set(cluster.namespaces)
    names.update(job.namespace for job in cluster.jobs)
    for budget in cluster.budgets:
        if budget.spec is not None:
            names.update(budget.spec.namespaces)
    return sorted(names)


def tenancy(cluster: Cluster, options: TenantOptions) -> Tenancy:
    """The tenants of ``cluster`` (module docstring): each valid Budget's namespaces, every other namespace (and
    every namespace two Budgets select) a tenant of its own with ``options.default_share``; no job is changed."""
    budgets: list[Budget] = [b for b in cluster.budgets if b.spec is not None]
    selected: dict[str, list[str]] = {}
    for namespace in _namespaces(cluster):
        labels = cluster.namespaces.get(namespace, {})
        for budget in budgets:
            assert budget.spec is not None
            if budget.spec.selects(namespace, labels):
                selected.setdefault(namespace, []).append(budget.name)
    of_namespace: dict[str, str] = {}
    members: dict[str, list[str]] = {b.name: [] for b in budgets}
    overlaps: dict[str, list[str]] = {}
    for namespace in _namespaces(cluster):
        names = selected.get(namespace, [])
        if len(names) == 1:
            of_namespace[namespace] = names[0]
            members[names[0]].append(namespace)
            continue
        of_namespace[namespace] = default_tenant(namespace)
        for name in names:
            overlaps.setdefault(name, []).append(namespace)
    tenants = []
    for budget in budgets:
        assert budget.spec is not None
        tenants.append(Tenant(budget.name, budget.spec.share, tuple(members[budget.name]), budget.name,
                              dict(budget.spec.caps)))
    for namespace, name in of_namespace.items():
        if name == default_tenant(namespace):
            tenants.append(Tenant(name, options.default_share, (namespace,)))
    return Tenancy(tuple(tenants), of_namespace, {k: tuple(v) for k, v in overlaps.items()})


def _wants(job: Job, pools: set[str]) -> bool:
    """Whether a job can take part in the market: valid, replicas > 0, positive throughput on a valid pool."""
    spec = job.spec
    return spec is not None and spec.replicas > 0 and any(v > 0 and p in pools for p, v in spec.throughput.items())


@dataclass(frozen=True)
class TenantsEntry:
    """The tenants step's record (:mod:`.reuse`): the jobs :func:`apply_tenants` returned and its :class:`Tenancy`
    for the inputs in ``inputs`` (``(Same(jobs), the Budgets' names and specs, namespace labels, valid pools,
    options, Same(pods) or None)``; the pods only matter, through the running counts, when a Budget has caps; a
    Budget's reported spend is not an input)."""

    inputs: Inputs
    jobs: tuple[Job, ...]
    tenancy: Tenancy


def apply_tenants(cluster: Cluster, options: TenantOptions | None,
                  reuse: Reuse | None = None) -> tuple[Cluster, Tenancy]:
    """The cluster the market should see with tenants (module docstring) and the :class:`Tenancy`: every priced
    job's utility becomes ``b_i log t`` with ``b_i`` of (T1) (its ``spec.weight`` becomes ``b_i`` too, for the fair
    placement policy), and the caps are applied to the jobs' pools and replicas. ``options=None`` (tenants off)
    returns ``cluster`` itself and an empty tenancy. One pass over the jobs (and, with caps, the pods). With
    ``reuse`` (:mod:`.reuse`), a cluster whose jobs (the same objects), Budget specs, namespace labels and pools are
    unchanged gets the previous plan's job objects back, so every later phase that compares jobs by identity reuses
    its record as it does with tenants off."""
    if options is None:
        return cluster, Tenancy()
    pools = {p.name for p in cluster.pools if p.spec is not None}
    caps = any(b.spec is not None and b.spec.caps for b in cluster.budgets)
    inputs = (Same(cluster.jobs), tuple((b.name, b.spec) for b in cluster.budgets),
              tuple(sorted((k, tuple(sorted(v.items()))) for k, v in cluster.namespaces.items())),
              tuple(sorted(pools)), options, Same(cluster.pods) if caps else None)
    hit = reuse.lookup(TenantsEntry, inputs) if reuse is not None else None
    if hit is None:
        hit = TenantsEntry(inputs, *_applied(cluster, options, pools, caps))
    if reuse is not None:
        reuse.store(hit)
    return replace(cluster, jobs=hit.jobs), hit.tenancy


def _applied(cluster: Cluster, options: TenantOptions, pools: set[str],
             caps: bool) -> tuple[tuple[Job, ...], Tenancy]:
    """The work of :func:`apply_tenants`: the jobs as the market sees them and the tenancy."""
    plan = tenancy(cluster, options)
    priced: dict[str, list[Job]] = {}
    for job in cluster.jobs:
        if _wants(job, pools):
            priced.setdefault(plan.of_namespace[job.namespace], []).append(job)
    specs: dict[tuple[str, str], JobSpec] = {}
    budgets: dict[tuple[str, str], float] = {}
    repriced: list[tuple[str, str]] = []
    capped: dict[tuple[str, str], tuple[str, ...]] = {}
    reduced: dict[tuple[str, str], int] = {}
    room: dict[tuple[str, str, str], tuple[float, float, int]] = {}
    running = _running(cluster) if caps else {}
    for tenant in plan.tenants:
        jobs = priced.get(tenant.name, [])
        total = sum(job_weight(j.spec) for j in jobs if j.spec is not None)
        for job in jobs:
            spec = job.spec
            assert spec is not None
            b = tenant.share * job_weight(spec) / total
            budgets[job.key] = b
            if spec.utility.type != "log":
                repriced.append(job.key)
            specs[job.key] = replace(spec, utility=UtilitySpec(type="log", weight=b), weight=b)
        for pool, cap in sorted(tenant.caps.items()):
            _cap(pool, cap, [j.key for j in jobs], specs, running, capped, reduced, room)
    out = tuple(replace(job, spec=specs[job.key]) if job.key in specs else job for job in cluster.jobs)
    return out, Tenancy(plan.tenants, plan.of_namespace, plan.overlaps, budgets, tuple(repriced), capped, reduced,
                        room)


def market_eps(tenancy: Tenancy, options: TenantOptions) -> float | None:
    """The market's duality-gap tolerance with tenants: ``options.gap * sum_i b_i`` (docs/budgets.md, "Accuracy");
    None (the allocator's default) when no job is priced."""
    total = math.fsum(tenancy.budgets.values())
    return options.gap * total if total > 0 else None


def _running(cluster: Cluster) -> dict[tuple[str, str, str], int]:
    """Live pods per (namespace, job, pool) of the managed pods bound to a node."""
    out: dict[tuple[str, str, str], int] = {}
    for pod in cluster.pods:
        if pod.job is not None and pod.pool is not None and pod.node is not None and not pod.terminal:
            key = (pod.namespace, pod.job, pod.pool)
            out[key] = out.get(key, 0) + 1
    return out


def _cap(pool: str, cap: float, keys: list[tuple[str, str]], specs: dict[tuple[str, str], JobSpec],
         running: Mapping[tuple[str, str, str], int], capped: dict[tuple[str, str], tuple[str, ...]],
         reduced: dict[tuple[str, str], int], room: dict[tuple[str, str, str], tuple[float, float, int]]) -> None:
    """Apply a tenant's cap of ``cap`` units in ``pool`` to its jobs ``keys`` (their specs in ``specs``, replaced in
    place): the admission described in the module docstring (running there first, then weight, then name). ``room``
    gets, per job capped or reduced, ``(cap, units left at its turn, its replicas)``."""
    users = [k for k in keys if specs[k].throughput.get(pool, 0.0) > 0]
    for k in users:  # a pod with a utility curve gets at most its demand in a capped pool (assign-and-allocate)
        if specs[k].curve is not None:
            specs[k] = replace(specs[k], pod_caps=(*specs[k].pod_caps, (pool, specs[k].demand)))
    if sum(specs[k].replicas * specs[k].demand for k in users) <= cap * (1 + 1e-12):
        return
    users.sort(key=lambda k: (-running.get((k[0], k[1], pool), 0), -job_weight(specs[k]), k))
    left = cap
    for key in users:
        spec = specs[key]
        full = spec.replicas * spec.demand
        if full <= left * (1 + 1e-12):
            left -= full
            continue
        only_here = all(v <= 0 for p, v in spec.throughput.items() if p != pool)
        fits = math.floor(left / spec.demand * (1 + 1e-12)) if only_here else 0
        room[(key[0], key[1], pool)] = (cap, left, spec.replicas)
        if fits > 0:
            specs[key] = replace(spec, replicas=fits, min_replicas=min(spec.min_replicas, fits))
            reduced[key] = fits
            left -= fits * spec.demand
            continue
        specs[key] = replace(spec, throughput={**spec.throughput, pool: 0.0})
        capped[key] = (*capped.get(key, ()), pool)


def _units(text: str | None) -> float:
    """The units of a request's quantity text (0 when absent or unreadable)."""
    try:
        return parse_quantity(text) if text is not None else 0.0
    except ValueError:
        return 0.0


def tenant_plans(tenancy: Tenancy, pools: Mapping[str, PoolPlan], jobs: Mapping[tuple[str, str], JobPlan],
                 pods: tuple[PodPlan, ...] | list[PodPlan]) -> dict[str, TenantPlan]:
    """Each tenant's :class:`TenantPlan` from the plan's pools, jobs and pods: units per pool of the priced resource
    held by its placed pods (actions in :data:`HOLDING` with a node), the spend rate of those units at the pools'
    prices, the market's spend (the jobs' ``priced_cost``, (T3)) and the conditions of its Budget."""
    counts: dict[tuple[str, str, str | None], int] = {}  # (namespace, pool, the request's text) -> pods
    for pod in pods:
        if pod.node is not None and pod.action in HOLDING:
            pool = pools.get(pod.pool)
            if pool is not None:
                cell = (pod.namespace, pod.pool, pod.requests.get(pool.resource))
                counts[cell] = counts.get(cell, 0) + 1
    units: dict[str, dict[str, float]] = {t.name: {} for t in tenancy.tenants}
    for (namespace, name, text), count in counts.items():  # one parse per distinct request, not per pod
        owner = tenancy.of_namespace.get(namespace)
        if owner is not None:
            held = units.setdefault(owner, {})
            held[name] = held.get(name, 0.0) + count * _units(text)
    members: dict[str, list[tuple[str, str]]] = {}
    for key in tenancy.budgets:
        members.setdefault(tenancy.of_namespace[key[0]], []).append(key)
    out: dict[str, TenantPlan] = {}
    for tenant in tenancy.tenants:
        held = dict(sorted(units.get(tenant.name, {}).items()))
        rate = sum(pools[p].price * u for p, u in held.items() if p in pools)
        keys = tuple(sorted(members.get(tenant.name, [])))
        priced = sum(jobs[k].priced_cost for k in keys if k in jobs)
        overlaps = tenancy.overlaps.get(tenant.budget or "", ()) if tenant.budget else ()
        out[tenant.name] = TenantPlan(tenant.name, tenant.budget, tenant.share, tenant.namespaces, held, rate,
                                      priced, dict(tenant.caps), overlaps, keys,
                                      _conditions(tenant, held, overlaps, tenancy, keys))
    return out


def _conditions(tenant: Tenant, held: Mapping[str, float], overlaps: tuple[str, ...], tenancy: Tenancy,
                keys: tuple[tuple[str, str], ...]) -> tuple[Condition, ...]:
    """A Budget's conditions: Valid, NamespacesOverlap (namespaces another Budget selects too), CapsApplied (a cap
    took a pool from or lowered the replicas of one of its jobs)."""
    out = [Condition("Valid", "True", "Valid", f"{len(tenant.namespaces)} namespace(s), {len(keys)} priced job(s)")]
    if overlaps:
        out.append(Condition("NamespacesOverlap", "True", "SelectedByAnotherBudget",
                             f"namespace(s) {', '.join(overlaps)} are selected by another Budget too; they are "
                             "planned under neither Budget (each as a tenant of its own with the default share)"))
    else:
        out.append(Condition("NamespacesOverlap", "False", "NoOverlap", ""))
    capped = [f"{k[0]}/{k[1]} without pool(s) {', '.join(tenancy.capped[k])}" for k in keys if k in tenancy.capped]
    capped += [f"{k[0]}/{k[1]} at {tenancy.reduced[k]} replica(s)" for k in keys if k in tenancy.reduced]
    if capped:
        out.append(Condition("CapsApplied", "True", "CapReached", "; ".join(capped)))
    elif tenant.caps:
        over = [p for p, cap in tenant.caps.items() if held.get(p, 0.0) > cap + 1e-9]
        if over:
            out.append(Condition("CapsApplied", "True", "CapExceeded", ", ".join(over)))
        else:
            out.append(Condition("CapsApplied", "False", "WithinCaps", ""))
    return tuple(out)


def with_tenants(tenancy: Tenancy, jobs: Mapping[tuple[str, str], JobPlan]) -> dict[tuple[str, str], JobPlan]:
    """``jobs`` with each job plan's ``tenant`` set to its namespace's tenant (for ``kubectl get fjob``)."""
    return {key: replace(job, tenant=tenancy.of_namespace.get(key[0], default_tenant(key[0])))
            for key, job in jobs.items()}
