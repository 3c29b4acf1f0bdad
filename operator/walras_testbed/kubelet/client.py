"""The kubelet stand-in's API access: a kubeconfig reader and a small aiohttp client (requests and watch streams).

Only what the stand-in needs: bearer tokens, client certificates and CAs given as files or inline ``*-data``
(written to a private temporary folder), ``insecure-skip-tls-verify``, plain-HTTP servers (the emulated API).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

JSON = dict[str, Any]


@dataclass(frozen=True)
class ApiConfig:
    """Where the API server is and how to authenticate."""

    server: str
    token: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False

    @classmethod
    def from_kubeconfig(cls, path: str | os.PathLike[str], context: str | None = None) -> ApiConfig:
        """Read the current (or named) context of a kubeconfig file."""
        doc = yaml.safe_load(Path(path).read_text()) or {}
        name = context or doc.get("current-context")
        ctx = next((c["context"] for c in doc.get("contexts") or [] if c.get("name") == name), None)
        if ctx is None:
            raise ValueError(f"{path}: no context {name!r}")
        cluster = next(c["cluster"] for c in doc.get("clusters") or [] if c.get("name") == ctx["cluster"])
        user = next((u.get("user") or {} for u in doc.get("users") or [] if u.get("name") == ctx.get("user")), {})
        base = Path(path).resolve().parent

        def file_of(entry: dict[str, Any], key: str) -> str | None:
            if entry.get(f"{key}-data"):
                folder = Path(tempfile.mkdtemp(prefix="walras-kubelet-"))
                target = folder / key
                target.write_bytes(base64.b64decode(entry[f"{key}-data"]))
                target.chmod(0o600)
                return str(target)
            if entry.get(key):
                return str(base / entry[key])
            return None

        return cls(server=str(cluster["server"]).rstrip("/"), token=user.get("token"),
                   ca_file=file_of(cluster, "certificate-authority"),
                   cert_file=file_of(user, "client-certificate"), key_file=file_of(user, "client-key"),
                   insecure=bool(cluster.get("insecure-skip-tls-verify")))

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https"):
            return False
        ctx = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else ssl.create_default_context()
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_file and self.key_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


class ApiClient:
    """``request`` returns ``(status, body)``; ``call`` raises :class:`ApiError` on a non-2xx answer."""

    def __init__(self, config: ApiConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json", "User-Agent": "walras-kubelet-standin"}
            if self.config.token:
                headers["Authorization"] = f"Bearer {self.config.token}"
            self._session = aiohttp.ClientSession(
                headers=headers, connector=aiohttp.TCPConnector(ssl=self.config.ssl_context()))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(self, method: str, path: str, body: Any = None,
                      content_type: str = "application/json", params: dict[str, str] | None = None,
                      ) -> tuple[int, Any]:
        session = await self.session()
        data = None if body is None else json.dumps(body)
        async with session.request(method, self.config.server + path, data=data, params=params,
                                   headers={"Content-Type": content_type},
                                   timeout=aiohttp.ClientTimeout(total=30)) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text) if text else None
            except ValueError:
                return resp.status, text

    async def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                   params: dict[str, str] | None = None) -> Any:
        status, out = await self.request(method, path, body, content_type, params)
        if status >= 300:
            raise ApiError(status, out)
        return out

    async def watch(self, path: str, resource_version: str, params: dict[str, str] | None = None,
                    timeout_seconds: int = 300) -> AsyncIterator[JSON]:
        """The events of one watch request (ends when the server closes it); an ``ERROR`` event is yielded as is."""
        session = await self.session()
        query = {"watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
                 "timeoutSeconds": str(timeout_seconds), **(params or {})}
        async with session.get(self.config.server + path, params=query,
                               timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_seconds + 30)) as resp:
            if resp.status != 200:
                raise ApiError(resp.status, await resp.text())
            async for line in resp.content:
                if line.strip():
                    yield json.loads(line)
