"""Reach in LlamaIndex's own way, against real agent-SDK servers: remote work in the workflow's event stream, and
approval through InputRequiredEvent / HumanResponseEvent.

No ``from __future__ import annotations`` (LlamaIndex reads tool annotations as classes).
"""

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from host_support import World, serve_langgraph_agent
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import ToolCallBlock
from llama_index.core.llms import ChatMessage
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.workflow import HumanResponseEvent, InputRequiredEvent

from reach_plugins.agent import ReachAgent
from reach_plugins.agent.llamaindex import add_llamaindex
from reach_plugins.llamaindex import ReachStreamEvent, enhance_agent


@pytest.fixture
def world() -> Iterator[World]:
    world = World()
    yield world
    world.close()


def llm(name: str, args: dict[str, Any], answer: str) -> MockFunctionCallingLLM:
    """Calls ``name`` once, then answers ``answer``."""
    turns: list[Any] = [[(name, args)], answer]

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        turn = turns.pop(0)
        if isinstance(turn, str):
            return ChatMessage(role="assistant", content=turn)
        blocks = [ToolCallBlock(tool_call_id=f"{tool}-1", tool_name=tool, tool_kwargs=kw) for tool, kw in turn]
        return ChatMessage(role="assistant", blocks=blocks)

    return MockFunctionCallingLLM(response_generator=respond)


async def test_remote_tokens_and_updates_are_workflow_events_while_the_tool_runs(world: World) -> None:
    """A remote LangGraph agent's tokens and node updates stream as ReachStreamEvents before the tool's result."""
    serve_langgraph_agent(world, "order-agent", "handle_order", ["Order A1 ships tomorrow."])
    agent = enhance_agent(
        FunctionAgent(tools=[], llm=llm("handle_order", {"message": "Where is A1?"}, "It ships.")), world.enhancer()
    )
    handler = agent.run("where is A1?")
    events = [event async for event in handler.stream_events()]
    assert str(await handler) == "It ships."
    result_at = next(i for i, event in enumerate(events) if isinstance(event, ToolCallResult))
    streamed = [event for event in events[:result_at] if isinstance(event, ReachStreamEvent)]
    tokens = "".join(event.text or "" for event in streamed if event.kind == "token" and event.agent == "order-agent")
    assert tokens == "Order A1 ships tomorrow."
    assert any(event.kind == "update" and event.node == "model" for event in streamed)
    result = events[result_at]
    assert isinstance(result, ToolCallResult) and result.tool_output.content == "Order A1 ships tomorrow."


@pytest.mark.parametrize(("said", "ran"), [("yes", [{"refund_order": "A1"}]), ("no, ask a manager", [])])
async def test_a_dangerous_call_asks_with_input_required_and_runs_once(world: World, said: str, ran: list[Any]) -> None:
    """InputRequiredEvent asks; the HumanResponseEvent with its waiter_id decides; an approved call runs once."""
    world.orders()
    agent = enhance_agent(
        FunctionAgent(tools=[], llm=llm("refund_order", {"order_id": "A1"}, "Handled.")), world.enhancer()
    )
    handler = agent.run("refund A1")
    asked: list[InputRequiredEvent] = []
    results: list[ToolCallResult] = []
    async for event in handler.stream_events():
        if isinstance(event, InputRequiredEvent):
            asked.append(event)
            assert world.ran == [], "sent before the answer"
            assert handler.ctx is not None
            handler.ctx.send_event(HumanResponseEvent(response=said, waiter_id=event.waiter_id))
        elif isinstance(event, ToolCallResult):
            results.append(event)
    assert str(await handler) == "Handled."
    (question,) = asked
    assert question.reach_approval == {
        "tool": "refund_order",
        "capability": "refund_order",
        "danger_level": "high",
        "args": {"order_id": "A1"},
        "asked_by": None,
    }
    assert world.ran == ran
    (result,) = results
    assert result.tool_output.is_error is (not ran)
    if not ran:
        assert "ask a manager" in str(result.tool_output.content)


async def test_a_served_llamaindex_agent_streams_its_tokens_to_a_llamaindex_caller(world: World) -> None:
    """A LlamaIndex agent served with add_llamaindex streams AgentStream deltas, attributed to it, into the caller's
    workflow events before the tool's result; the result is its reply, once."""
    served = ReachAgent("faq-agent", tokens="open")
    answer = "Returns are free for 30 days."
    add_llamaindex(
        served,
        FunctionAgent(
            tools=[],
            llm=MockFunctionCallingLLM(response_generator=lambda m, **k: ChatMessage(role="assistant", content=answer)),
        ),
    )
    world.serve(served)
    agent = enhance_agent(FunctionAgent(tools=[], llm=llm("chat", {"input": "returns?"}, "Free.")), world.enhancer())
    handler = agent.run("returns?")
    events = [event async for event in handler.stream_events()]
    assert str(await handler) == "Free."
    result_at = next(i for i, event in enumerate(events) if isinstance(event, ToolCallResult))
    tokens = [e for e in events[:result_at] if isinstance(e, ReachStreamEvent) and e.kind == "token"]
    assert tokens and {e.agent for e in tokens} == {"faq-agent"}
    assert "".join(e.text or "" for e in tokens) == answer
    result = events[result_at]
    assert isinstance(result, ToolCallResult) and result.tool_output.content == answer
