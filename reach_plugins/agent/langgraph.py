"""Serve a compiled LangGraph agent (or any runnable taking ``{"messages": [...]}``) as a ``chat`` capability.

The reply is normalised like every chat-style agent's: ``reply_content``,
``tool_calls``, ``raw_meta``. The session id is the graph's ``thread_id``, so
a checkpointer keeps each conversation's memory. Nothing here imports
LangGraph: the graph is used through ``ainvoke`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from reach_plugins.agent.agent import ReachAgent
from reach_plugins.agent.handlers import ReachContext
from reach_plugins.agent.server import serve
from reach_plugins.errors import InvalidPayload


class ChatGraph(Protocol):
    """What is needed of a compiled graph."""

    async def ainvoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any: ...


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return "" if content is None else str(content)


def normalise(result: Any) -> dict[str, Any]:
    """The graph's last message as ``reply_content`` / ``tool_calls`` / ``raw_meta``."""
    messages = result.get("messages") if isinstance(result, Mapping) else None
    if not messages:
        raise ValueError("the graph returned no messages")
    last = messages[-1]
    calls = getattr(last, "tool_calls", None) or []
    return {
        "reply_content": _text(getattr(last, "content", last)),
        "tool_calls": [{"id": c.get("id"), "name": c.get("name"), "arguments": c.get("args")} for c in calls],
        "raw_meta": {"message_id": getattr(last, "id", None), "messages": len(messages)},
    }


def add_langgraph(
    agent: ReachAgent, graph: ChatGraph, *, capability: str = "chat", description: str = "Chat with this agent"
) -> None:
    """Add ``capability`` to ``agent``: payload ``messages`` (or ``input`` text), one graph run per call."""

    @agent.capability(capability, description=description)
    async def chat(ctx: ReachContext, messages: list[Any] | None = None, input: str | None = None) -> dict[str, Any]:
        if not messages and input is None:
            raise InvalidPayload(f"{capability!r} needs 'messages' (a list of {{role, content}}) or 'input' (text)")
        turn = messages or [{"role": "user", "content": input}]
        config = {"configurable": {"thread_id": ctx.session_id or ctx.request_id}}
        return normalise(await graph.ainvoke({"messages": turn}, config=config))


def serve_langgraph(
    graph: ChatGraph, name: str, host: str = "127.0.0.1", port: int = 8000, *, capability: str = "chat", **options: Any
) -> None:
    """Serve ``graph`` as agent ``name`` with one ``capability`` until interrupted (see :func:`serve`)."""
    agent = ReachAgent(name)
    add_langgraph(agent, graph, capability=capability)
    serve(agent, host, port, **options)
