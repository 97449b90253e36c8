"""The aiohttp wire engine: the default, 2.5-10x faster than httpx on loopback (DESIGN.md section 10)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import aiohttp

from reach_plugins.adapters import HttpRequest, HttpResponse
from reach_plugins.errors import ConfigError, ConnectError, ConnectionLost, ReadTimeout
from reach_plugins.model import PoolConfig


def mapped(exc: BaseException, request: HttpRequest) -> Exception:
    """aiohttp's exception as ours, most specific first (a connect timeout is a timeout *and* a connect error)."""
    where = f"{request.method} {request.url}"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return ConnectError(f"connecting for {where} timed out")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return ConnectError(f"cannot connect for {where}: {exc.os_error or exc}")
    if isinstance(exc, TimeoutError):
        return ReadTimeout(f"no complete answer to {where} in time")
    if isinstance(exc, aiohttp.InvalidURL):
        return ConfigError(f"the agent endpoint is not a valid URL: {request.url!r}")
    return ConnectionLost(f"the connection broke during {where}: {exc!r}")


FOREIGN = (aiohttp.ClientError, TimeoutError)
"""What :func:`mapped` translates."""


class AiohttpStream:
    """A streamed aiohttp response."""

    def __init__(self, response: aiohttp.ClientResponse, request: HttpRequest) -> None:
        self._response = response
        self._request = request
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers

    async def next_chunk(self) -> bytes:
        try:
            return await self._response.content.readany()
        except FOREIGN as exc:
            raise mapped(exc, self._request) from exc

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except FOREIGN as exc:
            raise mapped(exc, self._request) from exc


class AiohttpEngine:
    """One ``aiohttp.ClientSession`` with its own connector (pool size, keep-alive, TLS)."""

    def __init__(self, pool: PoolConfig, tls: ssl.SSLContext | None) -> None:
        connector = aiohttp.TCPConnector(limit=pool.max_conns, keepalive_timeout=pool.idle_timeout, ssl=tls or True)
        self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
        self._limits: dict[tuple[float, float], aiohttp.ClientTimeout] = {}

    def _timeout(self, total: float, connect: float) -> aiohttp.ClientTimeout:
        """A ``ClientTimeout`` per distinct pair: most calls repeat their per-attempt timeout, so reuse it."""
        limits = self._limits.get((total, connect))
        if limits is None:
            if len(self._limits) >= 64:
                self._limits.clear()
            limits = self._limits[total, connect] = aiohttp.ClientTimeout(total=total, sock_connect=connect)
        return limits

    async def send(self, request: HttpRequest, *, timeout: float, connect_timeout: float) -> HttpResponse:
        limits = self._timeout(timeout, connect_timeout)
        try:
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
        except FOREIGN as exc:
            raise mapped(exc, request) from exc

    @asynccontextmanager
    async def stream(
        self, request: HttpRequest, *, timeout: float, connect_timeout: float
    ) -> AsyncIterator[AiohttpStream]:
        limits = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout)
        try:
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
        except FOREIGN as exc:
            raise mapped(exc, request) from exc
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
