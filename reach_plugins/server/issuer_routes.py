"""The issuer over HTTP: ``POST /v1/tokens`` and ``GET /.well-known/jwks.json``, for ``reach issuer`` and the gateway.

``POST /v1/tokens`` with ``{"audience": agent}`` and the tenant's
``Authorization: Bearer`` token issues a token for the tenant; with
``{"audience": agent, "subject_token": received}`` it exchanges the token an
agent received (its identity) for one bound to the chain (RFC 8693's shape,
without forwarding). Answers ``{"token", "expires_in"}``; refusals are 401/403
JSON naming the problem.

Both routes go through the server layer. A bearer token is checked before a
byte of the body is read. An exchange carries its credential in the body, so a
caller without a bearer may send only a body the size of a token request
(:data:`MAX_REQUEST`, its ``Content-Length`` declared up front: anything else
is refused before the body), read within :data:`BODY_TIMEOUT`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Final

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reach_plugins.errors import Unauthenticated
from reach_plugins.security.issuer import TokenIssuer
from reach_plugins.server.inbound import InputLimits
from reach_plugins.server.layer import OPEN, Inbound, ServerRoute
from reach_plugins.wire.headers import HEADER_SAFE

Authenticate = Callable[[str | None, str | None], "str | None"]
"""``(authorization header, claimed tenant) -> tenant``; raises ``PermissionDenied`` (401 if unauthenticated)."""
MAX_REQUEST: Final = 16 * 1024
"""The largest token request, in bytes (an audience and a token)."""
BODY_TIMEOUT: Final = 5.0
"""Seconds a token request has to arrive whole once its head did."""
JWKS_PATH = "/.well-known/jwks.json"
TOKENS_PATH = "/v1/tokens"
_ANONYMOUS: Final = (
    "missing 'Authorization: Bearer <token>' header; a tenant presents its token, "
    f"an agent exchanging a token sends it as subject_token in a body of at most {MAX_REQUEST} bytes "
    "with its Content-Length declared"
)


class TokenRequest(BaseModel):
    """The body of ``POST /v1/tokens``: the agent to reach, and the token to exchange or the tenant to act for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    audience: str = Field(min_length=1, max_length=200)
    subject_token: str | None = Field(default=None, min_length=1, max_length=MAX_REQUEST)
    tenant: str | None = Field(default=None, max_length=128, pattern=HEADER_SAFE)


def issuer_routes(
    issuer: TokenIssuer, authenticate: Authenticate, *, limits: InputLimits | None = None
) -> list[ServerRoute]:
    """The issuer's two routes, to mount in any app of ours (``limits`` may only tighten the token request's)."""
    given = limits or InputLimits()
    bounded = InputLimits(
        max_body=min(given.max_body, MAX_REQUEST),
        max_depth=min(given.max_depth, 4),
        body_timeout=min(given.body_timeout, BODY_TIMEOUT),
        large_bodies=1,
    )

    async def caller(request: Request, headers: Mapping[str, str]) -> str | None:
        """The tenant of a bearer token (checked before the body); none for an exchange, whose proof is the body."""
        authorization = headers.get("authorization")
        if authorization:
            return authenticate(authorization, headers.get("x-tenant"))
        declared = headers.get("content-length", "")
        if not (declared.isascii() and declared.isdigit()) or int(declared) > MAX_REQUEST:
            raise Unauthenticated(_ANONYMOUS)
        return None

    async def tokens(inbound: Inbound) -> Response:
        body: TokenRequest = inbound.body
        if body.subject_token is not None:
            issued = await issuer.exchange(body.subject_token, audience=body.audience)
        else:
            authorization = inbound.headers.get("authorization")
            if not authorization:
                raise Unauthenticated(_ANONYMOUS)
            tenant = inbound.caller
            if body.tenant is not None and body.tenant != tenant:
                tenant = authenticate(authorization, body.tenant)
            issued = issuer.for_tenant(tenant, body.audience)
        expires_in = max(0, int(issued.expires_at - time.time()))
        return JSONResponse({"token": issued.token, "token_type": "Bearer", "expires_in": expires_in})

    async def jwks(inbound: Inbound) -> Response:
        return JSONResponse(issuer.jwks(), headers={"Cache-Control": "max-age=60"})

    return [
        ServerRoute(TOKENS_PATH, ("POST",), tokens, auth=caller, body=TokenRequest, limits=bounded),
        ServerRoute(JWKS_PATH, ("GET",), jwks, auth=OPEN),
    ]
