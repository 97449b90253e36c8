"""Credentials and TLS through DirectTransport: mutual TLS with client certificates, and refused settings."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from transport_conformance import make_call, scripted_app

from reach_plugins.agent import BackgroundServer
from reach_plugins.errors import ConfigError
from reach_plugins.transport import Credential
from transports.direct import DirectTransport

OPENSSL = "openssl"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throw-away CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""
    root = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=root)  # fmt: skip
    (root / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=root)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", "san.ext", "-out", f"{name}.pem", cwd=root)  # fmt: skip
    return root


@pytest.fixture(scope="module")
def mtls_server(pki: Path) -> Iterator[BackgroundServer]:
    """The scripted agent behind TLS that requires a client certificate signed by the test CA."""
    options: dict[str, Any] = {
        "ssl_certfile": str(pki / "server.pem"),
        "ssl_keyfile": str(pki / "server.key"),
        "ssl_ca_certs": str(pki / "ca.pem"),
        "ssl_cert_reqs": ssl.CERT_REQUIRED,
    }
    with BackgroundServer(scripted_app(), **options) as server:
        yield server


def client_cert(pki: Path) -> Credential:
    return Credential(
        type="cert",
        cert_file=str(pki / "client.pem"),
        key_file=str(pki / "client.key"),
        ca_file=str(pki / "ca.pem"),
    )


@pytest.fixture(params=["aiohttp", "httpx"])
async def transport(request: pytest.FixtureRequest) -> AsyncIterator[DirectTransport]:
    async with DirectTransport(engine=request.param) as transport:
        yield transport


async def test_client_certificate_opens_mutual_tls(
    transport: DirectTransport, mtls_server: BackgroundServer, pki: Path
) -> None:
    """A cert credential presents the client certificate and trusts the agent's CA."""
    reply = await transport.send(make_call(mtls_server.url, "echo", credential=client_cert(pki)))
    assert mtls_server.url.startswith("https://")
    assert reply.status == "success"


async def test_missing_certificate_file_is_a_config_error(transport: DirectTransport, pki: Path) -> None:
    """A cert credential pointing at a missing file names the file."""
    credential = Credential(type="cert", cert_file=str(pki / "nope.pem"), key_file=str(pki / "client.key"))
    with pytest.raises(ConfigError, match=r"nope\.pem"):
        await transport.send(make_call("https://127.0.0.1:1", "echo", credential=credential))


@pytest.mark.parametrize(
    ("credential", "hint"),
    [
        (Credential(type="bearer"), "value_env"),
        (Credential(type="header", value="v"), "key"),
        (Credential(type="query", value="v"), "key"),
    ],
)
async def test_incomplete_credentials_are_config_errors(
    transport: DirectTransport, credential: Credential, hint: str
) -> None:
    """A credential without its secret or its name fails before sending, saying what to set."""
    with pytest.raises(ConfigError, match=hint):
        await transport.send(make_call("http://127.0.0.1:1", "echo", credential=credential))


async def test_http2_flag_still_talks_to_http1_agents(mtls_server: BackgroundServer, pki: Path) -> None:
    """With http2=True the httpx engine offers h2 and falls back to HTTP/1.1 when the agent has only that."""
    async with DirectTransport(engine="httpx", http2=True) as transport:
        reply = await transport.send(make_call(mtls_server.url, "echo", credential=client_cert(pki)))
    assert reply.status == "success"


def test_http2_needs_the_httpx_engine() -> None:
    """HTTP/2 on the aiohttp engine is refused with the fix in the message."""
    with pytest.raises(ConfigError, match="engine='httpx'"):
        DirectTransport(engine="aiohttp", http2=True)


def test_unknown_engine_is_refused() -> None:
    """Only the two engines exist."""
    with pytest.raises(ConfigError, match="aiohttp"):
        DirectTransport(engine="urllib3")  # type: ignore[arg-type]


async def test_cert_credential_needs_our_own_clients(pki: Path) -> None:
    """A caller's httpx client cannot take a per-agent certificate: that is a ConfigError, not a silent skip."""
    async with httpx.AsyncClient() as client, DirectTransport(client=client) as transport:
        with pytest.raises(ConfigError, match="certificate"):
            await transport.send(make_call("https://127.0.0.1:1", "echo", credential=client_cert(pki)))
