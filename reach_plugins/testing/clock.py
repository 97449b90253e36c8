"""Virtual time for tests and simulations: :class:`FakeClock`, a :class:`~reach_plugins.clock.Clock`.

``sleep`` returns as soon as every other task is idle, with the clock moved to
the moment the sleep ends, so a 40-second outage is simulated in
milliseconds and tests never really wait.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType


@dataclass(order=True, slots=True)
class _Timer:
    when: float
    seq: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)


class FakeClock:
    """Virtual time that jumps to the next pending timer once every task is idle.

    ``advance(seconds)`` moves time by hand (firing what falls due); ``sleep``
    and ``timeout_at`` need no help: a driver task waits until no task has
    touched the clock for ``settle_rounds`` event-loop turns, then jumps to
    the earliest timer. Only for code whose waiting all goes through this clock
    (no real I/O), which is what the core's tests and benchmarks are.
    """

    def __init__(self, start: float = 1_700_000_000.0, *, settle_rounds: int = 12) -> None:
        self._now = start
        self._timers: list[_Timer] = []
        self._seq = itertools.count()
        self._activity = 0
        self._settle_rounds = settle_rounds
        self._driver: asyncio.Task[None] | None = None

    def __call__(self) -> float:
        return self.now()

    def now(self) -> float:
        self._activity += 1
        return self._now

    def monotonic(self) -> float:
        """Virtual time never steps back, so it is its own monotonic clock."""
        return self.now()

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing every timer that falls due on the way."""
        if seconds < 0:
            raise ValueError(f"time only moves forward; advance() got {seconds}")
        target = self._now + seconds
        self._fire_until(target)
        self._now = target

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = self.call_at(self._now + seconds, lambda: _resolve(future))
        try:
            await future
        finally:
            timer.cancelled = True

    def timeout_at(self, deadline: float) -> AbstractAsyncContextManager[object]:
        return _FakeTimeout(self, deadline)

    def call_at(self, when: float, callback: Callable[[], object]) -> _Timer:
        """Run ``callback`` when virtual time reaches ``when``; cancel by setting ``cancelled`` on the result."""
        timer = _Timer(max(when, self._now), next(self._seq), lambda: _discard(callback()))
        heapq.heappush(self._timers, timer)
        self._activity += 1
        if self._driver is None or self._driver.done():
            self._driver = asyncio.get_running_loop().create_task(self._drive())
        return timer

    def _fire_until(self, when: float) -> None:
        while self._timers and self._timers[0].when <= when:
            timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                self._now = max(self._now, timer.when)
                timer.callback()

    async def _drive(self) -> None:
        while True:
            await self._settle()
            while self._timers and self._timers[0].cancelled:
                heapq.heappop(self._timers)
            if not self._timers:
                return
            self._fire_until(self._timers[0].when)

    async def _settle(self) -> None:
        quiet = 0
        while quiet < self._settle_rounds:
            mark = self._activity
            await asyncio.sleep(0)
            quiet = quiet + 1 if mark == self._activity else 0


def _discard(_: object) -> None:
    return None


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _FakeTimeout:
    """``asyncio.timeout`` semantics on virtual time: cancel the task at the deadline, raise TimeoutError."""

    def __init__(self, clock: FakeClock, deadline: float) -> None:
        self._clock = clock
        self._deadline = deadline
        self._fired = False
        self._timer: _Timer | None = None
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0

    async def __aenter__(self) -> _FakeTimeout:
        self._task = asyncio.current_task()
        if self._task is None:
            raise RuntimeError("timeout_at() must be used inside a task")
        self._cancelling = self._task.cancelling()
        self._timer = self._clock.call_at(self._deadline, self._fire)
        return self

    def _fire(self) -> None:
        if self._task is not None:
            self._fired = True
            self._task.cancel()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._timer is not None:
            self._timer.cancelled = True
        expired = self._fired and self._task is not None and self._task.uncancel() <= self._cancelling
        if expired and exc_type is asyncio.CancelledError:
            raise TimeoutError(f"virtual deadline {self._deadline} passed") from exc
