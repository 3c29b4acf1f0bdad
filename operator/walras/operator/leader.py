"""Leader election over a ``coordination.k8s.io/v1`` Lease, the way client-go's ``leaderelection`` package does it.

Every replica runs :meth:`LeaseElector.run`. A candidate takes the Lease when it is absent, released (empty
``holderIdentity``) or expired; expiry is judged on the candidate's own monotonic clock (the record has not changed for
``leaseDurationSeconds`` since this replica last saw it change), never by comparing the holder's ``renewTime`` with
the local wall clock. Writes carry the observed ``resourceVersion``, so of two candidates only one wins (the other
gets 409 Conflict). The holder renews every ``renew_period``; it counts as leader only while its last successful
renewal *started* less than ``renew_deadline`` ago, and ``renew_deadline < lease_duration``, so a holder cut off from
the API server stops acting before any other replica may take over.

Renewal follows client-go's fast path and its retry rule, so that injected or real 409/429/5xx answers do not make
the Lease flap (measured: with 10 % each of 409/429/500 and 3 s leases, the loop that did a GET and a PUT per round
and retried a failed renewal only at the next ``renew_period`` lost and re-won leadership 2-3 times in 30 s, each
time stopping and restarting the controller):

* the holder renews with one PUT of the Lease it last wrote (its ``resourceVersion``), without a GET, while that
  renewal is less than ``renew_deadline`` old; a 409 (a stale ``resourceVersion``, or a peer wrote) sends the next
  attempt through a GET first, as any other candidate;
* a failed renewal is retried every ``retry_period / 4`` (not after a whole ``renew_period``) until it succeeds or
  ``renew_deadline`` has passed since the last successful renewal started; only then does the replica stop leading.
  A failed attempt alone never ends leadership: others may take the Lease only ``lease_duration`` after that
  renewal, and ``lease_duration - renew_deadline`` is the margin in which this replica stops acting first.

A replica restarted with the same identity (the chart's pod name survives a container restart) finds itself the
holder and leads at once; another identity waits at most one ``lease_duration`` after the last renewal. On a clean
shutdown the holder releases the Lease, and a standby takes it within ``retry_period``.

No API answer ends the loop: 409, 429, 5xx and connection errors are logged and retried on the next period.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from walras.kube.client import KubeClient
from walras.kube.errors import ApiError, Conflict, NotFound

logger = logging.getLogger("walras.operator.leader")

Callback = Callable[[], Awaitable[None]]


def _micro_time() -> str:
    """A ``metav1.MicroTime`` for now (RFC 3339 with microseconds, UTC)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaseElector:
    """Acquire and renew the Lease ``namespace/name`` as ``identity``; call ``on_started``/``on_stopped`` on changes."""

    client: KubeClient
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    renew_period: float = 2.0
    retry_period: float = 2.0
    on_started: Callback | None = None
    on_stopped: Callback | None = None
    transitions: int = 0  # how often this replica became leader
    _renewed_at: float | None = None  # monotonic start of the last successful acquire/renew
    _observed: tuple[Any, ...] | None = None  # (holder, renewTime, transitions) as last seen
    _observed_at: float = 0.0  # monotonic time the record last changed, as seen here
    _leading: bool = False
    _held: dict[str, Any] | None = None  # the Lease as this replica last wrote it (fast-path renewal)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        if not 0 < self.renew_period < self.renew_deadline < self.lease_duration:
            raise ValueError("leader election needs 0 < renew_period < renew_deadline < lease_duration")

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    def is_leader(self) -> bool:
        """Whether this replica holds the Lease and renewed it within ``renew_deadline``."""
        return (self._leading and self._renewed_at is not None
                and time.monotonic() - self._renewed_at < self.renew_deadline)

    async def wait_changed(self) -> None:
        """Wait until leadership starts or stops (tests and logs)."""
        self._changed.clear()
        await self._changed.wait()

    # ------------------------------------------------------------------ one attempt

    def _spec(self, previous: dict[str, Any] | None) -> dict[str, Any]:
        now = _micro_time()
        spec = dict(previous or {})
        taking = spec.get("holderIdentity") != self.identity
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=round(self.lease_duration),
                    renewTime=now)
        if taking:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if previous else 0)
        return spec

    async def try_acquire_or_renew(self) -> bool:
        """One client-go style round: True if this replica holds the Lease afterwards.

        While this replica leads and its last renewal is valid, the round is one PUT of the Lease as last written
        (client-go's fast path); otherwise a GET decides whether the Lease may be taken, then a PUT (or a POST when
        there is none) takes or renews it."""
        started = time.monotonic()
        if self._held is not None and self.is_leader():
            body = {**self._held, "spec": self._spec(self._held.get("spec") or {})}
            try:
                updated = await self.client.request("PUT", self.path, body, attempts=1)
            except Conflict:
                self._held = None  # stale resourceVersion or a peer wrote: look before the next attempt
                return False
            self._wrote(updated, started)
            return True
        try:
            lease = await self.client.request("GET", self.path, attempts=1)
        except NotFound:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec(None)}
            try:
                created = await self.client.request(
                    "POST", f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases", body, attempts=1)
            except Conflict:  # a peer created it first
                return False
            self._wrote(created, started)
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, started
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and started - self._observed_at < duration:
            return False  # held by a live peer
        body = {**lease, "spec": self._spec(spec)}
        try:
            updated = await self.client.request("PUT", self.path, body, attempts=1)
        except Conflict:
            return False  # another replica wrote first
        self._wrote(updated, started)
        return True

    def _wrote(self, lease: dict[str, Any], started: float) -> None:
        """Record a successful acquire/renew that started at ``started`` (monotonic)."""
        spec = lease.get("spec") or {}
        self._held = lease
        self._observed = (self.identity, spec.get("renewTime"), spec.get("leaseTransitions"))
        self._observed_at = started
        self._renewed_at = started

    async def release(self) -> None:
        """Give the Lease up (empty holder, so a standby takes it at once); only if this replica holds it."""
        if not self._leading:
            return
        await self._set_leading(False)
        self._held = None
        try:
            async with asyncio.timeout(self.renew_deadline):  # never hold a shutdown up for long
                await self._release()
        except (ApiError, TimeoutError) as exc:
            logger.warning("could not release the leader Lease %s/%s: %s", self.namespace, self.name, exc)

    async def _release(self) -> None:
        lease = await self.client.request("GET", self.path, attempts=2)
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != self.identity:
            return
        body = {**lease, "spec": {**spec, "holderIdentity": "", "leaseDurationSeconds": 1,
                                  "renewTime": _micro_time()}}
        try:
            await self.client.request("PUT", self.path, body, attempts=2)
        except Conflict:  # a peer wrote it meanwhile: it is not ours to release any more
            logger.info("the leader Lease %s/%s changed before it was released", self.namespace, self.name)
            return
        logger.info("released the leader Lease %s/%s", self.namespace, self.name)

    # ------------------------------------------------------------------ the loop

    async def _set_leading(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        self._changed.set()
        if leading:
            self.transitions += 1
            logger.info("%s leads (Lease %s/%s)", self.identity, self.namespace, self.name)
            if self.on_started is not None:
                await self.on_started()
        else:
            logger.info("%s no longer leads (Lease %s/%s)", self.identity, self.namespace, self.name)
            if self.on_stopped is not None:
                await self.on_stopped()

    def _pause(self, held: bool) -> float:
        """Seconds to the next attempt: ``renew_period`` after a renewal, ``retry_period`` while not leading, and
        ``retry_period / 4`` after a failed renewal while leading, never past the renewal deadline (so the last
        attempt is made before leadership would end)."""
        if not self._leading:
            return self.retry_period
        if held:
            return self.renew_period
        assert self._renewed_at is not None
        left = self._renewed_at + self.renew_deadline - time.monotonic()
        return max(0.01, min(self.retry_period / 4, left - 0.01))

    async def run(self) -> None:
        """Elect forever (until cancelled); no API error ends it. Releases the Lease when cancelled."""
        try:
            while True:
                try:
                    held = await self.try_acquire_or_renew()
                except ApiError as exc:
                    logger.info("leader election round failed (%s); retrying", exc)
                    held = False
                if held:
                    await self._set_leading(True)
                elif self._leading and not self.is_leader():
                    await self._set_leading(False)  # could not renew within the deadline
                elif self._leading and self._observed is not None and self._observed[0] != self.identity:
                    await self._set_leading(False)  # someone else holds it now
                await asyncio.sleep(self._pause(held))
                if self._leading and not self.is_leader():
                    await self._set_leading(False)
        finally:
            await asyncio.shield(self.release())
