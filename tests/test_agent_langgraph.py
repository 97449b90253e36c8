"""A compiled LangGraph agent served as a ``chat`` capability: normalised replies, one thread per session."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph

from reach_plugins.agent import ReachAgent, add_langgraph


def reply(state: MessagesState) -> dict[str, Any]:
    """Echo the last message, counting the turns this thread has seen; ask for a tool when told to."""
    said = state["messages"][-1].content
    if said == "look it up":
        call = {"id": "t1", "name": "query_order", "args": {"order_id": "A1"}}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}
    return {"messages": [AIMessage(content=f"{said} (turn {len(state['messages']) // 2 + 1})")]}


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    agent = ReachAgent("assistant", tokens="open")
    add_langgraph(agent, builder.compile(checkpointer=InMemorySaver()))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=agent.app), base_url="http://a") as client:
        yield client


async def chat(http: httpx.AsyncClient, payload: dict[str, Any], session_id: str) -> dict[str, Any]:
    body = {"request_id": "r", "capability": "chat", "payload": payload, "session_id": session_id}
    answer: dict[str, Any] = (await http.post("/reach", json=body)).json()
    return answer


async def test_graph_reply_is_normalised_and_threads_follow_sessions(http: httpx.AsyncClient) -> None:
    """The last AI message becomes reply_content; the session id is the graph's thread."""
    first = await chat(http, {"input": "hello"}, "s1")
    second = await chat(http, {"messages": [{"role": "user", "content": "again"}]}, "s1")
    other = await chat(http, {"input": "hi"}, "s2")
    assert first["data"]["reply_content"] == "hello (turn 1)"
    assert second["data"]["reply_content"] == "again (turn 2)"
    assert other["data"]["reply_content"] == "hi (turn 1)"
    assert (first["data"]["tool_calls"], second["data"]["raw_meta"]["messages"]) == ([], 4)


async def test_graph_tool_calls_are_normalised(http: httpx.AsyncClient) -> None:
    """Tool calls of the last message come back as id, name and arguments."""
    answer = await chat(http, {"input": "look it up"}, "s3")
    assert answer["data"]["tool_calls"] == [{"id": "t1", "name": "query_order", "arguments": {"order_id": "A1"}}]


async def test_chat_needs_messages_or_input(http: httpx.AsyncClient) -> None:
    """A chat call with neither messages nor input is refused with a message naming both."""
    answer = await chat(http, {}, "s4")
    assert answer["status"] == "fail"
    assert "'messages'" in answer["error"]["message"]
    assert "'input'" in answer["error"]["message"]
