"""An upstream answering a huge reply: the direct transport (and so the gateway and node) stops at 16 MiB."""

from __future__ import annotations

import gzip
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from raw_upstream import RawUpstream

from reach_plugins import ReachClient
from transports.direct import DirectTransport

MiB = 1 << 20


class HugeReply(RawUpstream):
    """Answers every request with a 200 MB body (declared, or chunked) and counts the bytes it got out."""

    def __init__(self, chunked: bool, stream: bool = False) -> None:
        self.chunked = chunked
        self.stream = stream
        """Answer as an event stream whose one ``data:`` line never ends."""
        self.sent = 0
        super().__init__(self._huge)

    def _huge(self, conn: socket.socket) -> None:
        block = b"0" * 65536
        framing = b"Transfer-Encoding: chunked" if self.chunked else b"Content-Length: %d" % (200 * MiB)
        kind = b"text/event-stream" if self.stream else b"application/json"
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\n" + framing + b"\r\n\r\n")
        first = b"data: " + block[6:] if self.stream else block
        frame = b"10000\r\n" + block + b"\r\n" if self.chunked else block
        if self.stream:
            opening = b"10000\r\n" + first + b"\r\n" if self.chunked else first
            conn.sendall(opening)
            self.sent += len(opening)
        for _ in range(3200):
            conn.sendall(frame)
            self.sent += len(frame)


def client_of(upstream: RawUpstream, tmp_path: Path) -> ReachClient:
    """A direct client whose only agent, ``dump``, is served by ``upstream``."""
    config = tmp_path / "agents.yaml"
    agent = {"name": "dumper", "endpoints": [f"http://127.0.0.1:{upstream.port}"], "capabilities": ["dump"]}
    config.write_text(yaml.safe_dump({"agents": [agent]}))
    return ReachClient(f"file://{config}", DirectTransport())


@pytest.fixture(params=[False, True], ids=["declared", "chunked"])
def upstream(request: pytest.FixtureRequest) -> Iterator[HugeReply]:
    server = HugeReply(chunked=request.param)
    yield server
    server.close()


async def test_a_huge_reply_is_refused_at_the_cap(upstream: HugeReply, tmp_path: Path) -> None:
    """A 200 MB reply fails as invalid_response naming the 16 MiB cap; the client stopped reading near the cap."""
    client = client_of(upstream, tmp_path)
    try:
        response = await client.reach("dump", {}, timeout_ms=20_000)
    finally:
        await client.aclose()
    assert response.status == "fail"
    assert response.error is not None and response.error.type == "invalid_response"
    assert str(16 * MiB) in response.error.message
    assert upstream.sent < 64 * MiB


async def test_a_stream_whose_event_never_ends_is_refused_at_the_cap(tmp_path: Path) -> None:
    """An event-stream line of 200 MB with no end: the stream ends with invalid_response near the 16 MiB cap."""
    upstream = HugeReply(chunked=True, stream=True)
    client = client_of(upstream, tmp_path)
    try:
        events = [event async for event in client.stream("dump", {}, timeout_ms=20_000)]
    finally:
        await client.aclose()
        upstream.close()
    assert events and events[-1].kind == "error" and events[-1].error is not None
    assert events[-1].error.type == "invalid_response" and str(16 * MiB) in events[-1].error.message
    assert upstream.sent < 64 * MiB


class GzipBomb(RawUpstream):
    """Answers every request with 40 MiB of JSON gzipped to a few kB, its compressed size declared."""

    def __init__(self) -> None:
        self.body = gzip.compress(b'{"status":"success","data":"' + b"0" * (40 * MiB) + b'"}', compresslevel=9)
        super().__init__(self._bomb)

    def _bomb(self, conn: socket.socket) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
        conn.sendall(head + b"Content-Length: %d\r\n\r\n" % len(self.body) + self.body)


async def test_a_small_compressed_reply_inflating_past_the_cap_is_refused(tmp_path: Path) -> None:
    """A gzip reply declaring a few kB that inflates to 40 MiB fails as invalid_response at the 16 MiB cap."""
    upstream = GzipBomb()
    assert len(upstream.body) < MiB
    client = client_of(upstream, tmp_path)
    try:
        response = await client.reach("dump", {}, timeout_ms=20_000)
    finally:
        await client.aclose()
        upstream.close()
    assert response.status == "fail"
    assert response.error is not None and response.error.type == "invalid_response"
    assert str(16 * MiB) in response.error.message
