"""Which pools and jobs this release manages: ``walras run --pool-selector`` and the pools' claims
(docs/tasks/two-releases.md).

ResourcePools are cluster-scoped, so two Walras releases on one cluster would both plan every pool. A release
manages only the pools that

* match its pool selector (kubectl label-selector syntax on the pool's ``metadata.labels``; none: every pool), and
* are claimed by it: the annotation :data:`ANNOTATION_PLANNED_BY` names the release's identity (``NAMESPACE/LEASE``,
  the Lease that elects its leader). A release with a selector claims each matching, unclaimed pool before it plans
  it, with a merge patch that carries the pool's ``resourceVersion`` (the API server refuses it with 409 when the
  pool changed meanwhile), so of two releases claiming one pool exactly one succeeds. A release without a selector
  claims nothing (it behaves as before this option existed) but leaves every pool another release claimed alone.

A pool that matches the selector but is claimed by another, live release is refused: not planned, no pod created in
it, no status written; the refusal is reported once per pool and holder as a Warning Event with reason
:data:`OWNED_BY_ANOTHER_RELEASE` on the pool (an Event, not a condition of the pool's status: the owner writes that
status, and a condition written by the refusing release would be removed by the owner's next write and written back
by the refuser's, a status that flips for ever). A claim is stale, and may be taken over, when the holder's Lease
has not changed for :attr:`PoolScope.stale_after` seconds as seen by this release (absent, or released and not
taken again): an uninstalled release's claims expire by themselves; a live leader renews its Lease every few
seconds. Staleness is judged on this release's own monotonic clock, as :mod:`walras.operator.leader` judges expiry.

A job is planned by exactly one release: the one that manages the job's *home pool*, the first pool by name among
those its ``spec.throughput`` gives a positive throughput (all of its entries when none is positive) that exist in
the cluster. Every release sees every pool's labels and claim (kopf's pool index is cluster-wide; only the snapshot
handed to the planner is narrowed), so all releases compute the same home pool, and only its manager plans the job,
on the pools it manages, and writes the job's status: two releases never both write one job's status. A job whose
pools do not exist belongs to the releases without a selector (which report it as they always did). The namespaces
of ``--namespace`` narrow the jobs further. Managed pods (``walras.dev/managed``) of jobs another release plans are
left out of the snapshot, as the pods of jobs outside ``--namespace`` are; pools of different releases should select
disjoint nodes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from walras.kube.client import KubeClient
from walras.kube.errors import ApiError, Conflict, NotFound
from walras.kube.snapshot import object_key
from walras.planner.cluster import LabelSelector
from walras.planner.model import API_VERSION, GROUP, LABEL_JOB, LABEL_MANAGED, LABEL_POOL, Snapshot

logger = logging.getLogger("walras.operator")

#: The annotation by which a release claims a pool; its value is the release's identity.
ANNOTATION_PLANNED_BY = f"{GROUP}/planned-by"
#: The reason of the Warning Event on a pool another release manages.
OWNED_BY_ANOTHER_RELEASE = "OwnedByAnotherRelease"

RawObject = Mapping[str, Any]


def _meta(obj: RawObject) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def home_pool(job: RawObject, pools: Iterable[str]) -> str | None:
    """The job's home pool: the first pool by name of ``pools`` (the cluster's pools) among those the job's
    ``spec.throughput`` gives a positive throughput, or among all of its entries when none is positive; None when
    none of them exists."""
    existing = set(pools)
    throughput = (job.get("spec") or {}).get("throughput")
    if not isinstance(throughput, Mapping):
        return None

    def positive(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0

    names = sorted(str(k) for k, v in throughput.items() if positive(v)) or sorted(str(k) for k in throughput)
    return next((name for name in names if name in existing), None)


@dataclass(frozen=True)
class Scope:
    """One pass's division of the pools: ``managed`` (planned by this release), ``to_claim`` (matching and
    unclaimed: claimed before they are planned) and ``refused`` (matching, claimed by another live release: pool
    name -> holder)."""

    managed: frozenset[str]
    to_claim: tuple[str, ...]
    refused: Mapping[str, str]


@dataclass
class PoolScope:
    """The pools and jobs of one release (module docstring). ``selector`` None: every pool, no claims written."""

    release: str
    selector: LabelSelector | None = None
    stale_after: float = 60.0
    clock: Callable[[], float] = time.monotonic
    #: holder -> (the holder's Lease record as last read, when it last changed on ``clock``)
    _leases: dict[str, tuple[Any, float]] = field(default_factory=dict)
    _reported: set[tuple[str, str]] = field(default_factory=set)

    @property
    def claims(self) -> bool:
        """Whether this release claims the pools it manages (it has a selector)."""
        return self.selector is not None

    def divide(self, pools: Iterable[RawObject], stale: Callable[[str], bool] = lambda holder: False) -> Scope:
        """Divide ``pools`` (raw ResourcePools) into managed, to claim and refused; ``stale(holder)`` says whether
        another release's claim has expired (it may then be claimed again)."""
        managed: set[str] = set()
        to_claim: list[str] = []
        refused: dict[str, str] = {}
        for pool in pools:
            meta = _meta(pool)
            name = str(meta.get("name") or "")
            if self.selector is not None and not self.selector.matches(meta.get("labels") or {}):
                continue
            holder = str((meta.get("annotations") or {}).get(ANNOTATION_PLANNED_BY) or "")
            if holder == self.release:
                managed.add(name)
            elif holder and not stale(holder):
                refused[name] = holder
            elif self.claims:
                to_claim.append(name)
            else:
                managed.add(name)
        return Scope(frozenset(managed), tuple(sorted(to_claim)), refused)

    def narrow(self, snapshot: Snapshot, managed: frozenset[str]) -> Snapshot:
        """``snapshot`` with only the ``managed`` pools, the jobs whose home pool is managed (a job with no
        existing pool only for a release without a selector) and, of the managed pods, those of these jobs (or, for
        a pod whose job is not in the snapshot, whose pool is managed); every other object as it is."""
        names = [object_key(p)[1] for p in snapshot.pools]

        def mine(job: RawObject) -> bool:
            home = home_pool(job, names)
            return home in managed if home is not None else not self.claims

        jobs = tuple(j for j in snapshot.jobs if mine(j))
        if len(jobs) == len(snapshot.jobs) and len(managed) == len(names):
            return snapshot
        kept = {object_key(j) for j in jobs}
        present = {object_key(j) for j in snapshot.jobs}

        def keep_pod(pod: RawObject) -> bool:
            labels = _meta(pod).get("labels") or {}
            if labels.get(LABEL_MANAGED) != "true":
                return True
            job = (str(_meta(pod).get("namespace") or ""), str(labels.get(LABEL_JOB) or ""))
            if job in present:
                return job in kept
            pool = str(labels.get(LABEL_POOL) or "")
            return pool in managed or (not self.claims and pool not in names)

        return replace(snapshot, pools=tuple(p for p in snapshot.pools if object_key(p)[1] in managed), jobs=jobs,
                       pods=tuple(p for p in snapshot.pods if keep_pod(p)))

    # ------------------------------------------------------------------ API calls

    async def scope(self, snapshot: Snapshot, client: KubeClient,
                    report: Callable[[RawObject, str], Any] | None = None) -> Snapshot:
        """This release's part of ``snapshot``: claims the matching unclaimed pools (those claimed are managed from
        this pass on; one another release won meanwhile is left for the next pass), reports each refused pool once
        (``report(pool, holder)``, awaited when it returns an awaitable) and narrows the snapshot (:meth:`narrow`)."""
        holders = {str((_meta(p).get("annotations") or {}).get(ANNOTATION_PLANNED_BY) or "") for p in snapshot.pools}
        foreign = sorted(h for h in holders if h and h != self.release)
        if self.selector is None and not foreign:
            return snapshot  # as before pool selectors: every pool, nothing claimed
        expired = {h for h in foreign if await self._stale(client, h)}
        scope = self.divide(snapshot.pools, lambda holder: holder in expired)
        managed = set(scope.managed)
        by_name = {object_key(p)[1]: p for p in snapshot.pools}
        for name in scope.to_claim:
            if await self.claim(client, by_name[name]):
                managed.add(name)
        for name, holder in sorted(scope.refused.items()):
            if (name, holder) not in self._reported:
                self._reported.add((name, holder))
                logger.warning("ResourcePool %s matches this release's pool selector but release %s plans it: "
                               "left alone", name, holder)
                if report is not None:
                    result = report(by_name[name], holder)
                    if hasattr(result, "__await__"):
                        await result
        return self.narrow(snapshot, frozenset(managed))

    async def claim(self, client: KubeClient, pool: RawObject) -> bool:
        """Write this release's claim on ``pool`` (a merge patch conditioned on its ``resourceVersion``); True when
        the API server took it, False when the pool changed meanwhile (409) or is gone."""
        meta = _meta(pool)
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                              "annotations": {ANNOTATION_PLANNED_BY: self.release}}}
        try:
            await client.request("PATCH", f"/apis/{API_VERSION}/resourcepools/{meta.get('name')}", patch,
                                 content_type="application/merge-patch+json", attempts=3)
        except (Conflict, NotFound):
            logger.info("ResourcePool %s changed while release %s claimed it: tried again next plan",
                        meta.get("name"), self.release)
            return False
        except ApiError as exc:
            logger.warning("could not claim ResourcePool %s for release %s: %s", meta.get("name"), self.release, exc)
            return False
        logger.info("release %s claimed ResourcePool %s", self.release, meta.get("name"))
        return True

    async def _stale(self, client: KubeClient, holder: str) -> bool:
        """Whether ``holder``'s claims have expired: its Lease (``NAMESPACE/NAME``) has not changed for
        :attr:`stale_after` seconds of this release's clock (absent counts as unchanged); an API error counts as
        live (claims are never taken over on a guess)."""
        namespace, _, name = holder.partition("/")
        record: Any
        try:
            lease = await client.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}",
                                         attempts=1)
            spec = lease.get("spec") or {}
            record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))
        except NotFound:
            record = None
        except ApiError:
            return False
        now = self.clock()
        seen = self._leases.get(holder)
        if seen is None or seen[0] != record:
            self._leases[holder] = (record, now)
            return False
        return now - seen[1] >= self.stale_after
