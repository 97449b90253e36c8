"""The dify-plugin entry points: a tool that forwards to a capability, and agent strategies with the hook installed.

Importing this module imports ``dify_plugin``, which monkey-patches the
process with gevent: only a Dify plugin process should (``reach_plugins.frameworks.dify``
imports it on first use of these names). Dify loads each tool and strategy
class from its source file and wants exactly one subclass of ``Tool`` /
``AgentStrategy`` there, so the factories return fresh classes::

    QueryOrder = reach_tool("query_order")        # tools/query_order.py

    @reach_strategy                               # strategies/front_desk.py
    class FrontDesk(AgentStrategy): ...

:data:`ReachAgentStrategy` is a small function-calling strategy with the hook
already installed, ready to name in a strategy YAML.
"""

from __future__ import annotations

import json
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
from dify_plugin.entities.tool import ToolInvokeMessage, ToolProviderType
from dify_plugin.interfaces.agent import AgentModelConfig, ToolEntity
from dify_plugin.interfaces.tool import ToolLike
from pydantic import BaseModel

from reach_plugins.errors import ConfigError
from reach_plugins.frameworks.dify.hook import (
    CAPABILITY_PARAMETER,
    before_invoke,
    enhancer_from,
    reach_capability,
)
from reach_plugins.frameworks.enhancer import ReachEnhancer
from reach_plugins.frameworks.toolcalls import ToolResult

S = TypeVar("S", bound=AgentStrategy)
SETTINGS_PREFIX = "reach_"
"""Agent strategy parameters named ``reach_registry``, ``reach_tenant``, ... say where the agents are."""


def tool_messages(maker: Any, result: ToolResult) -> Iterator[Any]:
    """A result as Dify messages: the data as JSON when it is structured, else the text the model reads."""
    if result.ok and isinstance(result.data, Mapping | list):
        yield maker.create_json_message(result.data)
    else:
        yield maker.create_text_message(result.content)


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
        result = reach_capability(
            str(capability),
            parameters,
            conversation_id=self.session.conversation_id,
            app_id=self.session.app_id,
            user_id=self.runtime.user_id,
            enhancer=enhancer_from(self.runtime.credentials or {}),
        )
        yield from tool_messages(self, result)


def reach_tool(capability: str, *, name: str | None = None) -> type[ReachTool]:
    """A new Dify tool class forwarding to ``capability`` (one per tool source file, as Dify requires)."""
    class_name = name or "".join(part.title() for part in capability.split("_"))
    return type(class_name, (ReachTool,), {"capability": capability, "__module__": ReachTool.__module__})


class HookedTools:
    """``session.tool`` with :func:`before_invoke` in front of every ``invoke``; everything else unchanged."""

    def __init__(
        self, inner: Any, strategy: AgentStrategy, enhancer: ReachEnhancer, descriptions: Mapping[str, str]
    ) -> None:
        self.inner = inner
        self.strategy = strategy
        self.enhancer = enhancer
        self.descriptions = dict(descriptions)

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
        result = before_invoke(
            tool_name,
            parameters,
            conversation_id=session.conversation_id,
            app_id=session.app_id,
            user_id=runtime.user_id,
            description=self.descriptions.get(tool_name, ""),
            enhancer=self.enhancer,
        )
        if result is None:
            return self.inner.invoke(provider_type, provider, tool_name, parameters, credential_id)  # type: ignore[no-any-return]
        return _answered(result)

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


def _answered(result: ToolResult) -> Generator[ToolInvokeMessage, None, None]:
    yield from tool_messages(_ToolMessages(), result)


def reach_strategy(strategy: type[S], *, name: str | None = None) -> type[S]:
    """A subclass of ``strategy`` whose ``self.session.tool.invoke(...)`` calls go through :func:`before_invoke`.

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
        yield from strategy._invoke(self, parameters)

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
    """Ask the model, run the tools it calls, repeat until it answers (blocking model calls, no streaming)."""

    def _invoke(self, parameters: dict[str, Any]) -> Generator[AgentInvokeMessage, None, None]:
        params = FunctionCallingParams(**parameters)
        tools = {tool.identity.name: tool for tool in params.tools or []}
        prompt_tools = self._init_prompt_tools(list(tools.values()))
        messages: list[PromptMessage] = [*params.model.history_prompt_messages]
        if params.instruction:
            messages.insert(0, SystemPromptMessage(content=params.instruction))
        messages.append(UserPromptMessage(content=params.query))
        config = LLMModelConfig(**params.model.model_dump(mode="json"))
        for _ in range(params.maximum_iterations):
            result: LLMResult = self.session.model.llm.invoke(
                model_config=config, prompt_messages=messages, tools=prompt_tools, stream=False
            )
            reply = result.message
            messages.append(reply)
            if not reply.tool_calls:
                yield self.create_text_message(_text(reply))
                return
            for call in reply.tool_calls:
                output = self._run_tool(tools.get(call.function.name), call)
                messages.append(ToolPromptMessage(content=output, tool_call_id=call.id, name=call.function.name))
        yield self.create_text_message(f"Stopped after {params.maximum_iterations} rounds of tool calls.")

    def _run_tool(self, tool: ToolEntity | None, call: AssistantPromptMessage.ToolCall) -> str:
        """One tool call's output as text for the model."""
        if tool is None:
            return f"there is no tool named {call.function.name!r}"
        arguments = json.loads(call.function.arguments or "{}")
        responses = self.session.tool.invoke(
            provider_type=ToolProviderType(tool.provider_type),
            provider=tool.identity.provider,
            tool_name=tool.identity.name,
            parameters={**tool.runtime_parameters, **arguments},
        )
        parts = []
        for response in responses:
            message = response.message
            if response.type == ToolInvokeMessage.MessageType.JSON:
                parts.append(json.dumps(message.json_object, ensure_ascii=False))
            else:
                parts.append(str(getattr(message, "text", message)))
        return "".join(parts)


def _text(message: AssistantPromptMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(str(getattr(part, "data", "")) for part in content or [])


ReachAgentStrategy = reach_strategy(FunctionCalling, name="ReachAgentStrategy")
"""A function-calling agent strategy whose tool calls reach agents when one should serve them."""
