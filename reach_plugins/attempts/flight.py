"""The records of one request's attempts: its running state, an admission, and what follows an attempt."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from reach_plugins.attempts.admission import AgentGuards, Slot
from reach_plugins.attempts.ports import RouteLike
from reach_plugins.model import ErrorInfo, ReachRequest
from reach_plugins.policy.breaker import CircuitBreaker, Permit
from reach_plugins.policy.deadline import Deadline
from reach_plugins.telemetry.trace import TraceRecorder


@dataclass(slots=True)
class Flight:
    """The running state of one request."""

    request: ReachRequest
    rec: TraceRecorder
    route: RouteLike
    deadline: Deadline
    key: str | None
    retries_here: bool
    """Whether this layer owns retries (not marked ``retried_upstream``, transport does not retry)."""
    headers: dict[str, str]
    attempts: int = 0
    counted: int = 0
    """Attempts that count against ``max_attempts`` (a ``not_delivered`` one does not)."""
    far_attempts: int = 0
    spent_retry: bool = False
    """A retry token of the budget was spent on this request: its success gives the token back with one more."""
    pin: str | None = None
    """``agent/instance`` where a keyed attempt may have run (its answer was lost); retries go only there."""
    pin_shared: bool = False
    """The pinned agent declares shared idempotency: any of its instances can check the key."""
    ran_at: str | None = None
    """The last ``agent/instance`` an attempt may have run at (sent, and not answered "not delivered")."""
    claim: Claim | None = None
    """The dedup claim this flight owns, if keyed and claimed."""
    excluded: set[tuple[str, str]] = field(default_factory=set)
    status: str = "pending"
    error: ErrorInfo | None = None
    streamed_events: int = 0
    """Data events handed to the caller of a stream (a unary request leaves it 0)."""
    streamed_chars: int = 0
    """Characters of text those events carried (:func:`~reach_plugins.policy.batching.streamed_chars`)."""


@dataclass(slots=True)
class Claim:
    """The flight's dedup claim: where it says the key was sent, and how to tell the store it moved."""

    where: str | None
    tell: Callable[[str], Awaitable[None]]

    async def moved(self, where: str) -> None:
        """Record ``where`` before sending there: a crashed owner's heir then asks the right instance."""
        self.where = where
        await self.tell(where)


@dataclass(frozen=True, slots=True)
class Plan:
    """What follows a failed attempt: a retry after ``delay`` seconds, or (``delay`` None) the end, and why."""

    delay: float | None
    why: str
    out_of_time: bool = False


@dataclass(frozen=True, slots=True)
class Step:
    """What follows an attempt: ``finish``, ``give_up``, ``fail_over`` (now) or ``retry`` (after ``plan``)."""

    action: Literal["finish", "give_up", "fail_over", "retry"]
    plan: Plan


def where_of(route: RouteLike) -> str:
    """``agent/instance``: how a claim records where an attempt went."""
    return f"{route.agent.name}/{route.instance.instance_id}"


@dataclass(frozen=True, slots=True)
class Admission:
    """What one admitted attempt holds: concurrency slots and a breaker permit."""

    guards: AgentGuards
    slot: Slot
    breaker: CircuitBreaker
    permit: Permit
    hop: tuple[CircuitBreaker, Permit] | None = None
    """The breaker and permit of the gateway or node the attempt goes through (None: straight to the agent)."""
