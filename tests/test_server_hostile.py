"""Hostile callers against every server app, over real uvicorn on 127.0.0.1: what the shared server layer and its
uvicorn guard refuse (issue 24, deliverables 2 and 11).

The routes are enumerated from each app (the gateway with its issuer role and
/mcp, ``reach issuer``, an agent with its A2A routes), never listed here.
Covered: trickling sockets on every route (health, metrics, the card and
JWKS never read a body, yet their slow callers are cut), ambiguous framings
on both HTTP parsers, per-tenant large-body places, malformed agent headers,
duplicate token headers, 401s that echo nothing of the token, backend
addresses kept out of refusals, memory under a 300 MiB unauthenticated token
request, and a fuzzer over every route.
"""

from __future__ import annotations

import base64
import json
import selectors
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hop_support import TOKENS, demo_tenants, free_port, write_config
from hostile_support import closed_by_server, read_all, server_process
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.errors import BusinessError
from reach_plugins.gateway import create_app
from reach_plugins.security import HEADER_TOKEN, SigningKey, TokenIssuer
from reach_plugins.server.inbound import SMALL_BODY, InputLimits
from reach_plugins.server.issuer_server import create_issuer_app
from reach_plugins.server.layer import ServerApp, ServerRoute, declared_routes

HEAD_TIMEOUT = 1.0
"""Seconds every server of this module gives a request head (and an unread body after the answer)."""
LIMITS = InputLimits(max_body=1 << 20, body_timeout=1.0)
TRICKLERS = 200


@dataclass
class Served:
    """One server app under uvicorn, the headers its callers authenticate with, and what its agent ran."""

    name: str
    app: ServerApp
    server: BackgroundServer
    credentials: dict[str, str]

    def every(self) -> list[tuple[ServerRoute, str]]:
        return [(route, method) for route in declared_routes(self.app) for method in route.methods]


def _agent(issuer: TokenIssuer, ran: list[str]) -> ReachAgent:
    agent = ReachAgent("orders", tokens=issuer.verifier(), limits=LIMITS)

    @agent.capability("query_order")
    def query_order(order_id: str) -> dict[str, Any]:
        ran.append(order_id)
        return {"order_id": order_id}

    return agent


@pytest.fixture(scope="module")
def issuer() -> TokenIssuer:
    return TokenIssuer(issuer="reach")


@pytest.fixture(scope="module")
def ran() -> list[str]:
    """Order ids the module's agent executed."""
    return []


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, issuer: TokenIssuer, ran: list[str]) -> Iterator[list[Served]]:
    """The gateway (issuer role on), ``reach issuer`` and a token-checking agent under uvicorn, 1 s head timeout."""
    tmp = tmp_path_factory.mktemp("hostile")
    config = write_config(tmp / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    key = tmp / "issuer.pem"
    key.write_bytes(SigningKey.generate().pem())
    bearer = {"Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}"}
    apps = [
        ("gateway", create_app(config, environ=TOKENS, issuer_keys=[key], limits=LIMITS), bearer),
        ("issuer", create_issuer_app(config, keys=[key], environ=TOKENS, limits=LIMITS), bearer),
        ("agent", _agent(issuer, ran).app, {HEADER_TOKEN: issuer.for_tenant("demo", "orders").token}),
    ]
    served = [
        Served(name, app, BackgroundServer(app, proxy_headers=False, header_timeout=HEAD_TIMEOUT), creds)
        for name, app, creds in apps
    ]
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


def _trickle(sockets: dict[socket.socket, str], within: float) -> tuple[dict[str, float], set[str]]:
    """Send each socket a byte every 50 ms; when each was closed by the server (seconds), and which stayed open."""
    selector = selectors.DefaultSelector()
    for sock in sockets:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    started = time.monotonic()
    closed: dict[str, float] = {}

    def close(sock: socket.socket) -> None:
        closed[sockets[sock]] = time.monotonic() - started
        selector.unregister(sock)
        sock.close()

    while selector.get_map() and time.monotonic() - started < within:
        for key in list(selector.get_map().values()):
            try:
                key.fileobj.send(b" ")  # type: ignore[union-attr]
            except OSError:
                close(key.fileobj)  # type: ignore[arg-type]
        for key, _ in selector.select(0.05):
            try:
                if not key.fileobj.recv(65536):  # type: ignore[union-attr]
                    close(key.fileobj)  # type: ignore[arg-type]
            except BlockingIOError:
                continue
            except OSError:
                close(key.fileobj)  # type: ignore[arg-type]
    still = {sockets[key.fileobj] for key in selector.get_map().values()}  # type: ignore[index]
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    return closed, still


def test_trickling_sockets_on_every_route_are_closed_within_the_timeout(servers: list[Served]) -> None:
    """200 callers trickling a declared body to open routes (which never read it), plus one per other route, are
    all cut within the head or body timeout; on main the open routes kept 200 of 200 open indefinitely."""
    targets = [(one, route, method) for one in servers for route, method in one.every()]
    opened = [target for target in targets if target[1].open]
    plan = [opened[n % len(opened)] for n in range(TRICKLERS)] + [t for t in targets if not t[1].open]
    sockets: dict[socket.socket, str] = {}
    for n, (one, route, method) in enumerate(plan):
        headers = {**({} if route.open else one.credentials), "Content-Type": "application/json"}
        sock = socket.create_connection(("127.0.0.1", one.server.port), timeout=5)
        sock.sendall(_head(method, route.path, {**headers, "Content-Length": "100000"}))
        sockets[sock] = f"#{n} {one.name} {method} {route.path}"
    bound = max(HEAD_TIMEOUT, LIMITS.body_timeout) + 2.0
    closed, still = _trickle(sockets, within=bound + 2.0)
    assert not still, f"{len(still)} of {len(sockets)} trickling sockets still open: {sorted(still)[:5]}"
    late = {where: at for where, at in closed.items() if at > bound}
    assert not late, f"closed after {bound}s: {late}"
    assert len(closed) == len(plan) >= TRICKLERS + 5


def test_every_body_route_refuses_an_oversized_body_from_an_authenticated_caller(servers: list[Served]) -> None:
    """An authenticated caller's body past its route's bound (1 MiB; plus the base64 of its media limit on routes
    carrying media; 16 KiB for the token route), declared or chunked, is a 413 on every route taking a body, and
    the connection is closed rather than read on."""
    for one in servers:
        for route, method in one.every():
            if route.body is None:
                continue
            over = max(route.limits.bound, LIMITS.max_body) + 1
            headers = {**one.credentials, "Content-Type": "application/json"}
            for framing in ({"Content-Length": str(over)}, {"Transfer-Encoding": "chunked"}):
                with socket.create_connection(("127.0.0.1", one.server.port), timeout=5) as sock:
                    sock.sendall(_head(method, route.path, {**headers, **framing}))
                    try:
                        for _ in range(over // SMALL_BODY + 1):
                            sock.sendall(
                                b"%x\r\n%s\r\n" % (SMALL_BODY, b" " * SMALL_BODY)
                                if framing.get("Transfer-Encoding")
                                else b" " * SMALL_BODY
                            )
                    except OSError:
                        pass
                    answer = read_all(sock, 3.0)
                    where = f"{one.name} {method} {route.path} {framing}"
                    assert closed_by_server(sock, 1.0), f"{where}: the connection stayed open"
                assert _status(answer) == 413, f"{where}: {answer[:200]!r}"


def _chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


def _framings(token: str) -> dict[str, bytes]:
    """Request heads whose body length two parsers could read differently, each with a valid body after it."""
    body = json.dumps({"capability": "query_order", "payload": {"order_id": "smuggled"}}).encode()
    size = str(len(body)).encode()
    head = (
        b"POST /reach HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"{HEADER_TOKEN}: {token}\r\n".encode()
    )
    chunked = _chunked(body)
    return {
        "cl-and-te": head + b"Content-Length: " + size + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
        "two-cl-differ": head + b"Content-Length: " + size + b"\r\nContent-Length: 5\r\n\r\n" + body,
        "two-cl-same": head + b"Content-Length: " + size + b"\r\nContent-Length: " + size + b"\r\n\r\n" + body,
        "cl-list": head + b"Content-Length: " + size + b", " + size + b"\r\n\r\n" + body,
        "cl-plus": head + b"Content-Length: +" + size + b"\r\n\r\n" + body,
        "cl-minus": head + b"Content-Length: -" + size + b"\r\n\r\n" + body,
        "te-identity-chunked": head + b"Transfer-Encoding: identity, chunked\r\n\r\n" + chunked,
        "te-xchunked": head + b"Transfer-Encoding: xchunked\r\n\r\n" + chunked,
        "te-chunked-gzip": head + b"Transfer-Encoding: chunked, gzip\r\n\r\n" + chunked,
        "two-te": head + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
        "te-obs-fold": head + b"Transfer-Encoding:\r\n chunked\r\n\r\n" + chunked,
        "space-before-colon": head + b"Transfer-Encoding : chunked\r\n\r\n" + chunked,
        "bare-lf": head.replace(b"\r\n", b"\n") + b"Content-Length: " + size + b"\n\n" + body,
        "http10-te": head.replace(b"HTTP/1.1", b"HTTP/1.0") + b"Transfer-Encoding: chunked\r\n\r\n" + chunked,
    }


@pytest.mark.parametrize("parser", ["h11", "httptools"])
def test_ambiguous_framings_are_refused_by_either_parser(issuer: TokenIssuer, parser: str) -> None:
    """Each of 14 ambiguous framings is a 400 before the parser or the agent sees it (h11 accepted 6 on main,
    httptools 2); the same request framed plainly, by length or chunked, runs."""
    ran: list[str] = []
    token = issuer.for_tenant("demo", "orders").token
    with BackgroundServer(_agent(issuer, ran).app, http=parser) as server:
        answers = {name: _status(_send(server.port, raw)) for name, raw in _framings(token).items()}
        body = json.dumps({"capability": "query_order", "payload": {"order_id": "plain"}}).encode()
        head = f"POST /reach HTTP/1.1\r\nHost: 127.0.0.1\r\n{HEADER_TOKEN}: {token}\r\n".encode()
        by_length = _send(server.port, head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        by_chunks = _send(server.port, head + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(body))
    assert answers == dict.fromkeys(answers, 400), answers
    assert _status(by_length) == _status(by_chunks) == 200
    assert ran == ["plain", "plain"]


@pytest.mark.parametrize("parser", ["h11", "httptools"])
def test_a_head_arriving_in_pieces_is_checked_whole_and_served(issuer: TokenIssuer, parser: str) -> None:
    """A plain request sent in pieces (one cut inside the blank line ending its head) runs; an ambiguous one
    sent the same way is still a 400: the framing check waits for the whole head."""
    ran: list[str] = []
    token = issuer.for_tenant("demo", "orders").token
    body = json.dumps({"capability": "query_order", "payload": {"order_id": "pieces"}}).encode()
    plain = f"POST /reach HTTP/1.1\r\nHost: 127.0.0.1\r\n{HEADER_TOKEN}: {token}\r\n".encode()
    plain += b"Content-Length: %d\r\n\r\n" % len(body) + body
    blank = plain.index(b"\r\n\r\n") + 3
    cuts = [1, 7, 30, blank, len(plain)]
    with BackgroundServer(_agent(issuer, ran).app, http=parser) as server:
        answers = []
        for raw in (plain, _framings(token)["cl-and-te"]):
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for start, end in zip([0, *cuts], [*cuts, len(raw)], strict=True):
                    sock.sendall(raw[start:end])
                    time.sleep(0.02)  # lets each piece arrive on its own (what is tested, not a race hidden)
                answers.append(_status(read_all(sock, 2.0)))
    assert answers == [200, 400]
    assert ran == ["pieces"]


def _send(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(raw)
        sock.settimeout(3)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer) < 60:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


def _agent_of(servers: list[Served]) -> Served:
    return next(one for one in servers if one.name == "agent")


@pytest.mark.parametrize("value", ["nan", "inf", "²", "-5", "1e3", "٣", "5 5", ""])
@pytest.mark.parametrize("path", ["/reach", "/reach/stream"])
def test_a_malformed_deadline_header_is_a_400_naming_it(
    servers: list[Served], ran: list[str], value: str, path: str
) -> None:
    """``X-Reach-Deadline`` that is not a number of milliseconds is a 400 naming the header, and nothing runs
    (on main: ``nan`` was a 500 with a traceback, ``inf``, ``²`` and ``1e3`` ran, ``-5`` was a 504)."""
    agent = _agent_of(servers)
    before = len(ran)
    headers = [*agent.credentials.items(), ("X-Reach-Deadline", value.encode())]
    body = {"capability": "query_order", "payload": {"order_id": "late"}}
    answer = httpx.post(f"{agent.server.url}{path}", json=body, headers=headers)
    assert answer.status_code == 400, answer.text
    assert "X-Reach-Deadline" in answer.json()["error"]["message"]
    assert len(ran) == before


def test_an_idempotency_key_as_a_list_or_twice_is_a_400(servers: list[Served], ran: list[str]) -> None:
    """An idempotency key given as a JSON list, or as two headers, is a 400 naming it; nothing runs."""
    agent = _agent_of(servers)
    before = len(ran)
    url = f"{agent.server.url}/reach"
    body = {"capability": "query_order", "payload": {"order_id": "k"}}
    listed = httpx.post(url, json={**body, "idempotency_key": ["a", "b"]}, headers=agent.credentials)
    keys = [*agent.credentials.items(), ("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
    twice = httpx.post(url, json=body, headers=keys)
    assert listed.status_code == twice.status_code == 400
    assert "idempotency_key" in listed.json()["error"]["message"]
    assert "idempotency-key" in twice.json()["error"]["message"]
    assert len(ran) == before


def test_duplicate_token_headers_are_refused(servers: list[Served], issuer: TokenIssuer, ran: list[str]) -> None:
    """Two ``X-Reach-Token`` headers, even two valid tokens, are a 400 before anything runs (on main the last
    one won and the call ran)."""
    agent = _agent_of(servers)
    before = len(ran)
    tokens = [(HEADER_TOKEN, issuer.for_tenant(tenant, "orders").token) for tenant in ("demo", "acme")]
    body = {"capability": "query_order", "payload": {"order_id": "twice"}}
    answer = httpx.post(f"{agent.server.url}/reach", json=body, headers=tokens)
    assert answer.status_code == 400
    assert "x-reach-token appears more than once" in answer.json()["error"]["message"]
    assert len(ran) == before


def _forged(header: dict[str, str]) -> str:
    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part(header)}.{part({'aud': 'orders', 'tenant': 'demo'})}.{part({'sig': 'x'})}"


@pytest.mark.parametrize(
    "header", [{"alg": "HS256", "kid": "kid-PROBE-1"}, {"alg": "EdDSA", "kid": "kid-PROBE-2"}], ids=["alg", "kid"]
)
def test_a_401_never_echoes_the_tokens_kid_or_alg(servers: list[Served], header: dict[str, str]) -> None:
    """A forged token's ``kid`` and ``alg`` never come back in the 401 (on main both were quoted)."""
    agent = _agent_of(servers)
    body = {"capability": "query_order", "payload": {"order_id": "forged"}}
    answer = httpx.post(f"{agent.server.url}/reach", json=body, headers={HEADER_TOKEN: _forged(header)})
    assert answer.status_code == 401
    assert "PROBE" not in answer.text and "HS256" not in answer.text


def test_a_backend_address_never_reaches_the_caller(tmp_path: Path) -> None:
    """A keyed call refused because the gateway's Redis is down says so without naming where Redis runs."""
    port = free_port()
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    app = create_app(config, environ=TOKENS, store=f"redis://127.0.0.1:{port}/0")
    headers = {"Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}", "Idempotency-Key": "k1"}
    with BackgroundServer(app) as gateway:
        body = {"capability": "query_order", "payload": {"order_id": "1"}}
        answer = httpx.post(f"{gateway.url}/v1/reach", json=body, headers=headers, timeout=30)
    assert answer.status_code == 503
    error = answer.json()["error"]
    assert error["type"] == "backend_unavailable" and "redis" in error["message"]
    assert str(port) not in answer.text and "127.0.0.1" not in answer.text


def _poll(condition: Callable[[], bool], *, within: float) -> None:
    end = time.monotonic() + within
    while not condition():
        assert time.monotonic() < end, f"condition not reached within {within}s"
        time.sleep(0.01)


def test_one_tenants_slow_large_body_never_delays_another_tenant(tmp_path: Path) -> None:
    """Tenant demo stalls a large body in its one large-body place; tenant beta's 200 KB call is read at once
    (on main the place was the server's: beta waited out its body timeout, then got a 408)."""
    tenants = demo_tenants()
    tenants["beta"] = {**tenants["demo"], "token_env": "BETA_TOKEN"}
    environ = {**TOKENS, "BETA_TOKEN": "beta-token-1"}
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, tenants)
    app = create_app(config, environ=environ, limits=InputLimits(body_timeout=5.0))
    with BackgroundServer(app) as gateway, socket.create_connection(("127.0.0.1", gateway.port)) as stalled:
        head = {"Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}", "Content-Type": "application/json"}
        stalled.sendall(_head("POST", "/v1/reach", {**head, "Content-Length": "600000"}) + b" " * (SMALL_BODY * 2))
        places = next(route.large for route in declared_routes(app) if route.path == "/v1/reach")
        assert places is not None
        _poll(lambda: places.of("demo").locked(), within=5.0)
        started = time.monotonic()
        body = {"capability": "query_order", "payload": {"blob": "x" * 200_000}}
        answer = httpx.post(
            f"{gateway.url}/v1/reach", json=body, headers={"Authorization": "Bearer beta-token-1"}, timeout=10
        )
        elapsed = time.monotonic() - started
        assert read_all(stalled, 0.05) == b"", "demo's stalled body was answered early"
    assert answer.status_code != 408 and elapsed < 4.0, (answer.status_code, elapsed)


def test_a_300_mib_unauthenticated_token_request_costs_no_memory(tmp_path: Path) -> None:
    """300 MiB sent to POST /v1/tokens without credentials, declared or chunked, grows the gateway's peak RSS by
    less than 16 MiB (main before the server layer: +600 MiB)."""
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    huge, chunk = 300 << 20, b"x" * (1 << 20)
    with server_process("gateway", config) as gateway:
        httpx.get(f"{gateway.url}/healthz").raise_for_status()
        before = gateway.peak_rss()
        statuses = []
        for framing in (f"Content-Length: {huge}", "Transfer-Encoding: chunked"):
            with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
                sock.sendall(f"POST /v1/tokens HTTP/1.1\r\nHost: 127.0.0.1\r\n{framing}\r\n\r\n".encode())
                sent = 0
                try:
                    while sent < huge:
                        sock.sendall(chunk if "Length" in framing else b"100000\r\n" + chunk + b"\r\n")
                        sent += len(chunk)
                except OSError:
                    pass
                statuses.append(_status(read_all(sock, 2.0)))
        grown = gateway.peak_rss() - before
    assert all(status in (0, 401) for status in statuses), statuses
    assert grown < 16 << 20, f"peak RSS grew by {grown / 2**20:.1f} MiB"


# ---------------------------------------------------------------------- fuzzing every route

_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_bodies = st.one_of(
    _json.map(lambda value: json.dumps(value).encode()),
    st.fixed_dictionaries(
        {"capability": st.text(max_size=8) | _scalars},
        optional={"payload": _json, "idempotency_key": _json, "deadline_ms": _json, "session_id": _json},
    ).map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=64),
)
_header_values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)
_headers = st.dictionaries(
    st.sampled_from(["X-Reach-Deadline", "Idempotency-Key", "X-Tenant", "X-Reach-Hops", "X-Reach-Target", "Accept"]),
    _header_values,
    max_size=3,
)


def test_fuzzing_every_route_of_every_server_gives_no_server_error(servers: list[Served]) -> None:
    """Any JSON or bytes with any reach headers, to every route (enumerated) of every app: never a 5xx."""
    clients = [(one, TestClient(one.app, raise_server_exceptions=False)) for one in servers]
    seen: list[str] = []
    for one, client in clients:
        for route, method in one.every():
            seen.append(f"{one.name} {method} {route.path}")
            _fuzz_route(client, route.path, method, one.credentials)
    assert len(seen) == sum(len(one.every()) for one in servers) >= 15


def _fuzz_route(client: TestClient, path: str, method: str, credentials: dict[str, str]) -> None:
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(body=_bodies, headers=_headers, authenticated=st.booleans())
    def one(body: bytes, headers: dict[str, str], authenticated: bool) -> None:
        sent = {**(credentials if authenticated else {}), **headers, "Content-Type": "application/json"}
        answer = client.request(method, path, content=body if method == "POST" else None, headers=sent)
        assert answer.status_code < 500, f"{method} {path}: {answer.status_code} {answer.text[:200]}"

    one()


def test_the_fuzzer_reaches_every_route(servers: list[Served]) -> None:
    """The fuzzed routes are the apps' own: the gateway's reach, MCP and token routes and the agent's A2A among them."""
    paths = {route.path for one in servers for route, _ in one.every()}
    assert {"/v1/reach", "/v1/reach/stream", "/mcp", "/v1/tokens", "/.well-known/jwks.json", "/a2a", "/reach"} <= paths


def test_a_failed_mcp_tool_call_never_names_a_backend_address(tmp_path: Path) -> None:
    """``tools/call`` at ``/mcp`` whose agent refuses naming where its database runs: the tool error is passed on
    without the address, as ``/v1/reach`` passes it on (the failed-reply path of the MCP face skipped the scrub)."""
    agent = ReachAgent("orders")

    @agent.capability("query_order")
    def query_order(order_id: str) -> dict[str, str]:
        raise BusinessError(f"order {order_id}: the ledger at 127.0.0.1:6390 refused the lookup")

    headers = {"Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}", "Accept": "application/json, text/event-stream"}
    with BackgroundServer(agent.app) as served:
        config = write_config(tmp_path / "agents.yaml", {"orders": [served.url]}, demo_tenants())
        with BackgroundServer(create_app(config, environ=TOKENS)) as gateway:
            init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
            opened = httpx.post(f"{gateway.url}/mcp", json=init, headers=headers, timeout=10)
            session = {**headers, "Mcp-Session-Id": opened.headers["mcp-session-id"]}
            call = {"name": "query_order", "arguments": {"order_id": "1"}}
            body = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}
            answer = httpx.post(f"{gateway.url}/mcp", json=body, headers=session, timeout=30)
    said = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ") and line[6:].strip()]
    result = json.loads(said[-1])["result"]  # the answer is an SSE response stream, its result the last event
    assert result["isError"] is True and "the ledger at" in result["content"][0]["text"], answer.text
    assert "6390" not in answer.text, answer.text
