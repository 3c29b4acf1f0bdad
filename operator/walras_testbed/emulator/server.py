"""HTTP front of the emulated Kubernetes API (aiohttp): discovery, CRUD, watch, patches, sub-resources, faults.

This is an *emulator* for ``walras demo`` and the tests, never a real cluster: one process, no authentication, no
admission, no scheduler, a minimal "kubelet" that marks bound pods Running. It speaks enough of the API for
``kubectl create/apply/patch/delete/get -o json --validate=false`` (kubectl 1.35) and for kopf (list + watch with
``resourceVersion``, merge patches, status sub-resource, Events, peering objects).

Besides the Kubernetes paths it serves a small control surface under ``/_emulator/`` for tests: inject faults
(``POST /_emulator/faults``), read the log of accepted bindings (``GET /_emulator/bindings``), turn the kubelet stand-in
(``POST /_emulator/kubelet``) or in-place pod resize (``POST /_emulator/resize`` ``{"enabled": false}``) off and on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from walras_testbed.emulator.selectors import FieldSelector, LabelSelector, SelectorError
from walras_testbed.emulator.store import ApiError, Fault, ResourceType, Store

JSON_TYPE = "application/json"
K8S_VERSION = {"major": "1", "minor": "35", "gitVersion": "v1.35.0-walras-emulator", "platform": "linux/amd64",
               "goVersion": "go1.25", "compiler": "gc", "buildDate": "2026-01-01T00:00:00Z", "gitCommit": "emulator",
               "gitTreeState": "clean"}


def _dump(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(body, separators=(",", ":")).encode(), status=status,
                        content_type=JSON_TYPE)


def _error(exc: ApiError) -> web.Response:
    return _dump(exc.status(), exc.code)


class EmulatorApp:
    """The aiohttp application over a :class:`Store`."""

    def __init__(self, store: Store | None = None) -> None:
        self.store = store or Store()
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self.app.router.add_route("*", "/{tail:.*}", self.dispatch)
        self.requests = 0

    # ------------------------------------------------------------------ discovery

    def _api_versions(self, request: web.Request) -> JSON_DICT:
        return {"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}]}

    def _group(self, group: str, versions: list[str]) -> JSON_DICT:
        return {"name": group,
                "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]}}

    def _resource_list(self, group: str, version: str) -> JSON_DICT:
        types = [t for t in self.store.types.values() if t.group == group and t.version == version]
        if not types:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource {group}/{version}")
        resources = [entry for t in sorted(types, key=lambda t: t.plural) for entry in t.discovery()]
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version, "resources": resources}

    # ------------------------------------------------------------------ dispatch

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        path = request.path.rstrip("/") or "/"
        try:
            if path.startswith("/_emulator/"):
                return await self._control(request, path)
            if path in ("/healthz", "/readyz", "/livez"):
                return web.Response(text="ok")
            if path == "/version":
                return _dump(K8S_VERSION)
            if path == "/api":
                return _dump(self._api_versions(request))
            if path == "/apis":
                groups = self.store.groups()
                return _dump({"kind": "APIGroupList", "apiVersion": "v1",
                              "groups": [self._group(g, v) for g, v in sorted(groups.items()) if g]})
            parts = path.strip("/").split("/")
            if parts[0] == "api" and len(parts) >= 2:
                group, version, rest = "", parts[1], parts[2:]
            elif parts[0] == "apis" and len(parts) == 2:
                versions = self.store.groups().get(parts[1])
                if not versions:
                    raise ApiError(404, "NotFound", f"the server could not find the group {parts[1]}")
                return _dump({"kind": "APIGroup", "apiVersion": "v1", **self._group(parts[1], versions)})
            elif parts[0] == "apis" and len(parts) >= 3:
                group, version, rest = parts[1], parts[2], parts[3:]
            else:
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
            if not rest:
                if request.method != "GET":
                    raise ApiError(405, "MethodNotAllowed", f"{request.method} is not allowed on discovery")
                return _dump(self._resource_list(group, version))
            return await self._resource(request, group, version, rest)
        except ApiError as exc:
            return _error(exc)
        except SelectorError as exc:
            return _error(ApiError(400, "BadRequest", str(exc)))

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            raise ApiError(400, "BadRequest", "the request body is empty")
        try:
            if "yaml" in (request.content_type or ""):
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as exc:
            raise ApiError(400, "BadRequest", f"the request body is not valid JSON/YAML: {exc}") from exc

    async def _resource(self, request: web.Request, group: str, version: str, rest: list[str]) -> web.StreamResponse:
        namespace = ""
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else ""), (rest[2] if len(rest) > 2 else "")
        if len(rest) > 3:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({request.path})")
        rtype = self.store.find(group, version, plural)
        if namespace and not rtype.namespaced:
            raise ApiError(404, "NotFound", f"{plural} is cluster-scoped; it has no namespaced path")
        if sub and sub not in rtype.subresources:
            raise ApiError(404, "NotFound", f"{plural} has no sub-resource {sub!r}")
        method = request.method
        q = request.query
        if method == "GET" and not name:
            watching = q.get("watch", "").lower() in ("true", "1")
            self.store.check_fault("watch" if watching else "list", plural, "", "")
            labels = LabelSelector.parse(q["labelSelector"]) if q.get("labelSelector") else None
            fields = FieldSelector.parse(q["fieldSelector"]) if q.get("fieldSelector") else None
            if watching:
                return await self._watch(request, rtype, namespace, labels, fields)
            items = self.store.list(rtype, namespace or None, labels, fields)
            return _dump({"kind": rtype.list_kind, "apiVersion": rtype.api_version,
                          "metadata": {"resourceVersion": str(self.store.rv)}, "items": items})
        verb = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
        if verb is None:
            raise ApiError(405, "MethodNotAllowed", f"method {method} is not allowed")
        self.store.check_fault(verb, plural, sub, name)
        if method == "GET":
            return _dump(self.store.get(rtype, namespace, name))
        if method == "POST":
            body = await self._body(request)
            if sub == "binding":
                return _dump(self.store.bind(namespace, name, body), 201)
            if sub == "eviction":
                return _dump(self.store.evict(namespace, name, body), 201)
            if name:
                raise ApiError(405, "MethodNotAllowed", "POST goes to the collection, not to a named object")
            if q.get("dryRun"):
                return _dump(body, 201)
            return _dump(self.store.create(rtype, namespace, body), 201)
        if method == "PUT":
            body = await self._body(request)
            if not isinstance(body, Mapping):
                raise ApiError(400, "BadRequest", "PUT needs an object body")
            return _dump(self.store.replace(rtype, namespace, name, body, sub))
        if method == "PATCH":
            body = await self._body(request)
            content_type = request.headers.get("Content-Type", "")
            if "apply-patch" in content_type:
                try:
                    self.store.get(rtype, namespace, name)
                except ApiError:
                    return _dump(self.store.create(rtype, namespace, body), 201)
            return _dump(self.store.patch(rtype, namespace, name, body, content_type, sub))
        if not name:  # DELETE collection
            labels = LabelSelector.parse(q["labelSelector"]) if q.get("labelSelector") else None
            for obj in self.store.list(rtype, namespace or None, labels):
                self.store.delete(rtype, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            return _dump({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
        gone = self.store.delete(rtype, namespace, name)
        if rtype.delete_answers_status and not gone["metadata"].get("deletionTimestamp"):
            return _dump({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                          "details": {"name": name, "group": rtype.group, "kind": rtype.plural,
                                      "uid": gone["metadata"].get("uid")}})
        return _dump(gone)

    async def _watch(self, request: web.Request, rtype: ResourceType, namespace: str,
                     labels: LabelSelector | None, fields: FieldSelector | None) -> web.StreamResponse:
        q = request.query
        since = q.get("resourceVersion", "")
        timeout = float(q.get("timeoutSeconds") or 1800)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self.store.watchers[rtype.key].append(queue)

        def wanted(obj: Mapping[str, Any]) -> bool:
            if namespace and obj["metadata"].get("namespace") != namespace:
                return False
            return (labels is None or labels.matches(obj)) and (fields is None or fields.matches(obj))

        response = web.StreamResponse(status=200, headers={"Content-Type": JSON_TYPE})
        response.enable_chunked_encoding()
        try:
            if since in ("", "0"):
                initial = [("ADDED", o) for o in self.store.list(rtype, namespace or None, labels, fields)]
            else:
                try:
                    initial = [(e.type, e.obj) for e in self.store.history_since(rtype, int(since))]
                except ValueError as exc:
                    raise ApiError(400, "BadRequest", f"resourceVersion {since!r} is not a number") from exc
            await response.prepare(request)
            for kind, obj in initial:
                if wanted(obj):
                    await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")
            deadline = time.monotonic() + timeout
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    event = await asyncio.wait_for(queue.get(), remaining)
                except TimeoutError:
                    break
                if event is None:
                    break
                if wanted(event.obj):
                    await response.write(json.dumps({"type": event.type, "object": event.obj}).encode() + b"\n")
        except ApiError as exc:
            if not response.prepared:
                return _error(exc)
            await response.write(json.dumps({"type": "ERROR", "object": exc.status()}).encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(ValueError):
                self.store.watchers.get(rtype.key, []).remove(queue)
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await response.write_eof()
        return response

    # ------------------------------------------------------------------ control surface (tests only)

    async def _control(self, request: web.Request, path: str) -> web.Response:
        if path == "/_emulator/faults":
            if request.method == "POST":
                body = await self._body(request)
                items = body if isinstance(body, list) else [body]
                for item in items:
                    try:
                        self.store.faults.append(Fault(
                            verb=str(item["verb"]), resource=str(item["resource"]), code=int(item["code"]),
                            count=int(item.get("count", 1)), subresource=str(item.get("subresource", "")),
                            name=str(item.get("name", ""))))
                    except (KeyError, TypeError, ValueError) as exc:
                        raise ApiError(400, "BadRequest", f"a fault needs verb, resource and code: {exc}") from exc
            elif request.method == "DELETE":
                self.store.faults.clear()
            return _dump({"faults": [f.__dict__ for f in self.store.faults]})
        if path == "/_emulator/bindings":
            return _dump({"bindings": self.store.bindings})
        if path == "/_emulator/kubelet" and request.method == "POST":
            body = await self._body(request)
            self.store.kubelet = bool(body.get("enabled", True))
            return _dump({"kubelet": self.store.kubelet})
        if path == "/_emulator/resize":
            if request.method == "POST":
                body = await self._body(request)
                self.store.set_in_place_resize(bool(body.get("enabled", True)))
            return _dump({"inPlaceResize": self.store.in_place_resize})
        raise ApiError(404, "NotFound", f"no emulator control path {path}")


JSON_DICT = dict[str, Any]


class Emulator:
    """Runs the emulated API on loopback inside the current asyncio loop (``await start()`` / ``await stop()``)."""

    def __init__(self, store: Store | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.api = EmulatorApp(store)
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    @property
    def store(self) -> Store:
        return self.api.store

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        self._runner = web.AppRunner(self.api.app, access_log=None, handler_cancellation=True,
                                     shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        if self.port == 0 and server is not None:
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self.url

    async def stop(self) -> None:
        for key in list(self.store.watchers):
            for queue in list(self.store.watchers[key]):
                queue.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        """Write a kubeconfig that points kubectl, kopf and the kubernetes client at this emulator."""
        return write_kubeconfig(path, self.url, namespace)


def write_kubeconfig(path: str | Path, url: str, namespace: str = "default") -> Path:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "walras-emulator",
        "clusters": [{"name": "walras-emulator", "cluster": {"server": url}}],
        "users": [{"name": "walras-emulator", "user": {"token": "emulator"}}],
        "contexts": [{"name": "walras-emulator",
                      "context": {"cluster": "walras-emulator", "user": "walras-emulator", "namespace": namespace}}],
    }
    target = Path(path)
    target.write_text(yaml.safe_dump(config))
    return target


class EmulatorThread:
    """Runs an :class:`Emulator` in a background thread with its own loop (for synchronous tests)."""

    def __init__(self, port: int = 0) -> None:
        self.emulator = Emulator(port=port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="walras-emulator", daemon=True)

    def __enter__(self) -> Emulator:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.emulator.start(), self._loop).result(10)
        return self.emulator

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.emulator.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the emulator's loop (the store is not thread-safe) and return its result."""
        async def runner() -> Any:
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(runner(), self._loop).result(10)
