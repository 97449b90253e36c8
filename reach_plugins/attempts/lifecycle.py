"""The attempt lifecycle as data: what follows each outcome (DESIGN 11.1), and the phases a request moves through.

Modelled on h11's ``_state.py``: the transitions are tables that code looks
up, and a move the tables do not list raises :class:`ImpossibleMove`
instead of drifting into a state nobody designed. Pure: no clock, no I/O.
An impossible move is a bug of the driver, never the caller's input, so it is
not a :class:`~reach_plugins.errors.ReachError` and never crosses the wire.

What follows an attempt (:data:`AFTER`, keyed by the outcome and whether the request has an idempotency key):

================  ======  ==========================================================================
outcome           keyed   next
================  ======  ==========================================================================
success           any     ``finish``
business          any     ``give_up`` (never retried)
not_delivered     any     ``fail_over`` to the next candidate at once (no backoff, no retry budget, not
                          a retry); with no candidate left, or through a hop that owns failover: ``retry``
failed            any     ``retry`` after full-jitter backoff within max_attempts, budget and deadline
unknown           yes     ``pin`` the key where it can be checked, then ``retry`` only there; a move away
                          from the pin, or giving up, ends ``OutcomeUnknown``
unknown           no      ``retry`` when the capability is retryable (the retry plan says no otherwise)
================  ======  ==========================================================================

The phases of one request (:data:`PHASES`): ``ready`` -admit-> ``admitted`` -send-> ``sent``
-finish/give_up-> ``done``; ``sent`` -retry-> ``backing_off`` -wake-> ``ready``; ``sent``
-fail_over-> ``ready``; ``ready`` -give_up-> ``done`` (no instance could take a retry).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from reach_plugins.policy.classify import Stage


class ImpossibleMove(RuntimeError):
    """The driver asked for a move the lifecycle tables do not allow from where the request is."""


Action = Literal["finish", "give_up", "fail_over", "retry"]
Phase = Literal["ready", "admitted", "sent", "backing_off", "done"]
Move = Literal["admit", "send", "finish", "give_up", "fail_over", "retry", "wake"]


@dataclass(frozen=True, slots=True)
class Row:
    """One row of :data:`AFTER`: the action, whether to pin the key first, and whether to try a failover first."""

    action: Action
    pin: bool = False
    fail_over_first: bool = False


_FINISH = Row("finish")
_GIVE_UP = Row("give_up")
_RETRY = Row("retry")

AFTER: dict[tuple[Stage, bool], Row] = {
    ("success", False): _FINISH,
    ("success", True): _FINISH,
    ("business", False): _GIVE_UP,
    ("business", True): _GIVE_UP,
    ("not_delivered", False): Row("retry", fail_over_first=True),
    ("not_delivered", True): Row("retry", fail_over_first=True),
    ("failed", False): _RETRY,
    ("failed", True): _RETRY,
    ("unknown", False): _RETRY,
    ("unknown", True): Row("retry", pin=True),
}
"""DESIGN 11.1, one row per (outcome, keyed); the table in this module's docstring."""

PHASES: dict[Phase, dict[Move, Phase]] = {
    "ready": {"admit": "admitted", "give_up": "done"},
    "admitted": {"send": "sent"},
    "sent": {"finish": "done", "give_up": "done", "retry": "backing_off", "fail_over": "ready"},
    "backing_off": {"wake": "ready", "give_up": "done"},
    "done": {},
}
"""Every move a request may make from each phase; anything else is impossible."""


def after(stage: Stage, keyed: bool) -> Row:
    """The row of :data:`AFTER` for an attempt's outcome."""
    return AFTER[(stage, keyed)]


def moved(phase: Phase, move: Move) -> Phase:
    """The phase after ``move``; raises ImpossibleMove when ``phase`` has no such move."""
    nxt = PHASES[phase].get(move)
    if nxt is None:
        allowed = ", ".join(PHASES[phase]) or "none (the request is over)"
        raise ImpossibleMove(f"a request in phase {phase!r} cannot {move!r}; the moves from there are: {allowed}")
    return nxt
