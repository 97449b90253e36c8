"""An MCP call answered on an event stream (Streamable HTTP), read as the server writes it, sans-IO.

The server may open the stream with a priming event (``id``, ``retry``,
empty ``data``), send notifications and its own requests before the answer, or
close the stream early and expect the client to reconnect (a GET with
``Last-Event-ID`` after the ``retry`` time). :class:`McpExchange` reads the
events one by one for the transport: progress notifications become stream
events (``{"progress": {...}}`` data events), an ``elicitation/create`` is
answered by the caller's hook, other server requests are refused, and the
answer to our request ends the exchange.

Elicitation goes back to the caller: code that can ask a person installs a
handler for the calls it makes,

    with answering_elicitation(lambda asked: {"action": "accept", "content": {"name": "Ada"}}):
        reply = await client.reach("sign_up", {})

(a LangGraph node can raise its interrupt from the handler). Without one the
server is told no, and the call fails with a business error naming what it asked.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from reach_plugins.errors import ConnectionLost
from reach_plugins.protocols.base import HttpRequest, HttpResponse, encode_json
from reach_plugins.transport import StreamEvent
from reach_plugins.wire.sse import SseEvent

ElicitationHandler = Callable[[Mapping[str, Any]], Mapping[str, Any] | None]
"""Given an ``elicitation/create``'s params (``message``, ``requestedSchema``), the result to send back
(``{"action": "accept", "content": {...}}``, ``decline`` or ``cancel``), or ``None`` to refuse it."""
ELICITATION: ContextVar[ElicitationHandler | None] = ContextVar("reach_mcp_elicitation", default=None)
MAX_RESUMES = 3
"""Reconnections of one call's stream: a server that keeps closing it without answering is not followed forever."""
DEFAULT_RETRY = 1.0
"""Seconds before reconnecting when the stream never said (the SSE default is the client's choice)."""
SESSION_HEADER = "Mcp-Session-Id"
UNANSWERED = -32042
ACCEPT = "application/json, text/event-stream"
"""The JSON-RPC code of a call that ended because the server asked for input nobody gave."""


@contextlib.contextmanager
def answering_elicitation(handler: ElicitationHandler) -> Iterator[None]:
    """Answer the ``elicitation/create`` requests of the MCP calls made in this context with ``handler``."""
    token = ELICITATION.set(handler)
    try:
        yield
    finally:
        ELICITATION.reset(token)


class McpExchange:
    """One call's event stream: the answer to ``request_id``, what the server asked on the way, where to resume."""

    def __init__(self, request_id: str, url: str, headers: Callable[[str], dict[str, str]]) -> None:
        self._id = request_id
        self._url = url
        self._headers = headers
        """The session's headers (version, session id, token) for a request of the given method: answers are
        POSTs, reconnections GETs."""
        self._handler = ELICITATION.get()
        self._answer: bytes | None = None
        self._whole: HttpResponse | None = None
        self._progress: list[StreamEvent] = []
        self._last_id: str | None = None
        self._resumed = 0

    def feed(self, event: SseEvent) -> list[HttpRequest]:
        if event.id:
            self._last_id = event.id
        if not event.data.strip():
            return []  # a priming event: it only sets the id and retry to resume from
        try:
            message = json.loads(event.data)
        except ValueError:
            return []
        if not isinstance(message, dict):
            return []
        if message.get("id") == self._id and ("result" in message or "error" in message):
            self._answer = event.data.encode()
            return []
        method = message.get("method")
        given = message.get("params")
        params: dict[str, Any] = given if isinstance(given, dict) else {}
        if method == "notifications/progress":
            progress = {key: params[key] for key in ("progress", "total", "message") if key in params}
            self._progress.append(StreamEvent("data", {"progress": progress}))
        if "id" not in message or not isinstance(method, str):
            return []
        return [self._reply(message["id"], method, params)]

    def _reply(self, asked_id: Any, method: str, params: Mapping[str, Any]) -> HttpRequest:
        """Our answer to a request of the server's: an elicitation through the caller's hook, a ping, else refused."""
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": asked_id}
        answer = self._handler(params) if method == "elicitation/create" and self._handler is not None else None
        if answer is not None:
            body["result"] = dict(answer)
        elif method == "ping":
            body["result"] = {}
        elif method == "elicitation/create":
            body["error"] = {"code": UNANSWERED, "message": "no one here answers elicitation"}
            text = (
                f"the MCP server asked for input nobody answered ({params.get('message')!r}): make the call within "
                "reach_plugins.protocols.mcp_stream.answering_elicitation(handler)"
            )
            error = {"code": UNANSWERED, "message": text}
            self._answer = encode_json({"jsonrpc": "2.0", "id": self._id, "error": error})
        else:
            body["error"] = {"code": -32601, "message": f"this client does not serve {method}"}
        headers = {**self._headers("POST"), "Content-Type": "application/json", "Accept": ACCEPT}
        return HttpRequest("POST", self._url, headers, encode_json(body))

    def done(self) -> bool:
        return self._answer is not None or self._whole is not None

    def listen(self) -> HttpRequest | None:
        """The session's GET stream, where servers send requests not tied to a call (elicitation among them): read
        only for a caller that answers them, since it costs a connection per call."""
        headers = self._get_headers()
        if self._handler is None or SESSION_HEADER not in headers:
            return None
        return HttpRequest("GET", self._url, headers)

    def _get_headers(self) -> dict[str, str]:
        headers = {key: value for key, value in self._headers("GET").items() if key != "Content-Type"}
        return {**headers, "Accept": "text/event-stream"}

    def progress(self) -> list[StreamEvent]:
        events, self._progress = self._progress, []
        return events

    def resume(self, retry: float | None) -> tuple[HttpRequest, float] | None:
        if self._last_id is None or self._resumed >= MAX_RESUMES:
            return None
        self._resumed += 1
        headers = {**self._get_headers(), "Last-Event-ID": self._last_id}
        return HttpRequest("GET", self._url, headers), DEFAULT_RETRY if retry is None else retry

    def whole(self, response: HttpResponse) -> None:
        self._whole = response

    def response(self) -> HttpResponse:
        if self._whole is not None:
            return self._whole
        if self._answer is None:
            raise ConnectionLost(f"the MCP server's event stream ended before it answered request {self._id}")
        return HttpResponse(200, {"Content-Type": "application/json"}, self._answer)
