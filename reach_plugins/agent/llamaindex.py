"""Serve a LlamaIndex agent (``FunctionAgent``, ``ReActAgent``, ``AgentWorkflow``) as a ``chat`` capability.

One conversation per session id: each session's workflow ``Context`` and chat
history live in its session state (:attr:`ReachContext.state`) as JSON, so the
agent SDK's session snapshots carry conversations across restarts. The history
goes back in as ``chat_history`` on every run because a reused ``Context``
does not keep the agent's memory: LlamaIndex serialises a context between
runs and skips its unserialisable ``memory`` key. Calls of one session run one
at a time, so no turn is lost to a race.

A caller streaming the reach (``/reach/stream``) sees the run as it happens,
attributed to this agent: ``token`` (each ``AgentStream`` delta), ``update``
(a tool finished: ``node`` is ``tool:<name>``), the items of reaches the
agent's own tools stream (:class:`ReachStreamEvent`, keeping their author),
then the normalised reply as the closing ``reach.result``; a unary call gets
that reply alone.

    agent = ReachAgent("assistant")
    add_llamaindex(agent, FunctionAgent(tools=[...], llm=llm))
    serve(agent, port=8101)

Needs the ``llamaindex`` extra: ``pip install "reach-plugins[llamaindex]"``.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
import weakref
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

try:
    from llama_index.core.agent.workflow import AgentOutput, AgentStream, ToolCallResult
    from llama_index.core.llms import ChatMessage
    from llama_index.core.memory import BaseMemory
    from llama_index.core.workflow import Context, Event, JsonSerializer, Workflow
    from workflows.context.state_store import UnserializableKeyWarning
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        'serving a LlamaIndex agent needs the llamaindex extra: pip install "reach-plugins[llamaindex]"'
    ) from exc

from pydantic import ValidationError

from reach_plugins.agent.agent import ReachAgent
from reach_plugins.agent.handlers import Final, ReachContext
from reach_plugins.agent.server import serve
from reach_plugins.errors import ConfigError, InvalidPayload
from reach_plugins.security.verifier import TokenVerifier
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.stores.sessions import session_key

__all__ = ["STATE_KEY", "ReachStreamEvent", "add_llamaindex", "normalise", "serve_llamaindex"]

STATE_KEY = "llamaindex"
"""Where a session's ``{"context": ..., "history": [...]}`` lives in its state."""

log = logging.getLogger("reach_plugins.agent")
_SERIALIZER = JsonSerializer()


class ReachStreamEvent(Event):
    """One item of a remote agent's streamed work, shown in a workflow's event stream as it arrives."""

    agent: str | None = None
    """The agent that wrote it (a chain's inner agent keeps its own name)."""
    kind: str = "custom"
    """``token``, ``update`` (a node or tool finished), ``custom`` (the remote graph's own writes), or what it sent."""
    text: str | None = None
    node: str | None = None
    data: Any = None
    """The whole item as the remote agent sent it."""


def stream_item(agent: str, event: Any) -> dict[str, Any] | None:
    """The caller's stream item for one workflow event of agent ``agent`` (``None``: not shown)."""
    if isinstance(event, AgentStream) and event.delta:
        return {"type": "token", "agent": agent, "node": event.current_agent_name, "text": event.delta}
    if isinstance(event, ToolCallResult):
        return {"type": "update", "agent": agent, "node": f"tool:{event.tool_name}", "keys": ["tool_output"]}
    if isinstance(event, ReachStreamEvent) and isinstance(event.data, Mapping):
        return dict(event.data)
    return None


def normalise(output: Any, messages: int) -> dict[str, Any]:
    """A run's result as ``reply_content`` / ``tool_calls`` / ``raw_meta`` (any other result is its text)."""
    if not isinstance(output, AgentOutput):
        return {"reply_content": str(output), "tool_calls": [], "raw_meta": {"agent": None, "messages": messages}}
    calls = [{"id": call.tool_id, "name": call.tool_name, "arguments": call.tool_kwargs} for call in output.tool_calls]
    return {
        "reply_content": output.response.content or "",
        "tool_calls": calls,
        "raw_meta": {"agent": output.current_agent_name, "messages": messages},
    }


def _reply_message(output: Any) -> ChatMessage:
    if isinstance(output, AgentOutput):
        return output.response
    return ChatMessage(role="assistant", content=str(output))


def _turns(capability: str, messages: list[Any] | None, text: str | None) -> list[ChatMessage]:
    if not messages and text is None:
        raise InvalidPayload(f"{capability!r} needs 'messages' (a list of {{role, content}}) or 'input' (text)")
    if not messages:
        return [ChatMessage(role="user", content=text)]
    try:
        return [ChatMessage.model_validate(message) for message in messages]
    except ValidationError as exc:
        raise InvalidPayload(
            f"{capability!r}: each message needs a role and content ({exc.errors()[0]['msg']})"
        ) from None


def _trimmed(history: list[ChatMessage], limit: int) -> list[ChatMessage]:
    """The last ``limit`` messages at most, starting at a user message (never half a tool exchange)."""
    kept = history[-limit:]
    start = next((i for i, message in enumerate(kept) if message.role == "user"), len(kept))
    return kept[start:]


def _snapshot(context: Context) -> dict[str, Any] | None:
    """The context as JSON (its memory is skipped: the history is kept beside it), or ``None`` if it cannot be."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnserializableKeyWarning)
            return context.to_dict(serializer=_SERIALIZER)
    except (TypeError, ValueError):
        log.warning("the workflow state of a session is not JSON serialisable; it is not kept", exc_info=True)
        return None


async def _run(
    workflow: Workflow, state: dict[str, Any], turns: list[ChatMessage], limit: int, streamed_as: str | None
) -> AsyncIterator[Any]:
    """One run continuing the session kept in ``state`` (updated with the outcome): the events a caller streaming
    as agent ``streamed_as`` sees (none for ``None``), then the reply as :class:`Final`."""
    saved: Mapping[str, Any] = state.get(STATE_KEY) or {}
    history = [ChatMessage.model_validate(message) for message in saved.get("history", [])] + turns[:-1]
    previous = saved.get("context")
    context = Context.from_dict(workflow, previous, serializer=_SERIALIZER) if previous else Context(workflow)
    handler = workflow.run(user_msg=turns[-1], chat_history=history, ctx=context)
    if streamed_as is not None:
        async for event in handler.stream_events():
            item = stream_item(streamed_as, event)
            if item is not None:
                yield item
    output = await handler
    memory = await context.store.get("memory", default=None)
    if isinstance(memory, BaseMemory):
        history = await memory.aget_all()
    else:
        history = [*history, turns[-1], _reply_message(output)]
    history = _trimmed(history, limit)
    state[STATE_KEY] = {
        "context": _snapshot(context),
        "history": [message.model_dump(mode="json") for message in history],
    }
    yield Final(normalise(output, len(history)))


def add_llamaindex(
    agent: ReachAgent,
    workflow: Workflow,
    *,
    capability: str = "chat",
    description: str = "Chat with this agent",
    history_limit: int = 200,
) -> None:
    """Add ``capability`` to ``agent``: payload ``messages`` (or ``input`` text), one workflow run per call.

    ``workflow`` is a LlamaIndex agent or ``AgentWorkflow`` (any workflow whose
    ``run`` takes ``user_msg`` and ``chat_history``). Each session keeps at most
    ``history_limit`` messages of history.
    """
    if history_limit < 1:
        raise ConfigError(f"history_limit must be at least 1 message, got {history_limit}")
    locks: weakref.WeakValueDictionary[ScopedKey, asyncio.Lock] = weakref.WeakValueDictionary()
    """One lock per tenant's conversation: another tenant's session of the same id never waits on it."""

    @agent.capability(capability, description=description)
    async def chat(
        ctx: ReachContext, messages: list[Any] | None = None, input: str | None = None
    ) -> AsyncIterator[Any]:
        turns = _turns(capability, messages, input)
        streamed_as = agent.name if ctx.streaming else None
        if ctx.session_id is None:
            async for item in _run(workflow, ctx.state, turns, history_limit, streamed_as):
                yield item
            return
        lock = locks.setdefault(session_key(ctx.tenant, ctx.session_id), asyncio.Lock())
        async with lock:
            async for item in _run(workflow, ctx.state, turns, history_limit, streamed_as):
                yield item


def serve_llamaindex(
    workflow: Workflow,
    name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    capability: str = "chat",
    tokens: TokenVerifier | Literal["open"] | None = None,
    **options: Any,
) -> None:
    """Serve ``workflow`` as agent ``name`` with one ``capability`` until interrupted (see :func:`serve`); every
    call needs a token ``tokens`` accepts, as for :class:`ReachAgent` (``tokens="open"``: none, with a warning)."""
    agent = ReachAgent(name, tokens=tokens)
    add_llamaindex(agent, workflow, capability=capability)
    serve(agent, host, port, **options)
