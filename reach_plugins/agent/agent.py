"""ReachAgent: serve Python functions as capabilities over the reach wire protocol (DESIGN.md section 4).

    agent = ReachAgent("orders")

    @agent.capability("query_order", description="Where an order is")
    async def query_order(order_id: str) -> dict: ...

    serve(agent, port=8101)          # or mount agent.app in any ASGI server

The agent answers business errors (a raised :class:`BusinessError`) as
``error.type == "business"`` and any other exception of a handler as
``handler_failed`` with an error id (a transient error of its own reaches
too: run again by no layer unless the handler raised
:class:`~reach_plugins.errors.Retryable`), runs each ``Idempotency-Key``
once, honours ``X-Reach-Deadline``, and reports readiness from a user callback.

Secure by default (DESIGN.md 11.4): every call must carry a token of the Reach
issuer for this agent (``tokens=``, by default this process's in-process issuer),
and a capability needing approval is refused at registration unless the agent has
an ``approver=``. ``tokens="open"`` is the named development mode that verifies
nothing; it logs a warning at start.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

from opentelemetry import propagate, trace
from pydantic import ValidationError

from reach_plugins.agent.approval import ApprovalGate, Approver
from reach_plugins.agent.asgi import build_app
from reach_plugins.agent.faults import failed
from reach_plugins.agent.handlers import CapabilityHandler, ReachContext, dumps, split_media
from reach_plugins.agent.idempotency import IN_PROGRESS_RETRY, Claims, Committed, commit_key, open_key_store, scope
from reach_plugins.agent.outcome import Outcome, fail, refused
from reach_plugins.agent.registration import Registration
from reach_plugins.agent.streamed import StreamedItems
from reach_plugins.agent.tokens import TokenGate, TrustLevel, serving_holding
from reach_plugins.clock import as_clock
from reach_plugins.endpoints import endpoint_problem
from reach_plugins.errors import (
    ApprovalRequired,
    BackendUnavailable,
    Backpressure,
    ConfigError,
    DeadlineExceeded,
    EntryTooLarge,
    IdempotencyConflict,
    NoApprover,
    RateLimited,
    ReachError,
    RequestError,
    UnknownCapability,
    is_retryable,
)
from reach_plugins.media import check_size, digests, parts_from_wire, total_size
from reach_plugins.model import AgentDescriptor, Capability, DangerLevel, ErrorInfo, Hop, Idempotency
from reach_plugins.protocols import encode_sse
from reach_plugins.security.context import Served, serving
from reach_plugins.security.source import default_issuer
from reach_plugins.server.inbound import InputLimits
from reach_plugins.server.layer import ServerApp
from reach_plugins.stores.budget import DEFAULT_BUDGET, Budget
from reach_plugins.stores.sessiontable import MAX_SESSIONS, SessionTable, check_session
from reach_plugins.stores.snapshots import SnapshotStore
from reach_plugins.telemetry.spans import end_server_span, served_span
from reach_plugins.wire.body import WireBody

if TYPE_CHECKING:
    from reach_plugins.registry.base import Registry
    from reach_plugins.security.claims import Claims as TokenClaims
    from reach_plugins.security.verifier import TokenVerifier
    from reach_plugins.stores.dedup import DedupStore

log = logging.getLogger("reach_plugins.agent")
F = TypeVar("F", bound=Callable[..., Any])
Readiness = Callable[[], "bool | Awaitable[bool]"]
OPEN: Final = "open"
"""``ReachAgent(..., tokens="open")``: the development mode that verifies no token (it warns at start)."""


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A checked request, ready to run."""

    handler: CapabilityHandler
    payload: dict[str, Any]
    kwargs: dict[str, Any]
    ctx: ReachContext
    claims: TokenClaims | None
    """The verified token's claims (``None`` in the open mode)."""


def _not_executed(request_id: Any, why: str, kind: str = Backpressure.code) -> Outcome:
    """A retryable "not executed" answer: callers fail over or retry after ``Retry-After`` (DESIGN 11.1)."""
    body = {
        "request_id": request_id,
        "status": "fail",
        "data": None,
        "error": {"type": kind, "message": f"not executed: {why}", "retry_after": IN_PROGRESS_RETRY},
    }
    return Outcome(503, body, {"Retry-After": str(IN_PROGRESS_RETRY)})


def _busy(request_id: Any, handler: CapabilityHandler) -> Outcome:
    """The "not executed" answer of a capability at its ``max_concurrency``: overload (``rate_limited``), so callers
    narrow their window for this instance and go elsewhere or come back after ``Retry-After``; no breaker counts it."""
    seats = handler.seats
    assert seats is not None
    why = f"{handler.capability.name!r} runs at most {seats.limit} calls at once and {seats.queued} more are waiting"
    return _not_executed(request_id, why, RateLimited.code)


def _deadline(headers: Mapping[str, str], body: WireBody) -> float | None:
    """Monotonic deadline from ``X-Reach-Deadline`` (remaining ms), else the body's ``deadline_ms``."""
    raw = headers.get("x-reach-deadline", body.deadline_ms)
    try:
        return None if raw is None else time.monotonic() + float(raw) / 1000
    except (TypeError, ValueError):
        return None


def _tenant(body: WireBody, headers: Mapping[str, str], claims: TokenClaims | None) -> str | None:
    """The caller's tenant: the token's with tokens on, else the body's, else ``X-Tenant``."""
    return claims.tenant if claims is not None else body.tenant or headers.get("x-tenant")


def _token_gate(name: str, tokens: TokenVerifier | str | None, trust: TrustLevel) -> TokenGate | None:
    """The gate of ``tokens`` (this process's issuer by default); ``None`` only in the named open mode."""
    if not isinstance(tokens, str):
        return TokenGate(name, default_issuer().verifier() if tokens is None else tokens, trust)
    if tokens != OPEN:
        raise ConfigError(f"agent {name!r}: tokens={tokens!r}; give a TokenVerifier, or 'open' (verify nothing)")
    if trust != "L2":
        raise ConfigError(
            f"agent {name!r} is {trust}: it verifies every token (tokens='open' is for L2 agents in development)"
        )
    return None


def _public(name: str, url: str) -> str:
    """``url`` when it may be where callers reach agent ``name`` (an http(s) endpoint), else a ConfigError."""
    problem = endpoint_problem(url)
    if problem is None and not url.startswith(("http://", "https://")):
        problem = f"endpoint {url!r}: an agent is served over http or https"
    if problem is not None:
        raise ConfigError(f"agent {name!r}: {problem}")
    return url


class ReachAgent:
    """A Reach agent: capabilities, their handlers, and the ASGI app that serves them.

    ``idempotency_budget=Budget(max_entries=..., max_bytes=...)`` bounds the in-memory idempotency store
    (:data:`~reach_plugins.stores.budget.DEFAULT_BUDGET` by default: 10,000 keys, 64 MiB); a result over it is
    answered but not kept, so a replay of its key is ``outcome_unknown``, never a second run. ``public_url`` is
    the URL callers reach the agent at, published in its A2A card (by default the endpoint it is served or
    registered at, else the address its server is bound to; never the caller's ``Host`` header).
    """

    def __init__(
        self,
        name: str,
        *,
        version: str = "",
        description: str = "",
        namespace: str = "default",
        readiness: Readiness | None = None,
        idempotency: DedupStore | str = "memory://",
        idempotency_window: float = 300.0,
        idempotency_budget: Budget | None = None,
        committed: Committed | None = None,
        snapshots: SnapshotStore | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        clock: Callable[[], float] = time.monotonic,
        approver: Approver | str | None = None,
        limits: InputLimits | None = None,
        max_sessions: int = MAX_SESSIONS,
        tokens: TokenVerifier | Literal["open"] | None = None,
        trust: TrustLevel = "L2",
        public_url: str | None = None,
    ) -> None:
        try:
            AgentDescriptor(name=name)
        except ValidationError as exc:
            raise ConfigError(f"invalid agent name: {exc.errors()[0]['msg']}") from None
        self.name, self.version, self.description, self.namespace = name, version, description, namespace
        self.readiness = readiness
        self.draining = False
        self.limits = limits or InputLimits()
        self.sessions = SessionTable(budget=Budget(max_entries=max_sessions, max_bytes=DEFAULT_BUDGET.max_bytes))
        self.snapshots = snapshots
        self._handlers: dict[str, CapabilityHandler] = {}
        store, self.shared_idempotency = open_key_store(idempotency, clock, idempotency_budget)
        self._window = idempotency_window
        self._claims = Claims(store, window=idempotency_window, clock=as_clock(clock), committed=committed)
        self._tracer = trace.get_tracer("reach_plugins.agent", tracer_provider=tracer_provider)
        self._announce: list[tuple[Registry | str, str, dict[str, Any]]] = []
        self._approval = ApprovalGate(name, approver) if approver is not None else None
        """Asked before a ``danger_level: high`` / ``require_approval`` capability runs (:mod:`.approval`)."""
        self._registrations: list[Registration] = []
        self.trust: TrustLevel = trust
        self._gate = _token_gate(name, tokens, trust)
        """Every call must carry a token of the Reach issuer for this agent, unless started ``tokens="open"``."""
        self.public_url = None if public_url is None else _public(name, public_url)
        """Where callers reach this agent (its A2A card's URLs): ``public_url=``, else where it is served or
        registered (:meth:`served_at`); ``None`` until then, and the card names the address the server is bound to."""

    # ------------------------------------------------------------------ declaring

    def capability(
        self,
        name: str,
        *,
        description: str | None = None,
        params_schema: dict[str, Any] | None = None,
        return_schema: dict[str, Any] | None = None,
        scope_tags: Sequence[str] = (),
        danger_level: DangerLevel = "low",
        require_approval: bool = False,
        idempotency_key: str | None = None,
        retryable: bool = True,
        max_concurrency: int | None = None,
        max_media_bytes: int = 0,
    ) -> Callable[[F], F]:
        """Register the decorated function (sync, async or a generator for streaming) as capability ``name``."""

        def register(fn: F) -> F:
            try:
                capability = Capability(
                    name=name,
                    description=description if description is not None else inspect.getdoc(fn) or "",
                    params_schema=params_schema,
                    return_schema=return_schema,
                    scope_tags=list(scope_tags),
                    danger_level=danger_level,
                    require_approval=require_approval,
                    idempotency_key=idempotency_key,
                    retryable=retryable,
                    max_concurrency=max_concurrency,
                    max_media_bytes=max_media_bytes,
                )
            except ValidationError as exc:
                raise ConfigError(f"invalid capability {name!r}: {exc.errors()[0]['msg']}") from None
            return self._add(capability, fn)

        return register

    def offer(self, capability: Capability) -> Callable[[F], F]:
        """Register the decorated function as ``capability``, declared elsewhere (YAML, a served graph's spec)."""
        return lambda fn: self._add(capability, fn)

    def _add(self, capability: Capability, fn: F) -> F:
        if capability.name in self._handlers:
            raise ConfigError(f"agent {self.name!r} already has a capability {capability.name!r}")
        if capability.needs_approval and self._approval is None:
            raise NoApprover(
                f"capability {capability.name!r} of agent {self.name!r} needs approval (danger_level "
                f"{capability.danger_level!r}, require_approval {capability.require_approval}) and the agent has "
                "no approver: pass ReachAgent(..., approver=callable or webhook URL)"
            )
        self._handlers[capability.name] = CapabilityHandler(capability, fn)
        return fn

    @property
    def capabilities(self) -> list[Capability]:
        return [handler.capability for handler in self._handlers.values()]

    def handler(self, name: str) -> CapabilityHandler:
        """The handler of capability ``name`` (``KeyError`` if none: callers ask for declared names only)."""
        return self._handlers[name]

    def descriptor(self, *endpoints: str) -> AgentDescriptor:
        """The descriptor to register: this agent's capabilities, at ``endpoints`` if given."""
        return AgentDescriptor(
            name=self.name,
            version=self.version,
            description=self.description,
            namespace=self.namespace,
            protocol="reach",
            endpoints=list(endpoints),
            capabilities=self.capabilities,
            idempotency=Idempotency(window=self._window, shared=self.shared_idempotency),
            trust_level=self.trust,
        )

    # ------------------------------------------------------------------ health

    async def is_ready(self) -> bool:
        """Ready to take work: not draining, and the readiness callback (if any) agrees."""
        if self.draining:
            return False
        if self.readiness is None:
            return True
        answer = self.readiness()
        return bool(await answer) if inspect.isawaitable(answer) else bool(answer)

    @property
    def clock_offset(self) -> float | None:
        """Seconds the token issuer's clock is ahead of this agent's, from the last signed token (health reports it)."""
        return None if self._gate is None else self._gate.verifier.clock_offset

    # ------------------------------------------------------------------ serving

    def _context(
        self,
        body: WireBody,
        headers: Mapping[str, str],
        handler: CapabilityHandler,
        claims: TokenClaims | None,
    ) -> ReachContext:
        """The handler's context; the body's media parts are decoded once their size fits the capability's
        ``max_media_bytes`` (``MediaTooLarge`` else)."""
        capability = handler.capability.name
        media = parts_from_wire(body.media, limit=handler.capability.max_media_bytes, capability=capability)
        session_id = body.session_id
        hops = headers.get("x-reach-hops")
        tenant = _tenant(body, headers, claims)
        key = headers.get("idempotency-key") or body.idempotency_key
        return ReachContext(
            request_id=body.request_id or "",
            capability=capability,
            action=body.action,
            session_id=session_id,
            tenant=tenant,
            idempotency_key=key,
            idempotency_scope=commit_key(scope(tenant, self.name, capability, key)) if key else None,
            deadline=_deadline(headers, body),
            hops=tuple(str(Hop.parse(hop)) for hop in hops.split(",") if hop.strip()) if hops else (),
            media=tuple(media),
            headers=headers,
            state=self.sessions.state(tenant, session_id) if session_id else {},
        )

    async def authenticate(self, headers: Mapping[str, str]) -> TokenClaims | None:
        """The caller's token claims (``None`` with tokens off); else the ReachError refusing it (``InvalidToken``,
        ``TokenDenied``, or a verifier that cannot check now), answered with its own status.

        The server layer asks before a byte of the body is read (:func:`~reach_plugins.agent.asgi.build_app`).
        """
        return None if self._gate is None else await self._gate.admit(headers)

    def _prepare(self, body: WireBody, headers: Mapping[str, str], claims: TokenClaims | None) -> Outcome | _Prepared:
        """Check one parsed request: an early :class:`Outcome`, or what is needed to run it."""
        request_id, name = body.request_id, body.capability
        if self.draining:
            return fail(request_id, 503, Backpressure.code, f"agent {self.name!r} is draining", {"Retry-After": "1"})
        handler = self._handlers.get(name)
        if handler is None:
            offered = ", ".join(sorted(self._handlers)) or "nothing"
            return fail(
                request_id,
                UnknownCapability.http_status,
                UnknownCapability.code,
                f"agent {self.name!r} has no capability {name!r}; it offers: {offered}",
            )
        payload = body.payload or {}
        problem = check_session(body.session_id, _tenant(body, headers, claims))
        if problem is not None:
            return refused(request_id, RequestError(problem))
        try:
            ctx = self._context(body, headers, handler, claims)
        except ValueError as exc:
            return refused(request_id, RequestError(f"bad X-Reach-Hops header: {exc}"))
        except (EntryTooLarge, RequestError) as exc:
            return refused(request_id, exc)
        remaining = ctx.remaining()
        if remaining is not None and remaining <= 0:
            return refused(request_id, DeadlineExceeded("the caller's deadline had passed on arrival; not executed"))
        try:
            kwargs = handler.arguments(payload, ctx)
        except ReachError as exc:
            return refused(request_id, exc)
        return _Prepared(handler, payload, kwargs, ctx, claims)

    async def handle(self, body: WireBody, headers: Mapping[str, str], claims: TokenClaims | None) -> Outcome:
        """Answer one ``POST /reach`` body of a caller the server layer admitted (``headers`` with lowercase names).

        A capability declaring ``max_concurrency`` runs that many at once and holds as many more in line; a call
        past them is answered "not executed" (503, ``rate_limited``, Retry-After) before its key is claimed.
        """
        prepared = self._prepare(body, headers, claims)
        if isinstance(prepared, Outcome):
            return prepared
        handler = prepared.handler
        if not await handler.take_seat(prepared.ctx.remaining()):
            return _busy(prepared.ctx.request_id, handler)
        try:
            return await self._handle(prepared, headers)
        finally:
            handler.leave_seat()

    async def _handle(self, prepared: _Prepared, headers: Mapping[str, str]) -> Outcome:
        """Answer inside the SERVER span continuing the caller's trace, and mark the span with how it ended."""
        with self._span(prepared.ctx, headers) as span:
            outcome = await self._answer(prepared)
            served_span(span, outcome.status, outcome.body)
            return outcome

    async def _answer(self, prepared: _Prepared) -> Outcome:
        ctx = prepared.ctx
        if not ctx.idempotency_key:
            return await self._execute(prepared)
        key = scope(ctx.tenant, self.name, ctx.capability, ctx.idempotency_key)
        meant = [prepared.payload, *digests(ctx.media)] if ctx.media else prepared.payload  # unchanged without media
        fingerprint = json.dumps(meant, sort_keys=True, default=str)
        try:
            claimed = await self._claims.run(key, fingerprint, ctx.remaining(), lambda: self._execute(prepared))
        except IdempotencyConflict as exc:
            return refused(ctx.request_id, exc)
        except BackendUnavailable:
            log.warning("idempotency store unreachable; %r not executed", ctx.capability, exc_info=True)
            why = f"agent {self.name!r} cannot check its idempotency key now: its idempotency store is unreachable"
            return _not_executed(ctx.request_id, why, BackendUnavailable.code)
        outcome, replayed = claimed
        if outcome is None:
            return _not_executed(ctx.request_id, "a request with this idempotency key is in progress elsewhere")
        if replayed:
            return Outcome(outcome.status, outcome.body, {**outcome.headers, "Idempotent-Replayed": "true"})
        return outcome

    async def _approve(self, prepared: _Prepared) -> None:
        """Wait for the approver when the capability needs one (raises when it does not approve in time).

        Registration already refuses such a capability without an approver; this refuses it again at call time,
        so it can never run unapproved.
        """
        capability = prepared.handler.capability
        if not capability.needs_approval:
            return
        if self._approval is None:
            raise ApprovalRequired(
                f"{capability.name!r} needs approval and agent {self.name!r} has no approver; nothing was executed"
            )
        await self._approval.check(capability, prepared.ctx, prepared.payload, prepared.claims)

    async def _execute(self, prepared: _Prepared) -> Outcome:
        ctx = prepared.ctx
        deadline = asyncio.timeout(ctx.remaining())
        try:
            await self._approve(prepared)
            with self._serving(ctx):
                async with deadline:
                    data, media = split_media(await prepared.handler.call(prepared.kwargs))
            body = {"request_id": ctx.request_id, "status": "success", "data": data, "error": None}
            if media:
                check_size(total_size(media), prepared.handler.capability.max_media_bytes, ctx.capability)
                body["media"] = [part.to_wire() for part in media]
            return Outcome(200, body)
        except ReachError as exc:
            if is_retryable(exc):  # a transient error of its own reaches: it ran, so a failure (Retryable stays so)
                return refused(ctx.request_id, failed(exc, ctx.capability))
            return fail(ctx.request_id, 200, exc.error_type, exc.message)
        except TimeoutError as exc:
            if not deadline.expired():  # the handler's own timeout: it raised, like any other exception
                return refused(ctx.request_id, failed(exc, ctx.capability))
            return refused(
                ctx.request_id, DeadlineExceeded(f"{ctx.capability!r} did not finish within the caller's deadline")
            )
        except Exception as exc:  # the handler ran and raised: a result (HandlerFailed), never re-run
            return refused(ctx.request_id, failed(exc, ctx.capability))

    async def open_stream(
        self, body: WireBody, headers: Mapping[str, str], claims: TokenClaims | None
    ) -> Outcome | AsyncIterator[bytes]:
        """Answer one ``POST /reach/stream`` body: an early :class:`Outcome`, or the SSE frames to send."""
        prepared = self._prepare(body, headers, claims)
        if isinstance(prepared, Outcome):
            return prepared
        try:
            await self._approve(prepared)
        except ReachError as exc:
            return fail(prepared.ctx.request_id, 200, exc.error_type, exc.message)
        return self._frames(prepared)

    async def _frames(self, prepared: _Prepared) -> AsyncIterator[bytes]:
        ctx = prepared.ctx
        chunks = prepared.handler.chunks(prepared.kwargs, streaming=True)
        span = self._tracer.start_span(
            f"reach.agent {ctx.capability}",
            context=propagate.extract(ctx.headers),
            kind=trace.SpanKind.SERVER,
            attributes={"reach.agent": self.name, "reach.capability": ctx.capability, "reach.stream": True},
        )
        deadline = asyncio.timeout(None)
        items = StreamedItems(prepared.handler.capability)
        try:
            while True:
                deadline = asyncio.timeout(ctx.remaining())
                try:
                    with self._serving(ctx), trace.use_span(span, end_on_exit=False):
                        async with deadline:
                            chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                for frame in items.frames(chunk):
                    yield frame
            yield encode_sse("", "end")
        except ReachError as exc:
            yield self._stream_error(span, failed(exc, ctx.capability) if is_retryable(exc) else exc)
        except TimeoutError as exc:  # the caller's deadline, or the handler's own timeout (it raised, like any other)
            late = DeadlineExceeded("the stream passed the caller's deadline")
            yield self._stream_error(span, late if deadline.expired() else failed(exc, ctx.capability))
        except Exception as exc:
            yield self._stream_error(span, failed(exc, ctx.capability))
        finally:
            await chunks.aclose()
            span.end()

    @staticmethod
    def _stream_error(span: trace.Span, exc: ReachError) -> bytes:
        """The SSE error frame ending a stream with ``exc``, its SERVER span marked failed with the same type."""
        end_server_span(span, "fail", ErrorInfo(type=exc.error_type, message=exc.message))
        return encode_sse(dumps({"type": exc.error_type, "message": exc.message}), "error")

    def _serving(self, ctx: ReachContext) -> AbstractContextManager[Served]:
        """Mark the handler's code as serving this request, so reaches it makes continue the hop chain.

        Streams enter it around each step of the handler only, never across a ``yield`` to the server.
        """
        served = serving(
            self.name,
            ctx.capability,
            hops=ctx.hops,
            session_id=ctx.session_id,
            tenant=ctx.tenant,
            deadline=ctx.deadline,
        )
        return serving_holding(served, ctx.headers) if self._gate is not None else served

    def _span(self, ctx: ReachContext, headers: Mapping[str, str]) -> Any:
        """A server span continuing the caller's trace (``traceparent``)."""
        return self._tracer.start_as_current_span(
            f"reach.agent {ctx.capability}",
            context=propagate.extract(headers),
            kind=trace.SpanKind.SERVER,
            attributes={
                "reach.agent": self.name,
                "reach.capability": ctx.capability,
                "reach.request_id": ctx.request_id,
            },
        )

    # ------------------------------------------------------------------ lifecycle

    def served_at(self, endpoint: str) -> None:
        """Record ``endpoint`` as where callers reach this agent, unless ``public_url=`` or an earlier one named it."""
        if self.public_url is None:
            self.public_url = _public(self.name, endpoint)

    def register_on_startup(self, registry: Registry | str, endpoint: str, **options: Any) -> None:
        """Register in ``registry`` (an object or a URL, see :class:`Registration`) at ``endpoint`` when the app
        starts, deregister when it stops."""
        self.served_at(endpoint)
        self._announce.append((registry, endpoint, options))

    async def register(self, registry: Registry | str, endpoint: str, **options: Any) -> Registration:
        """Register now and keep heartbeats going; ``await registration.stop()`` drains and deregisters."""
        self.served_at(endpoint)
        registration = Registration(self, registry, endpoint, **options)
        await registration.start()
        return registration

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """Restore sessions and register on start; drain, deregister and save sessions on stop."""
        if self._gate is None:
            log.warning(
                "agent %r runs OPEN (tokens='open'): it verifies no token and takes the tenant callers name; "
                "for development only",
                self.name,
            )
        if self.snapshots is not None:
            self.sessions.restore(await self.snapshots.load(self.name))
        self.draining = False
        for registry, endpoint, options in self._announce:
            self._registrations.append(await self.register(registry, endpoint, **options))
        try:
            yield
        finally:
            self.draining = True
            for registration in self._registrations:
                await registration.stop()
            self._registrations.clear()
            if self.snapshots is not None:
                await self.snapshots.save(self.name, self.sessions)

    @cached_property
    def app(self) -> ServerApp:
        """The Starlette app: ``POST /reach``, ``POST /reach/stream``, ``GET /healthz``, ``GET /readyz``, A2A."""
        return build_app(self)
