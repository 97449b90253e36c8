"""What MCP puts on the wire beside the JSON-RPC body: the SEP-2243 headers and the stateless ``_meta`` envelope.

``Mcp-Method`` and ``Mcp-Name`` mirror a request's method and tool; a tool's
``x-mcp-header`` arguments travel as ``Mcp-Param-*`` headers (plain ASCII or
Base64), and a tool whose annotations cannot be honoured is left out. The
2026-07-28 revision carries the protocol version, client info and capabilities
in every request's ``_meta`` instead of an initialized session.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from typing import Any

from reach_plugins.protocols.mcp_stream import ELICITATION

STATELESS_VERSION = "2026-07-28"
"""The stateless revision (``server/discover``, ``_meta`` per request), asked for with ``protocol_options.version``."""
CLIENT_INFO: dict[str, str] = {"name": "reach-plugins", "version": "1"}
METHOD_HEADER = "Mcp-Method"
NAME_HEADER = "Mcp-Name"
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
"""An HTTP header name (RFC 9110 token)."""
_PRIMITIVE = frozenset({"string", "integer", "boolean"})
"""Types a header may carry (SEP-2243: not number, whose spelling varies between languages)."""


def capabilities() -> dict[str, Any]:
    """What this client serves the server: elicitation, when the caller installed a handler for it."""
    return {"elicitation": {}} if ELICITATION.get() is not None else {}


def envelope(version: str) -> dict[str, Any]:
    """The ``_meta`` a stateless (2026-07-28) request carries in place of a session."""
    return {
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientInfo": CLIENT_INFO,
        "io.modelcontextprotocol/clientCapabilities": capabilities(),
    }


def header_params(schema: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The arguments a tool mirrors into ``Mcp-Param-*`` headers (its ``x-mcp-header`` properties, SEP-2243), or
    ``None`` when an annotation is unusable (empty, not a header token, repeated, or on a non-primitive): such a
    tool is left out, as the spec asks."""
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    mirrored: dict[str, str] = {}
    for name, field in (properties or {}).items():
        wanted = field.get("x-mcp-header") if isinstance(field, Mapping) else None
        if wanted is None:
            continue
        if not isinstance(wanted, str) or not _TOKEN.fullmatch(wanted) or field.get("type") not in _PRIMITIVE:
            return None
        if wanted.lower() in (known.lower() for known in mirrored.values()):
            return None
        mirrored[name] = wanted
    return mirrored


def header_value(value: Any) -> str:
    """An argument as a header value: JSON's spelling of numbers and booleans; Base64 (``=?base64?...?=``) for text
    that is not plain printable ASCII or has spaces at its ends."""
    text = value if isinstance(value, str) else json.dumps(value)
    if text.isascii() and text.isprintable() and text == text.strip():
        return text
    return f"=?base64?{base64.b64encode(text.encode()).decode()}?="
