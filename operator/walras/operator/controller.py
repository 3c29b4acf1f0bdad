"""The reconcile loop: snapshot -> ``build_plan`` -> API calls (pods, bindings, resizes, statuses, Events).

kopf feeds the controller (see :mod:`walras.operator.handlers`): indexes hold the objects, event handlers call
:meth:`Controller.observe`, which triggers a re-plan when the event changes what the planner reads
(:class:`~walras.operator.watch.Watcher`); a timer triggers on the plan period. The loop debounces triggers, plans
off the event loop (``asyncio.to_thread``), then acts through three parts it composes:

* :class:`~walras.operator.actuator.Actuator`: the pod actions (creates, bindings, resizes, deletions, evictions,
  adoptions) and the assumed pods;
* :class:`~walras.operator.statuses.StatusWriter`: the statuses of pools, jobs and profiles, merge-patched when they
  differ, and the plan's Events, posted once;
* :class:`~walras.operator.watch.SnapshotIndex`: the snapshot's objects by key, built once per plan for both.

Every plan gets the wall clock (``PlanOptions.now``) for its time-dependent rules (backoff of failed pods, the
node-loss grace, migrations' minimum run time and cooldown), and the operator's ``max_migrations`` and
``node_loss_grace`` settings.

Each stored plan, and everything alive with it, is frozen out of the cyclic garbage collector's reach
(:meth:`Controller.settle_gc`), so the collections inside the next plan do not walk the previous one.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from walras.collector import paused
from walras.kube.client import KubeClient
from walras.kube.decode import TranslationCache, cluster_from, node_from, pod_from
from walras.kube.errors import Conflict
from walras.kube.snapshot import object_key
from walras.metrics import WalrasMetrics
from walras.operator.actuator import Actuator
from walras.operator.assumed import AssumedPods
from walras.operator.budgets import BudgetWriter
from walras.operator.ownership import OWNED_BY_ANOTHER_RELEASE, PoolScope
from walras.operator.recorder import Recorder, gather_calls
from walras.operator.statuses import StatusWriter
from walras.operator.watch import SnapshotIndex, Watcher
from walras.planner.capacity import room_for
from walras.planner.cluster import TenantOptions
from walras.planner.model import LABEL_MANAGED, Plan, Snapshot
from walras.planner.plan import PlanOptions
from walras.planner.reuse import PlanCache

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
    #: the Budgets' Fisher market (walras.planner.tenants, docs/budgets.md); None: tenants off
    tenants: TenantOptions | None = None

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
    #: the wall clock handed to each plan (``PlanOptions.now``); tests replace it
    clock: Callable[[], float] = time.time
    planned: asyncio.Event = field(default_factory=asyncio.Event)
    #: pods created or bound by us that the watch has not shown yet (walras.operator.assumed)
    assumed: AssumedPods = field(default_factory=AssumedPods)
    watcher: Watcher = field(default_factory=Watcher)
    actuator: Actuator = field(init=False)
    statuses: StatusWriter = field(init=False)
    budgets: BudgetWriter = field(init=False)
    #: the planner's reuse between plans (walras.planner.reuse) and the translations of the API objects
    #: (walras.kube.decode), owned here
    plan_cache: PlanCache = field(default_factory=PlanCache)
    translations: TranslationCache = field(default_factory=TranslationCache)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None
    #: the pools and jobs of this release (``--pool-selector``, walras.operator.ownership); None: all of them
    pool_scope: PoolScope | None = None

    def __post_init__(self) -> None:
        recorder = Recorder(self.client, self.options.identity)
        self.actuator = Actuator(self.client, recorder, self.metrics, self.assumed, self.options.mode,
                                 self.options.scheduler_name)
        self.statuses = StatusWriter(self.client, recorder)
        self.budgets = BudgetWriter(self.client, metrics=self.metrics.budgets)

    # ------------------------------------------------------------------ triggers

    def observe(self, kind: str, event_type: str | None, obj: Mapping[str, Any]) -> bool:
        """Record an object event; trigger a re-plan (and return True) if it matters to the plan."""
        reason = self.watcher.changed(kind, event_type, obj)
        if reason is None:
            return False
        if event_type == "DELETED":
            self.actuator.deleted(kind, obj)
        self.trigger(reason)
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
        """One pass: the snapshot, the plan (from the previous one, with the assumed pods), then the plan's API
        calls; the plan, or None when planning failed."""
        snapshot = self.source()
        if self.pool_scope is not None:  # this release's pools and jobs only (docs/tasks/two-releases.md)
            snapshot = await self.pool_scope.scope(snapshot, self.client, self.report_refused_pool)
        started = time.perf_counter()
        index = SnapshotIndex.of(snapshot)
        self.actuator.observed(index)
        seen = {key: (str((p.get("metadata") or {}).get("uid") or ""), (p.get("spec") or {}).get("nodeName") or None)
                for key, p in index.pods.items()}
        self.assumed.prune(seen, (object_key(n)[1] for n in snapshot.nodes), time.monotonic())
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
        await self.act(plan, snapshot, index)
        self.planned.set()
        return plan

    def planned_from(self, snapshot: Snapshot, previous: Plan | None, **kwargs: Any) -> Plan:
        """``snapshot`` translated (with the controller's translation cache) and planned by ``self.planner`` after
        ``previous`` with the controller's plan cache."""
        cluster = cluster_from(snapshot, self.translations)
        if previous is None:  # a restart: the refusals the jobs' statuses carry go on (docs/refusals.md)
            self.actuator.restore(cluster.jobs)
        if self.actuator.refusals:  # the API server's refusals of pod creations are an input (docs/refusals.md)
            cluster = replace(cluster, refused=self.actuator.refusals)
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
                           node_loss_grace=self.options.node_loss_grace, now=self.clock(),
                           tenants=self.options.tenants)

    async def act(self, plan: Plan, snapshot: Snapshot, index: SnapshotIndex | None = None) -> None:
        """Carry ``plan`` out against ``snapshot`` (``index``: its objects by key, when already built): the pod
        actions first, then the statuses, then the plan's Events."""
        index = SnapshotIndex.of(snapshot) if index is None else index
        limit = self.options.concurrency
        await gather_calls(self.actuator.calls(plan, index), limit)
        await gather_calls(self.statuses.status_calls(plan, index, self.actuator.resize_pending,
                                                      self.actuator.eviction_blocked, self.actuator.refusals), limit)
        await gather_calls(self.statuses.event_calls(plan, index), limit)
        await gather_calls(self.budgets.status_calls(plan, snapshot, self.clock()), limit)

    async def report_refused_pool(self, pool: Mapping[str, Any], holder: str) -> None:
        """The Warning Event ``OwnedByAnotherRelease`` on ``pool``, which release ``holder`` plans."""
        release = self.pool_scope.release if self.pool_scope is not None else self.options.identity
        await self.statuses.recorder.event(
            pool, "Warning", OWNED_BY_ANOTHER_RELEASE,
            f"pool matches the pool selector of release {release} but release {holder} plans it (its "
            f"walras.dev/planned-by annotation): release {release} leaves it alone; make the releases' "
            "--pool-selector (operator.poolSelector) disjoint")

    async def bind_foreign(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Bind a pod Walras does not manage as kube-scheduler's default binder would (``pods/binding``), when the
        extender is the scheduler's binder (it must bind every pod sent to it, docs/refusals.md): only after
        checking that ``node`` still has room for it, counting the pods bound there in the current snapshot and the
        operator's assumed pods (:func:`walras.planner.capacity.room_for`), so a binding never over-commits a node;
        :class:`~walras.kube.errors.Conflict` with the reason when it has none (kube-scheduler retries the pod)."""
        snapshot = self.source()
        raw = next((p for p in snapshot.pods if (p.get("metadata") or {}).get("namespace") == namespace
                    and (p.get("metadata") or {}).get("name") == name), None)
        pod = pod_from(raw) if raw is not None else None
        if pod is None or raw is None:
            raise Conflict(409, "Conflict", f"pod {namespace}/{name} is not in the operator's cache yet")
        if pod.job is not None or ((raw.get("metadata") or {}).get("labels") or {}).get(LABEL_MANAGED) == "true":
            raise Conflict(409, "Conflict", f"pod {namespace}/{name} is Walras's and not in the current plan: Walras "
                           "binds it only to its planned node")
        raw_node = next((n for n in snapshot.nodes if (n.get("metadata") or {}).get("name") == node), None)
        here = [p for p in (pod_from(o) for o in snapshot.pods if (o.get("spec") or {}).get("nodeName") == node)
                if p is not None]
        assumed = [p for p in self.assumed.pods() if p.node == node and p.key not in {o.key for o in here}]
        why = room_for(pod, node_from(raw_node) if raw_node is not None else None, here + assumed)
        if why is not None:
            raise Conflict(409, "Conflict", f"pod {namespace}/{name} not bound to {node}: {why}")
        await self.actuator.bind(namespace, name, uid, node, "", mode="foreign", raw=raw)

    async def bind(self, namespace: str, name: str, uid: str, node: str, mode: str = "extender") -> None:
        """Bind a pod (the extender's binder): at most once per uid, through ``pods/binding``
        (:meth:`Actuator.bind`, with the pool the current plan places it in)."""
        planned = self.plan.pod(namespace, name) if self.plan is not None else None
        await self.actuator.bind(namespace, name, uid, node, planned.pool if planned is not None else "", mode)
