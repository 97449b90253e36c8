"""Idempotency keys and the dedup store: one execution per key within the window.

The key is the caller's ``idempotency_key``, else the capability's template
(``${params.wo_number}``), else the agent's ``idempotency.key_from``, else
none. A store holds each key as in flight (someone is running it) or done
(its first successful response). Duplicates of a done key get the stored
response; duplicates of an in-flight key wait for it (single-flight); the
same key with another payload is an :class:`IdempotencyConflict`. Failed
results are not kept, so a later retry with the same key may run. A claim is
a lease (the request's deadline plus a grace): a key whose owner lost the
answer, or crashed, is ``unknown`` — never free — until the window ends
(:data:`CLAIM_TRANSITIONS`).

Every store judges expiry by the clock it is given (tests move a fake one),
and passes ``tests/dedup_store_conformance.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from reach_plugins.clock import Clock, SystemClock
from reach_plugins.errors import ConfigError, IdempotencyConflict, InvalidPayload
from reach_plugins.model import AgentDescriptor, Capability, ReachRequest, ReachResponse

_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
_REQUEST_FIELDS = ("tenant", "session_id", "action", "capability")


def render_key(template: str, request: ReachRequest) -> str:
    """Fill ``${params.a.b}`` (payload fields) and ``${tenant}``-style request fields into a key."""
    names = _PLACEHOLDER.findall(template)
    if not names:
        raise ConfigError(
            f"idempotency key template {template!r} has no placeholder; write it like '${{params.order_id}}' "
            "so each business operation gets its own key"
        )

    def fill(match: re.Match[str]) -> str:
        return _lookup(match.group(1).strip(), template, request)

    return _PLACEHOLDER.sub(fill, template)


def _lookup(name: str, template: str, request: ReachRequest) -> str:
    if name in _REQUEST_FIELDS:
        value: Any = getattr(request, name)
    elif name.startswith("params."):
        value = request.payload
        for part in name.removeprefix("params.").split("."):
            if not isinstance(value, dict) or part not in value:
                raise InvalidPayload(
                    f"capability {request.capability!r} derives its idempotency key from {template!r}, "
                    f"but the payload has no {name.removeprefix('params.')!r}; add that field or pass idempotency_key"
                )
            value = value[part]
    else:
        raise ConfigError(
            f"idempotency key template {template!r} uses unknown placeholder ${{{name}}}; "
            f"use ${{params.<field>}} or one of {', '.join(_REQUEST_FIELDS)}"
        )
    if value is None:
        raise InvalidPayload(f"idempotency key template {template!r}: {name} is empty in this request")
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


def resolve_key(request: ReachRequest, agent: AgentDescriptor, capability: Capability | None) -> str | None:
    """The explicit key, else the capability's template, else the agent's ``key_from``, else None."""
    if request.idempotency_key:
        return request.idempotency_key
    if capability is not None and capability.idempotency_key:
        return render_key(capability.idempotency_key, request)
    if agent.idempotency.key_from:
        return render_key(agent.idempotency.key_from, request)
    return None


def store_key(request: ReachRequest, key: str) -> str:
    """Keys are scoped by tenant and capability: one tenant's key never answers another's request."""
    return f"{request.tenant or '-'}\x1f{request.capability}\x1f{key}"


def payload_hash(request: ReachRequest) -> str:
    """A digest of what the key promises to mean: capability, action and payload."""
    body = json.dumps([request.capability, request.action, request.payload], sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


ClaimState = Literal["in_flight", "done", "unknown"]

CLAIM_TRANSITIONS: dict[tuple[ClaimState | None, str], ClaimState | None] = {
    (None, "begin"): "in_flight",  # a free key: the caller owns it for its lease
    ("in_flight", "complete"): "done",  # the owner's success: replayed to every twin for the window
    ("in_flight", "unknown"): "unknown",  # sent, answer lost: kept for the window, never free
    ("in_flight", "fail"): None,  # nothing ran, or it failed for sure: the next request runs
    ("in_flight", "expire"): "unknown",  # the owner crashed: its lease ran out, it may have sent
    ("unknown", "begin"): "in_flight",  # taken over by a caller that retries only where the key is checked
    ("done", "expire"): None,  # the window ended
    ("unknown", "expire"): None,  # the window ended
}
"""The claim lifecycle (STYLE 14). Invariants: only the lease owner moves ``in_flight``; ``unknown`` is never
free within the window (a taker gets :class:`Begin` state ``unknown`` and must not run it unguarded); a crashed
owner blocks its key for at most its lease (the request's deadline plus a grace)."""


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
        self, key: str, payload_hash: str, ttl: float, *, window: float | None = None, where: str | None = None
    ) -> Begin:
        """Claim ``key`` with a lease of ``ttl`` seconds (results then kept ``window``, default ``ttl``).

        ``where`` (``agent/instance``) is where the owner sends first. Raise IdempotencyConflict if the key
        is held for another payload.
        """
        ...

    async def complete(self, key: str, response: ReachResponse) -> None:
        """Store the successful response of the claim; duplicates get it until the window ends."""
        ...

    async def unknown(self, key: str, where: str | None) -> None:
        """The owner sent it and lost the answer at ``where``: keep the key ``unknown`` for the window."""
        ...

    async def sent(self, key: str, where: str) -> None:
        """The owner is sending it to ``where`` (not where it first said): an heir must ask there."""
        ...

    async def fail(self, key: str) -> None:
        """Drop the claim without a result: the next request with this key runs."""
        ...

    async def wait(self, key: str, timeout: float) -> ReachResponse | None:
        """The stored response once the in-flight claim completes; None if it failed, vanished or timed out."""
        ...

    async def aclose(self) -> None: ...


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


class MemoryDedupStore:
    """In-process store bounded by ``max_entries`` (oldest first out) and by each entry's TTL."""

    def __init__(self, *, max_entries: int = 10_000, clock: Clock | None = None) -> None:
        if max_entries < 1:
            raise ConfigError(f"a dedup store needs room for at least one key, got max_entries={max_entries}")
        self._max = max_entries
        self._clock = clock or SystemClock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    async def begin(
        self, key: str, payload_hash: str, ttl: float, *, window: float | None = None, where: str | None = None
    ) -> Begin:
        now = self._clock.now()
        entry = self._live(key, now)
        if entry is not None:
            if entry.payload_hash != payload_hash:
                raise IdempotencyConflict(
                    f"idempotency key {key.rpartition(chr(0x1F))[2]!r} was already used with a different payload; "
                    "use a new key for a different request",
                )
            if entry.state == "done":
                return Begin("done", entry.result)
            if entry.state == "in_flight":
                return Begin("inflight")
            entry.state, entry.expires_at = "in_flight", now + ttl
            return Begin("unknown", where=entry.where)
        self._make_room(now)
        span = ttl if window is None else max(window, ttl)
        self._entries[key] = _Entry(payload_hash, span, now + ttl, now + span, where=where)
        return Begin("new")

    async def complete(self, key: str, response: ReachResponse) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.state, entry.result = "done", response
        entry.expires_at = self._clock.now() + entry.window
        self._entries.move_to_end(key)
        entry.settle()

    async def unknown(self, key: str, where: str | None) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.state, entry.where, entry.expires_at = "unknown", where or entry.where, entry.window_end
        entry.settle()

    async def sent(self, key: str, where: str) -> None:
        entry = self._entries.get(key)
        if entry is not None and entry.state == "in_flight":
            entry.where = where

    async def fail(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            entry.settle()

    async def wait(self, key: str, timeout: float) -> ReachResponse | None:
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
        for entry in self._entries.values():
            entry.settle()
        self._entries.clear()

    def _live(self, key: str, now: float) -> _Entry | None:
        """The key's entry after applying expiry: a lapsed lease turns ``unknown``, a lapsed window frees it."""
        entry = self._entries.get(key)
        if entry is None or entry.expires_at > now:
            return entry
        if entry.state == "in_flight" and entry.window_end > now:
            entry.state, entry.expires_at = "unknown", entry.window_end
            entry.settle()
            return entry
        del self._entries[key]
        entry.settle()
        return None

    def _make_room(self, now: float) -> None:
        entries = self._entries
        while entries:
            oldest_key, oldest = next(iter(entries.items()))
            if oldest.window_end > now and len(entries) < self._max:
                return
            del entries[oldest_key]
            oldest.settle()
