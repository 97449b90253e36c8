"""``reach gateway --workers N``: N gateway processes serving one listening socket, kept alive by a supervisor.

The supervisor binds ``host:port`` once and hands the socket to each worker
(``python -m reach_plugins.gateway.workers``), so a restarted worker never
races anyone for the port and connections queued while one is down go to
the others. A worker that exits (``kill -9``, a crash) is started again, at
once the first time and after a doubling delay while it keeps dying young;
SIGTERM or SIGINT stops them all (SIGTERM to each, SIGKILL after ``grace``
seconds). A worker whose supervisor disappears stops itself.

Shared state goes through the stores, as between any two gateways: agents
come from the registry (or the same YAML file), idempotency keys from the
dedup store, which must then be shared (``--dedup-store redis://...``).
Breakers, load counts and session tables are each worker's own.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from reach_plugins.config.loader import load_config
from reach_plugins.errors import ConfigError
from reach_plugins.gateway.serve import listen, log_startup, serve_gateway
from reach_plugins.security.keys import ENV_KEYS, SigningKey
from reach_plugins.server.access import Access
from reach_plugins.telemetry.logs import setup_logging

log = logging.getLogger("reach_plugins.gateway")

FIRST_DELAY: Final = 0.0
"""Seconds before a worker that died is started again, the first time."""
MAX_DELAY: Final = 10.0
"""The longest wait between two starts of a worker that keeps dying."""
YOUNG: Final = 5.0
"""A worker that dies within this many seconds of its start doubles its next delay."""
GRACE: Final = 10.0
"""Seconds workers have to finish their requests after SIGTERM before they are killed."""
TICK: Final = 0.1
"""How often the supervisor looks at its workers."""


@dataclass
class _Slot:
    """One worker's place: its number, its current process, when it may start next."""

    number: int
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    delay: float = FIRST_DELAY
    due: float = 0.0


class Supervisor:
    """Keeps ``workers`` processes running ``options`` on ``sock`` until told to stop."""

    def __init__(self, options: dict[str, Any], workers: int, sock: socket.socket, *, grace: float = GRACE) -> None:
        self._options = options
        self._sock = sock
        self._grace = grace
        self._slots = [_Slot(number) for number in range(workers)]
        self._stopping = threading.Event()

    def _command(self, slot: _Slot) -> list[str]:
        settings = json.dumps({**self._options, "worker": slot.number, "fd": self._sock.fileno()})
        return [sys.executable, "-m", "reach_plugins.gateway.workers", settings]

    def _start(self, slot: _Slot, now: float) -> None:
        process = subprocess.Popen(self._command(slot), pass_fds=(self._sock.fileno(),))
        slot.process, slot.started = process, now
        log.info("gateway worker %d started (pid %d)", slot.number, process.pid)

    def _tend(self, now: float) -> None:
        """Notice workers that exited; start those whose turn has come."""
        for slot in self._slots:
            if slot.process is not None:
                code = slot.process.poll()
                if code is None:
                    continue
                young = now - slot.started < YOUNG
                slot.delay = min(MAX_DELAY, max(0.5, slot.delay * 2)) if young else FIRST_DELAY
                slot.due, slot.process = now + slot.delay, None
                log.warning(
                    "gateway worker %d exited with %s; starting it again in %.1fs", slot.number, code, slot.delay
                )
            if now >= slot.due:
                self._start(slot, now)

    def stop(self) -> None:
        """Ask :meth:`run` to stop every worker and return (safe from a signal handler or another thread)."""
        self._stopping.set()

    def run(self) -> None:
        """Start the workers, restart those that exit, and stop them all on SIGTERM / SIGINT."""
        previous = {sig: signal.signal(sig, lambda *_: self.stop()) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            while not self._stopping.is_set():
                self._tend(time.monotonic())
                self._stopping.wait(TICK)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._shutdown()

    def _shutdown(self) -> None:
        running = [slot.process for slot in self._slots if slot.process is not None and slot.process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        end = time.monotonic() + self._grace
        for process in running:
            try:
                process.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("gateway worker pid %d did not stop within %gs; killing it", process.pid, self._grace)
                process.kill()
                process.wait()
        self._sock.close()


def serve_workers(workers: int, host: str, port: int, options: dict[str, Any]) -> None:
    """Bind ``host:port`` and supervise ``workers`` gateway processes serving it with ``options``
    (the keywords of :func:`~reach_plugins.gateway.serve.serve_gateway`, JSON-serialisable)."""
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    store = options.get("store")
    if workers > 1 and (not store or urlsplit(store).scheme == "memory"):
        raise ConfigError(
            f"--workers {workers} needs a dedup store they share, or an idempotency key retried on another "
            "worker would run twice: pass --dedup-store redis://HOST:PORT/DB"
        )
    setup_logging(options.get("log_format") or "text", options.get("log_level") or "info")
    if workers > 1 and not options.get("issuer_keys") and not os.environ.get(ENV_KEYS):
        # Each worker would sign with a key of its own, and refuse the others' tokens and exchanges: they inherit
        # one made here instead (it lives as long as this supervisor; --issuer-key gives one that outlives it).
        os.environ[ENV_KEYS] = SigningKey.generate().pem().decode()
        log.warning("no --issuer-key: the %d workers sign with one key made at start (tokens die with it)", workers)
    # a tenant no caller can authenticate as is refused here, not by each worker dying at start over and over
    Access(load_config(Path(options["config"])).tenants)
    sock = listen(host, port)
    log_startup(
        options["config"],
        sock,
        registry=options.get("registry"),
        allow_open=bool(options.get("allow_open")),
        tls_cert=options.get("tls_cert"),
        client_ca=options.get("client_ca"),
        workers=workers,
    )
    Supervisor(options, workers, sock).run()


def _orphan_guard(parent: int) -> None:
    """Stop this worker (SIGTERM to itself) once its supervisor is gone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="reach-orphan-guard", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    """A worker: serve the gateway on the inherited socket with the supervisor's options."""
    settings = json.loads((argv if argv is not None else sys.argv[1:])[0])
    sock = socket.socket(fileno=settings.pop("fd"))
    _orphan_guard(os.getppid())
    serve_gateway(settings.pop("config"), sockets=[sock], **settings)


if __name__ == "__main__":
    main()
