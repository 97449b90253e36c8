"""``mcp`` agents: an MCP server's tools (Streamable HTTP) reached as capabilities, one MCP session per conversation.

A capability is a tool (``protocol_options.tools`` maps a capability to a
tool of another name); the payload is the tool's arguments. Before the first
call of a conversation (the request's ``session_id``; calls without one share
a session per endpoint and tenant) the adapter asks its transport for the
handshake: ``initialize``, then ``notifications/initialized`` carrying the
``Mcp-Session-Id`` the server gave (any 2xx answer ends it), or, with
``protocol_options.version: 2026-07-28``, ``server/discover`` and the protocol
``_meta`` on every request instead of a session. With ``protocol_options.oauth``
the handshake also runs OAuth (:mod:`reach_plugins.protocols.mcp_oauth`), and a
call refused for its token is authorized again and resent. A server that forgot
the session (HTTP 404) did not run the tool: that is a
:class:`~reach_plugins.errors.ConnectError` (safe to retry anything), and the
next attempt opens a new session. A conversation's session is DELETEd when the
conversation or the transport closes (:meth:`McpAdapter.farewell`).
:data:`LIST_TOOLS` as the request's ``action`` lists the tools instead (see
:mod:`reach_plugins.protocols.mcp_tools`).

Answers are read as event streams (:mod:`reach_plugins.protocols.mcp_stream`:
priming events, reconnection, progress, elicitation); an ``input_required``
result is answered through the caller's elicitation handler and resent once.
Replies become ``reply_content`` (the text content),
``content`` (every content item, when some are not text: image, audio,
resource; their bytes are also the reply's media parts,
:mod:`~reach_plugins.protocols.mcp_media`), ``structured_content`` (when the tool has an output schema),
``tool_calls`` (empty) and ``raw_meta``; a tool error (``isError``) is a
``business`` failure.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from reach_plugins.errors import ConnectError, InvalidResponse, RemoteError, Unauthenticated
from reach_plugins.model import ErrorInfo
from reach_plugins.protocols.base import (
    HttpRequest,
    HttpResponse,
    NoDiscovery,
    decode_json,
    encode_json,
    endpoint_url,
    failure,
    header,
    http_failure,
    invalid,
    list_at,
    mapping_at,
    reach_headers,
    success,
)
from reach_plugins.protocols.mcp_media import media_of_content
from reach_plugins.protocols.mcp_oauth import MAX_FLOWS, OAuthClient, OAuthSettings, Running, needs_authorization
from reach_plugins.protocols.mcp_sessions import SESSIONS_KEPT, McpSession, McpSessions
from reach_plugins.protocols.mcp_stream import ELICITATION, SESSION_HEADER, McpExchange
from reach_plugins.protocols.mcp_wire import (
    CLIENT_INFO,
    METHOD_HEADER,
    NAME_HEADER,
    STATELESS_VERSION,
    capabilities,
    envelope,
    header_params,
    header_value,
)
from reach_plugins.transport import Call, Reply
from reach_plugins.wire.sse import SseDecoder

PROTOCOL_VERSION = "2025-06-18"
"""A handshake revision that both ``mcp`` 1.x and 2.x servers speak."""
UNSUPPORTED_VERSION = -32022
VERSION_HEADER = "MCP-Protocol-Version"
ACCEPT = "application/json, text/event-stream"
LIST_TOOLS = "tools/list"


def rpc_message(body: bytes, content_type: str) -> Any:
    """The JSON-RPC message of a reply: the JSON body, or the last ``message`` event of an SSE body."""
    if not content_type.startswith("text/event-stream"):
        return None
    events = [event for event in SseDecoder().feed(body + b"\n\n") if event.event == "message" and event.data]
    return events[-1].data.encode() if events else None


def _texts(result: Mapping[str, Any]) -> str:
    return "".join(str(item.get("text", "")) for item in list_at(result, "content") if isinstance(item, Mapping))


class McpAdapter(NoDiscovery):
    """Client side of an MCP server over Streamable HTTP."""

    protocol = "mcp"

    def __init__(self) -> None:
        self.sessions = McpSessions()
        self._oauth: OrderedDict[tuple[str, str | None], OAuthClient] = OrderedDict()
        self._flows: dict[str, tuple[Running, int]] = {}
        """Per call (request id): the OAuth flow under way and how many this handshake ran."""
        self._discovering: dict[str, str] = {}
        """Per call: the version a ``server/discover`` under way proposes."""
        self._retried: set[str] = set()
        self._deleting: set[str] = set()
        """Calls whose handshake is DELETEing a pushed-out session first."""
        self._inputs: dict[str, dict[str, Any]] = {}
        """Per call: the answers (and server state) its resend after an ``input_required`` result carries."""
        self._stateful: set[tuple[str, str | None]] = set()
        """Servers (endpoint, tenant) that do not know ``server/discover``: they get the 2025 handshake."""

    def _oauth_of(self, call: Call) -> OAuthClient | None:
        """The OAuth state for this call's server and tenant, when ``protocol_options.oauth`` asks for OAuth."""
        options = call.agent.protocol_options.get("oauth")
        if options is None:
            return None
        key = (call.instance.endpoint, call.request.tenant)
        client = self._oauth.get(key)
        if client is None:
            settings = OAuthSettings.of(options if isinstance(options, Mapping) else {})
            client = self._oauth[key] = OAuthClient(self._url(call), settings)
            while len(self._oauth) > SESSIONS_KEPT:
                self._oauth.popitem(last=False)
        return client

    def _start(self, call: Call, flow_of: Running) -> HttpRequest | None:
        """Run ``flow_of`` for this call; the handshake asks for its requests until it ends."""
        _, ran = self._flows.get(call.request.request_id, (None, 0))
        if ran >= MAX_FLOWS:
            self._flows.pop(call.request.request_id, None)
            raise Unauthenticated(
                f"MCP server {call.instance.endpoint} refused every token obtained for it ({ran} authorizations)",
                agent=call.agent.name,
            )
        self._flows[call.request.request_id] = (flow_of, ran + 1)
        return flow_of.request

    def _post(
        self, call: Call, session: McpSession | None, body: dict[str, Any], extra: Mapping[str, str] | None = None
    ) -> HttpRequest:
        """A JSON-RPC message POSTed to the server, its method (and tool name) mirrored in headers (SEP-2243)."""
        headers = {**self._headers(call, session), **(extra or {})}
        if session is not None and session.stateless:
            params = body.setdefault("params", {})
            params["_meta"] = {**params.get("_meta", {}), **envelope(session.version)}
        headers[METHOD_HEADER] = str(body["method"])
        name = body.get("params", {}).get("name")
        if name is not None:
            headers[NAME_HEADER] = str(name)
        return HttpRequest("POST", self._url(call), headers, encode_json(body))

    def _headers(self, call: Call, session: McpSession | None, method: str = "POST") -> dict[str, str]:
        """The headers of a request of this conversation (its token's proof, under DPoP, is for ``method``)."""
        headers = reach_headers(call, accept=ACCEPT)
        oauth = self._oauth_of(call)
        if oauth is not None:
            headers.update(oauth.authorization(method, self._url(call)))
        # the negotiated version; the one proposed on initialize too (2026-07-28 servers ask for it on every request)
        headers[VERSION_HEADER] = session.version if session is not None else PROTOCOL_VERSION
        if session is not None and session.session_id:
            headers[SESSION_HEADER] = session.session_id
        return headers

    def _url(self, call: Call) -> str:
        """The endpoint itself (``http://host/mcp``), or ``protocol_options.path`` under it."""
        path = call.agent.protocol_options.get("path")
        return endpoint_url(call, str(path)) if path else call.instance.endpoint

    def handshake(self, call: Call) -> HttpRequest | None:
        """The next request of this conversation's MCP handshake (OAuth's first), or ``None`` once it is ready."""
        running, _ = self._flows.get(call.request.request_id, (None, 0))
        if running is not None and running.request is not None:
            return running.request
        oauth = self._oauth_of(call)
        if oauth is not None and oauth.refused is not None:
            refused, oauth.refused = oauth.refused, None
            return self._start(call, Running(oauth.authorize(refused, time.monotonic())))
        if oauth is not None and oauth.refresh_token and oauth.expired(time.monotonic()):
            return self._start(call, Running(oauth.refresh(time.monotonic())))
        gone = self.sessions.evicted(call)
        goodbye = None if gone is None else self._goodbye(call.instance.endpoint, call.request.tenant, gone)
        if goodbye is not None:
            self._deleting.add(call.request.request_id)
            return goodbye
        session = self.sessions.get(call)
        proposed = self._discovering.get(call.request.request_id)
        if session is None and proposed is None and self._stateless_wanted(call):
            proposed = self._discovering[call.request.request_id] = STATELESS_VERSION
        if session is None and proposed is not None:
            body: dict[str, Any] = {"jsonrpc": "2.0", "id": f"discover-{call.request.request_id}", "params": {}}
            return self._post(call, McpSession(None, proposed, stateless=True), {**body, "method": "server/discover"})
        if session is None:
            params: dict[str, Any] = {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": capabilities(),
                "clientInfo": CLIENT_INFO,
            }
            body = {"jsonrpc": "2.0", "id": f"init-{call.request.request_id}", "method": "initialize", "params": params}
            return self._post(call, None, body)
        if not session.ready:
            body = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            return self._post(call, session, body)
        self._flows.pop(call.request.request_id, None)
        return None

    def handshaken(self, call: Call, response: HttpResponse) -> None:
        """Learn from a handshake answer: an OAuth step, a refusal asking for authorization, the session opened (a
        result), then initialised (202, no body)."""
        running, _ = self._flows.get(call.request.request_id, (None, 0))
        if running is not None and running.request is not None:
            running.feed(response)
            return
        if call.request.request_id in self._deleting:
            self._deleting.discard(call.request.request_id)  # a pushed-out session's DELETE: any answer will do
            return
        oauth = self._oauth_of(call)
        if oauth is not None and oauth.resource_nonce(response):
            return  # the same request goes again, its proof carrying the nonce
        if oauth is not None and needs_authorization(response):
            oauth.refused = response
            return
        if call.request.request_id in self._discovering:
            self._discovered(call, response)
            return
        if response.status >= 500 or response.status in (408, 429):
            raise RemoteError(
                f"MCP server {call.instance.instance_id} answered HTTP {response.status} to the handshake"
            )
        if not 200 <= response.status < 300:
            raise invalid(call, f"the MCP handshake was refused with HTTP {response.status}")
        session = self.sessions.get(call)
        result = self._initialize_result(call, response)
        if result is None:
            # the answer to notifications/initialized: 202 as the spec says, or any other 2xx (a 200 with a JSON
            # body from some servers): either way the session is initialised and the notification is not resent
            if session is None:
                raise invalid(call, f"the MCP initialize answer has no result: {response.body[:120]!r}")
            session.ready = True
            return
        if session is not None:
            return  # another call of this conversation opened its session first: all use that one
        version = str(result.get("protocolVersion") or PROTOCOL_VERSION)
        self.sessions.put(call, McpSession(header(response.headers, SESSION_HEADER), version, url=self._url(call)))

    def _stateless_wanted(self, call: Call) -> bool:
        wanted = call.agent.protocol_options.get("version") == STATELESS_VERSION
        return wanted and (call.instance.endpoint, call.request.tenant) not in self._stateful

    def _discovered(self, call: Call, response: HttpResponse) -> None:
        """A ``server/discover`` answer: a stateless session, one retry with a version the server names, or (a server
        that does not know the method) the 2025 handshake from now on."""
        proposed = self._discovering.pop(call.request.request_id)
        try:
            message = self._message(call, response)
        except InvalidResponse:
            message = None
        answer: Mapping[str, Any] = message if isinstance(message, Mapping) else {}
        error = mapping_at(answer, "error")
        supported = list_at(mapping_at(error, "data"), "supported")
        rid = call.request.request_id
        if 200 <= response.status < 300 and isinstance(answer.get("result"), Mapping):
            self.sessions.put(call, McpSession(None, proposed, ready=True, url=self._url(call), stateless=True))
        elif error.get("code") == UNSUPPORTED_VERSION and STATELESS_VERSION in supported and rid not in self._retried:
            self._retried.add(rid)
            self._discovering[rid] = STATELESS_VERSION
            return
        else:
            self._stateful.add((call.instance.endpoint, call.request.tenant))
        self._retried.discard(rid)

    def _initialize_result(self, call: Call, response: HttpResponse) -> Mapping[str, Any] | None:
        """The result of an ``initialize`` answer (it names a ``protocolVersion``), else ``None``."""
        if response.status == 202 or not response.body.strip():
            return None
        try:
            message = self._message(call, response)
        except InvalidResponse:
            return None
        result = message.get("result") if isinstance(message, Mapping) else None
        return result if isinstance(result, Mapping) and "protocolVersion" in result else None

    def exchange(self, call: Call) -> McpExchange:
        """Every call's answer may be an event stream (notifications, server requests, reconnections first)."""
        session = self.sessions.get(call)
        return McpExchange(self._rpc_id(call), self._url(call), lambda method: self._headers(call, session, method))

    def farewell(self, conversation: tuple[str | None, str] | None) -> list[HttpRequest]:
        """A DELETE per MCP session of the conversation (or of all, when closing): the server may free it."""
        requests = []
        for (endpoint, tenant, _), session in self.sessions.drop(conversation):
            goodbye = self._goodbye(endpoint, tenant, session)
            if goodbye is not None:
                requests.append(goodbye)
        return requests

    def _goodbye(self, endpoint: str, tenant: str | None, session: McpSession) -> HttpRequest | None:
        """The DELETE ending ``session`` (``None`` for a stateless one: nothing to end)."""
        if not session.session_id:
            return None
        headers = {SESSION_HEADER: session.session_id, VERSION_HEADER: session.version}
        oauth = self._oauth.get((endpoint, tenant))
        if oauth is not None:
            headers.update(oauth.authorization("DELETE", session.url or endpoint))
        return HttpRequest("DELETE", session.url or endpoint, headers)

    def renegotiate(self, call: Call, response: HttpResponse) -> bool:
        """A call to send again: refused for its token (401, or 403 asking for more scope: authorize first), or
        answered ``input_required`` (SEP-2322: resent with the caller's answers and the server's state)."""
        oauth = self._oauth_of(call)
        if oauth is not None and oauth.resource_nonce(response):
            return True  # sent again, its proof carrying the nonce
        if oauth is not None and needs_authorization(response):
            oauth.refused = response
            return True
        return self._inputs_given(call, response)

    def _inputs_given(self, call: Call, response: HttpResponse) -> bool:
        """Answer an ``input_required`` result's requests with the caller's elicitation handler, for the resend."""
        handler = ELICITATION.get()
        if handler is None or call.request.request_id in self._inputs or "input_required" not in str(response.body):
            return False
        try:
            message = self._message(call, response)
        except InvalidResponse:
            return False
        result = mapping_at(message, "result") if isinstance(message, Mapping) else {}
        asked = mapping_at(result, "inputRequests")
        if result.get("resultType") != "input_required" or not asked:
            return False
        answers = {}
        for key, question in asked.items():
            answer = handler(mapping_at(question, "params")) if question.get("method") == "elicitation/create" else None
            if answer is None:
                return False
            answers[key] = dict(answer)
        retry: dict[str, Any] = {"inputResponses": answers}
        if "requestState" in result:
            retry["requestState"] = result["requestState"]  # echoed exactly, never read
        self._inputs[call.request.request_id] = retry
        return True

    def _rpc_id(self, call: Call) -> str:
        """The JSON-RPC id of this call's request: a resend with inputs gets a new one, as SEP-2322 asks."""
        rid = call.request.request_id
        return f"{rid}-inputs" if rid in self._inputs else rid

    def build(self, call: Call, *, stream: bool = False, discovered: Any = None) -> HttpRequest:
        request = call.request
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": self._rpc_id(call)}
        if request.action == LIST_TOOLS:
            body.update(method=LIST_TOOLS, params=dict(request.payload))
            return self._post(call, self.sessions.get(call), body)
        tools = call.agent.protocol_options.get("tools") or {}
        name = tools.get(request.capability, request.capability) if isinstance(tools, Mapping) else request.capability
        params: dict[str, Any] = {
            "name": name,
            "arguments": dict(request.payload),
            **self._inputs.get(request.request_id, {}),
        }
        if stream:
            params["_meta"] = {"progressToken": request.request_id}  # progress comes back as stream events
        capability = call.capability or call.agent.capability(request.capability)
        mirrored = header_params(capability.params_schema if capability else None) or {}
        headers = {
            f"Mcp-Param-{header_name}": header_value(request.payload[argument])
            for argument, header_name in mirrored.items()
            if request.payload.get(argument) is not None
        }
        body.update(method="tools/call", params=params)
        return self._post(call, self.sessions.get(call), body, headers)

    def _message(self, call: Call, response: HttpResponse) -> Any:
        content_type = header(response.headers, "Content-Type") or ""
        raw = rpc_message(response.body, content_type)
        return decode_json(call, raw if raw is not None else response.body)

    def parse(self, call: Call, response: HttpResponse) -> Reply:
        self._inputs.pop(call.request.request_id, None)  # the resend, if any, is answered
        session = self.sessions.get(call)
        if response.status == 404 and session is not None and session.session_id:
            self.sessions.forget(call)
            raise ConnectError(
                f"MCP server {call.instance.instance_id} no longer knows session {session.session_id}: the tool did "
                "not run; the next attempt opens a new session",
                agent=call.agent.name,
            )
        oauth = self._oauth_of(call)
        if oauth is not None and needs_authorization(response):
            oauth.refused = response
            raise ConnectError(
                f"MCP server {call.instance.instance_id} refused the token (HTTP {response.status}): the tool did not "
                "run; the next attempt authorizes again",
                agent=call.agent.name,
            )
        if not 200 <= response.status < 300:
            return http_failure(call, response)
        message = self._message(call, response)
        if not isinstance(message, Mapping) or not ("result" in message or "error" in message):
            raise invalid(call, "expected a JSON-RPC response with 'result' or 'error'")
        if "error" in message:
            error = message["error"] if isinstance(message["error"], Mapping) else {}
            text = f"MCP error {error.get('code')}: {error.get('message') or 'no message'}"
            return failure(call, ErrorInfo(type="business", message=text), response.status)
        result = message["result"]
        if not isinstance(result, Mapping):
            raise invalid(call, "the MCP result is not an object")
        if call.request.action == LIST_TOOLS:
            return success(call, dict(result), response.status)
        if result.get("resultType") == "input_required":
            asked = ", ".join(sorted(mapping_at(result, "inputRequests"))) or "input"
            text = f"the MCP tool asks for {asked}: make the call within answering_elicitation(handler) to answer"
            return failure(call, ErrorInfo(type="business", message=text))
        if result.get("isError") is True:
            return failure(call, ErrorInfo(type="business", message=_texts(result) or "the MCP tool failed"))
        data: dict[str, Any] = {"reply_content": _texts(result), "tool_calls": [], "raw_meta": {}}
        content = [dict(item) for item in list_at(result, "content") if isinstance(item, Mapping)]
        if any(item.get("type") != "text" for item in content):
            data["content"] = content  # images, audio, resources: kept as the server sent them
        if isinstance(result.get("structuredContent"), Mapping):
            data["structured_content"] = result["structuredContent"]
        if session is not None and session.session_id:
            data["raw_meta"]["mcp_session_id"] = session.session_id
        try:
            media = media_of_content(content)
        except ValueError as exc:
            raise invalid(call, str(exc)) from None
        return success(call, data, response.status, media)

    def decoder(self, call: Call) -> None:
        """A tool call answers once: a stream is that one reply."""
        return None
