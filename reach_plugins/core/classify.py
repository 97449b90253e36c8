"""Turn what one attempt produced (a Reply or a transport error) into a verdict the pipeline acts on.

The verdict answers the questions retry, breaker and limiter ask: may this be
retried, could the agent have executed it already, is the instance unreachable
or overloaded, and how long did it ask us to wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from reach_plugins.errors import (
    WIRE_CODES,
    Backpressure,
    BusinessError,
    ConnectError,
    InvalidResponse,
    ReachError,
    ReadTimeout,
    RemoteError,
    StreamIdle,
    TransportError,
)
from reach_plugins.model import Capability, ErrorInfo
from reach_plugins.transport import Reply
from reach_plugins.validation import check_reply

Outcome = Literal["success", "business", "transient", "timeout", "invalid_response", "backpressure"]

_RETRYABLE: frozenset[str] = frozenset({"transient", "timeout", "backpressure"})
_INSTANCE_FAULTS: frozenset[str] = frozenset({"transient", "timeout", "backpressure", "invalid_response"})


@dataclass(frozen=True, slots=True)
class Verdict:
    """The classified result of one attempt."""

    outcome: Outcome
    error: ErrorInfo | None = None
    retry_after: float | None = None
    delivered: bool = True
    """False only when the agent certainly did not execute the request (connect failure, explicit rejection)."""
    unreachable: bool = False
    """The instance could not be reached at all: the next try should go elsewhere."""
    overload: bool = False
    """The downstream signalled overload (timeout, 429/503, backpressure): adaptive concurrency narrows."""

    @property
    def ok(self) -> bool:
        return self.outcome == "success"

    @property
    def retryable(self) -> bool:
        """Transient by nature; whether a retry is actually made depends on policy, budget and deadline."""
        return self.outcome in _RETRYABLE

    @property
    def instance_fault(self) -> bool:
        """Counts against the instance's circuit breaker (a business refusal does not)."""
        return self.outcome in _INSTANCE_FAULTS


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
    if kind == "backpressure":
        message = error.message if error else "agent asked to slow down"
        return Verdict("backpressure", _info("backpressure", message, retry_after), retry_after, False, overload=True)
    if kind == "invalid_response":
        return Verdict("invalid_response", error)
    if code in (429, 503):
        error = error or _info("transient", f"agent answered HTTP {code}", retry_after)
        return Verdict("transient", error, retry_after, delivered=False, overload=True)
    if kind == "timeout":
        return Verdict("timeout", error, retry_after, overload=True)
    if code >= 500 or kind == "transient":
        return Verdict("transient", error or _info("transient", f"agent answered HTTP {code}"), retry_after)
    if reply.status == "success":
        return Verdict("invalid_response", _info("invalid_response", f"a success reply with HTTP status {code}"))
    return Verdict("business", error or _info("business", f"agent refused with HTTP {code}"))


def classify_exception(exc: ReachError | TimeoutError) -> Verdict:
    """Classify a transport failure; only a connect failure proves the agent never saw the request."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, TimeoutError):
        return Verdict("timeout", _info("timeout", "no answer within the attempt's time"), overload=True)
    if isinstance(exc, ConnectError):
        return Verdict("transient", _info("transient", message), delivered=False, unreachable=True)
    if isinstance(exc, ReadTimeout | StreamIdle):
        return Verdict("timeout", _info("timeout", message), overload=True)
    if isinstance(exc, TransportError):
        return Verdict("transient", _info("transient", message))
    if isinstance(exc, Backpressure):
        info = _info("backpressure", message, exc.retry_after)
        return Verdict("backpressure", info, exc.retry_after, delivered=False, overload=True)
    if isinstance(exc, InvalidResponse):
        return Verdict("invalid_response", _info("invalid_response", message))
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
