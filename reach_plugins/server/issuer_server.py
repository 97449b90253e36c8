"""``reach issuer``: the token issuer as a server of its own (the same code as the gateway's issuer role)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reach_plugins.config.loader import load_config
from reach_plugins.security.claims import DEFAULT_TTL
from reach_plugins.server.access import Access
from reach_plugins.server.issuer_role import build_issuer
from reach_plugins.server.issuer_routes import issuer_routes
from reach_plugins.server.uvicorn import uvicorn_config


def create_issuer_app(
    config: str | os.PathLike[str],
    *,
    keys: Sequence[str | os.PathLike[str]] = (),
    name: str = "reach",
    ttl: float = DEFAULT_TTL,
    environ: Mapping[str, str] = os.environ,
) -> Starlette:
    """The issuer's app: tenants (tokens, allow-lists) from ``config``, signing keys from ``keys`` or the env."""
    tenants = load_config(Path(config)).tenants
    issuer = build_issuer(tenants, keys=keys, name=name, ttl=ttl, environ=environ)

    async def healthz(request: Any) -> Response:
        return JSONResponse({"status": "alive", "issuer": issuer.issuer})

    routes = [*issuer_routes(issuer, Access(tenants, environ).authenticate), Route("/healthz", healthz)]
    return Starlette(routes=routes)


def serve_issuer(config: str | os.PathLike[str], host: str, port: int, **options: Any) -> None:
    """Serve the issuer under uvicorn until interrupted."""
    app = create_issuer_app(config, **options)
    uvicorn.Server(uvicorn_config(app, host=host, port=port, proxy_headers=False)).run()
