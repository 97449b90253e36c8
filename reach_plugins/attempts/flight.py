"""The state of one request's attempts, an admission, and what follows an attempt."""

from __future__ import annotations

from dataclasses import dataclass, field

from reach_plugins.attempts.admission import AgentGuards, Slot
from reach_plugins.attempts.claims import Claim
from reach_plugins.attempts.lifecycle import PHASES, Action, Move, Phase, moved
from reach_plugins.attempts.ports import RouteLike
from reach_plugins.model import ReachRequest
from reach_plugins.policy.breaker import CircuitBreaker, Permit
from reach_plugins.policy.deadline import Deadline
from reach_plugins.telemetry.trace import TraceRecorder


@dataclass(frozen=True, slots=True)
class Pin:
    """Where a keyed attempt may have run (its answer was lost): retries go only where the key is checked."""

    where: str
    """``agent/instance`` of that attempt."""
    shared: bool
    """The agent declares shared idempotency: any of its instances can check the key."""


@dataclass(slots=True)
class Flight:
    """The running state of one request: what it asks (set once), where it goes and how far it got."""

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
    pin: Pin | None = None
    ran_at: str | None = None
    """The last ``agent/instance`` an attempt may have run at (sent, and not answered "not delivered")."""
    claim: Claim | None = None
    """The dedup claim this flight owns, if keyed and claimed."""
    excluded: set[tuple[str, str]] = field(default_factory=set)
    phase: Phase = "ready"
    """Where the request is in :data:`~reach_plugins.attempts.lifecycle.PHASES`."""

    def move(self, move: Move) -> None:
        """Take one move of the lifecycle (raises ImpossibleMove when the phase has none such)."""
        phase = PHASES[self.phase].get(move)
        self.phase = moved(self.phase, move) if phase is None else phase


@dataclass(frozen=True, slots=True)
class Plan:
    """What follows a failed attempt: a retry after ``delay`` seconds, or (``delay`` None) the end, and why."""

    delay: float | None
    why: str
    out_of_time: bool = False


@dataclass(frozen=True, slots=True)
class Step:
    """What follows an attempt: ``finish``, ``give_up``, ``fail_over`` (now) or ``retry`` (after ``plan``)."""

    action: Action
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
