"""The small interface a wire engine offers DirectTransport, and how engines are made.

An engine owns one connection pool (one per agent) and moves one
:class:`~reach_plugins.protocols.HttpRequest` at a time. It maps its library's
exceptions to :mod:`reach_plugins.errors` and knows nothing of protocols,
retries or deadlines beyond the timeouts it is given.
"""

from __future__ import annotations

import importlib
import ssl
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Literal, Protocol

from reach_plugins.model import PoolConfig
from reach_plugins.protocols import HttpRequest, HttpResponse

if TYPE_CHECKING:
    import httpx

EngineName = Literal["aiohttp", "httpx"]


class WireStream(Protocol):
    """An open streamed response: status and headers known, body still arriving."""

    status: int
    headers: Mapping[str, str]

    async def next_chunk(self) -> bytes:
        """The next bytes of the body, ``b""`` at its end."""
        ...

    async def read(self) -> bytes:
        """The rest of the body (for error replies)."""
        ...


class Engine(Protocol):
    """One pooled HTTP client."""

    async def send(self, request: HttpRequest, *, timeout: float, connect_timeout: float) -> HttpResponse:
        """Send and read the whole reply; ``timeout`` bounds everything, ``connect_timeout`` the connect."""
        ...

    def stream(
        self, request: HttpRequest, *, timeout: float, connect_timeout: float
    ) -> AbstractAsyncContextManager[WireStream]:
        """Send and open the reply; ``timeout`` bounds the wait for its headers. Closing drops an unfinished body."""
        ...

    async def aclose(self) -> None: ...


def make_engine(name: EngineName, pool: PoolConfig, tls: ssl.SSLContext | None, *, http2: bool = False) -> Engine:
    """A new engine; each engine module is imported only when first used."""
    module = importlib.import_module(f"transports.direct.engine_{name}")
    engine: Engine = module.create(pool, tls, http2=http2)
    return engine


def wrap_client(client: httpx.AsyncClient) -> Engine:
    """An engine over a caller's ``httpx.AsyncClient`` (its pool and settings are the caller's)."""
    from transports.direct.engine_httpx import HttpxEngine

    return HttpxEngine(client, owned=False)
