"""LangChain / LangGraph adapter: one changed line puts every tool call another agent can serve through Reach.

    from reach_plugins.frameworks.langchain import create_agent
    agent = create_agent(model, tools, checkpointer=saver, enhanced_by=ReachEnhancer(registry="memory://"))

:class:`ReachMiddleware` implements both ``wrap_tool_call`` and
``awrap_tool_call`` (a sync-only one breaks ``ainvoke``). For a remote call it
swaps the tool (``handler(request.override(tool=...))``) instead of answering
itself, so LangChain's tool callbacks and error handling still run; a failure
becomes ``ToolMessage(status="error")`` through ``handle_tool_error`` unless
the enhancer says ``on_error="raise"``: then the
:mod:`~reach_plugins.errors` class escapes, a ``BusinessError`` for a refusal,
which ``ToolRetryMiddleware(retry_on=errors.is_retryable)`` does not retry
(:func:`reach_error_message` turns it into a message). Under ``remote_first`` a reach that
reached no agent runs the local tool in the same call (the ToolMessage's
artifact says ``fallback``). The conversation key is the LangGraph
``thread_id``; a dangerous capability pauses the run with ``interrupt`` until
``Command(resume={"approved": True})`` (resuming needs a checkpointer). The
same two methods plug into ``ToolNode(tools, wrap_tool_call=...,
awrap_tool_call=...)``; add ``middleware.tools`` to that ToolNode's tools.
With ``auto_register=True`` the built agent is served as a Reach agent in turn
(:func:`reach_plugins.agent.langgraph.serve_graph`, the agent SDK's one way to serve a graph).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

try:
    from langchain.agents import create_agent as _create_agent
    from langchain.agents.middleware import AgentMiddleware
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import BaseTool, StructuredTool, ToolException
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.prebuilt.tool_node import ToolCallRequest
    from langgraph.types import Command, interrupt
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        'the LangChain adapter needs the langchain extra: pip install "reach-plugins[langchain]"'
    ) from exc

from reach_plugins.agent.langgraph import serve_graph
from reach_plugins.errors import ReachError
from reach_plugins.frameworks.toolcalls import (
    ANY_OBJECT,
    Approver,
    Decision,
    PendingApproval,
    ProxySpec,
    ToolCall,
    ToolResult,
    content_of,
    error_text,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from reach_plugins.frameworks.enhancer import ReachEnhancer, SessionKey

ToolOutput = ToolMessage | Command[Any]


def thread_id_of(request: ToolCallRequest) -> str | None:
    """The LangGraph ``thread_id`` of the run this tool call belongs to (the conversation key)."""
    runtime = request.runtime
    if runtime is None:
        return None
    thread = (runtime.config or {}).get("configurable", {}).get("thread_id")
    if thread is None and runtime.execution_info is not None:
        thread = runtime.execution_info.thread_id
    return None if thread is None else str(thread)


def interrupt_approver(pending: PendingApproval) -> bool:
    """Pause the run for a human (LangGraph ``interrupt``); resume with ``Command(resume={"approved": True})``."""
    answer = interrupt(pending.describe())
    if isinstance(answer, Mapping):
        return answer.get("approved") is True
    return answer is True


class ReachMiddleware(AgentMiddleware[Any, Any, Any]):
    """Sends every tool call a remote agent should serve through the enhancer.

    ``local_tools`` are the agent's own tools; ``tools`` (what LangChain adds to
    the agent) are proxy tools for the capabilities the enhancer exposes (``expose``)
    that none of them covers. A call to any other tool the agent lacks is left
    to LangChain (which answers that the tool does not exist).
    """

    def __init__(
        self,
        enhancer: ReachEnhancer,
        *,
        local_tools: Sequence[BaseTool | Callable[..., Any] | dict[str, Any]] = (),
        session_key: SessionKey | None = None,
        approver: Approver | None = None,
        proxy_tools: bool = True,
    ) -> None:
        super().__init__()
        self.enhancer = enhancer
        self._session_key = session_key or enhancer.session_key or thread_id_of
        self._approver = approver or enhancer.approver or interrupt_approver
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

    def _swapped(self, request: ToolCallRequest, call: ToolCall, decision: Decision) -> BaseTool:
        schema = self._schema(request.tool)
        visible = set(schema["properties"]) if "properties" in schema else None

        def bound(args: dict[str, Any]) -> ToolCall:
            return replace(call, args={k: v for k, v in args.items() if visible is None or k in visible})

        local = request.tool

        def run(**args: Any) -> tuple[Any, dict[str, Any] | None]:
            result = self.enhancer.reach(bound(args), decision, approver=self._approver)
            if result.fallback is not None and local is not None:
                return _local(local.invoke(args), result)
            return _output(result)

        async def arun(**args: Any) -> tuple[Any, dict[str, Any] | None]:
            result = await self.enhancer.areach(bound(args), decision, approver=self._approver)
            if result.fallback is not None and local is not None:
                return _local(await local.ainvoke(args), result)
            return _output(result)

        description = local.description if local is not None else decision.reason
        return _tool(call.name, description, schema, run, arun)

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


def reach_error_message(exc: Exception, request: ToolCallRequest) -> str | None:
    """For ``ToolErrorMiddleware(on_error=...)``: a ReachError as text the model can act on; others propagate.

    With ``on_error="raise"`` compose it outside LangChain's retry middleware::

        middleware=[ToolErrorMiddleware(on_error=reach_error_message),
                    ToolRetryMiddleware(retry_on=errors.is_retryable, on_failure="error")]

    so a :class:`~reach_plugins.errors.BusinessError` is told to the model at
    once and a transient failure is retried first.
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


def _output(result: ToolResult) -> tuple[str, dict[str, Any] | None]:
    """Content and route for the ToolMessage; a failure becomes an error ToolMessage via ``ToolException``."""
    if result.error is not None:
        raise ToolException(result.content)
    return result.content, result.route.as_dict() if result.route is not None else None


def _local(output: Any, result: ToolResult) -> tuple[Any, dict[str, Any] | None]:
    """The local tool's output, with the route record saying the reach was not delivered and why."""
    content = output if isinstance(output, str | list) else content_of(output)
    return content, result.route.as_dict() if result.route is not None else None


def _identity(tool: BaseTool | Callable[..., Any] | dict[str, Any]) -> tuple[str, str]:
    """``(name, description)`` of a tool as given to ``create_agent``."""
    if isinstance(tool, BaseTool):
        return tool.name, tool.description
    if isinstance(tool, dict):
        return str(tool.get("name") or tool.get("function", {}).get("name", "")), str(tool.get("description", ""))
    return getattr(tool, "__name__", type(tool).__name__), tool.__doc__ or ""


def create_agent(
    model: Any, tools: Sequence[Any] | None = None, *, enhanced_by: ReachEnhancer | None = None, **options: Any
) -> Any:
    """``langchain.agents.create_agent`` with every argument unchanged, plus ``enhanced_by``'s middleware last.

    With ``auto_register=True`` the built agent is also served and registered (``enhancer.serve_as``).
    """
    if enhanced_by is None:
        return _create_agent(model, tools, **options)
    middleware = [*options.pop("middleware", ()), ReachMiddleware(enhanced_by, local_tools=tools or ())]
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
