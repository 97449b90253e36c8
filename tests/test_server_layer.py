"""Every route of every server app goes through the one server layer: caller, bounded and timed body, strict parse.

The routes are enumerated from each app (the gateway with its issuer role and
/mcp, ``reach issuer``, an agent with its A2A routes), never listed here, so a
route added later is covered at once. Each non-open route is sent, over real
uvicorn on 127.0.0.1: an unauthenticated oversized body (refused before a
byte of it is sent), a trickling body (cut at the time limit) and deep or
broken JSON (a 4xx naming the problem).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from hop_support import TOKENS, demo_tenants, write_config
from hostile_support import closed_by_server, read_all
from starlette.responses import Response
from starlette.routing import Route

from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.errors import ConfigError
from reach_plugins.gateway import create_app
from reach_plugins.node import build_node
from reach_plugins.security import HEADER_TOKEN, SigningKey, TokenIssuer
from reach_plugins.server.inbound import InputLimits
from reach_plugins.server.issuer_server import create_issuer_app
from reach_plugins.server.layer import OPEN, ServerApp, ServerRoute, declared_routes

LIMIT = 1.0
"""Seconds every app of this module gives a body to arrive."""
LIMITS = InputLimits(max_body=64 * 1024, body_timeout=LIMIT)
HUGE = 300 << 20
OPEN_PATHS = {"/healthz", "/readyz", "/metrics", "/.well-known/jwks.json", "/.well-known/agent-card.json"}
"""The routes anyone may call: the only ones declared open."""


@dataclass
class Served:
    """One server app under uvicorn and the headers its authenticated callers send."""

    name: str
    app: ServerApp
    server: BackgroundServer
    credentials: dict[str, str]

    @property
    def routes(self) -> list[ServerRoute]:
        return declared_routes(self.app)

    def guarded(self) -> list[tuple[ServerRoute, str]]:
        """Every (route, method) that is not open."""
        return [(route, method) for route in self.routes if not route.open for method in route.methods]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Served]]:
    """The gateway (issuer role on), ``reach issuer`` and a token-checking agent, each under real uvicorn."""
    tmp = tmp_path_factory.mktemp("layer")
    config = write_config(tmp / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    key = tmp / "issuer.pem"
    key.write_bytes(SigningKey.generate().pem())
    issuer = TokenIssuer(issuer="reach")
    agent = ReachAgent("orders", tokens=issuer.verifier(), limits=LIMITS)

    @agent.capability("query_order")
    def query_order(order_id: str) -> dict[str, Any]:
        return {"order_id": order_id}

    bearer = {"Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}"}
    apps = [
        ("gateway", create_app(config, environ=TOKENS, issuer_keys=[key], limits=LIMITS), bearer),
        ("issuer", create_issuer_app(config, keys=[key], environ=TOKENS, limits=LIMITS), bearer),
        ("agent", agent.app, {HEADER_TOKEN: issuer.for_tenant("demo", "orders").token}),
    ]
    served = [Served(name, app, BackgroundServer(app, proxy_headers=False), creds) for name, app, creds in apps]
    for one in served:
        one.server.start()
    try:
        yield served
    finally:
        for one in served:
            one.server.stop()


def _head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def _json_body(answer: bytes) -> Any:
    return json.loads(answer.partition(b"\r\n\r\n")[2])


def test_every_route_is_mounted_through_the_layer(servers: list[Served]) -> None:
    """Each app's routes are all layer routes, and an app of ours refuses a route that bypasses the layer."""
    for one in servers:
        assert one.routes, one.name
    assert {route.path for one in servers for route in one.routes} >= {"/mcp", "/v1/tokens", "/a2a", "/reach"}

    async def bare(request: Any) -> Response:
        return Response()

    with pytest.raises(ConfigError, match="through the layer"):
        ServerApp([Route("/bare", bare)])  # type: ignore[list-item]
    sneaked = ServerApp([])
    sneaked.router.routes.append(Route("/bare", bare))
    with pytest.raises(ConfigError, match="outside the server layer"):
        declared_routes(sneaked)


def test_only_health_metrics_jwks_and_the_card_are_open(servers: list[Served]) -> None:
    """Open routes are declared OPEN, take no body, and are exactly the health, metrics, JWKS and card routes."""
    opened = {route.path for one in servers for route in one.routes if route.open}
    assert opened == OPEN_PATHS
    with pytest.raises(ConfigError, match="open route takes no body"):
        ServerRoute("/x", ("POST",), lambda inbound: None, auth=OPEN, body=dict)  # type: ignore[arg-type,return-value]


def test_unauthenticated_oversized_body_is_refused_before_it_is_read(servers: list[Served]) -> None:
    """A 300 MiB body without credentials gets 401/403 while not one byte of it was sent (declared or chunked)."""
    for one in servers:
        for route, method in one.guarded():
            for framing in ({"Content-Length": str(HUGE)}, {"Transfer-Encoding": "chunked"}):
                head = _head(method, route.path, {"Content-Type": "application/json", **framing})
                with socket.create_connection(("127.0.0.1", one.server.port), timeout=5) as sock:
                    sock.sendall(head)
                    answer = read_all(sock, 3.0)
                where = f"{one.name} {method} {route.path} {framing}"
                assert _status(answer) in (401, 403), f"{where}: {answer[:200]!r}"
                assert _json_body(answer)["error"]["message"], where


def test_a_trickling_body_is_cut_within_the_time_limit(servers: list[Served]) -> None:
    """An authenticated caller trickling its body a byte at a time is answered 4xx and cut at the body time limit."""
    for one in servers:
        for route, method in one.guarded():
            if route.body is None:
                continue
            headers = {**one.credentials, "Content-Type": "application/json", "Content-Length": "4096"}
            with socket.create_connection(("127.0.0.1", one.server.port), timeout=5) as sock:
                sock.sendall(_head(method, route.path, headers))
                started = time.monotonic()
                sock.settimeout(0.05)
                answer = b""
                while time.monotonic() - started < 4 * LIMIT and not answer:
                    try:
                        sock.sendall(b" ")
                        answer = sock.recv(65536)
                    except TimeoutError:
                        continue
                    except OSError:
                        break
                elapsed = time.monotonic() - started
                where = f"{one.name} {method} {route.path}"
                assert 400 <= _status(answer) < 500, f"{where}: {answer[:200]!r}"
                assert LIMIT * 0.8 <= elapsed < LIMIT + 1.0, f"{where}: answered after {elapsed:.2f}s"
                assert closed_by_server(sock, 1.0), f"{where}: the connection stayed open"


@pytest.mark.parametrize(
    ("raw", "named"),
    [(b"[" * 5000 + b"]" * 5000, "nested deeper"), (b'{"capability": ', "not valid JSON"), (b"\xff\xfe", "UTF-8")],
    ids=["deep", "broken", "not-utf8"],
)
def test_deep_or_invalid_json_is_a_4xx_naming_the_problem(servers: list[Served], raw: bytes, named: str) -> None:
    """Deep, broken or non-UTF-8 JSON to any route taking a body is a 4xx JSON naming the problem, never a 5xx."""
    for one in servers:
        for route, method in one.guarded():
            if route.body is None:
                continue
            headers = {**one.credentials, "Content-Type": "application/json"}
            answer = httpx.request(method, f"{one.server.url}{route.path}", content=raw, headers=headers)
            where = f"{one.name} {method} {route.path}"
            assert 400 <= answer.status_code < 500, f"{where}: {answer.status_code} {answer.text[:200]}"
            assert named in answer.json()["error"]["message"], where


def test_a_token_request_without_a_bearer_is_refused_unread(tmp_path: Path) -> None:
    """POST /v1/tokens without a bearer is 401 before its body is read (an exchange too: its presenter authenticates
    with its own issuer token); a typo in a tenant's request is 400."""
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    with BackgroundServer(create_issuer_app(config, environ=TOKENS)) as issuer:
        body = json.dumps({"audience": "orders", "subject_token": "x" * (64 * 1024)}).encode()
        chunked = httpx.post(f"{issuer.url}/v1/tokens", content=iter([body[:100]]))
        declared = httpx.post(f"{issuer.url}/v1/tokens", content=body)
        typo = httpx.post(
            f"{issuer.url}/v1/tokens",
            json={"audience": "orders", "tenat": "demo"},
            headers={"Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}"},
        )
    assert chunked.status_code == declared.status_code == 401
    assert "Authorization" in chunked.json()["error"]["message"]
    assert typo.status_code == 400 and "tenat" in typo.json()["error"]["message"]


NODE_METHODS = {"Call": "unary_unary", "Stream": "unary_stream", "Submit": "unary_unary", "Result": "unary_unary"}
"""The node's RPCs (reach.v1.ReachNode), each sent raw bytes that are no protobuf message."""


async def test_the_node_refuses_a_caller_before_decoding_its_message(tmp_path: Path) -> None:
    """Every node RPC without a token is UNAUTHENTICATED even when its message cannot be decoded; with a token the
    same bytes are INVALID_ARGUMENT naming the RPC (never UNKNOWN with a traceback): the check ran first."""
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    garbage = b"\xff" * 64
    bearer = (("authorization", f"Bearer {TOKENS['DEMO_TOKEN']}"),)
    async with build_node(config, environ=TOKENS) as node, grpc.aio.insecure_channel(node.target) as channel:
        for method, kind in NODE_METHODS.items():
            call = getattr(channel, kind)(f"/reach.v1.ReachNode/{method}")
            for metadata, expected in ((), grpc.StatusCode.UNAUTHENTICATED), (bearer, grpc.StatusCode.INVALID_ARGUMENT):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    answer = call(garbage, metadata=metadata, timeout=5)
                    if kind == "unary_stream":
                        async for _ in answer:
                            pass
                    else:
                        await answer
                assert refused.value.code() == expected, (method, metadata, refused.value.details())
                assert expected is grpc.StatusCode.UNAUTHENTICATED or method in refused.value.details()


async def test_the_node_bounds_a_message_before_it_is_handled(tmp_path: Path) -> None:
    """A message over the node's receive limit (1 MiB and 8 MiB of media) is RESOURCE_EXHAUSTED, whoever sends it."""
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    async with build_node(config, environ=TOKENS) as node, grpc.aio.insecure_channel(node.target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await channel.unary_unary("/reach.v1.ReachNode/Call")(b"\x00" * (10 << 20), timeout=5)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
