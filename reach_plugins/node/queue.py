"""The node's bounded priority queue: ``workers`` requests run at once, the rest wait, ``online`` before ``batch``.

A request holds a slot for as long as it runs; when every slot is taken it
waits in the queue of its priority, and a freed slot goes to the oldest
``online`` waiter first. When ``capacity`` requests already wait, a new one is
refused at once with :class:`~reach_plugins.errors.Backpressure` carrying a
``retry_after`` hint (the time the queue needs to drain, from the measured
service time): nothing is dropped silently, and nothing waits unbounded.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Final

from reach_plugins.errors import Backpressure, ConfigError
from reach_plugins.model import Priority

MIN_HINT: Final = 0.05
MAX_HINT: Final = 5.0
_ORDER: Final[tuple[Priority, ...]] = ("online", "batch")


class WorkQueue:
    """Admission for a node: ``async with queue.slot(priority): ...`` runs one request."""

    def __init__(self, *, capacity: int = 1000, workers: int = 64, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity < 0 or workers < 1:
            raise ConfigError(f"the node queue needs capacity >= 0 and workers >= 1, got {capacity} and {workers}")
        self.capacity = capacity
        self.workers = workers
        self._clock = clock
        self._free = workers
        self._waiting: dict[Priority, deque[asyncio.Future[None]]] = {name: deque() for name in _ORDER}
        self._online, self._batch = self._waiting["online"], self._waiting["batch"]
        self._service = 0.05
        """Exponentially weighted mean of how long a request holds its slot, in seconds."""
        self.accepted = 0
        self.refused = 0

    @property
    def depth(self) -> int:
        """Requests waiting for a slot."""
        return len(self._online) + len(self._batch)

    @property
    def running(self) -> int:
        return self.workers - self._free

    @property
    def full(self) -> bool:
        return self._free == 0 and self.depth >= self.capacity

    def retry_after(self) -> float:
        """Seconds until the queue has likely drained enough to take one more request."""
        return min(MAX_HINT, max(MIN_HINT, self._service * (self.depth + 1) / self.workers))

    def refusal(self) -> Backpressure:
        self.refused += 1
        return Backpressure(
            f"the node's queue is full ({self.depth} waiting, capacity {self.capacity}, {self.running} running); "
            "slow down and retry after the hinted delay",
            retry_after=round(self.retry_after(), 3),
        )

    def slot(self, priority: Priority, *, bounded: bool = True) -> Slot:
        """Hold one slot while the block runs; ``bounded=False`` waits even when the queue is full."""
        return Slot(self, priority, bounded)

    async def _acquire(self, priority: Priority, bounded: bool) -> None:
        if self._free > 0 and not (self._online or self._batch):
            self._free -= 1
            return
        if bounded and self.depth >= self.capacity:
            raise self.refusal()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiting[priority]
        queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()
            elif waiter in queue:
                queue.remove(waiter)
            raise

    def _done(self, started: float) -> None:
        """A slot held since ``started`` is given back; the service time it took feeds the hint."""
        self._service += 0.2 * (self._clock() - started - self._service)
        self._release()

    def _release(self) -> None:
        """Hand the slot to the oldest waiter, online first; else free it."""
        for name in _ORDER:
            queue = self._waiting[name]
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return
        self._free += 1


class Slot:
    """``async with queue.slot(priority)``: one slot of :class:`WorkQueue`, a plain class (no generator per request)."""

    __slots__ = ("_bounded", "_priority", "_queue", "_started")

    def __init__(self, queue: WorkQueue, priority: Priority, bounded: bool) -> None:
        self._queue = queue
        self._priority = priority
        self._bounded = bounded
        self._started = 0.0

    async def __aenter__(self) -> None:
        queue = self._queue
        await queue._acquire(self._priority, self._bounded)
        queue.accepted += 1
        self._started = queue._clock()

    async def __aexit__(self, *_: object) -> None:
        self._queue._done(self._started)
