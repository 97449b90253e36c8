"""A small asyncio TCP fault proxy for tests: latency, blackhole, reset, lost replies, cut streams, down/up.

There is no toxiproxy or ``tc netem`` on these machines. The proxy sits
between a client and a real server and misbehaves on demand; the mode is read
on every chunk, so it applies to pooled keep-alive connections too::

    async with FaultProxy(("127.0.0.1", server_port)) as proxy:
        proxy.mode = "reset"          # pass | blackhole | reset | lose_reply
        proxy.times = 1               # the mode hits this many requests, then the proxy passes again
        proxy.latency = 0.05          # seconds added to every forwarded chunk
        proxy.cut_after = 200         # forward this many reply bytes per connection, then reset
        await proxy.down(); await proxy.up()
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from types import TracebackType
from typing import Literal

Mode = Literal["pass", "blackhole", "reset", "lose_reply"]


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0) instead of a clean FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        self.lose_reply = False
        self.reply_bytes = 0

    def reset(self) -> None:
        _reset(self.client)
        self.upstream.transport.abort()


class FaultProxy:
    """Forwards TCP from ``127.0.0.1:port`` to ``upstream`` and injects the faults it is told to."""

    def __init__(self, upstream: tuple[str, int], *, host: str = "127.0.0.1") -> None:
        self.upstream = upstream
        self.host = host
        self.port = 0
        self.mode: Mode = "pass"
        self.latency = 0.0
        self.cut_after: int | None = None
        self.times: int | None = None
        """How many more requests the fault mode hits before reverting to ``pass`` (``None``: until changed)."""
        self.connections = 0
        """Client connections accepted so far (keep-alive reuse shows as fewer connections than requests)."""
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def down(self) -> None:
        """Stop listening and reset every open connection: new connects are refused."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for link in list(self._links):
            link.reset()

    async def up(self) -> None:
        """Listen again on the same port."""
        if self._server is None:
            await self.start()

    async def aclose(self) -> None:
        """Stop listening, reset every connection and wait for their pumps to finish."""
        await self.down()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(writer)
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await asyncio.gather(self._requests(reader, link), self._replies(up_reader, link))
        except (OSError, asyncio.IncompleteReadError):
            link.reset()
        finally:
            self._links.discard(link)
            self._tasks.discard(task)
            for side in (writer, up_writer):
                side.transport.abort()

    def _fault(self) -> Mode:
        """The mode for the next request chunk, counting down ``times``."""
        mode = self.mode
        if mode != "pass" and self.times is not None:
            self.times -= 1
            if self.times <= 0:
                self.mode, self.times = "pass", None
        return mode

    async def _requests(self, reader: asyncio.StreamReader, link: _Link) -> None:
        while chunk := await reader.read(65536):
            mode = self._fault()
            if mode == "blackhole":
                continue
            if mode == "reset":
                link.reset()
                return
            link.lose_reply = mode == "lose_reply"
            await self._delay()
            link.upstream.write(chunk)
            await link.upstream.drain()
        link.upstream.transport.abort()

    async def _replies(self, reader: asyncio.StreamReader, link: _Link) -> None:
        while chunk := await reader.read(65536):
            if link.lose_reply:
                link.reset()
                return
            if self.cut_after is not None and link.reply_bytes + len(chunk) > self.cut_after:
                link.client.write(chunk[: self.cut_after - link.reply_bytes])
                await link.client.drain()
                link.reset()
                return
            link.reply_bytes += len(chunk)
            await self._delay()
            link.client.write(chunk)
            await link.client.drain()
        link.client.transport.abort()

    async def _delay(self) -> None:
        if self.latency > 0:
            await asyncio.sleep(self.latency)
