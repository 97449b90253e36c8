"""Serve a compiled LangGraph agent (or any runnable taking ``{"messages": [...]}``) as a Reach agent.

The one way to serve a graph: :func:`add_langgraph` adds its capabilities to a
:class:`ReachAgent`, :func:`serve_graph` serves and registers one in the
background (what ``create_agent(..., enhanced_by=ReachEnhancer(auto_register=True))``
calls), :func:`serve_langgraph` serves one in the foreground. A call's
``messages`` (or ``input`` / ``message`` text, else its payload as JSON) is the
user turn; the caller's conversation (its tenant's session key,
:func:`thread_id`) is the graph's ``thread_id``, so a checkpointer keeps each
conversation and tenant B naming tenant A's session id gets a thread of its
own; the reply is normalised like every chat-style agent's: ``reply_content``,
``tool_calls``, ``raw_meta``. The graph runs with ``astream`` on the agent's
loop, so a caller streaming the reach (``/reach/stream``) sees the run as it
happens, each item attributed to this agent (``agent``): ``token`` (the text of
a message chunk, from ``stream_mode="messages"``), ``update`` (a node finished:
its name and the state keys it wrote), ``custom`` (what the graph wrote with
``get_stream_writer()``), then the normalised reply as the closing
``reach.result`` (:class:`~reach_plugins.agent.handlers.Final`); a unary call
gets that reply alone. Reaches it makes continue the caller's hop chain and
trace (:mod:`reach_plugins.security.context`). Nothing here imports LangGraph.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from reach_plugins.agent.agent import ReachAgent
from reach_plugins.agent.handlers import Final, ReachContext
from reach_plugins.agent.server import serve
from reach_plugins.errors import ApprovalRequired, InvalidPayload
from reach_plugins.model import Capability
from reach_plugins.server.uvicorn import BackgroundServer
from reach_plugins.stores.sessions import session_key

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from reach_plugins.registry import Registry
    from reach_plugins.security.verifier import TokenVerifier

MESSAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"message": {"type": "string", "description": "What to ask this agent, in plain words"}},
    "required": ["message"],
}
"""Arguments of a served capability declared by name only: one message in plain words."""


class ChatGraph(Protocol):
    """What is needed of a compiled graph."""

    def astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]: ...


STREAM_MODES = ["messages", "updates", "custom", "values"]
"""What a streamed run streams: tokens, node updates and custom writes go to the caller; the last values answer."""
UNARY_MODES = ["updates", "values"]
"""What a unary run needs: the last values, and the updates that say whether it paused (models are not streamed)."""


def _text(content: Any) -> str:
    """A message's text (content blocks joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part if isinstance(part, str) else str(part.get("text", "")) for part in content)
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


def _turn(capability: str, payload: Mapping[str, Any]) -> list[Any]:
    """The user turn a call carries: ``messages``, or ``input`` / ``message`` text, else the payload as JSON."""
    messages = payload.get("messages")
    if messages is not None:
        if not isinstance(messages, list) or not messages:
            raise InvalidPayload(f"{capability!r}: 'messages' must be a non-empty list of {{role, content}}")
        return messages
    for field in ("input", "message"):
        if isinstance(payload.get(field), str) and set(payload) == {field}:
            return [{"role": "user", "content": payload[field]}]
    if not payload:
        raise InvalidPayload(f"{capability!r} needs 'messages' (a list of {{role, content}}) or 'input' (text)")
    return [{"role": "user", "content": json.dumps(dict(payload), ensure_ascii=False)}]


def stream_events(agent: str, mode: str, chunk: Any) -> list[dict[str, Any]]:
    """The caller's stream items for one ``astream`` chunk of ``mode``, attributed to ``agent``.

    A token streamed from a reach this graph made keeps the agent that wrote it (the chunk's ``name``), so a
    chain's text arrives once, attributed to its author, never wrapped by each hop.
    """
    if mode == "messages":
        message, metadata = chunk
        text = _text(getattr(message, "content", None))
        if not text or getattr(message, "type", None) not in {"AIMessageChunk", "ai"}:
            return []
        node = metadata.get("langgraph_node") if isinstance(metadata, Mapping) else None
        author = getattr(message, "name", None) or agent
        return [{"type": "token", "agent": author, "node": node, "text": text}]
    if mode == "updates" and isinstance(chunk, Mapping):
        return [
            {"type": "update", "agent": agent, "node": node, "keys": sorted(update or ())}
            for node, update in chunk.items()
            if node != "__interrupt__"
        ]
    if mode == "custom":
        return [{"type": "custom", "agent": agent, "data": chunk}]
    return []


def thread_id(ctx: ReachContext) -> str:
    """The graph thread of the caller's conversation: its tenant's session key (a call without a session: its own)."""
    return session_key(ctx.tenant, ctx.session_id or ctx.request_id).encode()


def add_langgraph(
    agent: ReachAgent,
    graph: ChatGraph,
    *,
    capabilities: Sequence[Capability | str] = ("chat",),
    description: str = "Chat with this agent",
) -> None:
    """Add ``capabilities`` to ``agent``, each answered by one graph run per call."""

    async def run(ctx: ReachContext, **payload: Any) -> AsyncIterator[Any]:
        config = {"configurable": {"thread_id": thread_id(ctx)}}
        state: Any = None
        paused = False
        turn = {"messages": _turn(ctx.capability, payload)}
        modes = STREAM_MODES if ctx.streaming else UNARY_MODES
        async for mode, chunk in graph.astream(turn, config=config, stream_mode=modes):
            if mode == "values":
                state = chunk
                continue
            paused = paused or (mode == "updates" and isinstance(chunk, Mapping) and "__interrupt__" in chunk)
            for event in stream_events(agent.name, mode, chunk) if ctx.streaming else ():
                yield event
        if paused:
            raise ApprovalRequired(
                f"{ctx.capability!r} of agent {agent.name!r} paused its graph for a human's approval (an interrupt), "
                f"which a reach cannot answer, so it did not finish: approve it where {agent.name!r} runs, or give "
                f"{agent.name!r} an approver (ReachAgent(approver=CallerApproval()) lets its callers approve)"
            )
        yield Final(normalise(state))

    for item in capabilities:
        declared = Capability(name=item) if isinstance(item, str) else item
        schema = declared.params_schema or (None if isinstance(item, str) and item == "chat" else MESSAGE_SCHEMA)
        update = {"description": declared.description or description, "params_schema": schema}
        agent.offer(declared.model_copy(update=update))(run)


@dataclass(frozen=True, slots=True)
class ServedAgent:
    """A graph answering as a Reach agent at ``url`` (registered while it runs)."""

    name: str
    url: str
    agent: ReachAgent
    server: BackgroundServer

    def stop(self) -> None:
        """Deregister and stop serving."""
        self.server.stop()


def serve_graph(
    graph: ChatGraph,
    name: str,
    capabilities: Sequence[Capability | str],
    *,
    registry: Registry | str,
    description: str = "",
    host: str = "127.0.0.1",
    port: int = 0,
    tracer_provider: TracerProvider | None = None,
    tokens: TokenVerifier | Literal["open"] | None = None,
) -> ServedAgent:
    """Serve ``graph`` as agent ``name`` in the background, registered in ``registry`` until stopped; ``tokens``
    as :class:`ReachAgent`'s (a verifier of your issuer; by default this process's issuer; ``"open"`` verifies
    nothing and warns)."""
    agent = ReachAgent(name, description=description, tracer_provider=tracer_provider, tokens=tokens)
    add_langgraph(agent, graph, capabilities=capabilities, description=description or f"Ask {name}")
    server = BackgroundServer(agent.app, host=host, port=port)
    agent.register_on_startup(registry, server.url)
    server.start()
    return ServedAgent(name, server.url, agent, server)


def serve_langgraph(
    graph: ChatGraph,
    name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    capability: str = "chat",
    tokens: TokenVerifier | Literal["open"] | None = None,
    **options: Any,
) -> None:
    """Serve ``graph`` as agent ``name`` with one ``capability`` until interrupted (see :func:`serve`); every call
    needs a token ``tokens`` accepts, as for :class:`ReachAgent` (``tokens="open"``: none, with a warning)."""
    agent = ReachAgent(name, tokens=tokens)
    add_langgraph(agent, graph, capabilities=[capability])
    serve(agent, host, port, **options)
