"""Where idempotency claims live: the :class:`DedupStore` interface and the in-memory store.

A claim is addressed by a :class:`~reach_plugins.stores.keys.ScopedKey`
(tenant, ``"dedup"``, capability and key: :func:`store_key`), so one tenant's
key never answers another's request. The claim lifecycle itself is the table
``reach_plugins.policy.dedup.CLAIM_TRANSITIONS``; every store judges expiry
by the clock it is given (tests move a fake one) and passes
``tests/dedup_store_conformance.py``. A stored response larger than the
store's byte bound is refused with :class:`EntryTooLarge`, and its key is
left ``unknown`` for the window: the call ran, so a twin must not run it
again unguarded (the pipeline still returns the response to its caller).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Final, Literal, Protocol, runtime_checkable

from reach_plugins.clock import Clock, SystemClock
from reach_plugins.errors import EntryTooLarge, IdempotencyConflict
from reach_plugins.model import ReachRequest, ReachResponse
from reach_plugins.policy.dedup import ClaimState
from reach_plugins.stores.budget import BoundedStore, Budget, LruTable, json_size
from reach_plugins.stores.keys import SEP, ScopedKey

KIND: Final = "dedup"


def store_key(request: ReachRequest, key: str) -> ScopedKey:
    """The claim's address: the request's tenant, its capability and the key (another tenant's never matches)."""
    return ScopedKey.of(request.tenant, KIND, f"{request.capability}{SEP}{key}")


def shown(key: ScopedKey) -> str:
    """The caller's own key, for messages."""
    return key.id.rpartition(SEP)[2]


def conflict(key: ScopedKey) -> IdempotencyConflict:
    """The error for a key reused with another payload."""
    return IdempotencyConflict(
        f"idempotency key {shown(key)!r} was already used with a different payload; "
        "use a new key for a different request"
    )


def too_large(key: ScopedKey, size: int, limit: int) -> EntryTooLarge:
    """The error for a response over the store's byte bound (its key is then kept ``unknown``)."""
    return EntryTooLarge(
        f"the response to idempotency key {shown(key)!r} is {size} bytes, over the dedup store's max_bytes={limit}; "
        "it ran but cannot be replayed (its key stays unknown for the window): return less data or raise the bound"
    )


@dataclass(frozen=True, slots=True)
class Begin:
    """Answer of ``begin``.

    ``new``: you own the key, run it. ``inflight``: someone else is running it (wait). ``done``: here is the
    result. ``unknown``: you own the key now, but an earlier attempt may have run it at ``where``
    (``agent/instance``, None if not known): send only where the key is checked, else end ``OutcomeUnknown``.
    """

    state: Literal["new", "inflight", "done", "unknown"]
    result: ReachResponse | None = None
    where: str | None = None


@runtime_checkable
class DedupStore(Protocol):
    """Where idempotency keys live; memory by default, Redis when processes share work."""

    async def begin(
        self, key: ScopedKey, payload_hash: str, ttl: float, *, window: float | None = None, where: str | None = None
    ) -> Begin:
        """Claim ``key`` with a lease of ``ttl`` seconds (results then kept ``window``, default ``ttl``).

        ``where`` (``agent/instance``) is where the owner sends first. Raise IdempotencyConflict if the key
        is held for another payload.
        """
        ...

    async def complete(self, key: ScopedKey, response: ReachResponse) -> None:
        """Store the successful response of the claim; duplicates get it until the window ends.

        Raises EntryTooLarge (leaving the key ``unknown``) when the response is over the store's byte bound.
        """
        ...

    async def unknown(self, key: ScopedKey, where: str | None) -> None:
        """The owner sent it and lost the answer at ``where``: keep the key ``unknown`` for the window."""
        ...

    async def sent(self, key: ScopedKey, where: str) -> None:
        """The owner is sending it to ``where`` (not where it first said): an heir must ask there."""
        ...

    async def fail(self, key: ScopedKey) -> None:
        """Drop the claim without a result: the next request with this key runs."""
        ...

    async def wait(self, key: ScopedKey, timeout: float) -> ReachResponse | None:
        """The stored response once the in-flight claim completes; None if it failed, vanished or timed out."""
        ...

    async def aclose(self) -> None: ...


_CLAIM_BYTES: Final = 128
"""Estimated bytes of a claim without its response (hash, times, state, where)."""


@dataclass(slots=True)
class _Entry:
    payload_hash: str
    window: float
    expires_at: float
    """End of the lease while ``in_flight``; end of the window once ``done`` or ``unknown``."""
    window_end: float
    state: ClaimState = "in_flight"
    where: str | None = None
    result: ReachResponse | None = None
    settled: asyncio.Event | None = None
    """Created by the first waiter only: most keys are never waited on."""

    def settle(self) -> None:
        if self.settled is not None:
            self.settled.set()
            self.settled = None


class MemoryDedupStore(BoundedStore):
    """In-process store within its :class:`Budget` (least recently used first out) and each entry's TTL."""

    def __init__(self, *, budget: Budget, clock: Clock | None = None) -> None:
        super().__init__(budget=budget)
        self._clock = clock or SystemClock()
        self.table: LruTable[_Entry] = LruTable(budget, "dedup", lambda _key, entry: entry.settle())

    def __len__(self) -> int:
        return len(self.table)

    async def begin(
        self, key: ScopedKey, payload_hash: str, ttl: float, *, window: float | None = None, where: str | None = None
    ) -> Begin:
        now = self._clock.now()
        entry = self._live(key, now)
        if entry is not None:
            if entry.payload_hash != payload_hash:
                raise conflict(key)
            if entry.state == "done":
                return Begin("done", entry.result)
            if entry.state == "in_flight":
                return Begin("inflight")
            entry.state, entry.expires_at = "in_flight", now + ttl
            return Begin("unknown", where=entry.where)
        self._drop_expired(now)
        span = ttl if window is None else max(window, ttl)
        self.table.put(key, _Entry(payload_hash, span, now + ttl, now + span, where=where), _CLAIM_BYTES)
        return Begin("new")

    async def complete(self, key: ScopedKey, response: ReachResponse) -> None:
        entry = self.table.peek(key)
        if entry is None:
            return
        size = _CLAIM_BYTES + json_size(response)
        if len(key.encode()) + size > self.budget.max_bytes:
            await self.unknown(key, None)
            raise too_large(key, size, self.budget.max_bytes)
        entry.state, entry.result = "done", response
        entry.expires_at = self._clock.now() + entry.window
        self.table.put(key, entry, size)
        entry.settle()

    async def unknown(self, key: ScopedKey, where: str | None) -> None:
        entry = self.table.peek(key)
        if entry is None:
            return
        entry.state, entry.where, entry.expires_at = "unknown", where or entry.where, entry.window_end
        entry.settle()

    async def sent(self, key: ScopedKey, where: str) -> None:
        entry = self.table.peek(key)
        if entry is not None and entry.state == "in_flight":
            entry.where = where

    async def fail(self, key: ScopedKey) -> None:
        entry = self.table.pop(key)
        if entry is not None:
            entry.settle()

    async def wait(self, key: ScopedKey, timeout: float) -> ReachResponse | None:
        clock = self._clock
        entry = self._live(key, clock.now())
        if entry is None or entry.state != "in_flight":
            return entry.result if entry else None
        if entry.settled is None:
            entry.settled = asyncio.Event()
        settled = entry.settled
        try:
            async with clock.timeout_at(min(clock.now() + timeout, entry.expires_at)):
                await settled.wait()
        except TimeoutError:
            return None
        return entry.result

    async def aclose(self) -> None:
        for entry in self.table.values():
            entry.settle()
        self.table.clear()

    def _live(self, key: ScopedKey, now: float) -> _Entry | None:
        """The key's entry after applying expiry: a lapsed lease turns ``unknown``, a lapsed window frees it."""
        entry = self.table.peek(key)
        if entry is None or entry.expires_at > now:
            return entry
        if entry.state == "in_flight" and entry.window_end > now:
            entry.state, entry.expires_at = "unknown", entry.window_end
            entry.settle()
            return entry
        self.table.pop(key)
        entry.settle()
        return None

    def _drop_expired(self, now: float) -> None:
        """Expired windows leave first (from the oldest), so live keys keep their room."""
        while (oldest := self.table.oldest()) is not None and oldest[1].window_end <= now:
            self.table.pop(oldest[0])
            oldest[1].settle()
