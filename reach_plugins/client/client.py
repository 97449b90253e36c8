"""ReachClient: name a capability, get an answer — route, then the resilience core, then a transport."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from contextlib import aclosing
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, TypedDict, Unpack

from pydantic import ValidationError

from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.attempts.quotas import Quotas, open_quotas
from reach_plugins.client.broadcast import Aggregate, AgreeKey, BroadcastResult, broadcast
from reach_plugins.config.loader import TenantConfig, resolve_credential
from reach_plugins.config.quotas import QuotaConfig
from reach_plugins.errors import ConfigError, InvalidPayload
from reach_plugins.media import MediaPart
from reach_plugins.model import (
    AgentDescriptor,
    Auth,
    Hop,
    LoopSettings,
    Priority,
    ReachRequest,
    ReachResponse,
    ReliefPolicy,
)
from reach_plugins.policy.outliers import Standing
from reach_plugins.registry import Registry, open_registry
from reach_plugins.routing import Router
from reach_plugins.routing.pinning import TargetedRouter
from reach_plugins.routing.probes import Prober
from reach_plugins.routing.route import Route
from reach_plugins.routing.sharedpins import agree_on_pin, follow_failover
from reach_plugins.security.caller import caller_transport
from reach_plugins.stores.sessions import session_key
from reach_plugins.stores.urls import open_sessions, open_store
from reach_plugins.telemetry.trace import TraceSink
from reach_plugins.transport import Credential, StreamEvent, Transport

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from reach_plugins.registry.base import Clock
    from reach_plugins.security.source import TokenSource
    from reach_plugins.stores.dedup import DedupStore
    from reach_plugins.stores.sessions import SessionStore


class ReachOptions(TypedDict, total=False):
    """The keyword options of every call (:meth:`ReachClient.reach`, ``stream``, ``broadcast``, ``request``)."""

    session_id: str | None
    """The conversation: the affinity key, and what ``SessionClosed`` is about."""
    idempotency_key: str | None
    """Same key, same result: a retry or a twin with this key never runs the work twice (README)."""
    timeout_ms: int | None
    """The whole request's budget; every attempt fits inside it."""
    intent: str | None
    action: str | None
    tenant: str | None
    """Overrides the client's tenant for this call."""
    hops: Iterable[Hop | str]
    """The chain already visited (``agent/capability``), for loop detection."""
    priority: Priority
    scope_tags: Iterable[str]
    retried_upstream: bool
    """An upstream layer owns retries: this one sends each attempt once."""
    media: Sequence[MediaPart]
    """Binary parts beside the payload (images, audio, files): :class:`~reach_plugins.media.MediaPart`."""


class BroadcastOptions(ReachOptions, total=False):
    """:class:`ReachOptions` plus how a broadcast aggregates (:mod:`reach_plugins.client.broadcast`)."""

    k: int
    """How many top candidates get a copy (3)."""
    aggregate: Aggregate
    """``first``, ``first_n`` (of ``n``), ``quorum``, ``agree`` (``n`` equal answers) or ``all`` (the default)."""
    n: int | None
    share_summary: bool
    """Later copies carry a summary of the answers already in (seed 004, section 6.2)."""
    stagger: float
    agree: AgreeKey | None


_NO_AUTH = Auth()
_NO_CREDENTIAL = Credential()
"""What an agent without ``auth`` gets from a tenant without its own credential for it: nothing to resolve."""


class ReachClient:
    """Reach any agent by capability, from one event loop.

    ``registry`` and the shared stores are objects or URLs (``memory://``,
    ``file://agents.yaml``, ``etcd://host:port``, ``redis://host:port/db``).
    Without a ``transport`` the client reaches agents directly over HTTP.
    Each direct reach carries a per-hop token for its target (DESIGN.md 11.4)
    from ``tokens`` (``RemoteTokens(issuer_url, bearer=...)``, ``LocalTokens(issuer)``),
    by default from this process's in-process issuer; ``tokens=False`` sends none.
    ``loops`` tunes the dependency-loop alerts (:class:`~reach_plugins.model.LoopSettings`) and ``relief`` the
    hot-spot relief of pinned conversations (:class:`~reach_plugins.model.ReliefPolicy`); both are on by default.
    The client serves the event loop of its first call (its waits, limits and
    pools belong to it); blocking code uses :class:`~reach_plugins.client.blocking.SyncReachClient`,
    which runs a client of its own on a private loop.
    """

    def __init__(
        self,
        registry: Registry | str = "memory://",
        transport: Transport | None = None,
        tenant: str | None = None,
        *,
        store: DedupStore | str | None = None,
        sessions: SessionStore | str | None = None,
        tenants: Mapping[str, TenantConfig] | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        sink: TraceSink | None = None,
        tracer_provider: TracerProvider | None = None,
        default_timeout: float = 30.0,
        environ: Mapping[str, str] | None = None,
        probes: bool = False,
        tokens: TokenSource | Literal[False] | None = None,
        quotas: QuotaConfig | Quotas | None = None,
        loops: LoopSettings | None = None,
        relief: ReliefPolicy | None = None,
    ) -> None:
        self.registry = open_registry(registry, clock=clock)
        self._opened: list[Any] = [self.registry] if isinstance(registry, str) else []
        if transport is None:
            from transports.direct import DirectTransport

            transport = DirectTransport()
        self.transport = transport
        self.tenant = tenant
        self.tenants: Mapping[str, TenantConfig] | None = tenants if tenants is not None else self.registry.tenants
        self.sessions = open_sessions(sessions, clock=clock) if sessions is not None else None
        self.quotas = open_quotas(quotas, clock=clock) if quotas is not None else None
        """Fleet-wide quotas (:mod:`reach_plugins.attempts.quotas`); left to the hop when the transport is one."""
        if isinstance(quotas, QuotaConfig) and self.quotas is not None:
            self._opened.append(self.quotas)
        dedup = open_store(store) if store is not None else None
        self._opened += [
            opened for opened, given in ((self.sessions, sessions), (dedup, store)) if isinstance(given, str)
        ]
        self._environ = environ if environ is not None else os.environ
        self._plain_auth: dict[int, tuple[Auth, bool]] = {}
        self._prober = Prober.shared(self.registry) if probes else None
        """Active health probes (:mod:`reach_plugins.routing.probes`), one prober per registry in the process."""
        self.router = Router(
            self.registry,
            tenants=self.tenants,
            is_available=self._available,
            standing=self._standing,
            clock=clock,
            rng=rng,
            relief=relief,
        )
        self.pipeline = Pipeline(
            router=TargetedRouter(self.router),
            transport=caller_transport(transport, tokens),
            store=dedup,
            clock=clock,
            rng=rng,
            credentials=self._credential,
            sink=sink,
            tracer_provider=tracer_provider,
            default_timeout=default_timeout,
            quotas=self.quotas,
            loops=loops,
            turns=self.router.relief,
        )
        self._loop: asyncio.AbstractEventLoop | None = None

    def _available(self, agent: str, instance_id: str) -> bool:
        """The router's health port: the breaker admits calls, no ejection, and the probes (if on) found it up."""
        probes = self._prober
        return self.pipeline.is_available(agent, instance_id) and (
            probes is None or probes.available(agent, instance_id)
        )

    def _standing(self, agent: str, instance_id: str) -> Standing:
        """The router's outlier port: the instance's share of its weight against its peers (the pipeline judges)."""
        return self.pipeline.standing(agent, instance_id)

    def _credential(self, agent: AgentDescriptor, tenant: str | None) -> Credential:
        config = self.tenants.get(tenant) if self.tenants is not None and tenant is not None else None
        if (config is None or agent.name not in config.credentials) and self._no_auth(agent.auth):
            return _NO_CREDENTIAL
        return resolve_credential(agent, config, self._environ)

    def _no_auth(self, auth: Auth) -> bool:
        """Whether ``auth`` is the empty default; remembered per (immutable) ``Auth`` object, asked every call."""
        known = self._plain_auth.get(id(auth))
        if known is None or known[0] is not auth:
            if len(self._plain_auth) >= 1024:
                self._plain_auth.clear()
            known = self._plain_auth[id(auth)] = (auth, auth == _NO_AUTH)
        return known[1]

    def request(
        self,
        capability: str,
        payload: Mapping[str, Any] | None = None,
        *,
        session_id: str | None = None,
        idempotency_key: str | None = None,
        timeout_ms: int | None = None,
        intent: str | None = None,
        action: str | None = None,
        tenant: str | None = None,
        hops: Iterable[Hop | str] = (),
        priority: Priority = "online",
        scope_tags: Iterable[str] = (),
        retried_upstream: bool = False,
        media: Sequence[MediaPart] = (),
    ) -> ReachRequest:
        """Build the :class:`ReachRequest` that :meth:`reach` would send.

        Only the options given are handed to the model (the rest keep their
        defaults): this runs on every call, and validating unset fields is waste.
        """
        fields: dict[str, Any] = {"capability": capability, "payload": {} if payload is None else payload}
        given = (
            ("action", action),
            ("session_id", session_id),
            ("tenant", tenant if tenant is not None else self.tenant),
            ("intent", intent),
            ("idempotency_key", idempotency_key),
            ("timeout_ms", timeout_ms),
        )
        for name, value in given:
            if value is not None:
                fields[name] = value
        if hops:
            fields["hops"] = [hop if isinstance(hop, Hop) else Hop.parse(hop) for hop in hops]
        if priority != "online":
            fields["priority"] = priority
        if scope_tags:
            fields["scope_tags"] = list(scope_tags)
        if retried_upstream:
            fields["retried_upstream"] = True
        if media:
            fields["media"] = list(media)
        try:
            return ReachRequest(**fields)
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(part) for part in problem["loc"])
            raise InvalidPayload(f"{where}: {problem['msg']}", field=where) from None

    async def send(self, request: ReachRequest, *, trace: bool = False) -> ReachResponse:
        """Send a prepared request through the resilience core (session liveness checked first)."""
        self._check_loop()
        if self.sessions is None or request.session_id is None:
            return await self.pipeline.run(request, trace=trace)
        conversation = session_key(request.tenant, request.session_id)
        await self.sessions.check(conversation)
        agreed = await agree_on_pin(self.router, self.sessions, request)
        async with self.sessions.guard(conversation):
            response = await self.pipeline.run(request, trace=trace, route=agreed)
        await follow_failover(self.router, self.sessions, request, agreed, response)
        return response

    async def reach(
        self,
        capability: str,
        payload: Mapping[str, Any] | None = None,
        *,
        trace: bool = False,
        **options: Unpack[ReachOptions],
    ) -> ReachResponse:
        """Reach ``capability`` with ``payload`` (options: :class:`ReachOptions`).

        Raises a :class:`~reach_plugins.errors.RequestError` or ``NoHealthyAgent``
        when nothing could be sent; otherwise returns the response, whose
        ``status`` says how it went (``raise_for_status()`` turns failure into an error).
        ``trace=True`` attaches the route decision and every attempt.
        """
        return await self.send(self.request(capability, payload, **options), trace=trace)

    async def broadcast(
        self,
        capability: str,
        payload: Mapping[str, Any] | None = None,
        *,
        k: int = 3,
        aggregate: Aggregate = "all",
        n: int | None = None,
        share_summary: bool = False,
        stagger: float = 0.2,
        agree: AgreeKey | None = None,
        **options: Unpack[ReachOptions],
    ) -> BroadcastResult:
        """Reach the top ``k`` candidates of ``capability`` and aggregate (:mod:`reach_plugins.client.broadcast`)."""
        self._check_loop()
        request = self.request(capability, payload, **options)
        return await broadcast(
            self, request, k=k, aggregate=aggregate, n=n, share_summary=share_summary, stagger=stagger, agree=agree
        )

    async def stream(
        self, capability: str, payload: Mapping[str, Any] | None = None, **options: Unpack[ReachOptions]
    ) -> AsyncGenerator[StreamEvent, None]:
        """Stream the answer of ``capability`` event by event."""
        self._check_loop()
        request = self.request(capability, payload, **options)
        if self.sessions is not None and request.session_id is not None:
            await self.sessions.check(session_key(request.tenant, request.session_id))
        async with aclosing(self.pipeline.stream(request)) as events:
            async for event in events:
                yield event

    async def candidates(self, request: ReachRequest, *, limit: int | None = None) -> list[Route]:
        """The healthy instances that could take ``request`` now, best first, without sending anything.

        It asks the router on this client's loop (the router is not thread-safe, 11.8);
        ``NoHealthyAgent`` or a ``RequestError`` says why nobody could.
        """
        self._check_loop()
        return self.router.candidates(request, limit=limit)

    async def close_session(self, session_id: str, tenant: str | None = None) -> None:
        """End conversation ``session_id`` of ``tenant`` (else the client's): later reaches get ``SessionClosed``,
        calls in flight stop, its pins go, and the transport ends what agents keep for it (MCP sessions).

        It runs on this client's loop, beside the calls it cancels.
        """
        self._check_loop()
        if self.sessions is None:
            raise ConfigError("this client has no session store: build the ReachClient with sessions=")
        owner = tenant if tenant is not None else self.tenant
        conversation = session_key(owner, session_id)
        await self.sessions.close(conversation)
        self.router.release(conversation)
        await self.transport.end_session(owner, session_id)

    def _check_loop(self) -> None:
        """Bind the client to the loop of its first call; refuse any other (its waits belong to that loop)."""
        loop = asyncio.get_running_loop()
        if loop is self._loop:  # every call after the first (a running loop is never closed)
            return
        if self._loop is None or self._loop.is_closed():
            self._loop = loop
            if self._prober is not None:
                self._prober.acquire()
        elif loop is not self._loop:
            raise ConfigError(
                "this ReachClient serves another event loop: its waits, limits and pools belong to that loop; "
                "use one client per loop, or reach_plugins.SyncReachClient for blocking code"
            )

    async def aclose(self) -> None:
        """Close the pipeline, the transport's pooled connections, and what this client opened from URLs."""
        if self._prober is not None and self._loop is not None:
            await self._prober.release()
        await self.pipeline.aclose()
        await self.transport.aclose()
        for opened in self._opened:
            await opened.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
