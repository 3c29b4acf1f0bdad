"""Typed Kubernetes API errors, in the spirit of kopf's (``kopf._cogs.clients.errors``).

Every answer of the API server that is not a success reaches the operator as one :class:`ApiError`, of the class its
HTTP status (and, for a 409, its ``reason``) names: callers write ``except NotFound`` instead of testing a code. The
classes:

* :class:`ClientError` (4xx): :class:`BadRequest` 400, :class:`Unauthorized` 401, :class:`Forbidden` 403,
  :class:`NotFound` 404, :class:`MethodNotAllowed` 405, :class:`Conflict` 409 (with :class:`AlreadyExists`, the
  409 whose reason is ``AlreadyExists``), :class:`Gone` 410, :class:`UnsupportedMediaType` 415,
  :class:`UnprocessableEntity` 422, :class:`TooManyRequests` 429;
* :class:`ServerError` (5xx): :class:`InternalError` 500, :class:`BadGateway` 502, :class:`ServiceUnavailable` 503
  (also a connection that failed: reason ``ConnectionError``), :class:`GatewayTimeout` 504.

``ApiError(code, reason, message)`` builds the instance of the class that ``code`` and ``reason`` name (so a
``ApiError(404, ...)`` *is* a :class:`NotFound`); :func:`api_error` maps the exceptions of the client libraries
(aiohttp, kopf, the ``kubernetes`` client) into the hierarchy.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar


class ApiError(Exception):
    """An API answer that is not a success (after retries): HTTP ``code``, Kubernetes ``reason`` and ``message``.

    Constructing :class:`ApiError` itself returns an instance of the most specific class for ``code`` and
    ``reason`` (:func:`error_class`); a subclass constructed directly is that subclass."""

    #: The HTTP status this class stands for (0: any).
    status_code: ClassVar[int] = 0

    def __new__(cls, code: int, reason: str = "", message: str = "") -> ApiError:
        chosen = error_class(code, reason) if cls is ApiError else cls
        return super().__new__(chosen)

    def __init__(self, code: int, reason: str = "", message: str = "") -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.code, self.reason, self.message))


class ClientError(ApiError):
    """A 4xx answer: the request was refused as it stands."""


class BadRequest(ClientError):
    status_code = 400


class Unauthorized(ClientError):
    status_code = 401


class Forbidden(ClientError):
    status_code = 403


class NotFound(ClientError):
    status_code = 404


class MethodNotAllowed(ClientError):
    status_code = 405


class Conflict(ClientError):
    """409: a precondition (resourceVersion, uid) failed, the object changed meanwhile, or it exists already."""

    status_code = 409


class AlreadyExists(Conflict):
    """409 with reason ``AlreadyExists``: a create of an object whose name is taken."""


class Gone(ClientError):
    """410: a watch's or a list's resourceVersion is too old."""

    status_code = 410


class UnsupportedMediaType(ClientError):
    status_code = 415


class UnprocessableEntity(ClientError):
    """422: the object does not validate (schema, immutable field, a failed JSON-patch ``test``)."""

    status_code = 422


class TooManyRequests(ClientError):
    """429: overloaded (priority and fairness) or, from the Eviction API, a PodDisruptionBudget that refuses."""

    status_code = 429


class ServerError(ApiError):
    """A 5xx answer (or no answer at all): worth retrying."""


class InternalError(ServerError):
    status_code = 500


class BadGateway(ServerError):
    status_code = 502


class ServiceUnavailable(ServerError):
    status_code = 503


class GatewayTimeout(ServerError):
    status_code = 504


_BY_CODE: dict[int, type[ApiError]] = {
    cls.status_code: cls
    for cls in (BadRequest, Unauthorized, Forbidden, NotFound, MethodNotAllowed, Conflict, Gone,
                UnsupportedMediaType, UnprocessableEntity, TooManyRequests, InternalError, BadGateway,
                ServiceUnavailable, GatewayTimeout)
}


def error_class(code: int, reason: str = "") -> type[ApiError]:
    """The class of an answer with HTTP status ``code`` and Kubernetes ``reason``: the class of that code, else
    :class:`ClientError` for another 4xx, :class:`ServerError` for another 5xx, :class:`ApiError` otherwise; a 409
    whose reason is ``AlreadyExists`` is :class:`AlreadyExists`."""
    if code == 409 and reason == "AlreadyExists":
        return AlreadyExists
    found = _BY_CODE.get(code)
    if found is not None:
        return found
    if 400 <= code < 500:
        return ClientError
    if 500 <= code < 600:
        return ServerError
    return ApiError


def _status_body(body: Any) -> dict[str, Any]:
    """A ``metav1.Status`` body (JSON text, bytes or already decoded) as a dict; ``{}`` when it is not one."""
    if isinstance(body, bytes | bytearray):
        body = body.decode(errors="replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return {"message": body} if body else {}
    return body if isinstance(body, dict) else {}


def api_error(exc: BaseException) -> ApiError:
    """The :class:`ApiError` of an exception raised by a Kubernetes client library:

    * an :class:`ApiError` is returned as it is;
    * kopf's ``APIError`` (``status``, the ``metav1.Status`` payload in ``args[1]``) and the ``kubernetes``
      client's ``ApiException`` (``status``, ``reason``, ``body``) -> the class of their status and the Status'
      reason and message;
    * aiohttp's ``ClientResponseError`` (``status``, ``message``) -> the class of its status;
    * any other ``aiohttp.ClientError``, an ``OSError`` or a ``TimeoutError`` (no answer) ->
      :class:`ServiceUnavailable` with reason ``ConnectionError``;
    * a ``ValueError`` (an answer whose body is not JSON) -> :class:`BadGateway` with reason ``BadResponse``.

    Anything else is not an API error: ``TypeError``.
    """
    import aiohttp  # the operator's HTTP client; already loaded wherever an API call could have raised

    if isinstance(exc, ApiError):
        return exc
    status = getattr(exc, "status", None)
    if isinstance(status, int) and not isinstance(status, bool):
        payload: dict[str, Any] = {}
        if len(getattr(exc, "args", ())) > 1 and isinstance(exc.args[1], dict):  # kopf.APIError(message, payload)
            payload = exc.args[1]
        elif hasattr(exc, "body"):  # kubernetes.client.ApiException
            payload = _status_body(exc.body)
        reason = str(payload.get("reason") or getattr(exc, "reason", "") or "")
        message = str(payload.get("message") or getattr(exc, "message", "") or str(exc))
        return ApiError(status, reason, message)
    if isinstance(exc, aiohttp.ClientError | OSError | TimeoutError):
        return ServiceUnavailable(503, "ConnectionError", str(exc) or type(exc).__name__)
    if isinstance(exc, ValueError):
        return BadGateway(502, "BadResponse", f"the answer is not JSON: {exc}")
    raise TypeError(f"not an API error: {exc!r}")


class ConfigError(Exception):
    """No usable cluster connection: no kubeconfig (or a malformed one) and not inside a cluster."""
