"""Agent-side idempotency: a key is claimed before the handler runs, so it runs once however often it arrives.

``ReachAgent(..., idempotency="memory://" | "redis://host:port/db")`` picks the
store: memory guards one instance; Redis guards every instance sharing it,
and the agent then declares ``idempotency.shared`` in its descriptor, which
lets callers retry a lost answer on any of its instances (DESIGN 11.1/11.2).

* The claim is a lease of the request's deadline (plus a grace): an instance
  that dies mid-handler blocks its key no longer than that.
* A duplicate arriving while this instance runs the key waits for it (single
  flight); one arriving at *another* instance is answered "in progress, not
  executed" (HTTP 503, ``backpressure``, ``Retry-After``), which callers treat
  as never delivered.
* Results with status < 500 are kept for the window (a business refusal is
  an answer too), and so is a handler that ran and raised (``handler_failed``:
  its replay answers the same failure, never a second run); failures a retry
  may cure (a handler's ``Retryable`` among them) release the key.
* Keys are namespaced by tenant, agent and capability (:func:`scope`, a
  :class:`~reach_plugins.stores.keys.ScopedKey`; a request without a tenant
  is the default tenant's), and the memory store is bounded in entries and bytes.
* A claim whose lease lapsed (its instance died or lost the store
  mid-handler) is ``unknown``, never a fresh key: the handler may have run,
  so it is not run again, and the answer is ``outcome_unknown`` (the caller
  ends with :class:`~reach_plugins.errors.OutcomeUnknown`, carrying the key);
  the key stays unknown for the window. A handler that commits its effect and
  its key in one transaction of its own passes ``committed`` (the lookup of
  that key in its store), and that store decides: the committed result is
  answered, and a key with nothing committed did not take effect, so it runs.
  ``ReachContext.idempotency_scope`` is the key to commit with.
* A result over the store's byte bound (its :class:`~reach_plugins.stores.budget.Budget`,
  or a Redis store's ``max_value_bytes``) is answered but not kept: its key
  stays unknown, so a replay is ``outcome_unknown`` (never a second run).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from reach_plugins.agent.outcome import Outcome
from reach_plugins.clock import Clock, as_clock
from reach_plugins.errors import ConfigError, EntryTooLarge, OutcomeUnknown
from reach_plugins.model import ReachResponse
from reach_plugins.stores.budget import DEFAULT_BUDGET, Budget
from reach_plugins.stores.dedup import DedupStore, MemoryDedupStore
from reach_plugins.stores.keys import SEP, ScopedKey
from reach_plugins.stores.urls import open_store

log = logging.getLogger(__name__)

LEASE_GRACE = 2.0
"""Seconds a claim outlives the request's deadline."""
DEFAULT_LEASE = 30.0
"""The lease of a request that carries no deadline."""
IN_PROGRESS_RETRY = 0.2
"""The Retry-After (seconds) of an "in progress, not executed" answer."""

Committed = Callable[[str], Awaitable[Any | None]]
"""``scope -> result | None``: the result a handler committed with this key in its own transaction, if any."""


KIND = "idempotency"


def scope(tenant: str | None, agent: str, capability: str, key: str) -> ScopedKey:
    """The namespaced key: one tenant's, agent's or capability's key never answers another's."""
    return ScopedKey.of(tenant, KIND, SEP.join((agent, capability, key)))


def commit_key(key: ScopedKey) -> str:
    """The text a handler commits its effect with (``tenant<US>agent<US>capability<US>key``)."""
    return f"{key.tenant}{SEP}{key.id}"


def open_key_store(
    store: DedupStore | str, clock: Callable[[], float], budget: Budget | None
) -> tuple[DedupStore, bool]:
    """The store named by ``store`` and whether it is shared by several processes (anything but memory).

    ``budget`` bounds the memory store (:data:`~reach_plugins.stores.budget.DEFAULT_BUDGET` when ``None``); any
    other store brings its own bound, so a budget given with one is refused rather than ignored.
    """
    memory = isinstance(store, str) and store.startswith("memory://")
    if budget is not None and not memory:
        raise ConfigError(
            "idempotency_budget bounds the in-memory store (idempotency='memory://'); a Redis store is bounded by "
            "?max_value_bytes= in its URL, a store object by its own budget: drop idempotency_budget"
        )
    if not isinstance(store, str):
        return store, not isinstance(store, MemoryDedupStore)
    if memory:
        return MemoryDedupStore(budget=budget or DEFAULT_BUDGET, clock=as_clock(clock)), False
    if store.startswith(("redis://", "rediss://")):
        return open_store(store), True
    raise ConfigError(f"unsupported idempotency store {store!r}; use 'memory://' or 'redis://HOST:PORT/DB'")


class Claims:
    """The agent's claims on keys: claim, single flight within the instance, settle."""

    def __init__(self, store: DedupStore, *, window: float, clock: Clock, committed: Committed | None) -> None:
        self.store = store
        self._window = window
        self._clock = clock
        self._committed = committed
        self._running: dict[ScopedKey, asyncio.Future[Outcome | None]] = {}

    async def run(
        self, key: ScopedKey, fingerprint: str, lease: float | None, execute: Callable[[], Awaitable[Outcome]]
    ) -> tuple[Outcome | None, bool]:
        """``(outcome, replayed)``, or ``(None, False)`` when another instance holds the key (in progress).

        Raises IdempotencyConflict (another payload) and BackendUnavailable (the store cannot be asked).
        """
        while (twin := self._running.get(key)) is not None:
            result = await asyncio.shield(twin)
            if result is not None:
                return result, True
        ttl = (DEFAULT_LEASE if lease is None else max(lease, 0.0)) + LEASE_GRACE
        begin = await self.store.begin(key, fingerprint, ttl, window=max(self._window, ttl))
        if begin.state == "done" and begin.result is not None:
            return Outcome(200, _body(begin.result)), True
        if begin.state == "inflight":
            return None, False
        kept = await self._kept(key)
        if kept is not None:
            return kept, True
        if begin.state == "unknown" and self._committed is None:
            return await self._unknown(key, begin.where), False
        future: asyncio.Future[Outcome | None] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        outcome: Outcome | None = None
        try:
            outcome = await execute()
        finally:
            del self._running[key]
            future.set_result(outcome if outcome is not None and outcome.settled else None)
            if outcome is not None and outcome.settled:
                await self._complete(key, outcome)
            else:
                await self.store.fail(key)
        return outcome, False

    async def _complete(self, key: ScopedKey, outcome: Outcome) -> None:
        """Store the result; one over the store's byte bound is answered all the same, its key left unknown."""
        try:
            await self.store.complete(key, _stored(outcome))
        except EntryTooLarge as exc:
            log.warning("%s", exc.message)

    async def _kept(self, key: ScopedKey) -> Outcome | None:
        """The result the handler committed with this key in its own transaction (now stored here too), if any."""
        saved = await self._committed(commit_key(key)) if self._committed is not None else None
        if saved is None:
            return None
        kept = Outcome(200, {"request_id": None, "status": "success", "data": saved, "error": None})
        await self._complete(key, kept)
        return kept

    async def _unknown(self, key: ScopedKey, where: str | None) -> Outcome:
        """A lapsed claim nothing was committed for: ``outcome_unknown``, not run again, the key left unknown."""
        await self.store.unknown(key, where)
        message = (
            f"idempotency key {key.id.rpartition(SEP)[2]!r} was claimed before and has no stored result (its claim "
            "lapsed, or its result was too large to keep): it may have run, so it was not run again"
        )
        error = {"type": OutcomeUnknown.code, "message": message}
        return Outcome(OutcomeUnknown.http_status, {"request_id": None, "status": "fail", "data": None, "error": error})

    async def aclose(self) -> None:
        await self.store.aclose()


def _stored(outcome: Outcome) -> ReachResponse:
    body = outcome.body
    return ReachResponse(
        request_id=str(body.get("request_id") or "-"), status=body["status"], data=body.get("data"), error=body["error"]
    )


def _body(stored: ReachResponse) -> dict[str, Any]:
    error = stored.error.model_dump(exclude_none=True) if stored.error is not None else None
    return {"request_id": stored.request_id, "status": stored.status, "data": stored.data, "error": error}
