"""The reconcile loop: snapshot -> ``build_plan`` -> API calls (pods, bindings, resizes, statuses, Events).

kopf feeds the controller (see :mod:`walras.operator.handlers`): indexes hold the objects, event handlers call
:meth:`Controller.trigger` when something relevant changed, a timer triggers on the plan period. The loop debounces
triggers, plans off the event loop (``asyncio.to_thread``), then acts:

* ``create``: the pod is created from its job's template (deterministic name: after a restart a 409 AlreadyExists
  means it is there); in *direct* mode it is then bound to its planned node through ``pods/binding``.
* ``bind``: direct mode binds the pending pod; extender mode leaves it to kube-scheduler, which calls the extender.
* ``resize``: ``pods/{name}/resize`` where the cluster supports in-place resize; else the job gets a
  ``ResizePending`` condition saying the change waits for the next pod.
* ``delete``: surplus, failed and suspended jobs' pods are deleted with ``PodPlan.grace`` as the grace period
  (None: the pod's own ``terminationGracePeriodSeconds``; 0: force deletion of a pod on a lost node, whose kubelet
  will never confirm it) and a UID precondition (a newer pod of the same name is never deleted).
* ``evict``: a running pod that rebalancing moves goes through the Eviction API (``pods/{name}/eviction``), so
  PodDisruptionBudgets hold and the termination grace period is respected; a 429 (a budget does not allow it now)
  leaves the pod running, records a Warning Event ``EvictionBlocked`` on the job once per pod and message, and the
  next plan asks again. The replacement is a separate ``create`` of the same plan.
* pods labelled with a job's name but not owned by it are adopted (owner reference added).
* statuses of pools, jobs and profiles are merge-patched when they differ; the plan's Events are posted once.

Every plan gets the wall clock (``PlanOptions.now``) for its time-dependent rules (backoff of failed pods, the
node-loss grace, migrations' minimum run time and cooldown), and the operator's ``max_migrations`` and
``node_loss_grace`` settings. Pods the operator deleted or evicted are forgotten by the assumed-pods cache; their
replacements are assumed like any created pod.

Each stored plan, and everything alive with it, is frozen out of the cyclic garbage collector's reach
(:meth:`Controller.settle_gc`), so the collections inside the next plan do not walk the previous one.

A pod is never bound twice: a pod that has ``spec.nodeName`` is never bound, bindings in flight are tracked by uid,
and a 409 from ``pods/binding`` is resolved by reading the pod back (:meth:`KubeClient.bind`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from walras.collector import paused
from walras.metrics import WalrasMetrics
from walras.operator.kube import KubeClient, KubeError
from walras.operator.translate import event_body, pod_manifest, resize_containers, stamp_conditions, status_patch
from walras.planner.cache import AssumedPods
from walras.planner.model import API_VERSION, LABEL_JOB, LABEL_MANAGED, Plan, PodPlan, Snapshot
from walras.planner.plan import PlanOptions
from walras.planner.reuse import PlanCache
from walras.planner.translate import TranslationCache, cluster_from, pod_from

logger = logging.getLogger("walras.operator")

JSON = dict[str, Any]
#: ``planner(cluster, previous, *, cache=..., assumed=..., options=...) -> Plan`` (:func:`walras.planner.build_plan`).
Planner = Callable[..., Plan]


@dataclass
class OperatorOptions:
    """What ``walras run`` configures."""

    mode: str = "direct"  # "direct" | "extender"
    namespaces: tuple[str, ...] = ()
    scheduler_name: str = "walras-scheduler"
    plan_period: float = 30.0
    debounce: float = 1.0
    identity: str = "walras"
    concurrency: int = 16
    max_deletes: int | None = 50  # running pods one plan may delete (the churn budget)
    max_migrations: int = 10  # running pods all migrating jobs together may move in one plan
    node_loss_grace: float = 300.0  # seconds a node is NotReady before its pods are force-deleted and re-planned
    #: freeze the objects alive after each stored plan out of the cyclic collector's reach (Controller.reconcile)
    freeze_gc: bool = True
    #: pause the cyclic collector while a plan is built, and restore it after (Controller.planned_without_gc)
    pause_gc: bool = True

    def __post_init__(self) -> None:
        if self.mode not in ("direct", "extender"):
            raise ValueError(f"mode must be 'direct' or 'extender', got {self.mode!r}")
        if self.plan_period <= 0:
            raise ValueError(f"plan_period must be > 0, got {self.plan_period}")
        if self.debounce < 0:
            raise ValueError(f"debounce must be >= 0, got {self.debounce}")
        if self.max_migrations < 0:
            raise ValueError(f"max_migrations must be >= 0, got {self.max_migrations}")
        if self.node_loss_grace < 0:
            raise ValueError(f"node_loss_grace must be >= 0, got {self.node_loss_grace}")


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _ready(node: Mapping[str, Any]) -> str:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status"))
    return ""


def fingerprint(kind: str, obj: Mapping[str, Any]) -> Any:
    """What of an object matters to the plan; a change of anything else (heartbeats, our own status writes, resource
    versions) does not trigger a re-plan."""
    meta = obj.get("metadata") or {}
    labels = tuple(sorted((meta.get("labels") or {}).items()))
    if kind == "Node":
        status = obj.get("status") or {}
        spec = obj.get("spec") or {}
        return (labels, repr(status.get("allocatable")), repr(status.get("capacity")), spec.get("unschedulable"),
                repr(spec.get("taints")), _ready(obj))
    if kind == "Pod":
        spec = obj.get("spec") or {}
        resources = tuple(repr(c.get("resources")) for c in spec.get("containers") or [])
        return (labels, spec.get("nodeName"), (obj.get("status") or {}).get("phase"), meta.get("deletionTimestamp"),
                resources)
    return (labels, meta.get("generation"), meta.get("deletionTimestamp"))


@dataclass
class Controller:
    """Plans from the cluster's state and writes the plan back; one instance per operator process."""

    client: KubeClient
    source: Callable[[], Snapshot]
    planner: Planner
    options: OperatorOptions = field(default_factory=OperatorOptions)
    metrics: WalrasMetrics = field(default_factory=WalrasMetrics)
    plan: Plan | None = None
    plans: int = 0
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _fingerprints: dict[tuple[str, str, str], Any] = field(default_factory=dict)
    _binding: set[str] = field(default_factory=set)
    _posted: set[tuple[str, str, str, str, str]] = field(default_factory=set)
    _resize_pending: dict[tuple[str, str], str] = field(default_factory=dict)  # job -> ResizePending message
    _resize_waiting: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)  # job -> pod -> message
    _status_written: dict[tuple[str, str, str], Any] = field(default_factory=dict)
    _blocked: dict[tuple[str, str], str] = field(default_factory=dict)  # pod -> last EvictionBlocked message posted
    #: the wall clock handed to each plan (``PlanOptions.now``); tests replace it
    clock: Callable[[], float] = time.time
    _task: asyncio.Task[None] | None = None
    planned: asyncio.Event = field(default_factory=asyncio.Event)
    #: pods created or bound by us that the watch has not shown yet (walras.planner.cache)
    assumed: AssumedPods = field(default_factory=AssumedPods)
    _pods: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)  # the last snapshot's pods
    #: the planner's reuse between plans (walras.planner.reuse) and the translations of the API objects
    #: (walras.planner.translate), owned here
    plan_cache: PlanCache = field(default_factory=PlanCache)
    translations: TranslationCache = field(default_factory=TranslationCache)

    # ------------------------------------------------------------------ triggers

    def observe(self, kind: str, event_type: str | None, obj: Mapping[str, Any]) -> bool:
        """Record an object event; trigger a re-plan (and return True) if it matters to the plan."""
        key = (kind, *_key(obj))
        if event_type == "DELETED":
            self._fingerprints.pop(key, None)
            if kind == "Pod":
                self._binding.discard(str((obj.get("metadata") or {}).get("uid")))
            self.trigger(f"{kind} {key[1]}/{key[2]} deleted")
            return True
        fp = fingerprint(kind, obj)
        if self._fingerprints.get(key) == fp:
            return False
        self._fingerprints[key] = fp
        self.trigger(f"{kind} {key[1]}/{key[2]} changed")
        return True

    def trigger(self, reason: str = "") -> None:
        logger.debug("re-plan requested: %s", reason)
        self._wake.set()

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name="walras-planner")
        return self._task

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def run(self) -> None:
        """Plan once per (debounced) burst of triggers, forever."""
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.options.debounce)
            self._wake.clear()
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("reconcile failed; retrying on the next trigger")
                await asyncio.sleep(min(self.options.plan_period, 2.0))
                self._wake.set()

    # ------------------------------------------------------------------ one pass

    async def reconcile(self) -> Plan | None:
        snapshot = self.source()
        started = time.perf_counter()
        self._pods = {_key(p): p for p in snapshot.pods}
        seen = {key: (str((p.get("metadata") or {}).get("uid") or ""), (p.get("spec") or {}).get("nodeName") or None)
                for key, p in self._pods.items()}
        self.assumed.prune(seen, (_key(n)[1] for n in snapshot.nodes), time.monotonic())
        options = self.plan_options()
        try:
            planner = self.planned_without_gc if self.options.pause_gc else self.planned_from
            plan = await asyncio.to_thread(planner, snapshot, self.plan, assumed=self.assumed.pods(), options=options)
        except Exception:
            self.metrics.plan_failed()
            logger.exception("planning failed")
            return None
        if not plan.seconds:
            plan = replace(plan, seconds=time.perf_counter() - started)
        self.plan = plan
        if self.options.freeze_gc:
            self.settle_gc()
        self.plans += 1
        self.metrics.plan_succeeded(plan)
        await self.act(plan, snapshot)
        self.planned.set()
        return plan

    def planned_from(self, snapshot: Snapshot, previous: Plan | None, **kwargs: Any) -> Plan:
        """``snapshot`` translated (with the controller's translation cache) and planned by ``self.planner`` after
        ``previous`` with the controller's plan cache."""
        cluster = cluster_from(snapshot, self.translations)
        return self.planner(cluster, previous, cache=self.plan_cache, **kwargs)

    def planned_without_gc(self, *args: Any, **kwargs: Any) -> Plan:
        """``self.planner(*args, **kwargs)`` with the cyclic garbage collector paused, and its setting restored after
        (also when the planner raises).

        A plan allocates ~10^5-10^6 container objects (a cold plan of 5,000 nodes / 20,000 pods), which set off
        generation-2 collections inside it that walk the cluster's objects and everything the plan has built so far:
        0.3-0.6 s of a 1.5-2 s cold plan on the planner bench (docs/bench/planner.md), while a plan makes little
        cyclic garbage (tests/test_planner_gc.py: plans hold no reference cycles). The pause is process-wide (the
        collector has one switch), so for the plan's duration the event loop's own cyclic garbage waits too; it is
        collected once the collector runs again. Done here, by the process owner: the planner itself changes no
        process state (:func:`walras.collector.paused`)."""
        with paused():
            return self.planned_from(*args, **kwargs)

    @staticmethod
    def settle_gc() -> None:
        """Move every object alive now (the stored plan, the snapshot it was built from, the indexes) out of the
        cyclic garbage collector's reach (``gc.freeze``), in both modes, after each plan is stored.

        The next plan is warm-started from this one and allocates ~10^5 objects, so the collector's generation-2
        collections that land inside it would otherwise walk the previous plan and the whole cluster each time
        (measured on 5,000 nodes / 20,000 pods: the warm plan 0.65 s CPU with them, ~0.35 s frozen). Frozen objects
        are still freed by reference counting when a later plan replaces this one: plans and the planner make no
        reference cycles (tests/test_planner_gc.py), so nothing frozen waits for a collection that never comes.
        Done here, by the process owner, never inside the planner (which changes no process state); ``walras run``
        freezes its start-up objects once (``walras.cli.run.settle_gc``), the extender freezes each new plan it
        indexes."""
        gc.freeze()

    def plan_options(self) -> PlanOptions:
        """The options of the next plan: the churn budgets and the node-loss grace of the operator's settings, and
        the wall clock now."""
        return PlanOptions(max_deletes=self.options.max_deletes, max_migrations=self.options.max_migrations,
                           node_loss_grace=self.options.node_loss_grace, now=self.clock())

    async def act(self, plan: Plan, snapshot: Snapshot) -> None:
        pods = {_key(p): p for p in snapshot.pods}
        jobs = {_key(j): j for j in snapshot.jobs}
        sem = asyncio.Semaphore(self.options.concurrency)

        async def guarded(coro: Any) -> None:
            async with sem:
                try:
                    await coro
                except KubeError as exc:
                    logger.warning("API call failed after retries: %s", exc)

        ops = [guarded(self._adopt(pod, jobs)) for pod in snapshot.pods if self._needs_adoption(pod, jobs)]
        resizing: dict[tuple[str, str], set[str]] = {}
        for pp in plan.pods:
            if pp.action == "resize":
                resizing.setdefault((pp.namespace, pp.job), set()).add(pp.name)
        for key in list(self._resize_waiting):  # pods that no longer wait for a resize (resized, gone, replaced)
            waiting = {n: m for n, m in self._resize_waiting[key].items() if n in resizing.get(key, ())}
            if waiting:
                self._resize_waiting[key] = waiting
                self._resize_pending[key] = "; ".join(waiting[name] for name in sorted(waiting))
            else:
                del self._resize_waiting[key]
                self._resize_pending.pop(key, None)
        for pp in plan.pods:
            current = pods.get((pp.namespace, pp.name))
            if pp.action == "create" and current is None:
                job = jobs.get((pp.namespace, pp.job))
                if job is not None:
                    ops.append(guarded(self._create(pp, job)))
            elif pp.action in ("create", "bind") and current is not None:
                if self.options.mode == "direct" and pp.node and not (current.get("spec") or {}).get("nodeName"):
                    ops.append(guarded(self._bind(pp, current)))
            elif pp.action == "resize" and current is not None:
                ops.append(guarded(self._resize(pp, current, jobs.get((pp.namespace, pp.job)))))
            elif pp.action == "delete" and current is not None:
                ops.append(guarded(self._delete(pp, current, jobs.get((pp.namespace, pp.job)))))
            elif pp.action == "evict" and current is not None:
                ops.append(guarded(self._evict(pp, current, jobs.get((pp.namespace, pp.job)))))
        for key in [k for k in self._blocked if k not in pods]:  # pods gone: their blocked evictions are over
            del self._blocked[key]
        await asyncio.gather(*ops)
        await asyncio.gather(*(guarded(op) for op in self._status_ops(plan, snapshot)))
        await asyncio.gather(*(guarded(op) for op in self._event_ops(plan, snapshot)))

    # ------------------------------------------------------------------ pods

    def _needs_adoption(self, pod: Mapping[str, Any], jobs: Mapping[tuple[str, str], Mapping[str, Any]]) -> bool:
        meta = pod.get("metadata") or {}
        job_name = (meta.get("labels") or {}).get(LABEL_JOB)
        if not job_name or (meta.get("namespace"), job_name) not in jobs or meta.get("deletionTimestamp"):
            return False
        return not any(ref.get("controller") for ref in meta.get("ownerReferences") or [])

    async def _adopt(self, pod: Mapping[str, Any], jobs: Mapping[tuple[str, str], Mapping[str, Any]]) -> None:
        meta = pod["metadata"]
        job = jobs[(meta["namespace"], meta["labels"][LABEL_JOB])]
        ref = {"apiVersion": API_VERSION, "kind": "FungibleJob", "name": job["metadata"]["name"],
               "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
        refs = [*list(meta.get("ownerReferences") or []), ref]
        patch = {"metadata": {"ownerReferences": refs, "labels": {LABEL_MANAGED: "true"}}}
        await self.client.request("PATCH", self.client.pod_path(meta["namespace"], meta["name"]), patch,
                                  content_type="application/merge-patch+json", retry_conflict=True)
        logger.info("adopted pod %s/%s into FungibleJob %s", meta["namespace"], meta["name"], ref["name"])

    async def _create(self, pp: PodPlan, job: Mapping[str, Any]) -> None:
        try:
            body = pod_manifest(job, pp, self.options.scheduler_name)
        except ValueError as exc:
            await self._event(job, "Warning", "PodTemplateInvalid", str(exc))
            return
        pod, created = await self.client.create_pod(pp.namespace, body)
        self._assume(pod)
        if created:
            logger.info("created pod %s/%s for job %s in pool %s", pp.namespace, pp.name, pp.job, pp.pool)
            await self._event(job, "Normal", "SuccessfulCreate",
                              f"Created pod {pp.name} in pool {pp.pool} (planned node {pp.node or 'none'})")
        if self.options.mode == "direct" and pp.node and not (pod.get("spec") or {}).get("nodeName"):
            await self._bind(pp, pod)

    async def bind(self, namespace: str, name: str, uid: str, node: str, mode: str = "extender") -> None:
        """Bind a pod (the extender's binder): at most once per uid, through ``pods/binding``."""
        if uid and uid in self._binding:
            raise KubeError(409, "Conflict", f"pod {namespace}/{name} is being bound already")
        if uid:
            self._binding.add(uid)
        pool = ""
        if self.plan is not None:
            planned = self.plan.pod(namespace, name)
            pool = planned.pool if planned is not None else ""
        try:
            done = await self.client.bind(namespace, name, uid, node)
        except KubeError as exc:
            self.metrics.binding_error(pool, exc.reason or str(exc.code))
            if uid:
                self._binding.discard(uid)
            raise
        known = self._pods.get((namespace, name))
        if known is not None:  # counts on its node until the watch shows the binding
            bound = {**known, "spec": {**(known.get("spec") or {}), "nodeName": node}}
            self._assume(bound)
        if done:
            self.metrics.bound(pool, mode)

    async def _bind(self, pp: PodPlan, pod: Mapping[str, Any]) -> None:
        assert pp.node is not None
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if uid in self._binding:
            return
        try:
            await self.bind(pp.namespace, pp.name, uid, pp.node, mode="direct")
        except KubeError as exc:
            await self._event(pod, "Warning", "BindingFailed", f"binding to {pp.node} failed: {exc}")
            return
        logger.info("bound pod %s/%s to %s", pp.namespace, pp.name, pp.node)
        await self._event(pod, "Normal", "Scheduled", f"Walras assigned {pp.namespace}/{pp.name} to {pp.node}")

    async def _resize(self, pp: PodPlan, pod: Mapping[str, Any], job: Mapping[str, Any] | None) -> None:
        """Take a running pod to its planned requests/limits through ``pods/resize`` where the API server serves it
        (discovered, :meth:`KubeClient.supports_pod_resize`); elsewhere record on the job (``ResizePending``
        condition and a ``ResizeDeferred`` Event) that the change waits for the next pod."""
        key = (pp.namespace, pp.job)
        waiting = self._resize_waiting.setdefault(key, {})
        containers = resize_containers(pod, pp)
        why = f" ({pp.reason})" if pp.reason else ""
        if containers is not None and await self.client.resize_pod(pp.namespace, pp.name, containers):
            logger.info("resized pod %s/%s in place%s", pp.namespace, pp.name, why)
            await self._event(pod, "Normal", "Resized", f"Walras resized {pp.name} in place{why}")
            containers = None
        if containers is None:
            waiting.pop(pp.name, None)
        else:
            message = (f"pod {pp.name}: in-place resize is not supported by this cluster; the new requests/limits"
                       f"{why} apply to the next pod created")
            repeated = waiting.get(pp.name) == message
            waiting[pp.name] = message
            if job is not None and not repeated:
                await self._event(job, "Normal", "ResizeDeferred", message)
        if waiting:
            self._resize_pending[key] = "; ".join(waiting[name] for name in sorted(waiting))
        else:
            self._resize_pending.pop(key, None)
            self._resize_waiting.pop(key, None)

    def _assume(self, pod: Mapping[str, Any]) -> None:
        typed = pod_from(pod)
        if typed is not None:
            self._pods[typed.key] = pod
            self.assumed.assume(typed, time.monotonic())

    async def _delete(self, pp: PodPlan, pod: Mapping[str, Any], job: Mapping[str, Any] | None) -> None:
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
                await self._event(job, "Normal", "SuccessfulDelete",
                                  f"{'Force-deleted' if forced else 'Deleted'} pod {pp.name}: {why}")

    async def _evict(self, pp: PodPlan, pod: Mapping[str, Any], job: Mapping[str, Any] | None) -> None:
        """Move a running pod: evict it through the Eviction API (PodDisruptionBudgets hold; grace ``pp.grace`` or
        the pod's own). Blocked (429) -> the pod stays, a Warning Event ``EvictionBlocked`` on the job (once per pod
        and message) and the next plan asks again. Never a plain delete."""
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):  # evicted already, terminating within its grace period
            self.assumed.forget(pp.namespace, pp.name)
            return
        key = (pp.namespace, pp.name)
        result = await self.client.evict_pod(pp.namespace, pp.name, pp.grace, str(meta.get("uid") or "") or None)
        if result.outcome == "blocked":
            message = f"Eviction of pod {pp.name} refused, retried by the next plan: {result.message}"
            logger.info("eviction of %s/%s blocked: %s", pp.namespace, pp.name, result.message)
            if job is not None and self._blocked.get(key) != message:
                self._blocked[key] = message
                await self._event(job, "Warning", "EvictionBlocked", message)
            return
        self._blocked.pop(key, None)
        self.assumed.forget(pp.namespace, pp.name)
        if result.outcome == "evicted":
            why = f": {pp.reason}" if pp.reason else ""
            logger.info("evicted pod %s/%s%s", pp.namespace, pp.name, why)
            if job is not None:
                await self._event(job, "Normal", "Evicted", f"Evicted pod {pp.name} to move it{why}")

    # ------------------------------------------------------------------ statuses and events

    def _status_ops(self, plan: Plan, snapshot: Snapshot) -> Iterable[Any]:
        base = f"/apis/{API_VERSION}"
        pools = {_key(p)[1]: p for p in snapshot.pools}
        for name, pool_plan in plan.pools.items():
            obj = pools.get(name)
            if obj is not None:
                yield self._write_status(("ResourcePool", "", name), f"{base}/resourcepools/{name}", obj,
                                         pool_plan.status())
        jobs = {_key(j): j for j in snapshot.jobs}
        for key, job_plan in plan.jobs.items():
            obj = jobs.get(key)
            if obj is None:
                continue
            desired = job_plan.status()
            pending = self._resize_pending.get(key)
            if pending:
                desired["conditions"] = [*desired["conditions"], {
                    "type": "ResizePending", "status": "True", "reason": "InPlaceResizeUnsupported",
                    "message": pending}]
            yield self._write_status(("FungibleJob", *key), f"{base}/namespaces/{key[0]}/fungiblejobs/{key[1]}",
                                     obj, desired)
        profiles = {_key(p)[1]: p for p in snapshot.profiles}
        for name, conditions in plan.profiles.items():
            obj = profiles.get(name)
            if obj is not None:
                desired = {"conditions": [c.to_dict() for c in conditions],
                           "observedGeneration": (obj.get("metadata") or {}).get("generation")}
                yield self._write_status(("ColocationProfile", "", name), f"{base}/colocationprofiles/{name}", obj,
                                         desired)

    async def _write_status(self, key: tuple[str, str, str], path: str, obj: Mapping[str, Any],
                            desired: Mapping[str, Any]) -> None:
        current = obj.get("status")
        written = self._status_written.get(key)
        if written is not None and written[0] == (obj.get("metadata") or {}).get("resourceVersion"):
            current = written[1]  # our last write is newer than the cached object
        desired = stamp_conditions(current, desired, (obj.get("metadata") or {}).get("generation"))
        patch = status_patch(current, desired)
        if patch is None:
            return
        try:
            result = await self.client.patch_status(path, patch)
        except KubeError as exc:
            if exc.code == 404:
                return
            raise
        self._status_written[key] = ((obj.get("metadata") or {}).get("resourceVersion"), result.get("status"))

    def _event_ops(self, plan: Plan, snapshot: Snapshot) -> Iterable[Any]:
        objects: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        for kind, items in (("ResourcePool", snapshot.pools), ("FungibleJob", snapshot.jobs),
                            ("ColocationProfile", snapshot.profiles), ("Pod", snapshot.pods)):
            for obj in items:
                objects[(kind, *_key(obj))] = obj
        for ev in plan.events:
            ident = (ev.kind, ev.namespace, ev.name, ev.reason, ev.message)
            if ident in self._posted:
                continue
            involved = objects.get((ev.kind, ev.namespace, ev.name))
            if involved is None:
                continue
            if len(self._posted) > 50_000:  # bound the memory of what was posted; a repeat Event is harmless
                self._posted.clear()
            self._posted.add(ident)
            yield self._event(involved, ev.type, ev.reason, ev.message)

    async def _event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Post an Event; failing to record one never fails the action it describes."""
        body = event_body(obj, type_, reason, message, self.options.identity)
        try:
            await self.client.post_event(body["metadata"]["namespace"], body)
        except KubeError as exc:
            logger.warning("could not record Event %s on %s: %s", reason, body["involvedObject"]["name"], exc)
