"""Real etcd and Redis for integration tests (a pytest plugin, loaded by ``tests/conftest.py``).

``etcd_url`` / ``redis_url`` point at the shared servers that ``scripts/services.sh start``
runs (``REACH_TEST_ETCD`` / ``REACH_TEST_REDIS`` as ``host:port`` move them). When a
server does not answer the test is skipped with the command that starts it, except
under ``CI=true``, where a missing server is a failure.

``private_etcd`` / ``private_redis`` start a throw-away server of their own on free
ports (for tests that stop and restart it without disturbing anyone else).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

START_COMMAND = "scripts/services.sh start"
BASE_STARTUP = 15.0
"""Seconds one Python server process needs to start on an idle core, with room to spare."""
MAX_STARTUP = 300.0


def startup_seconds(processes: int = 1) -> float:
    """How long to wait for ``processes`` servers started together: derived from the machine, not fixed.

    Start-up is CPU-bound (imports), so the wait grows with the processes per core and with the load already on
    the machine (the 1-minute load average per core): 15 s for one process on an idle core, 270 s for eight on two
    cores at load 9. Bounded, so a process that never comes up still fails, naming what it printed.
    """
    cores = os.cpu_count() or 1
    crowd = max(1.0, processes / cores) * max(1.0, os.getloadavg()[0] / cores)
    return min(MAX_STARTUP, BASE_STARTUP * crowd)


def _address(variable: str, default: str) -> tuple[str, int]:
    host, _, port = os.environ.get(variable, default).rpartition(":")
    return host or "127.0.0.1", int(port)


def _ask(host: str, port: int, request: bytes, expect: bytes, timeout: float = 0.5) -> bool:
    """Whether a TCP server at host:port answers ``request`` with bytes containing ``expect``."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(request)
            reply = b""
            while expect not in reply:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                reply += chunk
            return expect in reply
    except OSError:
        return False


def etcd_answers(host: str, port: int) -> bool:
    return _ask(host, port, b"GET /health HTTP/1.0\r\n\r\n", b'"health":"true"')


def redis_answers(host: str, port: int) -> bool:
    return _ask(host, port, b"PING\r\n", b"+PONG")


def _missing(what: str) -> None:
    message = f"{what}; start the test servers with `{START_COMMAND}`"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: integration servers are required)", pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def interrupt(process: subprocess.Popen[bytes] | subprocess.Popen[str], within: float = 10.0) -> None:
    """Stop a server process as an operator does (SIGINT), killing it if it has not exited ``within`` seconds."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(within)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``check`` every 20 ms until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g}s")
        time.sleep(0.02)


@pytest.fixture(scope="session")
def etcd_url() -> str:
    """``etcd://host:port`` of the shared test etcd (skips, or fails under CI, when it does not answer)."""
    host, port = _address("REACH_TEST_ETCD", "127.0.0.1:23790")
    if not etcd_answers(host, port):
        _missing(f"no etcd answers at {host}:{port}")
    return f"etcd://{host}:{port}"


@pytest.fixture(scope="session")
def redis_url() -> str:
    """``redis://host:port/0`` of the shared test Redis (skips, or fails under CI, when it does not answer)."""
    host, port = _address("REACH_TEST_REDIS", "127.0.0.1:63790")
    if not redis_answers(host, port):
        _missing(f"no redis answers at {host}:{port}")
    return f"redis://{host}:{port}/0"


class Server:
    """One private server process with its own data directory; ``restart()`` keeps the data."""

    def __init__(
        self, name: str, command: list[str], port: int, data: Path, answers: Callable[[str, int], bool]
    ) -> None:
        self.name, self.command, self.port, self.data, self._answers = name, command, port, data, answers
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: self._answers("127.0.0.1", self.port), startup_seconds(), f"{self.name} start")

    def stop(self, *, crash: bool = False) -> None:
        """Stop cleanly (SIGTERM), or ``crash`` it (SIGKILL: no chance to flush anything)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if crash else signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self, *, wipe: bool = False, crash: bool = False) -> None:
        """Stop and start again; ``wipe`` deletes the data in between (a server that lost everything)."""
        self.stop(crash=crash)
        if wipe:
            shutil.rmtree(self.data)
            self.data.mkdir()
        self.start()


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        _missing(f"the {name} binary is not installed")
    assert path is not None
    return path


@pytest.fixture
def private_etcd(tmp_path: Path) -> Iterator[Server]:
    """A running etcd of this test's own on free ports; ``.port`` is its client port."""
    etcd = _binary("etcd")
    client, peer = free_port(), free_port()
    data = tmp_path / "etcd"
    data.mkdir()
    server = Server(
        "etcd",
        [
            etcd,
            "--name=private",
            f"--data-dir={data}",
            f"--listen-client-urls=http://127.0.0.1:{client}",
            f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=private=http://127.0.0.1:{peer}",
        ],
        client,
        data,
        etcd_answers,
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Server]:
    """A running redis-server of this test's own (append-only file, fsync always) on a free port."""
    redis = _binary("redis-server")
    port = free_port()
    data = tmp_path / "redis"
    data.mkdir()
    command = [redis, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data)]
    command += ["--save", "", "--appendonly", "yes", "--appendfsync", "always"]
    server = Server("redis", command, port, data, redis_answers)
    server.start()
    yield server
    server.stop()
