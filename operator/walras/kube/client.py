"""A small asynchronous Kubernetes API client (aiohttp) with retries and backoff, for the operator's writes.

kopf reads (list + watch) through its own client; the operator's writes (pods, bindings, resizes, statuses, Events,
the leader Lease) go through :class:`KubeClient`, which retries 429 and 5xx answers, and 409 Conflicts where a retry
is meaningful, with exponential backoff (honouring ``Retry-After``), and raises the typed errors of
:mod:`walras.kube.errors` (``except NotFound``, ``except Conflict``). Semantics a retry must not break are decided by
the caller: ``create`` treats 409 AlreadyExists as done (pod names are deterministic), ``bind`` reads the pod back
after a 409 so that a pod is never bound twice.

Also here, so that no other module of the operator imports a Kubernetes client library: :meth:`KubeConfig.load`
(the kubeconfig, as kubectl reads it), :func:`probe` (is the API server there) and :func:`read_cluster` (one
listing of the objects the planner reads, for ``walras check``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from walras.kube.errors import (
    AlreadyExists,
    ApiError,
    ConfigError,
    Conflict,
    MethodNotAllowed,
    NotFound,
    ServiceUnavailable,
    TooManyRequests,
    UnsupportedMediaType,
    api_error,
)

logger = logging.getLogger("walras.kube.client")

JSON = dict[str, Any]


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and how to authenticate (from a kubeconfig or the in-cluster service account)."""

    server: str
    token: str | None = None
    ca_path: str | None = None
    cert_path: str | None = None
    key_path: str | None = None
    insecure: bool = False
    namespace: str = "default"

    @classmethod
    def load(cls, kubeconfig: str | None = None, context: str | None = None) -> KubeConfig:
        """Load the configuration as kubectl would: ``kubeconfig`` / ``$KUBECONFIG`` / ``~/.kube/config``, else the
        in-cluster service account; :class:`~walras.kube.errors.ConfigError` when there is neither."""
        from kubernetes import client, config  # only here: the client library is heavy to import

        conf = client.Configuration()
        namespace = "default"
        try:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=conf)
            try:
                _, active = config.list_kube_config_contexts(config_file=kubeconfig)
                namespace = (active or {}).get("context", {}).get("namespace") or "default"
            except config.ConfigException:
                pass
        except (config.ConfigException, FileNotFoundError, TypeError):
            try:
                config.load_incluster_config(client_configuration=conf)
            except config.ConfigException as exc:
                raise ConfigError(str(exc)) from exc
        token = None
        auth = (conf.api_key or {}).get("authorization") or (conf.api_key or {}).get("BearerToken")
        if auth:
            token = auth.split(" ", 1)[1] if auth.lower().startswith("bearer ") else auth
        return cls(server=conf.host.rstrip("/"), token=token, ca_path=conf.ssl_ca_cert, cert_path=conf.cert_file,
                   key_path=conf.key_file, insecure=not conf.verify_ssl, namespace=namespace)

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https"):
            return False
        ctx = ssl.create_default_context(cafile=self.ca_path) if self.ca_path else ssl.create_default_context()
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_path and self.key_path:
            ctx.load_cert_chain(self.cert_path, self.key_path)
        return ctx


@dataclass
class RetryPolicy:
    """Exponential backoff: ``base * 2**attempt`` seconds capped at ``cap``, at most ``attempts`` tries."""

    attempts: int = 8
    base: float = 0.05
    cap: float = 2.0

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        if retry_after:
            try:
                return min(float(retry_after), self.cap)
            except ValueError:
                pass
        return min(self.base * (2**attempt), self.cap)


RETRYABLE = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Eviction:
    """The answer to an eviction: ``evicted`` (the pod is being deleted with its grace period), ``blocked`` (429: a
    PodDisruptionBudget does not allow it now; ``message`` says which) or ``gone`` (no such pod any more)."""

    outcome: Literal["evicted", "blocked", "gone"]
    message: str


class KubeClient:
    """``request`` with retries, and the handful of typed calls the operator makes."""

    def __init__(self, config: KubeConfig, retry: RetryPolicy | None = None) -> None:
        self.config = config
        self.retry = retry or RetryPolicy()
        self._session: aiohttp.ClientSession | None = None
        self.retries = 0  # how many times a request was retried (for tests and logs)
        self._resize_checked: tuple[float, bool] | None = None  # (monotonic time, pods/resize served)

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json", "User-Agent": "walras-operator"}
            if self.config.token:
                headers["Authorization"] = f"Bearer {self.config.token}"
            connector = aiohttp.TCPConnector(ssl=self.config.ssl_context(), limit=32)
            self._session = aiohttp.ClientSession(headers=headers, connector=connector,
                                                  timeout=aiohttp.ClientTimeout(total=30))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def readiness(self, timeout: float = 5.0) -> str | None:
        """One ``GET /livez?verbose`` and one ``GET /readyz?verbose`` (no retry, ``timeout`` seconds each): None when
        the API server says it is live and ready, or answers 4xx (not allowed to ask, or no such endpoint: nothing
        known); else why not: the status and the checks that failed (``/livez 500: [-]etcd failed``: kube-apiserver
        is up but its etcd is not, which ``/version`` does not show; kube-apiserver v1.36's ``/readyz`` does not
        check etcd), or that no answer came."""
        session = await self.session()
        for path in ("/livez?verbose", "/readyz?verbose"):
            try:
                async with session.get(self.config.server + path,
                                       timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                    text = await resp.text()
                    status = resp.status
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                return f"{path}: no answer ({' '.join(str(exc).split()) or type(exc).__name__})"[:300]
            if status >= 500:
                failed = [line.strip() for line in text.splitlines() if line.strip().startswith("[-]")]
                return f"{path.split('?')[0]} {status}: {'; '.join(failed) or text.strip()}"[:300]
        return None

    async def request(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
                      retry_conflict: bool = False, final_reasons: frozenset[str] = frozenset(),
                      attempts: int | None = None, retryable: frozenset[int] | None = None) -> JSON:
        """Send one API request; retry 429/5xx (and 409 when ``retry_conflict``, except a 409 whose reason is in
        ``final_reasons``) with backoff, at most ``attempts`` tries (default: the retry policy's). ``retryable``
        replaces the set of retried status codes (the eviction call leaves 429 out: there it means a
        PodDisruptionBudget refused, an answer, not an overload).

        The answer's JSON body on success; else the :class:`~walras.kube.errors.ApiError` of the last answer (its
        class names the status: :class:`NotFound`, :class:`Conflict`, :class:`AlreadyExists`...). A request that got
        no answer (connection lost, timed out) ends as :class:`ServiceUnavailable` ``ConnectionError``; a 2xx answer
        whose body is not JSON as ``BadGateway`` ``BadResponse``.
        """
        retried = RETRYABLE if retryable is None else retryable
        session = await self.session()
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type} if body is not None else {}
        last: ApiError | None = None
        tries = self.retry.attempts if attempts is None else max(1, attempts)
        for attempt in range(tries):
            retry_after = None
            try:
                async with session.request(method, self.config.server + path, data=data, headers=headers) as resp:
                    text = await resp.text()
                    if resp.status < 300:
                        return json.loads(text) if text else {}
                    last = self._answer_error(resp.status, text)
                    retry_after = resp.headers.get("Retry-After")
                    if isinstance(last, Conflict):
                        if not retry_conflict or last.reason in final_reasons:
                            raise last
                    elif resp.status not in retried:
                        raise last
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:  # no answer, or a body that is not JSON
                last = api_error(exc)
            if attempt + 1 >= tries:
                break
            self.retries += 1
            delay = self.retry.delay(attempt, retry_after)
            logger.info("retrying %s %s after %s (attempt %d, %.2fs)", method, path, last, attempt + 1, delay)
            await asyncio.sleep(delay)
        assert last is not None
        raise last

    @staticmethod
    def _answer_error(code: int, text: str) -> ApiError:
        """The typed error of an answer with HTTP status ``code`` and body ``text`` (a ``metav1.Status``, or any
        text: then the text is the message)."""
        try:
            status = json.loads(text)
        except ValueError:
            status = {"message": text}
        if not isinstance(status, dict):
            status = {"message": text}
        return ApiError(code, str(status.get("reason", "")), str(status.get("message", text)))

    # ------------------------------------------------------------------ typed calls

    @staticmethod
    def pod_path(namespace: str, name: str = "", sub: str = "") -> str:
        path = f"/api/v1/namespaces/{namespace}/pods"
        if name:
            path += f"/{name}"
        if sub:
            path += f"/{sub}"
        return path

    async def get_pod(self, namespace: str, name: str) -> JSON | None:
        try:
            return await self.request("GET", self.pod_path(namespace, name))
        except NotFound:
            return None

    async def create_pod(self, namespace: str, body: Mapping[str, Any]) -> tuple[JSON, bool]:
        """Create a pod; (pod, created). An AlreadyExists answer returns the existing pod with ``created=False``."""
        try:
            result = await self.request("POST", self.pod_path(namespace), body, retry_conflict=True,
                                        final_reasons=frozenset({"AlreadyExists"}))
        except AlreadyExists:
            existing = await self.get_pod(namespace, str(body["metadata"]["name"]))
            if existing is None:
                raise
            return existing, False
        return result, True

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> bool:
        """Bind a pod through ``pods/binding``; True if this call bound it, False if it already was on ``node``.

        A 409 is never retried blindly: the pod is read back; bound elsewhere -> :class:`Conflict`, gone ->
        :class:`NotFound`,
        bound to ``node`` -> False (someone, maybe an earlier attempt of ours, did it), still unbound -> retry.
        """
        body: JSON = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": namespace},
                      "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        if uid:
            body["metadata"]["uid"] = uid
        for attempt in range(self.retry.attempts):
            try:
                await self.request("POST", self.pod_path(namespace, name, "binding"), body)
                return True
            except Conflict:
                pass  # a 409 is answered by reading the pod back (below), never by a blind retry
            pod = await self.get_pod(namespace, name)
            if pod is None:
                raise NotFound(404, "NotFound", f"pod {namespace}/{name} is gone")
            if uid and pod["metadata"].get("uid") != uid:
                raise Conflict(409, "Conflict", f"pod {namespace}/{name} was replaced (uid changed)")
            bound = (pod.get("spec") or {}).get("nodeName")
            if bound == node:
                return False
            if bound:
                raise Conflict(409, "Conflict", f"pod {namespace}/{name} is already bound to {bound}")
            self.retries += 1
            await asyncio.sleep(self.retry.delay(attempt))
        raise Conflict(409, "Conflict", f"binding {namespace}/{name} kept conflicting")

    @staticmethod
    def delete_options(grace: int | None = None, uid: str | None = None) -> JSON | None:
        """A ``DeleteOptions`` body: ``gracePeriodSeconds`` when ``grace`` is set (0 deletes the object at once,
        without waiting for a kubelet to confirm it), a UID precondition when ``uid`` is set (never delete a newer pod
        of the same name); None when neither is."""
        if grace is None and not uid:
            return None
        body: JSON = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace is not None:
            body["gracePeriodSeconds"] = max(0, int(grace))
        if uid:
            body["preconditions"] = {"uid": uid}
        return body

    async def delete_pod(self, namespace: str, name: str, grace: int | None = None, uid: str | None = None) -> bool:
        """Delete a pod (grace period ``grace`` seconds, None: the pod's own ``terminationGracePeriodSeconds``);
        False when it is gone already, or was replaced by a pod of another ``uid`` (409 on the precondition)."""
        try:
            await self.request("DELETE", self.pod_path(namespace, name), self.delete_options(grace, uid),
                               retry_conflict=not uid)
            return True
        except NotFound:
            return False
        except Conflict:
            if uid:
                return False
            raise

    async def evict_pod(self, namespace: str, name: str, grace: int | None = None,
                        uid: str | None = None) -> Eviction:
        """Evict a pod through the Eviction API (``POST pods/{name}/eviction``, a ``policy/v1`` Eviction), so that
        its PodDisruptionBudgets hold; ``grace`` goes into ``deleteOptions.gracePeriodSeconds`` (None: the pod's
        own). A 429 is the API server refusing because a disruption budget would be violated (or, rarely, because
        it is overloaded): returned as ``Eviction("blocked", message)``, never retried here; the next plan asks
        again. 404 -> ``gone``. 5xx are retried as any write."""
        body: JSON = {"apiVersion": "policy/v1", "kind": "Eviction",
                      "metadata": {"name": name, "namespace": namespace}}
        options = self.delete_options(grace, uid)
        if options is not None:
            body["deleteOptions"] = options
        try:
            await self.request("POST", self.pod_path(namespace, name, "eviction"), body,
                               retryable=RETRYABLE - {429})
        except TooManyRequests as exc:
            return Eviction("blocked", exc.message)
        except NotFound as exc:
            return Eviction("gone", exc.message)
        except Conflict as exc:
            if uid:
                return Eviction("gone", exc.message)
            raise
        return Eviction("evicted", "")

    #: How long a discovery answer about ``pods/resize`` is trusted before it is asked again (an API server upgrade
    #: or a feature-gate change turns it on or off without restarting the operator).
    RESIZE_DISCOVERY_TTL = 300.0

    async def supports_pod_resize(self) -> bool:
        """Whether the API server serves the ``pods/resize`` sub-resource (in-place pod resize, Kubernetes >= 1.33).

        Asked through discovery (``GET /api/v1`` lists ``pods/resize`` among the core resources where it is served)
        and cached for :attr:`RESIZE_DISCOVERY_TTL` seconds. A discovery failure counts as "not served" until the
        next check.
        """
        now = time.monotonic()
        checked = self._resize_checked
        if checked is not None and now - checked[0] < self.RESIZE_DISCOVERY_TTL:
            return checked[1]
        try:
            listing = await self.request("GET", "/api/v1")
            served = any(r.get("name") == "pods/resize" for r in listing.get("resources") or [])
        except ApiError as exc:
            logger.warning("discovery of pods/resize failed (%s); treating in-place resize as unsupported", exc)
            served = False
        self._resize_checked = (now, served)
        return served

    async def resize_pod(self, namespace: str, name: str, containers: list[JSON]) -> bool:
        """Patch ``pods/{name}/resize`` where discovery lists it; False where the cluster has no in-place resize
        (not in discovery, or the patch answers 404/405/415, after which discovery is asked again next time)."""
        if not await self.supports_pod_resize():
            return False
        try:
            await self.request("PATCH", self.pod_path(namespace, name, "resize"), {"spec": {"containers": containers}},
                               content_type="application/strategic-merge-patch+json", retry_conflict=True)
            return True
        except (NotFound, MethodNotAllowed, UnsupportedMediaType):
            self._resize_checked = None
            return False

    async def patch_status(self, path: str, patch: Mapping[str, Any]) -> JSON:
        """Merge-patch the ``/status`` sub-resource at ``path`` (the object's path)."""
        return await self.request("PATCH", f"{path}/status", patch, content_type="application/merge-patch+json",
                                  retry_conflict=True)

    async def post_event(self, namespace: str, event: Mapping[str, Any]) -> JSON:
        return await self.request("POST", f"/api/v1/namespaces/{namespace}/events", event, retry_conflict=True)

    async def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON:
        """Merge-patch the Event ``name`` (a repeat of it: its ``count`` and ``lastTimestamp``, as client-go's
        event correlator does); :class:`~walras.kube.errors.NotFound` when it expired."""
        return await self.request("PATCH", f"/api/v1/namespaces/{namespace}/events/{name}", patch,
                                  content_type="application/merge-patch+json")


async def probe(config: KubeConfig, timeout: float = 10.0) -> None:
    """GET ``/version`` once; :class:`~walras.kube.errors.ServiceUnavailable` (reason ``ConnectionError``) when the
    API server does not answer. Any HTTP answer (even 401/403) counts: authorization errors surface in the
    operator's own requests."""
    headers = {"Authorization": f"Bearer {config.token}"} if config.token else {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session, \
                session.get(config.server + "/version", ssl=config.ssl_context(), headers=headers) as resp:
            await resp.read()
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise ServiceUnavailable(503, "ConnectionError", " ".join(str(exc).split()) or type(exc).__name__) from exc


#: The custom resources the planner reads, by plural (``walras check`` lists them).
WALRAS_PLURALS = ("resourcepools", "fungiblejobs", "colocationprofiles")


def read_cluster(kubeconfig: str | None, context: str | None, group: str,
                 version: str) -> tuple[list[JSON], list[JSON], list[list[JSON]]]:
    """One listing (the synchronous ``kubernetes`` client) of the nodes, the pods of every namespace and the custom
    objects of :data:`WALRAS_PLURALS` in ``group``/``version``, as raw JSON objects: ``(nodes, pods, [pools, jobs,
    profiles])``. :class:`~walras.kube.errors.ConfigError` without a usable kubeconfig; the
    :class:`~walras.kube.errors.ApiError` of a listing that fails (:func:`~walras.kube.errors.api_error`)."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    try:
        config.load_kube_config(config_file=kubeconfig, context=context)
    except (ConfigException, OSError, TypeError) as exc:
        raise ConfigError(str(exc)) from exc
    api = client.ApiClient()
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)

    def plain(items: Any) -> list[JSON]:
        return [api.sanitize_for_serialization(item) for item in items]

    try:
        nodes = plain(core.list_node(_request_timeout=30).items)
        pods = plain(core.list_pod_for_all_namespaces(_request_timeout=30).items)
        lists: list[list[JSON]] = []
        for plural in WALRAS_PLURALS:
            found: Any = custom.list_cluster_custom_object(group, version, plural, _request_timeout=30)
            lists.append(list(found["items"]))
    except client.ApiException as exc:
        raise api_error(exc) from exc
    return nodes, pods, lists
