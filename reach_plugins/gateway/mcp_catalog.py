"""What ``/mcp`` offers a tenant besides tools: resources, resource templates, prompts and completions.

Agents declare them on ordinary capabilities with scope tags, so they are
routed, retried and allowed per tenant like any reach:

* ``mcp:resource=URI`` — a resource; ``resources/read`` of ``URI`` reaches the
  capability with an empty payload;
* ``mcp:resource-template=TEMPLATE`` (``test://items/{id}``) — a template; a
  read of a matching URI reaches it with the template's variables as payload;
* ``mcp:prompt`` — a prompt; its arguments are ``params_schema``'s properties,
  ``prompts/get`` reaches it with them.

Tagged capabilities are not listed as tools. Every agent the tenant may reach
is also a resource, ``reach://agents/NAME``: its card (description and
capabilities, never endpoints) as JSON, read without reaching anyone.
Completion values come from the ``enum`` of the argument's schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reach_plugins.protocols.mcp_tools import as_text, content_items, tool_of

RESOURCE_TAG = "mcp:resource="
TEMPLATE_TAG = "mcp:resource-template="
PROMPT_TAG = "mcp:prompt"
CARDS = "reach://agents/"
"""The URI prefix of the agents' cards."""
MAX_COMPLETIONS = 100
"""The spec's cap on the values of one completion."""


def _tagged(capability: Mapping[str, Any], prefix: str) -> str | None:
    for tag in capability.get("scope_tags") or ():
        if tag.startswith(prefix):
            return str(tag[len(prefix) :])
    return None


def _pattern(template: str) -> re.Pattern[str]:
    """A URI template's ``{name}`` variables as named groups of one path segment each."""
    parts = re.split(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", template)
    regex = "".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts))
    return re.compile(f"^{regex}$")


def _properties(capability: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    schema = capability.get("params_schema") or {}
    properties = schema.get("properties")
    required = schema.get("required")
    return (
        dict(properties) if isinstance(properties, Mapping) else {},
        [str(name) for name in required] if isinstance(required, list) else [],
    )


@dataclass(slots=True)
class Catalog:
    """One tenant's view of the agents it may reach, sorted into tools, resources, templates and prompts."""

    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    prompts: dict[str, dict[str, Any]] = field(default_factory=dict)
    cards: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, agents: list[dict[str, Any]]) -> Catalog:
        """Each name once (the first agent offering it wins), as ``tools/list`` always did."""
        catalog = cls()
        for agent in agents:
            card = {key: agent[key] for key in ("name", "description", "capabilities")}
            catalog.cards.setdefault(f"{CARDS}{agent['name']}", card)
            for capability in agent["capabilities"]:
                if (uri := _tagged(capability, RESOURCE_TAG)) is not None:
                    catalog.resources.setdefault(uri, capability)
                elif (template := _tagged(capability, TEMPLATE_TAG)) is not None:
                    catalog.templates.setdefault(template, capability)
                elif PROMPT_TAG in (capability.get("scope_tags") or ()):
                    catalog.prompts.setdefault(capability["name"], capability)
                else:
                    catalog.tools.setdefault(capability["name"], capability)
        return catalog

    def tool_list(self) -> list[dict[str, Any]]:
        return [tool_of(self.tools[name]) for name in sorted(self.tools)]

    def resource_list(self) -> list[dict[str, Any]]:
        listed = [
            {"uri": uri, "name": c["name"], "description": c.get("description") or ""}
            for uri, c in sorted(self.resources.items())
        ]
        cards = [
            {"uri": uri, "name": card["name"], "description": card["description"], "mimeType": "application/json"}
            for uri, card in sorted(self.cards.items())
        ]
        return listed + cards

    def template_list(self) -> list[dict[str, Any]]:
        return [
            {"uriTemplate": template, "name": c["name"], "description": c.get("description") or ""}
            for template, c in sorted(self.templates.items())
        ]

    def prompt_list(self) -> list[dict[str, Any]]:
        listed = []
        for name in sorted(self.prompts):
            capability = self.prompts[name]
            properties, required = _properties(capability)
            arguments = [
                {"name": arg, "description": str(spec.get("description", "")), "required": arg in required}
                for arg, spec in properties.items()
                if isinstance(spec, Mapping)
            ]
            listed.append({"name": name, "description": capability.get("description") or "", "arguments": arguments})
        return listed

    @staticmethod
    def required(capability: Mapping[str, Any]) -> list[str]:
        """The arguments a prompt cannot go without."""
        return _properties(capability)[1]

    def resolve(self, uri: str) -> tuple[dict[str, Any], dict[str, str]] | None:
        """The capability serving ``uri`` and the payload to reach it with (a template's variables)."""
        if uri in self.resources:
            return self.resources[uri], {}
        for template, capability in sorted(self.templates.items()):
            matched = _pattern(template).match(uri)
            if matched is not None:
                return capability, matched.groupdict()
        return None

    def complete(self, ref: Mapping[str, Any], argument: str, value: str) -> list[str]:
        """The ``enum`` values of a prompt's or template's argument that start with what was typed."""
        if ref.get("type") == "ref/prompt":
            capability = self.prompts.get(str(ref.get("name")))
        else:
            capability = self.templates.get(str(ref.get("uri")))
        if capability is None:
            return []
        spec = _properties(capability)[0].get(argument)
        options = spec.get("enum") if isinstance(spec, Mapping) else None
        if not isinstance(options, list):
            return []
        return [str(option) for option in options if str(option).startswith(value)][:MAX_COMPLETIONS]


def read_result(uri: str, data: Any) -> dict[str, Any]:
    """A resource capability's reply as ``resources/read`` contents.

    A string is ``text/plain``; ``{"text"|"blob": ..., "mimeType": ...}`` is one item; ``{"contents": [...]}`` is
    kept as it is; anything else is its JSON.
    """
    if isinstance(data, Mapping) and isinstance(data.get("contents"), list):
        return {"contents": [dict(item) for item in data["contents"] if isinstance(item, Mapping)]}
    if isinstance(data, Mapping) and ("text" in data or "blob" in data):
        item = {key: data[key] for key in ("text", "blob", "mimeType") if key in data}
        return {"contents": [{"uri": uri, **item}]}
    if isinstance(data, str):
        return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": data}]}
    return {"contents": [{"uri": uri, "mimeType": "application/json", "text": as_text(data)}]}


def card_result(uri: str, card: Mapping[str, Any]) -> dict[str, Any]:
    text = json.dumps(card, ensure_ascii=False, default=str)
    return {"contents": [{"uri": uri, "mimeType": "application/json", "text": text}]}


def prompt_result(capability: Mapping[str, Any], data: Any) -> dict[str, Any]:
    """A prompt capability's reply as ``prompts/get``: ``{"messages": [...]}`` kept, content items or text as one
    user message each."""
    description = capability.get("description") or ""
    if isinstance(data, Mapping) and isinstance(data.get("messages"), list):
        return {"description": description, "messages": [dict(m) for m in data["messages"] if isinstance(m, Mapping)]}
    items = content_items(data) or [{"type": "text", "text": as_text(data)}]
    return {"description": description, "messages": [{"role": "user", "content": item} for item in items]}
