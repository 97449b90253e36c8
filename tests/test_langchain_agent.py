"""The LangChain adapter end to end: the real create_agent and ToolNode, a scripted tool-calling model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from langchain.agents.middleware import ToolErrorMiddleware, ToolRetryMiddleware
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reach_plugins import AgentDescriptor, Capability, ReachEnhancer
from reach_plugins.errors import (
    BusinessError,
    InvalidPayload,
    NoHealthyAgent,
    RemoteError,
    SessionClosed,
    is_retryable,
)
from reach_plugins.langchain import ReachMiddleware, create_agent, reach_error_message
from reach_plugins.model import ErrorInfo, Instance
from reach_plugins.registry import MemoryRegistry
from reach_plugins.transport import Call, MockTransport, Reply

CATALOGUE = [
    Capability(name="query_order", description="Look up where a customer's order is and its delivery status"),
    Capability(
        name="check_inventory",
        description="How many units of a product are in stock",
        params_schema={"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]},
    ),
    Capability(name="refund_order", description="Refund a customer's order payment", danger_level="high"),
]


BOUND: list[list[str]] = []
"""The tool names each ScriptedModel was bound with, in order (what the model sees)."""


class ScriptedModel(GenericFakeChatModel):
    """A fake chat model that accepts tools (langchain_core's fakes refuse bind_tools) and records their names."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        BOUND.append(sorted(convert_to_openai_tool(tool)["function"]["name"] for tool in tools))
        return self.bind(**kwargs)


def turn(*calls: tuple[str, dict[str, Any]]) -> AIMessage:
    """An AI message calling ``calls`` (ids c1, c2, ... within the turn, prefixed by the first tool's name)."""
    return AIMessage(
        content="",
        tool_calls=[{"name": name, "args": args, "id": f"{name}-{n}"} for n, (name, args) in enumerate(calls)],
    )


def model(*messages: AIMessage | str) -> ScriptedModel:
    return ScriptedModel(messages=iter(messages))


def asks_order(order_id: str, reply: str) -> ScriptedModel:
    """A model that looks up one order, then answers ``reply``."""
    return model(turn(("query_order", {"order_id": order_id})), reply)


@tool
def query_order(order_id: str) -> str:
    """Look up where an order is (the local implementation)."""
    return f"local answer for {order_id}"


@tool
def add_numbers(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def echo(call: Call) -> dict[str, Any]:
    return {"instance": call.instance.instance_id, "payload": call.request.payload, "session": call.request.session_id}


def registry_with(*instances: str) -> MemoryRegistry:
    registry = MemoryRegistry()
    asyncio.run(registry.register_agent(AgentDescriptor(name="orders", capabilities=CATALOGUE)))
    for name in instances:
        instance = Instance(agent="orders", instance_id=name, endpoint=f"http://{name}")
        asyncio.run(registry.register_instance(instance))
    return registry


@pytest.fixture
def transport() -> MockTransport:
    return MockTransport(echo)


@pytest.fixture
def enhancer(transport: MockTransport) -> Iterator[ReachEnhancer]:
    registry = registry_with("orders-a", "orders-b")
    with ReachEnhancer(
        registry=registry, transport=transport, expose=["check_inventory", "refund_order"]
    ) as enhancer:
        yield enhancer


def tool_messages(messages: Sequence[BaseMessage]) -> dict[str, ToolMessage]:
    return {message.tool_call_id: message for message in messages if isinstance(message, ToolMessage)}


def thread(name: str) -> RunnableConfig:
    return {"configurable": {"thread_id": name}}


# ----------------------------------------------------------------------------- create_agent, invoke and ainvoke


SCRIPT = (
    turn(("query_order", {"order_id": "A1"}), ("check_inventory", {"sku": "S-9"}), ("add_numbers", {"a": 2, "b": 3})),
    "All done.",
)


def check_first_turn(messages: Sequence[BaseMessage], transport: MockTransport) -> None:
    results = tool_messages(messages)
    remote = results["query_order-0"]
    assert remote.status == "success" and '"order_id": "A1"' in str(remote.content)
    assert remote.artifact["reach"]["agent"] == "orders" and remote.artifact["reach"]["capability"] == "query_order"
    assert '"sku": "S-9"' in str(results["check_inventory-1"].content)
    assert results["add_numbers-2"].content == "5"
    assert sorted(call.request.capability for call in transport.calls) == ["check_inventory", "query_order"]
    assert {call.request.session_id for call in transport.calls} == {"t-1"}
    assert messages[-1].content == "All done."


def test_invoke_routes_mapped_and_proxy_tools_and_keeps_local_ones(
    enhancer: ReachEnhancer, transport: MockTransport
) -> None:
    """invoke: a mapped tool and a proxy tool reach the agent with the thread id; an unmapped tool runs locally."""
    agent = create_agent(model(*SCRIPT), [query_order, add_numbers], enhanced_by=enhancer)
    check_first_turn(agent.invoke({"messages": [("user", "where is A1?")]}, thread("t-1"))["messages"], transport)


async def test_ainvoke_takes_the_same_routes(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """ainvoke goes through awrap_tool_call with the same outcome as invoke."""
    agent = create_agent(model(*SCRIPT), [query_order, add_numbers], enhanced_by=enhancer)
    state = await agent.ainvoke({"messages": [("user", "where is A1?")]}, thread("t-1"))
    check_first_turn(state["messages"], transport)


@pytest.mark.parametrize(
    ("expose", "seen"),
    [
        ((), ["add_numbers", "query_order"]),
        (["check_inventory"], ["add_numbers", "check_inventory", "query_order"]),
        (lambda capability: True, ["add_numbers", "check_inventory", "query_order"]),
    ],
)
def test_the_model_sees_its_own_tools_plus_the_exposed_ones(
    transport: MockTransport, expose: Any, seen: list[str]
) -> None:
    """An agent built as in the README is bound to its tools and the exposed capabilities only (never refund_order)."""
    BOUND.clear()
    with ReachEnhancer(registry=registry_with("orders-a"), transport=transport, expose=expose) as enhancer:
        agent = create_agent(model("ok"), [query_order, add_numbers], enhanced_by=enhancer)
        agent.invoke({"messages": [("user", "hi")]})
    assert [seen] == BOUND, "the model was bound to other tools"


def test_a_call_to_an_unexposed_capability_is_not_sent(transport: MockTransport) -> None:
    """A model naming a capability it was not given gets LangChain's unknown-tool error; nothing is sent."""
    with ReachEnhancer(registry=registry_with("orders-a"), transport=transport) as enhancer:
        agent = create_agent(model(turn(("check_inventory", {"sku": "S"})), "ok"), [query_order], enhanced_by=enhancer)
        state = agent.invoke({"messages": [("user", "stock?")]})
    message = tool_messages(state["messages"])["check_inventory-0"]
    assert message.status == "error" and "check_inventory" in str(message.content)
    assert transport.calls == []


def test_create_agent_forwards_arguments_and_appends_the_middleware(enhancer: ReachEnhancer) -> None:
    """Other arguments reach langchain's create_agent unchanged; the Reach middleware comes last."""
    seen: list[str] = []

    class Spy(ReachMiddleware):
        def wrap_tool_call(self, request: Any, handler: Any) -> Any:
            seen.append(request.tool_call["name"])
            return handler(request)

    agent = create_agent(
        model(turn(("add_numbers", {"a": 1, "b": 1})), "ok"),
        [add_numbers],
        middleware=[Spy(enhancer)],
        system_prompt="Be brief.",
        name="desk",
        enhanced_by=enhancer,
    )
    state = agent.invoke({"messages": [("user", "1+1")]})
    assert agent.name == "desk" and seen == ["add_numbers"]
    assert state["messages"][0].content == "1+1" and state["messages"][-1].content == "ok"


def test_local_fallback_when_no_agent_is_healthy(transport: MockTransport) -> None:
    """remote_first runs the local tool when every instance is down, and sends nothing."""
    registry = registry_with()
    with ReachEnhancer(registry=registry, transport=transport) as enhancer:
        agent = create_agent(asks_order("A1", "ok"), [query_order], enhanced_by=enhancer)
        state = agent.invoke({"messages": [("user", "where is A1?")]}, thread("t-1"))
    assert tool_messages(state["messages"])["query_order-0"].content == "local answer for A1"
    assert transport.calls == []


def test_reach_failure_is_an_error_tool_message_and_the_run_goes_on() -> None:
    """A failed reach gives the model an error ToolMessage it can act on; the run still finishes."""
    error = ErrorInfo(type="business", message="order A9 does not exist")
    refuse = MockTransport(lambda call: Reply(status="fail", error=error))
    with ReachEnhancer(registry=registry_with("orders-a"), transport=refuse) as enhancer:
        agent = create_agent(asks_order("A9", "Sorry."), [query_order], enhanced_by=enhancer)
        state = agent.invoke({"messages": [("user", "where is A9?")]})
    message = tool_messages(state["messages"])["query_order-0"]
    assert message.status == "error" and "order A9 does not exist" in str(message.content)
    assert state["messages"][-1].content == "Sorry."


def test_on_error_raise_aborts_the_run() -> None:
    """With on_error='raise' the ReachError escapes the run."""
    error = ErrorInfo(type="business", message="order A9 does not exist")
    refuse = MockTransport(lambda call: Reply(status="fail", error=error))
    with ReachEnhancer(registry=registry_with("orders-a"), transport=refuse, on_error="raise") as enhancer:
        agent = create_agent(asks_order("A9", "x"), [query_order], enhanced_by=enhancer)
        with pytest.raises(BusinessError, match="A9 does not exist"):
            agent.invoke({"messages": [("user", "where is A9?")]})


@pytest.mark.parametrize(("retry_on", "runs"), [(is_retryable, 1), ((Exception,), 3)])
def test_retry_middleware_leaves_a_business_error_alone(retry_on: Any, runs: int) -> None:
    """With retry_on=errors.is_retryable a refusal runs once and becomes a message; LangChain's default re-runs it."""
    error = ErrorInfo(type="business", message="order A9 does not exist")
    refuse = MockTransport(lambda call: Reply(status="fail", error=error))
    middleware = [
        ToolErrorMiddleware(on_error=reach_error_message),
        ToolRetryMiddleware(max_retries=2, retry_on=retry_on, on_failure="error", initial_delay=0, jitter=False),
    ]
    with ReachEnhancer(registry=registry_with("orders-a"), transport=refuse, on_error="raise") as enhancer:
        agent = create_agent(asks_order("A9", "Sorry."), [query_order], middleware=middleware, enhanced_by=enhancer)
        state = agent.invoke({"messages": [("user", "where is A9?")]})
    message = tool_messages(state["messages"])["query_order-0"]
    assert message.status == "error" and "order A9 does not exist" in str(message.content)
    assert len(refuse.calls) == runs


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (BusinessError("no such order"), False),
        (SessionClosed("closed"), False),
        (InvalidPayload("order_id missing"), False),
        (RemoteError("agent answered HTTP 500"), True),
        (NoHealthyAgent("all down"), True),
        (ValueError("not ours"), True),
    ],
)
def test_is_retryable_separates_refusals_from_transient_failures(error: Exception, retryable: bool) -> None:
    """errors.is_retryable: no for a refusal or a refused request, yes for transient failures and foreign errors."""
    assert is_retryable(error) is retryable


# ----------------------------------------------------------------------------- sessions


def test_a_conversation_keeps_its_instance_across_turns(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """Every turn of a thread lands on the same instance; the thread id is the session id."""
    script = [m for n in range(6) for m in (turn(("query_order", {"order_id": f"A{n}"})), f"turn {n}")]
    agent = create_agent(model(*script), [query_order], checkpointer=InMemorySaver(), enhanced_by=enhancer)
    for n in range(6):
        agent.invoke({"messages": [("user", f"turn {n}")]}, thread(f"t-{n % 3}"))
    by_thread: dict[str | None, set[str]] = {}
    for call in transport.calls:
        by_thread.setdefault(call.request.session_id, set()).add(call.instance.instance_id)
    assert set(by_thread) == {"t-0", "t-1", "t-2"}
    assert all(len(instances) == 1 for instances in by_thread.values())


def test_session_key_callable_overrides_the_thread_id(transport: MockTransport) -> None:
    """A session_key callable chooses the conversation key instead of the thread id."""
    registry = registry_with("orders-a")
    with ReachEnhancer(registry=registry, transport=transport, session_key=lambda request: "user-42") as enhancer:
        agent = create_agent(asks_order("A1", "ok"), [query_order], enhanced_by=enhancer)
        agent.invoke({"messages": [("user", "hi")]}, thread("t-1"))
    assert [call.request.session_id for call in transport.calls] == ["user-42"]


def test_closed_conversation_sends_nothing(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """After close_session(thread), the model is told the conversation is closed and no agent is called."""
    script = (turn(("query_order", {"order_id": "A1"})), "first", turn(("query_order", {"order_id": "A2"})), "second")
    agent = create_agent(model(*script), [query_order], checkpointer=InMemorySaver(), enhanced_by=enhancer)
    agent.invoke({"messages": [("user", "one")]}, thread("t-1"))
    enhancer.close_session("t-1")
    state = agent.invoke({"messages": [("user", "two")]}, thread("t-1"))
    message = state["messages"][-2]
    assert isinstance(message, ToolMessage) and message.status == "error"
    assert "was closed" in str(message.content)
    assert [call.request.payload for call in transport.calls] == [{"order_id": "A1"}]


# ----------------------------------------------------------------------------- approval


def test_dangerous_call_pauses_until_approved(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """A high-danger capability interrupts the run showing the call; resuming with approval sends it."""
    agent = create_agent(
        model(turn(("refund_order", {"order_id": "A1"})), "Refunded."),
        [query_order],
        checkpointer=InMemorySaver(),
        enhanced_by=enhancer,
    )
    paused = agent.invoke({"messages": [("user", "refund A1")]}, thread("t-1"))
    (pending,) = paused["__interrupt__"]
    assert pending.value["capability"] == "refund_order" and pending.value["args"] == {"order_id": "A1"}
    assert transport.calls == []
    done = agent.invoke(Command(resume={"approved": True}), thread("t-1"))
    assert [call.request.payload for call in transport.calls] == [{"order_id": "A1"}]
    assert done["messages"][-1].content == "Refunded."


async def test_denied_call_is_an_error_message_and_sends_nothing(
    enhancer: ReachEnhancer, transport: MockTransport
) -> None:
    """Resuming with a denial (async path) tells the model it was not approved; nothing is sent."""
    agent = create_agent(
        model(turn(("refund_order", {"order_id": "A1"})), "Not refunded."),
        [query_order],
        checkpointer=InMemorySaver(),
        enhanced_by=enhancer,
    )
    await agent.ainvoke({"messages": [("user", "refund A1")]}, thread("t-2"))
    done = await agent.ainvoke(Command(resume={"approved": False}), thread("t-2"))
    message = tool_messages(done["messages"])["refund_order-0"]
    assert message.status == "error" and "not approved" in str(message.content)
    assert transport.calls == []


# ----------------------------------------------------------------------------- ToolNode and spans


async def test_toolnode_takes_the_same_wrappers(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """A hand-built graph's ToolNode with the middleware's two wrappers reaches the agent, sync and async."""
    middleware = ReachMiddleware(enhancer, local_tools=[query_order])
    node = ToolNode(
        [query_order, *middleware.tools],
        wrap_tool_call=middleware.wrap_tool_call,
        awrap_tool_call=middleware.awrap_tool_call,
    )
    graph = StateGraph(MessagesState)
    graph.add_node("tools", node)
    graph.add_edge(START, "tools")
    compiled = graph.compile()
    request: Any = {"messages": [turn(("query_order", {"order_id": "A1"}), ("check_inventory", {"sku": "S"}))]}
    sync_state = compiled.invoke(request, thread("t-7"))
    async_state = await compiled.ainvoke(request, thread("t-7"))
    for state in (sync_state, async_state):
        results = tool_messages(state["messages"])
        assert results["query_order-0"].artifact["reach"]["instance"] in {"orders-a", "orders-b"}
        assert '"sku": "S"' in str(results["check_inventory-1"].content)
    assert len(transport.calls) == 4 and {call.request.session_id for call in transport.calls} == {"t-7"}


def test_each_tool_call_is_a_span_with_the_conversation(transport: MockTransport) -> None:
    """The execute_tool span carries the thread id as gen_ai.conversation.id and parents the reach span."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with ReachEnhancer(registry=registry_with("orders-a"), transport=transport, tracer_provider=provider) as enhancer:
        agent = create_agent(asks_order("A1", "ok"), [query_order], enhanced_by=enhancer)
        agent.invoke({"messages": [("user", "hi")]}, thread("t-5"))
    spans = {span.name: span for span in exporter.get_finished_spans()}
    tool_span, client_span = spans["execute_tool query_order"], spans["invoke_agent orders"]
    assert tool_span.attributes is not None and tool_span.attributes["gen_ai.conversation.id"] == "t-5"
    assert tool_span.attributes["gen_ai.tool.call.id"] == "query_order-0"
    assert client_span.parent is not None and client_span.parent.span_id == tool_span.context.span_id
