"""TLS on every server command (``reach gateway``, ``reach node``, ``reach issuer``, the SDK's ``serve()``) and L1
enforced on the gateway's and node's hops, with real certificates (trustme) on 127.0.0.1 (issue 24, deliverable 10).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import trustme
from hop_support import TOKENS, demo_tenants, free_port, write_config
from servers import interrupt

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer, ReachAgent, mtls
from reach_plugins.errors import ConfigError
from reach_plugins.gateway import create_app
from reach_plugins.node import build_node
from reach_plugins.security import SigningKey, TokenIssuer
from reach_plugins.security.keys import KeyRing
from reach_plugins.server.tls import ServerTls
from transports.grpcnode import GrpcNodeTransport

CLI = "from reach_plugins.cli import main; main()"
STARTUP = 30.0
"""Seconds a server process may take to start answering (generous: the suite shares two cores)."""


@dataclass
class Pki:
    ca: Path
    server: tuple[Path, Path]
    client: tuple[Path, Path]
    stranger: tuple[Path, Path]
    """A client certificate of another CA."""


def _pair(folder: Path, name: str, cert: trustme.LeafCert) -> tuple[Path, Path]:
    chain, key = folder / f"{name}.pem", folder / f"{name}-key.pem"
    cert.private_key_pem.write_to_path(str(key))
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    return chain, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    return Pki(
        folder / "ca.pem",
        _pair(folder, "server", ca.issue_cert("127.0.0.1")),
        _pair(folder, "client", ca.issue_cert("front.reach")),
        _pair(folder, "stranger", other.issue_cert("front.reach")),
    )


def _tls_flags(pki: Pki, *, mutual: bool) -> list[str]:
    flags = ["--tls-cert", str(pki.server[0]), "--tls-key", str(pki.server[1])]
    return [*flags, "--client-ca", str(pki.ca)] if mutual else flags


@contextmanager
def _process(args: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(args, env={**os.environ, **TOKENS}, stderr=subprocess.PIPE)
    try:
        yield process
    finally:
        interrupt(process)


def _client(pki: Pki, cert: tuple[Path, Path] | None) -> httpx.Client:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    return httpx.Client(verify=context, timeout=5)


def _wait_https(url: str, pki: Pki, process: subprocess.Popen[bytes], cert: tuple[Path, Path] | None) -> None:
    """Poll ``url`` over TLS until it answers 200 (fails with the process's output after :data:`STARTUP`)."""
    end = time.monotonic() + STARTUP
    with _client(pki, cert) as http:
        while True:
            if process.poll() is not None:
                raise AssertionError(f"the server exited: {process.stderr.read().decode() if process.stderr else ''}")
            try:
                if http.get(url).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > end:
                raise AssertionError(f"{url} did not answer within {STARTUP}s")
            time.sleep(0.1)


def _refused(url: str, pki: Pki, cert: tuple[Path, Path] | None) -> bool:
    """Whether a GET of ``url`` fails at the TLS (or plain-HTTP) level, before any HTTP answer."""
    try:
        with _client(pki, cert) as http:
            http.get(url)
    except httpx.TransportError:
        return True
    return False


def test_reach_gateway_serves_mutual_tls(tmp_path: Path, pki: Pki) -> None:
    """`reach gateway --tls-cert --tls-key --client-ca` answers a client with a certificate of the CA only: no
    certificate, a foreign one, or plain http get no answer."""
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    port = free_port()
    args = [sys.executable, "-c", CLI, "gateway", "--config", str(config), "--port", str(port)]
    with _process([*args, *_tls_flags(pki, mutual=True)]) as process:
        url = f"https://127.0.0.1:{port}/healthz"
        _wait_https(url, pki, process, pki.client)
        assert _refused(url, pki, None)
        assert _refused(url, pki, pki.stranger)
        assert _refused(f"http://127.0.0.1:{port}/healthz", pki, None)


def test_reach_gateway_workers_serve_tls(tmp_path: Path, pki: Pki, redis_url: str) -> None:
    """`reach gateway --workers 2` hands the TLS flags to each worker: https with a client certificate answers."""
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    port = free_port()
    args = [sys.executable, "-c", CLI, "gateway", "--config", str(config), "--port", str(port), "--workers", "2"]
    args += ["--dedup-store", f"{redis_url}?prefix=tlsworkers-{port}:"]
    with _process([*args, *_tls_flags(pki, mutual=True)]) as process:
        url = f"https://127.0.0.1:{port}/healthz"
        _wait_https(url, pki, process, pki.client)
        assert _refused(url, pki, None)


def test_reach_issuer_serves_tls(tmp_path: Path, pki: Pki) -> None:
    """`reach issuer --tls-cert --tls-key` publishes its JWKS over https, and plain http gets no answer."""
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    key = tmp_path / "issuer.pem"
    key.write_bytes(SigningKey.generate().pem())
    port = free_port()
    args = [sys.executable, "-c", CLI, "issuer", "--config", str(config), "--key", str(key), "--port", str(port)]
    with _process([*args, *_tls_flags(pki, mutual=False)]) as process:
        _wait_https(f"https://127.0.0.1:{port}/healthz", pki, process, None)
        with _client(pki, None) as http:
            jwks = http.get(f"https://127.0.0.1:{port}/.well-known/jwks.json").json()
        assert jwks["keys"]
        assert _refused(f"http://127.0.0.1:{port}/healthz", pki, None)


async def _node_code(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    """The status of a token-less Call: UNAUTHENTICATED once TLS let the call through, UNAVAILABLE otherwise."""
    channel = grpc.aio.insecure_channel(target) if credentials is None else grpc.aio.secure_channel(target, credentials)
    async with channel:
        try:
            await channel.unary_unary("/reach.v1.ReachNode/Call")(b"", timeout=3)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def _channel_credentials(pki: Pki, cert: tuple[Path, Path] | None) -> grpc.ChannelCredentials:
    pair = {} if cert is None else {"private_key": cert[1].read_bytes(), "certificate_chain": cert[0].read_bytes()}
    return grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes(), **pair)


async def test_reach_node_serves_grpc_over_mutual_tls(tmp_path: Path, pki: Pki) -> None:
    """`reach node --tls-cert --tls-key --client-ca`: a client with a certificate of the CA reaches the node's
    auth check; a plaintext channel or one without a client certificate never does."""
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    port = free_port()
    target = f"127.0.0.1:{port}"
    args = [sys.executable, "-c", CLI, "node", "--config", str(config), "--port", str(port)]
    with _process([*args, *_tls_flags(pki, mutual=True)]) as process:
        loop = asyncio.get_running_loop()
        end = loop.time() + STARTUP
        while await _node_code(target, _channel_credentials(pki, pki.client)) != grpc.StatusCode.UNAUTHENTICATED:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            assert loop.time() < end, f"the node did not answer over TLS within {STARTUP}s"
            await asyncio.sleep(0.1)
        assert await _node_code(target, None) == grpc.StatusCode.UNAVAILABLE
        assert await _node_code(target, _channel_credentials(pki, None)) == grpc.StatusCode.UNAVAILABLE
        assert await _node_code(target, _channel_credentials(pki, pki.stranger)) == grpc.StatusCode.UNAVAILABLE


async def test_a_client_reaches_agents_through_a_node_over_mutual_tls(tmp_path: Path, pki: Pki) -> None:
    """``GrpcNodeTransport(credentials=...)`` to a node built with TLS flags: the call runs once at the agent."""
    vault = _vault(None)
    try:
        agents = {
            "vault": {"endpoints": [vault.server.url], "capabilities": ["open"]},
            "orders": {"endpoints": ["http://127.0.0.1:9"], "capabilities": ["query_order"]},
        }  # the agent verifies tokens bound to its own name; orders is only in acme's allow-list
        config = write_config(tmp_path / "agents.yaml", agents, demo_tenants())
        tls = {"tls_cert": pki.server[0], "tls_key": pki.server[1], "client_ca": pki.ca}
        async with build_node(config, environ=TOKENS, **tls) as node:
            credentials = _channel_credentials(pki, pki.client)
            transport = GrpcNodeTransport(node.target, token=TOKENS["DEMO_TOKEN"], credentials=credentials)
            async with ReachClient(str(config), transport, tenant="demo", environ=TOKENS) as client:
                reply = await client.reach("open", {"box": "b3"})
    finally:
        vault.server.stop()
    assert reply.status == "success", reply.error
    assert vault.calls == ["b3"]


_SERVE = textwrap.dedent(
    """
    import sys
    from reach_plugins.agent import ReachAgent, serve

    agent = ReachAgent("vault", trust="L1")
    serve(agent, port=int(sys.argv[1]), tls_cert=sys.argv[2], tls_key=sys.argv[3], client_ca=sys.argv[4])
    """
)


def test_the_sdks_serve_takes_the_tls_flags(pki: Pki) -> None:
    """``serve(agent, tls_cert=, tls_key=, client_ca=)`` serves an L1 agent over mutual TLS."""
    port = free_port()
    args = [sys.executable, "-c", _SERVE, str(port), str(pki.server[0]), str(pki.server[1]), str(pki.ca)]
    with _process(args) as process:
        url = f"https://127.0.0.1:{port}/healthz"
        _wait_https(url, pki, process, pki.client)
        assert _refused(url, pki, None)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--tls-cert", "{cert}"], "--tls-key"),
        (["--client-ca", "{ca}"], "--client-ca needs --tls-cert"),
        (["--tls-cert", "{cert}", "--tls-key", "{stranger_key}"], "cannot load"),
        (["--tls-cert", "{cert}", "--tls-key", "{key}", "--client-ca", "{missing}"], "--client-ca: no such file"),
    ],
    ids=["cert-without-key", "ca-without-cert", "key-of-another-cert", "missing-ca"],
)
@pytest.mark.parametrize("command", ["gateway", "node", "issuer"])
def test_half_or_wrong_tls_flags_end_the_command_naming_the_flag(
    tmp_path: Path, pki: Pki, command: str, flags: list[str], named: str
) -> None:
    """Half a TLS setting, or files that do not load, end the command with exit status 2 and the flag named."""
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    values = {
        "cert": pki.server[0],
        "key": pki.server[1],
        "stranger_key": pki.stranger[1],
        "ca": pki.ca,
        "missing": tmp_path / "nowhere.pem",
    }
    given = [flag.format(**values) for flag in flags]
    args = [sys.executable, "-c", CLI, command, "--config", str(config), "--port", str(free_port()), *given]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, env={**os.environ, **TOKENS})
    assert done.returncode == 2, done.stdout + done.stderr
    assert named in " ".join(done.stdout.split()), done.stdout


def test_server_tls_requires_the_key_that_matches_the_certificate(pki: Pki) -> None:
    """ServerTls loads its files at once: a key of another certificate is a ConfigError, a good pair is not."""
    with pytest.raises(ConfigError, match="cannot load"):
        ServerTls(str(pki.server[0]), str(pki.stranger[1]))
    assert ServerTls.given(*pki.server, pki.ca) == ServerTls(str(pki.server[0]), str(pki.server[1]), str(pki.ca))
    assert ServerTls.given(None, None) is None


# ---------------------------------------------------------------------- L1 on the hops


@dataclass
class Vault:
    """An L1 agent counting what reached it."""

    server: BackgroundServer
    calls: list[str]


def _vault(tokens: TokenIssuer | None, **options: Any) -> Vault:
    agent = ReachAgent("vault", tokens=tokens.verifier() if tokens else None)
    calls: list[str] = []

    @agent.capability("open")
    def open_vault(box: str) -> dict[str, str]:
        calls.append(box)
        return {"opened": box}

    return Vault(BackgroundServer(agent.app, **options).start(), calls)


def _l1_config(folder: Path, endpoint: str, auth: dict[str, str] | None = None) -> Path:
    vault = {"endpoints": [endpoint], "capabilities": ["open"], "trust": "L1", **({"auth": auth} if auth else {})}
    return write_config(folder / "agents.yaml", {"orders": ["http://127.0.0.1:9"], "vault": vault}, demo_tenants())


def test_the_gateway_never_sends_l1_traffic_over_plain_http(tmp_path: Path) -> None:
    """An L1 agent registered at an http endpoint is refused at the gateway (permission_denied naming https, the
    endpoint not shown): 0 requests, so no token, reach it (on main the gateway sent both in the clear)."""
    vault = _vault(None)
    try:
        app = create_app(_l1_config(tmp_path, vault.server.url), environ=TOKENS)
        with BackgroundServer(app) as gateway:
            body = {"capability": "open", "payload": {"box": "b1"}}
            bearer = {"Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}"}
            answer = httpx.post(f"{gateway.url}/v1/reach", json=body, headers=bearer, timeout=30)
    finally:
        vault.server.stop()
    error = answer.json()["error"]
    assert error["type"] == "permission_denied" and "https" in error["message"], answer.text
    assert str(vault.server.port) not in answer.text
    assert vault.calls == []


async def test_the_node_never_sends_l1_traffic_over_plain_http(tmp_path: Path) -> None:
    """The same refusal at the node: the call fails, naming https, and the agent saw nothing."""
    vault = _vault(None)
    try:
        config = _l1_config(tmp_path, vault.server.url)
        async with build_node(config, environ=TOKENS) as node:
            transport = GrpcNodeTransport(node.target, token=TOKENS["DEMO_TOKEN"])
            async with ReachClient(str(config), transport, tenant="demo", environ=TOKENS) as client:
                reply = await client.reach("open", {"box": "b1"})
    finally:
        vault.server.stop()
    assert reply.status == "fail" and reply.error is not None and "https" in reply.error.message
    assert str(vault.server.port) not in reply.error.message
    assert vault.calls == []


def test_the_gateway_reaches_an_l1_agent_over_mutual_tls(tmp_path: Path, pki: Pki) -> None:
    """With an https endpoint and a client certificate, the gateway's L1 call runs once (the check lets it by)."""
    key = tmp_path / "issuer.pem"
    key.write_bytes(SigningKey.generate().pem())
    vault = _vault(TokenIssuer(KeyRing.load([key]), issuer="reach"), **mtls(*pki.server, pki.ca))
    auth = {"type": "cert", "client_cert": str(pki.client[0]), "client_key": str(pki.client[1]), "ca_file": str(pki.ca)}
    try:
        app = create_app(_l1_config(tmp_path, vault.server.url, auth), environ=TOKENS, issuer_keys=[key])
        with BackgroundServer(app) as gateway:
            body = {"capability": "open", "payload": {"box": "b2"}}
            bearer = {"Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}"}
            answer = httpx.post(f"{gateway.url}/v1/reach", json=body, headers=bearer, timeout=30)
    finally:
        vault.server.stop()
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"] == {"opened": "b2"} and vault.calls == ["b2"]
