"""The Transport contract: carry one prepared call to one chosen instance, bring the reply back.

Modelled on httpx's ``AsyncBaseTransport``. A transport only moves bytes: it
maps its library's exceptions to :mod:`reach_plugins.errors` at its boundary
and never retries, breaks circuits or deduplicates — the core does that, once,
for every transport.

What a transport promises (the core relies on each, and reads nothing else):

* **it decides the attempt's outcome at its boundary** (DESIGN 11.1): a call
  that certainly never ran raises :class:`~reach_plugins.errors.ConnectError`
  or :class:`~reach_plugins.errors.Backpressure`, or returns a reply of error
  type ``backpressure`` (``not_delivered``); a call sent whose answer was lost
  raises :class:`~reach_plugins.errors.ConnectionLost`,
  :class:`~reach_plugins.errors.ReadTimeout` or
  :class:`~reach_plugins.errors.StreamIdle`, or returns a reply of error type
  ``outcome_unknown`` or ``timeout`` from a hop (``unknown``); every other
  answer is a :class:`Reply` (``failed``, ``business`` or ``success``);
* **it leaves time to the core**: the core bounds every ``send`` by
  ``call.timeout`` and every stream (first event, silence between events,
  the request's deadline) on its own clock, so real and virtual time behave
  alike; a transport may give up sooner at its boundary, never later;
* **a stream is an** :data:`EventStream` (an async generator): the core closes
  it with ``aclose()`` when it stops reading, and closing it frees the
  connection and asks the far side to stop;
* ``owns_retries``: True when the far side is a hop (gateway, node) that
  retries and fails over itself: the local core then sends a call once;
* it **reports who served**: ``Reply.agent``/``Reply.instance`` name the
  instance that answered (a hop may have failed over) and ``Reply.attempts``
  how many attempts the far side made.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Protocol, Self, runtime_checkable

from opentelemetry.trace import INVALID_SPAN, Span

from reach_plugins.errors import ConfigError, ReachError
from reach_plugins.media import MediaPart, reply_limit
from reach_plugins.model import AgentDescriptor, Capability, ErrorInfo, Instance, ReachRequest


@dataclass(frozen=True, slots=True)
class Credential:
    """A resolved secret for one downstream agent, chosen per tenant."""

    type: Literal["none", "header", "query", "bearer", "cert"] = "none"
    key: str | None = None
    value: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None

    def __repr__(self) -> str:
        return f"Credential(type={self.type!r}, key={self.key!r}, value=***)"


@dataclass(frozen=True, slots=True)
class Call:
    """One attempt, fully decided: what to send, to which instance, within how long."""

    request: ReachRequest
    agent: AgentDescriptor
    instance: Instance
    timeout: float
    """Seconds this attempt may take: ``min(remaining deadline, per-attempt timeout)``."""
    attempt: int = 1
    capability: Capability | None = None
    credential: Credential = field(default_factory=Credential)
    headers: Mapping[str, str] = field(default_factory=dict)
    """Propagation headers prepared by the core (traceparent, hops, deadline...)."""
    span: Span = INVALID_SPAN
    """The request's ``invoke_agent`` CLIENT span: a transport adds its protocol's attributes (HTTP method, URL
    and status; RPC system, method and status) with :mod:`reach_plugins.telemetry.spans`' ``note_*`` helpers."""

    @property
    def media_limit(self) -> int:
        """The most media bytes the reply to this call may carry (:func:`~reach_plugins.media.reply_limit`)."""
        return reply_limit(self.capability.max_media_bytes if self.capability is not None else None)


@dataclass(frozen=True, slots=True)
class Reply:
    """What came back from one attempt. The core classifies it; the transport does not."""

    status: Literal["success", "fail"]
    data: Any = None
    error: ErrorInfo | None = None
    status_code: int = 200
    retry_after: float | None = None
    agent: str | None = None
    instance: str | None = None
    attempts: int = 1
    """Attempts the far side made (a gateway or node that retried reports more than one)."""
    media: tuple[MediaPart, ...] = ()
    """Binary parts of the answer, beside ``data``."""


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of a streamed reply: ``data`` chunks and ``media`` parts in the order sent, then ``end`` or
    ``error``. A ``media`` event carries one whole part: transports reassemble the chunks it travelled in
    (:mod:`reach_plugins.wire.media_stream`)."""

    kind: Literal["data", "media", "end", "error"]
    data: Any = None
    error: ErrorInfo | None = None
    media: MediaPart | None = None

    @property
    def last(self) -> bool:
        """Whether the stream ends with this event (``end`` or ``error``)."""
        return self.kind == "end" or self.kind == "error"

    @classmethod
    def failed(cls, exc: ReachError) -> StreamEvent:
        """The ``error`` event ending a stream with ``exc``."""
        return cls("error", error=ErrorInfo(type=exc.error_type, message=exc.message))


EventStream = AsyncGenerator[StreamEvent, None]
"""What ``Transport.stream`` returns: events read with ``async for``, closed with ``aclose()``."""


@runtime_checkable
class Transport(Protocol):
    """Send one call, or stream one call; close pooled resources on ``aclose``."""

    owns_retries: bool
    """True when the far side (a gateway, a node) retries: the local core then does not."""

    hop: str | None
    """The gateway or node every call goes through (None: straight to the agents). The core keeps that hop's
    own breaker: when the hop does not answer, its breaker counts the failure, never the breakers of the
    agent instances behind it (DESIGN 11.3)."""

    async def send(self, call: Call) -> Reply: ...

    def stream(self, call: Call) -> EventStream: ...

    async def end_session(self, tenant: str | None, session_id: str) -> None:
        """Conversation ``session_id`` of ``tenant`` closed: end what the far side keeps for it (an MCP session),
        best effort."""
        ...

    async def aclose(self) -> None: ...


class BaseTransport:
    """Convenience base: context-manager support, no-op close, streaming as one event."""

    owns_retries: bool = False
    hop: str | None = None

    async def send(self, call: Call) -> Reply:
        raise NotImplementedError("send() must be implemented by Transport subclasses")

    async def stream(self, call: Call) -> EventStream:
        reply = await self.send(call)
        if reply.status == "success":
            yield StreamEvent("data", reply.data)
            yield StreamEvent("end")
        else:
            yield StreamEvent("error", error=reply.error)

    async def end_session(self, tenant: str | None, session_id: str) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


Handler = Callable[[Call], "Reply | Any | Awaitable[Reply | Any]"]


class MockTransport(BaseTransport):
    """In-memory transport: ``handler(call)`` answers every call (sync or async).

    The handler returns a :class:`Reply`, or plain data (wrapped as a success),
    or raises a :mod:`reach_plugins.errors` exception to simulate a failure.
    ``calls`` records the calls sent, for assertions: at least the last
    ``record`` of them (at most twice as many), none with ``record=0``, so a
    long-running user (a benchmark, a demo) does not keep every call alive.
    An async handler is bounded by the core's timer like every transport.
    """

    def __init__(self, handler: Handler, *, owns_retries: bool = False, record: int = 10_000) -> None:
        if record < 0:
            raise ConfigError(f"MockTransport record= is how many recent calls to keep (0 for none), got {record}")
        self._handler = handler
        self.owns_retries = owns_retries
        self.record = record
        self.calls: list[Call] = []

    async def send(self, call: Call) -> Reply:
        if self.record:
            calls = self.calls
            calls.append(call)
            if len(calls) > 2 * self.record:
                del calls[: -self.record]
        result = self._handler(call)
        if type(result) is not dict and inspect.isawaitable(result):  # plain data needs no (slow) awaitable check
            result = await result
        if isinstance(result, Reply):
            return result
        return Reply(status="success", data=result, agent=call.agent.name, instance=call.instance.instance_id)
