"""An upstream answering a huge reply: the direct transport (and so the gateway and node) stops at 16 MiB."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from reach_plugins import ReachClient
from transports.direct import DirectTransport

MiB = 1 << 20


class HugeReply:
    """Answers every request with a 200 MB body (declared, or chunked) and counts the bytes it got out."""

    def __init__(self, chunked: bool) -> None:
        self.chunked = chunked
        self.sent = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        block = b"0" * 65536
        with conn:
            got = b""
            while b"\r\n\r\n" not in got:
                got += conn.recv(65536)
            framing = b"Transfer-Encoding: chunked" if self.chunked else b"Content-Length: %d" % (200 * MiB)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + framing + b"\r\n\r\n")
            frame = b"10000\r\n" + block + b"\r\n" if self.chunked else block
            try:
                for _ in range(3200):
                    conn.sendall(frame)
                    self.sent += len(frame)
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(params=[False, True], ids=["declared", "chunked"])
def upstream(request: pytest.FixtureRequest) -> Iterator[HugeReply]:
    server = HugeReply(chunked=request.param)
    yield server
    server.close()


async def test_a_huge_reply_is_refused_at_the_cap(upstream: HugeReply, tmp_path: Path) -> None:
    """A 200 MB reply fails as invalid_response naming the 16 MiB cap; the client stopped reading near the cap."""
    config = tmp_path / "agents.yaml"
    agent = {"name": "huge", "endpoints": [f"http://127.0.0.1:{upstream.port}"], "capabilities": ["dump"]}
    config.write_text(yaml.safe_dump({"agents": [agent]}))
    client = ReachClient(f"file://{config}", DirectTransport())
    try:
        response = await client.reach("dump", {}, timeout_ms=20_000)
    finally:
        await client.aclose()
    assert response.status == "fail"
    assert response.error is not None and response.error.type == "invalid_response"
    assert str(16 * MiB) in response.error.message
    assert upstream.sent < 64 * MiB
