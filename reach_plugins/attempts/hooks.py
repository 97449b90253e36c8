"""What the attempt path tells its subscribers: each finished attempt, and each state change it caused.

Hooks in the manner of stamina's ``RetryHook``: the driver calls every
subscriber with an immutable record; nothing is set and reset around a call.
The request's trace recorder is one subscriber; a pipeline's own hooks
(metrics, logs) see every request.
"""

from __future__ import annotations

from typing import Protocol

from reach_plugins.model import AttemptRecord
from reach_plugins.policy.breaker import BreakerTransition
from reach_plugins.policy.consistency import ConsistencyTransition
from reach_plugins.policy.outliers import OutlierTransition

Moved = BreakerTransition | ConsistencyTransition | OutlierTransition
"""A state change of one instance: its breaker, its reply-consistency standing, or its standing among its peers."""


class AttemptHooks(Protocol):
    """A subscriber of the attempt path; each method must be quick and must not raise."""

    def attempt(self, record: AttemptRecord) -> None:
        """An attempt finished (a success only when :attr:`keep` says someone reads it)."""
        ...

    def moved(self, change: Moved) -> None:
        """An instance's breaker or consistency state changed during this request's call."""
        ...
