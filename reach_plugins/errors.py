"""The errors of reach-plugins. Callers never need to catch aiohttp, httpx or grpc errors.

Rule of thumb: ``ReachClient.reach`` *raises* when nothing was sent (the request
is wrong, or no agent may or can take it) and *returns* a ``ReachResponse``
whose ``status`` is ``fail`` or ``timeout`` when an agent was tried;
``response.raise_for_status()`` turns that into the matching exception.

    ReachError
    ├── ConfigError                  bad YAML, unknown key, literal secret
    │   └── NoApprover               a capability needing approval on an agent without an approver
    ├── RequestError                 the request itself is refused; nothing is sent
    │   ├── UnknownCapability        nobody offers it (names the closest known ones)
    │   ├── InvalidPayload           payload does not fit params_schema (names the field)
    │   ├── InputTooLong             estimated input tokens above every candidate's input_tokens_required
    │   ├── PermissionDenied         tenant not allowed, internal_only (HTTP 403)
    │   │   ├── Unauthenticated      no credential, or one nobody holds (HTTP 401)
    │   │   │   └── InvalidToken     no X-Reach-Token, or not a valid unexpired one of the issuer
    │   │   │       └── TokenClockSkew   exp/nbf/iat outside the leeway: expired, or clocks apart
    │   │   ├── TokenDenied          a valid token that does not entitle this call
    │   │   │   └── ExchangeDenied   the issuer refused to exchange a token (presenter, audience, chain)
    │   │   └── AuditRefused         the content audit refused an L3 exchange
    │   ├── BodyTooLarge             a request body over the server's limit (HTTP 413)
    │   │   └── MediaTooLarge        media parts over the capability's max_media_bytes (HTTP 413)
    │   ├── BodyTimeout              a body that did not arrive in time (HTTP 408)
    │   ├── UnsupportedMediaType     a POST that is not application/json (HTTP 415)
    │   ├── LoopDetected             target already in the hop chain, or too many hops
    │   ├── SessionClosed            the conversation was closed or expired
    │   ├── ApprovalRequired         danger_level high without approval
    │   ├── IdempotencyConflict      same key, different payload
    │   └── EntryTooLarge            one entry over a store's max_bytes (nothing kept)
    ├── NoHealthyAgent               candidates exist, none can take work (says why each)
    │   └── CircuitOpen              every candidate's breaker is open
    ├── RateLimited                  a rate limit or quota refused: which layer (global/tenant/agent), retry_after
    ├── TransportError               a transport's failure, mapped at its boundary
    │   ├── ConnectError             never reached the agent (safe to retry anything)
    │   ├── ConnectionLost           reset or closed mid-request (may have executed)
    │   ├── ReadTimeout              no answer within the attempt's time
    │   └── StreamIdle               a stream sent nothing for stream_idle seconds
    ├── Backpressure                 the downstream asked to slow down (retry_after)
    ├── InvalidResponse              the downstream answered garbage or broke return_schema
    ├── RemoteError                  the agent answered with an error
    │   ├── BusinessError            error.type == "business": never retried
    │   │   └── Refused              error.type == "refusal": the model behind the agent refused
    │   └── HandlerFailed            the handler ran and raised (an error id): never re-run by the reach layer
    │       └── Retryable            raised by a handler to say a new run may pass: retried per the retry policy
    ├── DeadlineExceeded             the request's deadline passed (lists the attempts)
    ├── BackendUnavailable           etcd or Redis (shared registry/state) did not answer
    └── OutcomeUnknown               a keyed call's answer was lost where its key cannot be checked now

Every class carries its own wire code (``code``, also ``error_type``): the
``error.type`` a gateway, node or agent sends; and how a server refuses with
it: ``http_status`` and ``grpc_code`` (the name of a ``grpc.StatusCode``, so
this module imports no grpc), inherited where a subclass is its parent on the
wire. Every server (gateway, node, agent SDK, issuer) reads these two and maps
nothing itself. :data:`WIRE_CODES` is the one table from code to class, built
from the classes; :func:`from_wire` rebuilds the error a hop reported, so a
refusal raises the same class on the client over every transport. The
codes an agent itself sends (``business``, ``transient``, ``timeout``,
``backpressure``, ``invalid_response``) keep their DESIGN.md section 4 meaning.
:func:`is_retryable` tells a framework's retry hook (LangChain's
``ToolRetryMiddleware(retry_on=...)``) a :class:`BusinessError`, a refused
request or a :class:`HandlerFailed`, which the reach layer does not retry
either, from a transient failure or a :class:`Retryable` one.

A handler's exception is a result, not a transport fault: the handler ran,
and may have acted before it raised. The agent answers it as
:class:`HandlerFailed` carrying an error id (its log holds the traceback under
that id) and no layer runs it again, on any path or transport. A handler that
knows a new run is safe and may pass marks its failure by raising
:class:`Retryable` (or a subclass of it), ``raise Retryable("inventory busy")
from exc``: that one is retried like a transient fault, and
:func:`is_retryable` says True for it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar, Final, Protocol

QUOTA_LAYERS: Final = ("global", "tenant", "agent")
"""The layers of a fleet-wide quota, widest first; a quota refusal's message starts ``the <layer> quota``."""
_QUOTA_LAYER: Final = re.compile(r"^the (global|tenant|agent) quota\b")
_ERROR_ID: Final = re.compile(r"error id ([0-9a-f]{16})\b")
"""How a :class:`HandlerFailed` message names its error id (:func:`reach_plugins.agent.faults.failed` writes it)."""


class ReachError(Exception):
    """Base of every error raised by reach-plugins."""

    code: ClassVar[str] = "error"
    """This class's wire code (``error.type``); unique per class, see :data:`WIRE_CODES`."""
    http_status: ClassVar[int] = 502
    """The HTTP status a server refuses with (4xx: the caller's to fix, 429: slow down, 5xx: nobody can now)."""
    grpc_code: ClassVar[str] = "UNKNOWN"
    """The name of the ``grpc.StatusCode`` the node aborts with."""
    refused: bool = False
    """True when a hop (gateway, node) refused the request before any agent saw it: the core raises it as is."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    @property
    def error_type(self) -> str:
        """The wire code of this error (its class's :attr:`code`)."""
        return self.code

    @classmethod
    def from_wire(cls, message: str, retry_after: float | None) -> ReachError:
        """The error a hop reported as ``{"type": cls.code, "message": message}``."""
        return cls(message)


class ConfigError(ReachError):
    """The configuration cannot be used; the message names the file, the field and the fix."""

    code = "config_error"
    http_status = 500
    grpc_code = "INTERNAL"


class NoApprover(ConfigError):
    """A capability needing approval (``danger_level: high``, ``require_approval``) on an agent without an approver."""

    code = "no_approver"


class RequestError(ReachError):
    """The request was refused before anything was sent."""

    code = "rejected"
    http_status = 400
    grpc_code = "INVALID_ARGUMENT"


class UnknownCapability(RequestError):
    """No agent offers this capability."""

    code = "unknown_capability"
    http_status = 404
    grpc_code = "NOT_FOUND"

    def __init__(self, capability: str, known: Sequence[str] = ()) -> None:
        hint = f"; closest known: {', '.join(known)}" if known else ""
        super().__init__(f"no agent offers capability {capability!r}{hint}", capability=capability)
        self.capability = capability
        self.known = list(known)

    @classmethod
    def from_wire(cls, message: str, retry_after: float | None) -> ReachError:
        error = cls.__new__(cls)
        RequestError.__init__(error, message)
        error.capability, error.known = "", []
        return error


class InvalidPayload(RequestError):
    """The payload does not fit the capability's ``params_schema``."""

    code = "invalid_payload"


class InputTooLong(RequestError):
    """The payload's estimated tokens exceed the ``input_tokens_required`` of every agent that could serve it."""

    code = "input_too_long"


class PermissionDenied(RequestError):
    """The tenant (or the source address) may not reach this agent."""

    code = "permission_denied"
    http_status = 403
    grpc_code = "PERMISSION_DENIED"


class Unauthenticated(PermissionDenied):
    """No credential, or a credential no tenant or agent holds."""

    code = "unauthenticated"
    http_status = 401
    grpc_code = "UNAUTHENTICATED"


class InvalidToken(Unauthenticated):
    """No token, or one that is not a valid, unexpired token of the trusted issuer: the token proves nothing."""

    code = "invalid_token"


class TokenClockSkew(InvalidToken):
    """A correctly signed token whose ``exp``, ``nbf`` or ``iat`` does not fit the verifier's clock beyond its leeway.

    Either the token expired, or the verifier's clock and the issuer's are apart: a caller whose token is valid by
    its own clock reads this refusal as the target's skew (nothing ran there) and may fail over to another instance.
    """

    code = "token_clock_skew"


class TokenDenied(PermissionDenied):
    """A valid token that does not entitle this call: another audience, a refused chain or trust level."""

    code = "token_denied"


class ExchangeDenied(TokenDenied):
    """The issuer refused an exchange: the presenter is not the token's holder, the tenant may not reach the new
    audience, the chain may not extend, or an L3 agent asked for a direct hop."""

    code = "exchange_denied"


class AuditRefused(PermissionDenied):
    """The content audit refused a request or a reply of an L3 agent."""

    code = "audit_refused"


class BodyTooLarge(RequestError):
    """The body is longer than the server accepts (HTTP 413)."""

    code = "body_too_large"
    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"


class MediaTooLarge(BodyTooLarge):
    """The media parts of a request or reply are larger than the capability's ``max_media_bytes`` (HTTP 413)."""

    code = "media_too_large"


class BodyTimeout(RequestError):
    """The body did not arrive in time (HTTP 408): a slow or stalled client."""

    code = "body_timeout"
    http_status = 408
    grpc_code = "DEADLINE_EXCEEDED"


class UnsupportedMediaType(RequestError):
    """A POST without ``Content-Type: application/json`` (HTTP 415)."""

    code = "unsupported_media_type"
    http_status = 415


class LoopDetected(RequestError):
    """The target is already in the hop chain, or the chain is too long."""

    code = "loop_detected"
    http_status = 409
    grpc_code = "FAILED_PRECONDITION"


class SessionClosed(RequestError):
    """The conversation was closed or its liveness TTL expired."""

    code = "session_closed"
    http_status = 410
    grpc_code = "FAILED_PRECONDITION"


TICKET_MARK: Final = "approval ticket: "
"""Ends the message of an :class:`ApprovalRequired` whose agent asks its caller for the approval."""


class ApprovalRequired(RequestError):
    """A dangerous capability needs approval, and none was given.

    ``ticket`` is set when the target agent asks its caller for the approval
    (``reach_plugins.agent.approval.CallerApproval``): once the caller's reviewer
    said yes, the same call re-sent with the ticket as its ``action`` runs, once.
    The ticket ends the message, so it crosses every hop and transport unchanged.
    """

    code = "approval_required"
    http_status = 403
    grpc_code = "PERMISSION_DENIED"

    def __init__(self, message: str, *, ticket: str | None = None) -> None:
        if ticket is not None:
            message = f"{message.rstrip('. ')}. {TICKET_MARK}{ticket}"
        super().__init__(message)

    @property
    def question(self) -> str:
        """The message without its ticket: who asks for approval, and why (the same on every request)."""
        return self.message.rpartition(TICKET_MARK)[0].rstrip(". ") or self.message

    @property
    def ticket(self) -> str | None:
        """The target's approval ticket, if it asks its caller for the approval."""
        _, mark, ticket = self.message.rpartition(TICKET_MARK)
        return ticket.strip() or None if mark else None


class IdempotencyConflict(RequestError):
    """The idempotency key was already used with a different payload."""

    code = "idempotency_conflict"
    http_status = 409
    grpc_code = "FAILED_PRECONDITION"


class EntryTooLarge(RequestError):
    """One entry (a response, a session's state) is larger than its store's ``max_bytes``; nothing was kept."""

    code = "entry_too_large"
    http_status = 413
    grpc_code = "RESOURCE_EXHAUSTED"


class NoHealthyAgent(ReachError):
    """Agents offer the capability but none can take work now."""

    code = "no_healthy_agent"
    http_status = 503
    grpc_code = "UNAVAILABLE"

    def __init__(self, message: str, reasons: dict[str, str] | None = None) -> None:
        super().__init__(message, reasons=reasons or {})
        self.reasons = reasons or {}


class CircuitOpen(NoHealthyAgent):
    """Every candidate's circuit breaker is open."""

    code = "circuit_open"


class RateLimited(ReachError):
    """A limit refused the call: the local rate or concurrency limit did not free a slot in time, or a quota.

    ``layer`` names the quota layer that refused (``global``, ``tenant`` or ``agent``; ``None`` for the local
    per-agent limits) and ``retry_after`` when a new try may pass (seconds, when known). Both survive every hop:
    the layer is read back from the message (:data:`QUOTA_LAYERS`), ``retry_after`` travels beside it.
    """

    code = "rate_limited"
    http_status = 429
    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, *, layer: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, layer=layer, retry_after=retry_after)
        self.layer = layer
        self.retry_after = retry_after

    @classmethod
    def from_wire(cls, message: str, retry_after: float | None) -> ReachError:
        found = _QUOTA_LAYER.search(message)
        return cls(message, layer=found.group(1) if found else None, retry_after=retry_after)


class TransportError(ReachError):
    """A transport failed; always transient."""

    code = "transport_error"
    grpc_code = "UNAVAILABLE"
    reached_agent: bool = True
    """Whether the request may have been executed (only a connect failure says no)."""


class ConnectError(TransportError):
    """The connection could not be made: the agent never saw the request."""

    code = "connect_error"
    reached_agent = False


class ConnectionLost(TransportError):
    """The connection broke after the request was sent."""

    code = "connection_lost"


class ReadTimeout(TransportError):
    """No answer within the attempt's time."""

    code = "read_timeout"
    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"


class StreamIdle(TransportError):
    """A stream stayed silent longer than ``stream_idle``."""

    code = "stream_idle"
    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"


class Backpressure(ReachError):
    """The downstream asked the caller to slow down and try again after ``retry_after`` seconds."""

    code = "backpressure"
    http_status = 429
    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message, retry_after=retry_after)
        self.retry_after = retry_after

    @classmethod
    def from_wire(cls, message: str, retry_after: float | None) -> ReachError:
        return cls(message, retry_after=retry_after)


class InvalidResponse(ReachError):
    """The downstream answered something that is not a valid reply."""

    code = "invalid_response"


class RemoteError(ReachError):
    """The agent answered with an error."""

    code = "transient"
    http_status = 500
    grpc_code = "INTERNAL"


class BusinessError(RemoteError):
    """The agent refused on business grounds; retrying cannot help."""

    code = "business"
    http_status = 422
    grpc_code = "FAILED_PRECONDITION"


class Refused(BusinessError):
    """The model behind an agent refused (an OpenAI ``refusal``): an answer, never retried nor held against it."""

    code = "refusal"


class HandlerFailed(RemoteError):
    """The agent's handler ran and raised; what it did before raising, it did. Never re-run by the reach layer.

    The message names the capability, the exception's class and the error id under which the agent logged the
    traceback; :attr:`error_id` is that id (``None`` when the message carried none).
    """

    code = "handler_failed"

    def __init__(self, message: str, error_id: str | None = None) -> None:
        super().__init__(message, error_id=error_id)
        self.error_id = error_id

    @classmethod
    def from_wire(cls, message: str, retry_after: float | None) -> ReachError:
        found = _ERROR_ID.search(message)
        return cls(message, error_id=found.group(1) if found else None)


class Retryable(HandlerFailed):
    """Raised by a handler: it failed this time, and running it again is safe and may pass (a busy backend).

    The reach layer retries it within the capability's retry policy, budget and deadline, as a transient fault;
    the caller sees the handler's message and the error id. Subclass it to give the mark to an error class.
    """

    code = "handler_retryable"
    http_status = 503
    grpc_code = "UNAVAILABLE"


class DeadlineExceeded(ReachError):
    """The request's deadline passed; ``attempts`` lists what was tried (the ``Attempt`` records of its trace)."""

    code = "timeout"
    http_status = 504
    grpc_code = "DEADLINE_EXCEEDED"

    def __init__(self, message: str, attempts: Sequence[object] = ()) -> None:
        super().__init__(message, attempts=list(attempts))
        self.attempts = list(attempts)


class BackendUnavailable(ReachError):
    """A shared backend (etcd registry, Redis store) could not be reached; names the backend and the fix."""

    code = "backend_unavailable"
    http_status = 503
    grpc_code = "UNAVAILABLE"


class OutcomeUnknown(ReachError):
    """A keyed call was sent and its answer lost, and no place that can check its key is left to ask.

    The agent may or may not have executed it. ``key`` is the idempotency key: retrying later with the same
    key is safe (the key is checked before anything runs again), running it under a new key is not.
    """

    code = "outcome_unknown"

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message, key=key)
        self.key = key


def _wire_codes() -> dict[str, type[ReachError]]:
    """Every error class by its code: the subclasses of :class:`ReachError` defined in this module."""
    table: dict[str, type[ReachError]] = {}
    pending: list[type[ReachError]] = [ReachError]
    while pending:
        kind = pending.pop()
        pending.extend(kind.__subclasses__())
        if kind.__module__ != __name__:
            continue
        if kind.code in table:
            raise RuntimeError(f"{kind.__name__} and {table[kind.code].__name__} share the wire code {kind.code!r}")
        table[kind.code] = kind
    return table


WIRE_CODES: Final[dict[str, type[ReachError]]] = _wire_codes()
"""The one table of wire codes: ``error.type`` -> the class a client raises for it."""


class WireError(Protocol):
    """An error as it travels (``model.ErrorInfo`` is one): ``{"type", "message", "retry_after"}``."""

    @property
    def type(self) -> str: ...

    @property
    def message(self) -> str: ...

    @property
    def retry_after(self) -> float | None: ...


def from_wire(info: WireError) -> ReachError:
    """The error a hop or agent reported (an unknown code is a :class:`RemoteError` that keeps the message)."""
    return WIRE_CODES.get(info.type, RemoteError).from_wire(info.message, info.retry_after)


_PERMANENT: Final = (RequestError, ConfigError, BusinessError, HandlerFailed, InvalidResponse)


def is_retryable(exc: BaseException) -> bool:
    """Whether calling again later may succeed; a framework's retry hook can ask it (``retry_on=is_retryable``).

    False for what a retry cannot fix: a :class:`BusinessError` (the agent
    refused), a refused request (:class:`RequestError`: wrong arguments,
    permission, closed conversation, approval), a :class:`ConfigError`, an
    :class:`InvalidResponse`, and a :class:`HandlerFailed` (the handler ran and
    raised; running it again may repeat what it did) unless the handler marked
    it :class:`Retryable`. True for the transient rest, and for exceptions that
    are not ours (the framework's own policy decides those). The core has
    already retried transient faults within the call's deadline.
    """
    return isinstance(exc, Retryable) or not isinstance(exc, _PERMANENT)
