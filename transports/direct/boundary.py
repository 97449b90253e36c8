"""The aiohttp boundary, shared by every transport that speaks HTTP with aiohttp (direct, gateway).

Foreign errors become ours here (DESIGN.md 11.1, STYLE 3) with messages built
by construction from the exception's kind and the URL's path, and a reply is
read under a size cap (DESIGN.md 11.5). Imported by transports only:
``import reach_plugins`` pulls in no HTTP client.
"""

from __future__ import annotations

import aiohttp
from aiohttp.abc import AbstractStreamWriter

from reach_plugins.errors import ConfigError, ConnectError, ConnectionLost, InvalidResponse, ReadTimeout
from reach_plugins.protocols import HttpRequest
from reach_plugins.wire.redact import describe, safe_url, url_path


class TrackedBody(aiohttp.BytesPayload):
    """A request body that records when aiohttp has handed all of it to the connection.

    aiohttp's trace signals fire *before* their writes, and a write failure
    usually surfaces as the read error that follows it, so the body itself is
    the one reliable witness of what was written.
    """

    written = False

    async def write_with_length(self, writer: AbstractStreamWriter, content_length: int | None) -> None:
        await super().write_with_length(writer, content_length)
        self.written = True


def _unsent(exc: BaseException) -> bool:
    """Whether aiohttp failed while writing: the transport was closing (reset) before the whole request was handed
    to it (``ClientConnectionResetError``, wrapped when writing the body). The agent then holds at most a truncated
    request, which it cannot run (it reads the whole body, framed by ``Content-Length``, before acting)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, aiohttp.ClientConnectionResetError):
            return True
        seen = seen.__cause__
    return False


def mapped(exc: BaseException, request: HttpRequest, *, written: bool = True) -> Exception:
    """aiohttp's exception as ours, most specific first (a connect timeout is a timeout *and* a connect error).

    What reached the agent decides the class (STYLE 18): a refused connect, a
    connect timeout, or a reset before the request was written is
    :class:`ConnectError` (not delivered); a loss after it was written is
    :class:`ConnectionLost` or :class:`ReadTimeout` (unknown). ``written``: whether
    the whole body was handed to the connection (a :class:`TrackedBody`'s
    verdict; True, "maybe", when not tracked).

    The message is built from the exception's kind and the URL's path, never
    from aiohttp's text: its repr carries the query string and, for a
    malformed answer, the request headers (credentials). The host stays out
    too: through a gateway the message reaches callers who must not learn
    where agents live (the trace's attempts record the endpoint).
    """
    where = f"{request.method} {url_path(request.url)}"
    if isinstance(exc, aiohttp.InvalidURL):
        return ConfigError(f"the agent endpoint is not a valid URL: {safe_url(request.url)!r}")
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return ConnectError(f"connecting for {where} timed out")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return ConnectError(f"cannot connect for {where}: {describe(exc)}")
    if not written or _unsent(exc):
        return ConnectError(f"the connection was reset before the request for {where} was written: {describe(exc)}")
    if isinstance(exc, TimeoutError):
        return ReadTimeout(f"no complete answer to {where} in time")
    return ConnectionLost(f"the connection broke during {where}: {describe(exc)}")


FOREIGN = (aiohttp.ClientError, TimeoutError)
"""What :func:`mapped` translates."""


async def read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The reply's body, refused (``InvalidResponse``) past ``limit`` bytes rather than held whole in memory.

    An uncompressed body of declared length within the limit is read in one
    go: aiohttp's parser ends it at ``Content-Length``, so no more can arrive
    (a compressed one may inflate past its length, so it is counted as it comes).
    """
    length = response.content_length
    if length is not None and length > limit:
        raise InvalidResponse(f"the agent's reply is {length} bytes; the most accepted is {limit}")
    if length is not None and "Content-Encoding" not in response.headers:
        return await response.read()
    body = bytearray()
    async for chunk in response.content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > limit:
            raise InvalidResponse(f"the agent's reply is longer than {limit} bytes, the most accepted")
    return bytes(body)
