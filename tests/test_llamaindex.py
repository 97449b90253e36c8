"""The LlamaIndex adapter end to end: FunctionAgent, ReActAgent and AgentWorkflow driven by MockFunctionCallingLLM.

No ``from __future__ import annotations`` here: LlamaIndex finds the ``ctx:
Context`` parameter of a tool function by its annotation, which must stay a
class, not a string.
"""

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from llama_index.core import SummaryIndex
from llama_index.core.agent.workflow import AgentWorkflow, FunctionAgent, ReActAgent
from llama_index.core.base.llms.types import ToolCallBlock
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.llms import ChatMessage, MessageRole
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.objects import ObjectIndex
from llama_index.core.tools import FunctionTool, ToolOutput
from llama_index.core.workflow import Context
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reach_plugins import AgentDescriptor, Capability, ReachEnhancer
from reach_plugins.errors import BusinessError
from reach_plugins.llamaindex import SESSION_KEY, ReachTool, enhance_agent, enhance_tools
from reach_plugins.model import ErrorInfo, Instance
from reach_plugins.registry import MemoryRegistry
from reach_plugins.transport import Call, MockTransport, Reply

SKU = {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}
CATALOGUE = [
    Capability(name="query_order", description="Look up where an order is"),
    Capability(name="check_inventory", description="How many units of a product are in stock", params_schema=SKU),
]


def echo(call: Call) -> Any:
    """The agent: who served which capability, with which payload, in which conversation; A9 does not exist."""
    request = call.request
    if request.payload.get("order_id") == "A9":
        return Reply(status="fail", error=ErrorInfo(type="business", message="order A9 does not exist"))
    return {"by": call.instance.instance_id, "capability": request.capability, "payload": request.payload}


def lookup(order_id: str) -> str:
    """Look up an order (the local implementation)."""
    return f"local answer for {order_id}"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def remember(ctx: Context, note: str) -> str:
    """Write a note into the workflow state (a tool that needs the Context injected)."""
    await ctx.store.set("note", note)
    return f"noted {note}"


def registry_with(*instances: str) -> MemoryRegistry:
    registry = MemoryRegistry()
    asyncio.run(registry.register_agent(AgentDescriptor(name="orders", capabilities=CATALOGUE)))
    for name in instances:
        asyncio.run(registry.register_instance(Instance(agent="orders", instance_id=name, endpoint=f"http://{name}")))
    return registry


@pytest.fixture
def transport() -> MockTransport:
    return MockTransport(echo)


@pytest.fixture
def enhancer(transport: MockTransport) -> Iterator[ReachEnhancer]:
    registry = registry_with("orders-a", "orders-b", "orders-c")
    capability_map = {"lookup": "query_order"}
    with ReachEnhancer(
        registry=registry, transport=transport, matcher=False, capability_map=capability_map, expose=["check_inventory"]
    ) as e:
        yield e


def script(*turns: Sequence[tuple[str, dict[str, Any]]] | str) -> tuple[MockFunctionCallingLLM, list[list[str]]]:
    """A function-calling LLM that plays ``turns`` in order (tool calls, or a final answer); also what it saw."""
    queue, seen = list(turns), []

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        seen.append([m.content or "" for m in messages if m.role == MessageRole.TOOL])
        turn = queue.pop(0)
        if isinstance(turn, str):
            return ChatMessage(role="assistant", content=turn)
        blocks = [
            ToolCallBlock(tool_call_id=f"{name}-{n}", tool_name=name, tool_kwargs=args)
            for n, (name, args) in enumerate(turn)
        ]
        return ChatMessage(role="assistant", blocks=blocks)

    return MockFunctionCallingLLM(response_generator=respond), seen


# ----------------------------------------------------------------------------- agents


async def test_function_agent_reaches_mapped_and_proxy_tools_and_keeps_local_ones(
    enhancer: ReachEnhancer, transport: MockTransport
) -> None:
    """FunctionAgent: a mapped tool and a proxy tool reach the agent; an unmapped tool runs locally."""
    llm, seen = script(
        [("lookup", {"order_id": "A1"}), ("check_inventory", {"sku": "K-7"}), ("add", {"a": 2, "b": 3})], "ok"
    )
    agent = enhance_agent(FunctionAgent(tools=[lookup, add], llm=llm), enhancer)
    assert [tool.metadata.name for tool in agent.tools] == ["lookup", "add", "check_inventory"]
    assert str(await agent.run("where is A1?")) == "ok"
    assert sorted(call.request.capability for call in transport.calls) == ["check_inventory", "query_order"]
    results = seen[1]
    assert len(results) == 3 and "5" in results
    assert any('"order_id": "A1"' in text for text in results) and any('"sku": "K-7"' in text for text in results)


async def test_one_context_is_one_conversation(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """The session key lives in ctx.store: two runs with one Context stay on one instance; a new Context differs."""
    turns = [[("lookup", {"order_id": f"A{n}"})] if n % 2 == 0 else "ok" for n in range(6)]
    llm, _ = script(*turns)
    agent = enhance_agent(FunctionAgent(tools=[lookup], llm=llm), enhancer)
    ctx = Context(agent)
    await agent.run("first", ctx=ctx)
    await agent.run("second", ctx=ctx)
    await agent.run("third")
    first, second, third = (call.request.session_id for call in transport.calls)
    assert first == second == await ctx.store.get(SESSION_KEY) and third not in (None, first)
    assert transport.calls[0].instance.instance_id == transport.calls[1].instance.instance_id


async def test_session_key_set_in_the_store_or_in_instrument_tags(
    enhancer: ReachEnhancer, transport: MockTransport
) -> None:
    """A key the caller put in ctx.store is used as is; outside a preset store, instrument_tags give it."""
    llm, _ = script([("lookup", {"order_id": "A1"})], "ok", [("lookup", {"order_id": "A2"})], "ok")
    agent = enhance_agent(FunctionAgent(tools=[lookup], llm=llm), enhancer)
    ctx = Context(agent)
    await ctx.store.set(SESSION_KEY, "thread-7")
    await agent.run("first", ctx=ctx)
    with instrument_tags({SESSION_KEY: "tagged-1"}):
        await agent.run("second")
    assert [call.request.session_id for call in transport.calls] == ["thread-7", "tagged-1"]


async def test_react_agent_reaches_through_a_proxy_tool(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """ReActAgent parses the text action and calls the proxy tool, whose schema is the capability's params_schema."""
    observations: list[str] = []

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        last = messages[-1].content or ""
        if last.startswith("Observation"):
            observations.append(last)
            return ChatMessage(
                role="assistant", content="Thought: I can answer without using any more tools.\nAnswer: 12"
            )
        action = 'Thought: I need stock.\nAction: check_inventory\nAction Input: {"sku": "K-7"}'
        return ChatMessage(role="assistant", content=action)

    agent = enhance_agent(ReActAgent(tools=[add], llm=MockFunctionCallingLLM(response_generator=respond)), enhancer)
    proxy = next(tool for tool in agent.tools if tool.metadata.name == "check_inventory")
    assert proxy.metadata.get_parameters_dict() == SKU
    assert str(await agent.run("how many kettles?")) == "12"
    assert transport.calls[0].request.payload == {"sku": "K-7"} and '"by": "orders-' in observations[0]


async def test_agent_workflow_enhances_every_agent(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """AgentWorkflow: each agent's tools are wrapped; handoff still works; the second agent's call is reached."""
    desk_llm, _ = script([("handoff", {"to_agent": "orders", "reason": "order question"})])
    orders_llm, _ = script([("lookup", {"order_id": "A3"})], "A3 shipped")
    desk = FunctionAgent(name="desk", description="front desk", tools=[add], llm=desk_llm, can_handoff_to=["orders"])
    orders = FunctionAgent(name="orders", description="orders", tools=[lookup], llm=orders_llm)
    workflow = enhance_agent(AgentWorkflow(agents=[desk, orders], root_agent="desk"), enhancer)
    assert all(isinstance(tool, ReachTool) for agent in (desk, orders) for tool in agent.tools)
    assert str(await workflow.run("where is A3?")) == "A3 shipped"
    assert [call.request.payload for call in transport.calls] == [{"order_id": "A3"}]


async def test_tools_from_a_retriever_are_wrapped_and_proxies_fill_the_gaps(
    enhancer: ReachEnhancer, transport: MockTransport
) -> None:
    """An agent's tool_retriever gives wrapped tools, plus proxies only for capabilities none of them covers."""
    index = ObjectIndex.from_objects([FunctionTool.from_defaults(lookup)], index_cls=SummaryIndex)
    llm, _ = script([("lookup", {"order_id": "A4"})], "ok")
    agent = enhance_agent(FunctionAgent(tool_retriever=index.as_retriever(), llm=llm), enhancer)
    tools = await agent.get_tools("orders")
    assert [(tool.metadata.name, type(tool)) for tool in tools] == [
        ("lookup", ReachTool),
        ("check_inventory", ReachTool),
    ]
    await agent.run("where is A4?")
    assert transport.calls[0].request.capability == "query_order"


# ----------------------------------------------------------------------------- ReachTool itself


async def test_failure_is_an_error_output_and_the_run_goes_on(enhancer: ReachEnhancer) -> None:
    """A failed reach is ToolOutput(is_error=True) with a message the model can act on; the agent still answers."""
    llm, seen = script([("lookup", {"order_id": "A9"})], "Sorry.")
    agent = enhance_agent(FunctionAgent(tools=[lookup], llm=llm), enhancer)
    assert str(await agent.run("where is A9?")) == "Sorry."
    assert "order A9 does not exist" in seen[1][0] and "check the arguments" in seen[1][0]
    [tool] = enhance_tools([lookup], enhancer, proxy_tools=False)
    output = await tool.acall(order_id="A9")
    assert output.is_error and isinstance(output.exception, BusinessError)
    error = {"type": "business", "class": "BusinessError", "message": "order A9 does not exist", "retryable": False}
    assert output.raw_output == {"error": error}


def test_an_agent_sees_only_its_tools_unless_capabilities_are_exposed(transport: MockTransport) -> None:
    """FunctionAgent(tools=[]) keeps no tools and tools=[lookup] one; expose= adds exactly the named capability."""
    with ReachEnhancer(registry=registry_with("orders-a"), transport=transport, matcher=False) as e:
        empty = enhance_agent(FunctionAgent(tools=[], llm=script("ok")[0]), e)
        one = enhance_agent(FunctionAgent(tools=[lookup], llm=script("ok")[0]), e)
        assert empty.tools == [] and [tool.metadata.name for tool in one.tools] == ["lookup"]
    with ReachEnhancer(registry=registry_with("orders-a"), transport=transport, expose=["check_inventory"]) as e:
        agent = enhance_agent(FunctionAgent(tools=[], llm=script("ok")[0]), e)
        assert [tool.metadata.name for tool in agent.tools] == ["check_inventory"]


def test_metadata_is_the_inner_tools() -> None:
    """The proxy keeps the inner tool's ToolMetadata object (name, description, schema, return_direct)."""
    inner = FunctionTool.from_defaults(lookup, return_direct=True)
    with ReachEnhancer(registry=registry_with(), transport=MockTransport(echo)) as enhancer:
        [tool] = enhance_tools([inner], enhancer, proxy_tools=False)
    assert tool.metadata is inner.metadata and tool.metadata.return_direct


def test_sync_call_outside_a_loop(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """call() works from plain synchronous code; positional arguments bind in schema order."""
    [tool] = enhance_tools([lookup], enhancer, proxy_tools=False)
    output = tool.call("A5")
    assert not output.is_error and transport.calls[0].request.payload == {"order_id": "A5"}


async def test_sync_call_inside_a_running_loop(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """call() from a coroutine (a loop is running) reaches on the enhancer's own loop instead of failing."""
    [tool, proxy] = enhance_tools([lookup], enhancer)
    with instrument_tags({SESSION_KEY: "sync-in-loop"}):
        outputs = [tool.call(order_id="A6"), proxy({"sku": "K-7"})]
    assert [output.is_error for output in outputs] == [False, False]
    assert [call.request.session_id for call in transport.calls] == ["sync-in-loop", "sync-in-loop"]


def test_too_many_positional_arguments_is_an_error_output(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """Arguments that cannot be named give an error output telling the model to pass them by name; nothing is sent."""
    [tool] = enhance_tools([lookup], enhancer, proxy_tools=False)
    output = tool.call("A1", "extra")
    assert output.is_error and "pass the arguments by name" in output.content
    assert output.raw_output["error"]["type"] == "invalid_payload" and not output.raw_output["error"]["retryable"]
    assert transport.calls == []


async def test_local_tools_still_get_their_context(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """A wrapped local tool that asks for ctx: Context gets the workflow's Context, as it would unwrapped."""
    llm, seen = script([("remember", {"note": "blue kettle"})], "ok")
    agent = enhance_agent(FunctionAgent(tools=[remember], llm=llm), enhancer)
    ctx = Context(agent)
    await agent.run("remember", ctx=ctx)
    assert seen[1] == ["noted blue kettle"] and await ctx.store.get("note") == "blue kettle"
    assert transport.calls == []


def test_local_tool_runs_when_no_agent_is_healthy(transport: MockTransport) -> None:
    """remote_first runs the inner tool when no instance can take the capability; nothing is sent."""
    with ReachEnhancer(registry=registry_with(), transport=transport, capability_map={"lookup": "query_order"}) as e:
        [tool] = enhance_tools([lookup], e, proxy_tools=False)
        output: ToolOutput = tool.call(order_id="A1")
    assert output.content == "local answer for A1" and transport.calls == []


def test_reach_is_traced_with_the_conversation(transport: MockTransport) -> None:
    """Each reached call is an execute_tool span carrying the conversation id."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = registry_with("orders-a")
    with ReachEnhancer(
        registry=registry, transport=transport, matcher=False, tracer_provider=provider, expose=["check_inventory"]
    ) as enhancer:
        proxy = next(tool for tool in enhance_tools([], enhancer) if tool.metadata.name == "check_inventory")
        with instrument_tags({SESSION_KEY: "traced"}):
            proxy.call(sku="K-7")
    span = next(s for s in exporter.get_finished_spans() if s.name == "execute_tool check_inventory")
    assert span.attributes is not None and span.attributes["gen_ai.conversation.id"] == "traced"


def test_bad_arguments_to_the_helpers(enhancer: ReachEnhancer) -> None:
    """ReachTool needs exactly one of tool/spec; enhance_agent refuses what is not an agent or a workflow."""
    with pytest.raises(TypeError, match="exactly one"):
        ReachTool(enhancer)
    with pytest.raises(TypeError, match="enhance_tools"):
        enhance_agent([lookup], enhancer)
