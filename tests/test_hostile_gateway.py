"""Fuzzing the gateway: whatever arrives, the answer is a JSON error naming the problem (4xx), never a 500."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from hop_support import TOKENS, demo_tenants, serve_agents, write_config
from hostile_support import closed_by_server, post_head, raw_request, server_process
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.gateway import create_app
from reach_plugins.server.inbound import InputLimits

ALLOWED = {200, 400, 401, 403, 404, 408, 409, 413, 415, 429, 503, 504}
"""Every status the gateway may answer: 200 for routed outcomes, refusals otherwise; never 500."""

DEMO = {"Authorization": "Bearer tok-demo", "Content-Type": "application/json"}
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
capabilities = st.sampled_from(["query_order", "whoami", "count", "refuse"]) | st.text(max_size=30)
fields = {
    "request_id": st.none() | st.text(max_size=140),
    "capability": capabilities | json_values,
    "action": st.none() | st.text(max_size=10) | st.integers(),
    "payload": st.none() | st.dictionaries(st.sampled_from(["order_id", "upto", "x"]), json_values, max_size=2),
    "session_id": st.none() | st.text(max_size=20),
    "tenant": st.sampled_from([None, "demo", "acme", "ghost"]),
    "idempotency_key": st.none() | st.text(max_size=20),
    "deadline_ms": st.none() | st.integers(min_value=-5, max_value=10**9) | st.text(max_size=5),
    "priority": st.sampled_from(["online", "batch", "urgent"]),
    "scope_tags": st.lists(st.text(max_size=5), max_size=3) | st.text(max_size=5),
    "unknown_field": json_values,
}
plausible = {
    "capability": st.sampled_from(["query_order", "whoami", "count", "refuse", "missing_one"]),
    "payload": st.fixed_dictionaries({}, optional={"order_id": st.text(max_size=8), "upto": st.integers(-2, 3)}),
    "session_id": st.none() | st.text(max_size=8),
    "idempotency_key": st.none() | st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=8),
    "deadline_ms": st.none() | st.integers(min_value=0, max_value=5000),
    "priority": st.sampled_from(["online", "batch"]),
    "scope_tags": st.lists(st.sampled_from(["orders", "billing"]), max_size=2),
    "intent": st.none() | st.sampled_from(["lookup", "refund"]),
}
bodies = (
    st.fixed_dictionaries({"capability": plausible.pop("capability")}, optional=plausible)
    | st.fixed_dictionaries({}, optional=fields)
    | json_values
)
header_values = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=30) | st.binary(
    max_size=40
).map(lambda raw: bytes(b for b in raw if b not in b"\r\n\x00"))
"""Printable ASCII, and raw bytes (latin-1 and control characters) as a hostile client sends them."""
headers = st.fixed_dictionaries(
    {
        "Authorization": st.sampled_from(["Bearer tok-demo"] * 4 + ["Bearer tok-acme", "Bearer bad", "Basic x", ""]),
        "Content-Type": st.sampled_from(["application/json"] * 4 + ["application/json; charset=utf-8", "text/plain"]),
    },
    optional={
        name: header_values
        for name in (
            "X-Reach-Deadline",
            "X-Reach-Hops",
            "X-Reach-Target",
            "X-Reach-Prefer",
            "X-Reach-Via",
            "X-Reach-Source",
            "X-Reach-Retry",
            "Idempotency-Key",
            "X-Tenant",
            "traceparent",
            "tracestate",
            "Content-Length",
        )
    },
)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with serve_agents(("orders", "o1")) as agents:
        path: Path = tmp_path_factory.mktemp("fuzz") / "agents.yaml"
        config = write_config(path, {"orders": [agents[0].url]}, demo_tenants())
        with TestClient(create_app(config, environ=TOKENS), raise_server_exceptions=False) as client:
            yield client


def check(answer: Any) -> None:
    assert answer.status_code in ALLOWED, (answer.status_code, answer.text)
    if answer.status_code != 200 and answer.headers["content-type"].startswith("application/json"):
        error = answer.json()["error"]
        assert error["type"] and error["message"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, sent=headers)
def test_any_json_body_gets_a_named_answer(gateway: TestClient, body: Any, sent: dict[str, str]) -> None:
    """Any JSON body with any reach headers gets 200 or a 4xx/503/504 JSON error naming the problem."""
    check(gateway.post("/v1/reach", content=json.dumps(body), headers=sent))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=64))
def test_any_bytes_get_a_named_answer(gateway: TestClient, raw: bytes) -> None:
    """Bytes that are not JSON (or not an object) are a 400 that says the body is not valid."""
    answer = gateway.post("/v1/reach", content=raw, headers=DEMO)
    check(answer)
    if answer.status_code == 400:
        assert "body" in answer.json()["error"]["message"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_stream_endpoint_never_fails_with_500(gateway: TestClient, body: Any) -> None:
    """The SSE endpoint refuses bad input the same way before any stream starts."""
    check(gateway.post("/v1/reach/stream", content=json.dumps(body), headers=DEMO))


def test_invalid_fields_are_named(gateway: TestClient) -> None:
    """A wrong field is named with its path, and an unknown field is refused rather than ignored."""
    answer = gateway.post(
        "/v1/reach",
        json={"capability": "query_order", "payload": [1], "colour": "red"},
        headers=DEMO,
    )
    message = answer.json()["error"]["message"]
    assert answer.status_code == 400
    assert "payload" in message and "colour" in message


# ---------------------------------------------------------------------- the table's gateway rows, over real sockets

LEAKY = [
    ("nested JSON, no token", b"[" * 5000 + b"]" * 5000, {}),
    ("nested JSON", b'{"capability": "query_order", "payload": {"a": ' + b"[" * 5000 + b"]" * 5000 + b"}}", {}),
    ("lone surrogate", b'{"capability": "query_order", "payload": {"order_id": "\\ud800"}}', {}),
    (
        "8 KB Idempotency-Key",
        b'{"capability": "query_order", "payload": {"order_id": "k"}}',
        {"Idempotency-Key": "k" * 8192},
    ),
    ("deadline superscript two", b'{"capability": "query_order", "payload": {}}', {"X-Reach-Deadline": b"\xb2"}),
    ("deadline nan", b'{"capability": "query_order", "payload": {}}', {"X-Reach-Deadline": "nan"}),
    ("list session_id", b'{"capability": "query_order", "session_id": ["a"]}', {}),
    ("dict tenant", b'{"capability": "query_order", "tenant": {"a": 1}}', {}),
    ("NaN in payload", b'{"capability": "query_order", "payload": {"order_id": NaN}}', {}),
    ("Infinity in payload", b'{"capability": "query_order", "payload": {"x": -Infinity}}', {}),
]


class Served:
    """A gateway (in-process uvicorn, small limits so the tests are quick) in front of one orders agent."""

    def __init__(self, server: BackgroundServer) -> None:
        self.server = server

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port

    def inflight(self) -> float:
        text = httpx.get(f"{self.url}/metrics").text
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith("reach_gateway_inflight")))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(
            tmp_path_factory.mktemp("hostile") / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants()
        )
        app = create_app(config, environ=TOKENS, max_inflight=4, limits=InputLimits(body_timeout=1.0))
        with BackgroundServer(app, proxy_headers=False, header_timeout=1.0) as server:
            yield Served(server)


def good(served: Served) -> httpx.Response:
    return httpx.post(
        f"{served.url}/v1/reach", json={"capability": "query_order", "payload": {"order_id": "ok"}}, headers=DEMO
    )


@pytest.mark.parametrize("path", ["/v1/reach", "/v1/reach/stream"])
def test_bad_input_is_a_4xx_and_never_leaks_a_place_in_flight(served: Served, path: str) -> None:
    """Each input of the table that once leaked the in-flight count is a 4xx on both endpoints; the count returns."""
    for name, body, extra in LEAKY * 2:
        sent = dict(DEMO) if name != "nested JSON, no token" else {"Content-Type": "application/json"}
        answer = httpx.post(f"{served.url}{path}", content=body, headers={**sent, **extra})
        assert 400 <= answer.status_code < 500, (name, answer.status_code, answer.text)
        assert answer.json()["error"]["message"], name
    assert served.inflight() == 0
    assert good(served).status_code == 200


def test_a_stream_abandoned_by_its_caller_releases_its_place(tmp_path: Path) -> None:
    """Callers that open an endless stream and hang up after one event leave the gateway's in-flight count at 0."""
    ticker = ReachAgent("ticker")

    @ticker.capability("tick")
    async def tick() -> AsyncIterator[int]:
        for n in range(100_000):
            yield n
            await asyncio.sleep(0.01)

    with BackgroundServer(ticker.app) as agent:
        config = write_config(
            tmp_path / "agents.yaml",
            {"ticker": {"endpoints": [agent.url], "capabilities": ["tick"]}},
            {"demo": {"token_env": "DEMO_TOKEN", "agents": "*"}},
        )
        with BackgroundServer(create_app(config, environ=TOKENS, max_inflight=4)) as gateway:
            served = Served(gateway)
            for _ in range(8):
                with (
                    httpx.Client(base_url=served.url) as http,
                    http.stream("POST", "/v1/reach/stream", json={"capability": "tick"}, headers=DEMO) as answer,
                ):
                    assert answer.status_code == 200
                    next(answer.iter_bytes())
            deadline = time.monotonic() + 5
            while served.inflight() != 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert served.inflight() == 0


def test_unauthenticated_flood_does_not_lock_the_gateway(served: Served) -> None:
    """1,100 unauthenticated 10 KB requests (nested JSON, to the stream endpoint) are 401s; then a tenant is served."""
    body = b"[" * 5000 + b"]" * 5000
    with httpx.Client(base_url=served.url) as http:
        statuses = {
            http.post("/v1/reach/stream", content=body, headers={"Content-Type": "application/json"}).status_code
            for _ in range(1100)
        }
    assert statuses == {401}
    assert served.inflight() == 0
    assert good(served).status_code == 200


def test_the_body_is_not_read_before_authentication(served: Served) -> None:
    """A 400 MB body without a token is answered 401 at once, and the connection is closed unread."""
    head = post_head("/v1/reach", {"Content-Type": "application/json", "Content-Length": "400000000"})
    started = time.monotonic()
    answer = raw_request(served.port, head, b"[" * 1000, timeout=5.0)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"connection: close" in answer.lower()
    assert time.monotonic() - started < 4.0


def test_a_declared_oversize_body_is_refused_before_it_is_read(served: Served) -> None:
    """A tenant's Content-Length over the limit is a 413 naming the limit, answered before the body is sent."""
    head = post_head("/v1/reach", {**DEMO, "Content-Length": str(400 * 1024 * 1024)})
    answer = raw_request(served.port, head, timeout=5.0)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"at most 1048576" in answer


def test_a_chunked_oversize_body_is_cut_at_the_limit(served: Served) -> None:
    """A chunked body is counted as it arrives: 413 once it passes 1 MiB, whatever it would have grown to."""

    def chunks() -> Iterator[bytes]:
        for _ in range(200):
            yield b" " * 65536

    try:
        answer = httpx.post(f"{served.url}/v1/reach", content=chunks(), headers=DEMO, timeout=10.0)
    except httpx.TransportError:
        return  # the server closed while we were still sending: it stopped reading, which is the point
    assert answer.status_code == 413


def test_slow_headers_are_dropped(served: Served) -> None:
    """50 sockets trickling a request head (slowloris) are all closed by the gateway within its header timeout."""
    sockets = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(50)]
    try:
        for sock in sockets:
            sock.sendall(b"POST /v1/reach HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.sendall(b"X-A: b\r\n")
        assert all(closed_by_server(sock, within=max(0.1, 6.0 - (time.monotonic() - started))) for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()
    assert good(served).status_code == 200


def test_an_idle_connection_without_a_request_is_dropped(served: Served) -> None:
    """A socket that connects and says nothing is closed after the header timeout, not held forever."""
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        assert closed_by_server(sock, within=6.0)


def test_a_stalled_body_is_answered_408(served: Served) -> None:
    """Headers whole, body stalled after 10 of 100 bytes: 408 within the body timeout, connection closed."""
    head = post_head("/v1/reach", {**DEMO, "Content-Length": "100"})
    answer = raw_request(served.port, head, b'{"capabil', timeout=6.0)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


def test_an_oversized_head_is_refused(served: Served) -> None:
    """A request head past 32 KiB gets 431 and a closed connection, not an ever-growing buffer."""
    head = post_head("/v1/reach", {**DEMO, **{f"X-Pad-{i}": "p" * 1000 for i in range(40)}})
    answer = raw_request(served.port, head, timeout=5.0)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]


def test_body_bytes_sent_with_the_head_never_count_as_head(served: Served) -> None:
    """A small head and a 600 KB body written in one go is served: only bytes before the blank line are head."""
    body = json.dumps({"capability": "query_order", "payload": {"order_id": "big", "pad": "p" * 600_000}}).encode()
    head = post_head("/v1/reach", {**DEMO, "Content-Length": str(len(body)), "Connection": "close"})
    answer = raw_request(served.port, head, body)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


@pytest.mark.parametrize("name", ["Authorization", "X-Tenant"])
def test_a_duplicated_auth_header_is_400(served: Served, name: str) -> None:
    """Two Authorization or X-Tenant headers are refused (400 naming the header): no last-one-wins."""
    value = "Bearer tok-demo" if name == "Authorization" else "demo"
    head = post_head("/v1/reach", {**DEMO, "Content-Length": "2"}).replace(
        b"\r\n\r\n", f"\r\n{name}: {value}\r\n\r\n".encode()
    )
    if name == "X-Tenant":
        head = head.replace(b"\r\n\r\n", b"\r\nX-Tenant: acme\r\n\r\n")
    answer = raw_request(served.port, head, b"{}", timeout=5.0)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert f"header {name.lower()} appears more than once".encode() in answer


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain"])
def test_a_post_without_json_content_type_is_415(served: Served, content_type: str | None) -> None:
    """A browser form post (or no Content-Type) is refused with 415 saying what to send."""
    headers = {"Authorization": "Bearer tok-demo"} | ({"Content-Type": content_type} if content_type else {})
    answer = httpx.post(f"{served.url}/v1/reach", content=b'{"capability": "query_order"}', headers=headers)
    assert answer.status_code == 415
    assert "application/json" in answer.json()["error"]["message"]


def test_bad_input_logs_no_traceback(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """Malformed requests leave no warning or traceback in the server's log (debug level at most)."""
    caplog.set_level(logging.DEBUG)
    for _name, body, extra in LEAKY:
        httpx.post(f"{served.url}/v1/reach", content=body, headers={**DEMO, **extra})
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or (r.exc_info and r.levelno > logging.DEBUG)]
    assert loud == []


def test_four_concurrent_oversize_bodies_cost_at_most_three_body_limits(tmp_path: Path) -> None:
    """A gateway process's peak RSS grows by <= 3 MiB (3x its 1 MiB limit) under 4 concurrent 100 MB bodies."""
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        with server_process("gateway", config) as gateway:
            for _ in range(20):
                assert (
                    httpx.post(
                        f"{gateway.url}/v1/reach",
                        json={"capability": "query_order", "payload": {"order_id": "w"}},
                        headers=DEMO,
                    ).status_code
                    == 200
                )
            before = gateway.peak_rss()

            def oversize(chunked: bool) -> None:
                head = {**DEMO, **({"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(100 << 20)})}
                with socket.create_connection(("127.0.0.1", gateway.port)) as sock:
                    sock.sendall(post_head("/v1/reach", head))
                    block = b"10000\r\n" + b" " * 65536 + b"\r\n" if chunked else b" " * 65536
                    with contextlib.suppress(OSError):
                        for _ in range(1600):
                            sock.sendall(block)

            with ThreadPoolExecutor(8) as pool:
                list(pool.map(oversize, [True, False] * 4))
            growth = gateway.peak_rss() - before
    print(f"peak RSS growth {growth / (1 << 20):.2f} MiB")
    assert growth <= 3 * (1 << 20), f"peak RSS grew by {growth / (1 << 20):.1f} MiB"
