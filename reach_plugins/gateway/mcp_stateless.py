"""The stateless MCP wire (revision 2026-07-28): no ``initialize``, every request carries its own envelope.

A request without ``Mcp-Session-Id`` names its revision, client capabilities
and log level in ``params._meta``; :func:`envelope` checks them and the
``MCP-Protocol-Version``/``Mcp-Method``/``Mcp-Name`` headers against the body
(the spec's error codes and statuses). ``server/discover`` replaces the
handshake. An agent's ``inputRequests`` go back to the client as an
``input_required`` result (only the questions the client declared the
capability for), and the client sends the request again with
``inputResponses`` and the ``requestState`` the gateway signed, so a client
cannot hand the agent a state it did not issue.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reach_plugins.gateway.mcp_calls import NEEDS, McpSession

STATELESS = "2026-07-28"
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
META_LEVEL = "io.modelcontextprotocol/logLevel"
META_SERVER = "io.modelcontextprotocol/serverInfo"
SERVER_INFO = {"name": "reach-gateway", "version": "1"}
INVALID_PARAMS, METHOD_NOT_FOUND = -32602, -32601
HEADER_MISMATCH, MISSING_CAPABILITY, UNSUPPORTED_VERSION = -32020, -32021, -32022
REMOVED = frozenset({"initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"})
"""Methods of the session wire that the stateless revision removed (404 + -32601)."""
CACHED = frozenset({"tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read"})
"""Results that carry caching hints: private to the caller, not to be reused (``ttlMs`` 0)."""
NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
"""The body parameter the ``Mcp-Name`` header must repeat, per method."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A JSON-RPC error of the stateless wire with its HTTP status."""

    code: int
    message: str
    status: int = 400
    data: Any = None

    def error(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            body["data"] = self.data
        return body


def is_stateless(params: Mapping[str, Any]) -> bool:
    """A request that names a revision in its ``_meta`` (the stateless wire's envelope)."""
    meta = params.get("_meta")
    return isinstance(meta, Mapping) and META_VERSION in meta


def envelope(method: str, params: Mapping[str, Any], headers: Mapping[str, str]) -> McpSession | Refusal:
    """The caller's view for one stateless request, or why it is refused."""
    meta = params.get("_meta")
    if not isinstance(meta, Mapping):
        return Refusal(
            INVALID_PARAMS, f"params._meta must be an object with {META_VERSION!r} and {META_CAPABILITIES!r}"
        )
    missing = [key for key in (META_VERSION, META_CAPABILITIES) if key not in meta]
    if missing:
        return Refusal(INVALID_PARAMS, f"params._meta is missing the required envelope key(s): {', '.join(missing)}")
    version = meta[META_VERSION]
    if headers.get("mcp-protocol-version", "").strip() != version:
        return Refusal(HEADER_MISMATCH, "MCP-Protocol-Version header does not match params._meta's protocol version")
    if version != STATELESS:
        data = {"supported": [STATELESS], "requested": version}
        return Refusal(UNSUPPORTED_VERSION, "Unsupported protocol version", data=data)
    if headers.get("mcp-method", "").strip() != method:
        return Refusal(HEADER_MISMATCH, "Mcp-Method header does not match the request body's method")
    named = NAMED.get(method)
    if named is not None and headers.get("mcp-name", "").strip() != str(params.get(named, "")):
        return Refusal(HEADER_MISMATCH, f"Mcp-Name header does not match the request body's {named!r}")
    if method in REMOVED or method not in SERVED:
        return Refusal(METHOD_NOT_FOUND, "Method not found", 404, method)
    capabilities = meta[META_CAPABILITIES]
    level = meta.get(META_LEVEL)
    return McpSession(
        capabilities=frozenset(capabilities) if isinstance(capabilities, Mapping) else frozenset(),
        level=str(level) if isinstance(level, str) else None,
    )


SERVED = frozenset(
    {
        "server/discover",
        "tools/list",
        "tools/call",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "prompts/list",
        "prompts/get",
        "completion/complete",
    }
)


CAPABILITIES: dict[str, Any] = {"tools": {}, "resources": {}, "prompts": {}, "logging": {}, "completions": {}}
"""What the gateway serves on this wire (no subscriptions: ``subscriptions/listen`` is not served)."""
ERROR_STATUS = {MISSING_CAPABILITY: 400, HEADER_MISMATCH: 400, INVALID_PARAMS: 400, UNSUPPORTED_VERSION: 400}
"""HTTP statuses of the errors this wire answers before a response stream starts."""


def discover() -> dict[str, Any]:
    return {"supportedVersions": [STATELESS], "capabilities": CAPABILITIES}


def _header_value(raw: str) -> str | None:
    """An ``Mcp-Param-*`` value: ``=?base64?...?=`` decoded (None when malformed), anything else literal."""
    if not (raw.startswith("=?base64?") and raw.endswith("?=")):
        return raw
    try:
        return base64.b64decode(raw[len("=?base64?") : -2], validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def param_headers(schema: Any, arguments: Mapping[str, Any], headers: Mapping[str, str]) -> Refusal | None:
    """Each argument a tool's schema mirrors into a header (``x-mcp-header``) must come with that header, equal."""
    properties = schema.get("properties") if isinstance(schema, Mapping) else None
    for name, spec in (properties or {}).items():
        suffix = spec.get("x-mcp-header") if isinstance(spec, Mapping) else None
        if not isinstance(suffix, str) or name not in arguments:
            continue
        header = f"Mcp-Param-{suffix}"
        raw = headers.get(header.lower())
        if raw is None:
            return Refusal(HEADER_MISMATCH, f"{header} header is missing but the request body's {name!r} is present")
        value = _header_value(raw.strip())
        if value is None:
            return Refusal(HEADER_MISMATCH, f"{header} header carries a malformed base64 sentinel value")
        if value != str(arguments[name]):
            return Refusal(HEADER_MISMATCH, f"{header} header does not match the request body's {name!r}")
    return None


def decorated(method: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """A result as the stateless wire sends it: its ``resultType``, caching hints, the server named in ``_meta``."""
    shaped = {"resultType": "complete", **result, "_meta": {META_SERVER: SERVER_INFO}}
    if method in CACHED or method == "server/discover":
        shaped |= {"cacheScope": "private", "ttlMs": 0}
    return shaped


class RequestStates:
    """Signs the ``requestState`` an agent hands out and checks it when the client sends it back."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def _mac(self, payload: bytes) -> str:
        return base64.urlsafe_b64encode(hmac.new(self._key, payload, hashlib.sha256).digest()).decode().rstrip("=")

    def sign(self, state: str) -> str:
        payload = state.encode()
        return f"v1.{base64.urlsafe_b64encode(payload).decode().rstrip('=')}.{self._mac(payload)}"

    def open(self, token: Any) -> str | None:
        """The agent's state inside ``token``, or None when the gateway did not sign it."""
        if not isinstance(token, str) or token.count(".") != 2 or not token.startswith("v1."):
            return None
        _, body, mac = token.split(".")
        try:
            payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except ValueError:
            return None
        return payload.decode(errors="replace") if hmac.compare_digest(mac, self._mac(payload)) else None


def input_required(asked: Mapping[str, Any], state: McpSession, signed: str | None) -> dict[str, Any] | Refusal:
    """An agent's questions as an ``input_required`` result, cut to what the client can answer."""
    allowed = {}
    needed: set[str] = set()
    for key, question in asked.items():
        method = question.get("method") if isinstance(question, Mapping) else None
        capability = NEEDS.get(str(method))
        if capability is None:
            continue
        if capability in state.capabilities:
            allowed[str(key)] = dict(question)
        else:
            needed.add(capability)
    if not allowed:
        data: dict[str, Any] = {"requiredCapabilities": {name: {} for name in sorted(needed)}}
        return Refusal(MISSING_CAPABILITY, f"this request needs the client capabilities {sorted(needed)}", data=data)
    result: dict[str, Any] = {"resultType": "input_required", "inputRequests": allowed}
    if signed is not None:
        result["requestState"] = signed
    return result
