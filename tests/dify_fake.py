"""A minimal stand-in for the parts of ``dify_plugin`` that ``reach_plugins.frameworks.dify.plugin`` imports.

The real SDK pins versions our stack cannot take and monkey-patches the whole
process with gevent on import, so it is not installed in the test
environment. This fake mirrors the shapes the entry points touch (the base
classes' constructors and message helpers, the pydantic entities they read)
and nothing else, no more leniently than the real SDK: the same required
fields, ``invoke`` converting parameters first, ``_init_prompt_tools``
returning ``PromptMessageTool``. ``tests/test_dify_real.py`` checks it against
dify-plugin 0.10.2 (in its own venv, built by ``scripts/setup.sh``) and runs
the example plugins with the real SDK.
"""

from __future__ import annotations

import sys
import types
import uuid
from collections.abc import Mapping
from enum import Enum, StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field


class MessageType(StrEnum):
    TEXT = "text"
    JSON = "json"
    LOG = "log"


class TextMessage(BaseModel):
    text: str


class JsonMessage(BaseModel):
    json_object: Any


class LogStatus(Enum):
    START = "start"
    ERROR = "error"
    SUCCESS = "success"


class LogMetadata(StrEnum):
    STARTED_AT = "started_at"
    FINISHED_AT = "finished_at"
    ELAPSED_TIME = "elapsed_time"


class LogMessage(BaseModel):
    LogStatus: ClassVar[type[LogStatus]] = LogStatus
    id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    label: str
    parent_id: str | None = None
    error: str | None = None
    status: LogStatus
    data: Mapping[str, Any]
    metadata: Mapping[LogMetadata, Any] | None = None


class InvokeMessage(BaseModel):
    MessageType: ClassVar[type[MessageType]] = MessageType
    TextMessage: ClassVar[type[TextMessage]] = TextMessage
    JsonMessage: ClassVar[type[JsonMessage]] = JsonMessage
    LogMessage: ClassVar[type[LogMessage]] = LogMessage
    type: MessageType
    message: TextMessage | JsonMessage | LogMessage


class ToolInvokeMessage(InvokeMessage):
    pass


class AgentInvokeMessage(InvokeMessage):
    pass


class ToolProviderType(StrEnum):
    BUILT_IN = "builtin"
    WORKFLOW = "workflow"
    API = "api"


class PromptMessageTool(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any]


class ToolLike:
    response_type: type[InvokeMessage]

    @classmethod
    def _convert_parameters(cls, parameters: dict[str, Any]) -> dict[str, Any]:
        """The real SDK turns file and tool-selector dicts into objects in place; none are used here."""
        return parameters

    def create_text_message(self, text: str) -> InvokeMessage:
        return self.response_type(type=MessageType.TEXT, message=TextMessage(text=text))

    def create_json_message(self, json: Any) -> InvokeMessage:
        return self.response_type(type=MessageType.JSON, message=JsonMessage(json_object=json))

    def create_log_message(
        self,
        label: str,
        data: Mapping[str, Any],
        status: LogStatus = LogStatus.SUCCESS,
        parent: InvokeMessage | None = None,
        metadata: Mapping[LogMetadata, Any] | None = None,
    ) -> InvokeMessage:
        parent_id = parent.message.id if parent is not None and isinstance(parent.message, LogMessage) else None
        log = LogMessage(label=label, data=data, status=status, parent_id=parent_id, metadata=metadata)
        return self.response_type(type=MessageType.LOG, message=log)

    def finish_log_message(
        self,
        log: InvokeMessage,
        status: LogStatus = LogStatus.SUCCESS,
        error: str | None = None,
        data: Mapping[str, Any] | None = None,
        metadata: Mapping[LogMetadata, Any] | None = None,
    ) -> InvokeMessage:
        """The real SDK's: the same log (id, label, parent) with a new status, and data/metadata when given."""
        old = log.message
        assert isinstance(old, LogMessage), "Log message payload is required"
        finished = LogMessage(
            id=old.id,
            label=old.label,
            data=data or old.data,
            status=status,
            parent_id=old.parent_id,
            error=error,
            metadata=metadata or old.metadata,
        )
        return self.response_type(type=MessageType.LOG, message=finished)

    def __class_getitem__(cls, item: Any) -> type[ToolLike]:
        return cls


class Tool(ToolLike):
    def __init__(self, runtime: Any, session: Any) -> None:
        self.runtime, self.session, self.response_type = runtime, session, ToolInvokeMessage

    def invoke(self, tool_parameters: dict[str, Any]) -> Any:
        return self._invoke(self._convert_parameters(tool_parameters))  # type: ignore[attr-defined]


class ToolProvider:
    pass


class AgentStrategy(ToolLike):
    def __init__(self, runtime: Any, session: Any) -> None:
        self.runtime, self.session, self.response_type = runtime, session, AgentInvokeMessage

    def invoke(self, parameters: dict[str, Any]) -> Any:
        return self._invoke(self._convert_parameters(parameters))  # type: ignore[attr-defined]

    def _init_prompt_tools(self, tools: list[Any] | None) -> list[PromptMessageTool]:
        return [
            PromptMessageTool(
                name=tool.identity.name,
                description=tool.description.llm if tool.description else "",
                parameters={"type": "object", "properties": {}, "required": []},
            )
            for tool in tools or []
        ]


class PromptMessage(BaseModel):
    role: str
    content: str | None = None


class ToolCallFunction(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    ToolCallFunction: ClassVar[Any] = ToolCallFunction  # ClassVar[type[...]]: the field "type" shadows the builtin
    id: str
    type: str
    function: ToolCallFunction


class AssistantPromptMessage(PromptMessage):
    ToolCall: ClassVar[type[ToolCall]] = ToolCall
    role: str = "assistant"
    tool_calls: list[ToolCall] = Field(default_factory=list)


class SystemPromptMessage(PromptMessage):
    role: str = "system"


class UserPromptMessage(PromptMessage):
    role: str = "user"


class ToolPromptMessage(PromptMessage):
    role: str = "tool"
    tool_call_id: str
    name: str = ""


class LLMModelConfig(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())
    provider: str
    model: str
    mode: str
    completion_params: dict[str, Any] = Field(default_factory=dict)


class AgentModelConfig(LLMModelConfig):
    history_prompt_messages: list[PromptMessage] = Field(default_factory=list)


class LLMResult(BaseModel):
    model: str
    message: AssistantPromptMessage
    usage: dict[str, Any]


class LLMResultChunkDelta(BaseModel):
    index: int
    message: AssistantPromptMessage


class LLMResultChunk(BaseModel):
    model: str
    delta: LLMResultChunkDelta


class AgentToolIdentity(BaseModel):
    author: str
    name: str
    label: dict[str, str]
    provider: str


class ToolDescription(BaseModel):
    human: dict[str, str]
    llm: str


class ToolEntity(BaseModel):
    identity: AgentToolIdentity
    description: ToolDescription | None = None
    provider_type: ToolProviderType = ToolProviderType.BUILT_IN
    runtime_parameters: dict[str, Any] = Field(default_factory=dict)


MODULES: dict[str, dict[str, Any]] = {
    "dify_plugin": {"AgentStrategy": AgentStrategy, "Tool": Tool, "ToolProvider": ToolProvider},
    "dify_plugin.entities": {},
    "dify_plugin.entities.agent": {"AgentInvokeMessage": AgentInvokeMessage},
    "dify_plugin.entities.model": {},
    "dify_plugin.entities.model.llm": {
        "LLMModelConfig": LLMModelConfig,
        "LLMResult": LLMResult,
        "LLMResultChunk": LLMResultChunk,
        "LLMResultChunkDelta": LLMResultChunkDelta,
    },
    "dify_plugin.entities.provider_config": {"LogMetadata": LogMetadata},
    "dify_plugin.entities.model.message": {
        "AssistantPromptMessage": AssistantPromptMessage,
        "PromptMessage": PromptMessage,
        "PromptMessageTool": PromptMessageTool,
        "SystemPromptMessage": SystemPromptMessage,
        "ToolPromptMessage": ToolPromptMessage,
        "UserPromptMessage": UserPromptMessage,
    },
    "dify_plugin.entities.tool": {
        "ToolDescription": ToolDescription,
        "ToolInvokeMessage": ToolInvokeMessage,
        "ToolProviderType": ToolProviderType,
    },
    "dify_plugin.interfaces": {},
    "dify_plugin.interfaces.agent": {
        "AgentModelConfig": AgentModelConfig,
        "AgentToolIdentity": AgentToolIdentity,
        "ToolEntity": ToolEntity,
    },
    "dify_plugin.interfaces.tool": {"ToolLike": ToolLike},
}


def install() -> list[str]:
    """Put the fake modules in ``sys.modules``; returns their names so the caller can remove them."""
    for name, attributes in MODULES.items():
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        sys.modules[name] = module
    return list(MODULES)
