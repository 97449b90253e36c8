"""The everything-server's tools, resources and prompts as a reach SDK agent, for the MCP harness behind ``/mcp``.

The conformance harness (modelcontextprotocol/conformance) calls its scenario
servers' features by name (``test_simple_text``, ``test://static-text``,
``test_prompt_with_arguments``...). This agent offers the same features as
ordinary capabilities, written the way the README's protocol section tells
agent authors to: MCP content in the reply, notifications yielded by a
streaming handler, input asked for by a reply with ``inputRequests``, and
resources and prompts declared with ``mcp:`` scope tags. The harness then
tests the gateway's protocol behaviour, not this agent.

Run: ``python tests/conformance/mcp_agents.py PORT`` (serves on 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

from reach_plugins.agent import ReachAgent, serve
from reach_plugins.errors import BusinessError

IMAGE = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
AUDIO = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="
NOTHING: dict[str, Any] = {"type": "object", "properties": {}}
JSON_SCHEMA_2020_12 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "$anchor": "addressDef",
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {
        "name": {"type": "string"},
        "address": {"$ref": "#/$defs/address"},
        "contactMethod": {"type": "string", "enum": ["phone", "email"]},
        "phone": {"type": "string"},
        "email": {"type": "string"},
    },
    "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
    "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
    "then": {"required": ["phone"]},
    "else": {"required": ["email"]},
    "additionalProperties": False,
}

agent = ReachAgent("everything", tokens="open")


def _log(level: str, data: str) -> dict[str, Any]:
    return {"method": "notifications/message", "params": {"level": level, "data": data}}


def _image() -> dict[str, Any]:
    return {"type": "image", "data": IMAGE, "mimeType": "image/png"}


def _text_resource(uri: str, text: str, mime: str = "text/plain") -> dict[str, Any]:
    return {"type": "resource", "resource": {"uri": uri, "mimeType": mime, "text": text}}


@agent.capability("test_simple_text", params_schema=NOTHING)
def simple_text() -> str:
    """Tests simple text content response"""
    return "This is a simple text response for testing."


@agent.capability("test_image_content", params_schema=NOTHING)
def image_content() -> dict[str, Any]:
    """Tests image content response"""
    return {"content": [_image()]}


@agent.capability("test_audio_content", params_schema=NOTHING)
def audio_content() -> dict[str, Any]:
    """Tests audio content response"""
    return {"content": [{"type": "audio", "data": AUDIO, "mimeType": "audio/wav"}]}


@agent.capability("test_embedded_resource", params_schema=NOTHING)
def embedded_resource() -> dict[str, Any]:
    """Tests embedded resource content response"""
    return {"content": [_text_resource("test://embedded-resource", "This is an embedded resource content.")]}


@agent.capability("test_multiple_content_types", params_schema=NOTHING)
def multiple_content_types() -> dict[str, Any]:
    """Tests response with multiple content types (text, image, resource)"""
    resource = _text_resource("test://mixed-content-resource", '{"test": "data", "value": 123}', "application/json")
    return {"content": [{"type": "text", "text": "Multiple content types test:"}, _image(), resource]}


@agent.capability("test_tool_with_logging", params_schema=NOTHING)
async def tool_with_logging() -> AsyncIterator[Any]:
    """Tests tool that emits log messages during execution"""
    yield _log("info", "Tool execution started")
    await asyncio.sleep(0.05)
    yield _log("info", "Tool processing data")
    await asyncio.sleep(0.05)
    yield _log("info", "Tool execution completed")
    yield "Tool with logging executed successfully"


@agent.capability("test_tool_with_progress", params_schema=NOTHING)
async def tool_with_progress() -> AsyncIterator[Any]:
    """Tests tool that reports progress notifications"""
    for step in (0, 50, 100):
        params = {"progress": step, "total": 100, "message": f"Completed step {step} of 100"}
        yield {"method": "notifications/progress", "params": params}
        await asyncio.sleep(0.05 if step < 100 else 0)
    yield "progress reported"


@agent.capability("test_reconnection", params_schema=NOTHING)
async def reconnection() -> AsyncIterator[Any]:
    """Tests SSE polling (SEP-1699): the stream closes mid-call, the client resumes it with GET + Last-Event-ID"""
    yield _log("info", "Before disconnect")
    yield {"method": "reach/poll", "params": {"retry": 100}}
    await asyncio.sleep(0.2)
    yield _log("info", "After reconnect")
    yield "Reconnection test completed"


@agent.capability("test_error_handling", params_schema=NOTHING)
def error_handling() -> str:
    """Tests error response handling"""
    raise BusinessError("This tool intentionally returns an error for testing")


@agent.capability("json_schema_2020_12_tool", params_schema=JSON_SCHEMA_2020_12)
def json_schema_2020_12_tool() -> str:
    """Tests JSON Schema 2020-12 keyword preservation in tools/list"""
    return "json_schema_2020_12_tool"


def _asked(key: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"inputRequests": {key: {"method": method, "params": params}}}


_PROMPT = {"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}


@agent.capability("test_sampling", params_schema=_PROMPT)
def sampling(prompt: str, inputResponses: dict[str, Any] | None = None) -> Any:
    """Tests server-initiated sampling (LLM completion request)"""
    answer = (inputResponses or {}).get("sampled")
    if answer is None:
        message = {"role": "user", "content": {"type": "text", "text": prompt}}
        return _asked("sampled", "sampling/createMessage", {"messages": [message], "maxTokens": 100})
    content = answer.get("content") or {}
    return f"LLM response: {content.get('text', 'No response') if content.get('type') == 'text' else 'No response'}"


def _elicited(answer: dict[str, Any], label: str) -> str:
    action = answer.get("action")
    content = json.dumps(answer.get("content") or {}, separators=(",", ":")) if action == "accept" else "{}"
    return f"{label}: action={action}, content={content}"


_MESSAGE = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
_RESPONSE = {
    "type": "object",
    "properties": {"response": {"type": "string", "description": "User's response"}},
    "required": ["response"],
}


@agent.capability("test_elicitation", params_schema=_MESSAGE)
def elicitation(message: str, inputResponses: dict[str, Any] | None = None) -> Any:
    """Tests server-initiated elicitation (user input request)"""
    answer = (inputResponses or {}).get("answer")
    if answer is None:
        return _asked("answer", "elicitation/create", {"message": message, "requestedSchema": _RESPONSE})
    return _elicited(answer, "User response")


_DEFAULTS = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {
            "type": "string",
            "description": "User status",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "description": "Verification status", "default": True},
    },
}


@agent.capability("test_elicitation_sep1034_defaults", params_schema=NOTHING)
def elicitation_defaults(inputResponses: dict[str, Any] | None = None) -> Any:
    """Tests elicitation with default values for all primitive types (SEP-1034)"""
    answer = (inputResponses or {}).get("answer")
    if answer is None:
        params = {"message": "Please provide user information", "requestedSchema": _DEFAULTS}
        return _asked("answer", "elicitation/create", params)
    return _elicited(answer, "Elicitation result")


def _titled(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"const": const, "title": title} for const, title in pairs]


_ENUMS = {
    "type": "object",
    "properties": {
        "untitledSingle": {
            "type": "string",
            "description": "Simple enum without titles",
            "enum": ["active", "inactive", "pending"],
        },
        "titledSingle": {
            "type": "string",
            "description": "Enum with titled options (oneOf)",
            "oneOf": _titled(("low", "Low Priority"), ("medium", "Medium Priority"), ("high", "High Priority")),
        },
        "untitledMulti": {
            "type": "array",
            "description": "Multi-select without titles",
            "items": {"type": "string", "enum": ["read", "write", "execute"]},
        },
        "titledMulti": {
            "type": "array",
            "description": "Multi-select with titled options",
            "items": {"anyOf": _titled(("feature", "New Feature"), ("bug", "Bug Fix"), ("docs", "Documentation"))},
        },
        "legacyEnum": {
            "type": "string",
            "description": "Legacy enum with enumNames",
            "enum": ["small", "medium", "large"],
            "enumNames": ["Small Size", "Medium Size", "Large Size"],
        },
    },
    "required": ["untitledSingle", "titledSingle", "untitledMulti", "titledMulti", "legacyEnum"],
}


@agent.capability("test_elicitation_sep1330_enums", params_schema=NOTHING)
def elicitation_enums(inputResponses: dict[str, Any] | None = None) -> Any:
    """Tests elicitation with enum schema variations per SEP-1330"""
    answer = (inputResponses or {}).get("answer")
    if answer is None:
        params = {"message": "Please select values using different enum schema types", "requestedSchema": _ENUMS}
        return _asked("answer", "elicitation/create", params)
    return _elicited(answer, "Elicitation completed")


_NAME = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
Answers = dict[str, Any] | None


def _form(message: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"method": "elicitation/create", "params": {"message": message, "mode": "form", "requestedSchema": schema}}


def _sample(text: str, tokens: int) -> dict[str, Any]:
    message = {"role": "user", "content": {"type": "text", "text": text}}
    return {"method": "sampling/createMessage", "params": {"messages": [message], "maxTokens": tokens}}


_ROOTS = {"method": "roots/list", "params": {}}


@agent.capability("test_input_required_result_elicitation", params_schema=NOTHING)
def input_required_elicitation(inputResponses: Answers = None) -> Any:
    """Tests InputRequiredResult with a single elicitation request"""
    answer = (inputResponses or {}).get("user_name")
    if answer is None:
        return {"inputRequests": {"user_name": _form("What is your name?", _NAME)}}
    return f"Hello, {(answer.get('content') or {}).get('name', 'stranger')}!"


@agent.capability("test_input_required_result_sampling", params_schema=NOTHING)
def input_required_sampling(inputResponses: Answers = None) -> Any:
    """Tests InputRequiredResult with a single sampling request"""
    answer = (inputResponses or {}).get("capital_question")
    if answer is None:
        return {"inputRequests": {"capital_question": _sample("What is the capital of France?", 100)}}
    return f"Model said: {(answer.get('content') or {}).get('text', '?')}"


@agent.capability("test_input_required_result_list_roots", params_schema=NOTHING)
def input_required_list_roots(inputResponses: Answers = None) -> Any:
    """Tests InputRequiredResult with a single roots/list request"""
    answer = (inputResponses or {}).get("client_roots")
    if answer is None:
        return {"inputRequests": {"client_roots": _ROOTS}}
    return f"Client exposed {len(answer.get('roots') or [])} root(s)."


_CONFIRM = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@agent.capability("test_input_required_result_request_state", params_schema=NOTHING)
def input_required_request_state(inputResponses: Answers = None, requestState: str | None = None) -> Any:
    """Tests requestState round-tripping in the InputRequiredResult flow"""
    if "confirm" in (inputResponses or {}) and requestState == "request-state-nonce":
        return "state-ok: confirmation received"
    return {"inputRequests": {"confirm": _form("Please confirm", _CONFIRM)}, "requestState": "request-state-nonce"}


@agent.capability("test_input_required_result_multiple_inputs", params_schema=NOTHING)
def input_required_multiple(inputResponses: Answers = None) -> Any:
    """Tests InputRequiredResult carrying elicitation, sampling and roots requests together"""
    if {"user_name", "greeting", "client_roots"} <= (inputResponses or {}).keys():
        return "All inputs received."
    asked = {"user_name": _form("What is your name?", _NAME), "greeting": _sample("Generate a greeting", 50)}
    return {"inputRequests": {**asked, "client_roots": _ROOTS}, "requestState": "multiple-inputs"}


_COLOR = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}


@agent.capability("test_input_required_result_multi_round", params_schema=NOTHING)
def input_required_multi_round(inputResponses: Answers = None, requestState: str | None = None) -> Any:
    """Tests a three-round InputRequiredResult flow with evolving requestState"""
    state = json.loads(requestState) if requestState else {"round": 0}
    answers = inputResponses or {}
    if state["round"] == 1 and "step1" in answers:
        name = (answers["step1"].get("content") or {}).get("name")
        step2 = _form("Step 2: What is your favorite color?", _COLOR)
        return {"inputRequests": {"step2": step2}, "requestState": json.dumps({"round": 2, "name": name})}
    if state["round"] == 2 and "step2" in answers:
        return f"{state.get('name')} likes {(answers['step2'].get('content') or {}).get('color')}."
    step1 = _form("Step 1: What is your name?", _NAME)
    return {"inputRequests": {"step1": step1}, "requestState": json.dumps({"round": 1})}


@agent.capability("test_input_required_result_tampered_state", params_schema=NOTHING)
def input_required_tampered(requestState: str | None = None) -> Any:
    """Tests that a tampered requestState echo is rejected (the gateway signs what the agent hands out)"""
    if requestState is None:
        return {"inputRequests": {"confirm": _form("Please confirm", _CONFIRM)}, "requestState": "round-1"}
    return f"state-ok: {requestState}"


@agent.capability("test_input_required_result_capabilities", params_schema=NOTHING)
def input_required_capabilities() -> Any:
    """Tests that inputRequests only include methods the client declared support for (the gateway cuts them)"""
    asked = {"sample": _sample("Say hello", 50), "ask": _form("What is your name?", _NAME)}
    return {"inputRequests": asked, "requestState": "capability-gated"}


@agent.capability("test_missing_capability", params_schema=NOTHING)
def missing_capability(inputResponses: Answers = None) -> Any:
    """Needs the client's sampling capability (the gateway answers -32021 to a client without it)"""
    if inputResponses:
        return "Client declared sampling capability; proceeding."
    return {"inputRequests": {"sampled": _sample("Say hello", 10)}}


@agent.capability("test_streaming_elicitation", params_schema=NOTHING)
def streaming_elicitation(inputResponses: Answers = None) -> Any:
    """A tool that needs elicitation: an input_required result on 2026-07-28, asked on the stream before"""
    answer = (inputResponses or {}).get("answer")
    if answer is None:
        return {"inputRequests": {"answer": _form("The stateless streaming probe asks for a word", _RESPONSE)}}
    return f"elicitation {answer.get('action')}"


_REGION = {
    "type": "object",
    "properties": {
        "region": {
            "type": "string",
            "description": "Mirrored into the Mcp-Param-Region header",
            "x-mcp-header": "Region",
        }
    },
}


@agent.capability("test_x_mcp_header", params_schema=_REGION)
def x_mcp_header(region: str = "<none>") -> str:
    """Tests SEP-2243 Mcp-Param-* validation (the gateway checks the header against the argument)"""
    return f"region={region}"


@agent.capability("test_logging_tool", params_schema=NOTHING)
async def logging_tool() -> AsyncIterator[Any]:
    """Logs once (on 2026-07-28 only when the request's _meta sets a logLevel)"""
    yield _log("info", "test_logging_tool ran")
    yield "logged through the request-scoped, logLevel-gated channel"


_CONTEXT = {"type": "object", "properties": {"context": {"type": "string"}}, "required": ["context"]}


@agent.capability("test_input_required_result_prompt", scope_tags=["mcp:prompt"], params_schema=NOTHING)
def input_required_prompt(inputResponses: Answers = None) -> Any:
    """Tests InputRequiredResult from prompts/get (SEP-2322 non-tool request)"""
    answer = (inputResponses or {}).get("user_context")
    if answer is None:
        return {"inputRequests": {"user_context": _form("What context should the prompt use?", _CONTEXT)}}
    return f"Use the following context: {(answer.get('content') or {}).get('context', '?')}"


@agent.capability("static_text", scope_tags=["mcp:resource=test://static-text"], params_schema=NOTHING)
def static_text() -> str:
    """A static text resource for testing"""
    return "This is the content of the static text resource."


@agent.capability("static_binary", scope_tags=["mcp:resource=test://static-binary"], params_schema=NOTHING)
def static_binary() -> dict[str, str]:
    """A static binary resource (image) for testing"""
    return {"blob": IMAGE, "mimeType": "image/png"}


@agent.capability("watched_resource", scope_tags=["mcp:resource=test://watched-resource"], params_schema=NOTHING)
def watched_resource() -> str:
    """A resource that can be subscribed to"""
    return "Watched resource content"


_ID = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}


@agent.capability("template_data", scope_tags=["mcp:resource-template=test://template/{id}/data"], params_schema=_ID)
def template_data(id: str) -> dict[str, str]:
    """A resource template with parameter substitution"""
    text = json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})
    return {"text": text, "mimeType": "application/json"}


def _user(content: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": content}


@agent.capability("test_simple_prompt", scope_tags=["mcp:prompt"], params_schema=NOTHING)
def simple_prompt() -> str:
    """A simple prompt without arguments"""
    return "This is a simple prompt for testing."


_ARGS = {
    "type": "object",
    "properties": {"arg1": {"type": "string"}, "arg2": {"type": "string"}},
    "required": ["arg1", "arg2"],
}


@agent.capability("test_prompt_with_arguments", scope_tags=["mcp:prompt"], params_schema=_ARGS)
def prompt_with_arguments(arg1: str, arg2: str) -> str:
    """A prompt with required arguments"""
    return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


_URI = {"type": "object", "properties": {"resourceUri": {"type": "string"}}, "required": ["resourceUri"]}


@agent.capability("test_prompt_with_embedded_resource", scope_tags=["mcp:prompt"], params_schema=_URI)
def prompt_with_embedded_resource(resourceUri: str) -> dict[str, Any]:
    """A prompt that includes an embedded resource"""
    embedded = _user(_text_resource(resourceUri, "Embedded resource content for testing."))
    return {"messages": [embedded, _user({"type": "text", "text": "Please process the embedded resource above."})]}


@agent.capability("test_prompt_with_image", scope_tags=["mcp:prompt"], params_schema=NOTHING)
def prompt_with_image() -> dict[str, Any]:
    """A prompt that includes image content"""
    return {"messages": [_user(_image()), _user({"type": "text", "text": "Please analyze the image above."})]}


if __name__ == "__main__":
    serve(agent, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
