"""The operator freezes each stored plan out of the cyclic garbage collector's reach (``gc.freeze``; see
:meth:`walras.operator.controller.Controller.settle_gc`). That is only safe if plans hold no reference cycles, so that
a frozen plan is still freed by reference counting once a later plan replaces it: checked here on the bench's
scenarios at small size (a warm plan that reuses the previous plan's pod plans and translations included), and the
controller is checked to freeze after each stored plan only when asked to."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any, cast

from walras.kube.client import KubeClient
from walras.metrics import WalrasMetrics
from walras.operator import Controller, OperatorOptions
from walras.planner import Plan, Snapshot

from bench.planner import cluster, grow_one_job, running
from tests.planning import build_plan


def test_a_frozen_plan_is_freed_by_reference_counting_when_replaced() -> None:
    snap = cluster(60, 3, 12, 4)
    first = build_plan(snap)
    steady = running(snap, first)
    changed = grow_one_job(steady)
    build_plan(changed, build_plan(steady))  # the planner's one-time lazy set-up (compiled kernels' types) first
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        previous = build_plan(changed)  # the grown job's new pods: pod plans the next plan does not reuse
        gc.freeze()  # as the controller does once the plan is stored
        plan_ref = weakref.ref(previous)
        job_refs = [weakref.ref(job) for job in previous.jobs.values()]
        warm = build_plan(steady, previous)  # the job shrinks back
        # pod plans the warm plan reuses stay alive through it; every other pod plan of ``previous`` must go with it
        shared = {id(p) for p in warm.pods}
        own_refs = [weakref.ref(p) for p in previous.pods if id(p) not in shared]
        assert len(own_refs) >= 2, "the grown job's two new pods are the previous plan's own pod plans"
        assert sum(1 for p in previous.pods if id(p) in shared) > len(own_refs), "the warm plan reuses pod plans"
        del previous
        assert plan_ref() is None, "the previous plan outlived its last reference: it is in a reference cycle"
        assert all(r() is None for r in job_refs), "a job plan of the previous plan is in a reference cycle"
        assert all(r() is None for r in own_refs), "a pod plan of the previous plan is in a reference cycle"
        # and neither plan left cyclic garbage behind: nothing for a collection to find
        assert gc.collect() == 0
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


class _Client:
    """Stands in for the API client: an empty plan makes no API call."""


def _reconcile(freeze: bool) -> int:
    def planner(snapshot: Snapshot, previous: Plan | None, **_: Any) -> Plan:
        return Plan()

    controller = Controller(cast(KubeClient, _Client()), lambda: Snapshot(), planner, OperatorOptions(freeze_gc=freeze),
                            WalrasMetrics())
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    plan = asyncio.run(controller.reconcile())
    assert plan is controller.plan
    return gc.get_freeze_count()


def test_the_controller_freezes_after_each_stored_plan_when_asked() -> None:
    try:
        assert _reconcile(True) > 0
        assert _reconcile(False) == 0
    finally:
        gc.unfreeze()


def _collector_during_plan(pause: bool, fail: bool = False) -> list[bool]:
    seen: list[bool] = []

    def planner(snapshot: Snapshot, previous: Plan | None, **_: Any) -> Plan:
        seen.append(gc.isenabled())
        if fail:
            raise RuntimeError("planner bug")
        return Plan()

    controller = Controller(cast(KubeClient, _Client()), lambda: Snapshot(), planner,
                            OperatorOptions(freeze_gc=False, pause_gc=pause), WalrasMetrics())
    plan = asyncio.run(controller.reconcile())
    assert (plan is None) == fail
    return seen


def test_the_controller_pauses_the_collector_while_it_plans_and_restores_it() -> None:
    assert gc.isenabled()
    assert _collector_during_plan(True) == [False]
    assert gc.isenabled()
    assert _collector_during_plan(True, fail=True) == [False]  # a planner that raises: reported, collector back on
    assert gc.isenabled()
    assert _collector_during_plan(False) == [True]
    gc.disable()  # a process that runs without the collector keeps it off
    try:
        assert _collector_during_plan(True) == [False]
        assert not gc.isenabled()
    finally:
        gc.enable()
