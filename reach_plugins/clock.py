"""The real clock: epoch and monotonic time, the event loop's sleeping and timeouts.

It implements :class:`reach_plugins.policy.clock.Clock` on asyncio; a room
of its own at the bottom of the house, so that every room that needs real
time (the attempt driver, the stores, the agent SDK) can import it while
``policy/`` stays free of the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from reach_plugins.policy.clock import Clock


class SystemClock:
    """Wall-clock time, a monotonic clock, and the event loop's own sleeping and timeouts.

    ``monotonic_fn`` defaults to :func:`time.monotonic` for the real wall
    clock, and to ``time_fn`` itself when a test hands in its own notion of now.
    """

    def __init__(
        self, time_fn: Callable[[], float] = time.time, *, monotonic_fn: Callable[[], float] | None = None
    ) -> None:
        self._time = time_fn
        self._monotonic = monotonic_fn or (time.monotonic if time_fn is time.time else time_fn)

    def __call__(self) -> float:
        return self._time()

    def now(self) -> float:
        return self._time()

    def monotonic(self) -> float:
        return self._monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def timeout_at(self, deadline: float) -> AbstractAsyncContextManager[object]:
        return asyncio.timeout(max(0.0, deadline - self._time()))


def as_clock(clock: Clock | Callable[[], float] | None) -> Clock:
    """A :class:`Clock` from a Clock, a bare time function (real sleeping, its notion of now), or None (system)."""
    if clock is None:
        return SystemClock()
    if isinstance(clock, Clock):
        return clock
    return SystemClock(clock)
