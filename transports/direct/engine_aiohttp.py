"""The aiohttp wire engine: the default, 2.5-10x faster than httpx on loopback (DESIGN.md section 10)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager

import aiohttp

from reach_plugins.adapters import HttpRequest, HttpResponse
from reach_plugins.errors import ConfigError, ConnectError, ConnectionLost, ReadTimeout
from reach_plugins.model import PoolConfig


@contextmanager
def mapped_errors(request: HttpRequest) -> Iterator[None]:
    """aiohttp's exceptions as ours, most specific first (connect timeouts are timeouts *and* connect errors)."""
    where = f"{request.method} {request.url}"
    try:
        yield
    except aiohttp.ConnectionTimeoutError as exc:
        raise ConnectError(f"connecting for {where} timed out") from exc
    except aiohttp.ClientConnectorError as exc:
        raise ConnectError(f"cannot connect for {where}: {exc.os_error or exc}") from exc
    except TimeoutError as exc:
        raise ReadTimeout(f"no complete answer to {where} in time") from exc
    except aiohttp.InvalidURL as exc:
        raise ConfigError(f"the agent endpoint is not a valid URL: {request.url!r}") from exc
    except aiohttp.ClientError as exc:
        raise ConnectionLost(f"the connection broke during {where}: {exc!r}") from exc


class AiohttpStream:
    """A streamed aiohttp response."""

    def __init__(self, response: aiohttp.ClientResponse, request: HttpRequest) -> None:
        self._response = response
        self._request = request
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers

    async def next_chunk(self) -> bytes:
        with mapped_errors(self._request):
            return await self._response.content.readany()

    async def read(self) -> bytes:
        with mapped_errors(self._request):
            return await self._response.read()


class AiohttpEngine:
    """One ``aiohttp.ClientSession`` with its own connector (pool size, keep-alive, TLS)."""

    def __init__(self, pool: PoolConfig, tls: ssl.SSLContext | None) -> None:
        connector = aiohttp.TCPConnector(limit=pool.max_conns, keepalive_timeout=pool.idle_timeout, ssl=tls or True)
        self._session = aiohttp.ClientSession(connector=connector, trust_env=False)

    async def send(self, request: HttpRequest, *, timeout: float, connect_timeout: float) -> HttpResponse:
        limits = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
        with mapped_errors(request):
            async with self._session.request(
                request.method,
                request.url,
                data=request.body,
                headers=request.headers,
                params=request.params or None,
                timeout=limits,
                allow_redirects=False,
            ) as response:
                return HttpResponse(response.status, response.headers, await response.read())

    @asynccontextmanager
    async def stream(
        self, request: HttpRequest, *, timeout: float, connect_timeout: float
    ) -> AsyncIterator[AiohttpStream]:
        limits = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout)
        with mapped_errors(request):
            async with asyncio.timeout(timeout):
                response = await self._session.request(
                    request.method,
                    request.url,
                    data=request.body,
                    headers=request.headers,
                    params=request.params or None,
                    timeout=limits,
                    allow_redirects=False,
                )
        try:
            yield AiohttpStream(response, request)
        finally:
            response.close()

    async def aclose(self) -> None:
        await self._session.close()


def create(pool: PoolConfig, tls: ssl.SSLContext | None, *, http2: bool = False) -> AiohttpEngine:
    if http2:
        raise ConfigError("HTTP/2 needs the httpx engine: DirectTransport(engine='httpx', http2=True)")
    return AiohttpEngine(pool, tls)
