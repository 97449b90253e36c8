"""Build and run a gateway from a config file: agents and tenants from YAML, or agents from a registry URL."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reach_plugins.config.loader import load_config
from reach_plugins.endpoints import EndpointPolicy
from reach_plugins.errors import ConfigError
from reach_plugins.registry import FileRegistry, Registry, open_registry
from reach_plugins.security.claims import VIA_GATEWAY
from reach_plugins.security.issuer import TokenIssuer
from reach_plugins.server.access import Access
from reach_plugins.server.forwarder import Forwarder
from reach_plugins.server.inbound import InputLimits
from reach_plugins.server.issuer_role import agent_transport, build_issuer

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider
    from starlette.applications import Starlette

    from reach_plugins.policy.dedup import DedupStore
    from reach_plugins.security.audit import AuditHook
    from reach_plugins.telemetry.trace import TraceSink


def build_forwarder(
    config: str | os.PathLike[str],
    *,
    registry: Registry | str | None = None,
    environ: Mapping[str, str] = os.environ,
    tracer_provider: TracerProvider | None = None,
    node_id: str | None = None,
    route_ttl: float = 1.0,
    sink: TraceSink | None = None,
    allow_open: bool = False,
    issuer: TokenIssuer | None = None,
    via: str | None = None,
    audit: AuditHook | str | None = None,
    store: DedupStore | str | None = None,
) -> tuple[Forwarder, Access]:
    """The forwarder and access rules a server runs with.

    Tenants (tokens, allow-lists, networks, credentials) come from ``config``
    and are read once at start. Agents come from ``registry`` when given,
    else from ``config`` itself, which is then reloaded when it changes. A
    config without tenants would serve anyone as any tenant: refused unless
    ``allow_open``. Agents are reached with a token of ``issuer`` each (by
    default one signing with ``$REACH_ISSUER_KEYS``, else a key of this
    process), marked ``via``; L3 agents only with ``audit`` set. Idempotency
    keys are held in ``store`` (a ``redis://`` URL shares them between processes).
    Agent endpoints obey the networks ``$REACH_ENDPOINT_NETWORKS`` in ``environ`` names (read here, once), in the
    file and in a registry opened from a URL.
    """
    path = Path(config)
    endpoints = EndpointPolicy.from_environ(environ)
    tenants = load_config(path, endpoints=endpoints).tenants
    if not tenants and not allow_open:
        raise ConfigError(
            f"{path}: no 'tenants:' section, so the server would serve anyone as any tenant it names; "
            "add tenants with token_env, or start it open on purpose with --allow-open (allow_open=True)"
        )
    access = Access(tenants, environ)
    source = (
        FileRegistry(path, endpoints=endpoints) if registry is None else open_registry(registry, endpoints=endpoints)
    )
    forwarder = Forwarder(
        source,
        tenants=tenants,
        environ=environ,
        tracer_provider=tracer_provider,
        node_id=node_id,
        route_ttl=route_ttl,
        owns_registry=registry is None or isinstance(registry, str),
        direct=agent_transport(issuer or build_issuer(tenants, environ=environ), via=via, audit=audit),
        sink=sink,
        store=store,
    )
    return forwarder, access


def create_app(
    config: str | os.PathLike[str],
    *,
    registry: Registry | str | None = None,
    environ: Mapping[str, str] = os.environ,
    tracer_provider: TracerProvider | None = None,
    max_inflight: int = 1024,
    allow_open: bool = False,
    limits: InputLimits | None = None,
    issuer_keys: Sequence[str | os.PathLike[str]] = (),
    audit: AuditHook | str | None = None,
    store: DedupStore | str | None = None,
    worker: int | None = None,
) -> Starlette:
    """The gateway's ASGI app for ``config`` (see :func:`build_forwarder`), with the token issuer role mounted;
    ``limits`` bound each request read; ``worker`` is this process's number under ``--workers`` (in /healthz)."""
    from reach_plugins.gateway.app import Gateway
    from reach_plugins.telemetry.prometheus import Metrics

    issuer = build_issuer(load_config(Path(config)).tenants, keys=issuer_keys, environ=environ)
    metrics = Metrics()
    forwarder, access = build_forwarder(
        config,
        registry=registry,
        environ=environ,
        tracer_provider=tracer_provider,
        allow_open=allow_open,
        issuer=issuer,
        via=VIA_GATEWAY,
        audit=audit,
        sink=metrics.reach,
        store=store,
    )
    gateway = Gateway(
        forwarder,
        access,
        max_inflight=max_inflight,
        tracer_provider=tracer_provider,
        limits=limits,
        issuer=issuer,
        metrics=metrics,
        worker=worker,
    )
    return gateway.app()


def serve_gateway(
    config: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    registry: str | None = None,
    allow_open: bool = False,
    issuer_keys: Sequence[str | os.PathLike[str]] = (),
    audit: str | None = None,
    store: str | None = None,
    worker: int | None = None,
    sockets: list[socket.socket] | None = None,
    **options: Any,
) -> None:
    """Serve the gateway under uvicorn until interrupted (uvloop and httptools when installed).

    ``X-Forwarded-For`` is ignored unless ``proxy_headers=True`` is passed:
    the source address decides who reaches ``internal_only`` agents. A worker
    of :mod:`reach_plugins.gateway.workers` serves the listening ``sockets``
    its supervisor handed down instead of binding ``host:port``.
    """
    import uvicorn

    from reach_plugins.server.uvicorn import uvicorn_config

    app = create_app(
        config,
        registry=registry,
        allow_open=allow_open,
        issuer_keys=issuer_keys,
        audit=audit,
        store=store,
        worker=worker,
    )
    options.setdefault("proxy_headers", False)
    uvicorn.Server(uvicorn_config(app, host=host, port=port, **options)).run(sockets=sockets)
