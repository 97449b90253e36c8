"""Real served agents for the host-native tests: orders (structured replies, a refusal, a dangerous refund) and
LangGraph agents built with create_agent and a scripted model, all on one registry, reached by DirectTransport."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGenerationChunk
from langgraph.checkpoint.memory import InMemorySaver

from reach_plugins import Capability, ReachEnhancer
from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.agent.langgraph import serve_graph
from reach_plugins.errors import BusinessError
from reach_plugins.frameworks.toolcalls import ServeSpec
from reach_plugins.langchain import create_agent
from reach_plugins.registry import MemoryRegistry
from transports.direct import DirectTransport


class ScriptedModel(GenericFakeChatModel):
    """A fake chat model that accepts tools and streams tool calls too (GenericFakeChatModel streams text only)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(**kwargs)

    def _stream(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Iterator[Any]:
        message = self._generate(messages, stop, run_manager, **kwargs).generations[0].message
        assert isinstance(message, AIMessage)
        if message.tool_calls:
            calls = [
                {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": n}
                for n, c in enumerate(message.tool_calls)
            ]
            yield ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=calls))  # type: ignore[arg-type]
            return
        for token in re.split(r"(\s)", str(message.content)):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=token))
            if run_manager is not None:
                run_manager.on_llm_new_token(token, chunk=chunk)
            yield chunk


def model(*messages: AIMessage | str) -> ScriptedModel:
    return ScriptedModel(messages=iter(messages))


def calls(name: str, **args: Any) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"{name}-1"}])


def tool_message(messages: Sequence[BaseMessage]) -> ToolMessage:
    (message,) = [m for m in messages if isinstance(m, ToolMessage)]
    return message


ORDER = Capability(
    name="query_order",
    description="Where an order is",
    params_schema={"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
)
REFUND = Capability(
    name="refund_order",
    description="Refund an order",
    danger_level="high",
    params_schema={"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
)


EXPOSED = ["query_order", "refund_order", "handle_order", "check_stock", "chat"]
"""Every capability of these tests, by name (a dangerous one is exposed by its name only)."""


class World:
    """One registry, the servers and enhancers started on it (all stopped at the end)."""

    def __init__(self) -> None:
        self.registry = MemoryRegistry()
        self.servers: list[BackgroundServer] = []
        self.enhancers: list[ReachEnhancer] = []
        self.ran: list[dict[str, Any]] = []

    def enhancer(self, **options: Any) -> ReachEnhancer:
        enhancer = ReachEnhancer(
            registry=self.registry, transport=DirectTransport(), matcher=False, expose=EXPOSED, **options
        )
        self.enhancers.append(enhancer)
        return enhancer

    def serve(self, agent: ReachAgent) -> None:
        server = BackgroundServer(agent.app)
        agent.register_on_startup(self.registry, server.url)
        self.servers.append(server.start())

    def orders(self) -> None:
        """query_order answers a structure (or refuses A9); refund_order runs once per approved call."""
        agent = ReachAgent("orders", tokens="open", approver=lambda request: True)

        @agent.offer(ORDER)
        def query_order(order_id: str) -> dict[str, Any]:
            self.ran.append({"query_order": order_id})
            if order_id == "A9":
                raise BusinessError("there is no order A9")
            return {"order_id": order_id, "status": "shipped", "eta_days": 2}

        @agent.offer(REFUND)
        def refund_order(order_id: str) -> dict[str, Any]:
            self.ran.append({"refund_order": order_id})
            return {"refunded": order_id}

        self.serve(agent)

    def close(self) -> None:
        for enhancer in self.enhancers:
            enhancer.close()
        for server in self.servers:
            server.stop()


def serve_langgraph_agent(world: World, name: str, capability: str, script: Sequence[AIMessage | str]) -> None:
    """A LangGraph agent built with create_agent, served under ``capability`` (a message in plain words)."""
    enhancer = world.enhancer(serve_as=ServeSpec(name, [capability]))
    graph = create_agent(model(*script), [], checkpointer=InMemorySaver(), enhanced_by=enhancer)
    enhancer.adopt(serve_graph(graph, name, [capability], registry=world.registry, tokens="open"))
