"""Build and run a gateway from a config file: agents and tenants from YAML, or agents from a registry URL."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from reach_plugins.config.loader import load_config
from reach_plugins.errors import ConfigError
from reach_plugins.gateway.app import Gateway
from reach_plugins.gateway.ops import Recent
from reach_plugins.registry import Registry
from reach_plugins.security.claims import VIA_GATEWAY
from reach_plugins.server.build import build_forwarder
from reach_plugins.server.inbound import InputLimits
from reach_plugins.server.issuer_role import build_issuer, presenter_tokens
from reach_plugins.server.layer import ServerApp
from reach_plugins.server.tls import uvicorn_tls
from reach_plugins.server.uvicorn import uvicorn_config
from reach_plugins.telemetry.labels import Vocabulary, metrics_token
from reach_plugins.telemetry.logs import security_mode, setup_logging, startup_line
from reach_plugins.telemetry.metrics import fan_out
from reach_plugins.telemetry.prometheus import Metrics
from reach_plugins.telemetry.trace import TRACE_BACKUPS, TRACE_MAX_BYTES, RecentTraces, file_sink

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from reach_plugins.security.audit import AuditHook
    from reach_plugins.stores.dedup import DedupStore

log = logging.getLogger("reach_plugins.gateway")


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
    agent_tokens: Mapping[str, str] | None = None,
    audit: AuditHook | str | None = None,
    store: DedupStore | str | None = None,
    worker: int | None = None,
    metrics_token_env: str | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    trace_file: str | None = None,
    trace_max_bytes: int = TRACE_MAX_BYTES,
    trace_backups: int = TRACE_BACKUPS,
    recent: RecentTraces | None = None,
) -> ServerApp:
    """The gateway's ASGI app for ``config`` (see :func:`build_forwarder`), with the token issuer role mounted;
    ``limits`` bound each request read; ``worker`` is this process's number under ``--workers`` (in /healthz).

    ``agent_tokens`` (agent name -> the environment variable holding its issuer token, as ``reach issuer
    --agent-token``) are the agents that may exchange, at this gateway's ``/v1/tokens``, the tokens it sent them;
    without it every exchange there is refused (401).

    ``/metrics`` shows only names the gateway knows (its agents, capabilities, instances and tenants); with
    ``metrics_token_env`` a scrape must present that variable's value as its bearer, and only then are tenant
    names shown; with ``metrics_port`` it is served on ``metrics_host:metrics_port`` instead of the gateway's port.
    ``trace_file``: every request's trace as a JSON line there (rotated past ``trace_max_bytes``, ``trace_backups``
    kept), what ``reach trace`` and ``reach usage`` read; the recent ones stream from ``GET /v1/traces/stream``
    behind the metrics token (``reach trace --follow``).
    """
    loaded = load_config(Path(config))
    tenants = loaded.tenants
    trust = {agent.name: agent.trust_level for agent in loaded.agents}
    issuer = build_issuer(tenants, keys=issuer_keys, environ=environ, trust=trust)
    token = metrics_token(metrics_token_env, environ)
    known = Vocabulary(lambda: forwarder.table, tenants=tenants, show_tenants=token is not None)
    metrics = Metrics(vocabulary=known, token=token)
    recent = recent if recent is not None else RecentTraces()
    reaches = Recent()
    forwarder, access = build_forwarder(
        config,
        registry=registry,
        environ=environ,
        tracer_provider=tracer_provider,
        allow_open=allow_open,
        issuer=issuer,
        via=VIA_GATEWAY,
        audit=audit,
        sink=fan_out(
            metrics.reach, recent, reaches, file_sink(trace_file, max_bytes=trace_max_bytes, backups=trace_backups)
        ),
        store=store,
    )
    gateway = Gateway(
        forwarder,
        access,
        max_inflight=max_inflight,
        tracer_provider=tracer_provider,
        limits=limits,
        max_media_bytes=max((cap.max_media_bytes for agent in loaded.agents for cap in agent.capabilities), default=0),
        issuer=issuer,
        exchangers=presenter_tokens(agent_tokens or {}, environ, access),
        metrics=metrics,
        worker=worker,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        recent=recent,
        reaches=reaches,
    )
    return gateway.app()


def listen(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on ``host:port`` that child processes inherit (``ConfigError`` if it cannot be had)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; choose another --port") from None
    sock.set_inheritable(True)
    return sock


def log_startup(
    config: str | os.PathLike[str],
    sock: socket.socket,
    *,
    registry: str | None,
    allow_open: bool,
    tls_cert: str | None,
    client_ca: str | None,
    workers: int = 1,
) -> None:
    """Log the gateway's start-up line: version, where it listens, its registry, tenants and security mode."""
    tenants = len(load_config(Path(config)).tenants)
    host, port = sock.getsockname()[:2]
    scheme = "https" if tls_cert else "http"
    security = security_mode(tls=tls_cert is not None, mutual=client_ca is not None, open_=allow_open and not tenants)
    line = startup_line(
        "gateway", address=f"{scheme}://{host}:{port}", registry=registry, tenants=tenants, security=security
    )
    log.info("%s workers=%d", line, workers)


def serve_gateway(
    config: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    registry: str | None = None,
    allow_open: bool = False,
    issuer_keys: Sequence[str | os.PathLike[str]] = (),
    agent_tokens: Mapping[str, str] | None = None,
    audit: str | None = None,
    store: str | None = None,
    worker: int | None = None,
    sockets: list[socket.socket] | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    client_ca: str | None = None,
    metrics_token_env: str | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    trace_file: str | None = None,
    trace_max_bytes: int = TRACE_MAX_BYTES,
    trace_backups: int = TRACE_BACKUPS,
    log_format: str | None = None,
    log_level: str = "info",
    **options: Any,
) -> None:
    """Serve the gateway under uvicorn until interrupted (uvloop and httptools when installed).

    ``X-Forwarded-For`` is ignored unless ``proxy_headers=True`` is passed:
    the source address decides who reaches ``internal_only`` agents. A worker
    of :mod:`reach_plugins.gateway.workers` serves the listening ``sockets``
    its supervisor handed down instead of binding ``host:port``. ``tls_cert``/``tls_key`` serve https,
    ``client_ca`` requires callers' certificates of that CA too (:mod:`reach_plugins.server.tls`).
    With ``log_format`` ("text" or "json") every line, uvicorn's too, goes through
    :func:`~reach_plugins.telemetry.logs.setup_logging` at ``log_level``.
    """
    if log_format is not None:
        setup_logging(log_format, log_level)
        options.setdefault("log_config", None)
    options |= uvicorn_tls(tls_cert, tls_key, client_ca)
    recent = RecentTraces()
    app = create_app(
        config,
        registry=registry,
        allow_open=allow_open,
        issuer_keys=issuer_keys,
        agent_tokens=agent_tokens,
        audit=audit,
        store=store,
        worker=worker,
        metrics_token_env=metrics_token_env,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        trace_file=trace_file,
        trace_max_bytes=trace_max_bytes,
        trace_backups=trace_backups,
        recent=recent,
    )
    options.setdefault("proxy_headers", False)
    if sockets is None:
        sockets = [listen(host, port)]
        log_startup(
            config, sockets[0], registry=registry, allow_open=allow_open, tls_cert=tls_cert, client_ca=client_ca
        )
    _Server(uvicorn_config(app, host=host, port=port, **options), recent).run(sockets=sockets)


class _Server(uvicorn.Server):
    """uvicorn's server, ending the trace followers' streams as soon as it is told to stop: it waits for every
    response to end, and ``GET /v1/traces/stream`` would never end by itself."""

    def __init__(self, config: uvicorn.Config, recent: RecentTraces) -> None:
        super().__init__(config)
        self._recent = recent

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        try:
            asyncio.get_running_loop().call_soon_threadsafe(self._recent.close)
        except RuntimeError:  # not serving yet
            self._recent.close()
