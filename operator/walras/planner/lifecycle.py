"""Phase *lifecycle*: a job over time (completion, failed pods with backoff and a limit, node loss, suspension), as
two steps around the market with an explicit clock (``now``, epoch seconds, or None when the caller has none).

:func:`prepare` runs before the market, on the typed cluster. It returns an *effective* cluster that the existing
phases plan as usual:

* a managed pod on a **lost node** (a node that no longer exists, or that has been NotReady for at least ``grace``
  seconds since its ``Ready`` condition changed) is force-deleted (``delete`` with ``grace=0``, reason ``NodeLost``:
  its kubelet will never confirm a graceful deletion) and leaves the effective cluster as a terminal pod: it counts on
  no node and is no replica, so the job's replica is placed elsewhere in the same plan, while its name stays taken.
  Before the grace period (or without a clock, or without a transition time) the pod is kept and counted, as before;
* a job one of whose pods **Succeeded** creates no new pod (its effective replicas are its live pods); once none is
  live it is ``Complete``: effective replicas 0, so it leaves the market and its capacity is priced again (terminal
  pods count on no node). Succeeded pods are never deleted nor re-created. A job reported ``Complete`` (by its status
  or by the previous plan) for its current generation stays ``Complete``;
* a **Failed** pod (kubelet admission failures ``OutOf<resource>`` included) is deleted and counted once in
  ``status.failedPods``. The count is idempotent over plans of the same cluster: a failed pod is counted only when it
  is neither terminating (its deletion was already issued, so an earlier plan counted it) nor in the previous plan's
  ``counted_failures`` (the identities, uid else name, of the visible failed pods already counted, carried from plan
  to plan while the pod is visible); the base is the larger of the status's and the previous plan's count. While the
  backoff runs (``min(10 s * 2^(failures-1), 360 s)`` from ``status.lastFailureTime``, batch/v1 Job's schedule) the
  job creates no new pod (effective replicas: its live pods). ``lastFailureTime`` is the plan's clock when a failure
  is first counted;
* a job with more failures than ``spec.backoffLimit`` is ``Failed`` (reason ``BackoffLimitExceeded``): effective
  replicas 0, so its live pods are deleted and its share released. Raising the limit lets it run again;
* ``spec.suspend`` makes the job ``Suspended``: effective replicas 0 (its pods are deleted gracefully, its share
  released); setting it back to false re-plans it.

* a pod the **previous plan evicted** (rebalancing, :mod:`.migration`) that is still there and not terminating (a
  PodDisruptionBudget refused the eviction, or the cache has not shown it yet) stays on its way out: its eviction is
  planned again and the effective cluster marks it terminating, so it still counts on its node but is no replica
  (its replacement exists; without this the job would have a pod too many and reconcile would *delete* one,
  bypassing the budget).

* **mass disruption** (kube-controller-manager's ``--unhealthy-zone-threshold``, 0.55): when at least
  :data:`UNHEALTHY_THRESHOLD` of a pool's nodes, or of the cluster's, are NotReady at once, the cause is more likely
  the control plane or the network than the nodes, so nothing of that pool (of every pool, for the cluster) is
  removed: no lost pod is force-deleted after the grace, and the reconcile phase removes no running pod there
  (:func:`disruption`, read by both). The pool gets a Warning Event ``NodesDisrupted`` (:func:`conclude`).

* a **misplaced** pod (issue 30 item 3: bound to a node that its own pool's ``nodeSelector``, the required node
  affinity :func:`walras.kube.encode.build_pod` gives every pod, does not match, in no pool the job can use: a
  scheduler bypassed the extender, or a binding was made by hand) is removed as surplus by the reconcile phase, as
  before, but it is counted once (``misplaced``, its identity carried in ``counted_misplaced`` while it is visible;
  the count and the time of the last are written to ``status.misplacedPods`` and ``status.lastMisplacementTime`` and
  read back after an operator restart) and its replacement is **backed off**: for :func:`misplaced_delay` ``(k) =
  min(10 s * 2^(k-1), 300 s)`` after the k-th misplacement the job creates no new pod (effective replicas: its live
  pods that are not misplaced), so a scheduler that keeps misplacing makes at most about ``log2(T / 10 s) + 2``
  rounds of creations (each at most the job's replicas) in the first ``T`` seconds (then one per 300 s), never a
  create/delete loop. The job gets the condition ``Misplaced``
  (naming the pod, the node and the pool) and one Warning Event ``Misplaced`` per counted pod, whose message names
  the node and the pool only, so that the same misplacement is one Event (the operator posts an Event of
  the same text once; the recorder aggregates repeats into its count);

* a job whose pod template the namespace's **Pod Security** level (``pod-security.kubernetes.io/enforce``) refuses
  (:func:`walras.planner.podsecurity.violations`) creates no new pod (effective replicas: its live pods, which the
  API server admitted before and which Pod Security never removes) and gets the condition ``PodSecurity=False``
  (reason ``PodSecurityRefused``, naming the failed checks) and one Warning Event when the refusal starts, instead
  of a create refused with 403 at every plan. A level label that is not a level is ``restricted``, as Pod Security
  admission reads it; an admitted template then gets ``PodSecurity=True`` saying so (reason
  ``InvalidEnforceLevel``; ``InvalidEnforceVersion`` for an invalid version label);

Precedence: Complete, then Failed, then Suspended, then Pod Security, then backoff, then misplacement. Without a
clock no node is lost by time (a node that is gone still is) and no backoff is measured (a failed pod's or a
misplaced pod's replacement is planned at once, as before this phase).

:func:`conclude` runs after the status phase: it adds this phase's deletions to the plan, gives the deletions of a
Failed or Suspended job their reason, sets the phase, conditions, events and the counters (``failedPods``,
``lastFailureTime``, ``completionTime``, ``migrations``, ``lastMigrationTime``) of every job, and reports the
throughput and utility of a job whose effective replicas differ from its spec over its real replica count.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from walras.planner.cluster import Cluster, Job, Node, Pod, ReportedStatus
from walras.planner.market import utility_values
from walras.planner.model import Condition, JobPlan, ObjectKey, Plan, PlanEvent, PodPlan, evolve, rfc3339
from walras.planner.podsecurity import ENFORCE_LABEL, Policy, policy_of, violations
from walras.planner.results import NODE_LOSS_GRACE, Actions, Concluded, PlanContext
from walras.planner.reuse import Inputs, Reuse, Same
from walras.planner.spec import JobSpec

#: batch/v1 Job's pod failure backoff: 10 s, doubled per failure, at most 6 minutes.
BACKOFF_BASE = 10.0
BACKOFF_CAP = 360.0
#: kube-controller-manager's ``--unhealthy-zone-threshold``: the share of NotReady nodes at which a zone counts as
#: disrupted and the node lifecycle controller stops evicting its pods.
UNHEALTHY_THRESHOLD = 0.55
#: The replacement of a misplaced pod: 10 s, doubled per misplacement of the job, at most 5 minutes.
MISPLACED_BASE = 10.0
MISPLACED_CAP = 300.0
#: Conditions of the market's view that mean nothing for a job out of the market.
_MARKET_CONDITIONS = ("Scheduled", "ReplicasPlaceable", "PlacedAsPriced", "MinimumReplicas", "ReplicasGranted")


def backoff_delay(failures: int) -> float:
    """Seconds a job waits after its ``failures``-th failure before it creates a pod again (0 without failures)."""
    if failures <= 0:
        return 0.0
    return min(BACKOFF_BASE * 2.0 ** min(failures - 1, 16), BACKOFF_CAP)


def misplaced_delay(misplacements: int) -> float:
    """Seconds a job waits after its ``misplacements``-th misplaced pod before it creates a pod again (0 without)."""
    if misplacements <= 0:
        return 0.0
    return min(MISPLACED_BASE * 2.0 ** min(misplacements - 1, 16), MISPLACED_CAP)


@dataclass(frozen=True)
class Disruption:
    """Where most nodes are NotReady at once (:data:`UNHEALTHY_THRESHOLD`): ``pools`` maps each disrupted pool to
    ``(NotReady nodes, nodes)``; ``cluster`` is ``(NotReady nodes, nodes)`` of the whole cluster when it is disrupted
    (then every pool is); ``held`` the nodes whose pods nothing may remove."""

    pools: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    cluster: tuple[int, int] | None = None
    held: frozenset[str] = frozenset()

    def message(self, pool: str) -> str:
        """Why nothing of ``pool`` is removed (empty when it is not held)."""
        if self.cluster is not None:
            down, total = self.cluster
            return (f"{down} of the cluster's {total} nodes are NotReady (>= {UNHEALTHY_THRESHOLD:.0%}): no pod is "
                    "removed until most nodes are Ready again")
        if pool in self.pools:
            down, total = self.pools[pool]
            return (f"{down} of the pool's {total} nodes are NotReady (>= {UNHEALTHY_THRESHOLD:.0%}): no pod of the "
                    "pool is removed until most of its nodes are Ready again")
        return ""


NO_DISRUPTION = Disruption()


def disrupted(down: int, total: int) -> bool:
    """Whether ``down`` NotReady nodes of ``total`` make a disrupted zone (kube-controller-manager's node lifecycle
    controller: the unhealthy share reaches ``--unhealthy-zone-threshold``)."""
    return total > 0 and down > 0 and down >= UNHEALTHY_THRESHOLD * total


def disruption(cluster: Cluster) -> Disruption:
    """The :class:`Disruption` of ``cluster``: each valid pool's nodes (a node in the first pool, in name order, whose
    ``nodeSelector`` it matches, as :func:`walras.planner.objects.build_objects` assigns them) and the whole
    cluster, with how many of them are NotReady. :data:`NO_DISRUPTION` when every node is Ready (the common case:
    one pass over the nodes)."""
    nodes = cluster.nodes
    down = [n for n in nodes if not n.ready]
    if not down:
        return NO_DISRUPTION
    if disrupted(len(down), len(nodes)):
        return Disruption(cluster=(len(down), len(nodes)), held=frozenset(n.name for n in nodes))
    members: dict[str, list[Node]] = defaultdict(list)
    by_name = {n.name: n for n in nodes}
    for name, pool in pool_of_nodes(cluster).items():
        members[pool].append(by_name[name])
    pools: dict[str, tuple[int, int]] = {}
    held: set[str] = set()
    for name, group in members.items():
        count = sum(1 for n in group if not n.ready)
        if disrupted(count, len(group)):
            pools[name] = (count, len(group))
            held.update(n.name for n in group)
    return Disruption(pools, None, frozenset(held)) if pools else NO_DISRUPTION


def pool_of_nodes(cluster: Cluster) -> dict[str, str]:
    """Each node's pool: the first valid pool, in name order, whose ``nodeSelector`` the node's labels match (as
    :func:`walras.planner.objects.build_objects` assigns them); nodes of no pool are left out."""
    out: dict[str, str] = {}
    for pool in cluster.pools:
        if pool.spec is None:
            continue
        selector = pool.spec.node_selector.items()
        for n in cluster.nodes:
            if n.name not in out and all(n.labels.get(k) == v for k, v in selector):
                out[n.name] = pool.name
    return out


def _astray(cluster: Cluster, nodes: Mapping[str, Node]) -> dict[ObjectKey, tuple[tuple[Pod, str | None], ...]]:
    """Per job, its live pods bound to an existing node that their own pool's ``nodeSelector`` (the ``walras.dev/pool``
    label names the pool) does not match, each with the node's pool (None: the node is in no pool). Whether the job
    can use that pool is the caller's question (it reads the job's current spec)."""
    selectors = {p.name: p.spec.node_selector.items() for p in cluster.pools if p.spec is not None}
    found: dict[ObjectKey, list[Pod]] = defaultdict(list)
    for pod in cluster.pods:
        if pod.job is None or pod.node is None or pod.pool is None or pod.terminating or pod.terminal:
            continue
        selector = selectors.get(pod.pool)
        node = nodes.get(pod.node)
        if selector is None or node is None or all(node.labels.get(k) == v for k, v in selector):
            continue
        found[(pod.namespace, pod.job)].append(pod)
    if not found:
        return {}
    where = pool_of_nodes(cluster)
    return {key: tuple((p, where.get(p.node or "")) for p in pods) for key, pods in found.items()}


def latest(*times: float | None) -> float | None:
    """The latest of the known times (None when none is known)."""
    known = [t for t in times if t is not None]
    return max(known) if known else None


@dataclass
class JobLife:
    """Where one valid job stands. ``state``: ``Active``, ``Backoff`` (failed pods wait for their replacement),
    ``Completing`` (a pod succeeded, others still run), ``Complete``, ``Failed`` or ``Suspended``."""

    spec: JobSpec  # as the user wrote it (the effective cluster may carry fewer replicas)
    state: str
    replicas: int  # effective replicas handed to the market
    live: int
    succeeded: int
    failures: int
    counted: frozenset[str]
    new_failures: list[Pod]
    last_failure: float | None
    completion: float | None
    retry_at: float | None = None  # end of the backoff
    #: misplacements (module docstring): counted so far, the pods visible now (each with its node's pool), the
    #: newly counted ones, the time of the last, the identities counted, the end of the replacement's backoff
    misplaced: int = 0
    astray: tuple[tuple[Pod, str | None], ...] = ()
    new_misplaced: tuple[tuple[Pod, str | None], ...] = ()
    last_misplaced: float | None = None
    counted_misplaced: frozenset[str] = frozenset()
    misplaced_until: float | None = None
    misplaced_where: str = ""  # the last misplaced pod, its node and pool (for the condition once it is gone)
    #: Pod Security: the namespace's enforced level and version and what of the template it refuses (empty:
    #: admitted); whether the previous plan already reported the refusal
    policy: Policy = field(default_factory=Policy)
    refused: tuple[str, ...] = ()
    was_refused: bool = False


@dataclass
class Lifecycle:
    """What :func:`prepare` decided: the effective cluster, each valid job's state, this phase's deletions."""

    cluster: Cluster
    jobs: dict[ObjectKey, JobLife] = field(default_factory=dict)
    pods: dict[ObjectKey, list[PodPlan]] = field(default_factory=lambda: defaultdict(list))
    lost: dict[ObjectKey, int] = field(default_factory=lambda: defaultdict(int))
    now: float | None = None
    evicting: bool = False  # some pod the previous plan evicted is still there
    #: where most nodes are NotReady: nothing of those pools is removed (:func:`disruption`)
    disruption: Disruption = NO_DISRUPTION
    #: lost pods kept because their pool (or the cluster) is disrupted, per job
    held_lost: dict[ObjectKey, int] = field(default_factory=lambda: defaultdict(int))

    @property
    def held(self) -> frozenset[ObjectKey]:
        """Jobs whose state holds them below their spec (every state but ``Active``): not to be rebalanced."""
        return frozenset(key for key, job in self.jobs.items() if job.state != "Active")


def _identity(pod: Pod) -> str:
    return pod.uid or pod.name


def _lost(node: Node | None, name: str, now: float | None, grace: float) -> str | None:
    """Why a pod bound to node ``name`` is lost, or None while it is not."""
    if node is None:
        return f"node {name} is gone"
    if node.ready or node.not_ready_since is None or now is None:
        return None
    down = now - node.not_ready_since
    if down >= grace:
        return f"node {name} has been NotReady for {down:.0f} s (grace {grace:g} s)"
    return None


@dataclass(frozen=True, slots=True)
class Tally:
    """Of a job's pods: how many are live (neither terminal nor terminating), how many succeeded, the failed ones."""

    live: int
    succeeded: int
    failed: tuple[Pod, ...]


_NO_PODS = Tally(0, 0, ())


@dataclass(frozen=True)
class TallyEntry:
    """The lifecycle phase's record (:mod:`.reuse`): each job's :class:`Tally` of the pods and nodes in ``inputs``
    (``(Same(pods), Same(nodes), the pools' node selectors)``), from a pass that lost and evicted nothing, and each
    job's pods bound outside their pool (:func:`_astray`)."""

    inputs: Inputs
    tallies: Mapping[ObjectKey, Tally]
    astray: Mapping[ObjectKey, tuple[tuple[Pod, str | None], ...]] = field(default_factory=dict)


def prepare(cluster: Cluster, previous: Plan | None, *, now: float | None,
            grace: float = NODE_LOSS_GRACE, reuse: Reuse | None = None) -> Lifecycle:
    """The pre-market step (see the module docstring): lost pods out, effective replicas of each valid job. With
    ``reuse`` (the caller's cache, :mod:`.reuse`), the pass over the pods (each job's live, succeeded
    and failed pods, :func:`_tally`) is the previous plan's when its pods and nodes are the same objects in the same
    order, no pod was lost or evicted then, and none can be now (every node is Ready, or has no transition time, or
    there is no clock: a pod is then lost only on a node that is gone, and the nodes are the same; the previous plan
    evicted nothing). This plan's pass is recorded when it lost and evicted nothing."""
    reuse = reuse or Reuse.off()
    nodes = {n.name: n for n in cluster.nodes}
    # nodes whose pods cannot be lost at this clock (_lost is None for them): one set lookup per pod, not a call
    safe = {n.name for n in cluster.nodes if n.ready or n.not_ready_since is None or now is None}
    # only a move's eviction is carried (its replacement exists); the reconcile phase plans a shrink's again
    evicting = {(p.namespace, p.name): p for p in previous.pods
                if p.action == "evict" and _is_move(p)} if previous is not None else {}
    out = Lifecycle(cluster, now=now, disruption=disruption(cluster))
    steady = not evicting and len(safe) == len(cluster.nodes)  # nothing evicted, no node lost by time
    selectors = tuple((p.name, tuple(sorted(p.spec.node_selector.items()))) for p in cluster.pools
                      if p.spec is not None)
    inputs = (Same(cluster.pods), Same(cluster.nodes), selectors)
    hit = reuse.lookup(TallyEntry, inputs) if steady else None
    if hit is not None:
        pods: Sequence[Pod] = cluster.pods  # nothing lost or leaving: the pods as they are
        tallies: Mapping[ObjectKey, Tally] = hit.tallies
        astray = hit.astray
        reuse.store(hit)
    else:
        pods, by_job = _pass(cluster, nodes, safe, evicting, (now, grace), out)
        tallies = {key: _tally(group) for key, group in by_job.items()}
        astray = _astray(cluster, nodes)
        if steady and not out.lost:
            reuse.store(TallyEntry(inputs, tallies, astray))
    jobs: list[Job] = []
    changed = bool(out.lost) or out.evicting
    for job in cluster.jobs:
        spec = job.spec
        if spec is None:
            jobs.append(job)
            continue
        tally = tallies.get(job.key, _NO_PODS)
        mine = tuple((p, pool) for p, pool in astray.get(job.key, ()) if not (
            pool is not None and spec.throughput.get(pool, 0.0) > 0))
        policy = policy_of(cluster.namespaces.get(job.namespace))
        refused = violations(spec.template, policy.level, policy.version) if policy.level != "privileged" else ()
        life = _job_life(job, spec, tally, previous, now, mine, (policy, refused))
        out.jobs[job.key] = life
        for pod in tally.failed:
            if not pod.terminating:
                out.pods[job.key].append(PodPlan(
                    pod.namespace, pod.name, spec.name, pod.pool or "", pod.node, {}, {}, "delete", True,
                    f"Failed{f' ({pod.reason})' if pod.reason else ''}: deleted; the job has {life.failures} "
                    f"failure(s) of its backoffLimit {spec.backoff_limit}"))
        if life.replicas != spec.replicas:
            effective = dataclasses.replace(spec, replicas=life.replicas,
                                            min_replicas=min(spec.min_replicas, life.replicas))
            job = dataclasses.replace(job, spec=effective)
            changed = True
        jobs.append(job)
    if changed:
        out.cluster = dataclasses.replace(cluster, pods=tuple(pods), jobs=tuple(jobs))
    return out


def _pass(cluster: Cluster, nodes: Mapping[str, Node], safe: set[str], evicting: Mapping[ObjectKey, PodPlan],
          clock: tuple[float | None, float], out: Lifecycle) -> tuple[list[Pod], dict[ObjectKey, list[Pod]]]:
    """The pass over the pods: lost pods force-deleted (into ``out``), pods the previous plan evicted marked leaving;
    the effective pods, and each job's pods. ``clock``: (now, grace)."""
    now, grace = clock
    pods: list[Pod] = []
    by_job: dict[ObjectKey, list[Pod]] = defaultdict(list)
    for pod in cluster.pods:
        if pod.job is None:
            pods.append(pod)
            continue
        key = (pod.namespace, pod.job)
        node = pod.node
        why = None if node is None or node in safe or pod.terminal else _lost(nodes.get(node), node, now, grace)
        if why is not None and node in out.disruption.held:  # a disrupted pool: the node exists, nothing removed
            out.held_lost[key] += 1
            why = None
        if why is not None:
            out.pods[key].append(PodPlan(pod.namespace, pod.name, pod.job, pod.pool or "", pod.node, {}, {},
                                         "delete", True, f"NodeLost: {why}; force-deleted and re-planned", grace=0))
            out.lost[key] += 1
            pods.append(dataclasses.replace(pod, phase="Failed", reason="NodeLost"))  # counts nowhere, name taken
            continue
        evicted = evicting.get(pod.key) if evicting else None
        if evicted is not None and not pod.terminal and not pod.terminating:
            reason = evicted.reason if evicted.reason.startswith("eviction") else f"eviction retried: {evicted.reason}"
            out.pods[key].append(PodPlan(pod.namespace, pod.name, pod.job, evicted.pool, pod.node, {}, {}, "evict",
                                         True, reason))
            pod = dataclasses.replace(pod, terminating=True)  # leaving: no replica, still on its node
            out.evicting = True
        by_job[key].append(pod)
        pods.append(pod)
    return pods, dict(by_job)


def _is_move(plan: PodPlan) -> bool:
    """Whether an ``evict`` plan is a move of :mod:`.migration` (its reason says ``rebalanced``; a shrink's eviction
    says ``surplus``)."""
    return "rebalanced" in plan.reason


def _tally(pods: list[Pod]) -> Tally:
    """A job's :data:`Tally` (one pass: a plan reads 20,000 pods here)."""
    live = succeeded = 0
    failed: list[Pod] = []
    for p in pods:
        phase = p.phase
        if phase == "Succeeded":
            succeeded += 1
        elif phase == "Failed":
            failed.append(p)
        elif not p.terminating:
            live += 1
    return Tally(live, succeeded, tuple(failed))


_NO_POLICY = Policy()


def _job_life(job: Job, spec: JobSpec, tally: Tally, previous: Plan | None, now: float | None,
              astray: tuple[tuple[Pod, str | None], ...] = (),
              security: tuple[Policy, tuple[str, ...]] = (_NO_POLICY, ())) -> JobLife:
    old = previous.jobs.get(job.key) if previous is not None else None
    misplaced, new_misplaced, last_misplaced, counted_misplaced = _misplacements(old, astray, now, job.reported)
    where = _where(*new_misplaced[-1]) if new_misplaced else (old.misplaced_where if old is not None else "")
    reported = job.reported
    live, succeeded, failed = tally.live, tally.succeeded, tally.failed
    new: list[Pod] = []
    counted: frozenset[str] = frozenset()  # no failed pod visible: none to count, none counted
    if failed:
        before = old.counted_failures if old is not None else frozenset()
        new = [p for p in failed if _identity(p) not in before and not p.terminating]
        visible = {_identity(p) for p in failed}
        counted = frozenset((before & visible) | {_identity(p) for p in new})
    failures = max(reported.failures, old.failures if old is not None else 0) + len(new)
    last_failure = latest(reported.last_failure, old.last_failure if old is not None else None)
    if new and now is not None:
        last_failure = now
    generation = spec.generation
    sticky = (reported.phase == "Complete" and reported.observed_generation == generation) or (
        old is not None and old.phase == "Complete" and old.observed_generation == generation)
    completion = None
    retry_at = None
    if succeeded > 0 or sticky:
        state = "Complete" if live == 0 else "Completing"
        replicas = min(spec.replicas, live)
        if state == "Complete":
            completion = latest(reported.completed, old.completion_time if old is not None else None)
            completion = completion if completion is not None else now
    elif failures > spec.backoff_limit:
        state, replicas = "Failed", 0
    elif spec.suspend:
        state, replicas = "Suspended", 0
    elif security[1]:
        state, replicas = "PodSecurityRefused", min(spec.replicas, live - len(astray))
    elif failures > 0 and now is not None and last_failure is not None and \
            now < last_failure + backoff_delay(failures):
        state, replicas = "Backoff", min(spec.replicas, live - len(astray))
        retry_at = last_failure + backoff_delay(failures)
    elif misplaced > 0 and now is not None and last_misplaced is not None and \
            now < last_misplaced + misplaced_delay(misplaced):
        state, replicas = "Misplaced", min(spec.replicas, live - len(astray))
    else:
        state, replicas = "Active", spec.replicas
    until = last_misplaced + misplaced_delay(misplaced) if last_misplaced is not None and misplaced else None
    was_refused = old is not None and any(c.type == "PodSecurity" and c.status == "False" for c in old.conditions)
    return JobLife(spec, state, replicas, live, succeeded, failures, counted, new, last_failure, completion, retry_at,
                   misplaced, astray, new_misplaced, last_misplaced, counted_misplaced, until, where, security[0],
                   security[1], was_refused)


_UNREPORTED = ReportedStatus()


def _misplacements(old: JobPlan | None, astray: tuple[tuple[Pod, str | None], ...], now: float | None,
                   reported: ReportedStatus = _UNREPORTED) -> tuple[
        int, tuple[tuple[Pod, str | None], ...], float | None, frozenset[str]]:
    """``(count, newly counted, last time, identities counted)`` of a job's misplaced pods ``astray`` after the
    previous plan's ``old``: a pod is counted once (its identity is carried while it is visible); the time of the
    last misplacement is the plan's clock when one is first counted. The base is the larger of the status's
    (``reported``: ``status.misplacedPods``, ``lastMisplacementTime``) and the previous plan's, as for failed pods,
    so an operator restart (no previous plan) goes on from what the status says; a misplaced pod still visible and
    not yet terminating at the restart is counted once more (a longer backoff, never a shorter one)."""
    count = max(reported.misplaced, old.misplaced if old is not None else 0)
    last = latest(reported.last_misplaced, old.last_misplaced if old is not None else None)
    if not astray:
        return count, (), last, frozenset()
    before = old.counted_misplaced if old is not None else frozenset()
    new = tuple((p, pool) for p, pool in astray if _identity(p) not in before)
    visible = {_identity(p) for p, _ in astray}
    counted = frozenset((before & visible) | {_identity(p) for p, _ in new})
    if new:
        count += len(new)
        last = now if now is not None else last
    return count, new, last, counted


def conclude(life: Lifecycle, ctx: PlanContext, actions: Actions, moved: Mapping[ObjectKey, int],
             job_plans: Mapping[ObjectKey, JobPlan]) -> Concluded:
    """The post-status step (see the module docstring) on the job plans ``job_plans``; ``moved``: pods the migration
    phase moved per job. Returns every job's concluded plan, the events it raised, job by job, and the actions with
    the lifecycle's deletions added and the reasons of a stopped job's deletions (new lists where they change)."""
    events: list[PlanEvent] = []
    out: dict[ObjectKey, JobPlan] = {}
    pods: dict[ObjectKey, list[PodPlan]] = defaultdict(list, actions.pods)  # lists shared until one changes
    for key, plans in life.pods.items():
        pods[key] = [*pods.get(key, ()), *plans]
    in_market = {info.key for info in ctx.objects.jobs}
    previous = ctx.previous
    for job in life.cluster.jobs:
        jp = job_plans.get(job.key)
        if jp is None:
            continue
        old = previous.jobs.get(job.key) if previous is not None else None
        reported = job.reported
        jp = dataclasses.replace(
            jp, migrations=max(reported.migrations, old.migrations if old is not None else 0) + moved.get(job.key, 0),
            last_migration=life.now if moved.get(job.key) else latest(
                reported.last_migration, old.last_migration if old is not None else None))
        state = life.jobs.get(job.key)
        if state is not None:
            jp = _conclude_job(jp, state, pods, old.phase if old is not None else reported.phase, life, events)
        else:  # an invalid job: its counters are carried as its status reports them
            jp = evolve(jp, failures=reported.failures, last_failure=reported.last_failure,
                                     completion_time=reported.completed)
        if job.key in in_market and life.pods.get(job.key):  # else the status phase's order stands
            jp = evolve(jp, pods=tuple(sorted(pods.get(job.key, []), key=lambda p: p.name)))
        out[job.key] = jp
        if life.lost.get(job.key):
            count = life.lost[job.key]
            events.append(PlanEvent("FungibleJob", job.namespace, job.name, "Warning", "NodeLost",
                                    f"{count} pod(s) on lost node(s) force-deleted; their replicas are "
                                    "planned elsewhere."))
    held = life.disruption
    for name in sorted({*held.pools, *((p.name for p in life.cluster.pools) if held.cluster is not None else ())}):
        events.append(PlanEvent("ResourcePool", "", name, "Warning", "NodesDisrupted", held.message(name)))
    return Concluded(out, tuple(events), Actions(pods, actions.deferred, actions.placed, actions.unplaced))


def _conclude_job(jp: JobPlan, life: JobLife, pods: dict[ObjectKey, list[PodPlan]], before: str, whole: Lifecycle,
                  events: list[PlanEvent]) -> JobPlan:
    """One job's plan with its lifecycle phase, counters and conditions; its events added to ``events``, its
    deletions' new reasons to ``pods`` (the pod plans per job)."""
    spec = life.spec
    jp = evolve(jp, failures=life.failures, last_failure=life.last_failure,
                             counted_failures=life.counted, completion_time=life.completion,
                misplaced=life.misplaced, last_misplaced=life.last_misplaced,
                counted_misplaced=life.counted_misplaced, misplaced_where=life.misplaced_where)
    event = events.append
    for pod, _pool in life.new_misplaced:
        event(PlanEvent("FungibleJob", spec.namespace, spec.name, "Warning", "Misplaced", _misplaced_event(pod)))
    for pod in life.new_failures:
        event(PlanEvent("FungibleJob", spec.namespace, spec.name, "Warning", "PodFailed",
                        f"Pod {pod.name} failed{f' ({pod.reason})' if pod.reason else ''}: failure {life.failures} "
                        f"of backoffLimit {spec.backoff_limit}; replaced after {backoff_delay(life.failures):g} s."))
    if life.replicas != spec.replicas:
        jp = _placed_over_real_replicas(jp, spec)
    conditions = list(jp.conditions)
    if life.state in ("Complete", "Failed", "Suspended"):
        conditions = [c for c in conditions if c.type not in _MARKET_CONDITIONS]
        jp = evolve(jp, phase=life.state)
    if life.state == "Complete":
        conditions.append(Condition("Complete", "True", "PodSucceeded",
                                    f"{life.succeeded} pod(s) succeeded and none runs any more; the job's share "
                                    "is released"))
        if before != "Complete":
            event(PlanEvent("FungibleJob", spec.namespace, spec.name, "Normal", "Completed",
                            f"Complete at {rfc3339(life.completion) if life.completion is not None else 'unknown'}; "
                            "its capacity is priced again."))
    elif life.state == "Completing":
        conditions.append(Condition("Complete", "False", "PodsFinishing",
                                    f"a pod succeeded: no new pod is created; {life.live} pod(s) still run"))
    elif life.state == "Failed":
        message = (f"{life.failures} failed pod(s), more than spec.backoffLimit {spec.backoff_limit}: the job's pods "
                   "are deleted and its share released")
        conditions.append(Condition("Failed", "True", "BackoffLimitExceeded", message))
        jp = _reason(pods, jp, f"BackoffLimitExceeded: {message}")
        if before != "Failed":
            event(PlanEvent("FungibleJob", spec.namespace, spec.name, "Warning", "BackoffLimitExceeded", message))
    elif life.state == "Suspended":
        message = "spec.suspend is true: the job's pods are deleted and its share released"
        conditions.append(Condition("Suspended", "True", "JobSuspended", message))
        jp = _reason(pods, jp, f"Suspended: {message}")
        if before != "Suspended":
            event(PlanEvent("FungibleJob", spec.namespace, spec.name, "Normal", "Suspended", message))
    elif life.state == "Backoff" and life.retry_at is not None:
        conditions.append(Condition(
            "Backoff", "True", "FailedPodBackoff",
            f"{life.failures} failed pod(s) (backoffLimit {spec.backoff_limit}): no new pod before "
            f"{rfc3339(life.retry_at)} ({backoff_delay(life.failures):g} s after the last failure)"))
    if life.refused:
        message = _refused_message(life)
        conditions.append(Condition("PodSecurity", "False", "PodSecurityRefused", message))
        if not life.was_refused:
            event(PlanEvent("FungibleJob", spec.namespace, spec.name, "Warning", "PodSecurityRefused", message))
    elif life.policy.note and life.policy.level != "privileged":  # admitted, but say what was checked and why
        admitted = f'{life.policy.note}; the pod template meets "{life.policy.text}"'
        if life.policy.invalid_level:  # the level label is not a level: restricted applies (fail-closed)
            conditions.append(Condition("PodSecurity", "True", "InvalidEnforceLevel", admitted))
        else:
            conditions.append(Condition("PodSecurity", "True", "InvalidEnforceVersion", admitted))
    if life.astray or life.state == "Misplaced":
        conditions.append(Condition("Misplaced", "True", "Misplaced", _misplaced_message(life)))
    if before == "Suspended" and life.state != "Suspended":
        event(PlanEvent("FungibleJob", spec.namespace, spec.name, "Normal", "Resumed",
                        "spec.suspend is false: the job is planned again."))
    return evolve(jp, conditions=tuple(conditions))


def _refused_message(life: JobLife) -> str:
    """The ``PodSecurity`` condition's message: the level, the failed checks (as the API server names them)."""
    spec = life.spec
    note = f" ({life.policy.note})" if life.policy.note else ""
    return (f'namespace {spec.namespace!r} enforces Pod Security "{life.policy.text}" ({ENFORCE_LABEL}){note}; the '
            f"pod template violates it: {', '.join(life.refused)}. No pod is created (docs/security.md); fix "
            "spec.template")


def _where(pod: Pod, where: str | None) -> str:
    """``pod P on node N, outside pool 'X'`` (and the node's pool, when it has one)."""
    return (f"pod {pod.name} on node {pod.node}, outside pool {pod.pool!r}"
            f"{f' (the node is in pool {where!r}, which the job cannot use)' if where else ''}")


def _misplaced_event(pod: Pod) -> str:
    """The Warning Event of a misplaced pod: the node and the pool, not the pod (the same misplacement is one Event)."""
    return (f"A pod of the job was bound to node {pod.node}, outside its pool {pod.pool!r} (the pool's nodeSelector, "
            "which the pod requires, does not match it): a scheduler bypassed Walras, or a binding was made by hand "
            "(docs/troubleshooting.md, Misplaced). The pod is removed; its replacement is backed off.")


def _misplaced_message(life: JobLife) -> str:
    """The ``Misplaced`` condition's message: the pods bound outside their pool now (or the last count), the
    backoff."""
    shown = "; ".join(_where(p, where) for p, where in life.astray[:5]) or (
        f"last: {life.misplaced_where}" if life.misplaced_where else "")
    more = f" and {len(life.astray) - 5} more" if len(life.astray) > 5 else ""
    until = (f"; no new pod before {rfc3339(life.misplaced_until)} ({misplaced_delay(life.misplaced):g} s after the "
             "last)" if life.state == "Misplaced" and life.misplaced_until is not None else "")
    return (f"{shown or 'a pod was bound outside its pool'}{more}: removed, {life.misplaced} misplacement(s) "
            f"counted{until}; check that kube-scheduler calls the extender for every Walras pod "
            "(managedResources) and that nothing binds them by hand")


def _reason(pods: dict[ObjectKey, list[PodPlan]], jp: JobPlan, reason: str) -> JobPlan:
    """The reason of the deletions the reconcile phase planned for a job that left the market (new plans in place of
    the old ones, in a new list of the job's in ``pods`` and in the listed pods of the job plan returned)."""
    plans = pods.get(jp.key)
    if not plans:
        return jp
    renamed: dict[int, PodPlan] = {}
    for p in plans:
        if p.action in ("delete", "evict") and p.reason.startswith("surplus"):
            renamed[id(p)] = dataclasses.replace(p, reason=reason)
    if not renamed:
        return jp
    pods[jp.key] = [renamed.get(id(p), p) for p in plans]
    # the status phase listed the same plans on the job
    return evolve(jp, pods=tuple(renamed.get(id(p), p) for p in jp.pods))


def _placed_over_real_replicas(jp: JobPlan, spec: JobSpec) -> JobPlan:
    """The job plan with the throughput and utility of the placed replicas over the spec's replica count (the status
    phase divided by the effective count): replica k of N runs a 1/N share of the job (004 Sec. 2.1)."""
    t = sum(spec.throughput.get(pool, 0.0) * count for pool, count in jp.replicas.items()) / max(spec.replicas, 1)
    return evolve(jp, throughput=float(t),
                               utility=float(utility_values([spec.utility], [1.0], np.array([t]))[0]))
