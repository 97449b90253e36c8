"""Agent-side idempotency: the same ``Idempotency-Key`` gets the stored result, not a second execution.

A duplicate that arrives while the first is still running waits for it
(single flight). Results are kept for ``window`` seconds, at most
``max_entries`` of them; failures that a retry may cure (5xx) are not kept,
so the retry executes again.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from reach_plugins.errors import IdempotencyConflict

T = TypeVar("T")


@dataclass(slots=True)
class _Entry(Generic[T]):
    fingerprint: str
    result: asyncio.Future[T | None]
    """Resolves to the result, or to ``None`` when the first execution raised (a waiter then runs itself)."""
    expires_at: float


class IdempotencyCache(Generic[T]):
    """Results by key, with single flight for duplicates in progress and a time window."""

    def __init__(
        self,
        *,
        window: float = 300.0,
        max_entries: int = 10_000,
        keep: Callable[[T], bool] = lambda result: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window = window
        self._max = max_entries
        self._keep = keep
        self._clock = clock
        self._entries: OrderedDict[Hashable, _Entry[T]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    async def run(self, key: Hashable, fingerprint: str, execute: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """``(result, replayed)``: run ``execute`` once per key; :class:`IdempotencyConflict` on another payload."""
        while (entry := self._live(key)) is not None:
            if entry.fingerprint != fingerprint:
                raise IdempotencyConflict(
                    f"idempotency key {key!r} was already used with a different payload; use a new key for a new call"
                )
            result = await asyncio.shield(entry.result)
            if result is not None:
                return result, True
        future: asyncio.Future[T | None] = asyncio.get_running_loop().create_future()
        self._entries[key] = _Entry(fingerprint, future, self._clock() + self._window)
        try:
            result = await execute()
        except BaseException:
            self._entries.pop(key, None)
            future.set_result(None)
            raise
        if not self._keep(result):
            self._entries.pop(key, None)
        future.set_result(result)
        return result, False

    def _live(self, key: Hashable) -> _Entry[T] | None:
        """The entry of ``key`` if still in its window, after dropping expired and surplus finished entries."""
        now = self._clock()
        while self._entries:
            oldest_key, oldest = next(iter(self._entries.items()))
            if (oldest.expires_at > now and len(self._entries) < self._max) or not oldest.result.done():
                break
            del self._entries[oldest_key]
        return self._entries.get(key)
