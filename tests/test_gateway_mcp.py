"""The gateway's ``/mcp`` endpoint reached by the official ``mcp`` client (run from the peers' virtualenv).

The tenant's token decides which capabilities are listed as tools; a tool
call goes through the gateway's routing to a real agent, which counts what it
executed.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hop_support import TOKENS, Agent, demo_tenants, serve_agents, write_config
from peer_servers import MCP1_PYTHON, PEER_PYTHON, PEERS
from servers import _missing

from reach_plugins.agent import BackgroundServer
from reach_plugins.gateway import create_app


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Agent]]]:
    with serve_agents(("orders", "o1"), ("tickets", "t1")) as agents:
        url = {agent.label: agent.url for agent in agents}
        tenants = demo_tenants(agents=["orders", "tickets"])
        config = write_config(
            tmp_path_factory.mktemp("gateway-mcp") / "agents.yaml",
            {
                "orders": {"endpoints": [url["o1"]], "capabilities": ["query_order", "refuse"]},
                "tickets": {"endpoints": [url["t1"]], "capabilities": ["whoami"]},
            },
            tenants,
        )
        with BackgroundServer(create_app(config, environ=TOKENS), proxy_headers=False) as server:
            yield server.url, {agent.label: agent for agent in agents}


def official_client(url: str, token: str, calls: list[list[Any]]) -> dict[str, Any]:
    """What the official mcp client saw: the tools listed and each call's result."""
    if not PEER_PYTHON.exists():
        _missing("the peers' virtualenv is missing (scripts/setup.sh builds it)")
    done = subprocess.run(
        [str(PEER_PYTHON), str(PEERS / "mcp_client.py"), f"{url}/mcp", token, json.dumps(calls)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_official_client_lists_the_tenants_capabilities_and_calls_one(
    gateway: tuple[str, dict[str, Agent]],
) -> None:
    """tools/list shows demo's capabilities; tools/call reaches the agent once and returns its data as JSON text
    (no structuredContent: query_order declares no return_schema for one to match)."""
    url, agents = gateway
    seen = official_client(url, TOKENS["DEMO_TOKEN"], [["query_order", {"order_id": "M1"}], ["refuse", {}]])
    assert [tool["name"] for tool in seen["tools"]] == ["query_order", "refuse", "whoami"]
    ok, refused = seen["results"]
    assert ok["isError"] is False
    assert json.loads(ok["content"][0]["text"]) == {"order_id": "M1", "by": "o1"}
    assert ok.get("structuredContent") is None
    assert refused["isError"] is True
    assert "already shipped" in refused["content"][0]["text"]
    assert agents["o1"].count("query_order") >= 1


def test_another_tenant_sees_only_its_agents(gateway: tuple[str, dict[str, Agent]]) -> None:
    """acme may reach orders only: tickets' whoami is not listed."""
    url, _ = gateway
    seen = official_client(url, TOKENS["ACME_TOKEN"], [])
    assert "whoami" not in [tool["name"] for tool in seen["tools"]]


def test_no_token_is_refused(gateway: tuple[str, dict[str, Agent]]) -> None:
    """Without the tenant's bearer token /mcp answers 401 and opens no session."""
    url, _ = gateway
    answer = httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
    assert answer.status_code == 401
    assert "mcp-session-id" not in answer.headers


def test_a_forged_session_is_unknown(gateway: tuple[str, dict[str, Agent]]) -> None:
    """A session id the gateway never issued (or another tenant's) is a 404: the client must initialize."""
    url, _ = gateway
    headers = {"Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}", "Mcp-Session-Id": "forged"}
    answer = httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=headers)
    assert answer.status_code == 404


def test_langchain_mcp_adapters_loads_the_gateways_tools_into_a_langgraph_agent(
    gateway: tuple[str, dict[str, Agent]],
) -> None:
    """langchain-mcp-adapters (mcp 1.x) lists the tenant's tools; a LangGraph agent's call reaches the agent."""
    url, agents = gateway
    if not MCP1_PYTHON.exists():
        _missing("the virtualenv .venv-mcp1 is missing (scripts/setup.sh builds it)")
    before = agents["o1"].count("query_order")
    done = subprocess.run(
        [
            str(MCP1_PYTHON),
            str(PEERS / "langchain_mcp_client.py"),
            f"{url}/mcp",
            TOKENS["DEMO_TOKEN"],
            "query_order",
            json.dumps({"order_id": "L1"}),
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    seen = json.loads(done.stdout)
    assert seen["tools"] == ["query_order", "refuse", "whoami"]
    assert len(seen["tool_messages"]) == 1 and '"order_id": "L1"' in str(seen["tool_messages"][0])
    assert agents["o1"].count("query_order") - before == 1


def test_mcp_calls_are_counted_in_the_gateways_metrics(gateway: tuple[str, dict[str, Agent]]) -> None:
    """/mcp answers appear in reach_gateway_requests_total under endpoint="mcp"."""
    url, _ = gateway
    httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}})
    metrics = httpx.get(f"{url}/metrics").text
    assert 'endpoint="mcp"' in metrics
