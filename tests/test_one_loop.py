"""One loop per client (DESIGN.md 11.8): framework adapters touch the client's router only on the client's loop.

Every call into any :class:`Router` is recorded with the thread it ran in; the
adapters are driven through their real paths (LangChain ``create_agent(...)
.invoke`` and ``ainvoke``, LlamaIndex's sync tool ``call``, Dify's
``before_invoke``), and every recorded thread must be the one running the
client's loop.
"""

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from llama_index.core.tools import FunctionTool

from reach_plugins import AgentDescriptor, Capability, ReachEnhancer, dify
from reach_plugins.langchain import create_agent
from reach_plugins.llamaindex import ReachTool
from reach_plugins.model import Instance
from reach_plugins.registry import MemoryRegistry
from reach_plugins.routing import Router
from reach_plugins.transport import Call, MockTransport

CATALOGUE = [Capability(name="query_order", description="Look up where a customer's order is")]
ROUTER_CALLS = ("route", "candidates", "pinned", "release")

Seen = list[tuple[str, int]]


class ScriptedModel(GenericFakeChatModel):
    """A fake chat model that accepts tools (langchain_core's fakes refuse bind_tools)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(**kwargs)


@tool
def query_order(order_id: str) -> str:
    """Look up where an order is (the local implementation)."""
    return f"local answer for {order_id}"


def lookup(order_id: str) -> str:
    """Look up an order (the local implementation)."""
    return f"local answer for {order_id}"


def echo(call: Call) -> dict[str, Any]:
    return {"instance": call.instance.instance_id, "payload": call.request.payload}


@pytest.fixture
def router_calls(monkeypatch: pytest.MonkeyPatch) -> Seen:
    """Every call into any Router made during the test: (method, thread ident)."""
    seen: Seen = []
    for name in ROUTER_CALLS:
        method: Callable[..., Any] = getattr(Router, name)

        def recording(self: Router, *args: Any, _name: str = name, _method: Any = method, **kwargs: Any) -> Any:
            seen.append((_name, threading.get_ident()))
            return _method(self, *args, **kwargs)

        monkeypatch.setattr(Router, name, recording)
    return seen


@pytest.fixture
def transport() -> MockTransport:
    return MockTransport(echo)


@pytest.fixture
def enhancer(transport: MockTransport) -> Iterator[ReachEnhancer]:
    registry = MemoryRegistry()
    asyncio.run(registry.register_agent(AgentDescriptor(name="orders", capabilities=CATALOGUE)))
    for name in ("orders-a", "orders-b"):
        endpoint = f"http://127.0.0.1:9/{name}"  # never dialled: the mock transport answers
        asyncio.run(registry.register_instance(Instance(agent="orders", instance_id=name, endpoint=endpoint)))
    with ReachEnhancer(
        registry=registry, transport=transport, matcher=False, capability_map={"lookup": "query_order"}
    ) as enhancer:
        yield enhancer


def loop_thread(enhancer: ReachEnhancer) -> int:
    """The ident of the thread that runs the enhancer's client loop."""

    async def ident() -> int:
        return threading.get_ident()

    return enhancer.blocking.bridge.run(ident())


def agent_of(enhancer: ReachEnhancer) -> Any:
    """A LangChain agent that looks up order A1 with its local tool, then answers."""
    call = AIMessage(content="", tool_calls=[{"name": "query_order", "args": {"order_id": "A1"}, "id": "c1"}])
    return create_agent(ScriptedModel(messages=iter([call, "done"])), [query_order], enhanced_by=enhancer)


def check_on_the_loop(seen: Seen, enhancer: ReachEnhancer, *expected: str) -> None:
    """The router was asked for ``expected`` (at least), and only ever on the client's loop thread."""
    owner = loop_thread(enhancer)
    assert {name for name, _ in seen} >= set(expected)
    assert {thread for _, thread in seen} == {owner}, f"router touched off the client's loop: {seen}"


def test_langchain_invoke_asks_the_router_only_on_the_clients_loop(
    router_calls: Seen, enhancer: ReachEnhancer, transport: MockTransport
) -> None:
    """create_agent(...).invoke: the health check, the reach and closing the conversation all run on the loop."""
    agent_of(enhancer).invoke({"messages": [("user", "where is A1?")]}, {"configurable": {"thread_id": "t-1"}})
    enhancer.close_session("t-1")
    assert [call.request.session_id for call in transport.calls] == ["t-1"]
    check_on_the_loop(router_calls, enhancer, "candidates", "route", "release")


async def test_langchain_ainvoke_asks_the_router_only_on_the_clients_loop(
    router_calls: Seen, enhancer: ReachEnhancer, transport: MockTransport
) -> None:
    """ainvoke runs on the caller's loop; its decision and reach still ask the router on the client's loop."""
    await agent_of(enhancer).ainvoke({"messages": [("user", "where is A1?")]}, {"configurable": {"thread_id": "t-2"}})
    await enhancer.aclose_session("t-2")
    assert len(transport.calls) == 1
    check_on_the_loop(router_calls, enhancer, "candidates", "route", "release")


def test_llamaindex_sync_call_asks_the_router_only_on_the_clients_loop(
    router_calls: Seen, enhancer: ReachEnhancer, transport: MockTransport
) -> None:
    """LlamaIndex's blocking tool call decides and reaches on the client's loop, not the caller's thread."""
    output = ReachTool(enhancer, FunctionTool.from_defaults(lookup)).call(order_id="A1")
    assert not output.is_error and len(transport.calls) == 1
    check_on_the_loop(router_calls, enhancer, "candidates", "route")


async def test_llamaindex_sync_call_inside_a_running_loop_stays_off_that_loop(
    router_calls: Seen, enhancer: ReachEnhancer, transport: MockTransport
) -> None:
    """A sync tool call made from a thread that runs a loop (Jupyter) still asks the router on the client's loop."""
    output = ReachTool(enhancer, FunctionTool.from_defaults(lookup)).call(order_id="A2")
    assert not output.is_error and len(transport.calls) == 1
    check_on_the_loop(router_calls, enhancer, "candidates", "route")


def test_dify_hook_asks_the_router_only_on_the_clients_loop(
    router_calls: Seen, enhancer: ReachEnhancer, transport: MockTransport
) -> None:
    """Dify's before_invoke (a plugin's thread) decides and reaches on the client's loop."""
    result = dify.before_invoke(
        "query_order", {"order_id": "A3"}, conversation_id="c-1", app_id="a", user_id="u", enhancer=enhancer
    )
    assert result is not None and result.ok and len(transport.calls) == 1
    check_on_the_loop(router_calls, enhancer, "candidates", "route")


def test_resolve_answers_the_same_from_any_thread(enhancer: ReachEnhancer) -> None:
    """enhancer.resolve maps a tool alike from the caller, another thread, a running loop and the client's loop."""

    async def on_a_loop() -> str | None:
        return enhancer.resolve("lookup", "Look up an order")

    answers = [enhancer.resolve("lookup", "Look up an order")]
    worker = threading.Thread(target=lambda: answers.append(enhancer.resolve("lookup", "Look up an order")))
    worker.start()
    worker.join()
    answers.append(asyncio.run(on_a_loop()))
    answers.append(enhancer.blocking.bridge.run(on_a_loop()))
    assert answers == ["query_order"] * 4
