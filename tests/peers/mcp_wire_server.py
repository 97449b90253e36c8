"""A scripted MCP server (Streamable HTTP) with the wire quirks the mcp client must survive, run as a process.

    python tests/peers/mcp_wire_server.py PORT            # http://127.0.0.1:PORT/mcp; GET /counts

* ``notifications/initialized`` is answered with HTTP 200 and a JSON body (not the usual 202), as some servers do;
* ``tools/list`` lists ``show`` with an ``outputSchema``; ``tools/call show`` answers on an SSE stream that opens
  with a priming event (``id``, ``retry``, empty ``data``), sends a progress notification, then the result with text,
  image, audio and resource content and ``structuredContent``;
* ``tools/call ask`` sends an ``elicitation/create`` on its stream and answers with what the client answered;
* ``tools/call resume`` opens its stream with a priming event (``retry: 200``) and closes it; the result comes on the
  GET the client reconnects with (its ``Last-Event-ID`` and delay recorded);
* ``tools/call confirm`` answers ``input_required`` (SEP-2322) until resent with the answer and the state;
* ``server/discover`` (the stateless 2026-07-28 wire) is refused once as an unsupported version, then answered;
  a request carrying the 2026-07-28 ``_meta`` needs no session;
* ``DELETE /mcp`` ends a session (counted);
* with ``--oauth``, every ``/mcp`` request needs a bearer token from the server's own authorization server:
  protected-resource metadata (RFC 9728), authorization-server metadata (RFC 8414), dynamic client registration
  (RFC 7591), ``/authorize`` redirecting at once with a code, ``/token`` checking PKCE (S256) and refreshing.
  Access tokens expire after ``--token-seconds``.

``GET /counts`` returns how many times each method, GET, DELETE and token grant was seen, and the reconnections.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import json
import secrets
import sys
import time
from typing import Any
from urllib.parse import parse_qs, urlencode

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

PORT = int(sys.argv[1])
OAUTH = "--oauth" in sys.argv
TOKEN_SECONDS = int(sys.argv[sys.argv.index("--token-seconds") + 1]) if "--token-seconds" in sys.argv else 3600
BASE = f"http://127.0.0.1:{PORT}"
COUNTS: collections.Counter[str] = collections.Counter()
SESSIONS: set[str] = set()
CLIENTS: dict[str, dict[str, Any]] = {}
CODES: dict[str, dict[str, str]] = {}
ACCESS: dict[str, float] = {}
REFRESH: set[str] = set()
ANSWERS: dict[str, asyncio.Future[dict[str, Any]]] = {}
PENDING: list[Any] = []
RESUMES: list[dict[str, Any]] = []
CLOSED_AT: list[float] = []
DISCOVERIES: list[str] = []
ROUNDS: list[dict[str, Any]] = []
RETRY_MS = 200
PIXEL = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()
OUTPUT_SCHEMA = {"type": "object", "properties": {"total": {"type": "integer"}}, "required": ["total"]}


def rpc(message_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": message_id, "result": result}


def authorised(request: Request) -> bool:
    token = request.headers.get("authorization", "").removeprefix("Bearer ")
    return not OAUTH or ACCESS.get(token, 0.0) > time.monotonic()


def challenge() -> Response:
    metadata = f"{BASE}/.well-known/oauth-protected-resource/mcp"
    header = f'Bearer resource_metadata="{metadata}", scope="tools"'
    return JSONResponse({"error": "invalid_token"}, status_code=401, headers={"WWW-Authenticate": header})


def show_stream(message_id: Any, token: Any) -> StreamingResponse:
    result = {
        "content": [
            {"type": "text", "text": "a pixel"},
            {"type": "image", "data": PIXEL, "mimeType": "image/png"},
            {"type": "audio", "data": PIXEL, "mimeType": "audio/wav"},
            {"type": "resource", "resource": {"uri": "file:///note.txt", "mimeType": "text/plain", "text": "hi"}},
        ],
        "structuredContent": {"total": 3},
    }
    progress = {"jsonrpc": "2.0", "method": "notifications/progress"}
    progress["params"] = {"progressToken": token, "progress": 1, "total": 2, "message": "half"}

    async def events() -> Any:
        yield b"id: e-1\nretry: 100\ndata: \n\n"
        if token is not None:
            yield b"event: message\nid: e-2\ndata: " + json.dumps(progress).encode() + b"\n\n"
        yield b"event: message\nid: e-3\ndata: " + json.dumps(rpc(message_id, result)).encode() + b"\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def ask_stream(message_id: Any) -> StreamingResponse:
    asked = {"message": "Your name?", "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}}
    ANSWERS["el-1"] = asyncio.get_running_loop().create_future()

    async def events() -> Any:
        request = {"jsonrpc": "2.0", "id": "el-1", "method": "elicitation/create", "params": asked}
        yield b"data: " + json.dumps(request).encode() + b"\n\n"
        answer = await asyncio.wait_for(ANSWERS["el-1"], 10)
        COUNTS["answer:" + ("result" if "result" in answer else "error")] += 1
        content = (answer.get("result") or {}).get("content") or {}
        text = f"hello {content.get('name')}" if "result" in answer else "nobody answered"
        yield b"data: " + json.dumps(rpc(message_id, {"content": [{"type": "text", "text": text}]})).encode() + b"\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def resume_stream(message_id: Any) -> StreamingResponse:
    PENDING.append(message_id)

    async def events() -> Any:
        yield f"id: r-1\nretry: {RETRY_MS}\ndata: \n\n".encode()
        CLOSED_AT.append(time.monotonic())

    return StreamingResponse(events(), media_type="text/event-stream")


def resumed(request: Request) -> Response:
    """A GET: the stream the client reconnects with; it carries the pending result, if any."""
    COUNTS["GET"] += 1
    last = request.headers.get("last-event-id")
    RESUMES.append({"last_event_id": last, "after": time.monotonic() - CLOSED_AT[-1] if CLOSED_AT else None})
    pending = PENDING.pop() if PENDING and last else None

    async def events() -> Any:
        if pending is not None:
            result = rpc(pending, {"content": [{"type": "text", "text": "resumed"}]})
            yield b"id: r-2\ndata: " + json.dumps(result).encode() + b"\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def discover(message: dict[str, Any], request: Request) -> Response:
    """server/discover (2026-07-28): the first one is refused as an unsupported version, naming the supported one."""
    if COUNTS["server/discover"] == 1:
        error = {"code": -32022, "message": "Unsupported protocol version", "data": {"supported": ["2026-07-28"]}}
        return JSONResponse({"jsonrpc": "2.0", "id": message["id"], "error": error}, status_code=400)
    DISCOVERIES.append(request.headers.get("mcp-protocol-version", ""))
    result = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}}, "serverInfo": {"name": "wire"}}
    return JSONResponse(rpc(message["id"], result))


def confirm(message: dict[str, Any]) -> Response:
    """An input_required result (SEP-2322) first; the resend must carry the answer and echo the state exactly."""
    params = message["params"]
    if "inputResponses" not in params:
        ROUNDS.append({"id": message["id"]})
        asked = {"message": "Sure?", "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}}}
        result = {
            "resultType": "input_required",
            "inputRequests": {"sure": {"method": "elicitation/create", "params": asked}},
            "requestState": '{"opaque": 1}',
        }
        return JSONResponse(rpc(message["id"], result))
    ROUNDS.append({"id": message["id"], "state": params.get("requestState"), "answers": params["inputResponses"]})
    ok = params["inputResponses"]["sure"]["content"]["ok"]
    return JSONResponse(rpc(message["id"], {"content": [{"type": "text", "text": f"confirmed {ok}"}]}))


async def mcp(request: Request) -> Response:
    if not authorised(request):
        COUNTS["unauthorised"] += 1
        return challenge()
    if request.method == "GET":
        return resumed(request)
    if request.method == "DELETE":
        COUNTS["DELETE"] += 1
        SESSIONS.discard(request.headers.get("mcp-session-id", ""))
        return Response(status_code=200)
    message = json.loads(await request.body())
    if "method" not in message and message.get("id") in ANSWERS:
        ANSWERS.pop(message["id"]).set_result(message)
        return Response(status_code=202)
    method = message.get("method", "")
    COUNTS[method] += 1
    meta = (message.get("params") or {}).get("_meta") or {}
    stateless = meta.get("io.modelcontextprotocol/protocolVersion") == "2026-07-28"
    if method == "server/discover":
        return discover(message, request)
    if method == "initialize":
        session = secrets.token_hex(8)
        SESSIONS.add(session)
        result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "wire"}}
        return JSONResponse(rpc(message["id"], result), headers={"Mcp-Session-Id": session})
    if stateless:
        COUNTS[f"stateless:{method}"] += 1
    elif request.headers.get("mcp-session-id") not in SESSIONS:
        return JSONResponse({"error": "unknown session"}, status_code=404)
    if method == "notifications/initialized":
        return JSONResponse({"jsonrpc": "2.0", "result": {}})
    if method == "tools/list":
        tool = {"name": "show", "description": "Show every content type.", "inputSchema": {"type": "object"}}
        others = [{"name": name, "inputSchema": {"type": "object"}} for name in ("ask", "resume", "confirm")]
        return JSONResponse(rpc(message["id"], {"tools": [{**tool, "outputSchema": OUTPUT_SCHEMA}, *others]}))
    if method == "tools/call" and message["params"]["name"] == "confirm":
        return confirm(message)
    if method == "tools/call" and message["params"]["name"] == "ask":
        return ask_stream(message["id"])
    if method == "tools/call" and message["params"]["name"] == "resume":
        return resume_stream(message["id"])
    if method == "tools/call":
        return show_stream(message["id"], (message["params"].get("_meta") or {}).get("progressToken"))
    return JSONResponse({"jsonrpc": "2.0", "id": message.get("id"), "error": {"code": -32601, "message": method}})


async def protected_resource(request: Request) -> Response:
    return JSONResponse({"resource": f"{BASE}/mcp", "authorization_servers": [BASE], "scopes_supported": ["tools"]})


async def authorization_server(request: Request) -> Response:
    return JSONResponse(
        {
            "issuer": BASE,
            "authorization_endpoint": f"{BASE}/authorize",
            "token_endpoint": f"{BASE}/token",
            "registration_endpoint": f"{BASE}/register",
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_post", "none"],
        }
    )


async def register(request: Request) -> Response:
    COUNTS["register"] += 1
    metadata = json.loads(await request.body())
    client_id = secrets.token_hex(6)
    CLIENTS[client_id] = {**metadata, "client_id": client_id, "client_secret": secrets.token_hex(8)}
    return JSONResponse(CLIENTS[client_id], status_code=201)


async def authorize(request: Request) -> Response:
    query = request.query_params
    if query.get("client_id") not in CLIENTS or query.get("code_challenge_method") != "S256":
        return JSONResponse({"error": "invalid_request"}, status_code=400)
    code = secrets.token_hex(8)
    CODES[code] = {"challenge": query["code_challenge"], "client_id": query["client_id"]}
    target = query["redirect_uri"] + "?" + urlencode({"code": code, "state": query.get("state", "")})
    return RedirectResponse(target, status_code=302)


def tokens() -> JSONResponse:
    access, refresh = secrets.token_hex(12), secrets.token_hex(12)
    ACCESS[access] = time.monotonic() + TOKEN_SECONDS
    REFRESH.add(refresh)
    body = {"access_token": access, "token_type": "Bearer", "expires_in": TOKEN_SECONDS, "refresh_token": refresh}
    return JSONResponse(body)


async def token(request: Request) -> Response:
    form = {key: values[0] for key, values in parse_qs((await request.body()).decode()).items()}
    grant = str(form.get("grant_type"))
    COUNTS[f"grant:{grant}"] += 1
    if grant == "refresh_token" and str(form.get("refresh_token")) in REFRESH:
        REFRESH.discard(str(form.get("refresh_token")))
        return tokens()
    code = CODES.pop(str(form.get("code")), None)
    verifier = str(form.get("code_verifier", ""))
    digest = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    if grant != "authorization_code" or code is None or code["challenge"] != digest:
        return JSONResponse({"error": "invalid_grant"}, status_code=400)
    return tokens()


async def counts(request: Request) -> Response:
    return JSONResponse({**COUNTS, "resumes": RESUMES, "discoveries": DISCOVERIES, "rounds": ROUNDS})


app = Starlette(
    routes=[
        Route("/mcp", mcp, methods=["POST", "GET", "DELETE"]),
        Route("/.well-known/oauth-protected-resource/mcp", protected_resource),
        Route("/.well-known/oauth-authorization-server", authorization_server),
        Route("/register", register, methods=["POST"]),
        Route("/authorize", authorize),
        Route("/token", token, methods=["POST"]),
        Route("/counts", counts),
    ]
)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning", timeout_graceful_shutdown=1)
