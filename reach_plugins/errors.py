"""The errors of reach-plugins. Callers never need to catch aiohttp, httpx or grpc errors.

Rule of thumb: ``ReachClient.reach`` *raises* when nothing was sent (the request
is wrong, or no agent may or can take it) and *returns* a ``ReachResponse``
whose ``status`` is ``fail`` or ``timeout`` when an agent was tried;
``response.raise_for_status()`` turns that into the matching exception.

    ReachError
    ├── ConfigError                  bad YAML, unknown key, literal secret
    ├── RequestError                 the request itself is refused; nothing is sent
    │   ├── UnknownCapability        nobody offers it (names the closest known ones)
    │   ├── InvalidPayload           payload does not fit params_schema (names the field)
    │   ├── PermissionDenied         tenant not allowed, internal_only, bad token
    │   ├── LoopDetected             target already in the hop chain, or too many hops
    │   ├── SessionClosed            the conversation was closed or expired
    │   ├── ApprovalRequired         danger_level high without approval
    │   └── IdempotencyConflict      same key, different payload
    ├── NoHealthyAgent               candidates exist, none can take work (says why each)
    │   └── CircuitOpen              every candidate's breaker is open
    ├── RateLimited                  the local rate limit did not free up within max_wait
    ├── TransportError               a transport's failure, mapped at its boundary
    │   ├── ConnectError             never reached the agent (safe to retry anything)
    │   ├── ConnectionLost           reset or closed mid-request (may have executed)
    │   ├── ReadTimeout              no answer within the attempt's time
    │   └── StreamIdle               a stream sent nothing for stream_idle seconds
    ├── Backpressure                 the downstream asked to slow down (retry_after)
    ├── InvalidResponse              the downstream answered garbage or broke return_schema
    ├── RemoteError                  the agent answered with an error
    │   └── BusinessError            error.type == "business": never retried
    ├── DeadlineExceeded             the request's deadline passed (lists the attempts)
    └── BackendUnavailable           etcd or Redis (shared registry/state) did not answer
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reach_plugins.model import Attempt, ReachResponse


class ReachError(Exception):
    """Base of every error raised by reach-plugins."""

    error_type: str = "rejected"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class ConfigError(ReachError):
    """The configuration cannot be used; the message names the file, the field and the fix."""


class RequestError(ReachError):
    """The request was refused before anything was sent."""


class UnknownCapability(RequestError):
    """No agent offers this capability."""

    def __init__(self, capability: str, known: Sequence[str] = ()) -> None:
        hint = f"; closest known: {', '.join(known)}" if known else ""
        super().__init__(f"no agent offers capability {capability!r}{hint}", capability=capability)
        self.capability = capability
        self.known = list(known)


class InvalidPayload(RequestError):
    """The payload does not fit the capability's ``params_schema``."""


class PermissionDenied(RequestError):
    """The tenant (or the source address) may not reach this agent."""


class LoopDetected(RequestError):
    """The target is already in the hop chain, or the chain is too long."""


class SessionClosed(RequestError):
    """The conversation was closed or its liveness TTL expired."""


class ApprovalRequired(RequestError):
    """A dangerous capability needs approval, and none was given."""


class IdempotencyConflict(RequestError):
    """The idempotency key was already used with a different payload."""


class NoHealthyAgent(ReachError):
    """Agents offer the capability but none can take work now."""

    error_type = "rejected"

    def __init__(self, message: str, reasons: dict[str, str] | None = None) -> None:
        super().__init__(message, reasons=reasons or {})
        self.reasons = reasons or {}


class CircuitOpen(NoHealthyAgent):
    """Every candidate's circuit breaker is open."""

    error_type = "circuit_open"


class RateLimited(ReachError):
    """The local rate limit or concurrency limit did not free a slot in time."""

    error_type = "rate_limited"


class TransportError(ReachError):
    """A transport failed; always transient."""

    error_type = "transient"
    reached_agent: bool = True
    """Whether the request may have been executed (only a connect failure says no)."""


class ConnectError(TransportError):
    """The connection could not be made: the agent never saw the request."""

    reached_agent = False


class ConnectionLost(TransportError):
    """The connection broke after the request was sent."""


class ReadTimeout(TransportError):
    """No answer within the attempt's time."""

    error_type = "timeout"


class StreamIdle(TransportError):
    """A stream stayed silent longer than ``stream_idle``."""

    error_type = "timeout"


class Backpressure(ReachError):
    """The downstream asked the caller to slow down and try again after ``retry_after`` seconds."""

    error_type = "backpressure"

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message, retry_after=retry_after)
        self.retry_after = retry_after


class InvalidResponse(ReachError):
    """The downstream answered something that is not a valid reply."""

    error_type = "invalid_response"


class RemoteError(ReachError):
    """The agent answered with an error."""

    error_type = "transient"


class BusinessError(RemoteError):
    """The agent refused on business grounds; retrying cannot help."""

    error_type = "business"


class DeadlineExceeded(ReachError):
    """The request's deadline passed; ``attempts`` lists what was tried."""

    error_type = "timeout"

    def __init__(self, message: str, attempts: Sequence[Attempt] = ()) -> None:
        super().__init__(message, attempts=list(attempts))
        self.attempts = list(attempts)


class BackendUnavailable(ReachError):
    """A shared backend (etcd registry, Redis store) could not be reached; names the backend and the fix."""

    error_type = "transient"


_BY_TYPE: dict[str, type[ReachError]] = {
    "business": BusinessError,
    "transient": RemoteError,
    "timeout": DeadlineExceeded,
    "invalid_response": InvalidResponse,
    "backpressure": Backpressure,
    "circuit_open": CircuitOpen,
    "rate_limited": RateLimited,
    "rejected": PermissionDenied,
}


def error_for_response(response: ReachResponse) -> ReachError:
    """Build the exception that matches a failed response (used by ``raise_for_status``)."""
    info = response.error
    kind = info.type if info else ("timeout" if response.status == "timeout" else "transient")
    message = info.message if info else f"request {response.request_id} ended with status {response.status}"
    attempts = response.trace.attempts if response.trace else ()
    if kind == "timeout":
        return DeadlineExceeded(message, attempts)
    if kind == "backpressure":
        return Backpressure(message, retry_after=info.retry_after if info else None)
    return _BY_TYPE.get(kind, RemoteError)(message)


class OutcomeUnknown(ReachError):
    """A keyed call was sent and its answer lost, and no place that can check its key is left to ask.

    The agent may or may not have executed it. ``key`` is the idempotency key: retrying later with the same
    key is safe (the key is checked before anything runs again), running it under a new key is not.
    """

    error_type = "outcome_unknown"

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message, key=key)
        self.key = key


_BY_TYPE["outcome_unknown"] = OutcomeUnknown
