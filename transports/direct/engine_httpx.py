"""The httpx wire engine: for users who need httpx's transports, HTTP/2 or ``httpx.MockTransport``.

httpx's timeouts are per operation, so the whole attempt is also bounded with
``asyncio.timeout``; ``sniffio`` must be installed or every request pays for
a failed import (DESIGN.md section 10).
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import httpx

from reach_plugins.errors import ConfigError, ConnectError, ConnectionLost, ReadTimeout
from reach_plugins.model import PoolConfig
from reach_plugins.protocols import HttpRequest, HttpResponse
from reach_plugins.wire.redact import describe, safe_url, url_path


class TrackedContent(httpx.AsyncByteStream):
    """A request body that records when httpcore has written all of it (it asks for more only after a write).

    httpcore reads the answer after a failed write (an early error reply may be waiting), so a reset while
    writing surfaces as a ``ReadError``: the body is the one witness of what was written.
    """

    def __init__(self, body: bytes) -> None:
        self._body = body
        self.written = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._body
        self.written = True


def _content(request: HttpRequest) -> tuple[TrackedContent | None, dict[str, str]]:
    """The tracked body and the headers to send it with (its length given, so it is not sent chunked)."""
    if request.body is None:
        return None, request.headers
    return TrackedContent(request.body), {**request.headers, "Content-Length": str(len(request.body))}


def mapped(exc: BaseException, request: HttpRequest, *, written: bool = True) -> Exception:
    """httpx's exception as ours: what reached the agent decides the class (STYLE 18).

    A failed or timed-out connect, a pool timeout, or a write that failed (reset before the whole request was
    written: the agent holds at most a truncated request, which it cannot run) is :class:`ConnectError`, not
    delivered; a loss while reading the answer is :class:`ConnectionLost` or :class:`ReadTimeout`, unknown.
    ``written``: whether the whole body was written (a :class:`TrackedContent`'s verdict; True, "maybe", untracked).

    As with the aiohttp engine, the message names the exception's kind and the URL's path, never httpx's
    text (which can carry the query string) nor the host.
    """
    where = f"{request.method} {url_path(request.url)}"
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return ConnectError(f"cannot connect for {where}: {describe(exc)}")
    if isinstance(exc, httpx.PoolTimeout):
        return ConnectError(f"no pooled connection became free for {where}")
    if isinstance(exc, httpx.InvalidURL | httpx.UnsupportedProtocol):
        return ConfigError(f"the agent endpoint is not a valid URL: {safe_url(request.url)!r}")
    if not written or isinstance(exc, httpx.WriteError | httpx.WriteTimeout):
        return ConnectError(f"the connection was reset before the request for {where} was written: {describe(exc)}")
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return ReadTimeout(f"no complete answer to {where} in time")
    return ConnectionLost(f"the connection broke during {where}: {describe(exc)}")


FOREIGN = (httpx.HTTPError, httpx.InvalidURL, TimeoutError)
"""What :func:`mapped` translates."""


class _RedactedUrls(logging.Filter):
    """httpx logs every request's full URL at INFO ("HTTP Request: POST http://...?api_key=..."): the query
    string can hold a tenant's credential (``auth.type: query``), so its log records carry :func:`safe_url`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(safe_url(str(arg)) if isinstance(arg, httpx.URL) else arg for arg in record.args)
        return True


logging.getLogger("httpx").addFilter(_RedactedUrls())


class HttpxStream:
    """A streamed httpx response."""

    def __init__(self, response: httpx.Response, request: HttpRequest) -> None:
        self._response = response
        self._request = request
        self._chunks = response.aiter_raw()
        self.status = response.status_code
        self.headers: Mapping[str, str] = response.headers

    async def next_chunk(self) -> bytes:
        try:
            return await anext(self._chunks, b"")
        except FOREIGN as exc:
            raise mapped(exc, self._request) from exc

    async def read(self) -> bytes:
        try:
            return await self._response.aread()
        except FOREIGN as exc:
            raise mapped(exc, self._request) from exc


class HttpxEngine:
    """One ``httpx.AsyncClient``: built from the pool settings, or the caller's own (then not closed here)."""

    def __init__(self, client: httpx.AsyncClient, *, owned: bool = True) -> None:
        self._client = client
        self._owned = owned

    async def send(self, request: HttpRequest, *, timeout: float, connect_timeout: float) -> HttpResponse:
        limits = httpx.Timeout(timeout, connect=connect_timeout)
        content, headers = _content(request)
        try:
            async with asyncio.timeout(timeout):
                response = await self._client.request(
                    request.method,
                    request.url,
                    content=content,
                    headers=headers,
                    params=request.params or None,
                    timeout=limits,
                )
        except FOREIGN as exc:
            raise mapped(exc, request, written=content is None or content.written) from exc
        return HttpResponse(response.status_code, response.headers, response.content)

    @asynccontextmanager
    async def stream(
        self, request: HttpRequest, *, timeout: float, connect_timeout: float
    ) -> AsyncIterator[HttpxStream]:
        limits = httpx.Timeout(None, connect=connect_timeout)
        content, headers = _content(request)
        built = self._client.build_request(
            request.method,
            request.url,
            content=content,
            headers=headers,
            params=request.params or None,
            timeout=limits,
        )
        try:
            async with asyncio.timeout(timeout):
                response = await self._client.send(built, stream=True)
        except FOREIGN as exc:
            raise mapped(exc, request, written=content is None or content.written) from exc
        try:
            yield HttpxStream(response, request)
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        if self._owned:
            await self._client.aclose()


def create(pool: PoolConfig, tls: ssl.SSLContext | None, *, http2: bool = False) -> HttpxEngine:
    if http2 and importlib.util.find_spec("h2") is None:
        raise ImportError('HTTP/2 needs the h2 package: pip install "reach-plugins[http2]"')
    limits = httpx.Limits(
        max_connections=pool.max_conns, max_keepalive_connections=pool.max_conns, keepalive_expiry=pool.idle_timeout
    )
    client = httpx.AsyncClient(limits=limits, verify=tls or True, http2=http2, trust_env=False, follow_redirects=False)
    return HttpxEngine(client)
