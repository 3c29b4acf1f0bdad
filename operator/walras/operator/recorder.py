"""Posting Events for the operator (:class:`Recorder`) and running its API calls side by side (:func:`gather_calls`)."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from walras.kube.client import KubeClient
from walras.kube.encode import event_body
from walras.kube.errors import ApiError, NotFound

logger = logging.getLogger("walras.operator")

#: How many distinct Events the recorder remembers for aggregation (client-go's event correlator keeps 4096).
SERIES_LIMIT = 4096

#: (involved kind, namespace, name, uid, type, reason, message): one Event object per key
EventKey = tuple[str, str, str, str, str, str, str]


@dataclass
class Series:
    """The Event object posted for one key and how often it was seen."""

    namespace: str
    name: str
    count: int


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Recorder:
    """Posts core/v1 Events about objects, as ``identity`` (the reporting instance), aggregated the Kubernetes way
    (client-go's ``EventCorrelator``): the first occurrence of an Event (same involved object, type, reason and
    message) creates an object; a repeat merge-patches that object's ``count`` and ``lastTimestamp`` instead of
    creating another one (and creates a new one only when the old one expired). At most :data:`SERIES_LIMIT` keys
    are remembered (least recently used dropped)."""

    client: KubeClient
    identity: str
    _series: OrderedDict[EventKey, Series] = field(default_factory=OrderedDict)

    @staticmethod
    def key(obj: Mapping[str, Any], type_: str, reason: str, message: str) -> EventKey:
        meta = obj.get("metadata") or {}
        return (str(obj.get("kind") or ""), str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                str(meta.get("uid") or ""), type_, reason, message)

    async def event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Record an Event about ``obj`` (a new object, or the count of its earlier one raised); failing to record
        one never fails the action it describes."""
        key = self.key(obj, type_, reason, message)
        seen = self._series.get(key)
        try:
            if seen is not None:
                self._series.move_to_end(key)
                try:
                    await self.client.patch_event(seen.namespace, seen.name,
                                                  {"count": seen.count + 1, "lastTimestamp": _now()})
                    seen.count += 1
                    return
                except NotFound:
                    del self._series[key]
            body = event_body(obj, type_, reason, message, self.identity)
            namespace = body["metadata"]["namespace"]
            created = await self.client.post_event(namespace, body)
            name = str(((created or {}).get("metadata") or {}).get("name") or "")
            if name:
                self._series[key] = Series(namespace, name, int((created or {}).get("count") or 1))
                while len(self._series) > SERIES_LIMIT:
                    self._series.popitem(last=False)
        except ApiError as exc:
            logger.warning("could not record Event %s on %s: %s", reason, key[2], exc)


async def gather_calls(calls: Iterable[Awaitable[None]], concurrency: int) -> None:
    """Await ``calls``, at most ``concurrency`` at a time; an API call that fails after its retries is logged and
    never stops the others."""
    sem = asyncio.Semaphore(concurrency)

    async def guarded(call: Awaitable[None]) -> None:
        async with sem:
            try:
                await call
            except ApiError as exc:
                logger.warning("API call failed after retries: %s", exc)

    await asyncio.gather(*(guarded(call) for call in calls))
