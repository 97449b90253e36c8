"""The Redis dedup store: one execution per idempotency key across every process sharing Redis.

Each key is a hash ``{prefix}{ScopedKey.encode()}`` (the tenant first) holding a claim
(``policy.dedup.CLAIM_TRANSITIONS``): the payload hash, the state (``in_flight``, ``done``, ``unknown``), the
owner's token, the lease end (``exp``), the window end (``wend``), where the owner sent it (``w``) and, once
done, the response JSON. Each transition is one Lua script, atomic in Redis: a live entry for another payload
is a conflict; an ``in_flight`` entry whose lease passed (its owner crashed) reads as ``unknown`` and is taken
over, never run as new; only the owner's token may settle a claim, so a late owner cannot overwrite someone's
newer claim. **Time is Redis's**: every lease and window is judged by ``TIME`` inside the script, never by a
caller's clock (a process whose clock is off by a minute neither steals nor stretches a claim); a ``clock``
given to the store replaces it for tests only. Redis's own PX only collects garbage.

**Restarts.** A dataset is stamped with an epoch (``{prefix}dedup:epoch``, the time its first script ran).
Every script answers with it, so a process notices a Redis that came back empty (no persistence, or a lost
tail of the append-only file) at its next call, and at most :data:`EPOCH_CHECK` s later while it holds recent
claims (it looks in the background). It then writes back what it journaled (its claims and results of the
last :data:`JOURNAL_SPAN` s, within :data:`JOURNAL_BUDGET`), never over an entry written since; and missing keys
are held (``BackendUnavailable``, retry shortly) for ``restore_hold`` s after the new epoch began, so a key is
not read as free before its owner wrote it back. A claim whose ``begin`` lost its answer or whose release
could not be told is released, and a result that could not be stored is written (over ``unknown`` too), once
Redis answers again. What no live process remembers (a result of a process that died meanwhile, or older than
the journal) is lost with the data: persistence (``appendonly``/``appendfsync``) is the operator's.

A response longer than ``max_value_bytes`` is not stored: the key is left ``unknown`` and ``complete``
raises ``EntryTooLarge``. Waiters are woken by a message on ``{prefix}dedup:settled`` (the encoded key) that
the settling scripts publish; a waiter in the same process is woken directly first, and no waiter waits past
the owner's lease. While Redis is unreachable ``begin`` raises ``BackendUnavailable`` (unless
``on_outage="open"``); the pipeline then refuses the keyed call unless its target agent declares shared
idempotency (its own store guards the key), and an agent answers "not executed" (``backend_unavailable``).
``unknown``/``fail`` never raise, nor does ``complete`` for an outage (the response is already in hand; it is
written when Redis is back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Final

from reach_plugins.clock import Clock, SystemClock
from reach_plugins.errors import BackendUnavailable, ConfigError, EntryTooLarge
from reach_plugins.model import ReachResponse
from reach_plugins.stores.budget import MIB, Budget, LruTable
from reach_plugins.stores.dedup import Begin, conflict, shown
from reach_plugins.stores.keys import ScopedKey
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

logger = logging.getLogger(__name__)

RESTORE_HOLD: Final = 1.0
"""Seconds a new dataset holds keys it does not know, once a process saw it replace an older one."""
EPOCH_CHECK: Final = 0.2
"""Seconds between looks at the dataset's epoch while this process journals claims."""
JOURNAL_SPAN: Final = 60.0
"""Seconds a claim stays journaled after its last write (longer when its lease is)."""
JOURNAL_BUDGET: Final = Budget(max_entries=10_000, max_bytes=64 * MIB)
"""What the journal of one process may hold."""
KIND_EPOCH: Final = "dedup-epoch"

_PRELUDE: Final = (
    NOW_LUA
    + """
local epoch = redis.call('GET', KEYS[2])
if not epoch then
  epoch = string.format('%.6f', now)
  redis.call('SET', KEYS[2], epoch)
end
if ARGV[2] ~= '' and ARGV[2] ~= epoch then
  local hold = tonumber(ARGV[3])
  redis.call('SET', KEYS[3], tonumber(epoch) + hold, 'NX', 'PX', math.ceil(hold * 1000) + 1000)
end
local function fields()
  local all, out = redis.call('HGETALL', KEYS[1]), {}
  for i = 1, #all, 2 do
    if all[i] ~= 'r' then out[#out + 1] = all[i]; out[#out + 1] = all[i + 1] end
  end
  return out
end
"""
)
"""Every script starts here. KEYS: entry, the dataset's epoch marker, the restore hold. ARGV: a test clock's now
('' for Redis ``TIME``: leases are judged by the store's clock, never a caller's), the epoch this process last saw,
the restore hold in seconds. A dataset without a marker is new (a first start, or a restart that lost the data):
it is stamped with the time; a process that saw another epoch before then holds missing keys for the restore
hold (every live process writes back the claims it journaled meanwhile). ``fields()`` is the entry without its
response (the caller has that already). Own ARGV start at 4."""

_BEGIN: Final = (
    _PRELUDE
    + """
local e = redis.call('HMGET', KEYS[1], 'h', 'exp', 'st', 'r', 'w', 'wend')
if e[1] and tonumber(e[6]) > now then
  local st = e[3]
  if st == 'in_flight' and tonumber(e[2]) <= now then st = 'unknown' end
  if e[1] ~= ARGV[4] then return {epoch, 'conflict'} end
  if st == 'done' then return {epoch, 'done', e[4]} end
  if st == 'in_flight' then return {epoch, 'inflight'} end
  redis.call('HSET', KEYS[1], 'st', 'in_flight', 'owner', ARGV[6], 'exp', now + ARGV[5])
  return {epoch, 'unknown', e[5] or '', fields()}
end
local held = tonumber(redis.call('GET', KEYS[3]) or '0')
if held > now then return {epoch, 'held', tostring(held - now)} end
redis.call('DEL', KEYS[1])
local span = math.max(tonumber(ARGV[7]), tonumber(ARGV[5]))
redis.call('HSET', KEYS[1], 'h', ARGV[4], 'exp', now + ARGV[5], 'wend', now + span, 'win', span,
  'st', 'in_flight', 'owner', ARGV[6], 'w', ARGV[8])
redis.call('PEXPIRE', KEYS[1], math.ceil(span * 1000))
return {epoch, 'new', '', fields()}
"""
)
"""ARGV: payload hash, lease seconds, owner token, window seconds, where. An ``in_flight`` entry whose lease has
passed (by the store's clock) reads as ``unknown`` (its owner crashed and may have sent it), never as new; a
missing key during a restore hold is ``held`` (seconds left), not new."""

_COMPLETE: Final = (
    _PRELUDE
    + """
local held = redis.call('HMGET', KEYS[1], 'owner', 'st')
if held[1] ~= ARGV[4] and held[2] ~= 'unknown' then return {epoch, 0} end
local win = tonumber(redis.call('HGET', KEYS[1], 'win'))
redis.call('HSET', KEYS[1], 'st', 'done', 'r', ARGV[5], 'exp', now + win, 'wend', now + win, 'owner', '')
redis.call('PEXPIRE', KEYS[1], math.ceil(win * 1000))
redis.call('PUBLISH', ARGV[6], ARGV[7])
return {epoch, 1, fields()}
"""
)
"""ARGV: owner token, response JSON, channel, key. The owner's claim, or a key left ``unknown`` (the owner's lease
lapsed and a twin found it so): the result is what ran, so it settles the unknown too; another's live claim or
result is never overwritten."""

_UNKNOWN: Final = (
    _PRELUDE
    + """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[4] then return {epoch, 0} end
local wend = redis.call('HGET', KEYS[1], 'wend')
redis.call('HSET', KEYS[1], 'st', 'unknown', 'exp', wend, 'owner', '')
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'w', ARGV[5]) end
redis.call('PUBLISH', ARGV[6], ARGV[7])
return {epoch, 1, fields()}
"""
)
"""ARGV: owner token, where, channel, key."""

_SENT: Final = (
    _PRELUDE
    + """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[4] then return {epoch, 0} end
redis.call('HSET', KEYS[1], 'w', ARGV[5])
return {epoch, 1, fields()}
"""
)
"""ARGV: owner token, where."""

_FAIL: Final = (
    _PRELUDE
    + """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[4] then return {epoch, 0} end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[5], ARGV[6])
return {epoch, 1}
"""
)
"""ARGV: owner token, channel, key."""

_PEEK: Final = (
    _PRELUDE
    + """
local e = redis.call('HMGET', KEYS[1], 'h', 'exp', 'st', 'r')
if (not e[1]) or tonumber(e[2]) <= now or e[3] == 'unknown' then return {epoch, 'settled'} end
if e[4] then return {epoch, 'done', e[4]} end
return {epoch, 'inflight', tostring(tonumber(e[2]) - now)}
"""
)
"""A waiter's look: ``settled`` (no live entry, or ``unknown``), ``done`` and the response, or ``inflight`` and
the seconds left of its lease (by the store's clock)."""

_RESTORE: Final = (
    _PRELUDE
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then
  local now_held = redis.call('HMGET', KEYS[1], 'owner', 'st')
  local mine = ARGV[5] ~= '' and now_held[1] == ARGV[5]
  local known = now_held[2] == 'unknown' and ARGV[6] == 'done'
  if not (mine or known) then return {epoch, 0} end
end
local wend = tonumber(ARGV[4])
if wend <= now then return {epoch, 0} end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 7))
redis.call('PEXPIRE', KEYS[1], math.ceil((wend - now) * 1000))
return {epoch, 1}
"""
)
"""Write a journaled claim back: into a dataset that lost it, over this process's own claim it settled while
Redis could not be told, or as the result of a key left ``unknown`` meanwhile (its lease lapsed while Redis was
away: the result is what it did); never over anyone else's live claim or result. ARGV: window end, the owner
token the entry may still carry ('' for none), the journaled state, then the fields as name, value pairs."""

_EPOCH: Final = (
    _PRELUDE
    + """
return {epoch}
"""
)
"""Only the prelude: which dataset is this (stamping a new one)."""

_RECHECK: Final = object()
"""What a waiter is woken with when only Redis knows the outcome (a message from another process)."""


@dataclass(slots=True)
class _Journaled:
    """What this process last wrote (or meant to write) for a key: restored into a dataset that lost it."""

    fields: dict[str, str]
    owner: str
    """The owner token the Redis entry may still carry ('' once settled there)."""
    until: float
    """Local monotonic time after which it is forgotten."""

    def pairs(self) -> list[str]:
        return [item for pair in self.fields.items() for item in pair]


class RedisDedupStore(RedisStore):
    """:class:`~reach_plugins.stores.dedup.DedupStore` in Redis; passes ``tests/dedup_store_conformance.py``.

    ``clock`` replaces Redis's clock in the scripts (a test's fake one); left out, every lease is judged by Redis
    ``TIME``, so callers' skewed clocks cannot shorten or stretch a claim.
    """

    def __init__(
        self,
        redis: Any,
        *,
        prefix: str = "reach:",
        clock: Clock | None = None,
        on_outage: OnOutage = "closed",
        max_value_bytes: int = MAX_VALUE_BYTES,
        restore_hold: float = RESTORE_HOLD,
        journal: Budget = JOURNAL_BUDGET,
        owns_client: bool = False,
    ) -> None:
        super().__init__(redis, prefix=prefix, max_value_bytes=max_value_bytes, owns_client=owns_client)
        if restore_hold <= 0:
            raise ConfigError(f"restore_hold must be positive seconds, got {restore_hold!r}")
        self.on_outage = on_outage
        self.restore_hold = restore_hold
        self._test_clock = clock
        self._clock = clock or SystemClock()
        self._scripts = {
            name: redis.register_script(text)
            for name, text in (
                ("begin", _BEGIN),
                ("complete", _COMPLETE),
                ("fail", _FAIL),
                ("unknown", _UNKNOWN),
                ("sent", _SENT),
                ("peek", _PEEK),
                ("restore", _RESTORE),
                ("epoch", _EPOCH),
            )
        }
        self._marks = [f"{prefix}dedup:epoch", f"{prefix}dedup:hold"]
        self._epoch = ""
        """The dataset this process last saw ('' before its first answer)."""
        self._journal: LruTable[_Journaled] = LruTable(journal, "dedup journal")
        self._pending: set[ScopedKey] = set()
        """Keys settled here while Redis could not be told."""
        self._abandoned: dict[ScopedKey, str] = {}
        """Claims nobody runs whose release Redis did not hear (``begin`` lost its answer, or ``fail`` could not be
        told), by owner token: released once Redis answers, so they never lapse into ``unknown``."""
        self._restoring = asyncio.Lock()
        self._watcher: asyncio.Task[None] | None = None
        self._claims: dict[ScopedKey, str] = {}
        self._waiting: dict[ScopedKey, set[asyncio.Future[object]]] = {}
        self._settled = Subscription(redis, f"{prefix}dedup:settled", self._on_settled, self._on_gap)

    async def _run(self, name: str, key: ScopedKey, *args: Any, notice: bool = True) -> list[Any]:
        """Run script ``name`` on ``key``; its answer after the epoch. A new dataset is restored into first
        (unless ``notice`` is off: the restore's own writes)."""
        now = "" if self._test_clock is None else repr(self._test_clock.now())
        argv = [now, self._epoch, self.restore_hold, *args]
        reply = await self._scripts[name](keys=[self._key(key), *self._marks], args=argv)
        epoch = text(reply[0])
        if notice and epoch != self._epoch:
            await self._new_epoch(epoch)
        return list(reply[1:])

    async def _new_epoch(self, epoch: str) -> None:
        """Redis answers from a dataset this process has not seen: write back what it journaled (once)."""
        async with self._restoring:
            if epoch == self._epoch:
                return
            seen, self._epoch = self._epoch, epoch
            if seen:
                logger.warning(
                    "redis at %s has a new dataset (restarted or flushed); restoring %d journaled claims",
                    describe(self.redis),
                    len(self._journal),
                )
                await self._restore(list(self._journal))

    async def _restore(self, keys: list[ScopedKey]) -> None:
        """Write journaled entries back (they never overwrite another process's)."""
        self._forget_old()
        for key in keys:
            entry = self._journal.peek(key)
            if entry is not None:
                wend = entry.fields.get("wend", "0")
                state = entry.fields.get("st", "")
                await self._run("restore", key, wend, entry.owner, state, *entry.pairs(), notice=False)
            self._pending.discard(key)

    def _journal_put(self, key: ScopedKey, fields: dict[str, str], owner: str, lease: float = 0.0) -> None:
        old = self._journal.peek(key)
        until = max(time.monotonic() + max(JOURNAL_SPAN, lease), old.until if old else 0.0)
        with contextlib.suppress(EntryTooLarge):
            self._journal.put(key, _Journaled(fields, owner, until), sum(map(len, fields.values())) + 64)
        self._forget_old()
        self._watch()

    def _forget_old(self) -> None:
        now = time.monotonic()
        while (oldest := self._journal.oldest()) is not None and oldest[1].until <= now:
            self._journal.pop(oldest[0])

    def _abandon(self, key: ScopedKey, token: str) -> None:
        """The claim may be in Redis with nobody to run it (its answer was lost): release it once Redis answers."""
        self._abandoned[key] = token
        self._watch()

    def _watch(self) -> None:
        """While anything is journaled, look at the dataset every :data:`EPOCH_CHECK` s (a restart is found soon)."""
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watching(), name="reach-redis-dedup-epoch")

    async def _watching(self) -> None:
        probe = ScopedKey("-", KIND_EPOCH, "-")
        while len(self._journal) or self._pending or self._abandoned:
            await asyncio.sleep(EPOCH_CHECK)
            self._forget_old()
            try:
                await self._run("epoch", probe)
                if self._pending:
                    await self._restore(list(self._pending))
                for key, token in list(self._abandoned.items()):
                    await self._run("fail", key, token, self._settled.channel, key.encode())
                    del self._abandoned[key]
            except OUTAGE_ERRORS:
                continue

    async def begin(
        self, key: ScopedKey, payload_hash: str, ttl: float, *, window: float | None = None, where: str | None = None
    ) -> Begin:
        token = uuid.uuid4().hex
        args = [payload_hash, ttl, token, ttl if window is None else window, where or ""]
        try:
            reply = await self._run("begin", key, *args)
        except asyncio.CancelledError:
            self._abandon(key, token)
            raise
        except OUTAGE_ERRORS as exc:
            self._abandon(key, token)
            if self.on_outage == "closed":
                raise unavailable(
                    self.redis,
                    f"idempotency key {shown(key)!r} cannot be checked and the call was not sent "
                    "(dedup fails closed; on_outage='open' runs such calls unguarded)",
                    exc,
                ) from exc
            logger.warning("redis at %s unreachable; running %r without dedup: %s", describe(self.redis), key, exc)
            return Begin("new")
        state = text(reply[0])
        if state == "conflict":
            raise conflict(key)
        if state == "done":
            return Begin("done", ReachResponse.model_validate_json(reply[1]))
        if state == "inflight":
            return Begin("inflight")
        if state == "held":
            raise BackendUnavailable(
                f"the dedup store lost its data (Redis restarted) and is restoring the claims its callers hold; "
                f"idempotency key {shown(key)!r} was not checked and the call was not sent: retry in "
                f"{float(text(reply[1])):.1f}s"
            )
        self._claims[key] = token
        self._journal_put(key, _fields(reply[2]), token, ttl)
        if state == "unknown":
            return Begin("unknown", where=text(reply[1]) or None)
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
        await self._settle(key, token, "complete", {"st": "done", "r": stored}, stored)

    async def unknown(self, key: ScopedKey, where: str | None) -> None:
        token = self._claims.pop(key, None)
        self._wake(key, None)
        if token is None:
            return
        change = {"st": "unknown", "w": where} if where else {"st": "unknown"}
        await self._settle(key, token, "unknown", change, where or "")

    async def _settle(self, key: ScopedKey, token: str, name: str, change: dict[str, str], value: str) -> None:
        """Settle the claim in Redis; while it cannot be told, journal the settlement to write when it is back."""
        try:
            reply = await self._run(name, key, token, value, self._settled.channel, key.encode())
        except OUTAGE_ERRORS as exc:
            logger.warning(
                "redis at %s unreachable; %s of %r kept to write later: %s", describe(self.redis), name, key, exc
            )
            entry = self._journal.peek(key)
            if entry is not None:
                fields = {**entry.fields, **change, "owner": ""}
                fields["exp"] = fields.get("wend", "0")
                self._journal_put(key, fields, token)
                self._pending.add(key)
            return
        if reply[0] == 1:
            self._journal_put(key, {**_fields(reply[1]), **change}, "")

    async def sent(self, key: ScopedKey, where: str) -> None:
        token = self._claims.get(key)
        if token is None:
            return
        try:
            reply = await self._run("sent", key, token, where)
        except OUTAGE_ERRORS as exc:
            logger.warning(
                "redis at %s unreachable; %r sent on to %s unrecorded: %s", describe(self.redis), key, where, exc
            )
            return
        if reply[0] == 1:
            self._journal_put(key, _fields(reply[1]), token)

    async def fail(self, key: ScopedKey) -> None:
        token = self._claims.pop(key, None)
        self._wake(key, None)
        if token is None:
            return
        self._journal.pop(key)
        self._pending.discard(key)
        try:
            await self._run("fail", key, token, self._settled.channel, key.encode())
        except asyncio.CancelledError:
            self._abandon(key, token)
            raise
        except OUTAGE_ERRORS as exc:
            logger.warning(
                "redis at %s unreachable; claim on %r released once it answers: %s", describe(self.redis), key, exc
            )
            self._abandon(key, token)

    async def wait(self, key: ScopedKey, timeout: float) -> ReachResponse | None:
        """The stored response once the claim settles; None if it failed, vanished, timed out or Redis is down."""
        waiter: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, set()).add(waiter)
        try:
            await self._settled.ensure()
            done, result, lease_left = await self._peek(key)
            if done:
                return result
            clock = self._clock
            try:
                async with clock.timeout_at(clock.now() + min(timeout, lease_left)):
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
        """``(settled, result, seconds left of the lease)``: a done or unknown entry, or none live, is settled."""
        reply = await self._run("peek", key)
        state = text(reply[0])
        if state == "settled":
            return True, None, 0.0
        if state == "done":
            return True, ReachResponse.model_validate_json(reply[1]), 0.0
        return False, None, float(text(reply[1]))

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
        """Stop listening and watching, wake every waiter (they get None); close the client if this store opened it."""
        await self._settled.aclose()
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        for key in list(self._waiting):
            self._wake(key, None)
        await self._close_client()


def _fields(raw: Any) -> dict[str, str]:
    """A flat ``HGETALL`` answer as a dict of text."""
    items = [text(item) for item in raw]
    return dict(zip(items[::2], items[1::2], strict=True))


def from_url(url: str, *, clock: Clock | None = None) -> RedisDedupStore:
    """``redis://host:port/db[?prefix=reach:&timeout=0.5&on_outage=closed&restore_hold=1]`` -> a store (own client)."""
    client, options = connect(url, options=("on_outage", "restore_hold"))
    try:
        hold = float(options.get("restore_hold", RESTORE_HOLD))
    except ValueError as exc:
        raise ConfigError(f"Redis URL {url!r}: restore_hold must be seconds, got {options['restore_hold']!r}") from exc
    return RedisDedupStore(
        client,
        prefix=options["prefix"],
        clock=clock,
        on_outage=on_outage(options.get("on_outage", "closed"), url),
        max_value_bytes=int(options["max_value_bytes"]),
        restore_hold=hold,
        owns_client=True,
    )
