"""Rate limit and backpressure state: a token bucket and an adaptive concurrency limit.

Both are pure state fed ``now``; the concurrency limiter that makes callers
wait in line is async and lives with the driver
(:mod:`reach_plugins.attempts.limiter`).
"""

from __future__ import annotations

import math

from reach_plugins.errors import ConfigError

AGENT_QUEUE = 1
"""How many calls beyond ``max_concurrency`` an agent SDK instance holds in line, per running one. Callers keep
that many more in flight to each instance, so it never idles for a round trip between calls (goodput stays at its
capacity); past the line the agent answers "not executed" at once."""


class TokenBucket:
    """``rate`` tokens a second up to ``burst``; a reservation may run into debt it then waits out."""

    __slots__ = ("_stamp", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: int | None = None, *, now: float) -> None:
        if rate <= 0:
            raise ConfigError(f"rate_limit.qps must be > 0, got {rate}")
        self.rate = rate
        self.burst = burst if burst is not None else max(1, math.ceil(rate))
        self._tokens = float(self.burst)
        self._stamp = now

    def _refill(self, now: float) -> None:
        if now > self._stamp:
            self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now

    def reserve(self, now: float, max_wait: float) -> float | None:
        """Seconds to wait before the call may go (0: now), or None if that would exceed ``max_wait``."""
        self._refill(now)
        after = self._tokens - 1.0
        wait = 0.0 if after >= 0 else -after / self.rate
        if wait > max_wait:
            return None
        self._tokens = after
        return wait

    def refund(self, now: float) -> None:
        """Return a reserved token whose call was abandoned."""
        self._refill(now)
        self._tokens = min(float(self.burst), self._tokens + 1.0)


class AdaptiveLimit:
    """AIMD concurrency: shrink by ``backoff`` on overload or rising latency, grow by one a window when it is used.

    Latency "rises" when a short moving average exceeds ``tolerance`` times a
    long one (a gradient, as in Netflix's concurrency-limits); a lasting
    change becomes the new normal as the long average catches up. At most one
    decrease per usual round trip (the long average: under overload the short
    one swells and would slow the cuts), so one burst of errors costs one step.
    """

    __slots__ = ("_calm_until", "_growth", "_long", "_short", "backoff", "limit", "max_limit", "min_limit", "tolerance")

    def __init__(self, max_limit: int, *, min_limit: int = 1, backoff: float = 0.9, tolerance: float = 2.0) -> None:
        if not 1 <= min_limit <= max_limit or not 0 < backoff < 1 or tolerance <= 1:
            raise ConfigError(
                f"adaptive limit needs 1 <= min_limit <= max_limit, 0 < backoff < 1 and tolerance > 1; "
                f"got {min_limit}, {max_limit}, {backoff}, {tolerance}"
            )
        self.max_limit = max_limit
        self.min_limit = min_limit
        self.backoff = backoff
        self.tolerance = tolerance
        self.limit = max_limit
        self._short: float | None = None
        self._long: float | None = None
        self._calm_until = 0.0
        self._growth = 0

    def record(
        self, now: float, latency: float | None, *, overload: bool, in_flight: int, refused: bool = False
    ) -> int:
        """Feed one finished call (``latency`` None when it says nothing about speed); return the new limit.

        ``refused``: the downstream refused it at its own limit ("not executed"), which is exact news: it held
        fewer than the ``in_flight`` calls sent, so the window drops below that at once (undamped); else each
        freed slot would be refilled at once and refused again, a loop of refusals costing the agent its time.
        """
        if refused:
            self.limit = max(self.min_limit, min(self.limit, in_flight - 1))
            return self.limit
        slow = False
        if latency is not None:
            self._short = latency if self._short is None else self._short + 0.2 * (latency - self._short)
            self._long = latency if self._long is None else self._long + 0.02 * (latency - self._long)
            slow = self._short > self.tolerance * self._long
        if overload or slow:
            if now >= self._calm_until:
                self.limit = max(self.min_limit, int(self.limit * self.backoff))
                self._calm_until = now + (self._long or 0.0)
        elif in_flight * 2 >= self.limit:
            # One more per window's worth of good answers (one a round trip), not one per answer: growing by one
            # per success outpaces the cuts under overload and keeps the window far above the instance's capacity.
            self._growth += 1
            if self._growth >= self.limit:
                self._growth = 0
                self.limit = min(self.max_limit, self.limit + 1)
        return self.limit
