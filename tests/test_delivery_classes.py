"""What reached the agent, over real sockets: not delivered (fail over at once) versus unknown (sent, answer lost).

Each listener is a plain socket on loopback misbehaving one way: a closed port,
a full accept queue (SYN dropped: the connect never completes), a listener
that accepts and resets before reading, one that accepts and never answers.
Both wire engines must name each the same (STYLE 18).
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import struct
import threading
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
from transport_conformance import closed_port, make_call

from reach_plugins.errors import ConnectError, ConnectionLost, ReadTimeout, TransportError
from reach_plugins.model import PoolConfig, Timeouts
from reach_plugins.policy.classify import classify_exception
from reach_plugins.protocols import HttpRequest
from reach_plugins.transport import Call
from transports.direct import DirectTransport
from transports.direct.boundary import mapped

ENGINES = ["aiohttp", "httpx"]
BIG = "x" * (32 << 20)
"""A payload far larger than loopback's socket buffers: it cannot all be handed to the kernel before a reset."""


@pytest.fixture(params=ENGINES)
async def transport(request: pytest.FixtureRequest) -> AsyncIterator[DirectTransport]:
    async with DirectTransport(engine=request.param) as made:
        yield made


@contextlib.contextmanager
def listener(behaviour: str) -> Iterator[int]:
    """A loopback listener that ``reset``s each connection before reading, or ``hold``s it open unanswered."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if behaviour == "reset":
                stop.wait(0.05)  # after the client's connect completed, before reading a byte
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
            else:
                held.append(conn)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()
        for conn in held:
            conn.close()


@contextlib.contextmanager
def full_accept_queue() -> Iterator[int]:
    """A listener that never accepts, its accept queue filled: the kernel drops further SYNs (connect hangs)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers: list[socket.socket] = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        server.close()


def call_to(port: int, *, timeout: float, connect: float = 1.0, payload: str = "hi") -> Call:
    """A call to ``127.0.0.1:port`` with the agent's connect timeout set to ``connect``."""
    call = make_call(f"http://127.0.0.1:{port}", "echo", {"text": payload}, timeout=timeout, pool=PoolConfig())
    return dataclasses.replace(call, agent=call.agent.model_copy(update={"timeouts": Timeouts(connect=connect)}))


async def outcome(transport: DirectTransport, call: Call) -> TransportError:
    with pytest.raises(TransportError) as caught:
        await transport.send(call)
    return caught.value


async def test_closed_port_is_not_delivered(transport: DirectTransport) -> None:
    """A refused connect is ConnectError: the agent never saw the request, the core fails over at once."""
    error = await outcome(transport, call_to(closed_port(), timeout=2.0))
    assert isinstance(error, ConnectError)
    assert classify_exception(error).stage == "not_delivered"


async def test_connect_that_never_completes_is_not_delivered_even_at_the_attempts_end(
    transport: DirectTransport,
) -> None:
    """A connect still pending when the attempt's time runs out is a connect failure, never an unknown outcome."""
    with full_accept_queue() as port:
        error = await outcome(transport, call_to(port, timeout=0.5, connect=5.0))
    assert isinstance(error, ConnectError), repr(error)
    assert error.reached_agent is False
    assert classify_exception(error).stage == "not_delivered"


async def test_reset_before_the_request_was_written_is_not_delivered(transport: DirectTransport) -> None:
    """A listener that resets before reading a request too large to hand over whole: the agent cannot have run it."""
    with listener("reset") as port:
        error = await outcome(transport, call_to(port, timeout=10.0, payload=BIG))
    assert isinstance(error, ConnectError), repr(error)
    assert "written" in str(error)
    assert classify_exception(error).stage == "not_delivered"


async def test_reset_after_the_request_was_written_is_unknown(transport: DirectTransport) -> None:
    """A small request handed to the kernel whole, then reset: it may have been read, so the outcome is unknown."""
    with listener("reset") as port:
        error = await outcome(transport, call_to(port, timeout=2.0))
    assert isinstance(error, ConnectionLost), repr(error)
    assert error.reached_agent is True
    assert classify_exception(error).stage == "unknown"


async def test_accepted_and_never_answered_is_unknown(transport: DirectTransport) -> None:
    """A blackhole that accepts and never answers: the request was written, so the outcome is unknown."""
    with listener("hold") as port:
        error = await outcome(transport, call_to(port, timeout=0.3))
    assert isinstance(error, ReadTimeout), repr(error)
    assert classify_exception(error).stage == "unknown"


def test_aiohttp_write_failures_map_to_not_delivered() -> None:
    """aiohttp's wrapped write failure (a reset transport) is ConnectError; a disconnect while reading is not."""
    request = HttpRequest("POST", "http://127.0.0.1:9/reach", {}, b"{}")
    cause = aiohttp.ClientConnectionResetError("Cannot write to closing transport")
    wrapped = aiohttp.ClientOSError(104, "Can not write request body for http://127.0.0.1:9/reach")
    wrapped.__cause__ = cause
    assert isinstance(mapped(wrapped, request), ConnectError)
    assert isinstance(mapped(cause, request), ConnectError)
    assert isinstance(mapped(aiohttp.ServerDisconnectedError(), request), ConnectionLost)
    assert isinstance(mapped(aiohttp.ClientOSError(104, "Connection reset by peer"), request), ConnectionLost)
