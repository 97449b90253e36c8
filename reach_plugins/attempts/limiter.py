"""The concurrency limiter: at most ``limit`` attempts in flight, a bounded FIFO of waiters behind them.

It hands slots to waiters and never sleeps itself (the caller bounds the wait
with its clock). Bounded waits turn moderate overload into slower answers and
only sustained overload into fast ``RateLimited`` errors.
"""

from __future__ import annotations

import asyncio
from collections import deque

from reach_plugins.errors import ConfigError, RateLimited


class ConcurrencyLimiter:
    """At most ``limit`` calls in flight; up to ``max_queue`` more wait in FIFO order, the rest are refused."""

    def __init__(self, limit: int, *, max_queue: int, name: str = "") -> None:
        if limit < 1 or max_queue < 0:
            raise ConfigError(f"a concurrency limit needs limit >= 1 and max_queue >= 0, got {limit} and {max_queue}")
        self._limit = limit
        self._max_queue = max_queue
        self._in_flight = 0
        self._waiters: deque[asyncio.Future[None]] | None = None
        """Made when the first caller has to wait: most limiters (one per instance) never see a line."""
        self.name = name

    @property
    def limit(self) -> int:
        return self._limit

    @limit.setter
    def limit(self, value: int) -> None:
        self._limit = max(1, value)
        self._wake()

    @property
    def max_queue(self) -> int:
        return self._max_queue

    @max_queue.setter
    def max_queue(self, value: int) -> None:
        """A shorter line refuses newcomers only; those already waiting keep their place."""
        self._max_queue = max(0, value)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def queued(self) -> int:
        return len(self._waiters) if self._waiters else 0

    def try_acquire(self) -> bool:
        if self._in_flight < self._limit and not self._waiters:
            self._in_flight += 1
            return True
        return False

    async def acquire(self) -> None:
        """Take a slot, waiting in line if needed; raise RateLimited at once when the line is full."""
        if self.try_acquire():
            return
        waiters = self._waiters
        if waiters is None:
            waiters = self._waiters = deque()
        if len(waiters) >= self._max_queue:
            raise RateLimited(
                f"{self.name or 'agent'}: {self._in_flight} calls in flight (limit {self._limit}) and "
                f"{len(waiters)} waiting; the wait queue is full — slow down or raise pool.max_conns"
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()
            elif waiter in waiters:
                # A release between the cancellation and this line already dropped the waiter from the line.
                waiters.remove(waiter)
            raise

    def release(self) -> None:
        self._in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and self._in_flight < self._limit:
            waiter = waiters.popleft()
            if not waiter.done():
                self._in_flight += 1
                waiter.set_result(None)
