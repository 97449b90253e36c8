"""The dify-plugin entry points: a tool that forwards to a capability, and agent strategies with the hook installed.

Importing this module imports ``dify_plugin``, which monkey-patches the
process with gevent: only a Dify plugin process should (``reach_plugins.frameworks.dify``
imports it on first use of these names). Dify loads each tool and strategy
class from its source file and wants exactly one subclass of ``Tool`` /
``AgentStrategy`` there, so the factories return fresh classes::

    QueryOrder = reach_tool("query_order")        # tools/query_order.py

    @reach_strategy                               # strategies/front_desk.py
    class FrontDesk(AgentStrategy): ...

:class:`AskAgent` is the generic "Ask an agent" tool (the app builder picks the
capability, its payload follows the capability's schema).
:data:`ReachAgentStrategy` is a small function-calling strategy with the hook
already installed, ready to name in a strategy YAML (it streams the model's
text as it comes). A hooked strategy streams:
each item a remote agent sends is a tool message as it arrives, and every reach
writes a Dify agent log (``reach {tool}``) that is updated as items arrive and
finished with the route or the error.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator, Iterator, Mapping
from typing import Any, ClassVar, TypeVar

from dify_plugin import AgentStrategy, Tool
from dify_plugin.entities.agent import AgentInvokeMessage
from dify_plugin.entities.model.llm import LLMModelConfig, LLMResult
from dify_plugin.entities.model.message import (
    AssistantPromptMessage,
    PromptMessage,
    SystemPromptMessage,
    ToolPromptMessage,
    UserPromptMessage,
)
from dify_plugin.entities.provider_config import LogMetadata
from dify_plugin.entities.tool import ToolInvokeMessage, ToolProviderType
from dify_plugin.interfaces.agent import AgentModelConfig, ToolEntity
from dify_plugin.interfaces.tool import ToolLike
from pydantic import BaseModel

from reach_plugins.errors import ConfigError, ReachError
from reach_plugins.frameworks.dify.ask import ask_payload
from reach_plugins.frameworks.dify.hook import (
    CAPABILITY_PARAMETER,
    before_invoke_stream,
    enhancer_from,
    reach_capability,
)
from reach_plugins.frameworks.enhancer import ReachEnhancer
from reach_plugins.frameworks.toolcalls import ToolResult, content_of

S = TypeVar("S", bound=AgentStrategy)
SETTINGS_PREFIX = "reach_"
"""Agent strategy parameters named ``reach_registry``, ``reach_tenant``, ... say where the agents are."""


LogStatus = ToolInvokeMessage.LogMessage.LogStatus


def item_message(maker: Any, item: Any) -> Any:
    """One value as a Dify message: JSON when it is structured, else the text the model reads."""
    if isinstance(item, Mapping | list):
        return maker.create_json_message(item)
    return maker.create_text_message(content_of(item))


def tool_messages(maker: Any, result: ToolResult) -> Iterator[Any]:
    """A result as Dify messages: its data as :func:`item_message` makes it, or the failure's text."""
    yield item_message(maker, result.data) if result.ok else maker.create_text_message(result.content)


class ReachTool(Tool):  # type: ignore[misc]
    """A Dify tool whose every call reaches one capability (``capability``, or the ``reach_capability`` parameter).

    The tool provider's credentials (``registry``, ``tenant``, ``gateway_url``,
    ``gateway_token``) say where the agents are; missing ones come from the
    ``REACH_*`` environment variables.
    """

    capability: ClassVar[str | None] = None

    def _invoke(self, tool_parameters: dict[str, Any]) -> Generator[ToolInvokeMessage, None, None]:
        parameters = dict(tool_parameters)
        capability = parameters.pop(CAPABILITY_PARAMETER, None) or self.capability
        if not capability:
            raise ConfigError(
                f"{type(self).__name__} names no capability: build it with reach_tool('query_order') or give the "
                f"tool a form parameter {CAPABILITY_PARAMETER!r}"
            )
        enhancer = enhancer_from(self.runtime.credentials or {})
        result = reach_capability(
            str(capability),
            self.payload(enhancer, str(capability), parameters),
            conversation_id=self.session.conversation_id,
            app_id=self.session.app_id,
            user_id=self.runtime.user_id,
            enhancer=enhancer,
        )
        yield from tool_messages(self, result)

    def payload(self, enhancer: ReachEnhancer, capability: str, parameters: dict[str, Any]) -> dict[str, Any]:
        """What the tool sends: its parameters as they are (the tool's YAML names the capability's fields)."""
        return parameters


class AskAgent(ReachTool):
    """ "Ask an agent": a question in plain words (``query``) or ``arguments``, shaped by the capability's schema.

    The question goes into the schema's one text field (``message`` of a served
    LangGraph agent, ``order_id`` of ``query_order``); see
    :func:`~reach_plugins.frameworks.dify.ask.ask_payload`.
    """

    def payload(self, enhancer: ReachEnhancer, capability: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return ask_payload(enhancer.catalogue().get(capability), parameters)


def reach_tool(capability: str, *, name: str | None = None) -> type[ReachTool]:
    """A new Dify tool class forwarding to ``capability`` (one per tool source file, as Dify requires)."""
    class_name = name or "".join(part.title() for part in capability.split("_"))
    return type(class_name, (ReachTool,), {"capability": capability, "__module__": ReachTool.__module__})


class HookedTools:
    """``session.tool`` with the hook in front of every ``invoke``; everything else unchanged.

    A reached call streams: each item the agent sends is a tool message as
    it arrives. The Dify agent log of each reach is queued in :attr:`logs`
    (opened, updated per item, finished); the strategy yields them
    (:meth:`drain`) between the tool messages it reads, under :attr:`parent`.
    """

    def __init__(
        self, inner: Any, strategy: AgentStrategy, enhancer: ReachEnhancer, descriptions: Mapping[str, str]
    ) -> None:
        self.inner = inner
        self.strategy = strategy
        self.enhancer = enhancer
        self.descriptions = dict(descriptions)
        self.logs: list[AgentInvokeMessage] = []
        self.parent: AgentInvokeMessage | None = None
        """The log the next reaches' logs go under (the strategy's tool-call log), else the root."""

    def drain(self) -> list[AgentInvokeMessage]:
        """The agent-log messages written since the last drain, oldest first (taken at once, so two drains in
        a row, the strategy's and the wrapper's, never swap them)."""
        taken, self.logs = self.logs, []
        return taken

    def invoke(
        self,
        provider_type: ToolProviderType,
        provider: str,
        tool_name: str,
        parameters: dict[str, Any],
        credential_id: str | None = None,
    ) -> Generator[ToolInvokeMessage, None, None]:
        """Reach the agent that serves ``tool_name``, or invoke the Dify tool as the strategy asked."""
        session, runtime = self.strategy.session, self.strategy.runtime
        items = before_invoke_stream(
            tool_name,
            parameters,
            conversation_id=session.conversation_id,
            app_id=session.app_id,
            user_id=runtime.user_id,
            description=self.descriptions.get(tool_name, ""),
            enhancer=self.enhancer,
        )
        local = (provider_type, provider, tool_name, parameters, credential_id)
        if items is None:
            return self.inner.invoke(*local)  # type: ignore[no-any-return]
        return self._reached(tool_name, parameters, items, local)

    def _reached(
        self,
        tool_name: str,
        parameters: dict[str, Any],
        items: Generator[Any, None, ToolResult],
        local: tuple[Any, ...],
    ) -> Generator[ToolInvokeMessage, None, None]:
        """The agent's items as tool messages while the reach's agent log follows them."""
        started = time.time()
        log = self.strategy.create_log_message(
            label=f"reach {tool_name}",
            data={"tool": tool_name, "arguments": parameters},
            status=LogStatus.START,
            parent=self.parent,
            metadata={LogMetadata.STARTED_AT: started},
        )
        self.logs.append(log)
        received: list[Any] = []
        try:
            while True:
                try:
                    item = next(items)
                except StopIteration as stop:
                    result: ToolResult = stop.value
                    break
                received.append(item)
                progress = {**log.message.data, "items": len(received), "latest": _loggable(item)}
                self.logs.append(self.strategy.finish_log_message(log, status=LogStatus.START, data=progress))
                yield item_message(_MESSAGES, item)
        except ReachError as exc:  # on_error="raise": the log still says how the reach ended
            self._finish(log, started, {"items": len(received)}, error=exc.message)
            raise
        outcome = {"items": len(received), "capability": result.capability}
        if result.fallback is not None:
            self._finish(log, started, {**outcome, "fallback": result.fallback})
            yield from self.inner.invoke(*local)
        elif not result.ok:
            self._finish(log, started, outcome, error=result.content)
            yield _MESSAGES.create_text_message(result.content)
        else:
            self._finish(log, started, {**outcome, "output": result.content})
            if not received:
                yield from tool_messages(_MESSAGES, result)

    def _finish(self, log: AgentInvokeMessage, started: float, data: dict[str, Any], error: str | None = None) -> None:
        """Queue the reach's last log: ``data`` beside its arguments, the times, ``error`` status when it failed."""
        now = time.time()
        metadata = {
            LogMetadata.STARTED_AT: started,
            LogMetadata.FINISHED_AT: now,
            LogMetadata.ELAPSED_TIME: now - started,
        }
        status = LogStatus.SUCCESS if error is None else LogStatus.ERROR
        self.logs.append(
            self.strategy.finish_log_message(
                log, status=status, error=error, data={**log.message.data, **data}, metadata=metadata
            )
        )

    def invoke_builtin_tool(
        self, provider: str, tool_name: str, parameters: dict[str, Any]
    ) -> Generator[ToolInvokeMessage, None, None]:
        return self.invoke(ToolProviderType.BUILT_IN, provider, tool_name, parameters)

    def invoke_workflow_tool(
        self, provider: str, tool_name: str, parameters: dict[str, Any]
    ) -> Generator[ToolInvokeMessage, None, None]:
        return self.invoke(ToolProviderType.WORKFLOW, provider, tool_name, parameters)

    def invoke_api_tool(
        self, provider: str, tool_name: str, parameters: dict[str, Any]
    ) -> Generator[ToolInvokeMessage, None, None]:
        return self.invoke(ToolProviderType.API, provider, tool_name, parameters)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _ToolMessages(ToolLike[ToolInvokeMessage]):  # type: ignore[misc]
    """Builds ``ToolInvokeMessage`` objects as a Tool does, for answers that come from Reach."""

    response_type = ToolInvokeMessage


_MESSAGES = _ToolMessages()


def _loggable(item: Any) -> Any:
    """An item as a log shows it: structured data as it is, anything else as text."""
    return item if isinstance(item, Mapping | list | str) else content_of(item)


def reach_strategy(strategy: type[S], *, name: str | None = None) -> type[S]:
    """A subclass of ``strategy`` whose ``self.session.tool.invoke(...)`` calls go through the hook.

    The agent logs of its reaches are yielded before the strategy's next
    message (a strategy that drains :meth:`HookedTools.drain` itself, as
    :data:`ReachAgentStrategy` does, shows them as the items arrive).

    Works as a class decorator. Agents are found with the strategy's
    ``reach_registry`` / ``reach_tenant`` / ``reach_gateway_url`` /
    ``reach_gateway_token`` parameters when the node sets them, else as
    :func:`~reach_plugins.frameworks.dify.hook.default_enhancer` says. The tools' LLM
    descriptions help map a tool to a capability by meaning.
    """

    def _invoke(self: Any, parameters: dict[str, Any]) -> Generator[AgentInvokeMessage, None, None]:
        if not isinstance(self.session.tool, HookedTools):
            enhancer = enhancer_from(parameters, prefix=SETTINGS_PREFIX)
            descriptions = _descriptions(parameters.get("tools"))
            self.session.tool = HookedTools(self.session.tool, self, enhancer, descriptions)
        hooked: HookedTools = self.session.tool
        try:
            for message in strategy._invoke(self, parameters):
                yield from hooked.drain()
                yield message
        except ReachError:  # on_error="raise": the logs of the reach that raised still reach Dify
            yield from hooked.drain()
            raise
        yield from hooked.drain()

    namespace = {"_invoke": _invoke, "__module__": strategy.__module__, "__doc__": strategy.__doc__}
    return type(name or strategy.__name__, (strategy,), namespace)


def _descriptions(tools: Any) -> dict[str, str]:
    """Tool name -> the description its LLM sees, from the strategy's ``tools`` parameter (dicts or entities)."""
    found: dict[str, str] = {}
    for tool in tools or []:
        data = tool.model_dump() if isinstance(tool, BaseModel) else tool
        if isinstance(data, Mapping):
            name = (data.get("identity") or {}).get("name")
            if name:
                found[str(name)] = str((data.get("description") or {}).get("llm") or "")
    return found


# --------------------------------------------------------------------------- a small function-calling strategy


class FunctionCallingParams(BaseModel):
    """The parameters of the strategy YAML: model, tools, instruction, query, maximum_iterations."""

    query: str
    instruction: str | None = None
    model: AgentModelConfig
    tools: list[ToolEntity] | None = None
    maximum_iterations: int = 5


class FunctionCalling(AgentStrategy):  # type: ignore[misc]
    """Ask the model, run the tools it calls, repeat until it answers; the model's text streams as it comes.

    Each round and each tool call writes a Dify agent log; the logs of a
    reach (:class:`HookedTools`) go under its tool call's and are yielded as
    the agent's items arrive.
    """

    def _invoke(self, parameters: dict[str, Any]) -> Generator[AgentInvokeMessage, None, None]:
        params = FunctionCallingParams(**parameters)
        tools = {tool.identity.name: tool for tool in params.tools or []}
        prompt_tools = self._init_prompt_tools(list(tools.values()))
        messages: list[PromptMessage] = [*params.model.history_prompt_messages]
        if params.instruction:
            messages.insert(0, SystemPromptMessage(content=params.instruction))
        messages.append(UserPromptMessage(content=params.query))
        config = LLMModelConfig(**params.model.model_dump(mode="json"))
        for round_number in range(1, params.maximum_iterations + 1):
            round_log = self.create_log_message(label=f"ROUND {round_number}", data={}, status=LogStatus.START)
            yield round_log
            reply = yield from self._ask_model(config, messages, prompt_tools)
            messages.append(reply)
            for call in reply.tool_calls:
                output = yield from self._run_tool(tools.get(call.function.name), call, round_log)
                messages.append(ToolPromptMessage(content=output, tool_call_id=call.id, name=call.function.name))
            calls = [call.function.name for call in reply.tool_calls]
            yield self.finish_log_message(round_log, data={"output": _text(reply), "tool_calls": calls})
            if not reply.tool_calls:
                return
        yield self.create_text_message(f"Stopped after {params.maximum_iterations} rounds of tool calls.")

    def _ask_model(
        self, config: LLMModelConfig, messages: list[PromptMessage], tools: list[Any]
    ) -> Generator[AgentInvokeMessage, None, AssistantPromptMessage]:
        """One model call, streamed: its text as it arrives; returns the whole reply (text and tool calls).

        A model that answers at once (an ``LLMResult``) is one chunk. A tool
        call streamed in pieces (the same id again, or no id) has its
        arguments joined.
        """
        answer = self.session.model.llm.invoke(model_config=config, prompt_messages=messages, tools=tools, stream=True)
        pieces = [answer.message] if isinstance(answer, LLMResult) else (chunk.delta.message for chunk in answer)
        text: list[str] = []
        calls: dict[str, AssistantPromptMessage.ToolCall] = {}
        for piece in pieces:
            said = _text(piece)
            if said:
                text.append(said)
                yield self.create_text_message(said)
            for call in piece.tool_calls:
                known = calls.get(call.id) if call.id else next(reversed(calls.values()), None)
                if known is None:
                    calls[call.id] = call.model_copy(deep=True)
                else:
                    known.function.arguments += call.function.arguments
        return AssistantPromptMessage(content="".join(text), tool_calls=list(calls.values()))

    def _run_tool(
        self, tool: ToolEntity | None, call: AssistantPromptMessage.ToolCall, round_log: AgentInvokeMessage
    ) -> Generator[AgentInvokeMessage, None, str]:
        """Run one tool call under its agent log; returns its output as text for the model."""
        name = call.function.name
        arguments = json.loads(call.function.arguments or "{}")
        call_log = self.create_log_message(
            label=f"CALL {name}", data={"tool": name, "arguments": arguments}, status=LogStatus.START, parent=round_log
        )
        yield call_log
        if tool is None:
            output = f"there is no tool named {name!r}"
            yield self.finish_log_message(call_log, status=LogStatus.ERROR, error=output)
            return output
        hooked = self.session.tool if isinstance(self.session.tool, HookedTools) else None
        if hooked is not None:
            hooked.parent = call_log
        responses = self.session.tool.invoke(
            provider_type=ToolProviderType(tool.provider_type),
            provider=tool.identity.provider,
            tool_name=tool.identity.name,
            parameters={**tool.runtime_parameters, **arguments},
        )
        parts = []
        for response in responses:
            if hooked is not None:
                yield from hooked.drain()
            message = response.message
            if response.type == ToolInvokeMessage.MessageType.JSON:
                parts.append(json.dumps(message.json_object, ensure_ascii=False))
            else:
                parts.append(str(getattr(message, "text", message)))
        if hooked is not None:
            yield from hooked.drain()
            hooked.parent = None
        output = "".join(parts)
        yield self.finish_log_message(call_log, data={"tool": name, "arguments": arguments, "output": output})
        return output


def _text(message: AssistantPromptMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(str(getattr(part, "data", "")) for part in content or [])


ReachAgentStrategy = reach_strategy(FunctionCalling, name="ReachAgentStrategy")
"""A function-calling agent strategy whose tool calls reach agents when one should serve them."""
