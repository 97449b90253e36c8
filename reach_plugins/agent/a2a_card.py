"""The agent's A2A card at ``/.well-known/agent-card.json``: a 1.0 card, revalidated by ETag and Last-Modified.

Its skills are the agent's capabilities; its interfaces are JSON-RPC 1.0 and
0.3 at ``/a2a`` and HTTP+JSON 1.0 at ``/a2a/rest``. The 0.3 top-level fields
(``url``, ``protocolVersion``, ``preferredTransport``) are not part of a 1.0
card and are added only when the request asks for 0.3 (``A2A-Version: 0.3``).
Its URLs are the agent's own (``public_url``, else the endpoint it is served
or registered at, else the address the server is bound to), never the
caller's ``Host`` header, which anyone may forge. It is sent with ``ETag``
(a hash of the card), ``Last-Modified`` (when this server started) and
``Cache-Control: max-age``; a matching ``If-None-Match`` is answered 304.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from email.utils import formatdate
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response

from reach_plugins.agent.a2a_parts import INPUT_MODES
from reach_plugins.protocols.a2a_wire import VERSION_HEADER
from reach_plugins.server.layer import Inbound

if TYPE_CHECKING:
    from reach_plugins.agent.face import Handling

CARD_PATH = "/.well-known/agent-card.json"
RPC_PATH = "/a2a"
REST_PATH = "/a2a/rest"
MAX_AGE = 300
"""Seconds a client may keep the card without asking again (it changes only when the agent is redeployed)."""


def bound(scope: Mapping[str, Any]) -> str:
    """The base URL of the address this connection reached (the ASGI ``server``), or ``""`` if it has none."""
    server = scope.get("server")
    if not server or server[1] is None:
        return str(scope.get("root_path", ""))
    host, port = server
    host = f"[{host}]" if ":" in host else host
    return f"{scope.get('scheme', 'http')}://{host}:{port}{scope.get('root_path', '')}"


def card(agent: Handling, base: str, *, legacy: bool = False) -> dict[str, Any]:
    """The card of ``agent`` reached at ``base``; ``legacy`` adds the 0.3 top-level fields."""
    root = base.rstrip("/")
    url = root + RPC_PATH
    skills = [
        {"id": c.name, "name": c.name, "description": c.description or c.name, "tags": c.scope_tags or [c.name]}
        for c in agent.capabilities
    ]
    found: dict[str, Any] = {
        "name": agent.name,
        "description": agent.description or f"Reach agent {agent.name}",
        "version": "1.0.0",
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            {"url": root + REST_PATH, "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"},
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        ],
        "capabilities": {"streaming": True, "pushNotifications": False},
        "defaultInputModes": list(INPUT_MODES),
        "defaultOutputModes": list(INPUT_MODES),
        "skills": skills,
    }
    if legacy:
        found |= {"url": url, "protocolVersion": "0.3.0", "preferredTransport": "JSONRPC"}
    return found


class CardRoute:
    """Serves the card with its validators; the start time is its ``Last-Modified``."""

    def __init__(self, agent: Handling, *, started: float | None = None) -> None:
        self.agent = agent
        self.modified = formatdate(time.time() if started is None else started, usegmt=True)

    async def __call__(self, inbound: Inbound) -> Response:
        legacy = inbound.headers.get(VERSION_HEADER.lower(), "").startswith("0.3")
        found = card(self.agent, self.agent.public_url or bound(inbound.request.scope), legacy=legacy)
        digest = hashlib.sha256(json.dumps(found, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        etag = f'"{digest[:32]}"'
        headers = {"ETag": etag, "Last-Modified": self.modified, "Cache-Control": f"public, max-age={MAX_AGE}"}
        asked = inbound.headers.get("if-none-match", "")
        if any(tag.strip().removeprefix("W/") in (etag, "*") for tag in asked.split(",") if tag.strip()):
            return Response(status_code=304, headers=headers)
        return JSONResponse(found, headers=headers)
