"""A raw TCP upstream on 127.0.0.1 for tests needing an HTTP peer that misbehaves: it reads a request head, then
lets ``answer(conn)`` write whatever bytes the test wants (garbage, a 200 MB body, a gzip bomb, nothing)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


class RawUpstream:
    """Accepts on a free port; each connection's request head is read, then ``answer`` owns the socket."""

    def __init__(self, answer: Callable[[socket.socket], None]) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            got = b""
            try:
                while b"\r\n\r\n" not in got:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    got += chunk
                self.answer(conn)
            except OSError:  # the client left (or stalled past 5 s): nothing more to say
                return

    def close(self) -> None:
        self.sock.close()
