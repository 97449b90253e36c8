"""``reach issuer``: the token issuer as a server of its own (the same code as the gateway's issuer role)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import uvicorn
from starlette.responses import JSONResponse, Response

from reach_plugins.config.loader import load_config
from reach_plugins.errors import ConfigError
from reach_plugins.security.claims import DEFAULT_TTL
from reach_plugins.server.access import Access
from reach_plugins.server.inbound import InputLimits
from reach_plugins.server.issuer_role import build_issuer, presenter_tokens
from reach_plugins.server.issuer_routes import issuer_routes
from reach_plugins.server.layer import OPEN, Inbound, ServerApp, ServerRoute
from reach_plugins.server.tls import uvicorn_tls
from reach_plugins.server.uvicorn import uvicorn_config

log = logging.getLogger("reach_plugins.server.issuer")


def create_issuer_app(
    config: str | os.PathLike[str],
    *,
    keys: Sequence[str | os.PathLike[str]] = (),
    name: str = "reach",
    ttl: float = DEFAULT_TTL,
    environ: Mapping[str, str] = os.environ,
    limits: InputLimits | None = None,
    agent_tokens: Mapping[str, str] | None = None,
    allow_open: bool = False,
) -> ServerApp:
    """The issuer's app: tenants (tokens, allow-lists) from ``config``, signing keys from ``keys`` or the env;
    ``limits`` may tighten how much of a token request is read, and how long it may take.

    ``agent_tokens`` (agent name -> the environment variable holding its issuer token) are the agents that may
    exchange the tokens they receive. A config without tenants would sign tokens for anyone, as any tenant:
    refused unless ``allow_open`` (then it says so loudly in the log).
    """
    loaded = load_config(Path(config))
    tenants = loaded.tenants
    if not tenants and not allow_open:
        raise ConfigError(
            f"{config}: no 'tenants:' section, so the issuer would sign tokens for anyone as any tenant it names; "
            "add tenants with token_env, or start it open on purpose with --allow-open (allow_open=True)"
        )
    if not tenants:
        log.warning("the token issuer runs OPEN (--allow-open): it signs tokens for any caller, as any tenant")
    trust = {agent.name: agent.trust_level for agent in loaded.agents}
    issuer = build_issuer(tenants, keys=keys, name=name, ttl=ttl, environ=environ, trust=trust)

    async def healthz(inbound: Inbound) -> Response:
        return JSONResponse({"status": "alive", "issuer": issuer.issuer})

    access = Access(tenants, environ)
    agents = presenter_tokens(agent_tokens or {}, environ, access)
    routes = [
        *issuer_routes(issuer, access.authenticate, limits=limits, agents=agents),
        ServerRoute("/healthz", ("GET",), healthz, auth=OPEN),
    ]
    return ServerApp(routes)


def serve_issuer(
    config: str | os.PathLike[str],
    host: str,
    port: int,
    *,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    client_ca: str | os.PathLike[str] | None = None,
    **options: Any,
) -> None:
    """Serve the issuer under uvicorn until interrupted (https with ``tls_cert``/``tls_key``, mutual with
    ``client_ca``); ``options`` go to :func:`create_issuer_app`."""
    tls = uvicorn_tls(tls_cert, tls_key, client_ca)
    app = create_issuer_app(config, **options)
    uvicorn.Server(uvicorn_config(app, host=host, port=port, proxy_headers=False, **tls)).run()
