"""Tools of a hostile caller, for the hostile test suites: servers in child processes, raw sockets, peak RSS.

A server under attack runs in its own process so its memory can be read
(``VmHWM``, the peak resident set, from ``/proc``) and nothing the test
process allocates counts against it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hop_support import TOKENS, free_port

_SERVER = textwrap.dedent(
    """
    import json, sys
    import uvicorn
    from reach_plugins.server.uvicorn import uvicorn_config

    kind, target, port, options = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    if kind == "gateway":
        from reach_plugins.gateway import create_app
        app = create_app(target, **options.pop("app", {}))
    else:
        import importlib
        module, _, name = target.partition(":")
        app = getattr(importlib.import_module(module), name).app
    uvicorn.Server(uvicorn_config(app, host="127.0.0.1", port=port, **options)).run()
    """
)


class ServerProcess:
    """A uvicorn server (gateway for a config, or an agent ``module:attr``) in a child process."""

    def __init__(self, kind: str, target: str | Path, options: dict[str, Any], cwd: Path | None = None) -> None:
        self.port = free_port()
        env = {**os.environ, **TOKENS}
        if cwd is not None:
            env["PYTHONPATH"] = f"{cwd}{os.pathsep}{env.get('PYTHONPATH', '')}"
        args = [sys.executable, "-c", _SERVER, kind, str(target), str(self.port), json.dumps(options)]
        self.process = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the server exited: {self.process.stderr.read().decode() if self.process.stderr else ''}"
                )
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the server did not start within 30 s")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def peak_rss(self) -> int:
        """The process's peak resident set so far, in bytes (``VmHWM``)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM in /proc status")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextmanager
def server_process(kind: str, target: str | Path, cwd: Path | None = None, **options: Any) -> Iterator[ServerProcess]:
    server = ServerProcess(kind, target, options, cwd)
    try:
        yield server
    finally:
        server.stop()


def raw_request(port: int, head: bytes, body: bytes = b"", *, timeout: float = 5.0) -> bytes:
    """Send ``head`` (and ``body``) on a fresh socket and read until the server closes or ``timeout``."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head + body)
        return read_all(sock, timeout)


def read_all(sock: socket.socket, timeout: float) -> bytes:
    """What the server sends until it closes the socket, or until ``timeout`` seconds pass."""
    sock.settimeout(timeout)
    got = b""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            break
        if not chunk:
            break
        got += chunk
    return got


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes (or resets) ``sock`` within ``within`` seconds."""
    sock.settimeout(within)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except TimeoutError:
        return False
    except OSError:
        return True


def post_head(path: str, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()
