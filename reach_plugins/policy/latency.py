"""Recent successful latencies of each capability, and their quantiles: when to hedge, when to cut an attempt.

The attempt path records how long each winning attempt of a call that may be
retried safely (keyed, or a ``safe`` capability) took. Only answers that won
are recorded: an attempt cancelled because its hedge answered first, or cut
by its timeout, is never timed, so a slow or lossy instance does not drag the
figures up to its own pace. Pure: durations come in as arguments, no clock,
no I/O.
"""

from __future__ import annotations

import math
from collections import deque

WINDOW = 200
"""Latencies kept per (agent, capability): the quantiles are taken over the last this many."""

_MAX_TRACKED = 4096
"""(agent, capability) pairs tracked at most; the oldest pair is forgotten beyond that."""


RESORT_EVERY = 16
"""A full window's sorted view is rebuilt after this many new samples, not after each (a sort per call is not
free on the hot path; a quantile lagging 16 of 200 samples moves little)."""


class _Window:
    """The last :data:`WINDOW` latencies of one capability, with a sorted view rebuilt as samples come in."""

    __slots__ = ("_ordered", "_stale", "samples")

    def __init__(self) -> None:
        self.samples: deque[float] = deque(maxlen=WINDOW)
        self._ordered: list[float] = []
        self._stale = 0

    def add(self, seconds: float) -> None:
        self.samples.append(seconds)
        self._stale += 1

    def quantile(self, q: float) -> float:
        """The nearest-rank ``q`` quantile of the window (not empty), at most :data:`RESORT_EVERY` samples old
        once the window is full."""
        if self._stale and (self._stale >= RESORT_EVERY or len(self.samples) < WINDOW):
            self._ordered = sorted(self.samples)
            self._stale = 0
        ordered = self._ordered
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class Latencies:
    """Recent successful latencies per (agent, capability)."""

    def __init__(self) -> None:
        self._windows: dict[tuple[str, str], _Window] = {}

    def record(self, agent: str, capability: str, seconds: float) -> None:
        """An attempt of ``agent``'s ``capability`` answered successfully in ``seconds`` (and won)."""
        window = self._windows.get((agent, capability))
        if window is None:
            if len(self._windows) >= _MAX_TRACKED:
                del self._windows[next(iter(self._windows))]
            window = self._windows[(agent, capability)] = _Window()
        window.add(seconds)

    def quantile(self, agent: str, capability: str, q: float, *, min_samples: int) -> float | None:
        """The ``q`` quantile of the capability's recent latencies; None until ``min_samples`` are known."""
        window = self._windows.get((agent, capability))
        if window is None or len(window.samples) < min_samples:
            return None
        return window.quantile(q)
