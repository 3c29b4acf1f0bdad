"""walras.kube.errors: each HTTP status maps to its class (through the constructor, through the client's answers
and from each client library's exceptions), and the typed calls turn the classes into their outcomes."""

from __future__ import annotations

import asyncio
import json
import pickle
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from walras.kube import errors
from walras.kube.client import KubeClient, KubeConfig, RetryPolicy
from walras.kube.errors import (
    AlreadyExists,
    ApiError,
    BadGateway,
    ClientError,
    Conflict,
    Forbidden,
    Gone,
    NotFound,
    ServerError,
    ServiceUnavailable,
    TooManyRequests,
    UnprocessableEntity,
    api_error,
    error_class,
)

CLASSES: dict[int, type[ApiError]] = {
    400: errors.BadRequest, 401: errors.Unauthorized, 403: Forbidden, 404: NotFound, 405: errors.MethodNotAllowed,
    409: Conflict, 410: Gone, 415: errors.UnsupportedMediaType, 422: UnprocessableEntity, 429: TooManyRequests,
    500: errors.InternalError, 502: BadGateway, 503: ServiceUnavailable, 504: errors.GatewayTimeout,
}


@pytest.mark.parametrize("code", sorted(CLASSES))
def test_each_code_constructs_its_class(code: int) -> None:
    exc = ApiError(code, "Reason", "message")
    assert type(exc) is CLASSES[code] and error_class(code) is CLASSES[code]
    assert (exc.code, exc.reason, exc.message) == (code, "Reason", "message")
    assert str(exc) == f"{code} Reason: message"
    assert isinstance(exc, ClientError if code < 500 else ServerError)
    assert not isinstance(exc, ServerError if code < 500 else ClientError)
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is CLASSES[code] and again.message == "message"


def test_codes_without_a_class_and_already_exists() -> None:
    assert type(ApiError(409, "AlreadyExists", "")) is AlreadyExists
    assert isinstance(ApiError(409, "AlreadyExists", ""), Conflict)
    assert type(ApiError(409, "Conflict", "")) is Conflict
    assert type(ApiError(418, "", "")) is ClientError
    assert type(ApiError(599, "", "")) is ServerError
    assert type(ApiError(302, "", "")) is ApiError
    assert type(NotFound(404, "NotFound", "x")) is NotFound  # a subclass constructed directly is that subclass


@pytest.mark.parametrize("code", sorted(CLASSES))
def test_api_error_maps_each_library_exception(code: int) -> None:
    from kopf._cogs.clients.errors import APIError as KopfError
    from kubernetes.client import ApiException

    status = {"kind": "Status", "code": code, "reason": "Because", "message": f"answer {code}"}
    kopf_exc = KopfError(status, status=code, headers={})  # type: ignore[arg-type]
    kube_exc = ApiException(status=code, reason="HTTP reason")
    kube_exc.body = json.dumps(status)
    aio_exc = aiohttp.ClientResponseError(None, (), status=code, message="aiohttp says")  # type: ignore[arg-type]
    for exc, reason, message in ((kopf_exc, "Because", f"answer {code}"), (kube_exc, "Because", f"answer {code}"),
                                 (aio_exc, "", "aiohttp says")):
        mapped = api_error(exc)
        assert type(mapped) is CLASSES[code], exc
        assert (mapped.code, mapped.reason, mapped.message) == (code, reason, message)
    plain = ApiException(status=code, reason="Plain")  # no Status body: the HTTP reason
    assert type(api_error(plain)) is CLASSES[code] and api_error(plain).reason == "Plain"


def test_api_error_maps_no_answer_and_refuses_what_is_not_an_api_error() -> None:
    same = NotFound(404, "NotFound", "x")
    assert api_error(same) is same
    for exc in (aiohttp.ClientConnectionError("reset"), TimeoutError(), ConnectionRefusedError("refused")):
        mapped = api_error(exc)
        assert type(mapped) is ServiceUnavailable and mapped.reason == "ConnectionError"
    bad = api_error(ValueError("Expecting value"))
    assert type(bad) is BadGateway and bad.reason == "BadResponse"
    with pytest.raises(TypeError):
        api_error(KeyError("x"))


async def _serve(answers: list[tuple[int, Any]]) -> tuple[web.AppRunner, KubeClient]:
    async def handle(request: web.Request) -> web.Response:
        code, body = answers.pop(0)
        return web.Response(status=code, text=body if isinstance(body, str) else json.dumps(body),
                            content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, KubeClient(KubeConfig(server=f"http://127.0.0.1:{port}"), RetryPolicy(attempts=3, base=0.001))


def test_the_client_raises_the_class_of_each_answer() -> None:
    async def run() -> None:
        answers: list[tuple[int, Any]] = []
        runner, client = await _serve(answers)
        try:
            for code, cls in CLASSES.items():
                answers[:] = [(code, {"kind": "Status", "reason": f"R{code}", "message": f"m{code}"})] * 3
                with pytest.raises(cls) as raised:
                    await client.request("GET", "/x", attempts=1)
                assert (raised.value.code, raised.value.reason, raised.value.message) == (code, f"R{code}", f"m{code}")
            answers[:] = [(404, "not json")]
            with pytest.raises(NotFound, match="not json"):
                await client.request("GET", "/x")
            answers[:] = [(200, "not json")] * 3
            with pytest.raises(BadGateway):
                await client.request("GET", "/x")
            # a 409 is retried only with retry_conflict, and never one whose reason is final
            answers[:] = [(409, {"reason": "Conflict"}), (200, {"ok": True})]
            assert await client.request("PATCH", "/x", {}, retry_conflict=True) == {"ok": True}
            answers[:] = [(409, {"reason": "AlreadyExists"}), (200, {"ok": True})]
            with pytest.raises(AlreadyExists):
                await client.request("POST", "/x", {}, retry_conflict=True, final_reasons=frozenset({"AlreadyExists"}))
            answers[:] = [(409, {"reason": "Conflict"})]
            with pytest.raises(Conflict):
                await client.request("PATCH", "/x", {})
            # the typed calls' outcomes
            answers[:] = [(404, {"reason": "NotFound"})]
            assert await client.get_pod("ns", "p") is None
            answers[:] = [(404, {"reason": "NotFound"})]
            assert await client.delete_pod("ns", "p") is False
            answers[:] = [(409, {"reason": "Conflict"})]
            assert await client.delete_pod("ns", "p", uid="u") is False
            answers[:] = [(429, {"reason": "TooManyRequests", "message": "budget"})]
            assert (await client.evict_pod("ns", "p")).outcome == "blocked"
            answers[:] = [(404, {"reason": "NotFound", "message": "gone"})]
            assert (await client.evict_pod("ns", "p")).outcome == "gone"
            answers[:] = [(403, {"reason": "Forbidden"})]
            with pytest.raises(Forbidden):
                await client.evict_pod("ns", "p")
            answers[:] = [(409, {"reason": "AlreadyExists"}), (200, {"metadata": {"name": "p", "uid": "old"}})]
            pod, created = await client.create_pod("ns", {"metadata": {"name": "p"}})
            assert not created and pod["metadata"]["uid"] == "old"
            answers[:] = [(409, {"reason": "Conflict"}), (200, {"metadata": {"uid": "u"}, "spec": {"nodeName": "n2"}})]
            with pytest.raises(Conflict, match="already bound to n2"):
                await client.bind("ns", "p", "u", "n1")
            answers[:] = [(409, {"reason": "Conflict"}), (404, {"reason": "NotFound"})]
            with pytest.raises(NotFound, match="gone"):
                await client.bind("ns", "p", "u", "n1")
        finally:
            await client.close()
            await runner.cleanup()

    asyncio.run(run())
