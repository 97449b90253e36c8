"""A LlamaIndex agent served as a ``chat`` capability: normalised replies, one Context and history per session.

No ``from __future__ import annotations`` here: LlamaIndex finds the ``ctx:
Context`` parameter of a tool function by its annotation, which must stay a
class, not a string.
"""

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent
from llama_index.core.base.llms.types import ToolCallBlock
from llama_index.core.llms import ChatMessage, MessageRole
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.workflow import Context

from reach_plugins.agent import MemorySnapshotStore, ReachAgent
from reach_plugins.agent.llamaindex import STATE_KEY, add_llamaindex
from reach_plugins.errors import ConfigError
from reach_plugins.stores.budget import DEFAULT_BUDGET


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def visit(ctx: Context) -> int:
    """Count this conversation's visits in the workflow state."""
    visits = await ctx.store.get("visits", default=0) + 1
    await ctx.store.set("visits", visits)
    return int(visits)


def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
    """Call the tool a user names ('add 2 3', 'visit'), say what a tool answered, else echo with the turn number."""
    last = messages[-1]
    if last.role == MessageRole.TOOL:
        return ChatMessage(role="assistant", content=f"tool said: {last.content}")
    said = last.content or ""
    if said.startswith("add "):
        a, b = (int(word) for word in said.split()[1:3])
        return ChatMessage(
            role="assistant",
            blocks=[ToolCallBlock(tool_call_id="c-add", tool_name="add", tool_kwargs={"a": a, "b": b})],
        )
    if said == "visit":
        return ChatMessage(
            role="assistant", blocks=[ToolCallBlock(tool_call_id="c-visit", tool_name="visit", tool_kwargs={})]
        )
    turn = sum(message.role == MessageRole.USER for message in messages)
    return ChatMessage(role="assistant", content=f"{said} (turn {turn})")


def assistant(snapshots: MemorySnapshotStore | None = None, **options: Any) -> ReachAgent:
    agent = ReachAgent("assistant", snapshots=snapshots, tokens="open")
    llm = MockFunctionCallingLLM(response_generator=respond)
    add_llamaindex(agent, FunctionAgent(tools=[add, visit], llm=llm), **options)
    return agent


def client_of(agent: ReachAgent) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=agent.app), base_url="http://agent")


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with client_of(assistant()) as client:
        yield client


async def chat(http: httpx.AsyncClient, payload: dict[str, Any], session_id: str | None) -> dict[str, Any]:
    body = {"request_id": "r", "capability": "chat", "payload": payload, "session_id": session_id}
    answer: dict[str, Any] = (await http.post("/reach", json=body)).json()
    return answer


async def reply(http: httpx.AsyncClient, text: str, session_id: str | None) -> str:
    answer = await chat(http, {"input": text}, session_id)
    assert answer["status"] == "success", answer
    return str(answer["data"]["reply_content"])


async def test_reply_is_normalised_and_history_follows_sessions(http: httpx.AsyncClient) -> None:
    """The agent's answer becomes reply_content; each session id is its own conversation."""
    first = await chat(http, {"input": "hello"}, "s1")
    second = await chat(http, {"messages": [{"role": "user", "content": "again"}]}, "s1")
    other = await reply(http, "hi", "s2")
    assert first["data"] == {
        "reply_content": "hello (turn 1)",
        "tool_calls": [],
        "raw_meta": {"agent": "Agent", "messages": 2},
    }
    assert (second["data"]["reply_content"], second["data"]["raw_meta"]["messages"]) == ("again (turn 2)", 4)
    assert other == "hi (turn 1)"


async def test_tool_calls_are_normalised(http: httpx.AsyncClient) -> None:
    """Tools the agent ran come back as id, name and arguments; the answer is the agent's last word."""
    answer = await chat(http, {"input": "add 2 3"}, "s3")
    assert answer["data"]["reply_content"] == "tool said: 5"
    assert answer["data"]["tool_calls"] == [{"id": "c-add", "name": "add", "arguments": {"a": 2, "b": 3}}]


async def test_workflow_state_is_kept_per_session(http: httpx.AsyncClient) -> None:
    """What tools write into the workflow Context stays with the session, not with the agent."""
    assert [await reply(http, "visit", "s4") for _ in range(2)] == ["tool said: 1", "tool said: 2"]
    assert await reply(http, "visit", "s5") == "tool said: 1"


async def test_calls_without_a_session_keep_nothing(http: httpx.AsyncClient) -> None:
    """Without a session id every call starts a fresh conversation."""
    assert [await reply(http, "hello", None) for _ in range(2)] == ["hello (turn 1)", "hello (turn 1)"]


async def test_concurrent_calls_of_one_session_keep_every_turn(http: httpx.AsyncClient) -> None:
    """Calls of one session run one at a time, so none overwrites another's turn."""
    await asyncio.gather(*(reply(http, f"message {n}", "s6") for n in range(3)))
    assert await reply(http, "last", "s6") == "last (turn 4)"


async def test_sessions_survive_a_restart_through_snapshots() -> None:
    """History and workflow state are JSON in the session state, so a snapshot store restores them."""
    store = MemorySnapshotStore(budget=DEFAULT_BUDGET)
    before = assistant(store)
    async with before.lifespan(), client_of(before) as http:
        await reply(http, "hello", "s7")
        await reply(http, "visit", "s7")
    after = assistant(store)
    async with after.lifespan(), client_of(after) as http:
        assert await reply(http, "again", "s7") == "again (turn 3)"
        assert await reply(http, "visit", "s7") == "tool said: 2"
    assert set(after.sessions["s7"][STATE_KEY]) == {"context", "history"}


async def test_history_is_trimmed_to_the_limit_at_a_user_turn() -> None:
    """history_limit bounds the kept messages; trimming never starts inside an exchange."""
    async with client_of(assistant(history_limit=5)) as http:
        for text in ("one", "two", "three"):
            await reply(http, text, "s8")
        answer = await chat(http, {"input": "four"}, "s8")
    assert answer["data"]["reply_content"] == "four (turn 3)"
    assert answer["data"]["raw_meta"]["messages"] == 4


async def test_agent_workflow_keeps_the_current_agent_per_session() -> None:
    """After a handoff the session stays with the agent it was handed to; raw_meta names who answered."""
    desk_calls: list[int] = []

    def desk(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        desk_calls.append(1)
        call = ToolCallBlock(
            tool_call_id="h1", tool_name="handoff", tool_kwargs={"to_agent": "orders", "reason": "order"}
        )
        return ChatMessage(role="assistant", blocks=[call])

    workflow = AgentWorkflow(
        agents=[
            FunctionAgent(
                name="desk",
                description="front desk",
                llm=MockFunctionCallingLLM(response_generator=desk),
                can_handoff_to=["orders"],
            ),
            FunctionAgent(name="orders", description="orders", llm=MockFunctionCallingLLM(response_generator=respond)),
        ],
        root_agent="desk",
    )
    agent = ReachAgent("front", tokens="open")
    add_llamaindex(agent, workflow, capability="ask")
    async with client_of(agent) as http:
        answers = []
        for text in ("where is A1", "and A2"):
            body = {"request_id": "r", "capability": "ask", "payload": {"input": text}, "session_id": "s9"}
            answers.append((await http.post("/reach", json=body)).json()["data"])
    assert [answer["raw_meta"]["agent"] for answer in answers] == ["orders", "orders"]
    assert answers[1]["reply_content"] == "and A2 (turn 2)"
    assert len(desk_calls) == 1


async def test_bad_payloads_are_refused_with_what_to_send(http: httpx.AsyncClient) -> None:
    """Neither messages nor input, or a message with an unknown role, is refused naming what is expected."""
    empty = await chat(http, {}, "s10")
    roleless = await chat(http, {"messages": [{"content": "hi", "role": "wizard"}]}, "s10")
    assert (empty["status"], roleless["status"]) == ("fail", "fail")
    assert "'messages'" in empty["error"]["message"] and "'input'" in empty["error"]["message"]
    assert "role" in roleless["error"]["message"]


def test_history_limit_must_be_positive() -> None:
    """A history limit below one message is a ConfigError."""
    with pytest.raises(ConfigError, match="history_limit"):
        assistant(history_limit=0)
