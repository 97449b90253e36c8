"""LangChain / LangGraph adapter: one changed line puts every tool call another agent can serve through Reach.

    from reach_plugins.frameworks.langchain import create_agent
    agent = create_agent(model, tools, checkpointer=saver, enhanced_by=ReachEnhancer(registry="memory://"))

:class:`ReachMiddleware` implements both ``wrap_tool_call`` and
``awrap_tool_call`` (a sync-only one breaks ``ainvoke``). For a remote call it
swaps the tool (``handler(request.override(tool=...))``) instead of answering
itself, so LangChain's tool callbacks and error handling still run. The
ToolMessage's ``artifact`` is ``{"structured_content": <the agent's data>,
"reach": <the route>}`` (``structured_content`` as langchain-mcp-adapters
gives it); a failure is ``ToolMessage(status="error")`` whose artifact is
``{"error": <the error record>, "reach": <the route>}``. ``create_agent`` puts
a :class:`ReachErrorMiddleware` first, so a *retryable* failure
(:func:`~reach_plugins.errors.is_retryable`) travels as the
:mod:`~reach_plugins.errors` exception through the middleware between them
(``ToolRetryMiddleware(retry_on=errors.is_retryable)`` retries it) and
becomes the error ToolMessage at the top; a refusal is a message at once.
``on_error="raise"`` lets every failure escape the run. Under
``remote_first`` a reach that reached no agent runs the local tool in the same
call (the route says ``fallback``). The conversation key is the LangGraph
``thread_id``.

Approval, LangChain's way: a dangerous capability pauses the run with
``interrupt`` whose value has the shape of ``HumanInTheLoopMiddleware``'s
per-call ``tool_approval`` request; resume with its decisions,
``Command(resume={"decisions": [{"type": "approve"}]})`` (or ``"edit"`` with
``edited_action``, sent with the edited arguments; or ``"reject"`` with a
``message``). A tool a ``HumanInTheLoopMiddleware`` of the same agent already
reviews is not asked about again (one question). Resuming needs a checkpointer.

While the host streams (``astream(stream_mode="messages")``, or
``stream=True``), a remote reach is streamed: a remote LangGraph agent's tokens
arrive in ``messages`` mode as ``AIMessageChunk`` named after the agent that
wrote them, and every item (tokens, node updates, custom writes, each with its
``agent``) in ``custom`` mode through ``get_stream_writer()``.

The same two methods plug into ``ToolNode(tools, wrap_tool_call=...,
awrap_tool_call=...)``; add ``middleware.tools`` to that ToolNode's tools.
With ``auto_register=True`` the built agent is served as a Reach agent in turn
(:func:`reach_plugins.agent.langgraph.serve_graph`, the agent SDK's one way to serve a graph).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

try:
    from langchain.agents import create_agent as _create_agent
    from langchain.agents.middleware import AgentMiddleware, HumanInTheLoopMiddleware
    from langchain_core.callbacks import AsyncCallbackManager, CallbackManager
    from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, LLMResult
    from langchain_core.tools import BaseTool, StructuredTool, ToolException
    from langchain_core.tracers._streaming import _StreamingCallbackHandler
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.config import get_stream_writer
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.types import Command, interrupt
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        'the LangChain adapter needs the langchain extra: pip install "reach-plugins[langchain]"'
    ) from exc

from reach_plugins.agent.langgraph import serve_graph
from reach_plugins.errors import InvalidPayload, ReachError, is_retryable
from reach_plugins.frameworks.toolcalls import (
    ANY_OBJECT,
    Approver,
    Decision,
    PendingApproval,
    ProxySpec,
    ToolCall,
    ToolResult,
    Verdict,
    content_of,
    error_record,
    error_text,
)
from reach_plugins.wire.items import is_result

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from reach_plugins.frameworks.enhancer import ReachEnhancer, SessionKey

ToolOutput = ToolMessage | Command[Any]
Callbacks = CallbackManager | AsyncCallbackManager | None

DECISIONS = ("approve", "edit", "reject")
"""The decisions a Reach approval interrupt accepts (``HumanInTheLoopMiddleware``'s, but ``respond``)."""


def thread_id_of(request: ToolCallRequest) -> str | None:
    """The LangGraph ``thread_id`` of the run this tool call belongs to (the conversation key)."""
    runtime = request.runtime
    if runtime is None:
        return None
    thread = (runtime.config or {}).get("configurable", {}).get("thread_id")
    if thread is None and runtime.execution_info is not None:
        thread = runtime.execution_info.thread_id
    return None if thread is None else str(thread)


def approval_request(pending: PendingApproval) -> dict[str, Any]:
    """The interrupt value: ``HumanInTheLoopMiddleware``'s per-call ``tool_approval`` shape, plus the capability."""
    capability = pending.capability
    return {
        "type": "tool_approval",
        "tool_call_id": pending.call_id,
        "name": pending.tool,
        "args": dict(pending.args),
        "description": capability.description or f"{pending.tool} reaches {capability.name}",
        "allowed_decisions": list(DECISIONS),
        "capability": capability.name,
        "danger_level": capability.danger_level,
        "conversation": pending.session_key,
        "asked_by": pending.asked_by,
    }


def verdict_of(answer: object, tool: str) -> Verdict:
    """A resume value as a :class:`Verdict`: LangChain's ``{"decisions": [decision]}`` or one decision.

    ``{"approved": bool}`` and a bare bool are read too; anything else is refused, naming what to send.
    """
    if isinstance(answer, Mapping) and isinstance(answer.get("decisions"), list | tuple):
        decisions = answer["decisions"]
        if len(decisions) != 1:
            raise InvalidPayload(f"resume the approval of {tool!r} with exactly one decision, got {len(decisions)}")
        answer = decisions[0]
    if isinstance(answer, Mapping) and "type" in answer:
        return _decision(answer, tool)
    if isinstance(answer, Mapping) and "approved" in answer:
        return Verdict(answer["approved"] is True)
    if isinstance(answer, bool):
        return Verdict(answer)
    raise InvalidPayload(
        f"resume the approval of {tool!r} with Command(resume={{'decisions': [{{'type': 'approve'}}]}}) "
        f"('approve', 'edit' with edited_action, or 'reject' with a message), got {answer!r}"
    )


def _decision(decision: Mapping[str, Any], tool: str) -> Verdict:
    kind = decision["type"]
    if kind == "approve":
        return Verdict(True)
    if kind == "reject":
        return Verdict(False, reason=str(decision.get("message") or "the reviewer rejected it"))
    if kind == "edit":
        action = decision.get("edited_action")
        if not isinstance(action, Mapping) or not isinstance(action.get("args"), Mapping):
            raise InvalidPayload(f"an 'edit' of {tool!r} needs edited_action={{'name': {tool!r}, 'args': {{...}}}}")
        if action.get("name", tool) != tool:
            raise InvalidPayload(f"an 'edit' of {tool!r} may change its arguments, not the tool ({action['name']!r})")
        return Verdict(True, args=dict(action["args"]))
    raise InvalidPayload(f"the approval of {tool!r} takes a decision of type {', '.join(DECISIONS)}, got {kind!r}")


def interrupt_approver(pending: PendingApproval) -> Verdict:
    """Pause the run for a human (LangGraph ``interrupt`` with :func:`approval_request`); the resume is read by
    :func:`verdict_of`."""
    return verdict_of(interrupt(approval_request(pending)), pending.tool)


def _reviewed(pending: PendingApproval) -> bool:
    """The approver of a call a ``HumanInTheLoopMiddleware`` already let through: the human said yes there."""
    return True


class ReachMiddleware(AgentMiddleware[Any, Any, Any]):
    """Sends every tool call a remote agent should serve through the enhancer.

    ``local_tools`` are the agent's own tools; ``tools`` (what LangChain adds to
    the agent) are proxy tools for the capabilities the enhancer exposes (``expose``)
    that none of them covers. A call to any other tool the agent lacks is left
    to LangChain (which answers that the tool does not exist). ``reviewed_by``:
    the agent's ``HumanInTheLoopMiddleware``, whose reviewed calls are not asked
    about again. ``raise_retryable``: a retryable failure raises (for a
    :class:`ReachErrorMiddleware` further out; ``create_agent`` sets both).
    ``stream``: ``None`` streams remote reaches while the run streams
    ``messages``; ``True`` always inside a graph; ``False`` never.
    """

    def __init__(
        self,
        enhancer: ReachEnhancer,
        *,
        local_tools: Sequence[BaseTool | Callable[..., Any] | dict[str, Any]] = (),
        session_key: SessionKey | None = None,
        approver: Approver | None = None,
        proxy_tools: bool = True,
        reviewed_by: Sequence[HumanInTheLoopMiddleware[Any, Any, Any]] = (),
        raise_retryable: bool = False,
        stream: bool | None = None,
    ) -> None:
        super().__init__()
        self.enhancer = enhancer
        self._session_key = session_key or enhancer.session_key or thread_id_of
        self._approver = approver or enhancer.approver or interrupt_approver
        self._reviewers = tuple(reviewed_by)
        self._raise_retryable = raise_retryable
        self._stream = stream
        local = [_identity(tool) for tool in local_tools]
        specs = enhancer.tools(local) if proxy_tools else []
        self.tools = [self._proxy(spec) for spec in specs]
        self._proxies = {spec.name for spec in specs}
        self._schemas: dict[str, dict[str, Any]] = {}

    def wrap_tool_call(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolOutput]) -> ToolOutput:
        """Run the local tool, or the same call swapped onto a tool that reaches the remote agent."""
        call = self._call(request)
        decision = self._remote(request, self.enhancer.decide(call))
        if decision is None:
            return handler(request)
        return handler(request.override(tool=self._swapped(request, call, decision)))

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[ToolOutput]]
    ) -> ToolOutput:
        """Async :meth:`wrap_tool_call` (``ainvoke``, ``astream``)."""
        call = self._call(request)
        decision = self._remote(request, await self.enhancer.adecide(call))
        if decision is None:
            return await handler(request)
        return await handler(request.override(tool=self._swapped(request, call, decision)))

    def _call(self, request: ToolCallRequest) -> ToolCall:
        """The framework's tool call as the enhancer sees it."""
        tool, raw = request.tool, request.tool_call
        return ToolCall(
            name=raw["name"],
            args=raw["args"],
            call_id=raw.get("id"),
            description=tool.description if tool is not None else "",
            session_key=self._session_key(request),
            has_local=tool is not None and tool.name not in self._proxies,
        )

    def _remote(self, request: ToolCallRequest, decision: Decision) -> Decision | None:
        """The decision if the call goes remote, ``None`` to let the framework run it as it would."""
        if not decision.remote or (request.tool is None and not self._exposed(decision)):
            return None
        return decision

    def _exposed(self, decision: Decision) -> bool:
        """Whether a call to a tool the agent does not have may reach its capability (only an exposed one)."""
        capability = decision.capability
        return capability is not None and self.enhancer.exposes(capability.name)

    def _approver_for(self, request: ToolCallRequest) -> Approver:
        """Who approves this call: nobody again if a ``HumanInTheLoopMiddleware`` reviewed it, else the approver."""
        name = request.tool_call["name"]
        for reviewer in self._reviewers:
            config = reviewer.interrupt_on.get(name)
            when = config.get("when") if config is not None else None
            if config is not None and (when is None or when(request)):
                return _reviewed
        return self._approver

    def _swapped(self, request: ToolCallRequest, call: ToolCall, decision: Decision) -> BaseTool:
        schema = self._schema(request.tool)
        visible = set(schema["properties"]) if "properties" in schema else None
        approver = self._approver_for(request)

        def bound(args: dict[str, Any]) -> ToolCall:
            return replace(call, args={k: v for k, v in args.items() if visible is None or k in visible})

        local = request.tool

        def run(callbacks: Callbacks = None, **args: Any) -> tuple[Any, dict[str, Any] | None]:
            relay = self._relay(callbacks)
            on_item = relay.write if relay is not None else None
            result = self.enhancer.reach(bound(args), decision, approver=approver, on_item=on_item)
            if relay is not None:
                relay.close()
            if result.fallback is not None and local is not None:
                return _local(local.invoke(args), result)
            return self._reply(result)

        async def arun(callbacks: Callbacks = None, **args: Any) -> tuple[Any, dict[str, Any] | None]:
            relay = self._relay(callbacks)
            on_item = relay.awrite if relay is not None else None
            result = await self.enhancer.areach(bound(args), decision, approver=approver, on_item=on_item)
            if relay is not None:
                await relay.aclose()
            if result.fallback is not None and local is not None:
                return _local(await local.ainvoke(args), result)
            return self._reply(result)

        description = local.description if local is not None else decision.reason
        return _tool(call.name, description, schema, run, arun)

    def _relay(self, callbacks: Callbacks) -> _Relay | None:
        """Where a streamed reach's items go, or ``None`` when this call is not streamed."""
        if self._stream is False or callbacks is None:
            return None
        watched = any(isinstance(handler, _StreamingCallbackHandler) for handler in callbacks.handlers)
        return _Relay(callbacks) if watched or self._stream else None

    def _reply(self, result: ToolResult) -> tuple[Any, dict[str, Any] | None]:
        """Content and artifact of a reach; a failure an error ToolMessage, or raised when it is retryable."""
        error = result.error
        if error is None:
            return result.content, _artifact(result)
        if self._raise_retryable and is_retryable(error):
            raise error
        message = ToolMessage(
            content=result.content,
            status="error",
            tool_call_id=result.call.call_id or "",
            name=result.call.name,
            artifact=_artifact(result),
        )
        return message, None

    def _schema(self, tool: BaseTool | None) -> dict[str, Any]:
        """The arguments the model sees (injected ones left out), cached per tool name."""
        if tool is None:
            return dict(ANY_OBJECT)
        schema = self._schemas.get(tool.name)
        if schema is None:
            schema = self._schemas[tool.name] = convert_to_openai_tool(tool)["function"]["parameters"]
        return schema

    def _proxy(self, spec: ProxySpec) -> BaseTool:
        """The tool the model sees for a capability without a local tool (works without the middleware too)."""
        enhancer = self.enhancer

        def run(**args: Any) -> tuple[str, dict[str, Any] | None]:
            return _output(enhancer.reach(ToolCall(spec.name, args, has_local=False)))

        async def arun(**args: Any) -> tuple[str, dict[str, Any] | None]:
            return _output(await enhancer.areach(ToolCall(spec.name, args, has_local=False)))

        return _tool(spec.name, spec.description, spec.params_schema, run, arun)


class _Relay:
    """Shows a streamed reach in the host's stream: every item in ``custom`` mode, tokens in ``messages`` mode.

    Tokens become a chat-model run named after the agent that wrote them (one run per author in a row), so
    LangGraph's ``messages`` stream carries them as ``AIMessageChunk`` with ``name`` set to that agent.
    """

    def __init__(self, callbacks: CallbackManager | AsyncCallbackManager) -> None:
        self.callbacks = callbacks
        self.writer = _stream_writer()
        self.author: str | None = None
        self.text: list[str] = []
        self.run: Any = None
        self.message_id = ""

    def write(self, item: Any) -> None:
        token = self._token(item)
        if token is None:
            return
        if token[0] != self.author:
            self.close()
            assert isinstance(self.callbacks, CallbackManager)
            self.run = self.callbacks.on_chat_model_start(*self._start(token[0]))[0]
        self.run.on_llm_new_token(token[1], chunk=self._chunk(token[1]))

    async def awrite(self, item: Any) -> None:
        token = self._token(item)
        if token is None:
            return
        if token[0] != self.author:
            await self.aclose()
            assert isinstance(self.callbacks, AsyncCallbackManager)
            self.run = (await self.callbacks.on_chat_model_start(*self._start(token[0])))[0]
        await self.run.on_llm_new_token(token[1], chunk=self._chunk(token[1]))

    def close(self) -> None:
        if self.run is not None:
            self.run.on_llm_end(self._end())

    async def aclose(self) -> None:
        if self.run is not None:
            await self.run.on_llm_end(self._end())

    def _token(self, item: Any) -> tuple[str, str] | None:
        """Write ``item`` to the custom stream; ``(author, text)`` if it is a token."""
        if not isinstance(item, Mapping) or is_result(item):
            return None
        self.writer(dict(item))
        text, author = item.get("text"), item.get("agent")
        if item.get("type") != "token" or not isinstance(text, str) or not isinstance(author, str):
            return None
        return author, text

    def _start(self, author: str) -> tuple[dict[str, Any], list[list[BaseMessage]]]:
        self.author, self.text, self.message_id = author, [], f"reach-{uuid.uuid4().hex}"
        return {"name": author}, [[HumanMessage(content=f"reach {author}")]]

    def _chunk(self, text: str) -> ChatGenerationChunk:
        self.text.append(text)
        return ChatGenerationChunk(message=AIMessageChunk(content=text, name=self.author, id=self.message_id))

    def _end(self) -> LLMResult:
        message = AIMessage(content="".join(self.text), name=self.author, id=self.message_id)
        self.run, self.author = None, None
        return LLMResult(generations=[[ChatGeneration(message=message)]])


def _stream_writer() -> Callable[[Any], None]:
    """LangGraph's ``custom``-mode writer, or a no-op outside a graph run (a tool streamed by ``astream_events``)."""
    try:
        return get_stream_writer()
    except RuntimeError:
        return lambda item: None


class ReachErrorMiddleware(AgentMiddleware[Any, Any, Any]):
    """The outermost tool wrapper ``create_agent`` adds: a :class:`ReachError` that came up through the middleware
    (a retryable failure some retry middleware may have retried) becomes an error ToolMessage with its record."""

    def wrap_tool_call(self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolOutput]) -> ToolOutput:
        try:
            return handler(request)
        except ReachError as exc:
            return _error_message(request, exc)

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[ToolOutput]]
    ) -> ToolOutput:
        try:
            return await handler(request)
        except ReachError as exc:
            return _error_message(request, exc)


def _error_message(request: ToolCallRequest, error: ReachError) -> ToolMessage:
    name = request.tool_call["name"]
    return ToolMessage(
        content=error_text(name, None, error),
        status="error",
        tool_call_id=request.tool_call.get("id") or "",
        name=name,
        artifact={"error": error_record(error), "reach": None},
    )


def reach_error_message(exc: Exception, request: ToolCallRequest) -> str | None:
    """For ``ToolErrorMiddleware(on_error=...)``: a ReachError as text the model can act on; others propagate.

    Needed only with ``on_error="raise"``; by default ``create_agent`` composes
    with ``ToolRetryMiddleware(retry_on=errors.is_retryable)`` on its own (module docstring).
    """
    if not isinstance(exc, ReachError):
        return None
    return error_text(request.tool_call["name"], None, exc)


def _tool(name: str, description: str, schema: dict[str, Any], run: Callable[..., Any], arun: Any) -> BaseTool:
    return StructuredTool(
        name=name,
        description=description,
        args_schema=schema,
        func=run,
        coroutine=arun,
        handle_tool_error=True,
        response_format="content_and_artifact",
    )


def _artifact(result: ToolResult) -> dict[str, Any]:
    """The agent's data as ``structured_content`` (or the error record), the route under ``reach``."""
    route = result.route.as_dict() if result.route is not None else None
    if result.error is not None:
        return {"error": error_record(result.error), "reach": route}
    return {"structured_content": result.data, "reach": route}


def _output(result: ToolResult) -> tuple[str, dict[str, Any] | None]:
    """A proxy tool's content and artifact; a failure becomes an error ToolMessage via ``ToolException``."""
    if result.error is not None:
        raise ToolException(result.content)
    return result.content, _artifact(result)


def _local(output: Any, result: ToolResult) -> tuple[Any, dict[str, Any] | None]:
    """The local tool's output, with the route record saying the reach was not delivered and why."""
    content = output if isinstance(output, str | list) else content_of(output)
    return content, {"structured_content": output, "reach": result.route.as_dict() if result.route else None}


def _identity(tool: BaseTool | Callable[..., Any] | dict[str, Any]) -> tuple[str, str]:
    """``(name, description)`` of a tool as given to ``create_agent``."""
    if isinstance(tool, BaseTool):
        return tool.name, tool.description
    if isinstance(tool, dict):
        return str(tool.get("name") or tool.get("function", {}).get("name", "")), str(tool.get("description", ""))
    return getattr(tool, "__name__", type(tool).__name__), tool.__doc__ or ""


def create_agent(
    model: Any,
    tools: Sequence[Any] | None = None,
    *,
    enhanced_by: ReachEnhancer | None = None,
    stream_remote: bool | None = None,
    **options: Any,
) -> Any:
    """``langchain.agents.create_agent`` with every argument unchanged, plus ``enhanced_by``'s middleware.

    The :class:`ReachMiddleware` comes last (innermost), reviewed by the agent's ``HumanInTheLoopMiddleware``
    if any; unless the enhancer says ``on_error="raise"``, a :class:`ReachErrorMiddleware` comes first, so
    retry middleware in between sees retryable failures. ``stream_remote`` is :class:`ReachMiddleware`'s
    ``stream``. With ``auto_register=True`` the built agent is also served and registered (``enhancer.serve_as``).
    """
    if enhanced_by is None:
        return _create_agent(model, tools, **options)
    given = list(options.pop("middleware", ()))
    reviewers = [item for item in given if isinstance(item, HumanInTheLoopMiddleware)]
    catches = enhanced_by.on_error == "message"
    reach = ReachMiddleware(
        enhanced_by, local_tools=tools or (), reviewed_by=reviewers, raise_retryable=catches, stream=stream_remote
    )
    middleware = [*([ReachErrorMiddleware()] if catches else []), *given, reach]
    graph = _create_agent(model, tools, middleware=middleware, **options)
    spec = enhanced_by.serve_as
    if enhanced_by.auto_register and spec is not None:
        served = serve_graph(
            graph,
            spec.name,
            spec.capabilities,
            registry=enhanced_by.client.registry,
            description=spec.description,
            host=spec.host,
            port=spec.port,
            tracer_provider=enhanced_by.tracer_provider,
            tokens=spec.tokens,
        )
        enhanced_by.adopt(served)
    return graph
