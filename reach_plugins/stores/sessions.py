"""Session liveness: is this conversation still open? (The seeds' "ghost reach".)

A user closed the window, yet the agent kept calling other agents for minutes.
Every reach with a session id checks the store first: a closed or expired
conversation gets ``SessionClosed`` and nothing is sent, and calls already in
flight for a conversation that closes are cancelled.

A session seen for the first time is opened implicitly; ``touch`` is the
heartbeat that keeps it alive for ``ttl`` seconds; ``close`` ends it for good.

A store shared by several processes also holds each conversation's pin
(:class:`PinStore`: session -> instance, per agent, first writer wins), so
every process routes a conversation to the same instance (DESIGN 11.3).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol, runtime_checkable

from reach_plugins.errors import SessionClosed

Listener = Callable[[str], None]


@runtime_checkable
class SessionStore(Protocol):
    """Liveness of conversations, shared by every process that reaches on their behalf."""

    ttl: float

    async def open(self, session_id: str) -> None: ...

    async def touch(self, session_id: str) -> None: ...

    async def close(self, session_id: str) -> None: ...

    async def is_alive(self, session_id: str) -> bool: ...

    async def check(self, session_id: str) -> None:
        """Open an unknown session, refresh a live one, raise ``SessionClosed`` for a dead one."""
        ...

    def guard(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """Cancel the enclosed work (raising ``SessionClosed``) if the session closes meanwhile."""
        ...

    def on_close(self, listener: Listener) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class PinStore(Protocol):
    """Where each conversation is pinned, per agent; the first process to pin it decides for all."""

    async def claim_pin(self, session_id: str, agent: str, instance_id: str, *, replace: str | None = None) -> str:
        """Pin the session to ``instance_id`` unless a pin is stored (or the stored one is ``replace``); the pin."""
        ...


class InFlight:
    """Tasks running on behalf of each session, cancelled when it closes; shared by every store."""

    def __init__(self) -> None:
        self._tasks: dict[str, set[asyncio.Task[object]]] = {}
        self._cancelled: set[asyncio.Task[object]] = set()

    @asynccontextmanager
    async def guard(self, session_id: str) -> AsyncIterator[None]:
        task = asyncio.current_task()
        if task is None:
            yield
            return
        self._tasks.setdefault(session_id, set()).add(task)
        try:
            yield
        except asyncio.CancelledError:
            if task in self._cancelled:
                raise SessionClosed(
                    f"conversation {session_id!r} was closed while the call was in flight", in_flight=True
                ) from None
            raise
        finally:
            self._cancelled.discard(task)
            tasks = self._tasks.get(session_id)
            if tasks is not None:
                tasks.discard(task)
                if not tasks:
                    del self._tasks[session_id]

    def cancel(self, session_id: str) -> int:
        """Cancel every task in flight for ``session_id``; returns how many."""
        tasks = list(self._tasks.get(session_id, ()))
        for task in tasks:
            self._cancelled.add(task)
            task.get_loop().call_soon_threadsafe(task.cancel)
        return len(tasks)


class MemorySessions:
    """In-process session liveness with TTL, bounded in size; the embedded default."""

    def __init__(self, *, ttl: float = 1800.0, clock: Callable[[], float] | None = None, capacity: int = 100_000):
        self.ttl = ttl
        self._clock = clock or time.time
        self._capacity = capacity
        self._expires: OrderedDict[str, float] = OrderedDict()
        self._closed: OrderedDict[str, float] = OrderedDict()
        self._listeners: list[Listener] = []
        self._inflight = InFlight()
        self._pins: OrderedDict[tuple[str, str], str] = OrderedDict()

    async def claim_pin(self, session_id: str, agent: str, instance_id: str, *, replace: str | None = None) -> str:
        key = (session_id, agent)
        stored = self._pins.get(key)
        if stored is None or stored == replace:
            stored = instance_id
        self._remember(self._pins, key, stored)
        return stored

    async def open(self, session_id: str) -> None:
        self._closed.pop(session_id, None)
        self._remember(self._expires, session_id, self._clock() + self.ttl)

    async def touch(self, session_id: str) -> None:
        await self.check(session_id)

    async def close(self, session_id: str) -> None:
        self._expires.pop(session_id, None)
        for key in [key for key in self._pins if key[0] == session_id]:
            del self._pins[key]
        self._remember(self._closed, session_id, self._clock())
        self._inflight.cancel(session_id)
        for listener in self._listeners:
            listener(session_id)

    async def is_alive(self, session_id: str) -> bool:
        expires = self._expires.get(session_id)
        return expires is not None and expires > self._clock()

    async def check(self, session_id: str) -> None:
        if session_id in self._closed:
            raise SessionClosed(f"conversation {session_id!r} was closed; start a new one to reach agents again")
        expires = self._expires.get(session_id)
        now = self._clock()
        if expires is not None and expires <= now:
            raise SessionClosed(
                f"conversation {session_id!r} expired after {self.ttl:g}s without activity; start a new one"
            )
        self._remember(self._expires, session_id, now + self.ttl)

    def guard(self, session_id: str) -> AbstractAsyncContextManager[None]:
        return self._inflight.guard(session_id)

    def on_close(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def aclose(self) -> None:
        return None

    def _remember(self, table: OrderedDict[Any, Any], session_id: Any, value: Any) -> None:
        table[session_id] = value
        table.move_to_end(session_id)
        while len(table) > self._capacity:
            table.popitem(last=False)
