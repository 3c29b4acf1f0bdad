"""A fault-injecting HTTP proxy between a Kubernetes client (the operator, kopf) and an API server, for the tests.

Every request is forwarded to ``upstream`` unless a seeded draw decides otherwise:

* ``conflict`` (rate): a mutating request (POST/PUT/PATCH/DELETE) is answered 409 Conflict without reaching the
  server, as a real API server answers a stale ``resourceVersion`` or a concurrent writer;
* ``throttle``: 429 TooManyRequests with ``Retry-After: 1`` (any request but a watch);
* ``error``: 500 InternalError (any request but a watch);
* ``latency``: the request waits ``latency_s`` (uniform in [0, latency_s]) before it is forwarded;
* ``drop_watch``: a watch stream is cut after a uniform [0, ``watch_life_s``] seconds, as a load balancer or an API
  server restart cuts it.

A real API server makes none of these by itself on demand. The answers carry a ``metav1.Status`` body as the real
server's do. The draws come from ``random.Random(seed)`` in request order, so a run with the same seed and the same
request order injects the same faults. :attr:`FaultProxy.counts` records what was injected and forwarded.

Usable from a test's event loop (``await proxy.start()``) or from a thread (:class:`ProxyThread`).
"""

from __future__ import annotations

import asyncio
import random
import ssl
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "content-length", "content-encoding", "host"}


@dataclass
class FaultRates:
    """Probabilities per request (0..1) of each fault, and the latency / watch-life bounds in seconds."""

    conflict: float = 0.0
    throttle: float = 0.0
    error: float = 0.0
    latency: float = 0.0
    latency_s: float = 0.2
    drop_watch: float = 0.0
    watch_life_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("conflict", "throttle", "error", "latency", "drop_watch"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {value}")


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


@dataclass
class FaultProxy:
    """The proxy: ``await start()`` gives its URL; ``rates`` may be changed while it runs."""

    upstream: str
    rates: FaultRates = field(default_factory=FaultRates)
    upstream_ssl: ssl.SSLContext | None = None  # to trust an HTTPS API server's CA (kube-apiserver)
    seed: int = 0
    host: str = "127.0.0.1"
    port: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    log: list[tuple[str, str, str]] = field(default_factory=list)  # (fault, method, path)
    _rng: random.Random = field(init=False)
    _runner: web.AppRunner | None = None
    _session: aiohttp.ClientSession | None = None

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                                              auto_decompress=False,
                                              connector=aiohttp.TCPConnector(ssl=self.upstream_ssl or False))
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        if self.port == 0 and server is not None:
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def _draw(self, rate: float) -> bool:
        return rate > 0 and self._rng.random() < rate

    def _record(self, fault: str, request: web.Request) -> None:
        self.counts[fault] += 1
        self.log.append((fault, request.method, request.path))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        rates = self.rates
        watch = request.query.get("watch") in ("true", "1")
        # draw every decision up front, in a fixed order, so the sequence depends only on the request order
        conflict = self._draw(rates.conflict) and request.method in MUTATING
        throttle = self._draw(rates.throttle) and not watch
        error = self._draw(rates.error) and not watch
        delay = self._rng.uniform(0, rates.latency_s) if self._draw(rates.latency) else 0.0
        drop_after = self._rng.uniform(0, rates.watch_life_s) if self._draw(rates.drop_watch) and watch else None
        if delay:
            self._record("latency", request)
            await asyncio.sleep(delay)
        if conflict:
            self._record("409", request)
            return web.json_response(status_body(409, "Conflict", "injected conflict: the object has been "
                                                                  "modified; please apply your changes to the latest "
                                                                  "version and try again"), status=409)
        if throttle:
            self._record("429", request)
            return web.json_response(status_body(429, "TooManyRequests", "injected: too many requests"),
                                     status=429, headers={"Retry-After": "1"})
        if error:
            self._record("500", request)
            return web.json_response(status_body(500, "InternalError", "injected internal error"), status=500)
        self.counts["forwarded"] += 1
        return await self._forward(request, drop_after)

    async def _forward(self, request: web.Request, drop_after: float | None) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        body = await request.read()
        try:
            upstream = await self._session.request(request.method, self.upstream + request.path_qs,
                                                   headers=headers, data=body or None, allow_redirects=False)
        except aiohttp.ClientError as exc:
            return web.json_response(status_body(503, "ServiceUnavailable", f"proxy: upstream: {exc}"), status=503)
        async with upstream:
            # the body is relayed as received (auto_decompress=False): its Content-Encoding goes with it (a gzip
            # list of kube-apiserver relayed without the header broke kopf's watcher: "can't decode byte 0x8b")
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items()
                if k.lower() not in HOP_BY_HOP or k.lower() == "content-encoding"})
            await response.prepare(request)
            loop = asyncio.get_running_loop()
            deadline = None if drop_after is None else loop.time() + drop_after
            try:
                while True:
                    timeout = None if deadline is None else max(0.0, deadline - loop.time())
                    try:
                        chunk = await asyncio.wait_for(upstream.content.readany(), timeout)
                    except TimeoutError:
                        self._record("watch-dropped", request)
                        # cut the connection mid-stream, as a lost TCP connection does
                        if request.transport is not None:
                            request.transport.close()
                        return response
                    if not chunk:
                        break
                    await response.write(chunk)
            except (aiohttp.ClientError, ConnectionResetError):
                if request.transport is not None:
                    request.transport.close()
                return response
            await response.write_eof()
            return response


class ProxyThread:
    """A :class:`FaultProxy` on its own event loop in a daemon thread (for synchronous tests and subprocesses)."""

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self._loop).result(10)
        return self.proxy

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
