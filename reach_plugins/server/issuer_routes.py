"""The issuer over HTTP: ``POST /v1/tokens`` and ``GET /.well-known/jwks.json``, for ``reach issuer`` and the gateway.

``POST /v1/tokens`` with ``{"audience": agent}`` and the tenant's
``Authorization: Bearer`` token issues a token for the tenant; with
``{"audience": agent, "subject_token": received}`` it exchanges the token an
agent received for one bound to the chain (RFC 8693's shape, without
forwarding). Answers ``{"token", "expires_in"}``; refusals are 401/403
JSON naming the problem.

An exchange is presented by the agent the token was issued to, authenticated
by its own issuer token (``agents``: agent name -> its bearer token, e.g.
``reach issuer --agent-token orders=ORDERS_ISSUER_TOKEN``): the presented
token alone proves nothing about who presents it. The issuer then checks the
tenant's allow-list, the chain and the trust level
(:meth:`~reach_plugins.security.issuer.TokenIssuer.exchange`).

Both routes go through the server layer. Every bearer (a tenant's, an agent's)
is checked before a byte of the body is read; the body is at most
:data:`MAX_REQUEST` bytes, read within :data:`BODY_TIMEOUT`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from reach_plugins.errors import PermissionDenied, Unauthenticated
from reach_plugins.security.issuer import TokenIssuer
from reach_plugins.server.access import bearer_of, digest
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
_PRESENTER: Final = (
    "an exchange is presented by the agent the token was issued to, with its own issuer token "
    "('Authorization: Bearer <agent token>', configured at the issuer with --agent-token NAME=ENV)"
)


@dataclass(frozen=True, slots=True)
class TokenCaller:
    """Who asks for a token: an agent (by its own issuer token) or a tenant's caller."""

    agent: str | None = None
    tenant: str | None = None


class TokenRequest(BaseModel):
    """The body of ``POST /v1/tokens``: the agent to reach, and the token to exchange or the tenant to act for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    audience: str = Field(min_length=1, max_length=200)
    subject_token: str | None = Field(default=None, min_length=1, max_length=MAX_REQUEST)
    tenant: str | None = Field(default=None, max_length=128, pattern=HEADER_SAFE)


def issuer_routes(
    issuer: TokenIssuer,
    authenticate: Authenticate,
    *,
    limits: InputLimits | None = None,
    agents: Mapping[str, str] | None = None,
) -> list[ServerRoute]:
    """The issuer's two routes, to mount in any app of ours (``limits`` may only tighten the token request's);
    ``agents`` (name -> its issuer token) are the agents that may exchange the tokens they receive."""
    presenters = {digest(token): name for name, token in (agents or {}).items()}
    given = limits or InputLimits()
    bounded = InputLimits(
        max_body=min(given.max_body, MAX_REQUEST),
        max_depth=min(given.max_depth, 4),
        body_timeout=min(given.body_timeout, BODY_TIMEOUT),
        large_bodies=1,
    )

    async def caller(request: Request, headers: Mapping[str, str]) -> TokenCaller:
        """An agent by its issuer token, else the tenant of a bearer token: checked before the body is read."""
        authorization = headers.get("authorization") or ""
        bearer = bearer_of(authorization)
        agent = presenters.get(digest(bearer)) if bearer is not None else None
        if agent is not None:
            return TokenCaller(agent=agent)
        return TokenCaller(tenant=authenticate(authorization or None, headers.get("x-tenant")))

    async def tokens(inbound: Inbound) -> Response:
        body: TokenRequest = inbound.body
        who: TokenCaller = inbound.caller
        if body.subject_token is not None:
            if who.agent is None:
                raise Unauthenticated(_PRESENTER)
            issued = await issuer.exchange(body.subject_token, audience=body.audience, presenter=who.agent)
        else:
            if who.agent is not None:
                raise PermissionDenied(
                    f"agent {who.agent!r} authenticated with its issuer token, which only exchanges the tokens it "
                    "received (send subject_token); tenants ask with their own bearer"
                )
            tenant = who.tenant
            if body.tenant is not None and body.tenant != tenant:
                tenant = authenticate(inbound.headers.get("authorization"), body.tenant)
            issued = issuer.for_tenant(tenant, body.audience)
        expires_in = max(0, int(issued.expires_at - time.time()))
        return JSONResponse({"token": issued.token, "token_type": "Bearer", "expires_in": expires_in})

    async def jwks(inbound: Inbound) -> Response:
        return JSONResponse(issuer.jwks(), headers={"Cache-Control": "max-age=60"})

    return [
        ServerRoute(TOKENS_PATH, ("POST",), tokens, auth=caller, body=TokenRequest, limits=bounded),
        ServerRoute(JWKS_PATH, ("GET",), jwks, auth=OPEN),
    ]
