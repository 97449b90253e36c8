"""One absolute deadline per request, and the slice of it each attempt may use.

The deadline is absolute (seconds since the epoch) because it crosses
processes: the remaining budget travels downstream as ``X-Reach-Deadline`` so
the next hop never works on a request its caller has already given up on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from reach_plugins.model import AgentDescriptor, Capability, ReachRequest, Timeouts


@dataclass(frozen=True, slots=True)
class Deadline:
    """An absolute moment (epoch seconds) after which nothing more is tried or waited for."""

    at: float

    def remaining(self, now: float) -> float:
        return max(0.0, self.at - now)

    def expired(self, now: float) -> bool:
        return now >= self.at

    def attempt_timeout(self, now: float, per_attempt: float) -> float:
        """``min(remaining, per-attempt timeout)``: what one attempt may take."""
        return min(self.at - now, per_attempt)

    def fits(self, now: float, delay: float) -> bool:
        """Whether sleeping ``delay`` still leaves time for an attempt (no sleep ends past the deadline)."""
        return now + delay < self.at


def timeouts_for(agent: AgentDescriptor, capability: Capability | None) -> Timeouts:
    """The capability's own timeouts when it declares them, else the agent's."""
    if capability is not None and capability.timeouts is not None:
        return capability.timeouts
    return agent.timeouts


RETRY_ROOM_QUANTILE = 0.99
RETRY_ROOM_FACTOR = 3.0
RETRY_ROOM_SAMPLES = 20
"""An attempt is cut for its retries' sake only at 3x the capability's p99, known from 20 answers at least."""


def retry_room(remaining: float, attempts_left: int, p99: float | None) -> float:
    """The longest one attempt of a call that can be retried safely may take, so that a lost answer leaves its
    retries time: its share of the remaining deadline (``remaining / attempts_left``), never below
    :data:`RETRY_ROOM_FACTOR` times the capability's recent p99 (a call that is slow by nature is not cut);
    unbounded until that p99 is known, and for the last attempt."""
    if p99 is None or attempts_left <= 1:
        return math.inf
    return max(RETRY_ROOM_FACTOR * p99, remaining / attempts_left)


def per_attempt_timeout(agent: AgentDescriptor, capability: Capability | None) -> float:
    """Connect plus response time: the longest one attempt may legitimately take."""
    timeouts = timeouts_for(agent, capability)
    return timeouts.connect + timeouts.response


def resolve_deadline(
    request: ReachRequest,
    agent: AgentDescriptor,
    capability: Capability | None,
    *,
    started_at: float,
    default_timeout: float,
) -> Deadline:
    """``request.deadline``, else start + ``timeout_ms``, else the agent's ``total`` timeout, else the default."""
    if request.deadline is not None:
        return Deadline(request.deadline)
    if request.timeout_ms is not None:
        return Deadline(started_at + request.timeout_ms / 1000.0)
    total = timeouts_for(agent, capability).total
    return Deadline(started_at + (total if total is not None else default_timeout))


def has_explicit_deadline(request: ReachRequest) -> bool:
    """Whether the caller bounded the request itself (streams are otherwise cut only by idleness)."""
    return request.deadline is not None or request.timeout_ms is not None
