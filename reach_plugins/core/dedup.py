"""Idempotency keys and the dedup store: one execution per key within the window.

The key is the caller's ``idempotency_key``, else the capability's template
(``${params.wo_number}``), else the agent's ``idempotency.key_from``, else
none. A store holds each key as in flight (someone is running it) or done
(its first successful response). Duplicates of a done key get the stored
response; duplicates of an in-flight key wait for it (single-flight); the
same key with another payload is an :class:`IdempotencyConflict`. Failed
results are not kept, so a later retry with the same key may run.

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

from reach_plugins.core.clock import Clock, SystemClock
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


@dataclass(frozen=True, slots=True)
class Begin:
    """Answer of ``begin``: ``new`` (you run it), ``inflight`` (someone else is), ``done`` (here is the result)."""

    state: Literal["new", "inflight", "done"]
    result: ReachResponse | None = None


@runtime_checkable
class DedupStore(Protocol):
    """Where idempotency keys live; memory by default, Redis when processes share work."""

    async def begin(self, key: str, payload_hash: str, ttl: float) -> Begin:
        """Claim ``key`` for ``ttl`` seconds; raise IdempotencyConflict if it is held for another payload."""
        ...

    async def complete(self, key: str, response: ReachResponse) -> None:
        """Store the successful response of the claim; duplicates get it until the window ends."""
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
    ttl: float
    expires_at: float
    result: ReachResponse | None = None
    settled: asyncio.Event | None = None
    """Created by the first waiter only: most keys are never waited on."""

    def settle(self) -> None:
        if self.settled is not None:
            self.settled.set()


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

    async def begin(self, key: str, payload_hash: str, ttl: float) -> Begin:
        now = self._clock.now()
        entry = self._live(key, now)
        if entry is not None:
            if entry.payload_hash != payload_hash:
                raise IdempotencyConflict(
                    f"idempotency key {key.rpartition(chr(0x1F))[2]!r} was already used with a different payload; "
                    "use a new key for a different request",
                )
            return Begin("done", entry.result) if entry.result is not None else Begin("inflight")
        self._make_room(now)
        self._entries[key] = _Entry(payload_hash, ttl, now + ttl)
        return Begin("new")

    async def complete(self, key: str, response: ReachResponse) -> None:
        now = self._clock.now()
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.result = response
        entry.expires_at = now + entry.ttl
        self._entries.move_to_end(key)
        entry.settle()

    async def fail(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            entry.settle()

    async def wait(self, key: str, timeout: float) -> ReachResponse | None:
        clock = self._clock
        entry = self._live(key, clock.now())
        if entry is None or entry.result is not None:
            return entry.result if entry else None
        if entry.settled is None:
            entry.settled = asyncio.Event()
        try:
            async with clock.timeout_at(clock.now() + timeout):
                await entry.settled.wait()
        except TimeoutError:
            return None
        return entry.result

    async def aclose(self) -> None:
        for entry in self._entries.values():
            entry.settle()
        self._entries.clear()

    def _live(self, key: str, now: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and entry.expires_at <= now:
            del self._entries[key]
            entry.settle()
            return None
        return entry

    def _make_room(self, now: float) -> None:
        entries = self._entries
        while entries:
            oldest_key, oldest = next(iter(entries.items()))
            if oldest.expires_at > now and len(entries) < self._max:
                return
            del entries[oldest_key]
            oldest.settle()
