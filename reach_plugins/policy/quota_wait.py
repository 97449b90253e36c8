"""A refused call's bounded wait for its quota, pure state fed ``now``: sleep how long, or refuse now.

A call refused by a quota layer may wait and be judged again instead of being
refused at once, if its priority allows a wait (``quotas.waits``). A rate
refusal's ``retry_after`` is exact (GCRA says when the next call conforms), so
the call sleeps that long only if it fits both the rest of its wait and the
rest of its deadline. A concurrency refusal predicts nothing (a slot frees
when some call ends), so the call waits for a release at most until its
``retry_after`` (the earliest lease's expiry, at most a second) or the end of
its wait, whichever is first. Either way the judging is bounded: at most
:data:`MAX_RECHECKS` re-checks, and never past the wait or the deadline. A
waiting call holds nothing and is charged nothing; only the check that admits
it charges the budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

from reach_plugins.policy.gcra import EPSILON, Refusal

MAX_RECHECKS: Final = 8
"""Re-checks of one call at most: waiters woken together by one freed call take their turns one per re-check."""
SHORTEST_PAUSE: Final = 0.001
"""Seconds a re-check waits at least: a ``retry_after`` below it is a clock's rounding (epoch seconds carry
about 0.2 us), and judging again sooner would find the same answer."""


@dataclass(frozen=True, slots=True)
class QuotaWait:
    """How long a call may still wait for its quota: its wait's end, its deadline, and re-checks left."""

    started: float
    until: float
    """When the priority's wait ends (``started + max_wait``)."""
    deadline: float
    """When the request's deadline passes: a wait never reaches it (the call would arrive with no time left)."""
    rechecks: int = MAX_RECHECKS

    @classmethod
    def start(cls, now: float, *, max_wait: float, remaining: float) -> QuotaWait:
        """The wait of a call judged first at ``now``, with ``remaining`` seconds to its deadline."""
        return cls(now, now + max_wait, now + remaining)

    def delay(self, refusal: Refusal, now: float) -> float | None:
        """Seconds to sleep before judging the call again, or None: refuse it now."""
        if self.rechecks <= 0:
            return None
        left = self.until - now
        delay = max(SHORTEST_PAUSE, refusal.retry_after if refusal.kind == "rate" else min(refusal.retry_after, left))
        if delay <= left + EPSILON and delay < self.deadline - now:
            return delay
        return None

    def again(self) -> QuotaWait:
        """This wait after one more re-check."""
        return replace(self, rechecks=self.rechecks - 1)

    def waited(self, now: float) -> float:
        """Seconds since the call was first judged."""
        return now - self.started

    @property
    def rechecked(self) -> int:
        """Re-checks spent so far."""
        return MAX_RECHECKS - self.rechecks
