"""uvicorn protocols that drop slow or oversized request heads (slowloris), for the gateway and the agent SDK.

uvicorn times out an idle keep-alive connection, but not one that opened and
sends nothing, nor one that trickles its headers a byte at a time: each such
socket is held for as long as the caller likes. :func:`guarded` wraps
uvicorn's HTTP protocol class so a request head must arrive whole within
``header_timeout`` seconds and ``max_header_bytes`` bytes, or the connection
is closed (with a 431 for an oversized head). Slow *bodies* are the app's to
time out (:func:`reach_plugins.server.inbound.read_body`).
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

HEADER_TIMEOUT: Final = 10.0
"""Default seconds from a connection's first byte (or its opening) to the end of a request head."""
MAX_HEADER_BYTES: Final = 32 * 1024
"""Default largest request head (request line and headers), in bytes."""

_TOO_LARGE: Final = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
    b"content-length: 35\r\nconnection: close\r\n\r\nthe request headers are too large.\n"
)


def guarded(base: type[Any], *, header_timeout: float, max_header_bytes: int) -> type[asyncio.Protocol]:
    """A subclass of uvicorn's ``base`` protocol (httptools or h11) enforcing the two head limits."""

    class Guarded(base):  # type: ignore[misc]
        """A request head is "being read" while no request cycle runs (uvicorn creates one at the head's end)."""

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._head_bytes = 0
            self._tail = b""
            self._head_timer: asyncio.TimerHandle | None = None
            self._arm()

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(header_timeout, self._too_slow)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            self._head_bytes = 0
            self._tail = b""

        def _reading_head(self) -> bool:
            """No request in progress: the previous one was answered and its body read to the end (or none yet)."""
            cycle = self.cycle
            return cycle is None or bool(cycle.response_complete and not cycle.more_body)

        def _too_slow(self) -> None:
            self._head_timer = None
            if self._reading_head() and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            """Count the bytes up to the head's blank line (body bytes never count) before the parser sees them."""
            if self.transport.is_closing():
                return
            before = self.cycle
            if self._reading_head():
                window = self._tail + data
                end = window.find(b"\r\n\r\n")
                self._head_bytes += len(data) if end < 0 else end + 4 - len(self._tail)
                self._tail = window[-3:]
                if self._head_bytes > max_header_bytes:
                    self._disarm()
                    self.transport.write(_TOO_LARGE)
                    self.transport.close()
                    return
                self._arm()
            super().data_received(data)
            if self.cycle is not before:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded
