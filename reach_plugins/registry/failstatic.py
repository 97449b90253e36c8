"""Fail static: a registry that cannot be reached keeps its last view, and its silence ages no heartbeat.

While the registry answers, a heartbeat older than the agent's grace means
the instance is gone. While it does not, agents cannot write heartbeats at
all, so their age says nothing about them: routing keeps the last-seen lease
view (breakers still apply) and the heartbeat clock stops (DESIGN 11.3).
:class:`Reachability` remembers when the registry was unreachable and tells
how much of a heartbeat's age fell into such a time; the judge subtracts it.
Pure state: every method takes ``now`` (the registry's clock, the one the
heartbeats are stamped with).
"""

from __future__ import annotations

from collections import deque
from typing import Final

MAX_OUTAGES: Final = 64
"""Outages remembered; older ones are forgotten (a heartbeat older than all of them is long dead anyway)."""


class Reachability:
    """When the registry could not be reached: past outages, and the one going on now if any."""

    __slots__ = ("_lost_at", "_outages")

    def __init__(self) -> None:
        self._outages: deque[tuple[float, float]] = deque(maxlen=MAX_OUTAGES)
        self._lost_at: float | None = None

    @property
    def reachable(self) -> bool:
        return self._lost_at is None

    def lost(self, now: float) -> None:
        """The registry stopped answering at ``now`` (a second call during one outage changes nothing)."""
        if self._lost_at is None:
            self._lost_at = now

    def found(self, now: float) -> None:
        """The registry answers again at ``now``; the outage joins the past ones."""
        if self._lost_at is not None:
            if now > self._lost_at:
                self._outages.append((self._lost_at, now))
            self._lost_at = None

    def unseen(self, since: float, now: float) -> float:
        """Seconds between ``since`` and ``now`` during which the registry could not be reached."""
        total = 0.0
        spans = list(self._outages)
        if self._lost_at is not None:
            spans.append((self._lost_at, now))
        for start, end in spans:
            overlap = min(end, now) - max(start, since)
            if overlap > 0:
                total += overlap
        return total

    def heartbeat_time(self, seen: float, now: float) -> float:
        """The moment to judge a heartbeat seen at ``seen`` against: ``now`` less the unreachable time since."""
        return now - self.unseen(seen, now)
