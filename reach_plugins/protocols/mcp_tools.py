"""An MCP server's tools as capabilities: ``tools/list`` read once, the agent registered with them.

    agent = AgentDescriptor(name="tools", protocol="mcp", endpoints=["http://127.0.0.1:8000/mcp"])
    agent = await register_mcp_agent(registry, agent, DirectTransport())

Each tool becomes a :class:`~reach_plugins.model.Capability` with its
description, ``inputSchema`` as ``params_schema`` and ``outputSchema`` within ``return_schema``. Tool names that are not
capability names (``getWeather``) are lowercased and mapped back through
``protocol_options.tools``. A tool is ``retryable`` only when its annotations
say it is idempotent or read-only, and ``danger_level: medium`` when they say
it is destructive.

The other way round (the gateway's ``/mcp``), :func:`tool_of` lists a
capability as a tool and :func:`tool_result` turns an agent's reply into a
``tools/call`` result: a string is one ``text`` item (never JSON-quoted), a
reply carrying MCP ``content`` items keeps them (image, audio, resource), and
``structuredContent`` is sent only when the tool declares an ``outputSchema``
(from the capability's ``return_schema``) for it to match.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from reach_plugins.errors import ConfigError, from_wire
from reach_plugins.media import MediaPart
from reach_plugins.model import NAME_PATTERN, AgentDescriptor, Capability, ErrorInfo, ReachRequest
from reach_plugins.protocols.base import list_at, mapping_at
from reach_plugins.protocols.mcp import LIST_TOOLS
from reach_plugins.protocols.mcp_media import content_of_media
from reach_plugins.protocols.mcp_wire import header_params
from reach_plugins.registry.base import Registry
from reach_plugins.transport import Call, Transport

_NAME = re.compile(NAME_PATTERN)
_INVALID = re.compile(r"[^a-z0-9_.\-]+")
MAX_PAGES = 100
CONTENT_TYPES = frozenset({"text", "image", "audio", "resource", "resource_link"})
"""The MCP content item types an agent's reply may carry through unchanged."""


def capability_name(tool: str) -> str | None:
    """The capability name for a tool name, or ``None`` when nothing usable is left of it."""
    name = _INVALID.sub("_", re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", tool).lower()).strip("_")
    return name if _NAME.match(name) else None


def structured_schema(output: Mapping[str, Any]) -> dict[str, Any]:
    """A tool's ``outputSchema`` as the capability's ``return_schema``: it describes the reply's
    ``structured_content``, which a reply must then carry (the spec: a tool with an output schema returns one)."""
    return {"type": "object", "properties": {"structured_content": dict(output)}, "required": ["structured_content"]}


def capability_of(tool: Mapping[str, Any]) -> Capability | None:
    """A tool of ``tools/list`` as a capability (``None`` for a tool without a usable name or header annotations)."""
    name = capability_name(str(tool.get("name", "")))
    schema, output = tool.get("inputSchema"), tool.get("outputSchema")
    if name is None or header_params(schema if isinstance(schema, Mapping) else None) is None:
        return None
    hints = mapping_at(tool, "annotations")
    return Capability(
        name=name,
        description=str(tool.get("description") or tool.get("title") or ""),
        params_schema=dict(schema) if isinstance(schema, Mapping) else None,
        return_schema=structured_schema(output) if isinstance(output, Mapping) else None,
        retryable=bool(hints.get("idempotentHint") or hints.get("readOnlyHint")),
        danger_level="medium" if hints.get("destructiveHint") is True else "low",
    )


async def list_tools(agent: AgentDescriptor, transport: Transport, *, timeout: float = 10.0) -> list[dict[str, Any]]:
    """Every tool of the agent's first endpoint (``tools/list``, following ``nextCursor``)."""
    instance = agent.static_instances()[0]
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        payload = {"cursor": cursor} if cursor else {}
        request = ReachRequest(capability="mcp.tools_list", action=LIST_TOOLS, payload=payload)
        reply = await transport.send(Call(request=request, agent=agent, instance=instance, timeout=timeout))
        if reply.status != "success" or not isinstance(reply.data, Mapping):
            raise from_wire(reply.error or ErrorInfo(type="invalid_response", message="tools/list gave no result"))
        tools.extend(dict(tool) for tool in list_at(reply.data, "tools") if isinstance(tool, Mapping))
        next_cursor = reply.data.get("nextCursor")
        if not isinstance(next_cursor, str) or not next_cursor:
            return tools
        cursor = next_cursor
    raise ConfigError(f"MCP server {instance.endpoint} listed more than {MAX_PAGES} pages of tools")


async def mcp_agent(agent: AgentDescriptor, transport: Transport, *, timeout: float = 10.0) -> AgentDescriptor:
    """``agent`` with its MCP server's tools as capabilities (and the renamed tools mapped back)."""
    if agent.protocol != "mcp":
        raise ConfigError(f"agent {agent.name!r} speaks {agent.protocol!r}; tools are listed only for protocol 'mcp'")
    capabilities: list[Capability] = []
    renamed: dict[str, str] = {}
    for tool in await list_tools(agent, transport, timeout=timeout):
        capability = capability_of(tool)
        if capability is None:
            continue
        capabilities.append(capability)
        if capability.name != tool.get("name"):
            renamed[capability.name] = str(tool.get("name"))
    options = {**agent.protocol_options, "tools": {**agent.protocol_options.get("tools", {}), **renamed}}
    return agent.model_copy(update={"capabilities": capabilities, "protocol_options": options})


async def register_mcp_agent(
    registry: Registry, agent: AgentDescriptor, transport: Transport, *, timeout: float = 10.0
) -> AgentDescriptor:
    """List the MCP server's tools and register ``agent`` with them as capabilities; returns what was registered."""
    described = await mcp_agent(agent, transport, timeout=timeout)
    await registry.register_agent(described)
    return described


def tool_of(capability: Mapping[str, Any]) -> dict[str, Any]:
    """A capability (as the forwarder lists it) as an MCP tool; ``outputSchema`` when it returns an object."""
    name = capability["name"]
    tool = {
        "name": name,
        "description": capability.get("description") or f"Reach the capability {name}.",
        "inputSchema": capability.get("params_schema") or {"type": "object"},
    }
    schema = capability.get("return_schema")
    if isinstance(schema, Mapping) and schema.get("type") == "object":
        tool["outputSchema"] = dict(schema)
    return tool


def content_items(data: Any) -> list[dict[str, Any]] | None:
    """The MCP content items a reply carries (``{"content": [...]}`` of known types), else ``None``."""
    items = data.get("content") if isinstance(data, Mapping) else None
    if not isinstance(items, list) or not items:
        return None
    if all(isinstance(item, Mapping) and item.get("type") in CONTENT_TYPES for item in items):
        return [dict(item) for item in items]
    return None


def as_text(data: Any) -> str:
    """A reply as text: a string as it is, an MCP client's ``reply_content``, anything else as JSON."""
    if isinstance(data, str):
        return data
    reply = data.get("reply_content") if isinstance(data, Mapping) else None
    if isinstance(reply, str):
        return reply
    return json.dumps(data, ensure_ascii=False, default=str)


def tool_result(data: Any, *, output_schema: bool, media: Sequence[MediaPart] = ()) -> dict[str, Any]:
    """A capability's reply as a ``tools/call`` result (structured only where ``outputSchema`` promises it); its
    ``media`` as image, audio and resource items after the text, unless the reply brought MCP content of its own
    (an MCP server's reply, whose items already hold its media)."""
    items = content_items(data)
    if items is None:
        text = [] if media and data in (None, []) else [{"type": "text", "text": as_text(data)}]
        items = text + content_of_media(media)
    result: dict[str, Any] = {"content": items, "isError": False}
    if output_schema:
        structured = data.get("structured_content", data) if isinstance(data, Mapping) else None
        if isinstance(structured, Mapping):
            result["structuredContent"] = dict(structured)
    return result
