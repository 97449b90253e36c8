"""Fuzzing what Reach serves to other protocols (an agent's ``/a2a``, the gateway's ``/mcp``): never a 5xx.

Whatever JSON-RPC arrives, the answer is a JSON-RPC error or result with a 2xx/4xx status.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hop_support import TOKENS, demo_tenants, write_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from reach_plugins.agent import ReachAgent
from reach_plugins.gateway import create_app

json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
parts = st.lists(
    st.fixed_dictionaries({}, optional={"text": json_values, "data": json_values, "kind": json_values}) | json_values,
    max_size=3,
)
message = st.fixed_dictionaries(
    {},
    optional={
        "messageId": json_values,
        "contextId": json_values,
        "taskId": json_values,
        "role": json_values,
        "parts": parts | json_values,
        "metadata": st.fixed_dictionaries({}, optional={"reach.capability": json_values}) | json_values,
    },
)
a2a_methods = st.sampled_from(
    ["SendMessage", "SendStreamingMessage", "GetTask", "CancelTask", "message/send", "tasks/get", "nope"]
)
a2a_bodies = (
    st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0"), "method": a2a_methods},
        optional={
            "id": json_values,
            "params": st.fixed_dictionaries({}, optional={"message": message, "id": json_values}) | json_values,
        },
    )
    | json_values
)
mcp_methods = st.sampled_from(["initialize", "tools/list", "tools/call", "ping", "notifications/initialized", "x"])
mcp_bodies = (
    st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0"), "method": mcp_methods},
        optional={
            "id": json_values,
            "params": st.fixed_dictionaries(
                {}, optional={"name": st.sampled_from(["query_order", "nope"]) | json_values, "arguments": json_values}
            )
            | json_values,
        },
    )
    | json_values
)

agent = ReachAgent("fuzzed", tokens="open")


@agent.capability("echo_text")
def echo_text(text: str, times: int = 1) -> str:
    return text * max(0, min(times, 3))


@pytest.fixture(scope="module")
def agent_client() -> Iterator[TestClient]:
    with TestClient(agent.app) as client:
        yield client


@pytest.fixture(scope="module")
def gateway_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, str]]:
    config = write_config(
        tmp_path_factory.mktemp("fuzz-mcp") / "agents.yaml",
        {"orders": {"endpoints": ["http://127.0.0.1:9"], "capabilities": ["query_order"]}},
        demo_tenants(),
    )
    with TestClient(create_app(Path(config), environ=TOKENS)) as client:
        answer = client.post(
            "/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
            headers={"Authorization": "Bearer tok-demo"},
        )
        yield client, answer.headers["mcp-session-id"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=a2a_bodies)
def test_agent_a2a_never_answers_5xx(agent_client: TestClient, body: Any) -> None:
    """Any JSON body to an agent's /a2a gets a JSON-RPC answer, never a server error."""
    answer = agent_client.post("/a2a", json=body)
    assert answer.status_code < 500, answer.text
    if answer.headers["content-type"].startswith("application/json"):
        assert "jsonrpc" in answer.json()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=mcp_bodies, with_session=st.booleans())
def test_gateway_mcp_never_answers_5xx(gateway_client: tuple[TestClient, str], body: Any, with_session: bool) -> None:
    """Any JSON body to the gateway's /mcp gets a 2xx/4xx answer, never a server error."""
    client, session = gateway_client
    headers = {"Authorization": "Bearer tok-demo", **({"Mcp-Session-Id": session} if with_session else {})}
    answer = client.post("/mcp", json=body, headers=headers)
    assert answer.status_code < 500, answer.text


@pytest.mark.parametrize(
    "params",
    [
        {"message": {"metadata": [1], "parts": []}},
        {"message": {}, "metadata": "x"},
        {"message": {"parts": [{"text": "hi"}], "contextId": {"a": 1}, "messageId": ["x"]}},
        {"message": {"parts": "x"}},
        {"message": [1]},
    ],
)
def test_agent_a2a_odd_shapes_are_json_rpc_answers(agent_client: TestClient, params: Any) -> None:
    """Metadata, context ids and parts of the wrong type are answered, never a 500."""
    answer = agent_client.post("/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params})
    assert answer.status_code == 200
    assert "result" in answer.json() or "error" in answer.json()


def test_deeply_nested_json_is_a_parse_error(agent_client: TestClient, gateway_client: tuple[TestClient, str]) -> None:
    """A body nested past Python's recursion limit is refused as JSON-RPC, not crashed on."""
    deep = b"[" * 100_000 + b"]" * 100_000
    client, _ = gateway_client
    assert agent_client.post("/a2a", content=deep).status_code < 500
    assert client.post("/mcp", content=deep, headers={"Authorization": "Bearer tok-demo"}).status_code < 500
