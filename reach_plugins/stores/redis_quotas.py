"""Fleet-wide quotas in Redis: every layer of a call judged and charged in one Lua script, on Redis's clock.

Implements :class:`reach_plugins.stores.quotas.QuotaStore` with the rules of
:mod:`reach_plugins.policy.gcra`. Per layer two keys, both led by the
budget's owner (``prefix`` + the layer's :class:`~reach_plugins.stores.keys.ScopedKey`):
``...:rate`` holds the GCRA ``tat`` and expires once it is in the past, and
``...:leases`` is a sorted set ``lease id -> expiry`` that expires with its
last lease. Time is Redis ``TIME``, one clock for every process (a test may
pass its own). The script reads every layer before it writes any, so a call
refused by one layer costs the others nothing. All keys of one call must live
on one server (plain Redis or Sentinel, not Cluster).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

from reach_plugins.policy.gcra import CONCURRENCY_RETRY, EPSILON, QuotaLayer, Refusal, allowed_ahead, slots
from reach_plugins.stores.redis import NOW_LUA, OUTAGE_ERRORS, connect, unavailable

ACQUIRE_LUA: Final = (
    NOW_LUA
    + """
local ttl = tonumber(ARGV[2])
local id = ARGV[3]
local eps = tonumber(ARGV[4])
local retry_cap = tonumber(ARGV[5])
local n = #KEYS / 2
local tats = {}
for i = 1, n do
  local base = 5 + (i - 1) * 3
  local interval, ahead, cap = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
  if interval > 0 then
    local tat = tonumber(redis.call('GET', KEYS[2 * i - 1]) or '0')
    if tat < now then tat = now end
    tat = tat + interval
    local over = tat - now - ahead
    if over > eps then return {i, 'rate', string.format('%.17g', over)} end
    tats[i] = tat
  end
  if cap > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[2 * i], '-inf', now)
    if redis.call('ZCARD', KEYS[2 * i]) >= cap then
      local first = redis.call('ZRANGE', KEYS[2 * i], 0, 0, 'WITHSCORES')
      return {i, 'concurrency', string.format('%.17g', math.min(retry_cap, tonumber(first[2]) - now))}
    end
  end
end
for i = 1, n do
  if tats[i] then
    redis.call('SET', KEYS[2 * i - 1], string.format('%.17g', tats[i]), 'PX', math.ceil((tats[i] - now) * 1000) + 1000)
  end
  if tonumber(ARGV[5 + (i - 1) * 3 + 3]) > 0 then
    redis.call('ZADD', KEYS[2 * i], now + ttl, id)
    local last = redis.call('ZRANGE', KEYS[2 * i], -1, -1, 'WITHSCORES')
    redis.call('PEXPIRE', KEYS[2 * i], math.ceil((tonumber(last[2]) - now) * 1000) + 1000)
  end
end
return {0}
"""
)
"""KEYS: per layer its rate key and its leases key. ARGV: now ('' = Redis TIME), lease ttl, lease id, epsilon,
the longest concurrency retry_after, then per layer: seconds per call (0: no rate), how far ahead its tat may run
for this call's share, slots this call may see taken (0: no concurrency). Returns {0}, or {layer index (from 1),
'rate'|'concurrency', retry_after}."""

RENEW_LUA: Final = (
    NOW_LUA
    + """
local ttl = tonumber(ARGV[2])
local id = ARGV[3]
for i = 1, #KEYS do
  if redis.call('ZSCORE', KEYS[i], id) then
    redis.call('ZADD', KEYS[i], 'XX', now + ttl, id)
    local last = redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')
    redis.call('PEXPIRE', KEYS[i], math.ceil((tonumber(last[2]) - now) * 1000) + 1000)
  end
end
return 0
"""
)
"""KEYS: the leases keys of a call's concurrency layers. ARGV: now ('' = Redis TIME), ttl, lease id. A lease
still held is moved to ``now + ttl``; one that expired or was released is not brought back."""


class RedisQuotaStore:
    """:class:`~reach_plugins.stores.quotas.QuotaStore` in Redis, shared by every process that names it."""

    def __init__(
        self,
        redis: Any,
        *,
        prefix: str = "reach:",
        clock: Callable[[], float] | None = None,
        owns_client: bool = False,
    ) -> None:
        """``clock``: a test's clock, sent to the script as ``now`` (without one the script reads Redis ``TIME``)."""
        self.redis = redis
        self._prefix = prefix
        self._clock = clock
        self._owns_client = owns_client
        self._acquire = redis.register_script(ACQUIRE_LUA)
        self._renew = redis.register_script(RENEW_LUA)

    def _keys(self, layer: QuotaLayer) -> tuple[str, str]:
        base = f"{self._prefix}{layer.key}"
        return f"{base}:rate", f"{base}:leases"

    async def acquire(self, layers: Sequence[QuotaLayer], share: float, lease: str, ttl: float) -> Refusal | None:
        keys: list[str] = []
        args: list[Any] = ["" if self._clock is None else repr(self._clock()), repr(ttl), lease, EPSILON]
        args.append(CONCURRENCY_RETRY)
        for layer in layers:
            keys.extend(self._keys(layer))
            rate = layer.rate
            args += [
                0 if rate is None else repr(1.0 / rate),
                0 if rate is None else repr(allowed_ahead(layer, share)),
                0 if layer.concurrency is None else slots(layer, share),
            ]
        try:
            verdict = await self._acquire(keys=keys, args=args)
        except OUTAGE_ERRORS as exc:
            raise unavailable(self.redis, "the fleet's quotas cannot be checked", exc) from exc
        if int(verdict[0]) == 0:
            return None
        kind = verdict[1].decode() if isinstance(verdict[1], bytes) else str(verdict[1])
        return Refusal(layers[int(verdict[0]) - 1], "rate" if kind == "rate" else "concurrency", float(verdict[2]))

    async def renew(self, layers: Sequence[QuotaLayer], lease: str, ttl: float) -> None:
        counted = [self._keys(layer)[1] for layer in layers if layer.concurrency is not None]
        if not counted:
            return
        now = "" if self._clock is None else repr(self._clock())
        try:
            await self._renew(keys=counted, args=[now, repr(ttl), lease])
        except OUTAGE_ERRORS as exc:
            raise unavailable(self.redis, f"lease {lease} was not renewed (it may expire mid-call)", exc) from exc

    async def release(self, layers: Sequence[QuotaLayer], lease: str) -> None:
        counted = [self._keys(layer)[1] for layer in layers if layer.concurrency is not None]
        if not counted:
            return
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key in counted:
                    pipe.zrem(key, lease)
                await pipe.execute()
        except OUTAGE_ERRORS as exc:
            raise unavailable(self.redis, f"lease {lease} was not given back (it expires by itself)", exc) from exc

    async def aclose(self) -> None:
        if self._owns_client:
            await self.redis.aclose()


def from_url(url: str, *, clock: Callable[[], float] | None = None) -> RedisQuotaStore:
    """A store on ``redis://host:port/db?prefix=...&timeout=...`` (its own client, closed by ``aclose``)."""
    client, options = connect(url)
    return RedisQuotaStore(client, prefix=options["prefix"], clock=clock, owns_client=True)
