"""Turn what one attempt produced (a Reply or a transport error) into a verdict the pipeline acts on.

The verdict answers the questions retry, breaker and limiter ask: may this be
retried, could the agent have executed it already, is the instance unreachable
or overloaded, and how long did it ask us to wait. Its :attr:`Verdict.stage`
is the attempt's outcome in DESIGN 11.1's words: ``not_delivered`` (never ran:
connect failure, explicit backpressure or "not executed"), ``unknown`` (sent,
answer lost), ``failed`` (a transient answer, or a handler that ran and
raised), ``business``, ``success``.

A handler that raised (``handler_failed``) is ``failed`` and final: it ran, so
no retry and no failover runs it again, keyed or not, and it counts against no
breaker (it is about the call, not the instance). One the handler marked
:class:`~reach_plugins.errors.Retryable` (``handler_retryable``) is transient.

A refusal that proves the instance ran nothing (:func:`refused_before_running`:
a token the issuer signed that the instance cannot verify, as a skewed clock
makes it; its key store unreachable) is ``not_delivered`` too, and it is the
instance's fault: the call fails over to a peer and the instance's breaker
counts it. Refused by every instance, it ends as the refusal it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from reach_plugins.errors import (
    WIRE_CODES,
    BackendUnavailable,
    Backpressure,
    BusinessError,
    ConnectError,
    HandlerFailed,
    InvalidResponse,
    InvalidToken,
    OutcomeUnknown,
    RateLimited,
    ReachError,
    ReadTimeout,
    RemoteError,
    Retryable,
    StreamIdle,
    TokenClockSkew,
    TransportError,
    Unauthenticated,
)
from reach_plugins.model import Capability, ErrorInfo
from reach_plugins.policy.validation import check_reply
from reach_plugins.transport import Reply

Outcome = Literal["success", "business", "handler_failed", "transient", "timeout", "invalid_response", "backpressure"]
Delivery = Literal["not_delivered", "unknown", "answered"]
Stage = Literal["not_delivered", "unknown", "failed", "business", "success"]

OUTCOME_UNKNOWN = OutcomeUnknown.code
"""The error type a hop answers with when it sent the call on and lost the answer."""

_RETRYABLE: frozenset[str] = frozenset({"transient", "timeout", "backpressure"})
_INSTANCE_FAULTS: frozenset[str] = frozenset({"transient", "timeout", "invalid_response"})
"""Backpressure is not among them: an instance that answers "slow down" or "in progress elsewhere, not
executed" is alive; the adaptive limit (``overload``) and failover handle it, a breaker would shut it out."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The classified result of one attempt."""

    outcome: Outcome
    error: ErrorInfo | None = None
    retry_after: float | None = None
    delivery: Delivery = "answered"
    """``not_delivered`` only when the agent certainly did not execute it; ``unknown`` when sent and unanswered."""
    unreachable: bool = False
    """The instance could not be reached at all: the next try should go elsewhere."""
    overload: bool = False
    """The downstream signalled overload (timeout, 429/503, backpressure): adaptive concurrency narrows."""
    refusal: bool = False
    """The instance refused before running anything, by its own fault (:func:`refused_before_running`)."""

    @property
    def ok(self) -> bool:
        return self.outcome == "success"

    @property
    def delivered(self) -> bool:
        """Whether the agent may have executed the request."""
        return self.delivery != "not_delivered"

    @property
    def stage(self) -> Stage:
        """The attempt's outcome as DESIGN 11.1 names it."""
        if self.refusal:
            return "not_delivered"
        if self.outcome in ("success", "business"):
            return self.outcome
        if self.delivery == "answered":
            return "failed"
        return self.delivery

    @property
    def settled(self) -> bool:
        """The agent's own final answer (a refusal, a handler that raised): the call ends with it as it is."""
        return self.outcome in ("business", "handler_failed")

    @property
    def retryable(self) -> bool:
        """Transient by nature; whether a retry is actually made depends on policy, budget and deadline."""
        return self.outcome in _RETRYABLE

    @property
    def instance_fault(self) -> bool:
        """Counts against the instance's circuit breaker (a business refusal or backpressure does not, nor an
        ``outcome_unknown`` answer: it is an answer about the key, from an instance that works)."""
        if self.error is not None and self.error.type == OUTCOME_UNKNOWN:
            return self.refusal
        return self.refusal or self.outcome in _INSTANCE_FAULTS


SUCCESS = Verdict("success")


def _info(kind: str, message: str, retry_after: float | None = None) -> ErrorInfo:
    return ErrorInfo(type=kind, message=message, retry_after=retry_after)


def _outcome_code(code: str) -> str:
    """An agent reporting one of our transport errors (its own downstream call failed) reports a transient fault."""
    kind = WIRE_CODES.get(code)
    if kind is not None and issubclass(kind, TransportError):
        return "timeout" if issubclass(kind, ReadTimeout | StreamIdle) else "transient"
    return code


def classify_reply(reply: Reply) -> Verdict:
    """Classify an answer: error type first (the agent knows best), then the HTTP-style status code."""
    code = reply.status_code
    if reply.status == "success" and 200 <= code < 300:
        return SUCCESS
    error = reply.error
    kind = _outcome_code(error.type) if error else None
    retry_after = reply.retry_after if reply.retry_after is not None else (error.retry_after if error else None)
    if kind == "business":
        return Verdict("business", error)
    if kind == HandlerFailed.code:
        return Verdict("handler_failed", error)
    if kind == Retryable.code:
        return Verdict("transient", error, retry_after)
    if kind in ("backpressure", RateLimited.code):
        # Both say "not executed". Only a limit's refusal is overload; "in progress elsewhere", "draining" or "key
        # cannot be checked now" say nothing about load, so they do not narrow the instance's limit.
        message = error.message if error else "agent asked to slow down"
        info = _info(kind, message, retry_after)
        overload = kind == RateLimited.code
        return Verdict("backpressure", info, retry_after, delivery="not_delivered", overload=overload)
    if kind == BackendUnavailable.code:  # "not executed": its store could not check the key; no overload
        return Verdict("backpressure", error, retry_after, delivery="not_delivered")
    if kind == "invalid_response":
        return Verdict("invalid_response", error)
    if kind == OUTCOME_UNKNOWN:
        return Verdict("transient", error, retry_after, delivery="unknown")
    if code == 429 or (code == 503 and retry_after is not None):
        # Overload, not a fault: an instance saying "slow down, try after N s" is alive (no breaker counts it).
        error = error or _info("backpressure", f"agent answered HTTP {code}", retry_after)
        return Verdict("backpressure", error, retry_after, overload=True)
    if code == 503:
        # No Retry-After: maybe overload (the window narrows), maybe a broken instance (the breaker counts it).
        return Verdict("transient", error or _info("transient", f"agent answered HTTP {code}"), overload=True)
    if kind == "timeout":
        return Verdict("timeout", error, retry_after, delivery="unknown", overload=True)
    if code >= 500 or kind == "transient":
        return Verdict("transient", error or _info("transient", f"agent answered HTTP {code}"), retry_after)
    if reply.status == "success":
        return Verdict("invalid_response", _info("invalid_response", f"a success reply with HTTP status {code}"))
    return Verdict("business", error or _info("business", f"agent refused with HTTP {code}"))


TOKEN_REFUSALS: frozenset[str] = frozenset({Unauthenticated.code, InvalidToken.code, TokenClockSkew.code})
"""An agent could not verify the caller's token (of a token our issuer just signed: most often a skewed clock)."""

_REFUSED_BEFORE_RUNNING: frozenset[str] = TOKEN_REFUSALS | {BackendUnavailable.code}
"""Error types an agent answers before it runs anything: it could not verify the caller's token, or it cannot
check the idempotency key now."""


def refused_before_running(verdict: Verdict) -> Verdict:
    """``verdict`` as a refusal of the instance when its answer proves nothing ran there by the instance's fault.

    Apply it only to answers of an agent reached directly with a token the caller's issuer signed: from a
    gateway or node, ``unauthenticated`` is about the caller's own credential and stays final. The refusal
    keeps its outcome (``business``: never retried at that instance) and its error, so a call that every
    instance refuses ends with the same error as before.
    """
    error = verdict.error
    if verdict.ok or error is None or error.type not in _REFUSED_BEFORE_RUNNING:
        return verdict
    return Verdict("business", error, verdict.retry_after, delivery="not_delivered", refusal=True)


def classify_exception(exc: ReachError | TimeoutError) -> Verdict:
    """Classify a transport failure; only a connect failure or backpressure proves the agent never saw it."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, TimeoutError):
        info = _info("timeout", "no answer within the attempt's time")
        return Verdict("timeout", info, delivery="unknown", overload=True)
    if isinstance(exc, ConnectError):
        return Verdict("transient", _info("transient", message), delivery="not_delivered", unreachable=True)
    if isinstance(exc, ReadTimeout | StreamIdle):
        return Verdict("timeout", _info("timeout", message), delivery="unknown", overload=True)
    if isinstance(exc, TransportError):
        return Verdict("transient", _info("transient", message), delivery="unknown")
    if isinstance(exc, Backpressure):
        info = _info("backpressure", message, exc.retry_after)
        return Verdict("backpressure", info, exc.retry_after, delivery="not_delivered", overload=True)
    if isinstance(exc, InvalidResponse):
        return Verdict("invalid_response", _info("invalid_response", message))
    if isinstance(exc, Retryable):
        return Verdict("transient", _info(exc.error_type, message))
    if isinstance(exc, HandlerFailed):
        return Verdict("handler_failed", _info(exc.error_type, message))
    if isinstance(exc, BusinessError):
        return Verdict("business", _info("business", message))
    if isinstance(exc, RemoteError):
        return Verdict("transient", _info("transient", message))
    return Verdict("business", _info(exc.error_type, message))


def check_return_schema(capability: Capability | None, data: Any) -> Verdict | None:
    """An ``invalid_response`` verdict when ``data`` breaks the capability's ``return_schema``, else None."""
    if capability is None or capability.return_schema is None:
        return None
    try:
        check_reply(capability, data)
    except InvalidResponse as exc:
        return Verdict("invalid_response", _info("invalid_response", exc.message))
    return None
