"""A local tool runs locally unless the user said otherwise (issue 26, deliverable 1).

A real agent-SDK server offers ``query_order`` and the ``danger_level: high``
``cancel_order``; a LangGraph ``create_agent`` and a LlamaIndex
``FunctionAgent``, driven by fake models, have local tools named otherwise
(``get_order_status``, ``delete_order``). Both sides count executions, so a
tool routed away from its local code is seen, not guessed.

No ``from __future__ import annotations``: LlamaIndex reads tool annotations as classes.
"""

import collections
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ToolCallBlock
from llama_index.core.llms import ChatMessage
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.tools import FunctionTool

from reach_plugins import ReachEnhancer
from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.langchain import create_agent
from reach_plugins.llamaindex import enhance_agent
from reach_plugins.matching import CapabilityMatcher, LexicalEmbedder
from reach_plugins.registry import MemoryRegistry
from transports.direct import DirectTransport

RAN: collections.Counter[str] = collections.Counter()
"""Executions per tool or capability, local (``local:``) and remote (``remote:``)."""
LEXICAL = LexicalEmbedder()
ORDER_STATUS = "Get the status of a customer's order and where it is"
DELETE_ORDER = "Cancel a customer's order so that it is not shipped"


class ScriptedModel(GenericFakeChatModel):
    """A fake chat model that accepts tools (langchain_core's fakes refuse bind_tools)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(**kwargs)


@tool(description=ORDER_STATUS)
def get_order_status(order_id: str) -> str:
    RAN["local:get_order_status"] += 1
    return f"local status of {order_id}"


@tool(description=DELETE_ORDER)
def delete_order(order_id: str) -> str:
    RAN["local:delete_order"] += 1
    return f"local delete of {order_id}"


def li_get_order_status(order_id: str) -> str:
    """Get the status of a customer's order and where it is."""
    RAN["local:get_order_status"] += 1
    return f"local status of {order_id}"


def li_delete_order(order_id: str) -> str:
    """Cancel a customer's order so that it is not shipped."""
    RAN["local:delete_order"] += 1
    return f"local delete of {order_id}"


@pytest.fixture(scope="module")
def registry() -> Iterator[MemoryRegistry]:
    """The orders agent on its own uvicorn server; it approves its dangerous capability (the caller decides)."""
    registry = MemoryRegistry()
    agent = ReachAgent("orders", tokens="open", approver=lambda request: True)

    @agent.capability("query_order", description="Look up where a customer's order is and its delivery status")
    def query_order(order_id: str) -> dict[str, str]:
        RAN["remote:query_order"] += 1
        return {"order_id": order_id, "status": "shipped"}

    @agent.capability("cancel_order", description="Cancel a customer's order before it ships", danger_level="high")
    def cancel_order(order_id: str) -> dict[str, str]:
        RAN["remote:cancel_order"] += 1
        return {"order_id": order_id, "status": "cancelled"}

    server = BackgroundServer(agent.app)
    agent.register_on_startup(registry, server.url)
    server.start()
    yield registry
    server.stop()


@pytest.fixture(autouse=True)
def counted() -> None:
    RAN.clear()


def enhancer(registry: MemoryRegistry, **options: Any) -> ReachEnhancer:
    """An enhancer over real HTTP; it approves dangerous calls, so only the mapping can keep one local."""
    return ReachEnhancer(registry=registry, transport=DirectTransport(), approver=lambda pending: True, **options)


def run_langgraph(e: ReachEnhancer, local: Any, name: str) -> ToolMessage:
    """One turn of a real create_agent whose model calls ``name`` once; the tool's message."""
    calls = [{"name": name, "args": {"order_id": "A1"}, "id": f"{name}-1"}]
    model = ScriptedModel(messages=iter([AIMessage(content="", tool_calls=calls), "done"]))
    agent = create_agent(model, [local], enhanced_by=e, checkpointer=InMemorySaver())
    state = agent.invoke({"messages": [("user", "order A1")]}, {"configurable": {"thread_id": "t-1"}})
    return next(m for m in state["messages"] if isinstance(m, ToolMessage))


async def run_llamaindex(e: ReachEnhancer, local: Any, name: str) -> None:
    """One run of a real FunctionAgent whose model calls ``name`` (the local function ``local``'s tool) once."""
    turns: list[Any] = [[ToolCallBlock(tool_call_id=f"{name}-1", tool_name=name, tool_kwargs={"order_id": "A1"})]]
    turns.append("done")

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        turn = turns.pop(0)
        return ChatMessage(role="assistant", content=turn) if isinstance(turn, str) else ChatMessage(blocks=turn)

    llm = MockFunctionCallingLLM(response_generator=respond)
    function = FunctionTool.from_defaults(local, name=name, description=local.__doc__)
    agent = enhance_agent(FunctionAgent(tools=[function], llm=llm), e)
    assert str(await agent.run("order A1")) == "done"


def test_by_default_a_local_tool_near_a_remote_capability_runs_locally(registry: MemoryRegistry) -> None:
    """get_order_status beside remote query_order (no map, default settings): the local code runs, said why."""
    with enhancer(registry) as e:
        message = run_langgraph(e, get_order_status, "get_order_status")
        found = e.explain("get_order_status", ORDER_STATUS)
    assert message.content == "local status of A1"
    assert RAN == {"local:get_order_status": 1}
    assert (found.capability, found.rule) == (None, "unmapped")
    assert "match='semantic'" in found.detail and "capability_map" in found.detail


async def test_llamaindex_keeps_a_local_tool_local_by_default(registry: MemoryRegistry) -> None:
    """The same through a LlamaIndex FunctionAgent: the local function runs, the agent is not reached."""
    async with enhancer(registry) as e:
        await run_llamaindex(e, li_get_order_status, "get_order_status")
    assert RAN == {"local:get_order_status": 1}


def test_meaning_never_routes_to_a_high_danger_capability(registry: MemoryRegistry) -> None:
    """delete_order, semantically closest to danger_level high cancel_order under the opt-in: it stays local."""
    with enhancer(registry, match="semantic", min_similarity=LEXICAL.recommended_threshold, matcher=LEXICAL) as e:
        evidence = CapabilityMatcher(e.catalogue().values(), embedder=LEXICAL).match("delete_order", DELETE_ORDER)
        message = run_langgraph(e, delete_order, "delete_order")
        found = e.explain("delete_order", DELETE_ORDER)
    assert (evidence.capability, evidence.reason) == ("cancel_order", "semantic")
    assert message.content == "local delete of A1"
    assert RAN == {"local:delete_order": 1}
    assert (found.capability, found.rule) == (None, "high_danger")
    assert "capability_map={'delete_order': 'cancel_order'}" in found.detail


async def test_llamaindex_meaning_never_routes_to_a_high_danger_capability(registry: MemoryRegistry) -> None:
    """The same through a LlamaIndex FunctionAgent under the semantic opt-in."""
    options = {"match": "semantic", "min_similarity": 0.0, "matcher": LEXICAL}
    async with enhancer(registry, **options) as e:
        await run_llamaindex(e, li_delete_order, "delete_order")
    assert RAN == {"local:delete_order": 1}


def test_the_semantic_opt_in_routes_only_at_its_stated_threshold(registry: MemoryRegistry) -> None:
    """match="semantic": get_order_status reaches query_order when its score meets min_similarity, else stays local."""
    with enhancer(registry) as probe:
        matcher = CapabilityMatcher(probe.catalogue().values(), embedder=LEXICAL)
    (best, score), (_, runner_up) = matcher.rank("get_order_status", ORDER_STATUS)[:2]
    assert best == "query_order" and score - runner_up > 0.05
    with enhancer(registry, match="semantic", min_similarity=score, matcher=LEXICAL) as e:
        routed = run_langgraph(e, get_order_status, "get_order_status")
    assert RAN == {"remote:query_order": 1}
    assert routed.artifact["reach"]["capability"] == "query_order"
    RAN.clear()
    with enhancer(registry, match="semantic", min_similarity=min(1.0, score + 0.01), matcher=LEXICAL) as e:
        kept = run_langgraph(e, get_order_status, "get_order_status")
        found = e.explain("get_order_status", ORDER_STATUS)
    assert kept.content == "local status of A1" and RAN == {"local:get_order_status": 1}
    assert (found.rule, f"{score:.3f}" in found.detail) == ("below_threshold", True)


@pytest.mark.parametrize(
    ("local", "name", "options", "capability"),
    [
        (get_order_status, "get_order_status", {"capability_map": {"get_order_status": "query_order"}}, "query_order"),
        (delete_order, "delete_order", {"capability_map": {"delete_order": "cancel_order"}}, "cancel_order"),
    ],
)
def test_the_map_routes_even_a_dangerous_capability(
    registry: MemoryRegistry, local: Any, name: str, options: dict[str, Any], capability: str
) -> None:
    """capability_map is the user's word: the tool reaches the mapped capability (approved), its local code idle."""
    with enhancer(registry, **options) as e:
        message = run_langgraph(e, local, name)
        assert e.explain(name).rule == "map"
    assert message.artifact["reach"]["capability"] == capability
    assert {f"remote:{capability}": 1} == RAN


@tool
def cancel_order(order_id: str) -> str:
    """Cancel an order (a local tool with the remote capability's own name)."""
    RAN["local:cancel_order"] += 1
    return f"local cancel of {order_id}"


async def test_an_exact_name_routes_in_both_frameworks(registry: MemoryRegistry) -> None:
    """A tool named like the capability (here the dangerous one) reaches it from LangGraph and LlamaIndex."""
    with enhancer(registry) as e:
        message = run_langgraph(e, cancel_order, "cancel_order")
        assert e.explain("cancel_order").rule == "exact"
    assert message.artifact["reach"]["capability"] == "cancel_order"
    assert RAN == {"remote:cancel_order": 1}

    def li_cancel_order(order_id: str) -> str:
        """Cancel an order."""
        RAN["local:cancel_order"] += 1
        return "local"

    async with enhancer(registry) as e:
        await run_llamaindex(e, li_cancel_order, "cancel_order")
    assert RAN == {"remote:cancel_order": 2}
