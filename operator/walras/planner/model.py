"""Data model of the planner: the cluster snapshot it reads and the plan it returns.

The planner is a pure function ``build_plan(snapshot, previous) -> Plan`` (see :mod:`walras.planner.plan`).
A :class:`Snapshot` holds raw Kubernetes objects as plain dicts (as the API server returns them, already
decoded from JSON); a :class:`Plan` holds everything the operator writes back (pods to create, bind, resize or
delete, what each status reports, Events) and everything the metrics and the scheduler extender show. Nothing here
talks to Kubernetes or builds an API object: :mod:`walras.kube.encode` turns a plan into pods, status bodies and
Events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, Literal, TypeVar

#: API group and version of the Walras custom resources.
GROUP = "walras.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

#: Labels and annotations Walras puts on the pods it manages.
LABEL_JOB = "walras.dev/job"
LABEL_POOL = "walras.dev/pool"
LABEL_MANAGED = "walras.dev/managed"
ANNOTATION_NODE = "walras.dev/planned-node"

#: A namespaced object's key; cluster-scoped objects use the empty namespace.
ObjectKey = tuple[str, str]

KubeObject = Mapping[str, Any]


@dataclass(frozen=True)
class Snapshot:
    """The cluster as the planner sees it: raw objects (dicts) of each kind, in any order."""

    nodes: tuple[KubeObject, ...] = ()
    pods: tuple[KubeObject, ...] = ()
    pools: tuple[KubeObject, ...] = ()  # ResourcePool
    jobs: tuple[KubeObject, ...] = ()  # FungibleJob
    profiles: tuple[KubeObject, ...] = ()  # ColocationProfile
    budgets: tuple[KubeObject, ...] = ()  # Budget (docs/budgets.md)
    namespaces: tuple[KubeObject, ...] = ()  # Namespace (their labels, for the Budgets' selectors)
    priorityclasses: tuple[KubeObject, ...] = ()  # PriorityClass (scheduling.k8s.io/v1; docs/preemption.md)
    resourcequotas: tuple[KubeObject, ...] = ()  # ResourceQuota (namespaces' limits, docs/refusals.md)


@dataclass(frozen=True)
class Condition:
    """A status condition in the Kubernetes convention (``type``, ``status`` True/False/Unknown, reason, message).
    Frozen: the planner reuses a job's conditions from one plan to the next where their inputs are equal."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class PlanEvent:
    """A Kubernetes Event the operator should record against an object. Frozen: plans share reused events."""

    kind: str  # "FungibleJob", "ResourcePool", "ColocationProfile", "Pod"
    namespace: str  # "" for cluster-scoped objects
    name: str
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


PodAction = Literal["create", "bind", "keep", "resize", "delete", "evict"]


_V = TypeVar("_V", "PodPlan", "JobPlan")


def evolve(value: _V, **changes: Any) -> _V:
    """``dataclasses.replace(value, **changes)`` for :class:`PodPlan` and :class:`JobPlan`, which have no
    ``__post_init__``, no ``init=False`` field and no cached attribute: a new instance whose fields are ``value``'s
    with ``changes``, set in one step instead of through the frozen ``__init__``, which sets each field with
    ``object.__setattr__`` (about 9 us per copy of a JobPlan's 25 fields against 1 us; the lifecycle and status
    phases copy each job plan up to four times a plan). An unknown field name is a ``TypeError``, as with
    ``replace``."""
    cls = type(value)
    names = cls.__dataclass_fields__
    if not changes.keys() <= names.keys():
        raise TypeError(f"{cls.__name__} has no field(s) {sorted(changes.keys() - names.keys())}")
    state = {name: value.__dict__[name] for name in names}
    state.update(changes)
    new = object.__new__(cls)
    object.__setattr__(new, "__dict__", state)
    return new


@dataclass(frozen=True)
class PodPlan:
    """One pod of a FungibleJob: where it goes and what it gets. Frozen: a plan shares unchanged pods' plans with
    the plan before it (:mod:`walras.planner.reconcile`); a phase that changes one builds a new one
    (``dataclasses.replace``).

    ``action`` says what the operator must do: ``create`` a new pod (named ``name``, so re-creating after a restart
    is idempotent), ``bind`` an existing pending pod to ``node``, ``keep`` a running pod as it is, ``resize`` a running
    pod's requests/limits in place (where the cluster supports it), ``delete`` a surplus pod, ``evict`` a running pod
    that rebalancing moves (through the Eviction API, so PodDisruptionBudgets hold; its replacement is a ``create``).
    For ``resize``, ``requests``/``limits`` are the new values and ``reason`` says what changes (``"cpu 2 -> 4"``);
    where the cluster has no in-place resize the operator leaves the pod as it is and the new values apply to the
    job's next pod.
    """

    namespace: str
    name: str
    job: str
    pool: str
    node: str | None
    requests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)
    action: PodAction = "create"
    exists: bool = False
    reason: str = ""
    #: For ``delete``/``evict``: the grace period to ask for (seconds; 0 forces the deletion of a pod on a lost node,
    #: whose kubelet will never confirm it); None keeps the pod's own terminationGracePeriodSeconds.
    grace: int | None = None

    @classmethod
    def kept(cls, namespace: str, name: str, job: str, pool: str, node: str | None,
             requests: Mapping[str, str]) -> PodPlan:
        """The ``keep`` plan of a running pod (its limits written as its requests), built without the frozen
        ``__init__`` (one ``object.__setattr__`` per field: 1.6 us per plan against 0.5 us here; a steady cluster of
        20,000 pods builds one per pod). Equal to ``PodPlan(namespace, name, job, pool, node, dict(requests),
        dict(requests), "keep", True, "")``."""
        plan = object.__new__(cls)
        object.__setattr__(plan, "__dict__", {
            "namespace": namespace, "name": name, "job": job, "pool": pool, "node": node,
            "requests": dict(requests), "limits": dict(requests), "action": "keep", "exists": True, "reason": "",
            "grace": None})
        return plan

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict (a flat copy: ``dataclasses.asdict`` deep-copies and took 1.1 s for 18,688 pods)."""
        return {
            "namespace": self.namespace, "name": self.name, "job": self.job, "pool": self.pool, "node": self.node,
            "requests": dict(self.requests), "limits": dict(self.limits), "action": self.action,
            "exists": self.exists, "reason": self.reason, "grace": self.grace,
        }


#: The rules that keep a replica out of a pool, one reason each (docs/troubleshooting.md lists them with what to do).
#: The status phase (``walras.planner.status._Diagnosis``) tries them in this order after the plan's placement and
#: stops at the first that holds.
REASONS: dict[str, str] = {
    "NoUsablePool": "no pool the job names can run it: unknown or invalid pools, throughput 0, or pods the pool can "
                    "never run",
    "NoReadyNode": "the pool matches no Ready, schedulable node",
    "NoEligibleNode": "no Ready node of the pool admits the pod (taints, nodeSelector, node affinity)",
    "TooLarge": "the pod requests more than the largest node of the pool may allocate",
    "DegreeLimited": "nodes have room for the pod but no pod slot under the pool's degreeLimit",
    "InsufficientCpu": "nodes have the priced resource free but too little cpu",
    "InsufficientMemory": "nodes have the priced resource free but too little memory",
    "InsufficientResource": "nodes have the priced resource free but too little of another requested resource",
    "Fragmented": "the pool has the priced resource free in total, but no node has a whole pod's worth",
    "InsufficientCapacity": "the pool has too little of the priced resource free",
    "PoolCapacity": "the pool's spec.capacity is sold out",
    "PriceAboveBid": "there is room, but the pool's price is at or above the job's bid for one more unit",
    "MarketShare": "there is room and the job bids above the price, but the market's share rounds to fewer replicas",
    "NoMarginalUtility": "one more replica adds nothing to the job's utility (a zero bid): no capacity makes it useful",
    "BudgetCap": "the tenant's Budget caps the pool (spec.caps[].maxUnits); its jobs admitted first leave too little",
    "BudgetShare": "there is room, but the job's part of its tenant's budget buys no more at the pool's price",
    "GangNotPlaceable": "a gang (spec.replicas.gang) needs all its replicas in one pool; no pool can place them all",
    # docs/refusals.md (walras.planner.quota)
    "QuotaLimited": "the namespace's ResourceQuota leaves room for fewer replicas than the job wants",
    "AdmissionRefused": "the API server refused the job's pods (Pod Security, quota, webhook); retried with backoff",
    # outages helper (issue 30 items 3, 5, 7): job conditions of the lifecycle and objects phases and of build_plan
    "Misplaced": "a pod of the job was bound to a node outside its pool (a scheduler bypassed Walras); it is removed "
                 "and its replacement backed off",
    "PodSecurityRefused": "the namespace's Pod Security level (pod-security.kubernetes.io/enforce) refuses the pod "
                          "template; no pod is created",
    "SolverFailed": "the market's solver failed on this job's numbers; the job is left out of the plan, the others "
                    "are planned",
}


@dataclass(frozen=True)
class Blocker:
    """Why replicas of a job do not run in one pool now, as the status phase found it after this plan's placement
    (:func:`walras.planner.status.blockers`): the rule (``reason``, one per rule, docs/troubleshooting.md), the
    replicas it keeps out, and a message with the numbers (units missing, nodes, degree limit, shortfalls). Frozen."""

    pool: str
    reason: str
    replicas: int
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"pool": self.pool, "reason": self.reason, "replicas": self.replicas, "message": self.message}


@dataclass(frozen=True)
class PoolPlan:
    """A ResourcePool's market state and placement summary. Frozen: the objects phase builds it, the phases after
    it return changed copies (``dataclasses.replace``)."""

    name: str
    resource: str
    policy: str
    node_count: int
    nodes: tuple[str, ...]
    capacity: float
    used: float
    price: float
    utilisation: float
    pods_planned: int = 0
    pods_bound: int = 0
    conditions: tuple[Condition, ...] = ()
    observed_generation: int | None = None
    #: For ``walras explain`` (the status phase): nodes the pool's selector matches (Ready or not), its
    #: ``spec.degreeLimit``, and the priced resource left after this plan (``capacity - used``, at least 0).
    member_count: int = 0
    degree_limit: int | None = None
    free: float = 0.0
    #: The clock times (``PlanOptions.now``) of the pool's preemptions over the last hour, one per preempted pod, for
    #: ``spec.preemption.maxPerHour`` (:mod:`walras.planner.preemption`; carried from plan to plan).
    preemptions: tuple[float, ...] = ()


#: At most this many preemption times are written to and read from a pool's status (the CRD's maxItems).
MAX_PREEMPTION_TIMES = 10_000


@dataclass(frozen=True)
class JobPlan:
    """A FungibleJob's allocation across pools (time fractions), its replicas and pods, and what it gets for it.
    Frozen: the objects phase builds it, the status and lifecycle phases return changed copies
    (``dataclasses.replace``)."""

    namespace: str
    name: str
    phase: str  # "Pending", "Running", "Invalid", "Unschedulable", "Complete", "Failed", "Suspended"
    allocation: dict[str, float] = field(default_factory=dict)  # pool -> fraction of time priced (004, x_i)
    replicas: dict[str, int] = field(default_factory=dict)  # pool -> pods placed (running, or with a node)
    throughput: float = 0.0  # of the placed replicas: sum_j a_ij placed_ij / N_i
    utility: float = 0.0  # u_i(throughput)
    cost: float = 0.0  # of the placed replicas at current prices: sum_j p_j d_i placed_ij
    allocation_text: str = ""  # "a100=0.46,v100=0.54" (printer column)
    wanted: dict[str, int] = field(default_factory=dict)  # pool -> replicas the market's allocation rounds to
    priced_throughput: float = 0.0  # a_i^T x_i
    priced_cost: float = 0.0  # sum_j p_j d_ij x_ij
    throughput_unit: str = "/s"
    target: float | None = None  # target throughput for target-priority utilities
    tenant: str = ""  # the job's tenant (walras.planner.tenants); empty with tenants off
    pods: tuple[PodPlan, ...] = ()
    conditions: tuple[Condition, ...] = ()
    observed_generation: int | None = None
    #: Lifecycle counters (:mod:`walras.planner.lifecycle`, :mod:`walras.planner.migration`); times in epoch seconds.
    failures: int = 0  # failed pods counted so far (status.failedPods)
    last_failure: float | None = None
    completion_time: float | None = None
    migrations: int = 0  # pods moved by rebalancing so far
    last_migration: float | None = None
    #: Identities (uid, else name) of the failed pods still visible that ``failures`` already counts: the next plan
    #: does not count them again (see :mod:`walras.planner.lifecycle`).
    counted_failures: frozenset[str] = field(default_factory=frozenset, repr=False, compare=False)
    #: What the pods say and why replicas wait (the status phase, :mod:`walras.planner.status`; ``walras explain``
    #: prints these, recomputing nothing): ``count`` is ``spec.replicas`` (an elastic job's maximum) and ``minimum``
    #: its minimum; ``running`` the job's pods that exist on a node in phase Running and ``bound`` those that exist
    #: on a node; ``demand`` the priced units one replica takes; per pool, ``units`` (``demand x replicas``) and
    #: ``spend`` (``price x units``) of the placed replicas and ``bids``, the marginal utility per unit at the
    #: granted allocation ``u_i'(t) a_ij / (N_i d_i)`` (004 Sec. 2.2; None where it is unbounded, a log utility at
    #: nothing granted), against the pool's price; ``blockers`` why replicas are not granted or not placed, per pool;
    #: ``reason`` the first blocker's reason ("" when nothing waits); ``queue_position`` its place (1 first) among the
    #: ``waiting`` jobs that have fewer replicas placed than ``count``, in the documented order (priority
    #: ``spec.weight`` high first, then the largest bid, then the oldest); ``created`` its creationTimestamp and
    #: ``first_running`` the earliest startTime of its running pods (epoch seconds).
    count: int = 0
    minimum: int = 0
    running: int = 0
    bound: int = 0
    demand: float = 0.0
    units: dict[str, float] = field(default_factory=dict)
    spend: dict[str, float] = field(default_factory=dict)
    bids: dict[str, float | None] = field(default_factory=dict)
    blockers: tuple[Blocker, ...] = ()
    reason: str = ""
    queue_position: int | None = None
    waiting: int = 0
    created: float | None = None
    first_running: float | None = None
    #: Misplacements (:mod:`walras.planner.lifecycle`, issue 30 item 3): pods of the job bound to a node outside
    #: their pool that the job cannot use (a scheduler that bypassed the extender), counted once each; the time of
    #: the last one (the replacement's backoff runs from it); the identities already counted, carried while visible.
    misplaced: int = 0
    last_misplaced: float | None = None
    counted_misplaced: frozenset[str] = field(default_factory=frozenset, repr=False, compare=False)
    misplaced_where: str = ""  # the last misplaced pod: "pod P on node N, outside pool 'X'"

    @property
    def key(self) -> ObjectKey:
        return (self.namespace, self.name)


def rfc3339(epoch: float) -> str:
    """Epoch seconds as the API server writes a time (``2026-11-25T15:00:00Z``, whole seconds, UTC)."""
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class SolverStats:
    """The price-discovery solve behind a plan (004, Alg. 2)."""

    iterations: int = 0
    gap: float = 0.0
    primal: float = 0.0
    dual: float = 0.0
    converged: bool = True
    seconds: float = 0.0
    device: str = "cpu"
    rounds: int = 1  #: market -> placement rounds (the market re-prices what placement could not realise)
    eps: float = 0.0  #: the duality-gap tolerance ``converged`` was judged against
    #: no solve ran in this plan: every input was the previous plan's, and so is the result (``seconds`` is 0, the
    #: other fields are that solve's)
    reused: bool = False
    #: the integral fill's route (``exact``: HiGHS MILP, ``search``: greedy marginal utility; ``""``: nothing to
    #: fill) and, where the exact route certified one, its gap to the optimum of the fill (:mod:`allocator.integral`)
    integral_route: str = ""
    integral_gap: float | None = None


@dataclass(frozen=True)
class TenantPlan:
    """One tenant of the Budgets' Fisher market (:mod:`walras.planner.tenants`, docs/budgets.md): its name (a
    Budget's, or ``namespace/<name>`` for a namespace no single Budget selects), the Budget (None: a default
    tenant), its share (budget, credits per hour) and namespaces; ``units`` per pool of the priced resource its
    placed pods hold; ``spend_rate`` what they pay at the pools' prices (credits per hour: sum_j p_j units_j);
    ``priced_spend`` what the market's allocation spends (sum_i sum_j p_j d_ij x_ij, at most ``share``);
    ``caps`` its caps (units); ``overlaps`` the namespaces it selects that another Budget selects too (planned
    under neither); ``jobs`` its priced jobs; ``conditions`` for the Budget's status."""

    name: str
    budget: str | None
    share: float
    namespaces: tuple[str, ...] = ()
    units: Mapping[str, float] = field(default_factory=dict)
    spend_rate: float = 0.0
    priced_spend: float = 0.0
    caps: Mapping[str, float] = field(default_factory=dict)
    overlaps: tuple[str, ...] = ()
    jobs: tuple[ObjectKey, ...] = ()
    conditions: tuple[Condition, ...] = ()


@dataclass(frozen=True)
class Plan:
    """Everything the operator, the extender and the metrics need from one planning pass. Frozen, its pods and events
    tuples (lists given are stored as tuples); the reuse state between plans is not here but in the caller's
    :class:`walras.planner.reuse.PlanCache`."""

    pools: Mapping[str, PoolPlan] = field(default_factory=dict)
    jobs: Mapping[ObjectKey, JobPlan] = field(default_factory=dict)
    pods: tuple[PodPlan, ...] = ()
    profiles: Mapping[str, tuple[Condition, ...]] = field(default_factory=dict)  # ColocationProfile -> conditions
    events: tuple[PlanEvent, ...] = ()
    solver: SolverStats = field(default_factory=SolverStats)
    seconds: float = 0.0
    tenants: Mapping[str, TenantPlan] = field(default_factory=dict)  # empty with tenants off
    #: The pods whose requests this plan reserved on a node for kube-scheduler's nomination: pod -> (node, since
    #: when, epoch seconds; None without a clock); the next plan holds them a while after the nomination is
    #: cleared (walras.planner.capacity.nominations, docs/refusals.md)
    nominations: Mapping[ObjectKey, tuple[str, float | None]] = field(default_factory=dict)
    #: With tenants: each priced job's market weight ``b'`` in this plan's market (docs/budgets.md, T6), with its
    #: pools' prices the next plan's warm start, so an unchanged cluster's market stays at its fixed point.
    market_weights: Mapping[ObjectKey, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("pods", "events"):
            value = getattr(self, name)
            if type(value) is not tuple:
                object.__setattr__(self, name, tuple(value))

    __hash__ = object.__hash__  # by identity (the extender and the operator cache by plan)

    @property
    def prices(self) -> dict[str, float]:
        return {name: pool.price for name, pool in self.pools.items()}

    @cached_property
    def _by_key(self) -> dict[tuple[str, str], PodPlan]:
        return {(p.namespace, p.name): p for p in self.pods}

    def pod(self, namespace: str, name: str) -> PodPlan | None:
        """The plan for one pod, or None if Walras does not manage it (O(1) through an index of ``pods``, built on
        first use)."""
        return self._by_key.get((namespace, name))
