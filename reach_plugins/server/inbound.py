"""Reading a request from a caller who may be hostile: bounded body, bounded JSON, one value per auth header.

The steps of the server layer (:mod:`reach_plugins.server.layer`, DESIGN.md
11.5) and of the node's gate. Each check refuses with a
:class:`~reach_plugins.errors.RequestError` subclass whose message names the
limit and the field, never the caller's bytes: the body is read
through a byte budget and a time budget (a 400 MB body costs at most the
limit), decoded strictly (UTF-8, no lone surrogates, no ``NaN`` /
``Infinity``) and walked once for its nesting depth and lone surrogates
when its brackets could nest that deep or its escapes spell a surrogate.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from starlette.requests import ClientDisconnect

from reach_plugins.errors import BodyTimeout, BodyTooLarge, RequestError, UnsupportedMediaType
from reach_plugins.media import wire_size

MAX_BODY: Final = 1 << 20
"""Default largest request body, in bytes (1 MiB)."""
MAX_DEPTH: Final = 64
"""Default deepest JSON nesting (objects and arrays) accepted."""
BODY_TIMEOUT: Final = 15.0
"""Default seconds a caller has to send the whole body once its headers arrived."""
SMALL_BODY: Final = 64 * 1024
"""Bodies up to this size are read at once; a larger one first waits for one of the few large-body places."""
SINGLE: Final = (
    "authorization",
    "x-reach-token",
    "x-tenant",
    "idempotency-key",
    "x-reach-deadline",
    "content-type",
    "content-length",
    "transfer-encoding",
)
"""Headers that must appear at most once: two values would leave it to chance which one decides."""
TENANTS_WITH_PLACES: Final = 256
"""Callers (tenants) that get large-body places of their own; any further ones share one set."""


@dataclass(frozen=True, slots=True)
class InputLimits:
    """How much of a request a server reads: body bytes, JSON depth, seconds for the body to arrive."""

    max_body: int = MAX_BODY
    max_media: int = 0
    """Media bytes a body may carry beside ``max_body`` (base64 parts of a reach body); a route for reach bodies
    sets it (:meth:`with_media`), the body is then read up to :attr:`bound`."""
    max_depth: int = MAX_DEPTH
    body_timeout: float = BODY_TIMEOUT
    large_bodies: int = 1
    """Bodies over 64 KiB read at once per tenant; the tenant's others wait (within ``body_timeout``), so memory
    stays near ``tenants * large_bodies * max_body`` however many callers send big (or endless) bodies
    together, and one tenant's slow body never holds another's place. Measured: 4 concurrent 100 MB bodies
    grow a server's peak RSS by 2.2-2.7 MiB with 1, 2.9-3.2 MiB with 2."""

    @property
    def bound(self) -> int:
        """The most body bytes read: ``max_body``, plus the base64 size of ``max_media`` media bytes."""
        return self.max_body + (wire_size(self.max_media) if self.max_media else 0)

    def with_media(self, max_media: int) -> InputLimits:
        """These limits for a route whose bodies carry up to ``max_media`` media bytes."""
        return replace(self, max_media=max_media)

    def places(self) -> BodyPlaces:
        """Fresh large-body places, for one server (one event loop)."""
        return BodyPlaces(self.large_bodies)


class BodyPlaces:
    """Large-body places per tenant: ``per_tenant`` each for the first :data:`TENANTS_WITH_PLACES` tenants seen,
    one shared set for callers without a tenant and for tenants past that many (memory stays bounded)."""

    def __init__(self, per_tenant: int, *, tenants: int = TENANTS_WITH_PLACES) -> None:
        self._per_tenant = per_tenant
        self._tenants = tenants
        self._shared = asyncio.Semaphore(per_tenant)
        self._own: dict[str, asyncio.Semaphore] = {}

    def of(self, tenant: str | None) -> asyncio.Semaphore:
        """The places ``tenant``'s large bodies wait for."""
        if tenant is None:
            return self._shared
        places = self._own.get(tenant)
        if places is None:
            if len(self._own) >= self._tenants:
                return self._shared
            places = self._own[tenant] = asyncio.Semaphore(self._per_tenant)
        return places


class _Constant(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity`` in JSON text (valid for Python, not for JSON)."""


def _refuse_constant(name: str) -> Any:
    raise _Constant(f"{name} is not a JSON number")


def single_headers(raw: Iterable[tuple[bytes | str, bytes | str]], names: Iterable[str] = SINGLE) -> dict[str, str]:
    """The headers (or gRPC metadata) as a lowercase dict; ``RequestError`` when one of ``names`` appears twice.

    Binary values (gRPC ``-bin`` metadata) are left out.
    """
    watched = frozenset(names)
    headers: dict[str, str] = {}
    for key, value in raw:
        name = (key.decode("latin-1") if isinstance(key, bytes) else key).lower()
        if name in headers and name in watched:
            raise RequestError(f"header {name} appears more than once; send it once")
        if isinstance(value, bytes) and name.endswith("-bin"):
            continue
        headers[name] = value.decode("latin-1") if isinstance(value, bytes) else value
    return headers


def require_json(headers: Mapping[str, str]) -> None:
    """Refuse a body that is not declared ``application/json`` (a browser form post, for one)."""
    media = headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json":
        raise UnsupportedMediaType("send the body with 'Content-Type: application/json'")


async def read_body(
    chunks: AsyncIterator[bytes],
    headers: Mapping[str, str],
    *,
    limit: int = MAX_BODY,
    timeout: float = BODY_TIMEOUT,
    large: asyncio.Semaphore | None = None,
) -> bytes:
    """The whole body, refused as soon as it passes ``limit`` bytes or ``timeout`` seconds.

    A declared ``Content-Length`` over the limit is refused before a byte is
    read; a chunked body is counted as it comes. Past :data:`SMALL_BODY`
    bytes (declared or read), the rest is read only while holding a place of
    ``large``, waited for within ``timeout``.
    """
    declared = headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise RequestError("the Content-Length header must be a number of bytes")
        if int(declared) > limit:
            raise BodyTooLarge(f"the body is {int(declared)} bytes; this server accepts at most {limit}")
    parts: list[bytes] = []
    size = 0
    held = False
    try:
        async with asyncio.timeout(timeout):
            if large is not None and declared is not None and int(declared) > SMALL_BODY:
                await large.acquire()
                held = True
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise BodyTooLarge(f"the body is longer than {limit} bytes, the most this server accepts")
                if large is not None and not held and size > SMALL_BODY:
                    await large.acquire()
                    held = True
                parts.append(chunk)
    except TimeoutError:
        raise BodyTimeout(f"the body did not arrive within {timeout:g}s") from None
    except ClientDisconnect:
        raise RequestError("the caller closed the connection before the body ended") from None
    finally:
        if held and large is not None:
            large.release()
    return b"".join(parts)


def loads(raw: bytes, *, max_depth: int = MAX_DEPTH, what: str = "body") -> Any:
    """Strict JSON: UTF-8, no ``NaN``/``Infinity``, no lone surrogate, nested at most ``max_depth`` deep.

    ``what`` names the field in the refusal (``body``, or ``payload`` where the payload travels as bytes).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError(f"the {what} is not UTF-8 text") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise RequestError(f"the {what} is nested deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise RequestError(f"the {what} is not valid JSON: {exc}") from None
    if raw.count(b"[") + raw.count(b"{") > max_depth or b"\\u" in raw:
        _check(value, max_depth, what)  # else no container can nest that deep, and no escape spell a surrogate
    return value


def _check(value: Any, max_depth: int, what: str) -> None:
    """Refuse nesting deeper than ``max_depth`` and strings that are not Unicode text (lone surrogates)."""
    stack: list[tuple[Any, int, str]] = [(value, 0, what)]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, str):
            _text(item, where)
        elif isinstance(item, dict | list):
            if depth >= max_depth:
                raise RequestError(f"{where}: nested deeper than {max_depth} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    _text(key, where)
                    stack.append((child, depth + 1, f"{where}.{key[:32]}" if depth < 4 else where))
            else:
                stack.extend((child, depth + 1, where) for child in item)


def _text(value: str, where: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(f"{where}: a string holds a lone surrogate (\\ud800-\\udfff), which is not text") from None
