"""LlamaIndex adapter: wrap tools so every call another agent can serve goes through Reach.

LlamaIndex has no hook around tool calls, so the adapter wraps the tools
themselves. :class:`ReachTool` is an ``AsyncBaseTool`` that keeps the inner
tool's ``ToolMetadata`` (the model sees the same tool) and asks the enhancer,
call by call, whether to run the inner tool or reach an agent. It works in
``FunctionAgent``, ``ReActAgent`` and ``AgentWorkflow``:

    agent = enhance_agent(FunctionAgent(tools=[lookup_order], llm=llm), enhancer)

A failed reach becomes ``ToolOutput(is_error=True)`` whose text tells the
model what to do next; under ``remote_first`` a reach that reached no agent
runs the inner tool in the same call instead. An error output's
``raw_output`` is ``{"error": {"type", "class", "message", "retryable"}}``
and its ``exception`` the :mod:`reach_plugins.errors` instance. The conversation key is the workflow ``Context``'s
``ctx.store["reach_session_id"]`` (created on the first reach, so one Context
is one conversation), else the ``reach_session_id`` of LlamaIndex's
``instrument_tags``. The sync ``call`` works inside a running event loop: the
reach runs on the enhancer's own loop.

Inside a workflow, the host's own ways apply. A remote reach is streamed: each
item (a remote LangGraph agent's tokens, node updates, custom writes) is a
:class:`ReachStreamEvent` in the workflow's event stream (``handler.stream_events()``)
as it arrives, attributed to the agent that wrote it. A dangerous capability
(``danger_level: high``, ``require_approval``) asks with LlamaIndex's
``InputRequiredEvent`` (its ``reach_approval`` says what, its ``waiter_id``
which call) and waits for the ``HumanResponseEvent`` carrying that
``waiter_id``; ``response="yes"`` (or ``approve``) sends the call, anything
else rejects it with that text as the reason. The workflow replays the step
when the answer comes, so the call is sent once, after the answer.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

try:
    from llama_index.core.bridge.pydantic import BaseModel, ConfigDict
    from llama_index.core.objects.base import ObjectRetriever
    from llama_index.core.tools import AsyncBaseTool, BaseTool, FunctionTool, ToolMetadata, ToolOutput
    from llama_index.core.tools.types import adapt_to_async_tool
    from llama_index.core.workflow import (
        Context,
        HumanResponseEvent,
        InputRequiredEvent,
        WorkflowRuntimeError,
    )
    from llama_index_instrumentation.dispatcher import active_instrument_tags
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        'the LlamaIndex adapter needs the llamaindex extra: pip install "reach-plugins[llamaindex]"'
    ) from exc

from reach_plugins.agent.llamaindex import ReachStreamEvent
from reach_plugins.errors import InvalidPayload, ReachError
from reach_plugins.frameworks.toolcalls import (
    Approver,
    PendingApproval,
    ProxySpec,
    ToolCall,
    ToolResult,
    Verdict,
    error_record,
    error_text,
)
from reach_plugins.wire.items import is_result

if TYPE_CHECKING:
    from reach_plugins.frameworks.enhancer import ReachEnhancer

__all__ = [
    "APPROVALS",
    "SESSION_KEY",
    "ReachStreamEvent",
    "ReachTool",
    "ReachToolRetriever",
    "enhance_agent",
    "enhance_tools",
    "error_output",
    "workflow_approver",
]

SESSION_KEY = "reach_session_id"
"""Where the conversation key lives: in the workflow ``ctx.store`` and in ``instrument_tags``."""


APPROVALS = frozenset({"yes", "y", "approve", "approved"})
"""``HumanResponseEvent.response`` values (any case) that approve a call; anything else rejects it."""


def workflow_approver(ctx: Context) -> Approver:
    """Ask for approval the LlamaIndex way: ``InputRequiredEvent`` out, a ``HumanResponseEvent`` back."""

    async def ask(pending: PendingApproval) -> Verdict:
        request = {
            "tool": pending.tool,
            "capability": pending.capability.name,
            "danger_level": pending.capability.danger_level,
            "args": dict(pending.args),
            "asked_by": pending.asked_by,
        }
        waiter = (
            "reach-approval-"
            + hashlib.sha256(json.dumps(request, sort_keys=True, default=str).encode()).hexdigest()[:16]
        )
        question = (
            f"Approve {pending.tool} ({pending.capability.name}) with {json.dumps(request['args'], default=str)}? "
        )
        asked = InputRequiredEvent(prefix=question, waiter_id=waiter, reach_approval=request)
        answer = await ctx.wait_for_event(
            HumanResponseEvent, waiter_event=asked, waiter_id=waiter, requirements={"waiter_id": waiter}, timeout=None
        )
        said = str(answer.response).strip()
        return Verdict(True) if said.lower() in APPROVALS else Verdict(False, reason=said or "the reviewer said no")

    return ask


class ReachTool(AsyncBaseTool):
    """A tool that runs ``tool`` locally or reaches the agent the enhancer picks for it.

    Without ``tool`` it is a proxy for a capability no local tool covers
    (``spec``, from :meth:`ReachEnhancer.tools`), described by the
    capability's ``params_schema``.
    """

    def __init__(self, enhancer: ReachEnhancer, tool: BaseTool | None = None, *, spec: ProxySpec | None = None) -> None:
        self.enhancer = enhancer
        self.inner: AsyncBaseTool | None
        if tool is not None and spec is None:
            self.inner, self._metadata = adapt_to_async_tool(tool), tool.metadata
        elif spec is not None and tool is None:
            self.inner, self._metadata = None, _proxy_metadata(spec)
        else:
            raise TypeError("ReachTool needs exactly one of tool= (a local tool) or spec= (a capability proxy)")

    @property
    def metadata(self) -> ToolMetadata:
        """The inner tool's metadata, unchanged: same name, description, schema, ``return_direct``."""
        return self._metadata

    def call(self, *args: Any, **kwargs: Any) -> ToolOutput:
        """Blocking call; the reach runs on the enhancer's loop, so it works inside a running loop too."""
        try:
            call = self._call(args, kwargs, _tagged_session())
        except InvalidPayload as exc:
            return self._refused(args, kwargs, exc)
        decision = self.enhancer.decide(call)
        if not decision.remote and self.inner is not None:
            return self.inner.call(*args, **kwargs)
        result = self.enhancer.reach(call, decision)
        if result.fallback is not None and self.inner is not None:
            return self.inner.call(*args, **kwargs)
        return _output(call, result)

    async def acall(self, *args: Any, **kwargs: Any) -> ToolOutput:
        """Async call, as agents and workflows make it (the session key comes from the step's Context)."""
        ctx = _step_context()
        try:
            call = self._call(args, kwargs, await _session(ctx))
        except InvalidPayload as exc:
            return self._refused(args, kwargs, exc)
        decision = await self.enhancer.adecide(call)
        if decision.remote or self.inner is None:
            if ctx is None:
                result = await self.enhancer.areach(call, decision)
            else:
                approver = self.enhancer.approver or workflow_approver(ctx)
                result = await self.enhancer.areach(call, decision, approver=approver, on_item=_streamer(ctx))
            if result.fallback is None or self.inner is None:
                return _output(call, result)
        return await self.inner.acall(*args, **_with_context(self.inner, kwargs, ctx))

    def _call(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], session_key: str | None) -> ToolCall:
        return ToolCall(
            name=self._metadata.get_name(),
            args=_arguments(self._metadata, self.inner, args, kwargs),
            description=self._metadata.description,
            session_key=session_key,
            has_local=self.inner is not None,
        )

    def _refused(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], problem: InvalidPayload) -> ToolOutput:
        """Arguments that cannot be bound: an error output for the model, nothing run or sent."""
        name = self._metadata.get_name()
        return ToolOutput(
            tool_name=name,
            content=error_text(name, None, problem),
            raw_input={"args": args, "kwargs": dict(kwargs)},
            raw_output=error_output(problem),
            is_error=True,
            exception=problem,
        )


class ReachToolRetriever(ObjectRetriever[BaseTool]):
    """An agent's ``tool_retriever`` whose tools are wrapped, plus proxies for capabilities none of them covers."""

    def __init__(
        self,
        inner: ObjectRetriever[BaseTool],
        enhancer: ReachEnhancer,
        *,
        static: Sequence[BaseTool] = (),
        proxy_tools: bool = True,
    ) -> None:
        super().__init__(inner.retriever, inner.object_node_mapping, inner.node_postprocessors)
        self.inner = inner
        self.enhancer = enhancer
        self.proxy_tools = proxy_tools
        self._static = [_identity(tool) for tool in static]

    def retrieve(self, str_or_query_bundle: Any) -> list[BaseTool]:
        return self._enhanced(self.inner.retrieve(str_or_query_bundle))

    async def aretrieve(self, str_or_query_bundle: Any) -> list[BaseTool]:
        return self._enhanced(await self.inner.aretrieve(str_or_query_bundle))

    def _enhanced(self, tools: Sequence[BaseTool]) -> list[BaseTool]:
        wrapped = [_wrapped(tool, self.enhancer) for tool in tools]
        if not self.proxy_tools:
            return wrapped
        specs = self.enhancer.tools([*self._static, *(_identity(tool) for tool in tools)])
        return [*wrapped, *(ReachTool(self.enhancer, spec=spec) for spec in specs)]


def enhance_tools(
    tools: Iterable[BaseTool | Any], enhancer: ReachEnhancer, *, proxy_tools: bool = True
) -> list[BaseTool]:
    """Each tool wrapped in a :class:`ReachTool`, plus proxy tools for capabilities none of them covers.

    Plain functions are turned into ``FunctionTool`` first, as agents do.
    """
    wrapped = [_wrapped(_as_tool(tool), enhancer) for tool in tools]
    if not proxy_tools:
        return wrapped
    specs = enhancer.tools([_identity(tool) for tool in wrapped])
    return [*wrapped, *(ReachTool(enhancer, spec=spec) for spec in specs)]


def enhance_agent(agent_or_workflow: Any, enhancer: ReachEnhancer, *, proxy_tools: bool = True) -> Any:
    """Enhance a ``FunctionAgent``, ``ReActAgent`` (any workflow agent) or every agent of an ``AgentWorkflow``.

    The agent's ``tools`` are wrapped in place and its ``tool_retriever``, if
    any, wrapped so retrieved tools are too; the same object is returned.
    """
    agents = getattr(agent_or_workflow, "agents", None)
    if isinstance(agents, Mapping):
        for agent in agents.values():
            _enhance_one(agent, enhancer, proxy_tools)
    elif hasattr(agent_or_workflow, "tools") and hasattr(agent_or_workflow, "tool_retriever"):
        _enhance_one(agent_or_workflow, enhancer, proxy_tools)
    else:
        raise TypeError(
            f"enhance_agent takes a LlamaIndex workflow agent (FunctionAgent, ReActAgent) or an AgentWorkflow, "
            f"not {type(agent_or_workflow).__name__}; wrap plain tool lists with enhance_tools()"
        )
    return agent_or_workflow


def _enhance_one(agent: Any, enhancer: ReachEnhancer, proxy_tools: bool) -> None:
    tools = list(agent.tools or [])
    retriever = agent.tool_retriever
    if retriever is None:
        agent.tools = enhance_tools(tools, enhancer, proxy_tools=proxy_tools)
        return
    agent.tools = enhance_tools(tools, enhancer, proxy_tools=False)
    if not isinstance(retriever, ReachToolRetriever):
        agent.tool_retriever = ReachToolRetriever(retriever, enhancer, static=agent.tools, proxy_tools=proxy_tools)


# --------------------------------------------------------------------------- helpers


def _output(call: ToolCall, result: ToolResult) -> ToolOutput:
    """The enhancer's result as a ``ToolOutput``: the text the model reads, ``is_error`` when it failed."""
    return ToolOutput(
        tool_name=call.name,
        content=result.content,
        raw_input={"args": (), "kwargs": dict(call.args)},
        raw_output=result.data if result.error is None else error_output(result.error),
        is_error=not result.ok,
        exception=result.error,
    )


def error_output(error: ReachError) -> dict[str, Any]:
    """The ``raw_output`` of an error ``ToolOutput``: the error's wire code and class, so code can act on it."""
    return {"error": error_record(error)}


def _wrapped(tool: BaseTool, enhancer: ReachEnhancer) -> BaseTool:
    return tool if isinstance(tool, ReachTool) else ReachTool(enhancer, tool)


def _as_tool(tool: BaseTool | Any) -> BaseTool:
    if isinstance(tool, BaseTool):
        return tool
    if callable(tool):
        return FunctionTool.from_defaults(tool)
    raise TypeError(f"not a LlamaIndex tool or a function: {tool!r}")


def _identity(tool: BaseTool) -> tuple[str, str]:
    return tool.metadata.get_name(), tool.metadata.description


def _proxy_metadata(spec: ProxySpec) -> ToolMetadata:
    """Metadata whose parameters are exactly the capability's ``params_schema``."""
    schema = dict(spec.params_schema)

    class CapabilityParams(BaseModel):
        model_config = ConfigDict(extra="allow")

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return dict(schema)

    CapabilityParams.__name__ = f"{spec.name}_params"
    return ToolMetadata(description=spec.description, name=spec.name, fn_schema=CapabilityParams)


def _arguments(
    metadata: ToolMetadata, inner: AsyncBaseTool | None, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """The call's arguments by name: positional ones bound in schema order, a lone dict taken as the arguments."""
    named: dict[str, Any] = dict(getattr(inner, "partial_params", None) or {})
    if len(args) == 1 and isinstance(args[0], Mapping) and not kwargs:
        named.update(args[0])
    elif args:
        order = list(metadata.get_parameters_dict().get("properties", {}))
        if len(args) > len(order):
            raise InvalidPayload(
                f"tool {metadata.name!r} takes {len(order)} positional argument(s) ({', '.join(order) or 'none'}), "
                f"got {len(args)}; pass the arguments by name"
            )
        named.update(zip(order, args, strict=False))
    named.update((key, value) for key, value in kwargs.items() if not isinstance(value, Context))
    return named


def _streamer(ctx: Context) -> Callable[[Any], None]:
    """Writes each streamed item but the closing result to the workflow's event stream."""

    def write(item: Any) -> None:
        if not isinstance(item, Mapping):
            ctx.write_event_to_stream(ReachStreamEvent(data=item))
        elif not is_result(item):
            text, node, agent = item.get("text"), item.get("node"), item.get("agent")
            ctx.write_event_to_stream(
                ReachStreamEvent(
                    agent=agent if isinstance(agent, str) else None,
                    kind=str(item.get("type", "custom")),
                    text=text if isinstance(text, str) else None,
                    node=node if isinstance(node, str) else None,
                    data=dict(item),
                )
            )

    return write


def _step_context() -> Context | None:
    """The running workflow step's Context, or ``None`` outside a workflow."""
    try:
        return Context.get_step_context()
    except WorkflowRuntimeError:
        return None


async def _session(ctx: Context | None) -> str | None:
    """The conversation key: ``ctx.store`` first, then ``instrument_tags``; a new one is kept in ``ctx.store``."""
    if ctx is None:
        return _tagged_session()
    key = await ctx.store.get(SESSION_KEY, default=None)
    if key is None:
        key = _tagged_session() or f"llamaindex-{uuid.uuid4().hex}"
        await ctx.store.set(SESSION_KEY, key)
    return str(key)


def _tagged_session() -> str | None:
    value = active_instrument_tags.get().get(SESSION_KEY)
    return None if value is None else str(value)


def _with_context(inner: AsyncBaseTool, kwargs: Mapping[str, Any], ctx: Context | None) -> dict[str, Any]:
    """Inject the Context into a wrapped ``FunctionTool`` that asks for one (the workflow only does it unwrapped)."""
    name = inner.ctx_param_name if isinstance(inner, FunctionTool) and inner.requires_context else None
    if name is None or ctx is None or name in kwargs:
        return dict(kwargs)
    return {**kwargs, name: ctx}
