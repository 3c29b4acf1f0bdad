"""Planning in tests as a caller does it: a raw snapshot translated first (:func:`walras.kube.decode.cluster_from`
with a :class:`~walras.kube.decode.TranslationCache`), then :func:`walras.planner.plan.build_plan` with a
:class:`~walras.planner.reuse.PlanCache`.

Tests chain plans by passing the previous plan, and sometimes plan twice from the same one (with and without
reuse, to compare): :func:`build_plan` here keeps, per plan it returns, the caches that plan left (the entries it
recorded) and starts the next plan from a fork of the caches of the ``previous`` plan it is given; a plan built
from no previous plan (or from one this module did not build) starts from empty caches. So every plan reuses exactly
what its ``previous`` recorded, as when the memos lived inside the plan, while the planner itself only sees the
explicit caches.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Hashable, Sequence
from typing import TypeVar

from walras.kube.decode import TranslationCache, cluster_from
from walras.planner.cluster import Cluster, Pod
from walras.planner.model import Plan, Snapshot
from walras.planner.plan import PlanOptions
from walras.planner.plan import build_plan as plan_cluster
from walras.planner.reuse import PlanCache

__all__ = ["build_plan", "caches", "entry", "with_caches"]

E = TypeVar("E")

_CACHES: dict[int, tuple[weakref.ref[Plan], PlanCache, TranslationCache]] = {}


def caches(plan: Plan) -> tuple[PlanCache, TranslationCache]:
    """The plan cache and translation cache ``plan`` left (what it recorded)."""
    held = _CACHES.get(id(plan))
    assert held is not None and held[0]() is plan, "a plan this module did not build"
    return held[1], held[2]


def build_plan(source: Snapshot | Cluster, previous: Plan | None = None, *, options: PlanOptions | None = None,
               device: str = "cpu", assumed: Sequence[Pod] = ()) -> Plan:
    """``source`` (translated when raw) planned after ``previous``, from a fork of the caches ``previous`` left
    (see the module docstring); with ``options.reuse`` False nothing is taken from them (the new plan still
    records)."""
    opts = options or PlanOptions(device=device)
    held = _CACHES.get(id(previous)) if previous is not None else None
    if held is not None and held[0]() is previous and opts.reuse:
        cache, translation = held[1].fork(), held[2].fork()
    else:
        cache, translation = PlanCache(), TranslationCache()
    cluster = source if isinstance(source, Cluster) else cluster_from(source, translation)
    plan = plan_cluster(cluster, previous, cache=cache, options=opts, assumed=assumed)
    key = id(plan)
    _CACHES[key] = (weakref.ref(plan, lambda _: _CACHES.pop(key, None)), cache, translation)
    return plan


def entry(plan: Plan, kind: type[E], group: Hashable = None) -> E | None:
    """The entry of ``kind`` (and ``group``) that ``plan`` recorded in its plan cache."""
    return caches(plan)[0].get(kind, group)


def with_caches(plan: Plan, cache: PlanCache | None = None, translation: TranslationCache | None = None) -> Plan:
    """A copy of ``plan`` (the same content) whose caches are ``cache`` and ``translation`` (empty ones when not
    given): the next plan built from it reuses those and nothing else."""
    copy = dataclasses.replace(plan)
    key = id(copy)
    _CACHES[key] = (weakref.ref(copy, lambda _: _CACHES.pop(key, None)), cache or PlanCache(),
                    translation or TranslationCache())
    return copy
