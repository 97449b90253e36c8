"""The aiohttp wire engine: the default, 2.5-10x faster than httpx on loopback (DESIGN.md section 10)."""

from __future__ import annotations

import asyncio
import math
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import aiohttp

from reach_plugins.errors import ConfigError
from reach_plugins.model import PoolConfig
from reach_plugins.protocols import HttpRequest, HttpResponse
from reach_plugins.wire.body import MAX_REPLY
from transports.direct.boundary import FOREIGN, TrackedBody, mapped, read_capped


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
    """One ``aiohttp.ClientSession`` with its own connector (pool size, keep-alive, TLS).

    ``max_reply`` caps a whole (not streamed) reply's size (default 16 MiB).
    """

    max_reply: int = MAX_REPLY

    def __init__(self, pool: PoolConfig, tls: ssl.SSLContext | None) -> None:
        connector = aiohttp.TCPConnector(limit=pool.max_conns, keepalive_timeout=pool.idle_timeout, ssl=tls or True)
        self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
        self._limits: dict[tuple[int, float], aiohttp.ClientTimeout] = {}

    def _timeout(self, total: float, connect: float) -> aiohttp.ClientTimeout:
        """A ``ClientTimeout`` ending the attempt on time (at most a millisecond early, never late).

        The total is rounded down to the millisecond so that calls whose
        remaining budgets differ by microseconds share one object; aiohttp's
        rounding of long timeouts up to the next whole second is turned off,
        since the core relies on this bound ending the attempt.
        """
        millis = int(total * 1000.0)
        if millis < 1:
            return aiohttp.ClientTimeout(total=total, sock_connect=connect, ceil_threshold=math.inf)
        limits = self._limits.get((millis, connect))
        if limits is None:
            if len(self._limits) >= 64:
                self._limits.clear()
            limits = aiohttp.ClientTimeout(total=millis / 1000.0, sock_connect=connect, ceil_threshold=math.inf)
            self._limits[millis, connect] = limits
        return limits

    async def send(self, request: HttpRequest, *, timeout: float, connect_timeout: float) -> HttpResponse:
        limits = self._timeout(timeout, connect_timeout)
        body = None if request.body is None else TrackedBody(request.body)
        try:
            async with self._session.request(
                request.method,
                request.url,
                data=body,
                headers=request.headers,
                params=request.params or None,
                timeout=limits,
                allow_redirects=False,
            ) as response:
                return HttpResponse(response.status, response.headers, await read_capped(response, self.max_reply))
        except FOREIGN as exc:
            raise mapped(exc, request, written=body is None or body.written) from exc

    @asynccontextmanager
    async def stream(
        self, request: HttpRequest, *, timeout: float, connect_timeout: float
    ) -> AsyncIterator[AiohttpStream]:
        limits = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout)
        body = None if request.body is None else TrackedBody(request.body)
        try:
            async with asyncio.timeout(timeout):
                response = await self._session.request(
                    request.method,
                    request.url,
                    data=body,
                    headers=request.headers,
                    params=request.params or None,
                    timeout=limits,
                    allow_redirects=False,
                )
        except FOREIGN as exc:
            raise mapped(exc, request, written=body is None or body.written) from exc
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
