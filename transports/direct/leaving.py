"""Requests that stop work a caller left (A2A's CancelTask), kept until sent and flushed before pools close.

A caller leaves work behind when a poll loop hits its deadline or is
cancelled, or when a stream is abandoned before its end. The stop request must
not be awaited where the caller left (a cancelled task cannot await, and an
async generator's ``finally`` may run only when the loop finalises it, after
the client closed). So work in progress is *held* here with the request that
would stop it; leaving sends it in a background task, and
:meth:`Leaving.flush` (the transport's ``aclose``) sends what is still held and
waits, bounded, for every stop in flight before the pools close — no
"Session is closed", no "Task exception was never retrieved".
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from reach_plugins.protocols import HttpRequest
from transports.direct.engine import Engine

logger = logging.getLogger("reach_plugins.transports.direct")

STOP_TIMEOUT = 2.0
"""Seconds a stop request may take, and the most ``flush`` waits for those in flight."""

Stop = Callable[[], "HttpRequest | None"]
"""The request that stops held work, asked for when leaving (a stream learns its task id as it goes)."""


@dataclass(frozen=True, slots=True)
class _Held:
    loop: asyncio.AbstractEventLoop
    engine: Engine
    stop: Stop


class Leaving:
    """Work in progress and the stops in flight, per event loop (engines belong to the loop that opened them)."""

    def __init__(self) -> None:
        self._held: dict[int, _Held] = {}
        self._sending: set[asyncio.Task[None]] = set()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        """A transport serves a framework's loop and a blocking client's private loop at once."""

    def hold(self, engine: Engine, stop: Stop) -> int:
        """Remember work in progress on this loop; the key :meth:`done` or :meth:`leave` settles it with."""
        key = next(self._ids)
        with self._lock:
            self._held[key] = _Held(asyncio.get_running_loop(), engine, stop)
        return key

    def holds(self, key: int) -> bool:
        """Whether the work is still held: not settled, and not stopped by a :meth:`flush` (the transport closing)."""
        with self._lock:
            return key in self._held

    def done(self, key: int) -> None:
        """The work finished (or the far side ended it): nothing to stop."""
        with self._lock:
            self._held.pop(key, None)

    def leave(self, key: int) -> None:
        """The caller left the work unfinished: send its stop in the background (once; a no-op after a flush)."""
        with self._lock:
            held = self._held.pop(key, None)
        if held is not None:
            self._send(held)

    def loops(self) -> set[asyncio.AbstractEventLoop]:
        """The loops with work held or stops in flight (each must :meth:`flush` on itself)."""
        with self._lock:
            return {held.loop for held in self._held.values()} | {task.get_loop() for task in self._sending}

    async def flush(self) -> None:
        """Stop what this loop still holds, then wait (at most :data:`STOP_TIMEOUT`) for its stops in flight."""
        here = asyncio.get_running_loop()
        with self._lock:
            mine = [key for key, held in self._held.items() if held.loop is here]
            held = [self._held.pop(key) for key in mine]
        for item in held:
            self._send(item)
        with self._lock:
            sending = [task for task in self._sending if task.get_loop() is here]
        if sending:
            await asyncio.wait(sending, timeout=STOP_TIMEOUT)

    def _send(self, held: _Held) -> None:
        request = held.stop()
        if request is None:
            return
        task = held.loop.create_task(best_effort(held.engine, request))
        with self._lock:
            self._sending.add(task)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        with self._lock:
            self._sending.discard(task)


async def best_effort(engine: Engine, request: HttpRequest, timeout: float = STOP_TIMEOUT) -> None:
    """Send one request asking the far side to stop or forget (A2A's CancelTask, MCP's DELETE), best effort:
    whatever goes wrong is logged, never raised nor left in an unawaited task."""
    try:
        await engine.send(request, timeout=timeout, connect_timeout=timeout)
    except Exception as exc:  # a best-effort send: any failure (closed pool included) is only logged
        logger.info("could not ask %s to stop or forget its work: %r", request.url, exc)
