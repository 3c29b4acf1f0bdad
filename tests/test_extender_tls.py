"""The extender served over TLS the way ``walras run --extender-tls-cert/--extender-tls-key`` serves it.

A self-signed certificate for ``localhost`` is made with the real ``openssl`` binary; the extender app runs behind
:class:`walras.cli.run.Servers` with the context of :func:`walras.cli.run.extender_tls`, and a client that trusts
the certificate (as kube-scheduler does through ``tlsConfig.caData``) posts a kube-scheduler-shaped ``filter``
request over HTTPS. A client that does not trust it is refused, and plain HTTP to the TLS port gets no answer.
Under ``CI=true`` a missing ``openssl`` fails the test (:func:`realtools.require`).
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
from pathlib import Path

import aiohttp
import pytest
from realtools import require
from walras.cli.run import Servers, extender_tls
from walras.extender import Extender
from walras.planner.model import Plan, PodPlan

FIXTURE = Path(__file__).resolve().parents[1] / "e2e" / "fixtures" / "extender" / "filter_nodenames.json"


def _certificate(tmp: Path) -> tuple[str, str]:
    cert, key = tmp / "tls.crt", tmp / "tls.key"
    subprocess.run(
        [require("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return str(cert), str(key)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _plan() -> Plan:
    return Plan(pods=[PodPlan("ml", "resnet-0", "resnet", "v100", "gpu-v100-1", action="create")])


def test_tls_options_go_together(tmp_path: Path) -> None:
    assert extender_tls(None, None) is None
    with pytest.raises(ValueError, match="go together"):
        extender_tls(str(tmp_path / "tls.crt"), None)


def test_extender_answers_over_https_only_to_clients_that_trust_it(tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path)
    server_ctx = extender_tls(cert, key)
    assert server_ctx is not None
    port = _free_port()
    body = json.loads(FIXTURE.read_text())

    async def scenario() -> None:
        servers = await Servers.start([(Extender(_plan).app(), "127.0.0.1", port, server_ctx)])
        try:
            trusting = ssl.create_default_context(cafile=cert)
            async with aiohttp.ClientSession() as session:
                async with session.post(f"https://localhost:{port}/scheduler/filter", json=body,
                                        ssl=trusting) as resp:
                    assert resp.status == 200
                    result = await resp.json()
                assert result["nodenames"] == ["gpu-v100-1"]
                with pytest.raises(aiohttp.ClientConnectorCertificateError):
                    await session.post(f"https://localhost:{port}/scheduler/filter", json=body,
                                       ssl=ssl.create_default_context())
                with pytest.raises((aiohttp.ClientError, asyncio.TimeoutError)):
                    async with session.post(f"http://127.0.0.1:{port}/scheduler/filter", json=body,
                                            timeout=aiohttp.ClientTimeout(total=5)) as plain:
                        await plain.read()
        finally:
            await servers.stop()

    asyncio.run(scenario())


def _run(*args: str, cwd: Path) -> None:
    subprocess.run([require("openssl"), *args], check=True, capture_output=True, cwd=cwd)


def _mutual_tls_files(tmp: Path) -> dict[str, str]:
    """A CA, a server certificate for localhost and a client certificate (as kube-scheduler's tlsConfig.certFile),
    both signed by the CA, and a client certificate signed by another CA."""
    for ca in ("ca", "other-ca"):
        _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={ca}", "-keyout",
             f"{ca}.key", "-out", f"{ca}.crt", cwd=tmp)
    for name, ca, ext in (("server", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
                          ("client", "ca", "extendedKeyUsage=clientAuth"),
                          ("stranger", "other-ca", "extendedKeyUsage=clientAuth")):
        _run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out",
             f"{name}.csr", cwd=tmp)
        (tmp / f"{name}.ext").write_text(ext + "\n")
        _run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=tmp)
    return {p.stem + p.suffix.replace(".", "_"): str(p) for p in tmp.iterdir()}


def test_mutual_tls_admits_only_clients_of_the_client_ca(tmp_path: Path) -> None:
    """``server_tls(cert, key, client_ca)``: a client with a certificate of the client CA (kube-scheduler with
    ``tlsConfig.certFile``/``keyFile``) is answered; one without a certificate, or with one of another CA, fails the
    handshake before any request is read."""
    from walras.extender import server_tls, start_site

    f = _mutual_tls_files(tmp_path)
    server_ctx = server_tls(f["server_crt"], f["server_key"], client_ca=f["ca_crt"])
    body = json.loads(FIXTURE.read_text())

    def client(cert: str | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=f["ca_crt"])
        if cert is not None:
            ctx.load_cert_chain(f[f"{cert}_crt"], f[f"{cert}_key"])
        return ctx

    async def scenario() -> None:
        runner, port = await start_site(Extender(_plan).app(), "127.0.0.1", 0, server_ctx)
        url = f"https://localhost:{port}/scheduler/filter"
        try:
            async with aiohttp.ClientSession() as session:
                async with session.post(url, json=body, ssl=client("client")) as resp:
                    assert resp.status == 200 and (await resp.json())["nodenames"] == ["gpu-v100-1"]
                for cert in (None, "stranger"):
                    with pytest.raises(aiohttp.ClientError):
                        async with session.post(url, json=body, ssl=client(cert),
                                                timeout=aiohttp.ClientTimeout(total=5)) as resp:
                            await resp.read()
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
