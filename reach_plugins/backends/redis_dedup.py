"""The Redis dedup store: one execution per idempotency key across every process sharing Redis.

Each key is a hash ``{prefix}dedup:{key}`` with the payload hash, the claim's
owner token, its TTL, its expiry by the store's clock and, once done, the
response JSON. The claim is one Lua script, ``SET NX PX`` with two more checks
in the same atomic step: a live entry for another payload is a conflict, and an
entry whose clock expiry has passed is claimed afresh (so a test's fake clock,
and every process's clock, decide expiry; Redis's own PX only collects garbage).
Only the owner's token may complete or fail a claim, so a late owner cannot
overwrite someone's newer claim.

Waiters are woken by a message on ``{prefix}dedup:settled`` (the key) that the
complete/fail script publishes; a waiter in the same process is woken directly
first. While Redis is unreachable the store fails closed (``BackendUnavailable``)
unless ``on_outage="open"``; ``complete``/``fail`` never raise (the response is
already in hand; the claim then expires by its TTL). The pipeline then decides
per capability: a ``retryable: false`` call is refused (a duplicate side effect
is worse than an error), a retryable one runs without dedup and its trace says so.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Final

from reach_plugins.backends import (
    OUTAGE_ERRORS,
    OnOutage,
    Subscription,
    connect,
    describe,
    on_outage,
    unavailable,
)
from reach_plugins.core.clock import Clock, SystemClock
from reach_plugins.core.dedup import Begin
from reach_plugins.errors import IdempotencyConflict
from reach_plugins.model import ReachResponse

logger = logging.getLogger(__name__)

_BEGIN: Final = """
local entry = redis.call('HMGET', KEYS[1], 'h', 'exp', 'r')
if entry[1] and tonumber(entry[2]) > tonumber(ARGV[2]) then
  if entry[1] ~= ARGV[1] then return {'conflict'} end
  if entry[3] then return {'done', entry[3]} end
  return {'inflight'}
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'h', ARGV[1], 'exp', ARGV[2] + ARGV[3], 't', ARGV[3], 'owner', ARGV[4])
redis.call('PEXPIRE', KEYS[1], math.ceil(ARGV[3] * 1000))
return {'new'}
"""
"""KEYS: entry. ARGV: payload hash, now, ttl seconds, owner token."""

_COMPLETE: Final = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
local ttl = tonumber(redis.call('HGET', KEYS[1], 't'))
redis.call('HSET', KEYS[1], 'r', ARGV[2], 'exp', ARGV[3] + ttl)
redis.call('PEXPIRE', KEYS[1], math.ceil(ttl * 1000))
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
"""
"""KEYS: entry. ARGV: owner token, response JSON, now, channel, key."""

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


class RedisDedupStore:
    """:class:`~reach_plugins.core.dedup.DedupStore` in Redis; passes ``tests/dedup_store_conformance.py``.

    ``redis`` is a ``redis.asyncio.Redis`` (closed by ``aclose`` only if ``owns_client``).
    """

    def __init__(
        self,
        redis: Any,
        *,
        prefix: str = "reach:",
        clock: Clock | None = None,
        on_outage: OnOutage = "closed",
        owns_client: bool = False,
    ) -> None:
        self.redis = redis
        self.on_outage = on_outage
        self._prefix = prefix
        self._clock = clock or SystemClock()
        self._owns_client = owns_client
        self._begin = redis.register_script(_BEGIN)
        self._complete = redis.register_script(_COMPLETE)
        self._fail = redis.register_script(_FAIL)
        self._claims: dict[str, str] = {}
        self._waiting: dict[str, set[asyncio.Future[object]]] = {}
        self._settled = Subscription(redis, f"{prefix}dedup:settled", self._on_settled, self._on_gap)

    def _entry(self, key: str) -> str:
        return f"{self._prefix}dedup:{key}"

    async def begin(self, key: str, payload_hash: str, ttl: float) -> Begin:
        token = uuid.uuid4().hex
        try:
            reply = await self._begin(keys=[self._entry(key)], args=[payload_hash, repr(self._clock.now()), ttl, token])
        except OUTAGE_ERRORS as exc:
            if self.on_outage == "closed":
                raise unavailable(
                    self.redis,
                    f"idempotency key {key.rpartition(chr(0x1F))[2]!r} cannot be checked and the call was not sent "
                    "(dedup fails closed; on_outage='open' runs such calls unguarded)",
                    exc,
                ) from exc
            logger.warning("redis at %s unreachable; running %r without dedup: %s", describe(self.redis), key, exc)
            return Begin("new")
        state = _text(reply[0])
        if state == "conflict":
            raise IdempotencyConflict(
                f"idempotency key {key.rpartition(chr(0x1F))[2]!r} was already used with a different payload; "
                "use a new key for a different request",
            )
        if state == "done":
            return Begin("done", ReachResponse.model_validate_json(reply[1]))
        if state == "new":
            self._claims[key] = token
            return Begin("new")
        return Begin("inflight")

    async def complete(self, key: str, response: ReachResponse) -> None:
        token = self._claims.pop(key, None)
        self._wake(key, response)
        if token is None:
            return
        args = [token, response.model_dump_json(), repr(self._clock.now()), self._settled.channel, key]
        try:
            await self._complete(keys=[self._entry(key)], args=args)
        except OUTAGE_ERRORS as exc:
            logger.warning("redis at %s unreachable; result of %r not stored: %s", describe(self.redis), key, exc)

    async def fail(self, key: str) -> None:
        token = self._claims.pop(key, None)
        self._wake(key, None)
        if token is None:
            return
        try:
            await self._fail(keys=[self._entry(key)], args=[token, self._settled.channel, key])
        except OUTAGE_ERRORS as exc:
            logger.warning("redis at %s unreachable; claim on %r left to expire: %s", describe(self.redis), key, exc)

    async def wait(self, key: str, timeout: float) -> ReachResponse | None:
        """The stored response once the claim settles; None if it failed, vanished, timed out or Redis is down."""
        waiter: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, set()).add(waiter)
        try:
            await self._settled.ensure()
            done, result = await self._peek(key)
            if done:
                return result
            clock = self._clock
            try:
                async with clock.timeout_at(clock.now() + timeout):
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

    async def _peek(self, key: str) -> tuple[bool, ReachResponse | None]:
        """``(settled, result)``: a live done entry, or no live entry at all, is settled."""
        raw_hash, raw_exp, raw_result = await self.redis.hmget(self._entry(key), ["h", "exp", "r"])
        if raw_hash is None or float(_text(raw_exp)) <= self._clock.now():
            return True, None
        if raw_result is None:
            return False, None
        return True, ReachResponse.model_validate_json(raw_result)

    def _wake(self, key: str, outcome: object) -> None:
        for waiter in self._waiting.get(key, ()):
            if not waiter.done():
                waiter.set_result(outcome)

    def _on_settled(self, key: str) -> None:
        self._wake(key, _RECHECK)

    def _on_gap(self) -> None:
        for key in list(self._waiting):
            self._wake(key, _RECHECK)

    async def aclose(self) -> None:
        """Stop listening and wake every waiter (they get None); close the client if this store opened it."""
        await self._settled.aclose()
        for key in list(self._waiting):
            self._wake(key, None)
        if self._owns_client:
            await self.redis.aclose()


def from_url(url: str, *, clock: Clock | None = None) -> RedisDedupStore:
    """``redis://host:port/db[?prefix=reach:&timeout=0.5&on_outage=closed]`` -> a store owning its client."""
    client, options = connect(url, options=("on_outage",))
    return RedisDedupStore(
        client,
        prefix=options["prefix"],
        clock=clock,
        on_outage=on_outage(options.get("on_outage", "closed"), url),
        owns_client=True,
    )
