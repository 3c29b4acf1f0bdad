"""The planner's result types, in one module so that the phases depend on it and not on each other (the import
graph stays shallow): what each phase returns (with the conditions and events it raised), and the options and
context every phase reads; :func:`walras.planner.plan.build_plan` assembles the plan from the results.

Phase by phase: *objects* -> :class:`Objects` (:class:`PoolInfo`, :class:`JobInfo`) and :class:`Reported`;
*observe* -> :class:`Observed`; *resize* -> :class:`Resizes` (:class:`ResizeTarget`); *placement* -> :class:`Placed`
of a :class:`Batch`; *market/replicas/placement rounds* -> :class:`Outcome`; *reconcile* (and *migration*,
*lifecycle*) -> :class:`Actions`, *migration* -> :class:`Migrated`; *job status* -> :class:`JobStatuses`. The node
table is :class:`walras.planner.capacity.NodeTable`, the market's result :class:`walras.planner.market.MarketResult`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from walras.planner.capacity import NodeTable
from walras.planner.cluster import Cluster, Job, JobTemplate, Pod, TenantOptions
from walras.planner.market import MarketResult
from walras.planner.model import Condition, JobPlan, Plan, PlanEvent, PodPlan, PoolPlan
from walras.planner.reuse import Reuse, frozen
from walras.planner.spec import JobSpec, PoolSpec, ProfileSpec

#: kube-controller-manager's default wait before the pods of a NotReady node are evicted (the
#: ``node.kubernetes.io/not-ready`` NoExecute toleration of 300 s).
NODE_LOSS_GRACE = 300.0


@dataclass(frozen=True)
class PoolInfo:
    """A valid pool: its spec and profile, the node indices it claims and the usable ones among them."""

    spec: PoolSpec
    profile: ProfileSpec | None
    members: np.ndarray
    usable: np.ndarray

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class JobInfo:
    """A valid job and the pools it may use (``pools[j]`` over :attr:`Objects.pools`)."""

    job: Job
    spec: JobSpec
    pools: np.ndarray  # bool (m,)

    @property
    def key(self) -> tuple[str, str]:
        return self.job.key


@dataclass(frozen=True)
class Objects:
    """The valid pools and jobs (in name order), each node's pool (``-1``: in no pool; read-only) and the keys of
    the invalid jobs."""

    pools: tuple[PoolInfo, ...] = ()
    jobs: tuple[JobInfo, ...] = ()
    pool_of_node: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # -1: in no pool
    invalid_jobs: frozenset[tuple[str, str]] = frozenset()

    @property
    def pool_index(self) -> dict[str, int]:
        return {p.name: j for j, p in enumerate(self.pools)}


@dataclass(frozen=True)
class Observed:
    """Per job row and pool, the pods (read-only lists: empty cells may share one list)."""

    running: list[list[list[Pod]]]  # [row][pool] -> pods
    pending: list[list[list[Pod]]]
    surplus: list[tuple[Pod, str]] = field(default_factory=list)  # (pod, why) for pods of no wanted replica
    frozen: list[Pod] = field(default_factory=list)
    names: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # every pod name each job has (read-only)
    walras_count: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # managed pods per node
    #: The names each job has once this plan's new pods are named (:meth:`taken`); :attr:`names` is shared.
    own: dict[tuple[str, str], set[str]] = field(default_factory=dict)

    def taken(self, key: tuple[str, str]) -> set[str]:
        """The pod names job ``key`` has, as a set this plan adds its new pods' names to (a copy of its
        :attr:`names` entry, made on first use: the entry may be shared with the previous plan)."""
        own = self.own.get(key)
        if own is None:
            own = self.own[key] = set(self.names.get(key, ()))
        return own

    #: :meth:`counts` once computed (read-only arrays; shared with the next plan's Observed when it reuses the lists).
    tallies: dict[str, np.ndarray] = field(default_factory=dict)

    def counts(self, which: str) -> np.ndarray:
        """Pods per (job row, pool) of ``running`` or ``pending`` (read-only)."""
        got = self.tallies.get(which)
        if got is None:
            rows = self.running if which == "running" else self.pending
            m = len(rows[0]) if rows else 0
            got = np.array([[len(pods) for pods in row] for row in rows], dtype=np.int64).reshape(len(rows), m)
            self.tallies[which] = frozen(got)
        return got


@dataclass(frozen=True)
class ResizeTarget:
    """New requests/limits of a running pod (text), the change of each request (amount), what changes in place
    (``reason``, empty when nothing does), and what cannot change in place and waits for the next pod (``later``)."""

    requests: dict[str, str]
    limits: dict[str, str]
    delta: tuple[tuple[str, float], ...]
    reason: str
    later: str = ""


@dataclass(frozen=True)
class Resizes:
    """Per pod (namespace, name): the resize it gets; per job: pods blocked (no room) and deferred (not in place)."""

    done: dict[tuple[str, str], ResizeTarget] = field(default_factory=dict)
    blocked: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    later: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    #: the node table with the resizes' increases reserved, which the phases after the resize phase read (None: the
    #: context's, unchanged)
    table: NodeTable | None = None


@dataclass(frozen=True)
class Batch:
    """Pods to place in one pool: ``rows[q]`` the job row of pod q (into the job list), ``optional[q]`` whether it
    is an elastic job's offer that the policy may leave out."""

    pool: int
    rows: list[int]
    optional: list[bool]


@dataclass(frozen=True)
class Placed:
    """``node[q]``: global node index of pod q (-1 unplaced); ``amount[q]``: its priced amount; ``why[q]``: for an
    unplaced pod, ``"DegreeLimited"``, ``"Fragmented"`` or ``"InsufficientCapacity"``."""

    node: np.ndarray
    amount: np.ndarray
    why: list[str]
    #: The pool's policy reports of this placement (``PolicyApplied``/``PolicyCertified`` conditions, each also
    #: raised as a Warning against the pool); the rounds phase keeps each once per pool.
    conditions: tuple[Condition, ...] = ()


@dataclass(frozen=True)
class Reservations:
    """The node table and the Walras pods per node of one round, which placement reserves into (copies of the
    capacity phase's, made per round)."""

    table: NodeTable
    count: np.ndarray


@dataclass(frozen=True)
class IntegralReport:
    """What the integral fill (:mod:`walras.planner.integral`) did: the route (``"exact"``, ``"search"``; ``""``
    when nothing could be filled), replicas added, the objective ``sum_i u_i`` of the plan's replicas (the starved
    value of :mod:`allocator.integral` for a job with none), the certified upper bound and gap where the exact route
    gave one (else None), and the seconds it took."""

    route: str = ""
    added: int = 0
    value: float = 0.0
    bound: float | None = None
    gap: float | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class Outcome:
    """The last round: market result, replica targets, and what placement did with each batch."""

    market: MarketResult
    allocation: np.ndarray  # (n, m) X over every job row (zero rows for jobs out of the market)
    throughput: np.ndarray  # (n, m) a_ij as the market saw it in the last round
    offered: np.ndarray  # (n, m) bool: pools the job may use with throughput > 0 (before any was withdrawn)
    demand: np.ndarray  # (n, m)
    capacity: np.ndarray  # (m,) the sellable capacity of the last round
    target: np.ndarray  # (n, m) wanted replicas
    batches: list[tuple[Batch, Placed, list[Pod | None]]]  # pod q: existing pending pod, or None for a new one
    table: NodeTable  # after reservations
    walras_count: np.ndarray
    rounds: int = 1
    blocked: dict[tuple[int, int], str] = field(default_factory=dict)  # (row, pool) no longer offered, and why
    below_min: dict[int, int] = field(default_factory=dict)  # elastic job row -> replicas it would have (< min)
    #: (n, m) wanted replicas that rounding took out of a pool without room now (:func:`.replicas.fit_columns`);
    #: not in ``target``, reported on the job as unplaced (``InsufficientCapacity``).
    dropped: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    #: Conditions the placement policies added per pool name (each once, in the order raised) and the rounds' events
    #: (the policies' warnings, then the market's), in the order raised.
    pool_conditions: Mapping[str, tuple[Condition, ...]] = field(default_factory=dict)
    events: tuple[PlanEvent, ...] = ()
    #: What the integral fill added and how (:mod:`walras.planner.integral`).
    integral: IntegralReport = field(default_factory=lambda: IntegralReport())
    #: With tenants: each priced job's market weight ``b'`` in the last round's solve (market.budget_equilibrium),
    #: the next plan's warm start (:attr:`walras.planner.model.Plan.market_weights`).
    market_weights: Mapping[tuple[str, str], float] = field(default_factory=dict)

    @cached_property
    def blocked_by_row(self) -> dict[int, list[tuple[int, str]]]:
        """:attr:`blocked` grouped by job row: row -> [(pool, why)] in pool order."""
        out: dict[int, list[tuple[int, str]]] = {}
        for (i, j), why in sorted(self.blocked.items()):
            out.setdefault(i, []).append((j, why))
        return out


@dataclass(frozen=True)
class Actions:
    """Pod plans per job key, and per job what the churn budget deferred and where placed pods went."""

    pods: dict[tuple[str, str], list[PodPlan]] = field(default_factory=lambda: defaultdict(list))
    deferred: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    placed: dict[tuple[str, str], dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    unplaced: dict[tuple[str, str], dict[str, tuple[int, str]]] = field(default_factory=lambda: defaultdict(dict))
    #: per waiting gang job, its ``GangNotPlaceable`` message (:func:`walras.planner.gang.enforce`)
    gangs: dict[tuple[str, str], str] = field(default_factory=dict)


@dataclass(frozen=True)
class Migrated:
    """What the migration phase returns: the pods moved per job key, their ``Rebalanced`` events in the order the
    moves were made, and the actions and outcome after the moves (:func:`walras.planner.migration.migrate`)."""

    moved: Mapping[tuple[str, str], int]
    events: tuple[PlanEvent, ...]
    actions: Actions
    outcome: Outcome


@dataclass(frozen=True)
class JobStatuses:
    """What the job-status phase returns: each valid job's plan, its pods planned and bound per pool
    (``(pool, planned, bound)``, for the pool-status phase) and the events it raised, in job order."""

    jobs: Mapping[tuple[str, str], JobPlan]
    counted: Mapping[tuple[str, str], tuple[tuple[str, int, int], ...]]
    events: tuple[PlanEvent, ...]


@dataclass(frozen=True)
class Concluded:
    """What the post-status lifecycle step returns: every job's plan with its lifecycle phase, counters and
    conditions, the events it raised, job by job, and the actions with the lifecycle's deletions."""

    jobs: Mapping[tuple[str, str], JobPlan]
    events: tuple[PlanEvent, ...]
    actions: Actions


@dataclass(frozen=True)
class PoolStatuses:
    """What the pool-status phase returns: each valid pool's plan with its price, use and pods, and the ``Priced``
    events, in pool order."""

    pools: Mapping[str, PoolPlan]
    events: tuple[PlanEvent, ...]


@dataclass(frozen=True)
class Reported:
    """What the objects phase reports: each pool's and job's plan as validation leaves it (the later phases fill
    them), each profile's conditions, and the Warning events of what is invalid, in the order raised."""

    pools: Mapping[str, PoolPlan]
    jobs: Mapping[tuple[str, str], JobPlan]
    profiles: Mapping[str, tuple[Condition, ...]]
    events: tuple[PlanEvent, ...]


@dataclass(frozen=True)
class PlanOptions:
    """Knobs of one plan. ``max_rounds``: market/placement rounds; ``max_deletes``: running pods one plan may delete
    (the churn budget; None = no bound); ``market_iterations``: dual evaluations per market solve; ``now``: the plan's
    clock in epoch seconds, for the time-dependent rules (backoff of failed pods, node-loss grace, minimum run time
    and cooldown of migrations); None means no clock: no node is lost by time, no backoff is measured, nothing
    migrates. ``max_migrations``: pods all migrating jobs together may move in one plan. ``node_loss_grace``: seconds
    a node may be NotReady before its pods are force-deleted and re-planned. ``reuse``: take from the
    caller's :class:`~walras.planner.reuse.PlanCache` what did not change (each phase's result whose inputs are
    unchanged, placement proposals, kept pods' plans; :mod:`walras.planner.plan`); False recomputes it all (still
    recording into the cache) and gives an equal plan (tests/test_planner_reuse.py compares the two)."""

    device: str = "cpu"
    max_rounds: int = 3
    max_deletes: int | None = None
    market_iterations: int = 60
    now: float | None = None
    max_migrations: int = 10
    node_loss_grace: float = NODE_LOSS_GRACE
    reuse: bool = True
    tenants: TenantOptions | None = None  # Budgets' Fisher market (walras.planner.tenants); None: off
    market_eps: float | None = None  # the market's duality-gap tolerance (None: the allocator's; tenants set it)


@dataclass(frozen=True)
class PlanContext:
    """What every phase after *objects* reads: the options, the clock, the effective typed cluster and its tables
    (node table as capacity built it, the valid objects, each job's template and admitted-node mask), the previous
    plan (read-only: prices to warm-start from, counters to carry) and this plan's access to the caller's cache."""

    options: PlanOptions
    cluster: Cluster
    table: NodeTable
    objects: Objects
    templates: tuple[JobTemplate, ...]
    admitted: tuple[np.ndarray, ...]
    previous: Plan | None
    reuse: Reuse

    @property
    def now(self) -> float | None:
        return self.options.now
