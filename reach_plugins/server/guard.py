"""uvicorn protocols that drop slow or oversized request heads (slowloris), for the gateway and the agent SDK.

uvicorn times out an idle keep-alive connection, but not one that opened and
sends nothing, nor one that trickles its headers a byte at a time: each such
socket is held for as long as the caller likes. :func:`guarded` wraps
uvicorn's HTTP protocol class so a request head must arrive whole within
``header_timeout`` seconds and ``max_header_bytes`` bytes, or the connection
is closed (with a 431 for an oversized head, a 400 for an ambiguous one:
:func:`~reach_plugins.server.framing.framing_problem`). Slow *bodies* are the
app's to time out (:func:`reach_plugins.server.inbound.read_body`); a body the
app answered without reading (a health route, a refusal) must end within
``header_timeout`` of the answer, or the connection is closed.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from reach_plugins.server.framing import framing_problem

HEADER_TIMEOUT: Final = 10.0
"""Default seconds from a connection's first byte (or its opening) to the end of a request head."""
MAX_HEADER_BYTES: Final = 32 * 1024
"""Default largest request head (request line and headers), in bytes."""

_TOO_LARGE: Final = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
    b"content-length: 35\r\nconnection: close\r\n\r\nthe request headers are too large.\n"
)


def _bad_request(problem: str) -> bytes:
    text = f"the request is framed ambiguously: {problem}.\n".encode()
    return (
        b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(text), text)
    )


def _head_end(window: bytes, start: int) -> int:
    """The length of the request head in ``window``, blank line included (a bare-LF one too), or -1 if not yet whole.

    ``start`` is where to look from (the bytes before it were searched already).
    """
    found = [(window.find(b"\n\r\n", start), 3), (window.find(b"\n\n", start), 2)]
    ends = [at + size for at, size in found if at >= 0]
    return min(ends) if ends else -1


class _Joined:
    """A request cycle's view of its connection: the response head waits for the body's first bytes.

    uvicorn writes a response's head and its body with a write each, so a small answer leaves in two segments and
    wakes the caller twice. Held here, the head joins the first body write of the same turn of the loop (or leaves
    on its own at the end of that turn: a stream's head is never kept waiting for an event); a close sends what is
    held first. Everything else is the transport's.
    """

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = b""  # b"": nothing written yet (the first write is held); None: passing through

    def write(self, data: bytes) -> None:
        held = self._held
        if held == b"":
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
            return
        self._held = None
        self._transport.write(held + data if held else data)

    def flush(self) -> None:
        """Send a held head (the turn of the loop that wrote it ended, or the connection closes)."""
        held, self._held = self._held, None
        if held:
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def guarded(base: type[Any], *, header_timeout: float, max_header_bytes: int) -> type[asyncio.Protocol]:
    """A subclass of uvicorn's ``base`` protocol (httptools or h11) enforcing the two head limits."""

    class Guarded(base):  # type: ignore[misc]
        """A request head is "being read" while no request cycle runs (uvicorn creates one at the head's end)."""

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._head = b""
            self._head_timer: asyncio.TimerHandle | None = None
            self._arm()

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(header_timeout, self._too_slow)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            self._head = b""

        def _reading_head(self) -> bool:
            """No request in progress: the previous one was answered and its body read to the end (or none yet)."""
            cycle = self.cycle
            return cycle is None or bool(cycle.response_complete and not cycle.more_body)

        def _too_slow(self) -> None:
            """No request is being answered: the caller is sending a head, or a body nobody reads, too slowly."""
            self._head_timer = None
            cycle = self.cycle
            if (cycle is None or cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

        def on_response_complete(self) -> None:
            """An answer sent before its request's body ended (never read): the rest must come within the limit."""
            super().on_response_complete()
            if self.cycle is not None and self.cycle.more_body:
                self._arm()

        def _refuse(self, answer: bytes) -> None:
            self._disarm()
            self.transport.write(answer)
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            """Gather the head up to its blank line (body bytes never count) and check its size and framing before
            the parser sees it."""
            if self.transport.is_closing():
                return
            before = self.cycle
            if self._reading_head():
                window = self._head + data
                end = _head_end(window, max(0, len(self._head) - 2))
                if (end < 0 and len(window) > max_header_bytes) or end > max_header_bytes:
                    self._refuse(_TOO_LARGE)
                    return
                if end < 0:
                    self._head = window
                else:
                    problem = framing_problem(window[:end].lstrip(b"\r\n"))
                    if problem is not None:
                        self._refuse(_bad_request(problem))
                        return
                    self._head = b""
                self._arm()
            super().data_received(data)
            if self.cycle is not before:
                self._disarm()
                if self.cycle is not None:
                    self.cycle.transport = _Joined(self.transport, self.loop)

        def shutdown(self) -> None:
            cycle = self.cycle
            if cycle is not None and isinstance(cycle.transport, _Joined):
                cycle.transport.flush()
            super().shutdown()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded
