"""Every server of ours under uvicorn: guarded parsers, keep-alive, mutual TLS options, a server in a thread.

uvloop and httptools are used when installed (the ``server`` extra brings
them). The server keeps idle connections longer than clients do (the pool's
90 s), so a client never reuses a connection the server is closing. The
gateway, ``reach issuer`` and the agent SDK all start through
:func:`uvicorn_config`, so each gets the same slow-head and header-size guard.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import threading
from typing import Any

import uvicorn

from reach_plugins.server.guard import HEADER_TIMEOUT, MAX_HEADER_BYTES, guarded
from reach_plugins.server.tls import ServerTls

KEEP_ALIVE = 100
"""Seconds the server keeps an idle connection: longer than the client pools' 90 s idle timeout."""


def _protocol(name: str, header_timeout: float, max_header_bytes: int) -> type[Any]:
    """uvicorn's ``name`` protocol class, guarded against slow and oversized request heads."""
    base: type[Any]
    if name == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base = HttpToolsProtocol
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol
    return guarded(base, header_timeout=header_timeout, max_header_bytes=max_header_bytes)


def uvicorn_config(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    header_timeout: float = HEADER_TIMEOUT,
    max_header_bytes: int = MAX_HEADER_BYTES,
    **options: Any,
) -> uvicorn.Config:
    """A uvicorn config with the fast loop and parser when available; ``options`` override anything.

    The parser (``http``: "httptools" or "h11") is wrapped so a request head
    must arrive within ``header_timeout`` seconds and ``max_header_bytes``.
    """
    parser = options.pop("http", "httptools" if importlib.util.find_spec("httptools") else "h11")
    settings: dict[str, Any] = {
        "loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        "http": _protocol(parser, header_timeout, max_header_bytes) if isinstance(parser, str) else parser,
        "h11_max_incomplete_event_size": max_header_bytes,
        "timeout_keep_alive": KEEP_ALIVE,
        "lifespan": "on",
        "log_level": "warning",
        "access_log": False,
    }
    settings.update(options)
    return uvicorn.Config(app, host=host, port=port, **settings)


def mtls(
    cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str], ca_file: str | os.PathLike[str]
) -> dict[str, Any]:
    """uvicorn options serving TLS that requires a client certificate signed by ``ca_file`` (an L1 agent's).

    ``serve(agent, port=8443, **mtls("agent.pem", "agent-key.pem", "ca.pem"))``, or the same
    options to :class:`BackgroundServer` (``serve(agent, tls_cert=..., tls_key=..., client_ca=...)`` says the same).
    """
    return ServerTls(os.fspath(cert_file), os.fspath(key_file), os.fspath(ca_file)).uvicorn()


class _Server(uvicorn.Server):
    """A uvicorn server that signals a thread-safe event once it is listening."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.ready.set()


class BackgroundServer:
    """An ASGI app served by uvicorn in a daemon thread, on a free port (or the one given).

    ``with BackgroundServer(agent.app) as server: ... server.url ...``; the
    app's own event loop runs in the thread, so blocking handlers never stall
    the caller's loop.
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, **options: Any) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host = host
        self.port: int = self._socket.getsockname()[1]
        self.scheme = "https" if options.get("ssl_certfile") else "http"
        self._server = _Server(uvicorn_config(app, host=host, port=self.port, **options))
        self._thread = threading.Thread(target=self._run, name=f"uvicorn :{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def _run(self) -> None:
        self._server.run(sockets=[self._socket])

    def start(self, timeout: float = 10.0) -> BackgroundServer:
        """Start and wait until the server listens (``RuntimeError`` if it does not within ``timeout``)."""
        self._thread.start()
        if not self._server.ready.wait(timeout):
            raise RuntimeError(f"the server on port {self.port} did not start within {timeout}s")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the server to exit (it drains and runs the app's shutdown) and wait for the thread."""
        self._server.should_exit = True
        self._thread.join(timeout)
        self._socket.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
