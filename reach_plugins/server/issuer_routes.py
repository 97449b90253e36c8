"""The issuer over HTTP: ``POST /v1/tokens`` and ``GET /.well-known/jwks.json``, for ``reach issuer`` and the gateway.

``POST /v1/tokens`` with ``{"audience": agent}`` and the tenant's
``Authorization: Bearer`` token issues a token for the tenant; with
``{"audience": agent, "subject_token": received}`` it exchanges the token an
agent received (its identity) for one bound to the chain (RFC 8693's shape,
without forwarding). Answers ``{"token", "expires_in"}``; refusals are 401/403
JSON naming the problem.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reach_plugins.errors import ReachError, RequestError
from reach_plugins.security.issuer import TokenIssuer

Authenticate = Callable[[str | None, str | None], "str | None"]
"""``(authorization header, claimed tenant) -> tenant``; raises ``PermissionDenied`` (401 if unauthenticated)."""
MAX_REQUEST = 16 * 1024
JWKS_PATH = "/.well-known/jwks.json"
TOKENS_PATH = "/v1/tokens"


def _refusal(exc: ReachError) -> Response:
    body = {"error": {"type": exc.error_type, "message": exc.message}}
    return JSONResponse(body, status_code=exc.http_status)


def issuer_routes(issuer: TokenIssuer, authenticate: Authenticate) -> list[Route]:
    """The issuer's two routes, to mount in any Starlette app."""

    async def tokens(request: Request) -> Response:
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if len(raw) <= MAX_REQUEST else None
        except ValueError:
            body = None
        audience = body.get("audience") if isinstance(body, dict) else None
        if not isinstance(audience, str) or not audience:
            return _refusal(RequestError('the body must be a JSON object with "audience" (an agent name)'))
        subject_token, tenant = body.get("subject_token"), body.get("tenant")
        try:
            if isinstance(subject_token, str):
                issued = await issuer.exchange(subject_token, audience=audience)
            else:
                claimed = tenant if isinstance(tenant, str) else None
                who = authenticate(request.headers.get("authorization"), claimed)
                issued = issuer.for_tenant(who, audience)
        except ReachError as exc:
            return _refusal(exc)
        expires_in = max(0, int(issued.expires_at - time.time()))
        return JSONResponse({"token": issued.token, "token_type": "Bearer", "expires_in": expires_in})

    async def jwks(request: Request) -> Response:
        return JSONResponse(issuer.jwks(), headers={"Cache-Control": "max-age=60"})

    return [Route(TOKENS_PATH, tokens, methods=["POST"]), Route(JWKS_PATH, jwks, methods=["GET"])]
