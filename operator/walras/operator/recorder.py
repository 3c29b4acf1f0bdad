"""Posting Events for the operator (:class:`Recorder`) and running its API calls side by side (:func:`gather_calls`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from walras.kube.client import KubeClient
from walras.kube.encode import event_body
from walras.kube.errors import ApiError

logger = logging.getLogger("walras.operator")


@dataclass
class Recorder:
    """Posts core/v1 Events about objects, as ``identity`` (the reporting instance)."""

    client: KubeClient
    identity: str

    async def event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Post an Event about ``obj``; failing to record one never fails the action it describes."""
        body = event_body(obj, type_, reason, message, self.identity)
        try:
            await self.client.post_event(body["metadata"]["namespace"], body)
        except ApiError as exc:
            logger.warning("could not record Event %s on %s: %s", reason, body["involvedObject"]["name"], exc)


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
