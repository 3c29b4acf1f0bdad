"""The actuator: a plan's pod actions as API calls (creates, bindings, resizes, deletions, evictions, adoptions).

* ``create``: the pod is built from its job's parsed template (:class:`walras.kube.encode.TemplateCache`;
  deterministic name: after a restart a 409 AlreadyExists means it is there); in *direct* mode it is then bound to
  its planned node through ``pods/binding``.
* ``bind``: direct mode binds the pending pod; extender mode leaves it to kube-scheduler, which calls the extender
  (:meth:`Actuator.bind`).
* ``resize``: ``pods/{name}/resize`` where the cluster supports in-place resize; else the job waits for its next
  pod, which :attr:`Actuator.resize_pending` reports (the status writer's ``ResizePending`` condition).
* ``delete``: with ``PodPlan.grace`` as the grace period (None: the pod's own ``terminationGracePeriodSeconds``;
  0: force deletion of a pod on a lost node) and a UID precondition (a newer pod of the same name is never
  deleted).
* ``evict``: through the Eviction API, so PodDisruptionBudgets hold; a 429 leaves the pod running, records a
  Warning Event ``EvictionBlocked`` on the job (aggregated: one Event object whose count rises), reports the API
  server's message on the job (:attr:`Actuator.eviction_blocked`, the status writer's ``EvictionBlocked``
  condition), and the eviction is asked again by later plans with a capped exponential backoff per pod
  (:data:`EVICTION_BACKOFF` doubling up to :data:`EVICTION_BACKOFF_CAP`); plans within the backoff send nothing.
* pods labelled with a job's name but not owned by it are adopted (owner reference added).
* a ``create`` the API server refuses (400, 403 or 422: Pod Security, a ResourceQuota, an admission webhook) is
  recorded per job (:attr:`Actuator.refusals`, docs/refusals.md): a Warning Event ``AdmissionRefused`` on the job
  (aggregated), the refusal handed to the next plans (``Cluster.refused``: the planner holds no capacity for the
  job's missing pods and writes the ``AdmissionRefused`` condition), and the creation asked again after a backoff
  (:data:`REFUSAL_BACKOFF` doubling per refused attempt up to :data:`REFUSAL_BACKOFF_CAP`); a create of a job within
  its backoff sends nothing. A successful creation, the job's deletion, or a change of its spec (a new
  ``metadata.generation``) ends the record. The record is written to the job's ``status.admissionRefusal`` (the
  status writer) and read back by a restarted operator (:meth:`Actuator.restore`), so a restart neither asks again
  before the backoff ends nor starts the backoff over.

Every pod created or bound is assumed (:class:`walras.operator.assumed.AssumedPods`) until the watch shows it; pods
deleted or evicted are forgotten. A pod is never bound twice: a pod that has ``spec.nodeName`` is never bound,
bindings in flight are tracked by uid, and a 409 from ``pods/binding`` is resolved by reading the pod back
(:meth:`walras.kube.client.KubeClient.bind`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from walras.kube.client import KubeClient
from walras.kube.decode import pod_from
from walras.kube.encode import TemplateCache, build_pod, pool_node_selector, resize_containers
from walras.kube.errors import ApiError, BadRequest, Conflict, Forbidden, UnprocessableEntity
from walras.metrics import WalrasMetrics
from walras.operator.assumed import AssumedPods
from walras.operator.recorder import Recorder
from walras.operator.watch import ObjectKey, RawObject, SnapshotIndex
from walras.planner.cluster import Job, Refusal
from walras.planner.model import API_VERSION, LABEL_JOB, LABEL_MANAGED, Plan, PodPlan

logger = logging.getLogger("walras.operator")

#: Seconds before a refused eviction is asked again, doubled per refusal up to the cap (``kubectl drain`` retries a
#: refused eviction every 5 s; the backoff keeps a long-blocked budget from costing a request every plan).
EVICTION_BACKOFF = 2.0
EVICTION_BACKOFF_CAP = 120.0

#: Seconds before a refused pod creation is tried again, doubled per refused attempt up to the cap (docs/refusals.md;
#: kube-controller-manager's ReplicaSet controller retries a refused create with its work queue's rate limiter,
#: 5 ms doubling to 1000 s; ours starts where an admission problem is unlikely to have gone, and caps at 5 minutes).
REFUSAL_BACKOFF = 10.0
REFUSAL_BACKOFF_CAP = 300.0


def refusal_delay(attempts: int) -> float:
    """Seconds before a pod of a job is asked for again after its ``attempts``-th refused attempt in a row:
    :data:`REFUSAL_BACKOFF` doubled per attempt, at most :data:`REFUSAL_BACKOFF_CAP`."""
    return min(REFUSAL_BACKOFF * 2.0 ** min(max(attempts, 1) - 1, 16), REFUSAL_BACKOFF_CAP)


def _generation(job: RawObject | None) -> object:
    """A job's ``metadata.generation`` (``"gone"`` for no job)."""
    return "gone" if job is None else (job.get("metadata") or {}).get("generation")


@dataclass
class _Refused:
    """A job's refused pod creations: the API server's answer, the pods refused in the last attempt (one plan's
    creates), refused attempts in a row, the delay after this one, and when to try again (``wall`` seconds)."""

    code: int
    message: str
    pods: int
    attempts: int
    delay: float
    until: float
    round: int
    generation: object  # the job's metadata.generation when refused ("gone" when the job is gone)


@dataclass
class Actuator:
    """Carries out the pod actions of each plan; one per controller."""

    client: KubeClient
    recorder: Recorder
    metrics: WalrasMetrics
    assumed: AssumedPods
    mode: str = "direct"  # "direct" | "extender"
    scheduler_name: str = "walras-scheduler"
    templates: TemplateCache = field(default_factory=TemplateCache)
    #: uids of the pods a binding is in flight for
    _binding: set[str] = field(default_factory=set)
    #: pod -> the last EvictionBlocked message posted for it
    _blocked: dict[ObjectKey, str] = field(default_factory=dict)
    #: job -> pod -> why it waits for a resize the cluster cannot do in place
    _resize_waiting: dict[ObjectKey, dict[str, str]] = field(default_factory=dict)
    #: job -> the ResizePending message (its waiting pods' messages, in name order)
    _resize_pending: dict[ObjectKey, str] = field(default_factory=dict)
    #: the last snapshot's pods, with the ones this actuator created or bound since as it wrote them
    _pods: dict[ObjectKey, RawObject] = field(default_factory=dict)
    #: pod -> (when its refused eviction may be asked again, the delay after the next refusal), ``clock`` seconds
    _evict_retry: dict[ObjectKey, tuple[float, float]] = field(default_factory=dict)
    #: job -> pod -> the API server's message of its refused eviction
    _eviction_blocked: dict[ObjectKey, dict[str, str]] = field(default_factory=dict)
    #: the clock of the eviction backoff (tests replace it)
    clock: Callable[[], float] = time.monotonic
    #: job -> its refused pod creations (docs/refusals.md)
    _refused: dict[ObjectKey, _Refused] = field(default_factory=dict)
    #: how many plans :meth:`calls` carried out (a refusal's attempt is one plan's creates)
    _round: int = 0
    #: the clock of the refusals' backoff: the planner's (``PlanOptions.now``, epoch seconds; tests replace it)
    wall: Callable[[], float] = time.time

    @property
    def refusals(self) -> Mapping[ObjectKey, Refusal]:
        """job -> the API server's refusal of its pods, as the planner reads it (``Cluster.refused``)."""
        return {key: Refusal(r.message, r.pods, r.until, r.code, r.attempts)
                for key, r in sorted(self._refused.items())}

    def restore(self, jobs: Iterable[Job]) -> None:
        """After a restart (the controller's first plan): take each job's ``status.admissionRefusal`` as decoded
        (``Job.reported.refusal``, what this actuator wrote before, :func:`walras.operator.statuses.with_refusal`) as
        its refusal where none is recorded, so the backoff goes on where it was (no creation before its end, and
        the next refusal doubles it) instead of asking again at once (docs/refusals.md)."""
        for job in jobs:
            refusal = job.reported.refusal
            if refusal is None or job.spec is None or job.key in self._refused or refusal.until is None:
                continue
            self._refused[job.key] = _Refused(refusal.code, refusal.message, refusal.pods, refusal.attempts,
                                              refusal_delay(refusal.attempts), refusal.until, self._round,
                                              job.generation)

    @property
    def eviction_blocked(self) -> Mapping[ObjectKey, str]:
        """job -> why some of its evictions are refused (the API server's messages, pod by pod in name order)."""
        return {job: "; ".join(f"pod {name}: {why}" for name, why in sorted(pods.items()))
                for job, pods in self._eviction_blocked.items() if pods}

    @property
    def resize_pending(self) -> Mapping[ObjectKey, str]:
        """job -> the ``ResizePending`` message of its pods that wait for their next pod (empty for none)."""
        return self._resize_pending

    def observed(self, index: SnapshotIndex) -> None:
        """Take the pods of the snapshot the next plan is built from as the known pods."""
        self._pods = dict(index.pods)

    def deleted(self, kind: str, obj: RawObject) -> None:
        """The watch deleted ``obj``: a binding in flight for a deleted pod is over."""
        if kind == "Pod":
            self._binding.discard(str((obj.get("metadata") or {}).get("uid")))

    def calls(self, plan: Plan, index: SnapshotIndex) -> list[Awaitable[None]]:
        """The API calls that carry out ``plan``'s pod actions against the pods of ``index`` (adoptions first)."""
        calls: list[Awaitable[None]] = [self._adopt(pod, index.jobs) for pod in index.pods.values()
                                        if self._needs_adoption(pod, index.jobs)]
        self._settle_resizes(plan)
        self._settle_refusals(index)
        now = self.wall()
        for pp in plan.pods:
            current = index.pods.get((pp.namespace, pp.name))
            job = index.jobs.get((pp.namespace, pp.job))
            if pp.action == "create" and current is None:
                refused = self._refused.get((pp.namespace, pp.job))
                if refused is not None and now < refused.until:
                    continue  # refused, within its backoff: not asked again yet
                if job is not None:
                    calls.append(self._create(pp, job, pool_node_selector(index.pools.get(("", pp.pool)))))
            elif current is None:
                continue
            elif pp.action in ("create", "bind"):
                if self.mode == "direct" and pp.node and not (current.get("spec") or {}).get("nodeName"):
                    calls.append(self._bind(pp, current))
            elif pp.action == "resize":
                calls.append(self._resize(pp, current, job))
            elif pp.action == "delete":
                calls.append(self._delete(pp, current, job))
            elif pp.action == "evict":
                calls.append(self._evict(pp, current, job))
        for key in [k for k in self._blocked if k not in index.pods]:  # pods gone: their blocked evictions are over
            del self._blocked[key]
        evicting = {(pp.namespace, pp.name) for pp in plan.pods if pp.action == "evict"}
        for key in [k for k in self._evict_retry if k not in evicting]:  # no longer evicted: its backoff is over
            del self._evict_retry[key]
        for owner, blocked in list(self._eviction_blocked.items()):
            for name in [n for n in blocked if (owner[0], n) not in evicting or (owner[0], n) not in index.pods]:
                del blocked[name]
            if not blocked:
                del self._eviction_blocked[owner]
        return calls

    def _settle_refusals(self, index: SnapshotIndex) -> None:
        """Start a new attempt; drop the refusals of jobs that are gone or whose spec changed since (a new
        ``metadata.generation``: the template may be fixed, so its pods are asked for at once)."""
        self._round += 1
        for key in [k for k, r in self._refused.items() if _generation(index.jobs.get(k)) != r.generation]:
            del self._refused[key]

    async def _refuse(self, pp: PodPlan, job: RawObject, exc: ApiError) -> None:
        """Record that the API server refused to create ``pp`` (see the module docstring)."""
        key = (pp.namespace, pp.job)
        now = self.wall()
        message = exc.message or str(exc)
        self.metrics.creation_refused(pp.namespace, pp.job, exc.code, message)
        was = self._refused.get(key)
        if was is not None and was.round == self._round:  # another pod of the same attempt
            was.pods += 1
        else:
            attempts = was.attempts + 1 if was is not None else 1
            delay = refusal_delay(attempts)
            self._refused[key] = _Refused(exc.code, message, 1, attempts, delay, now + delay, self._round,
                                          _generation(job))
            logger.warning("the API server refused pod %s/%s of job %s (%s %s), asked again in %g s: %s",
                           pp.namespace, pp.name, pp.job, exc.code, exc.reason, delay, message)
        await self.recorder.event(job, "Warning", "AdmissionRefused",
                                  f"The API server refused pod {pp.name} ({exc.code} {exc.reason}); asked again with "
                                  f"backoff: {message}")

    def _settle_resizes(self, plan: Plan) -> None:
        """Drop the waiting pods that no longer wait for a resize (resized, gone, replaced)."""
        resizing: dict[ObjectKey, set[str]] = {}
        for pp in plan.pods:
            if pp.action == "resize":
                resizing.setdefault((pp.namespace, pp.job), set()).add(pp.name)
        for key in list(self._resize_waiting):
            waiting = {n: m for n, m in self._resize_waiting[key].items() if n in resizing.get(key, ())}
            if waiting:
                self._resize_waiting[key] = waiting
                self._resize_pending[key] = "; ".join(waiting[name] for name in sorted(waiting))
            else:
                del self._resize_waiting[key]
                self._resize_pending.pop(key, None)

    # ------------------------------------------------------------------ pods

    @staticmethod
    def _needs_adoption(pod: RawObject, jobs: Mapping[ObjectKey, RawObject]) -> bool:
        meta = pod.get("metadata") or {}
        job_name = (meta.get("labels") or {}).get(LABEL_JOB)
        if not job_name or (meta.get("namespace"), job_name) not in jobs or meta.get("deletionTimestamp"):
            return False
        return not any(ref.get("controller") for ref in meta.get("ownerReferences") or [])

    async def _adopt(self, pod: RawObject, jobs: Mapping[ObjectKey, RawObject]) -> None:
        meta = pod["metadata"]
        job = jobs[(meta["namespace"], meta["labels"][LABEL_JOB])]
        ref = {"apiVersion": API_VERSION, "kind": "FungibleJob", "name": job["metadata"]["name"],
               "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
        refs = [*list(meta.get("ownerReferences") or []), ref]
        patch = {"metadata": {"ownerReferences": refs, "labels": {LABEL_MANAGED: "true"}}}
        await self.client.request("PATCH", self.client.pod_path(meta["namespace"], meta["name"]), patch,
                                  content_type="application/merge-patch+json", retry_conflict=True)
        logger.info("adopted pod %s/%s into FungibleJob %s", meta["namespace"], meta["name"], ref["name"])

    async def _create(self, pp: PodPlan, job: RawObject, pool_nodes: Mapping[str, str] | None = None) -> None:
        try:
            body = build_pod(self.templates.template(job), pp, self.scheduler_name, pool_nodes)
        except ValueError as exc:
            await self.recorder.event(job, "Warning", "PodTemplateInvalid", str(exc))
            return
        try:
            pod, created = await self.client.create_pod(pp.namespace, body)
        except (BadRequest, Forbidden, UnprocessableEntity) as exc:  # admission refused it (docs/refusals.md)
            await self._refuse(pp, job, exc)
            return
        self._refused.pop((pp.namespace, pp.job), None)
        self._assume(pod)
        if created:
            logger.info("created pod %s/%s for job %s in pool %s", pp.namespace, pp.name, pp.job, pp.pool)
            await self.recorder.event(job, "Normal", "SuccessfulCreate",
                                      f"Created pod {pp.name} in pool {pp.pool} (planned node {pp.node or 'none'})")
        if self.mode == "direct" and pp.node and not (pod.get("spec") or {}).get("nodeName"):
            await self._bind(pp, pod)

    async def bind(self, namespace: str, name: str, uid: str, node: str, pool: str = "",
                   mode: str = "extender", raw: RawObject | None = None) -> None:
        """Bind a pod (of ``pool``, for the metrics): at most once per uid, through ``pods/binding``;
        :class:`~walras.kube.errors.Conflict` while a binding of the same uid is in flight."""
        if uid and uid in self._binding:
            raise Conflict(409, "Conflict", f"pod {namespace}/{name} is being bound already")
        if uid:
            self._binding.add(uid)
        try:
            done = await self.client.bind(namespace, name, uid, node)
        except ApiError as exc:
            self.metrics.binding_error(pool, exc.reason or str(exc.code))
            if uid:
                self._binding.discard(uid)
            raise
        known = self._pods.get((namespace, name)) or raw  # raw: the pod as the caller read it
        if known is not None:  # counts on its node until the watch shows the binding
            bound = {**known, "spec": {**(known.get("spec") or {}), "nodeName": node}}
            self._assume(bound)
        if done:
            self.metrics.bound(pool, mode)

    async def _bind(self, pp: PodPlan, pod: RawObject) -> None:
        assert pp.node is not None
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if uid in self._binding:
            return
        try:
            await self.bind(pp.namespace, pp.name, uid, pp.node, pp.pool, mode="direct")
        except ApiError as exc:
            await self.recorder.event(pod, "Warning", "BindingFailed", f"binding to {pp.node} failed: {exc}")
            return
        logger.info("bound pod %s/%s to %s", pp.namespace, pp.name, pp.node)
        await self.recorder.event(pod, "Normal", "Scheduled", f"Walras assigned {pp.namespace}/{pp.name} to {pp.node}")

    async def _resize(self, pp: PodPlan, pod: RawObject, job: RawObject | None) -> None:
        """Take a running pod to its planned requests/limits through ``pods/resize`` where the API server serves it
        (discovered, :meth:`KubeClient.supports_pod_resize`); elsewhere record on the job (``ResizePending``
        condition and a ``ResizeDeferred`` Event) that the change waits for the next pod."""
        key = (pp.namespace, pp.job)
        waiting = self._resize_waiting.setdefault(key, {})
        containers = resize_containers(pod, pp)
        why = f" ({pp.reason})" if pp.reason else ""
        if containers is not None and await self.client.resize_pod(pp.namespace, pp.name, containers):
            logger.info("resized pod %s/%s in place%s", pp.namespace, pp.name, why)
            await self.recorder.event(pod, "Normal", "Resized", f"Walras resized {pp.name} in place{why}")
            containers = None
        if containers is None:
            waiting.pop(pp.name, None)
        else:
            message = (f"pod {pp.name}: in-place resize is not supported by this cluster; the new requests/limits"
                       f"{why} apply to the next pod created")
            repeated = waiting.get(pp.name) == message
            waiting[pp.name] = message
            if job is not None and not repeated:
                await self.recorder.event(job, "Normal", "ResizeDeferred", message)
        if waiting:
            self._resize_pending[key] = "; ".join(waiting[name] for name in sorted(waiting))
        else:
            self._resize_pending.pop(key, None)
            self._resize_waiting.pop(key, None)

    def _assume(self, pod: RawObject) -> None:
        typed = pod_from(pod)
        if typed is not None:
            self._pods[typed.key] = pod
            self.assumed.assume(typed, time.monotonic())

    async def _delete(self, pp: PodPlan, pod: RawObject, job: RawObject | None) -> None:
        """Delete a pod with the planned grace period (None: the pod's own; 0: at once) and a UID precondition.

        A pod already terminating is deleted again only to shorten its grace period (a force deletion of a pod on a
        lost node): a plain repeat would only re-send the same request every plan."""
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            terminating = int(meta.get("deletionGracePeriodSeconds") or 0)
            if pp.grace is None or pp.grace >= terminating:
                self.assumed.forget(pp.namespace, pp.name)
                return
        deleted = await self.client.delete_pod(pp.namespace, pp.name, pp.grace, str(meta.get("uid") or "") or None)
        self.assumed.forget(pp.namespace, pp.name)
        if deleted:
            why = pp.reason or "surplus"
            forced = pp.grace == 0
            logger.info("%s pod %s/%s (%s)", "force-deleted" if forced else "deleted", pp.namespace, pp.name, why)
            if job is not None:
                await self.recorder.event(job, "Normal", "SuccessfulDelete",
                                          f"{'Force-deleted' if forced else 'Deleted'} pod {pp.name}: {why}")

    async def _evict(self, pp: PodPlan, pod: RawObject, job: RawObject | None) -> None:
        """Move a running pod: evict it through the Eviction API (PodDisruptionBudgets hold; grace ``pp.grace`` or
        the pod's own). Blocked (429) -> the pod stays, a Warning Event ``EvictionBlocked`` on the job (once per pod
        and message) and the next plan asks again. Never a plain delete."""
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):  # evicted already, terminating within its grace period
            self.assumed.forget(pp.namespace, pp.name)
            return
        key = (pp.namespace, pp.name)
        now = self.clock()
        retry = self._evict_retry.get(key)
        if retry is not None and now < retry[0]:  # refused before: wait out the backoff
            return
        result = await self.client.evict_pod(pp.namespace, pp.name, pp.grace, str(meta.get("uid") or "") or None)
        if result.outcome == "blocked":
            delay = retry[1] if retry is not None else EVICTION_BACKOFF
            self._evict_retry[key] = (now + delay, min(2.0 * delay, EVICTION_BACKOFF_CAP))
            self._eviction_blocked.setdefault((pp.namespace, pp.job), {})[pp.name] = result.message
            message = f"Eviction of pod {pp.name} refused, asked again with backoff: {result.message}"
            logger.info("eviction of %s/%s blocked (again in %g s): %s", pp.namespace, pp.name, delay,
                        result.message)
            if job is not None:
                self._blocked[key] = message
                await self.recorder.event(job, "Warning", "EvictionBlocked", message)
            return
        self._blocked.pop(key, None)
        self._evict_retry.pop(key, None)
        blocked = self._eviction_blocked.get((pp.namespace, pp.job))
        if blocked is not None:
            blocked.pop(pp.name, None)
        self.assumed.forget(pp.namespace, pp.name)
        if result.outcome == "evicted":
            why = f": {pp.reason}" if pp.reason else ""
            logger.info("evicted pod %s/%s%s", pp.namespace, pp.name, why)
            if job is not None:
                await self.recorder.event(job, "Normal", "Evicted", f"Evicted pod {pp.name}{why}")
