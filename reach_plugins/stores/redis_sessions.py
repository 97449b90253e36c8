"""Session liveness in Redis: a conversation closed in one process stops its calls in every process.

Each session is one key, ``{prefix}`` + its :class:`~reach_plugins.stores.keys.ScopedKey`
(tenant first, so one tenant's session id never names another's): its expiry time by the
store's clock (Redis ``TIME`` in the scripts, never a caller's) while open, ``closed`` once
closed. Checking is one Lua script (closed? expired? else extend), so concurrent processes agree. Keys outlive the
session by ``tombstone_ttl`` (a day unless told) so a closed or expired
conversation is refused for that long, then forgotten.

Each conversation's pins live in the same key with kind ``pin`` (a hash: agent ->
instance), written by the first process that routes it and adopted by the
others (one Lua script: keep the stored pin unless it is the one being
replaced), with the session's lifetime.

``close`` cancels the calls in flight here at once (``InFlight`` from
:mod:`reach_plugins.stores.sessions`) and publishes on ``{prefix}session:closed``;
every other store listening there cancels its own calls and tells its
``on_close`` listeners.

While Redis is unreachable the store fails open by default: checks pass with a
warning (a liveness guard is no reason to stop all traffic), ``is_alive`` says
yes, and ``close`` raises ``BackendUnavailable`` after cancelling local calls,
because the other processes did not hear it. ``on_outage="closed"`` makes
checks raise instead.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Final

from reach_plugins.errors import ConfigError, SessionClosed
from reach_plugins.stores.keys import SEP, ScopedKey
from reach_plugins.stores.redis import (
    MAX_VALUE_BYTES,
    NOW_LUA,
    OUTAGE_ERRORS,
    OnOutage,
    RedisStore,
    Subscription,
    connect,
    describe,
    on_outage,
    text,
    unavailable,
)
from reach_plugins.stores.sessions import InFlight, Listener

logger = logging.getLogger(__name__)

_CLOSED: Final = "closed"

_CHECK: Final = (
    NOW_LUA
    + """
local value = redis.call('GET', KEYS[1])
if value == 'closed' then return 'closed' end
if value and tonumber(value) <= now then return 'expired' end
redis.call('SET', KEYS[1], tostring(now + tonumber(ARGV[2])), 'PX', ARGV[3])
return 'open'
"""
)
"""KEYS: session. ARGV: now ('' for Redis's), ttl seconds, key lifetime in ms."""

_OPEN: Final = (
    NOW_LUA
    + """
redis.call('SET', KEYS[1], tostring(now + tonumber(ARGV[2])), 'PX', ARGV[3])
return 1
"""
)
"""KEYS: session. ARGV: now ('' for Redis's), ttl seconds, key lifetime in ms."""

_ALIVE: Final = (
    NOW_LUA
    + """
local value = redis.call('GET', KEYS[1])
if (not value) or value == 'closed' or tonumber(value) <= now then return 0 end
return 1
"""
)
"""KEYS: session. ARGV: now ('' for Redis's)."""

_CLAIM_PIN: Final = """
local stored = redis.call('HGET', KEYS[1], ARGV[1])
if (not stored) or (ARGV[3] ~= '' and stored == ARGV[3]) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  stored = ARGV[2]
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return stored
"""
"""KEYS: the session's pins. ARGV: agent, instance, instance to replace ('' for none), key lifetime in ms."""


class RedisSessions(RedisStore):
    """:class:`~reach_plugins.stores.sessions.SessionStore` in Redis, shared by every process using the same prefix."""

    def __init__(
        self,
        redis: Any,
        *,
        ttl: float = 1800.0,
        tombstone_ttl: float = 86_400.0,
        prefix: str = "reach:",
        clock: Callable[[], float] | None = None,
        on_outage: OnOutage = "open",
        max_value_bytes: int = MAX_VALUE_BYTES,
        owns_client: bool = False,
    ) -> None:
        if ttl <= 0 or tombstone_ttl <= 0:
            raise ConfigError(f"session ttl and tombstone_ttl must be positive seconds, got {ttl!r}, {tombstone_ttl!r}")
        super().__init__(redis, prefix=prefix, max_value_bytes=max_value_bytes, owns_client=owns_client)
        self.ttl = ttl
        self.tombstone_ttl = tombstone_ttl
        self.on_outage = on_outage
        self._clock = clock
        """A test's clock; None judges every expiry by Redis ``TIME`` (a caller's skewed clock never does)."""
        self._check = redis.register_script(_CHECK)
        self._open = redis.register_script(_OPEN)
        self._alive = redis.register_script(_ALIVE)
        self._claim_pin = redis.register_script(_CLAIM_PIN)
        self._origin = uuid.uuid4().hex
        self._inflight = InFlight()
        self._listeners: list[Listener] = []
        self._closes = Subscription(redis, f"{prefix}session:closed", self._on_remote_close, lambda: None)
        self._outage = False

    def _now(self) -> str:
        return "" if self._clock is None else repr(self._clock())

    def _lifetime_ms(self, seconds: float) -> int:
        return max(1, round((seconds + self.tombstone_ttl) * 1000))

    async def open(self, key: ScopedKey) -> None:
        """Open (or reopen, even after a close) a session for ``ttl`` seconds."""
        try:
            await self._listen()
            await self._open(keys=[self._key(key)], args=[self._now(), self.ttl, self._lifetime_ms(self.ttl)])
        except OUTAGE_ERRORS as exc:
            self._degraded(f"conversation {key.id!r} cannot be opened", exc)
        else:
            self._recovered()

    async def touch(self, key: ScopedKey) -> None:
        await self.check(key)

    async def check(self, key: ScopedKey) -> None:
        """Open an unknown session, extend a live one, raise ``SessionClosed`` for a closed or expired one."""
        try:
            await self._listen()
            args = [self._now(), self.ttl, self._lifetime_ms(self.ttl)]
            state = await self._check(keys=[self._key(key)], args=args)
        except OUTAGE_ERRORS as exc:
            self._degraded(f"conversation {key.id!r} cannot be checked", exc)
            return
        self._recovered()
        state = text(state)
        if state == "closed":
            raise SessionClosed(f"conversation {key.id!r} was closed; start a new one to reach agents again")
        if state == "expired":
            raise SessionClosed(
                f"conversation {key.id!r} expired after {self.ttl:g}s without activity; start a new one"
            )

    async def close(self, key: ScopedKey) -> None:
        """End the session for good: cancel its calls here, then in every process listening."""
        self._closed_here(key)
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.set(self._key(key), _CLOSED, px=self._lifetime_ms(0.0))
                pipe.publish(self._closes.channel, f"{self._origin}{SEP}{key.encode()}")
                await pipe.execute()
        except OUTAGE_ERRORS as exc:
            raise unavailable(
                self.redis,
                f"closing conversation {key.id!r} reached only this process (its calls here were cancelled)",
                exc,
            ) from exc

    async def claim_pin(self, key: ScopedKey, agent: str, instance_id: str, *, replace: str | None = None) -> str:
        """The session's pin on ``agent``: the stored one, else (or if it is ``replace``) ``instance_id``.

        Redis unreachable: the local choice stands (with the outage warning); the
        processes may then disagree until it is back, as they would without a store.
        """
        pins = ScopedKey(key.tenant, "pin", key.id)
        self._bounded(pins, agent + instance_id, f"the pin on agent {agent!r}")
        args = [agent, instance_id, replace or "", self._lifetime_ms(self.ttl)]
        try:
            stored = await self._claim_pin(keys=[self._key(pins)], args=args)
        except OUTAGE_ERRORS as exc:
            self._degraded(f"the pin of conversation {key.id!r} cannot be shared", exc)
            return instance_id
        self._recovered()
        return text(stored)

    async def is_alive(self, key: ScopedKey) -> bool:
        try:
            alive = await self._alive(keys=[self._key(key)], args=[self._now()])
        except OUTAGE_ERRORS as exc:
            self._degraded(f"liveness of conversation {key.id!r} is unknown", exc)
            return True
        return bool(alive)

    def guard(self, key: ScopedKey) -> AbstractAsyncContextManager[None]:
        """Cancel the enclosed work (raising ``SessionClosed``) if any process closes the session meanwhile."""
        return self._guard(key)

    @asynccontextmanager
    async def _guard(self, key: ScopedKey) -> AsyncIterator[None]:
        try:
            await self._listen()
        except OUTAGE_ERRORS as exc:
            self._degraded(f"closes of {key.id!r} from other processes will not be heard", exc)
        async with self._inflight.guard(key):
            yield

    def on_close(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def aclose(self) -> None:
        """Stop listening for closes; close the client if this store opened it."""
        await self._closes.aclose()
        await self._close_client()

    async def _listen(self) -> None:
        await self._closes.ensure()

    def _closed_here(self, key: ScopedKey) -> None:
        self._inflight.cancel(key)
        for listener in self._listeners:
            listener(key)

    def _on_remote_close(self, message: str) -> None:
        origin, _, key = message.partition(SEP)
        if origin != self._origin:
            self._closed_here(ScopedKey.decode(key))

    def _degraded(self, what: str, exc: BaseException) -> None:
        """Apply the outage policy: raise when failing closed, else warn once per outage and carry on."""
        if self.on_outage == "closed":
            raise unavailable(self.redis, f"{what} (sessions fail closed)", exc) from exc
        if not self._outage:
            logger.warning("redis at %s unreachable; %s, letting calls through: %s", describe(self.redis), what, exc)
            self._outage = True

    def _recovered(self) -> None:
        if self._outage:
            logger.warning("redis at %s reachable again; session liveness is enforced again", describe(self.redis))
            self._outage = False


def from_url(url: str, *, clock: Callable[[], float] | None = None) -> RedisSessions:
    """``redis://host:port/db[?prefix=reach:&timeout=0.5&ttl=1800&on_outage=open]`` -> a store owning its client."""
    client, options = connect(url, options=("ttl", "on_outage"))
    try:
        ttl = float(options.get("ttl", 1800.0))
    except ValueError as exc:
        raise ConfigError(f"Redis URL {url!r}: ttl must be seconds, got {options['ttl']!r}") from exc
    return RedisSessions(
        client,
        ttl=ttl,
        prefix=options["prefix"],
        clock=clock,
        on_outage=on_outage(options.get("on_outage", "open"), url),
        max_value_bytes=int(options["max_value_bytes"]),
        owns_client=True,
    )
