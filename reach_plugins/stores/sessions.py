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

A conversation is addressed by :func:`session_key` (a
:class:`~reach_plugins.stores.keys.ScopedKey` of the request's tenant): tenant
B naming tenant A's ``session_id`` is another conversation, with its own
liveness and pins. The memory store keeps each conversation (liveness, close
tombstone, pins) as one entry within its :class:`Budget`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Final, Protocol, runtime_checkable

from reach_plugins.errors import SessionClosed
from reach_plugins.stores.budget import BoundedStore, Budget, LruTable
from reach_plugins.stores.keys import DEFAULT_TENANT, ScopedKey

KIND: Final = "session"

Listener = Callable[[ScopedKey], None]
"""Told the key of each conversation that closes."""


def session_key(tenant: str | None, session_id: str) -> ScopedKey:
    """The address of one tenant's conversation (the default tenant's when the request names none)."""
    return ScopedKey(DEFAULT_TENANT if tenant is None else tenant, KIND, session_id)


@runtime_checkable
class SessionStore(Protocol):
    """Liveness of conversations, shared by every process that reaches on their behalf."""

    ttl: float

    async def open(self, key: ScopedKey) -> None: ...

    async def touch(self, key: ScopedKey) -> None: ...

    async def close(self, key: ScopedKey) -> None: ...

    async def is_alive(self, key: ScopedKey) -> bool: ...

    async def check(self, key: ScopedKey) -> None:
        """Open an unknown session, refresh a live one, raise ``SessionClosed`` for a dead one."""
        ...

    def guard(self, key: ScopedKey) -> AbstractAsyncContextManager[None]:
        """Cancel the enclosed work (raising ``SessionClosed``) if the session closes meanwhile."""
        ...

    def on_close(self, listener: Listener) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class PinStore(Protocol):
    """Where each conversation is pinned, per agent; the first process to pin it decides for all."""

    async def claim_pin(self, key: ScopedKey, agent: str, instance_id: str, *, replace: str | None = None) -> str:
        """Pin the session to ``instance_id`` unless a pin is stored (or the stored one is ``replace``); the pin."""
        ...


class InFlight:
    """Tasks running on behalf of each session, cancelled when it closes; shared by every store."""

    def __init__(self) -> None:
        self._tasks: dict[ScopedKey, set[asyncio.Task[object]]] = {}
        self._cancelled: set[asyncio.Task[object]] = set()

    @asynccontextmanager
    async def guard(self, key: ScopedKey) -> AsyncIterator[None]:
        task = asyncio.current_task()
        if task is None:
            yield
            return
        self._tasks.setdefault(key, set()).add(task)
        try:
            yield
        except asyncio.CancelledError:
            if task in self._cancelled:
                raise SessionClosed(
                    f"conversation {key.id!r} was closed while the call was in flight", in_flight=True
                ) from None
            raise
        finally:
            self._cancelled.discard(task)
            tasks = self._tasks.get(key)
            if tasks is not None:
                tasks.discard(task)
                if not tasks:
                    del self._tasks[key]

    def cancel(self, key: ScopedKey) -> int:
        """Cancel every task in flight for the conversation ``key``; returns how many."""
        tasks = list(self._tasks.get(key, ()))
        for task in tasks:
            self._cancelled.add(task)
            task.get_loop().call_soon_threadsafe(task.cancel)
        return len(tasks)


@dataclass(slots=True)
class _Conversation:
    expires: float | None = None
    """When it lapses without a touch; None while unknown (only pinned) or once closed."""
    closed: bool = False
    pins: dict[str, str] = field(default_factory=dict)
    """agent -> instance."""

    def size(self) -> int:
        return 24 + sum(len(agent) + len(instance) for agent, instance in self.pins.items())


class MemorySessions(BoundedStore):
    """In-process session liveness and pins with TTL, one entry per conversation within a :class:`Budget`."""

    def __init__(self, *, budget: Budget, ttl: float = 1800.0, clock: Callable[[], float] | None = None) -> None:
        super().__init__(budget=budget)
        self.ttl = ttl
        self._clock = clock or time.time
        self.table: LruTable[_Conversation] = LruTable(budget, "session")
        self._listeners: list[Listener] = []
        self._inflight = InFlight()

    async def claim_pin(self, key: ScopedKey, agent: str, instance_id: str, *, replace: str | None = None) -> str:
        conversation = self._conversation(key)
        stored = conversation.pins.get(agent)
        if stored is not None and stored != replace:
            self._keep(key, conversation)
            return stored
        pins = {**conversation.pins, agent: instance_id}
        self._keep(key, _Conversation(conversation.expires, conversation.closed, pins))
        return instance_id

    async def open(self, key: ScopedKey) -> None:
        conversation = self._conversation(key)
        conversation.closed, conversation.expires = False, self._clock() + self.ttl
        self._keep(key, conversation)

    async def touch(self, key: ScopedKey) -> None:
        await self.check(key)

    async def close(self, key: ScopedKey) -> None:
        self._keep(key, _Conversation(closed=True))
        self._inflight.cancel(key)
        for listener in self._listeners:
            listener(key)

    async def is_alive(self, key: ScopedKey) -> bool:
        conversation = self.table.peek(key)
        expires = conversation.expires if conversation is not None else None
        return expires is not None and expires > self._clock()

    async def check(self, key: ScopedKey) -> None:
        conversation = self._conversation(key)
        if conversation.closed:
            raise SessionClosed(f"conversation {key.id!r} was closed; start a new one to reach agents again")
        now = self._clock()
        if conversation.expires is not None and conversation.expires <= now:
            raise SessionClosed(
                f"conversation {key.id!r} expired after {self.ttl:g}s without activity; start a new one"
            )
        conversation.expires = now + self.ttl
        self._keep(key, conversation)

    def guard(self, key: ScopedKey) -> AbstractAsyncContextManager[None]:
        return self._inflight.guard(key)

    def on_close(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def aclose(self) -> None:
        return None

    def _conversation(self, key: ScopedKey) -> _Conversation:
        return self.table.peek(key) or _Conversation()

    def _keep(self, key: ScopedKey, conversation: _Conversation) -> None:
        """Store (or refresh) the conversation as the most recently used entry."""
        self.table.put(key, conversation, conversation.size())
