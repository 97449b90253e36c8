"""DirectTransport: one prepared call, straight to the agent's endpoint over HTTP.

It only moves bytes: the protocol adapter builds the request and normalises
the reply, the wire engine (aiohttp by default, httpx on request) carries it
over one pooled client per agent. It never retries, breaks circuits or
dedups; the resilience core does that for every transport. Work the agent
took without finishing (an A2A task answered at once) is polled within the
attempt's time, and stopped when the caller leaves it (:mod:`.leaving`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
from collections.abc import AsyncIterator, Hashable
from typing import TYPE_CHECKING, Any, Literal

from reach_plugins.errors import (
    ConfigError,
    ConnectError,
    ConnectionLost,
    InvalidResponse,
    ReachError,
    ReadTimeout,
    SessionClosed,
    TransportError,
)
from reach_plugins.model import Timeouts
from reach_plugins.protocols import (
    Adapter,
    Exchange,
    HttpRequest,
    HttpResponse,
    SseDecoder,
    SseEvent,
    StreamDecoder,
    adapter_for,
    decoded,
)
from reach_plugins.protocols.base import Pending
from reach_plugins.telemetry.spans import note_http_request, note_http_status
from reach_plugins.transport import BaseTransport, Call, EventStream, Reply, StreamEvent
from reach_plugins.wire.body import MAX_REPLY
from transports.direct.auth import tls_context, tls_identity, with_credential
from transports.direct.engine import Engine, EngineName, WireStream, make_engine, wrap_client
from transports.direct.leaving import Leaving, best_effort

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger("reach_plugins.transports.direct")
FAREWELL_SECONDS = 2.0
"""How long a closing transport waits for each agent to acknowledge the end of a conversation."""


CONNECT_SHARE = 0.95
"""The most of an attempt's time its connect may take: the connect phase ends strictly before the attempt's own
timers, so a connect that never completes is reported as one (``ConnectError``, not delivered, fail over at once)
rather than as an attempt timeout (outcome unknown)."""
FIRST_POLL = 0.002
"""Seconds before the first poll of pending work; each later wait is :data:`POLL_GROWTH` times longer, up to
:data:`LAST_POLL` (a task of a few milliseconds is seen done within about one poll's worth of its end; a long one
costs about one GetTask a second)."""
POLL_GROWTH = 1.5
LAST_POLL = 1.0


def _connect_timeout(call: Call) -> float:
    """The agent's connect timeout, overridden by the capability's when it sets one, within the attempt's time."""
    agent: Timeouts = call.agent.timeouts
    own = call.capability.timeouts if call.capability else None
    connect = own.connect if own is not None and "connect" in own.model_fields_set else agent.connect
    return min(connect, call.timeout * CONNECT_SHARE)


class DirectTransport(BaseTransport):
    """HTTP straight to agents, speaking their protocol (reach, openai-compatible, raw-http, a2a, mcp).

    ``engine="aiohttp"`` (default) or ``"httpx"``; passing ``client`` (an
    ``httpx.AsyncClient``) selects httpx with the caller's pool and settings.
    ``http2=True`` needs the httpx engine and the ``h2`` package.
    """

    owns_retries = False

    def __init__(
        self,
        *,
        engine: Literal["aiohttp", "httpx"] = "aiohttp",
        client: httpx.AsyncClient | None = None,
        http2: bool = False,
    ) -> None:
        if engine not in ("aiohttp", "httpx"):
            raise ConfigError(f"unknown engine {engine!r}: use 'aiohttp' (default) or 'httpx'")
        self.engine: EngineName = "httpx" if client is not None else engine
        if http2 and self.engine != "httpx":
            raise ConfigError("HTTP/2 needs the httpx engine: DirectTransport(engine='httpx', http2=True)")
        if http2 and client is None and importlib.util.find_spec("h2") is None:
            raise ImportError('HTTP/2 needs the h2 package: pip install "reach-plugins[http2]"')
        self._http2 = http2
        self._shared = wrap_client(client) if client is not None else None
        self._engines: dict[Hashable, tuple[asyncio.AbstractEventLoop, Engine]] = {}
        self._discovered: dict[tuple[str, str], Any] = {}
        self._leaving = Leaving()
        self._adapters: dict[str, Adapter] = {}
        """This transport's own adapters: what they keep (MCP sessions, tokens) belongs to it, and ends with it."""

    def _adapter(self, protocol: str) -> Adapter:
        adapter = self._adapters.get(protocol)
        if adapter is None:
            adapter = self._adapters[protocol] = type(adapter_for(protocol))()
        return adapter

    def _engine_for(self, call: Call) -> Engine:
        identity = tls_identity(call.credential) if call.credential.type == "cert" else None
        if self._shared is not None:
            if identity is not None:
                raise ConfigError(
                    "a 'cert' credential cannot be applied to a caller's httpx client: configure the client's "
                    "certificate yourself, or let DirectTransport build its clients"
                )
            return self._shared
        pool = call.agent.pool
        loop = asyncio.get_running_loop()
        key = (id(loop), call.agent.name, pool.max_conns, pool.idle_timeout, identity)
        known = self._engines.get(key)
        if known is None or known[0] is not loop:
            tls = tls_context(*identity) if identity else None
            known = self._engines[key] = (loop, make_engine(self.engine, pool, tls, http2=self._http2))
        return known[1]

    async def _discover(self, adapter: Adapter, engine: Engine, call: Call, request: HttpRequest) -> Any:
        """Run the adapter's discovery ``request`` once per endpoint (an A2A agent card); cache what it teaches."""
        key = (adapter.protocol, call.instance.endpoint)
        if key not in self._discovered:
            connect = _connect_timeout(call)
            response = await engine.send(
                with_credential(request, call.credential), timeout=call.timeout, connect_timeout=connect
            )
            self._discovered[key] = adapter.discovered(call, response)
        return self._discovered[key]

    async def _handshake(self, adapter: Adapter, engine: Engine, call: Call) -> None:
        """Send the requests the adapter needs answered before this call (an MCP session's opening), in order."""
        connect = _connect_timeout(call)
        while (request := adapter.handshake(call)) is not None:
            response = await engine.send(
                with_credential(request, call.credential), timeout=call.timeout, connect_timeout=connect
            )
            adapter.handshaken(call, response)

    async def _prepare(self, adapter: Adapter, engine: Engine, call: Call, *, stream: bool) -> HttpRequest:
        """The request for ``call``, after discovery and handshake if the protocol needs them, with the credential."""
        discovery = adapter.discovery(call)
        discovered = None if discovery is None else await self._discover(adapter, engine, call, discovery)
        await self._handshake(adapter, engine, call)
        return with_credential(adapter.build(call, stream=stream, discovered=discovered), call.credential)

    async def send(self, call: Call) -> Reply:
        adapter = self._adapter(call.agent.protocol)
        engine = self._engine_for(call)
        discovery = adapter.discovery(call)
        discovered = None
        timeout = call.timeout
        loop = asyncio.get_running_loop()
        began = loop.time()
        if discovery is not None:
            discovered = await self._discover(adapter, engine, call, discovery)
        await self._handshake(adapter, engine, call)
        timeout -= loop.time() - began
        if timeout <= 0:
            raise ReadTimeout(f"discovering {call.instance.endpoint} used up the attempt's time")
        request = with_credential(adapter.build(call, stream=False, discovered=discovered), call.credential)
        connect = min(_connect_timeout(call), timeout)
        note_http_request(call.span, request.method, request.url)
        response = await _answer(adapter, engine, call, request, timeout, connect)
        if adapter.renegotiate(call, response):
            await self._handshake(adapter, engine, call)
            timeout = began + call.timeout - loop.time()  # the resend gets what is left of the attempt's time
            if timeout <= 0:
                raise ReadTimeout(f"renegotiating with {call.instance.endpoint} used up the attempt's time")
            request = with_credential(adapter.build(call, stream=False, discovered=discovered), call.credential)
            connect = min(connect, timeout)
            response = await _answer(adapter, engine, call, request, timeout, connect)
        pending = adapter.pending(call, request, response)
        if pending is not None:
            response = await self._follow(adapter, engine, call, pending, began + call.timeout)
        note_http_status(call.span, response.status)
        return adapter.parse(call, response)

    async def _follow(
        self, adapter: Adapter, engine: Engine, call: Call, pending: Pending, deadline: float
    ) -> HttpResponse:
        """Poll ``pending`` until the agent answers, by ``deadline`` (loop time); stop it if we leave without one."""
        loop = asyncio.get_running_loop()
        key = self._leaving.hold(engine, lambda: pending.stop)
        wait = FIRST_POLL
        try:
            while (remaining := deadline - loop.time()) > 0:
                await asyncio.sleep(min(wait, remaining))
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                if not self._leaving.holds(key):  # the client closed: the work was stopped, the call ends here
                    raise SessionClosed(
                        f"the client was closed while instance {call.instance.instance_id} was still working on the "
                        "call; it was asked to stop",
                        in_flight=True,
                    )
                connect = min(_connect_timeout(call), remaining)
                try:
                    response = await engine.send(pending.poll, timeout=remaining, connect_timeout=connect)
                except ConnectError as exc:  # the poll was not delivered, the work was: its outcome is unknown
                    raise ConnectionLost(f"the agent took the work, then could not be polled: {exc.message}") from exc
                if adapter.pending(call, pending.poll, response) is None:
                    self._leaving.done(key)
                    return response
                wait = min(wait * POLL_GROWTH, LAST_POLL)
            raise ReadTimeout(
                f"instance {call.instance.instance_id} took the work but did not finish it within the attempt's "
                f"{call.timeout:g} s (polled until then; asked it to stop)"
            )
        finally:
            self._leaving.leave(key)

    async def stream(self, call: Call) -> EventStream:
        """Stream events; failures before the first event raise (retryable), later ones end with an error event."""
        adapter = self._adapter(call.agent.protocol)
        decoder = adapter.decoder(call)
        exchange = adapter.exchange(call) if decoder is None else None
        if exchange is not None:
            engine = self._engine_for(call)
            request = await self._prepare(adapter, engine, call, stream=True)
            async for event in _converse(engine, exchange, request, call.timeout, _connect_timeout(call)):
                yield event
            for event in _reply_events(adapter.parse(call, exchange.response())):
                yield event
            return
        if decoder is None:
            async for event in super().stream(call):
                yield event
            return
        engine = self._engine_for(call)
        request = await self._prepare(adapter, engine, call, stream=True)
        connect = _connect_timeout(call)
        note_http_request(call.span, request.method, request.url)
        async with engine.stream(request, timeout=call.timeout, connect_timeout=connect) as wire:
            note_http_status(call.span, wire.status)
            content_type = wire.headers.get("Content-Type") or wire.headers.get("content-type") or ""
            if not (200 <= wire.status < 300 and content_type.startswith("text/event-stream")):
                reply = adapter.parse(call, HttpResponse(wire.status, wire.headers, await wire.read()))
                for event in _reply_events(reply):
                    yield event
                return
            key = self._leaving.hold(engine, lambda: decoder.abandoned(request))
            try:
                async for event in _events(wire, decoder):
                    if event.last:
                        self._leaving.done(key)
                    yield event
            finally:
                self._leaving.leave(key)  # the caller left before the end: the far side stops (A2A's CancelTask)

    async def end_session(self, tenant: str | None, session_id: str) -> None:
        """A conversation closed: ask the agents to drop what they keep for it (MCP's DELETE), best effort."""
        await self._farewell((tenant, session_id))

    async def _farewell(self, conversation: tuple[str | None, str] | None) -> None:
        here = asyncio.get_running_loop()
        engine = next((engine for loop, engine in self._engines.values() if loop is here), self._shared)
        requests = [request for adapter in self._adapters.values() for request in adapter.farewell(conversation)]
        if engine is None or not requests:
            return
        await asyncio.gather(*(best_effort(engine, request, FAREWELL_SECONDS) for request in requests))

    async def aclose(self) -> None:
        """End the conversations the agents keep (MCP sessions), then close every pool: on this loop directly, on
        another running loop by handing it the close.

        Pools are per event loop (a connection belongs to the loop that opened it), so one
        transport serves a framework's async calls and its blocking ones (run on a private loop).
        """
        await self._farewell(None)
        here = asyncio.get_running_loop()
        for loop in self._leaving.loops():  # stop work callers left, before the pools that would carry it close
            if loop is here:
                await self._leaving.flush()
            elif loop.is_running():
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._leaving.flush(), loop))
        engines, self._engines = list(self._engines.values()), {}
        for loop, engine in engines:
            if loop is here:
                await engine.aclose()
            elif loop.is_running():
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(engine.aclose(), loop))
        if self._shared is not None:
            await self._shared.aclose()


async def _answer(
    adapter: Adapter, engine: Engine, call: Call, request: HttpRequest, timeout: float, connect: float
) -> HttpResponse:
    """The answer to ``request``: its body, or what the adapter's exchange made of an event stream."""
    exchange = adapter.exchange(call)
    if exchange is None:
        return await engine.send(request, timeout=timeout, connect_timeout=connect)
    async for _ in _converse(engine, exchange, request, timeout, connect):
        pass  # progress matters only to a caller that streams
    return exchange.response()


async def _converse(
    engine: Engine, exchange: Exchange, request: HttpRequest, timeout: float, connect: float
) -> AsyncIterator[StreamEvent]:
    """Read an event-stream answer through ``exchange``: send what it asks, reconnect where and when it says (within
    ``timeout``); yield its progress events."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + timeout
    listening = exchange.listen()
    listener = None
    if listening is not None:
        opened = asyncio.Event()
        listener = asyncio.create_task(_listen(engine, exchange, listening, opened, timeout, connect))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(opened.wait(), min(connect, ends - loop.time()))  # before the call, or missed
    try:
        while True:
            sse = SseDecoder()
            async with engine.stream(request, timeout=ends - loop.time(), connect_timeout=connect) as wire:
                content_type = wire.headers.get("Content-Type") or wire.headers.get("content-type") or ""
                if not (200 <= wire.status < 300 and content_type.startswith("text/event-stream")):
                    exchange.whole(HttpResponse(wire.status, wire.headers, await _whole(wire)))
                    return
                while not exchange.done() and (chunk := await wire.next_chunk()):
                    for frame in sse.feed(chunk):
                        await _answer_all(engine, exchange.feed(frame), ends - loop.time(), connect)
                    for event in exchange.progress():
                        yield event
            follow = None if exchange.done() else exchange.resume(sse.retry)
            if follow is None or loop.time() + follow[1] >= ends:
                return
            request = follow[0]
            await asyncio.sleep(follow[1])  # the server's retry field: a reconnection sooner is refused by spec
    finally:
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener


async def _whole(wire: WireStream) -> bytes:
    """A streamed reply's whole body, refused past :data:`MAX_REPLY` bytes (as ``engine.send`` refuses it)."""
    body = bytearray()
    while chunk := await wire.next_chunk():
        body += chunk
        if len(body) > MAX_REPLY:
            raise InvalidResponse(f"the agent's reply is over {MAX_REPLY} bytes, the most accepted")
    return bytes(body)


async def _answer_all(engine: Engine, answers: list[HttpRequest], timeout: float, connect: float) -> None:
    for answer in answers:
        await engine.send(answer, timeout=max(0.0, timeout), connect_timeout=connect)


async def _listen(
    engine: Engine, exchange: Exchange, request: HttpRequest, opened: asyncio.Event, timeout: float, connect: float
) -> None:
    """Read the stream beside the answer's (what the server asks meanwhile) until cancelled; best effort."""
    try:
        async with engine.stream(request, timeout=timeout, connect_timeout=connect) as wire:
            opened.set()
            content_type = wire.headers.get("Content-Type") or wire.headers.get("content-type") or ""
            if not (200 <= wire.status < 300 and content_type.startswith("text/event-stream")):
                return  # the server offers no such stream (405): nothing to hear
            sse = SseDecoder()
            while chunk := await wire.next_chunk():
                for frame in sse.feed(chunk):
                    # its event ids are its own: the answer's stream resumes from the answer's ids only
                    await _answer_all(engine, exchange.feed(SseEvent(frame.event, frame.data)), timeout, connect)
    except (ReachError, OSError) as exc:
        logger.info("the side stream %s ended: %s", request.url, exc)
    finally:
        opened.set()


def _reply_events(reply: Reply) -> list[StreamEvent]:
    """A whole (non-SSE) reply as stream events."""
    if reply.status == "success":
        return [StreamEvent("data", reply.data), StreamEvent("end")]
    return [StreamEvent("error", error=reply.error)]


async def _events(wire: WireStream, decoder: StreamDecoder) -> AsyncIterator[StreamEvent]:
    """Decode SSE from ``wire`` until the end or an error; how long to wait for each event is the core's to bound."""
    sse = SseDecoder()
    started = False
    while True:
        try:
            chunk = await wire.next_chunk()
            for event in decoded(decoder, sse.feed(chunk) if chunk else (), closing=not chunk):
                started = True
                yield event
                if event.last:
                    return
        except (TransportError, InvalidResponse) as exc:
            if not started:
                raise
            yield StreamEvent.failed(exc)
            return
        if not chunk:
            return
