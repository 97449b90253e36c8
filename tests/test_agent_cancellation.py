"""Closing reaches the agent: a conversation closed mid-call stops the handlers still running for it.

A real agent server (uvicorn) runs slow handlers; a client holds 11 calls in
flight for one conversation and closes it. The client cuts its connections,
the agent sees the disconnects: async handlers are cancelled, sync handlers
see ``cancelled()`` turn true. The test counts the handlers still running
one second after the close.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.agent.cancellation import cancelled, while_connected
from reach_plugins.errors import SessionClosed
from reach_plugins.registry.memory import MemoryRegistry
from reach_plugins.stores.budget import DEFAULT_BUDGET
from reach_plugins.stores.sessions import MemorySessions, session_key

IN_FLIGHT = 11
HOLD = 30.0
"""Seconds a handler would run if nobody stopped it."""


class Running:
    """Handlers running now, counted from the agent's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.started = 0

    def __enter__(self) -> None:
        with self._lock:
            self.now += 1
            self.started += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.now -= 1


@pytest.fixture
def served() -> Iterator[tuple[str, Running, ReachAgent]]:
    running = Running()
    agent = ReachAgent("slow")

    @agent.capability("wait_async")
    async def wait_async(n: int) -> int:
        with running:
            await asyncio.sleep(HOLD)
        return n

    @agent.capability("wait_sync")
    def wait_sync(n: int) -> int:
        with running:
            end = time.monotonic() + HOLD
            while time.monotonic() < end and not cancelled():
                time.sleep(0.01)
        return n

    server = BackgroundServer(agent.app).start()
    try:
        yield server.url, running, agent
    finally:
        server.stop()


async def until(condition: Callable[[], bool], within: float) -> None:
    end = time.monotonic() + within
    while not condition():
        assert time.monotonic() < end, f"not reached within {within}s"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("capability", ["wait_async", "wait_sync"])
async def test_closing_a_conversation_stops_its_handlers_at_the_agent(
    capability: str, served: tuple[str, Running, ReachAgent]
) -> None:
    """11 calls in flight, the conversation closes: all raise SessionClosed, 0 handlers run 1 s later."""
    url, running, agent = served
    registry = MemoryRegistry()
    registry.put_agent(agent.descriptor(url))
    async with asyncio.timeout(20), ReachClient(registry, sessions=MemorySessions(budget=DEFAULT_BUDGET)) as client:
        calls = [
            asyncio.create_task(client.reach(capability, {"n": n}, session_id="s-1", timeout_ms=60_000))
            for n in range(IN_FLIGHT)
        ]
        await until(lambda: running.now == IN_FLIGHT, 10)
        assert client.sessions is not None
        await client.sessions.close(session_key(None, "s-1"))
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        closed = time.monotonic()
        await asyncio.sleep(1.0 - (time.monotonic() - closed))
        still_running = running.now
    assert all(isinstance(outcome, SessionClosed) for outcome in outcomes), outcomes
    assert running.started == IN_FLIGHT
    assert still_running == 0


async def test_a_caller_that_gives_up_stops_the_handler(served: tuple[str, Running, ReachAgent]) -> None:
    """A call whose deadline passes at the client (the agent got no deadline) is cut there and stops here."""
    url, running, agent = served
    registry = MemoryRegistry()
    registry.put_agent(agent.descriptor(url))
    async with asyncio.timeout(20), ReachClient(registry) as client:
        call = asyncio.create_task(client.reach("wait_async", {"n": 1}))
        await until(lambda: running.now == 1, 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await until(lambda: running.now == 0, 1.0)


async def test_a_handler_that_never_suspends_is_not_watched() -> None:
    """A handler answering in its first step returns before anything reads the connection for a disconnect."""

    async def receive() -> dict[str, str]:
        raise AssertionError("nothing should watch a handler that answered at once")

    async def work() -> str:
        return "done"

    assert await while_connected(receive, work()) == "done"


async def test_the_handler_runs_in_the_requests_own_task() -> None:
    """No task is spawned for the handler: it runs, suspends and answers in the caller's task."""

    async def receive() -> dict[str, str]:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def work() -> asyncio.Task[object] | None:
        await asyncio.sleep(0)
        return asyncio.current_task()

    assert await while_connected(receive, work()) is asyncio.current_task()


async def test_a_disconnect_while_suspended_cancels_the_handler_and_sets_the_flag() -> None:
    """The disconnect cancels the handler at its await, flags it, and the call answers None; the task lives on."""
    gone = asyncio.Event()
    seen: list[bool] = []

    async def receive() -> dict[str, str]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def work() -> str:
        gone.set()
        try:
            await asyncio.Event().wait()
        finally:
            seen.append(cancelled())
        return "never"

    async with asyncio.timeout(5):
        assert await while_connected(receive, work()) is None
    assert seen == [True]
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the request's own task is not left cancelled
