"""Time, injected: what a clock offers, and the real one (epoch and monotonic time, the event loop's sleeping).

Every state machine in ``policy/`` takes ``now`` as an argument and imports no
clock; only the attempt driver (and the stores and agent SDK that wait) read a
:class:`Clock`, sleep on it and bound awaits with ``timeout_at``. Two
readings: ``now()`` is epoch time, for what crosses processes (a request's
absolute deadline, trace stamps); ``monotonic()`` is for local intervals (rate
limiter, breaker windows and open time), so a step of the wall clock neither
blocks calls nor reopens breakers (STYLE 15). The virtual clock for tests and
simulations is :class:`reach_plugins.testing.clock.FakeClock`. A room on the
ground floor: it imports nothing of ours.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Seconds since the epoch, sleeping, and a timeout bound on an absolute epoch deadline.

    Both clocks here are also plain time functions (``clock()`` is ``clock.now()``),
    so one object can drive the registry, the router and the pipeline.
    """

    def now(self) -> float: ...

    def monotonic(self) -> float:
        """Seconds on a clock that never steps back: only differences between two readings mean anything."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    def timeout_at(self, deadline: float) -> AbstractAsyncContextManager[object]:
        """Cancel the enclosed block at ``deadline`` and raise :class:`TimeoutError`, as ``asyncio.timeout`` does."""
        ...


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
