"""The echo agent the Python peers proxy to in ``bench_hops.py``: a real OpenAI-style and MCP server.

ContextForge registers it with the official MCP client's handshake, so the
official ``mcp`` client (from the peers' venv) must list and call its tool;
LiteLLM parses its chat completion, so the body must be a well-formed one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from peer_servers import PEER_PYTHON, PEERS
from servers import _missing, free_port, interrupt, wait_until

AGENT = Path(__file__).resolve().parent.parent / "benchmarks" / "peer_agent.py"


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 405
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def agent_url() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, str(AGENT), str(port)])
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: answers(f"{url}/mcp"), 15, "the echo agent listening")
        yield url
    finally:
        interrupt(process)


def test_the_official_mcp_client_lists_and_calls_the_echo_tool(agent_url: str) -> None:
    """initialize, tools/list and tools/call over Streamable HTTP, answered as JSON without a session."""
    if not PEER_PYTHON.exists():
        _missing("the peers' virtualenv is missing (scripts/setup.sh builds it)")
    calls = json.dumps([["echo", {"order_id": "A7"}]])
    done = subprocess.run(
        [str(PEER_PYTHON), str(PEERS / "mcp_client.py"), f"{agent_url}/mcp", "unused", calls],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    seen = json.loads(done.stdout)
    assert [tool["name"] for tool in seen["tools"]] == ["echo"]
    (result,) = seen["results"]
    assert result["content"] == [{"type": "text", "text": "A7"}]
    assert result["structuredContent"] == {"order_id": "A7"}


def test_a_chat_completion_answers_the_last_message(agent_url: str) -> None:
    """The assistant's content is the last message's, in an OpenAI chat.completion body."""
    messages = [{"role": "system", "content": "x"}, {"role": "user", "content": "B2"}]
    body = httpx.post(f"{agent_url}/v1/chat/completions", json={"model": "echo", "messages": messages}).json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "B2"}
    assert body["choices"][0]["finish_reason"] == "stop"


def test_a_notification_is_accepted_without_an_answer(agent_url: str) -> None:
    """A JSON-RPC message without an id (notifications/initialized) gets 202 and no body."""
    answer = httpx.post(f"{agent_url}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert answer.status_code == 202
    assert answer.content == b""
