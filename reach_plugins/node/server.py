"""Run a Reach node: a grpc.aio server around a forwarder, a bounded priority queue and the ticket table."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import uuid
from collections.abc import Collection, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

import grpc

from reach_plugins.config.loader import load_config
from reach_plugins.errors import ConfigError
from reach_plugins.media import MAX_MEDIA_BYTES
from reach_plugins.node.gate import AuthFirst
from reach_plugins.node.queue import WorkQueue
from reach_plugins.node.service import NodeService
from reach_plugins.node.tickets import Tickets
from reach_plugins.registry import Registry
from reach_plugins.server.access import Access
from reach_plugins.server.build import build_forwarder
from reach_plugins.server.forwarder import Forwarder
from reach_plugins.server.inbound import MAX_BODY
from reach_plugins.server.tls import ServerTls
from reach_plugins.stores.budget import DEFAULT_BUDGET
from reach_plugins.telemetry.labels import Vocabulary, metrics_token
from reach_plugins.telemetry.logs import security_mode, setup_logging, startup_line
from reach_plugins.telemetry.metrics import fan_out
from reach_plugins.telemetry.trace import TRACE_BACKUPS, TRACE_MAX_BYTES, file_sink
from reach_plugins.wire.proto import reach_pb2 as pb

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from opentelemetry.trace import TracerProvider

    from reach_plugins.telemetry.prometheus import Metrics

log = logging.getLogger("reach_plugins.node")

SERVICE: Final = pb.DESCRIPTOR.services_by_name["ReachNode"].full_name
"""``reach.v1.ReachNode``: the gRPC service the node serves."""

SLOW_CLIENTS: Final[tuple[tuple[str, Any], ...]] = (
    ("grpc.server_handshake_timeout_ms", 10_000),
    ("grpc.max_connection_idle_ms", 300_000),
    ("grpc.max_receive_message_length", MAX_BODY + MAX_MEDIA_BYTES),
)
"""Default server options: a connection must finish its handshake in 10 s, idle ones go after 5 min, messages of
1 MiB plus the media parts they may carry (8 MiB)."""


class NodeServer:
    """A Reach node listening on ``host:port`` (0 picks a free port); ``async with`` starts and stops it.

    ``node_id`` names the node in ``x-reach-via`` chains (node-to-node loop
    detection); by default a random one. ``callback_hosts`` are the hosts
    (``host`` or ``host:port``) Submit callbacks may go to; none by default.
    ``options`` are grpc server options, over :data:`SLOW_CLIENTS`. With ``tls`` the port speaks TLS
    (mutual TLS when it names a client CA), else plaintext gRPC.
    """

    def __init__(
        self,
        forwarder: Forwarder,
        access: Access,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        queue_capacity: int = 1000,
        workers: int = 64,
        node_id: str | None = None,
        tracer_provider: TracerProvider | None = None,
        options: list[tuple[str, Any]] | None = None,
        metrics: Metrics | None = None,
        metrics_port: int = 0,
        callback_hosts: Collection[str] = (),
        tls: ServerTls | None = None,
    ) -> None:
        self.host = host
        self.tls = tls
        self.metrics = metrics
        self.metrics_port = metrics_port
        """Where ``/metrics`` is served over HTTP when ``metrics`` is given (0 picks a free port)."""
        self._metrics_http: WSGIServer | None = None
        self.port = port
        self.node_id = node_id or f"node-{uuid.uuid4().hex[:8]}"
        self.forwarder = forwarder
        self.queue = WorkQueue(capacity=queue_capacity, workers=workers)
        self.service = NodeService(
            forwarder,
            access,
            queue=self.queue,
            tickets=Tickets(budget=DEFAULT_BUDGET, callback_hosts=callback_hosts),
            node_id=self.node_id,
            tracer_provider=tracer_provider,
        )
        self._options = list({**dict(SLOW_CLIENTS), **dict(options or [])}.items())
        self._server: Any = None

    @property
    def target(self) -> str:
        """``host:port`` to give a :class:`~transports.grpcnode.GrpcNodeTransport`."""
        return f"{self.host}:{self.port}"

    async def start(self) -> Self:
        server = grpc.aio.server(options=self._options)
        server.add_registered_method_handlers(SERVICE, self._handlers())
        address = f"{self.host}:{self.port}"
        if self.tls is None:
            bound = server.add_insecure_port(address)
        else:
            key, cert, client_ca = self.tls.pem()
            credentials = grpc.ssl_server_credentials(
                [(key, cert)], root_certificates=client_ca, require_client_auth=self.tls.mutual
            )
            bound = server.add_secure_port(address, credentials)
        if bound == 0:
            raise ConfigError(f"the node cannot listen on {self.host}:{self.port} (in use, or not a local address)")
        self.port = bound
        await server.start()
        await self.forwarder.start()
        self._server = server
        if self.metrics is not None:
            self._metrics_http = self.metrics.serve_http(self.host, self.metrics_port)
            self.metrics_port = self._metrics_http.server_port
        return self

    def _handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """The node's RPCs behind its gate, built once (no interceptor runs per call)."""
        service = self.service
        gate = AuthFirst(service.access, service.refuse, node_id=self.node_id, service=SERVICE)
        return {
            "Call": gate.unary("Call", service.Call, pb.ReachCall, pb.CallReply),
            "Stream": gate.streaming("Stream", service.Stream, pb.ReachCall, pb.StreamReply),
            "Submit": gate.unary("Submit", service.Submit, pb.SubmitRequest, pb.SubmitReply),
            "Result": gate.unary("Result", service.Result, pb.ResultRequest, pb.ResultReply),
        }

    async def stop(self, grace: float = 1.0) -> None:
        """Stop taking requests, let running ones finish for ``grace`` seconds, then close everything."""
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        await self.service.aclose()
        await self.forwarder.aclose()
        if self._metrics_http is not None:
            await asyncio.to_thread(self._metrics_http.shutdown)
            self._metrics_http.server_close()
            self._metrics_http = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


def build_node(
    config: str | os.PathLike[str],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    registry: Registry | str | None = None,
    environ: Mapping[str, str] = os.environ,
    tracer_provider: TracerProvider | None = None,
    queue_capacity: int = 1000,
    workers: int = 64,
    node_id: str | None = None,
    metrics_port: int | None = None,
    metrics_token_env: str | None = None,
    allow_open: bool = False,
    callback_hosts: Collection[str] = (),
    options: list[tuple[str, Any]] | None = None,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    client_ca: str | os.PathLike[str] | None = None,
    trace_file: str | None = None,
    trace_max_bytes: int = TRACE_MAX_BYTES,
    trace_backups: int = TRACE_BACKUPS,
) -> NodeServer:
    """A node for ``config`` (tenants; agents unless ``registry`` is given), not yet started.

    ``tls_cert``/``tls_key`` serve gRPC over TLS; ``client_ca`` requires client certificates of that CA.
    ``trace_file``: every request's trace as a JSON line there, rotated by size (``reach trace``, ``reach usage``).

    With ``metrics_port`` the node serves ``/metrics`` (Prometheus text, through the
    OpenTelemetry exporter) over HTTP on that port of ``host``: only names the node
    knows, tenant names only behind the bearer token ``metrics_token_env`` names.
    """
    tls = ServerTls.given(tls_cert, tls_key, client_ca)
    node_id = node_id or f"node-{uuid.uuid4().hex[:8]}"
    metrics = None
    if metrics_port is not None:
        from reach_plugins.telemetry.prometheus import Metrics  # the server extra's exporter, only when asked for

        token = metrics_token(metrics_token_env, environ)
        tenants = load_config(Path(config)).tenants
        known = Vocabulary(lambda: forwarder.table, tenants=tenants, show_tenants=token is not None)
        metrics = Metrics(vocabulary=known, token=token)
    forwarder, access = build_forwarder(
        config,
        registry=registry,
        environ=environ,
        tracer_provider=tracer_provider,
        node_id=node_id,
        sink=fan_out(
            metrics.reach if metrics is not None else None,
            file_sink(trace_file, max_bytes=trace_max_bytes, backups=trace_backups),
        ),
        allow_open=allow_open,
    )
    return NodeServer(
        forwarder,
        access,
        host=host,
        port=port,
        queue_capacity=queue_capacity,
        workers=workers,
        node_id=node_id,
        tracer_provider=tracer_provider,
        metrics=metrics,
        metrics_port=metrics_port or 0,
        callback_hosts=callback_hosts,
        options=options,
        tls=tls,
    )


async def serve_node(
    config: str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 50051,
    *,
    log_format: str | None = None,
    log_level: str = "info",
    **options: Any,
) -> None:
    """Serve a node until SIGINT/SIGTERM (``reach node``), logging in ``log_format`` ("text", "json") when given."""
    if log_format is not None:
        setup_logging(log_format, log_level)
    node = build_node(config, host=host, port=port, **options)
    await node.start()
    access = node.service.access
    tls = node.tls
    security = security_mode(tls=tls is not None, mutual=tls is not None and tls.mutual, open_=access.open)
    metrics = f"http://{node.host}:{node.metrics_port}/metrics" if node.metrics is not None else "off"
    line = startup_line(
        "node",
        address=f"grpc{'s' if tls else ''}://{node.target}",
        registry=options.get("registry"),
        tenants=len(access.tenants),
        security=security,
    )
    log.info("%s node_id=%s metrics=%s", line, node.node_id, metrics)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    try:
        await stopping.wait()
    finally:
        await node.stop(grace=5.0)


def run_node(config: str | os.PathLike[str], host: str = "127.0.0.1", port: int = 50051, **options: Any) -> None:
    """Run :func:`serve_node` to the end on uvloop when it is installed (the ``server`` extra), else asyncio's loop.

    uvloop takes the event loop's own share of each request down (the node's
    gRPC completions and its aiohttp calls to agents both run through it).
    """
    try:
        import uvloop
    except ImportError:  # pragma: no cover - depends on the installed extras
        asyncio.run(serve_node(config, host, port, **options))
    else:
        uvloop.run(serve_node(config, host, port, **options))
