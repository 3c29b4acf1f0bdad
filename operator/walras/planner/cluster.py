"""The typed cluster model: what the planner's phases read, after the translation layer (:mod:`.translate`).

Nothing downstream of the translation reads a raw API dict. Quantities are parsed once, into floats keyed by the
resource name (``cpu`` in cores, ``memory`` in bytes, ``pods`` in pods, extended resources such as
``nvidia.com/gpu`` in units). Objects are frozen; collections are tuples in name order, so a cluster is a value.

Requests follow kube-scheduler's accounting (``NodeInfo``, ``computePodResourceRequest``): a pod requests the sum of
its containers' requests (a limit stands in for a missing request, as the API server defaults it), at least the
largest init container's request, plus its ``overhead``; and one ``pods`` slot. Every pod bound to a node and not in
a terminal phase counts on that node, terminating ones included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from walras.planner.spec import JobSpec, PoolSpec, ProfileSpec

#: The pod-count resource: each pod requests one; a node's ``allocatable.pods`` bounds it (default 110, as kubelet).
PODS = "pods"
DEFAULT_MAX_PODS = 110.0

Resources = Mapping[str, float]

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class Toleration:
    """A pod toleration (``operator`` Exists or Equal; an empty key with Exists tolerates every taint)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """Whether this toleration matches ``taint`` (``v1.Toleration.ToleratesTaint``)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return bool(self.key) and self.value == taint.value


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` entry of a required node-affinity term."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.operator == "In":
            return present and value in self.values
        if self.operator == "NotIn":
            return not present or value not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator in ("Gt", "Lt") and present and self.values:
            try:
                have, bound = int(str(value)), int(self.values[0])
            except ValueError:
                return False
            return have > bound if self.operator == "Gt" else have < bound
        return False


@dataclass(frozen=True)
class Constraints:
    """Where a job's pods may go, from its pod template: ``nodeSelector``, tolerations, and the required node
    affinity (terms ORed, requirements within a term ANDed), as kube-scheduler's NodeAffinity and TaintToleration
    filters read them."""

    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    affinity: tuple[tuple[Requirement, ...], ...] = ()

    def admits(self, node: Node) -> bool:
        """Whether a pod with these constraints may be placed on ``node`` (labels and NoSchedule/NoExecute taints)."""
        labels = node.labels
        if any(labels.get(k) != v for k, v in self.node_selector):
            return False
        if self.affinity and not any(all(r.matches(labels) for r in term) for term in self.affinity):
            return False
        for taint in node.taints:
            if taint.effect in ("NoSchedule", "NoExecute") and not any(t.tolerates(taint) for t in self.tolerations):
                return False
        return True


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str]
    allocatable: Resources  # includes PODS
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    unschedulable: bool = False
    #: When the node stopped being Ready (the ``Ready`` condition's ``lastTransitionTime``, epoch seconds), while it
    #: is not Ready; None when Ready or when the time is not known.
    not_ready_since: float | None = None

    @property
    def usable(self) -> bool:
        """Ready and not cordoned: new pods may go here (pods already bound stay and count either way)."""
        return self.ready and not self.unschedulable


@dataclass(frozen=True)
class Pod:
    """A pod as the planner counts it. ``node`` is ``spec.nodeName`` (None while Pending). ``job`` is the
    FungibleJob's name for a pod Walras manages, else None. ``first`` is the first container's (requests, limits) as
    written (quantity strings), the part Walras sets and resizes. ``assumed`` marks a pod the operator created or
    bound that the watch has not shown yet (see :mod:`.cache`)."""

    namespace: str
    name: str
    node: str | None
    requests: Resources  # kube-scheduler's effective request, PODS included
    phase: str = "Pending"
    terminating: bool = False
    job: str | None = None
    pool: str | None = None  # the walras.dev/pool label of a managed pod
    first: tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = ((), ())
    uid: str = ""
    assumed: bool = False
    started: float | None = None  # status.startTime (epoch seconds), set once the kubelet accepted the pod
    reason: str = ""  # status.reason, e.g. OutOfcpu (kubelet admission) or Evicted
    #: ``status.nominatedNodeName``: the node kube-scheduler preempted for this pod and holds for it until it binds
    #: (docs/refusals.md, "Nominations"); None when not nominated.
    nominated: str | None = None
    priority: int = 0  # spec.priority (resolved from its PriorityClass by the API server; 0 without one)
    #: The ``walras.dev/planned-node`` annotation of a managed pod: the node the plan that created it chose. A pending
    #: pod keeps that node while it fits (:func:`walras.planner.rounds.run_rounds`), so a plan without the previous
    #: plan (after a restart, or ``walras plan`` of emitted pods) places it where the plan that created it did.
    planned: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True)
class JobTemplate:
    """What the planner reads of a job's ``spec.template``: its placement constraints and the requests of its
    containers (the first container's own, overridden by Walras; the others' summed, as they ride along)."""

    constraints: Constraints = Constraints()
    first: Resources = field(default_factory=dict)
    others: Resources = field(default_factory=dict)  # sum over the other containers
    init: Resources = field(default_factory=dict)  # max over init containers
    overhead: Resources = field(default_factory=dict)


@dataclass(frozen=True)
class ReportedStatus:
    """What a FungibleJob's status said last (for ``walras check``: statuses that disagree with the pods)."""

    replicas: Mapping[str, int] = field(default_factory=dict)
    phase: str = ""
    observed_generation: int | None = None
    failures: int = 0  # status.failedPods: failed pods counted so far (the backoff limit applies to it)
    last_failure: float | None = None  # status.lastFailureTime (epoch seconds)
    migrations: int = 0  # status.migrations: pods moved by rebalancing so far
    last_migration: float | None = None  # status.lastMigrationTime (epoch seconds)
    completed: float | None = None  # status.completionTime (epoch seconds)
    misplaced: int = 0  # status.misplacedPods: misplaced pods counted so far (their replacement's backoff)
    last_misplaced: float | None = None  # status.lastMisplacementTime (epoch seconds)
    #: ``status.admissionRefusal``: the operator's record of the API server's refusal of the job's pod creations, as
    #: it last wrote it (None without one, or when written for another ``metadata.generation``), read back after a
    #: restart (docs/refusals.md)
    refusal: Refusal | None = None


@dataclass(frozen=True)
class Job:
    """A FungibleJob: its validated spec (or why it is invalid), its template, what its status reports."""

    namespace: str
    name: str
    generation: int | None
    spec: JobSpec | None
    error: str | None = None
    template: JobTemplate = JobTemplate()
    reported: ReportedStatus = ReportedStatus()
    created: float | None = None  # metadata.creationTimestamp (epoch seconds)
    # --- contention (docs/preemption.md) ---
    #: The job's priority: its template's ``priority`` when set, else its ``priorityClassName`` resolved against the
    #: PriorityClass objects (scheduling.k8s.io/v1), else the value of the globalDefault class, else 0
    #: (:func:`walras.kube.decode.with_priorities`). Higher is served first and may preempt lower (docs/preemption.md).
    priority: int = 0
    #: ``spec.preemptible`` (default true): false means no pod of the job is ever preempted.
    preemptible: bool = True
    #: The template's ``priorityClassName`` ("" when unset), resolved into :attr:`priority` by the decode.
    priority_class: str = ""
    #: Whether the template sets ``priority`` itself (then :attr:`priority` is that value, no class is looked up).
    priority_explicit: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class Pool:
    name: str
    generation: int | None
    spec: PoolSpec | None
    error: str | None = None
    #: ``status.preemptionTimes`` (epoch seconds): the pool's preemptions over the last hour as the operator last
    #: wrote them, so that ``spec.preemption.maxPerHour`` holds across an operator restart (docs/preemption.md)
    preemptions: tuple[float, ...] = ()


@dataclass(frozen=True)
class Profile:
    name: str
    generation: int | None
    spec: ProfileSpec | None
    error: str | None = None


@dataclass(frozen=True)
class LabelSelector:
    """A ``metav1.LabelSelector``: ``matchLabels`` ANDed with ``matchExpressions`` (In, NotIn, Exists,
    DoesNotExist). The empty selector matches every namespace, as in Kubernetes."""

    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy every ``matchLabels`` entry and every expression."""
        return all(labels.get(k) == v for k, v in self.match_labels) and all(r.matches(labels) for r in
                                                                              self.expressions)


@dataclass(frozen=True)
class BudgetSpec:
    """A validated Budget: which namespaces form the tenant (``selector`` and/or ``namespaces``; a namespace is in
    the tenant when it is listed or its labels match the selector), the tenant's ``share`` of the market (> 0,
    relative to the other tenants' shares: its budget in credits per hour, docs/budgets.md) and ``caps``, the most
    units of each named pool's priced resource the tenant's pods may hold."""

    share: float
    namespaces: tuple[str, ...] = ()
    selector: LabelSelector | None = None
    caps: tuple[tuple[str, float], ...] = ()

    def selects(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether the namespace ``namespace`` with ``labels`` belongs to this Budget's tenant."""
        return namespace in self.namespaces or (self.selector is not None and self.selector.matches(labels))


@dataclass(frozen=True)
class BudgetReported:
    """What a Budget's status said last, read back so that the accumulated spend survives a restart: the credits
    spent since creation and when that total was last brought up to date (epoch seconds; None: never)."""

    spent: float = 0.0
    updated: float | None = None
    rate: float = 0.0  # the spend rate reported with them (credits per hour), in effect since ``updated``


@dataclass(frozen=True)
class Budget:
    """A Budget (cluster-scoped): its validated spec (or why it is invalid), creation time and reported status."""

    name: str
    generation: int | None
    spec: BudgetSpec | None
    error: str | None = None
    created: float | None = None
    reported: BudgetReported = BudgetReported()


@dataclass(frozen=True)
class TenantOptions:
    """How the planner forms tenants (docs/budgets.md): ``default_share`` is the share of a namespace that no
    Budget selects (each such namespace is a tenant of its own). ``PlanOptions.tenants = None`` turns tenants off:
    every job is its own buyer with its own utility, as before budgets."""

    default_share: float = 1.0
    #: The market's duality-gap tolerance relative to the total budget: ``eps = gap * sum_i b_i`` (docs/budgets.md,
    #: "Accuracy"). The allocator's default ``1e-3 n`` (004 Sec. 5) is an absolute gap for unit-weight log jobs; the
    #: budgets' weights sum to ``sum_t B_t`` instead, and a tenant's spend error grows as ``sqrt(2 gap / sum B)``.
    gap: float = 1e-5


@dataclass(frozen=True)
class Cluster:
    """The whole typed model: every tuple in name order (pods and jobs by (namespace, name)). ``namespaces`` maps a
    Namespace's name to its labels (for the Budgets' selectors); a namespace absent from it has no labels."""

    nodes: tuple[Node, ...] = ()
    pods: tuple[Pod, ...] = ()
    pools: tuple[Pool, ...] = ()
    jobs: tuple[Job, ...] = ()
    profiles: tuple[Profile, ...] = ()
    budgets: tuple[Budget, ...] = ()
    namespaces: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: PriorityClass name -> value (scheduling.k8s.io/v1; docs/preemption.md), for reports; jobs carry theirs resolved.
    priority_classes: Mapping[str, int] = field(default_factory=dict)
    #: job key -> the operator's record of the API server refusing its pods (docs/refusals.md)
    refused: Mapping[tuple[str, str], Refusal] = field(default_factory=dict)
    #: the ResourceQuotas (without scopes), in (namespace, name) order (docs/refusals.md)
    quotas: tuple[Quota, ...] = ()

    def resource_names(self) -> tuple[str, ...]:
        """Every resource named by a node's allocatable or a live pod's request, ``pods`` first, then sorted."""
        names = {PODS}
        for node in self.nodes:
            names.update(node.allocatable)
        for pod in self.pods:
            if not pod.terminal:
                names.update(pod.requests)
        return (PODS, *sorted(names - {PODS}))


@dataclass(frozen=True)
class Refusal:
    """The API server refused to create pods of a job (Pod Security, ResourceQuota, an admission webhook): the
    operator's record (:class:`walras.operator.actuator.Actuator`), an input of the plan (``Cluster.refused``,
    docs/refusals.md). ``pods`` were refused in the last attempt, ``message`` is the API server's, and until
    ``until`` (epoch seconds, the clock of ``PlanOptions.now``; None: until the caller says otherwise) the plan holds
    no capacity for the job's replicas that have no pod (:mod:`walras.planner.quota`)."""

    message: str
    pods: int = 1
    until: float | None = None
    code: int = 403
    attempts: int = 1  # refusals in a row (each doubles the backoff)


@dataclass(frozen=True)
class Quota:
    """A ResourceQuota's hard limits, as request amounts of the planner's resources (``requests.cpu`` and ``cpu``
    -> ``cpu``, ``requests.nvidia.com/gpu`` -> ``nvidia.com/gpu``, ``pods`` and ``count/pods`` -> ``pods``); limits
    on ``limits.*`` and other object counts are not modelled, nor are quotas with scopes (docs/refusals.md)."""

    namespace: str
    name: str
    hard: Resources


def pod_vector(template: JobTemplate, job: JobSpec, priced: str, amount: float) -> dict[str, float]:
    """The effective request of a pod Walras creates for ``job`` with ``amount`` of the ``priced`` resource: the
    template's first container overridden by the job's ``spec.resources`` and the priced amount (what
    :func:`walras.kube.encode.build_pod` writes), plus the other containers, at least the largest init
    container, plus overhead, plus one pod slot."""
    first = {**template.first, **job.resources, priced: amount}
    total = dict(template.others)
    for name, value in first.items():
        total[name] = total.get(name, 0.0) + value
    for name, value in template.init.items():
        if value > total.get(name, 0.0):
            total[name] = value
    for name, value in template.overhead.items():
        total[name] = total.get(name, 0.0) + value
    total[PODS] = 1.0
    return {k: v for k, v in total.items() if v > 0}
