"""Reach in LangChain's own way, against real agent-SDK servers: artifacts, retry middleware, approval, streaming.

Every remote agent is a real uvicorn server on 127.0.0.1 reached through
DirectTransport; the caller is the real ``langchain.agents.create_agent``
with a scripted fake model (langchain_core's fakes refuse ``bind_tools``).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from host_support import ORDER, World, calls, model, serve_langgraph_agent, tool_message
from langchain.agents.middleware import AgentMiddleware, HumanInTheLoopMiddleware, ToolRetryMiddleware
from langchain_core.messages import AIMessageChunk
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from reach_plugins import AgentDescriptor
from reach_plugins.errors import is_retryable
from reach_plugins.frameworks.dify.hook import before_invoke_stream
from reach_plugins.langchain import create_agent
from reach_plugins.model import Instance
from reach_plugins.registry import MemoryRegistry


@pytest.fixture
def world() -> Iterator[World]:
    world = World()
    yield world
    world.close()


def thread(name: str) -> Any:
    return {"configurable": {"thread_id": name}}


# ----------------------------------------------------------------------------- artifacts


def test_artifact_is_the_agents_structured_result_plus_the_route(world: World) -> None:
    """The ToolMessage artifact holds the agent's data as structured_content and the route under 'reach'."""
    world.orders()
    desk = create_agent(model(calls("query_order", order_id="A1"), "Shipped."), [], enhanced_by=world.enhancer())
    message = tool_message(desk.invoke({"messages": [("user", "A1?")]}, thread("t1"))["messages"])
    assert message.status == "success"
    assert message.artifact["structured_content"] == {"order_id": "A1", "status": "shipped", "eta_days": 2}
    route = message.artifact["reach"]
    assert (route["agent"], route["capability"], route["delivered"]) == ("orders", "query_order", True)


async def test_a_refusal_is_an_error_message_whose_artifact_is_the_error_record(world: World) -> None:
    """A business refusal: error ToolMessage at once, artifact = the error record (type, class, retryable)."""
    world.orders()
    desk = create_agent(model(calls("query_order", order_id="A9"), "Sorry."), [], enhanced_by=world.enhancer())
    message = tool_message((await desk.ainvoke({"messages": [("user", "A9?")]}, thread("t2")))["messages"])
    assert message.status == "error" and "there is no order A9" in str(message.content)
    assert message.artifact["error"] == {
        "type": "business",
        "class": "BusinessError",
        "message": "there is no order A9",
        "retryable": False,
    }
    assert message.artifact["reach"]["agent"] == "orders"


# ----------------------------------------------------------------------------- ToolRetryMiddleware


class Count(AgentMiddleware[Any, Any, Any]):
    """Counts how often the middleware outside it ran the tool call (between ToolRetryMiddleware and Reach's)."""

    def __init__(self) -> None:
        super().__init__()
        self.runs = 0

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        self.runs += 1
        return handler(request)

    async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
        self.runs += 1
        return await handler(request)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def dead_orders(registry: MemoryRegistry) -> None:
    """An orders agent registered at a port where nothing listens: every reach fails, retryably."""
    await registry.register_agent(AgentDescriptor(name="orders", capabilities=[ORDER]))
    endpoint = f"http://127.0.0.1:{free_port()}"
    await registry.register_instance(Instance(agent="orders", instance_id="orders-1", endpoint=endpoint))


@pytest.mark.parametrize("run", ["invoke", "ainvoke"])
@pytest.mark.parametrize("dead", [True, False], ids=["retryable", "refusal"])
async def test_tool_retry_middleware_retries_retryable_failures_and_never_a_refusal(
    world: World, dead: bool, run: str
) -> None:
    """Default settings: ToolRetryMiddleware(retry_on=is_retryable) sees a retryable failure as an exception and
    retries it (3 runs); a refusal is a message at once (1 run); both end as our error ToolMessage."""
    if dead:
        await dead_orders(world.registry)
    else:
        world.orders()
    count = Count()
    retry = ToolRetryMiddleware(max_retries=2, retry_on=is_retryable, on_failure="error", initial_delay=0, jitter=False)
    desk = create_agent(
        model(calls("query_order", order_id="A9"), "Sorry."),
        [],
        middleware=[retry, count],
        enhanced_by=world.enhancer(timeout_ms=2000),
    )
    request = {"messages": [("user", "A9?")]}
    state = desk.invoke(request, thread("t3")) if run == "invoke" else await desk.ainvoke(request, thread("t3"))
    message = tool_message(state["messages"])
    assert message.status == "error"
    assert message.artifact["error"]["retryable"] is dead
    assert count.runs == (3 if dead else 1)
    assert world.ran == ([] if dead else [{"query_order": "A9"}])


# ----------------------------------------------------------------------------- approval


def refund_desk(world: World, *middleware: Any) -> Any:
    return create_agent(
        model(calls("refund_order", order_id="A1"), "Done."),
        [],
        middleware=list(middleware),
        checkpointer=InMemorySaver(),
        enhanced_by=world.enhancer(),
    )


@pytest.mark.parametrize(
    ("decision", "ran"),
    [
        ({"type": "approve"}, [{"refund_order": "A1"}]),
        (
            {"type": "edit", "edited_action": {"name": "refund_order", "args": {"order_id": "A2"}}},
            [{"refund_order": "A2"}],
        ),
        ({"type": "reject", "message": "refunds need a manager"}, []),
    ],
    ids=["approve", "edit", "reject"],
)
def test_our_interrupt_takes_langchains_decisions(world: World, decision: dict[str, Any], ran: list[Any]) -> None:
    """A dangerous capability interrupts in HITL's tool_approval shape; LangChain's decisions resume it, once."""
    world.orders()
    desk = refund_desk(world)
    paused = desk.invoke({"messages": [("user", "refund A1")]}, thread("t4"))
    (pending,) = paused["__interrupt__"]
    assert pending.value["type"] == "tool_approval" and pending.value["name"] == "refund_order"
    assert pending.value["args"] == {"order_id": "A1"} and pending.value["tool_call_id"] == "refund_order-1"
    assert world.ran == []
    done = desk.invoke(Command(resume={"decisions": [decision]}), thread("t4"))
    assert "__interrupt__" not in done
    assert world.ran == ran
    message = tool_message(done["messages"])
    if decision["type"] == "reject":
        assert message.status == "error" and "refunds need a manager" in str(message.content)
    else:
        assert message.status == "success" and message.artifact["structured_content"] == {
            "refunded": ran[0]["refund_order"]
        }


@pytest.mark.parametrize("mode", ["batched", "per_call"])
def test_beside_human_in_the_loop_the_user_is_asked_once(world: World, mode: str) -> None:
    """With LangChain's HumanInTheLoopMiddleware on the tool, its one question is the only one; an edit is sent."""
    world.orders()
    hitl = HumanInTheLoopMiddleware(interrupt_on={"refund_order": True}, interrupt_mode=mode)  # type: ignore[arg-type]
    desk = refund_desk(world, hitl)
    paused = desk.invoke({"messages": [("user", "refund A1")]}, thread("t5"))
    assert len(paused["__interrupt__"]) == 1
    edit = {"type": "edit", "edited_action": {"name": "refund_order", "args": {"order_id": "A3"}}}
    resume = {"decisions": [edit]} if mode == "batched" else edit
    done = desk.invoke(Command(resume=resume), thread("t5"))
    assert "__interrupt__" not in done, "asked a second time"
    assert world.ran == [{"refund_order": "A3"}]


# ----------------------------------------------------------------------------- streaming


async def test_a_two_level_chain_streams_into_the_callers_astream(world: World) -> None:
    """desk -> order-agent -> stock-agent: both remote agents' tokens and node updates appear in the desk's
    astream (messages and custom) before the tool's result, attributed to their authors; no text wrapped twice."""
    serve_langgraph_agent(world, "stock-agent", "check_stock", ["Three units of K-7 left."])
    serve_langgraph_agent(
        world, "order-agent", "handle_order", [calls("check_stock", message="K-7?"), "Order A1 ships; K-7 is in stock."]
    )
    desk = create_agent(
        model(calls("handle_order", message="Where is A1?"), "It ships."), [], enhanced_by=world.enhancer()
    )
    seen: list[tuple[str, Any]] = []
    async for mode, chunk in desk.astream(
        {"messages": [("user", "A1?")]}, thread("t6"), stream_mode=["messages", "custom", "updates"]
    ):
        seen.append((mode, chunk))
    result_at = next(i for i, (mode, chunk) in enumerate(seen) if mode == "updates" and "tools" in chunk)
    during = seen[:result_at]
    tokens = [(c[0].name, c[0].content) for m, c in during if m == "messages" and isinstance(c[0], AIMessageChunk)]
    texts = {
        name: "".join(text for author, text in tokens if author == name) for name in ("order-agent", "stock-agent")
    }
    assert texts == {"order-agent": "Order A1 ships; K-7 is in stock.", "stock-agent": "Three units of K-7 left."}
    custom = [chunk for mode, chunk in during if mode == "custom"]
    assert {"type": "update", "agent": "order-agent", "node": "model", "keys": ["messages"]} in custom
    assert any(item["type"] == "token" and item["agent"] == "stock-agent" for item in custom)
    (answer,) = [c["tools"]["messages"][0] for m, c in seen if m == "updates" and "tools" in c]
    assert answer.content == "Order A1 ships; K-7 is in stock."
    assert answer.artifact["structured_content"]["reply_content"] == answer.content


def test_sync_stream_and_invoke_see_the_same_answer(world: World) -> None:
    """The blocking path streams too (stream_mode='messages'); invoke, not streaming, gets the same reply."""
    serve_langgraph_agent(world, "order-agent", "handle_order", ["Order A1 ships.", "Order A1 ships."])
    desk = create_agent(
        model(calls("handle_order", message="A1?"), "ok", calls("handle_order", message="A1?"), "ok"),
        [],
        enhanced_by=world.enhancer(),
    )
    streamed = [
        chunk.content
        for chunk, _ in desk.stream({"messages": [("user", "A1?")]}, thread("t7"), stream_mode="messages")
        if isinstance(chunk, AIMessageChunk) and chunk.name == "order-agent"
    ]
    assert "".join(streamed) == "Order A1 ships."
    state = desk.invoke({"messages": [("user", "A1?")]}, thread("t8"))
    assert tool_message(state["messages"]).content == "Order A1 ships."


def test_dify_streams_a_served_graph_as_one_reply_without_its_progress(world: World) -> None:
    """A Dify strategy streaming a served LangGraph agent shows its reply once, not its tokens as JSON messages."""
    serve_langgraph_agent(world, "order-agent", "handle_order", ["Order A1 ships."])
    items = before_invoke_stream(
        "handle_order", {"message": "A1?"}, conversation_id="c-1", app_id=None, user_id=None, enhancer=world.enhancer()
    )
    assert items is not None
    shown: list[Any] = []
    while True:
        try:
            shown.append(next(items))
        except StopIteration as stop:
            result = stop.value
            break
    assert shown == []
    assert result.ok and result.content == "Order A1 ships." and result.data["reply_content"] == "Order A1 ships."


@pytest.mark.parametrize("stream_remote", [True, None])
async def test_custom_mode_alone_streams_when_asked(world: World, stream_remote: bool | None) -> None:
    """stream_mode='custom' alone carries the remote items with stream_remote=True; by default only a 'messages'
    listener turns streaming on (LangGraph tells a tool nothing else about its stream)."""
    serve_langgraph_agent(world, "order-agent", "handle_order", ["Order A1 ships."])
    desk = create_agent(
        model(calls("handle_order", message="A1?"), "ok"), [], enhanced_by=world.enhancer(), stream_remote=stream_remote
    )
    custom = [
        chunk async for chunk in desk.astream({"messages": [("user", "A1?")]}, thread("t9"), stream_mode="custom")
    ]
    tokens = "".join(item["text"] for item in custom if item["type"] == "token")
    assert tokens == ("Order A1 ships." if stream_remote else "")
