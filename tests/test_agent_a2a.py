"""A ReachAgent answers A2A: the official ``a2a-sdk`` 1.x client and Reach's own a2a adapter both reach it."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from peer_servers import PEER_PYTHON, PEERS
from servers import _missing

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.errors import BusinessError
from reach_plugins.model import AgentDescriptor
from reach_plugins.registry.memory import MemoryRegistry
from transports.direct import DirectTransport

agent = ReachAgent("kb", tokens="open")
"""Open: the official A2A client (a foreign peer) carries no Reach token."""
EXECUTED: list[dict[str, Any]] = []


@agent.capability("search_kb", description="Search the knowledge base")
def search_kb(query: str, lang: str = "en") -> dict[str, Any]:
    EXECUTED.append({"query": query, "lang": lang})
    if query == "forbidden":
        raise BusinessError("that topic is off limits")
    return {"reply_content": f"found {query} ({lang})", "hits": 2}


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    with BackgroundServer(agent.app) as server:
        yield server.url


def stock_client(url: str, text: str, data: dict[str, Any], mode: str) -> dict[str, Any]:
    """What the official a2a-sdk client saw: its stream responses and the task read back with GetTask."""
    if not PEER_PYTHON.exists():
        _missing("the peers' virtualenv is missing (scripts/setup.sh builds it)")
    done = subprocess.run(
        [str(PEER_PYTHON), str(PEERS / "a2a_client.py"), url, text, json.dumps(data), mode],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("mode", ["send", "stream"])
def test_the_official_a2a_client_reaches_a_reach_agent(served: str, mode: str) -> None:
    """The stock 1.x client reads the card, sends a message and gets a completed task whose artifact is the result."""
    seen = stock_client(served, "refunds", {"lang": "fr"}, mode)
    task = seen["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    parts = task["artifacts"][0]["parts"]
    assert parts[0]["text"] == "found refunds (fr)"
    assert parts[1]["data"]["hits"] == 2
    assert EXECUTED[-1] == {"query": "refunds", "lang": "fr"}


def test_a_business_error_is_a_failed_task(served: str) -> None:
    """A handler's business error is a failed task whose status message says why."""
    seen = stock_client(served, "forbidden", {}, "send")
    status = seen["task"]["status"]
    assert status["state"] == "TASK_STATE_FAILED"
    assert status["message"]["parts"][0]["text"] == "that topic is off limits"


@pytest.mark.parametrize("version", ["1.0", "0.3"])
async def test_reachs_own_a2a_adapter_reaches_a_reach_agent(served: str, version: str) -> None:
    """Round trip: protocol a2a (either dialect) to a ReachAgent gives the handler's answer."""
    registry = MemoryRegistry()
    await registry.register_agent(
        AgentDescriptor(
            name="kb",
            protocol="a2a",
            endpoints=[served],
            capabilities=["search_kb"],
            protocol_options={"version": version},
        )
    )
    async with ReachClient(registry=registry, transport=DirectTransport()) as client:
        answer = await client.reach("search_kb", {"query": "returns", "lang": "de"}, session_id="s-1")
        events = [event async for event in client.stream("search_kb", {"query": "refunds"}, session_id="s-2")]
    assert answer.status == "success", answer.error
    assert answer.data["reply_content"] == "found returns (de)"
    assert [e.data["reply_content"] for e in events if e.kind == "data"] == ["found refunds (en)"]
    assert events[-1].kind == "end"


def test_get_and_cancel_answer_in_the_dialect_asked(served: str) -> None:
    """tasks/get reads a task back in 0.3 shape; a finished task is not cancelable; an unknown one is not found."""

    def rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = httpx.post(
            f"{served}/a2a", json={"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
        ).json()
        return answer

    message = {"kind": "message", "messageId": "m-9", "role": "user", "parts": [{"kind": "text", "text": "tea"}]}
    sent = rpc("message/send", {"message": message})["result"]
    read = rpc("tasks/get", {"id": sent["id"]})["result"]
    assert (read["kind"], read["status"]["state"], read["artifacts"][0]["parts"][0]) == (
        "task",
        "completed",
        {"kind": "text", "text": "found tea (en)"},
    )
    assert rpc("CancelTask", {"id": sent["id"]})["error"]["code"] == -32002
    assert rpc("GetTask", {"id": "never"})["error"]["code"] == -32001
