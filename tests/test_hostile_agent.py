"""The agent SDK under hostile callers: bounded bodies, strict JSON, tenant-namespaced sessions, no leaked errors."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from hostile_agent_app import SECRET_DSN, agent
from hostile_support import closed_by_server, post_head, raw_request, server_process
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.server.inbound import InputLimits
from reach_plugins.stores.budget import DEFAULT_BUDGET
from reach_plugins.stores.snapshots import MemorySnapshotStore

HERE = Path(__file__).parent
JSON = {"Content-Type": "application/json"}


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with (
        agent.lifespan(),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=agent.app), base_url="http://a") as client,
    ):
        yield client


def reach(capability: str, payload: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"request_id": "r", "capability": capability, "payload": payload, **fields}


async def test_a_tenant_cannot_read_another_tenants_session(http: httpx.AsyncClient) -> None:
    """Tenant B naming tenant A's session id gets an empty state, not A's note (by header or by body field)."""
    await http.post(
        "/reach", json=reach("note", {"text": "A's secret note"}, session_id="shared"), headers={"X-Tenant": "a"}
    )
    by_header = await http.post("/reach", json=reach("note", {}, session_id="shared"), headers={"X-Tenant": "b"})
    by_body = await http.post("/reach", json=reach("note", {}, session_id="shared", tenant="b"))
    own = await http.post("/reach", json=reach("note", {}, session_id="shared"), headers={"X-Tenant": "a"})
    assert by_header.json()["data"] == {"note": None}
    assert by_body.json()["data"] == {"note": None}
    assert own.json()["data"] == {"note": "A's secret note"}


async def test_the_session_table_is_bounded_and_evicts_the_oldest(http: httpx.AsyncClient) -> None:
    """200 new session ids keep at most 50 states (the agent's max_sessions): the oldest go, the latest stay."""
    for n in range(200):
        await http.post(
            "/reach", json=reach("note", {"text": f"n{n}"}, session_id=f"flood-{n}"), headers={"X-Tenant": "f"}
        )
    assert len(agent.sessions) <= 50
    latest = await http.post("/reach", json=reach("note", {}, session_id="flood-199"), headers={"X-Tenant": "f"})
    oldest = await http.post("/reach", json=reach("note", {}, session_id="flood-0"), headers={"X-Tenant": "f"})
    assert (latest.json()["data"]["note"], oldest.json()["data"]["note"]) == ("n199", None)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"session_id": "s" * 1_000_000}, "session_id"),
        ({"session_id": ["a"]}, "session_id"),
        ({"tenant": {"a": 1}}, "tenant"),
    ],
)
async def test_a_bad_session_key_is_a_400_naming_the_field(
    http: httpx.AsyncClient, fields: dict[str, Any], named: str
) -> None:
    """A 1 MB, list or dict session id or tenant is refused with 400 naming the field, and stores nothing."""
    before = len(agent.sessions)
    answer = await http.post("/reach", json=reach("note", {"text": "x"}, **fields))
    assert answer.status_code == 400 and named in answer.json()["error"]["message"]
    assert len(agent.sessions) == before


async def test_snapshots_keep_sessions_apart_by_tenant() -> None:
    """A restarted agent restores each tenant's state under that tenant only."""
    store = MemorySnapshotStore(budget=DEFAULT_BUDGET)
    first = ReachAgent("notes", snapshots=store, tokens="open")
    first.capability("note")(agent._handlers["note"].fn)
    async with first.lifespan():
        first.sessions.state("a", "s1")["note"] = "for a"
    second = ReachAgent("notes", snapshots=store, tokens="open")
    async with second.lifespan():
        assert second.sessions.state("a", "s1") == {"note": "for a"}
        assert second.sessions.state("b", "s1") == {}


async def test_a_handler_exception_text_never_reaches_the_caller(
    http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler failing with a credentialed URL answers an error id; the URL is only in the agent's own log."""
    caplog.set_level(logging.DEBUG)
    answer = await http.post("/reach", json=reach("connect", {}))
    stream = await http.post("/reach/stream", json=reach("connect_stream", {}))
    assert answer.status_code == 500
    for text in (answer.text, stream.text):
        assert "PaSsWoRd" not in text and "error id" in text
    error_id = answer.json()["error"]["message"].rpartition("error id ")[2]
    logged = [r for r in caplog.records if error_id in r.getMessage()]
    assert logged and SECRET_DSN in str(logged[0].exc_info[1])


@pytest.mark.parametrize(
    "raw",
    [
        b'{"capability": "note", "payload": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"capability": "note", "payload": {"text": NaN}}',
        b'{"capability": "note", "payload": {"text": "\\ud800"}}',
        b'{"capability": "note", "payload": {"text": Infinity}}',
    ],
    ids=["nested", "nan", "surrogate", "infinity"],
)
async def test_malformed_json_is_a_400(http: httpx.AsyncClient, raw: bytes) -> None:
    """Deep nesting, NaN/Infinity and lone surrogates are 400s saying what is wrong, never a 500."""
    answer = await http.post("/reach", content=raw, headers=JSON)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
bodies = (
    st.fixed_dictionaries(
        {},
        optional={
            "request_id": json_values,
            "capability": st.sampled_from(["note", "connect", "nope"]) | json_values,
            "payload": json_values,
            "session_id": json_values,
            "tenant": json_values,
            "idempotency_key": json_values,
            "deadline_ms": json_values,
            "action": json_values,
        },
    )
    | json_values
)
printable = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
headers = st.fixed_dictionaries(
    {},
    optional={
        "X-Tenant": printable,
        "X-Reach-Deadline": printable,
        "X-Reach-Hops": printable,
        "Idempotency-Key": printable,
        "traceparent": printable,
    },
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, sent=headers)
async def test_any_body_and_headers_get_a_named_answer(
    http: httpx.AsyncClient, body: Any, sent: dict[str, str]
) -> None:
    """Generated bodies and headers: 200, or a 4xx/504 JSON error naming the problem; 5xx only for a failing handler."""
    answer = await http.post("/reach", content=json.dumps(body), headers={**JSON, **sent})
    capability = body.get("capability") if isinstance(body, dict) else None
    assert answer.status_code < 500 or answer.status_code == 504 or capability == "connect", answer.text
    assert answer.json()["error"] is None or answer.json()["error"]["message"]


def test_oversize_bodies_cost_at_most_three_body_limits() -> None:
    """An agent process's peak RSS grows by <= 3 MiB (3x its 1 MiB limit) under 4 concurrent 100 MB bodies."""
    with server_process("agent", "hostile_agent_app:agent", cwd=HERE) as server:
        for _ in range(20):
            assert httpx.post(f"{server.url}/reach", json=reach("note", {})).status_code == 200
        before = server.peak_rss()

        def oversize(chunked: bool) -> None:
            head = {**JSON, **({"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(100 << 20)})}
            with socket.create_connection(("127.0.0.1", server.port)) as sock:
                sock.sendall(post_head("/reach", head))
                block = b"10000\r\n" + b" " * 65536 + b"\r\n" if chunked else b" " * 65536
                with contextlib.suppress(OSError):
                    for _ in range(1600):
                        sock.sendall(block)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(oversize, [True, False] * 4))
        growth = server.peak_rss() - before
        declared = raw_request(server.port, post_head("/reach", {**JSON, "Content-Length": str(400 << 20)}))
    assert declared.startswith(b"HTTP/1.1 413"), declared[:100]
    print(f"peak RSS growth {growth / (1 << 20):.2f} MiB")
    assert growth <= 3 * (1 << 20), f"peak RSS grew by {growth / (1 << 20):.1f} MiB"


def test_slow_clients_are_dropped_by_the_agent_server() -> None:
    """The agent's server closes a silent socket and a stalled body, as the gateway does."""
    limited = ReachAgent("slow", limits=InputLimits(body_timeout=1.0), tokens="open")
    limited.capability("note")(agent._handlers["note"].fn)
    with BackgroundServer(limited.app, header_timeout=1.0) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            assert closed_by_server(sock, within=6.0)
        stalled = raw_request(
            server.port, post_head("/reach", {**JSON, "Content-Length": "100"}), b'{"cap', timeout=6.0
        )
    assert stalled.startswith(b"HTTP/1.1 408"), stalled[:100]
