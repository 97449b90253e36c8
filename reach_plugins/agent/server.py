"""Run an agent under uvicorn: ``serve()`` for a process, with registration (the server itself: ``server.uvicorn``)."""

from __future__ import annotations

import os
import ssl
from typing import Any

import uvicorn

from reach_plugins.agent.agent import ReachAgent
from reach_plugins.errors import ConfigError
from reach_plugins.registry.base import Registry
from reach_plugins.server.tls import uvicorn_tls
from reach_plugins.server.uvicorn import uvicorn_config


def serve(
    agent: ReachAgent,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    registry: Registry | str | None = None,
    endpoint: str | None = None,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    client_ca: str | os.PathLike[str] | None = None,
    **options: Any,
) -> None:
    """Serve ``agent`` until interrupted; with ``registry`` (an object or a URL: the agent opens a URL without
    waiting for the registry, so it starts while the registry is down), register at ``endpoint`` (default from
    host/port).

    ``endpoint`` is also where the agent's A2A card says it is reached (unless ``ReachAgent(public_url=)`` says).

    ``tls_cert``/``tls_key`` serve https; ``client_ca`` also requires a client certificate of that CA
    (mutual TLS, which an L1 agent must have).
    """
    options |= uvicorn_tls(tls_cert, tls_key, client_ca)
    mutual = options.get("ssl_cert_reqs") == ssl.CERT_REQUIRED
    if agent.trust == "L1" and not mutual:
        raise ConfigError(
            f"agent {agent.name!r} is L1: serve it with mutual TLS: serve(agent, ..., tls_cert=, tls_key=, client_ca=)"
        )
    if endpoint is not None:
        agent.served_at(endpoint)
    if registry is not None:
        scheme = "https" if options.get("ssl_certfile") else "http"
        agent.register_on_startup(registry, endpoint or f"{scheme}://{host}:{port}")
    uvicorn.Server(uvicorn_config(agent.app, host=host, port=port, **options)).run()
