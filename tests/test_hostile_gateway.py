"""Fuzzing the gateway: whatever arrives, the answer is a JSON error naming the problem (4xx), never a 500."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hop_support import TOKENS, demo_tenants, serve_agents, write_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from reach_plugins.gateway import create_app

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
header_values = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=30)
headers = st.fixed_dictionaries(
    {
        "Authorization": st.sampled_from(["Bearer tok-demo"] * 4 + ["Bearer tok-acme", "Bearer bad", "Basic x", ""]),
        "Content-Type": st.sampled_from(["application/json"] * 4 + ["application/json; charset=utf-8", "text/plain"]),
    },
    optional={
        "X-Reach-Deadline": header_values,
        "X-Reach-Hops": header_values,
        "X-Reach-Target": header_values,
        "X-Reach-Prefer": header_values,
        "Idempotency-Key": header_values,
        "X-Tenant": st.sampled_from(["demo", "acme", "ghost"]),
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
