"""The Redis dedup store: one execution per idempotency key across every process sharing Redis.

Each key is a hash ``{prefix}{ScopedKey.encode()}`` (the tenant first) holding a claim
(``policy.dedup.CLAIM_TRANSITIONS``): the payload hash, the state (``in_flight``, ``done``, ``unknown``), the
owner's token, the lease end (``exp``), the window end (``wend``), where the owner sent it (``w``) and, once
done, the response JSON. Each transition is one Lua
script, atomic in Redis: a live entry for another payload is a conflict; an ``in_flight`` entry whose lease
passed (its owner crashed) reads as ``unknown`` and is taken over, never run as new; only the owner's token
may settle a claim, so a late owner cannot overwrite someone's newer claim. Expiry is judged by the clock the
store is given (every process's, or a test's fake one); Redis's own PX only collects garbage.

A response longer than ``max_value_bytes`` is not stored: the key is left ``unknown`` and ``complete``
raises ``EntryTooLarge``. Waiters are woken by a message on ``{prefix}dedup:settled`` (the encoded key) that
the settling scripts publish; a waiter in the same process is woken directly first, and no waiter waits past
the owner's lease. While Redis is unreachable ``begin`` raises ``BackendUnavailable`` (unless
``on_outage="open"``); the pipeline then refuses the keyed call unless its target agent declares shared
idempotency (its own store guards the key).
``unknown``/``fail`` never raise, nor does ``complete`` for an outage (the response is already in hand; the
claim lapses by its lease).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Final

from reach_plugins.clock import Clock, SystemClock
from reach_plugins.errors import EntryTooLarge
from reach_plugins.model import ReachResponse
from reach_plugins.stores.dedup import Begin, conflict, shown
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.stores.redis import (
    MAX_VALUE_BYTES,
    OUTAGE_ERRORS,
    OnOutage,
    RedisStore,
    Subscription,
    connect,
    describe,
    on_outage,
    unavailable,
)

logger = logging.getLogger(__name__)

_BEGIN: Final = """
local e = redis.call('HMGET', KEYS[1], 'h', 'exp', 'st', 'r', 'w', 'wend')
local now = tonumber(ARGV[2])
if e[1] and tonumber(e[6]) > now then
  local st = e[3]
  if st == 'in_flight' and tonumber(e[2]) <= now then st = 'unknown' end
  if st ~= 'in_flight' or tonumber(e[2]) > now then
    if e[1] ~= ARGV[1] then return {'conflict'} end
    if st == 'done' then return {'done', e[4]} end
    if st == 'in_flight' then return {'inflight'} end
    redis.call('HSET', KEYS[1], 'st', 'in_flight', 'owner', ARGV[4], 'exp', now + ARGV[3])
    return {'unknown', e[5] or ''}
  end
end
redis.call('DEL', KEYS[1])
local span = math.max(tonumber(ARGV[5]), tonumber(ARGV[3]))
redis.call('HSET', KEYS[1], 'h', ARGV[1], 'exp', now + ARGV[3], 'wend', now + span, 'win', span,
  'st', 'in_flight', 'owner', ARGV[4], 'w', ARGV[6])
redis.call('PEXPIRE', KEYS[1], math.ceil(span * 1000))
return {'new'}
"""
"""KEYS: entry. ARGV: payload hash, now, lease seconds, owner token, window seconds, where.
An ``in_flight`` entry whose lease has passed reads as ``unknown`` (its owner crashed and may have sent it)."""

_COMPLETE: Final = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
local win = tonumber(redis.call('HGET', KEYS[1], 'win'))
redis.call('HSET', KEYS[1], 'st', 'done', 'r', ARGV[2], 'exp', ARGV[3] + win, 'wend', ARGV[3] + win, 'owner', '')
redis.call('PEXPIRE', KEYS[1], math.ceil(win * 1000))
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
"""
"""KEYS: entry. ARGV: owner token, response JSON, now, channel, key."""

_UNKNOWN: Final = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
local wend = redis.call('HGET', KEYS[1], 'wend')
redis.call('HSET', KEYS[1], 'st', 'unknown', 'exp', wend, 'owner', '')
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'w', ARGV[2]) end
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
"""
"""KEYS: entry. ARGV: owner token, where, channel, key."""

_SENT: Final = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'w', ARGV[2])
return 1
"""
"""KEYS: entry. ARGV: owner token, where."""

_FAIL: Final = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
"""
"""KEYS: entry. ARGV: owner token, channel, key."""

_RECHECK: Final = object()
"""What a waiter is woken with when only Redis knows the outcome (a message from another process)."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisDedupStore(RedisStore):
    """:class:`~reach_plugins.stores.dedup.DedupStore` in Redis; passes ``tests/dedup_store_conformance.py``."""

    def __init__(
        self,
        redis: Any,
        *,
        prefix: str = "reach:",
        clock: Clock | None = None,
        on_outage: OnOutage = "closed",
        max_value_bytes: int = MAX_VALUE_BYTES,
        owns_client: bool = False,
    ) -> None:
        super().__init__(redis, prefix=prefix, max_value_bytes=max_value_bytes, owns_client=owns_client)
        self.on_outage = on_outage
        self._clock = clock or SystemClock()
        self._begin = redis.register_script(_BEGIN)
        self._complete = redis.register_script(_COMPLETE)
        self._fail = redis.register_script(_FAIL)
        self._unknown = redis.register_script(_UNKNOWN)
        self._sent = redis.register_script(_SENT)
        self._claims: dict[ScopedKey, str] = {}
        self._waiting: dict[ScopedKey, set[asyncio.Future[object]]] = {}
        self._settled = Subscription(redis, f"{prefix}dedup:settled", self._on_settled, self._on_gap)

    async def begin(
        self, key: ScopedKey, payload_hash: str, ttl: float, *, window: float | None = None, where: str | None = None
    ) -> Begin:
        token = uuid.uuid4().hex
        args = [payload_hash, repr(self._clock.now()), ttl, token, ttl if window is None else window, where or ""]
        try:
            reply = await self._begin(keys=[self._key(key)], args=args)
        except OUTAGE_ERRORS as exc:
            if self.on_outage == "closed":
                raise unavailable(
                    self.redis,
                    f"idempotency key {shown(key)!r} cannot be checked and the call was not sent "
                    "(dedup fails closed; on_outage='open' runs such calls unguarded)",
                    exc,
                ) from exc
            logger.warning("redis at %s unreachable; running %r without dedup: %s", describe(self.redis), key, exc)
            return Begin("new")
        state = _text(reply[0])
        if state == "conflict":
            raise conflict(key)
        if state == "done":
            return Begin("done", ReachResponse.model_validate_json(reply[1]))
        if state == "inflight":
            return Begin("inflight")
        self._claims[key] = token
        if state == "unknown":
            return Begin("unknown", where=_text(reply[1]) or None)
        return Begin("new")

    async def complete(self, key: ScopedKey, response: ReachResponse) -> None:
        try:
            stored = self._bounded(key, response.model_dump_json(), "the response to idempotency key")
        except EntryTooLarge:
            await self.unknown(key, None)
            raise
        token = self._claims.pop(key, None)
        self._wake(key, response)
        if token is None:
            return
        args = [token, stored, repr(self._clock.now()), self._settled.channel, key.encode()]
        try:
            await self._complete(keys=[self._key(key)], args=args)
        except OUTAGE_ERRORS as exc:
            logger.warning("redis at %s unreachable; result of %r not stored: %s", describe(self.redis), key, exc)

    async def unknown(self, key: ScopedKey, where: str | None) -> None:
        token = self._claims.pop(key, None)
        self._wake(key, None)
        if token is None:
            return
        try:
            await self._unknown(keys=[self._key(key)], args=[token, where or "", self._settled.channel, key.encode()])
        except OUTAGE_ERRORS as exc:
            logger.warning("redis at %s unreachable; claim on %r left to lapse: %s", describe(self.redis), key, exc)

    async def sent(self, key: ScopedKey, where: str) -> None:
        token = self._claims.get(key)
        if token is None:
            return
        try:
            await self._sent(keys=[self._key(key)], args=[token, where])
        except OUTAGE_ERRORS as exc:
            logger.warning(
                "redis at %s unreachable; %r sent on to %s unrecorded: %s", describe(self.redis), key, where, exc
            )

    async def fail(self, key: ScopedKey) -> None:
        token = self._claims.pop(key, None)
        self._wake(key, None)
        if token is None:
            return
        try:
            await self._fail(keys=[self._key(key)], args=[token, self._settled.channel, key.encode()])
        except OUTAGE_ERRORS as exc:
            logger.warning("redis at %s unreachable; claim on %r left to expire: %s", describe(self.redis), key, exc)

    async def wait(self, key: ScopedKey, timeout: float) -> ReachResponse | None:
        """The stored response once the claim settles; None if it failed, vanished, timed out or Redis is down."""
        waiter: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, set()).add(waiter)
        try:
            await self._settled.ensure()
            done, result, lease_end = await self._peek(key)
            if done:
                return result
            clock = self._clock
            try:
                async with clock.timeout_at(min(clock.now() + timeout, lease_end)):
                    settled = await waiter
            except TimeoutError:
                return None
            if settled is _RECHECK:
                return (await self._peek(key))[1]
            return settled if isinstance(settled, ReachResponse) else None
        except OUTAGE_ERRORS as exc:
            logger.warning("redis at %s unreachable while waiting for %r: %s", describe(self.redis), key, exc)
            return None
        finally:
            waiters = self._waiting.get(key)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiting[key]

    async def _peek(self, key: ScopedKey) -> tuple[bool, ReachResponse | None, float]:
        """``(settled, result, lease end)``: a done or unknown entry, or no live entry at all, is settled."""
        raw_hash, raw_exp, raw_state, raw_result = await self.redis.hmget(self._key(key), ["h", "exp", "st", "r"])
        if raw_hash is None or float(_text(raw_exp)) <= self._clock.now() or _text(raw_state) == "unknown":
            return True, None, 0.0
        if raw_result is None:
            return False, None, float(_text(raw_exp))
        return True, ReachResponse.model_validate_json(raw_result), 0.0

    def _wake(self, key: ScopedKey, outcome: object) -> None:
        for waiter in self._waiting.get(key, ()):
            if not waiter.done():
                waiter.set_result(outcome)

    def _on_settled(self, message: str) -> None:
        self._wake(ScopedKey.decode(message), _RECHECK)

    def _on_gap(self) -> None:
        for key in list(self._waiting):
            self._wake(key, _RECHECK)

    async def aclose(self) -> None:
        """Stop listening and wake every waiter (they get None); close the client if this store opened it."""
        await self._settled.aclose()
        for key in list(self._waiting):
            self._wake(key, None)
        await self._close_client()


def from_url(url: str, *, clock: Clock | None = None) -> RedisDedupStore:
    """``redis://host:port/db[?prefix=reach:&timeout=0.5&on_outage=closed]`` -> a store owning its client."""
    client, options = connect(url, options=("on_outage",))
    return RedisDedupStore(
        client,
        prefix=options["prefix"],
        clock=clock,
        on_outage=on_outage(options.get("on_outage", "closed"), url),
        max_value_bytes=int(options["max_value_bytes"]),
        owns_client=True,
    )
