"""Time, injected: what a clock must offer; the real one and the virtual one live elsewhere.

Every state machine here takes ``now`` as an argument; only the attempt driver
reads a :class:`Clock`, sleeps on it and bounds awaits with ``timeout_at``.
Two readings: ``now()`` is epoch time, for what crosses processes (a
request's absolute deadline, trace stamps); ``monotonic()`` is for local
intervals (rate limiter, breaker windows and open time), so a step of the
wall clock neither blocks calls nor reopens breakers (STYLE 15). The real
clock is :class:`reach_plugins.clock.SystemClock`; the virtual one, for tests
and simulations, :class:`reach_plugins.testing.clock.FakeClock`. This module
imports no event loop (policy/ is sans-IO).
"""

from __future__ import annotations

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
