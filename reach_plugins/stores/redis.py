"""Shared state in Redis (the ``redis`` extra): idempotency/dedup, session liveness, session snapshots.

Every store takes a ``redis.asyncio.Redis`` from outside (it does not close it)
or opens its own from a URL with :func:`connect`::

    redis://host:port/db?prefix=reach:&timeout=0.5

The client gets an explicit socket timeout (0.5 s unless told) and at most one
quick retry: redis-py's default of ten retries hides an outage for ~10 s.

What a store does while Redis is unreachable is chosen per store:

==========  =================  ========================================================
store       default            why
==========  =================  ========================================================
dedup       fails closed       a keyed call promised "at most once"; without the
                               store that promise cannot be kept, so nothing is sent
                               (``BackendUnavailable``) -- unless the target agent
                               declares shared idempotency: its own store guards the
                               key, and the call proceeds. ``on_outage=open`` runs it
                               unguarded instead, with a warning.
sessions    fails open         liveness stops ghost calls; refusing every conversation
                               because a cache is down would turn a Redis blip into an
                               outage. Checks pass with a warning; ``close`` raises
                               (it did not reach the other processes).
                               ``on_outage=closed`` refuses instead.
snapshots   save raises,       a lost save must be visible; an agent that cannot read
            load starts empty  its snapshot still starts (with fresh sessions).
==========  =================  ========================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from typing import Any, Final, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from reach_plugins.errors import BackendUnavailable, ConfigError, EntryTooLarge
from reach_plugins.stores.keys import ScopedKey

try:
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError('the Redis stores need redis-py: pip install "reach-plugins[redis]"') from exc

logger = logging.getLogger(__name__)

OnOutage = Literal["open", "closed"]
DEFAULT_PREFIX: Final = "reach:"
DEFAULT_TIMEOUT: Final = 0.5
MAX_VALUE_BYTES: Final = 8 << 20
"""Largest value a Redis store writes unless told (``max_value_bytes``): 8 MiB."""
NOW_LUA: Final = """
local now
if ARGV[1] ~= '' then now = tonumber(ARGV[1]) else
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""
"""How every script that judges time opens: ``now`` is Redis ``TIME`` (the store's clock, the same for every
caller), or ARGV[1] when a test's clock gives it ('' otherwise)."""
SUBSCRIBE_TIMEOUT: Final = 2.0
OUTAGE_ERRORS: Final = (RedisConnectionError, RedisTimeoutError, OSError)
"""What "Redis is unreachable" looks like (a refused or dropped connection, a timeout, a server still loading)."""


def connect(url: str, *, options: Collection[str] = ()) -> tuple[Any, dict[str, str]]:
    """Open a client for ``redis://host:port/db``; return it and the URL's store ``options`` (others refused).

    ``timeout`` (seconds) and ``prefix`` are understood here and returned along.
    """
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    allowed = {"timeout", "prefix", "max_value_bytes", *options}
    unknown = sorted(query.keys() - allowed)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname or unknown:
        raise ConfigError(
            f"Redis URL {url!r}: write redis://HOST:PORT/DB with optional "
            f"?{'&'.join(f'{name}=...' for name in sorted(allowed))}"
            + (f" (unknown option {', '.join(unknown)})" if unknown else "")
        )
    try:
        port = parts.port or 6379
        db = int(parts.path.strip("/") or 0)
        timeout = float(query.get("timeout", DEFAULT_TIMEOUT))
        max_value_bytes = int(query.get("max_value_bytes", MAX_VALUE_BYTES))
    except ValueError as exc:
        raise ConfigError(
            f"Redis URL {url!r}: {exc}; port and db are integers (so is max_value_bytes), timeout is seconds"
        ) from exc
    if timeout <= 0 or max_value_bytes < 1:
        raise ConfigError(
            f"Redis URL {url!r}: timeout must be positive seconds and max_value_bytes a positive integer, "
            f"got {timeout} and {max_value_bytes}"
        )
    client = aioredis.Redis(
        host=parts.hostname,
        port=port,
        db=db,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        ssl=parts.scheme == "rediss",
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 1),
    )
    query.setdefault("prefix", DEFAULT_PREFIX)
    query["max_value_bytes"] = str(max_value_bytes)
    return client, query


class RedisStore:
    """Base of every Redis store: keys are ``prefix`` + :meth:`ScopedKey.encode` (the tenant leads), values bounded.

    A value longer than ``max_value_bytes`` is refused with :class:`EntryTooLarge` before anything is written.
    ``redis`` is a ``redis.asyncio.Redis``, closed by ``aclose`` only if ``owns_client``.
    """

    def __init__(self, redis: Any, *, prefix: str, max_value_bytes: int, owns_client: bool) -> None:
        if max_value_bytes < 1:
            raise ConfigError(f"max_value_bytes must be a positive integer, got {max_value_bytes!r}")
        self.redis = redis
        self.max_value_bytes = max_value_bytes
        self._prefix = prefix
        self._owns_client = owns_client

    def _key(self, key: ScopedKey) -> str:
        return f"{self._prefix}{key.encode()}"

    def _bounded(self, key: ScopedKey, value: str, what: str) -> str:
        """``value`` when it fits ``max_value_bytes``; EntryTooLarge naming ``what`` otherwise."""
        size = len(value.encode())
        if size > self.max_value_bytes:
            raise EntryTooLarge(
                f"{what} of {key.id!r} (tenant {key.tenant!r}) is {size} bytes, over this Redis store's "
                f"max_value_bytes={self.max_value_bytes}; keep it smaller or raise max_value_bytes"
            )
        return value

    async def _close_client(self) -> None:
        if self._owns_client:
            await self.redis.aclose()


def on_outage(value: str, url: str) -> OnOutage:
    """Validate an ``on_outage`` option."""
    if value not in ("open", "closed"):
        raise ConfigError(f"Redis URL {url!r}: on_outage must be 'open' or 'closed', got {value!r}")
    return "open" if value == "open" else "closed"


def text(value: Any) -> str:
    """A Redis reply as text (bytes decoded; anything else by ``str``)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def describe(redis: Any) -> str:
    """``host:port/db`` of a client, for messages."""
    kwargs = getattr(getattr(redis, "connection_pool", None), "connection_kwargs", {})
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"


def unavailable(redis: Any, what: str, exc: BaseException) -> BackendUnavailable:
    """The error for an unreachable Redis, naming the server and what could not be done."""
    return BackendUnavailable(f"redis at {describe(redis)} is unreachable, so {what}: {exc or type(exc).__name__}")


class Subscription:
    """One pub/sub channel read by a background task, shared by a store's waiters.

    ``ensure()`` subscribes on first use and returns once Redis confirmed it, so
    a state read after it cannot miss a later message (it raises Redis's errors);
    if the connection drops, the reader stops, ``on_gap`` is told (messages may
    have been missed, so whoever waits should look again) and the next
    ``ensure()`` subscribes afresh.
    """

    def __init__(self, redis: Any, channel: str, on_message: Callable[[str], None], on_gap: Callable[[], None]) -> None:
        self._redis = redis
        self.channel = channel
        self._on_message = on_message
        self._on_gap = on_gap
        self._pubsub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._subscribing = asyncio.Lock()
        """One subscription at a time: concurrent first calls would each open (and leak) a pub/sub connection."""

    async def ensure(self) -> None:
        if self._pubsub is not None:
            return
        async with self._subscribing:
            if self._pubsub is None:
                await self._subscribe()

    async def _subscribe(self) -> None:
        pubsub = self._redis.pubsub()
        try:
            await pubsub.subscribe(self.channel)
            confirmed = await pubsub.get_message(timeout=SUBSCRIBE_TIMEOUT)
            if confirmed is None or confirmed["type"] != "subscribe":
                raise RedisTimeoutError(f"no confirmation of SUBSCRIBE {self.channel} within {SUBSCRIBE_TIMEOUT}s")
        except BaseException:
            await pubsub.aclose()
            raise
        self._pubsub = pubsub
        self._task = asyncio.create_task(self._read(pubsub), name=f"reach-redis-subscription {self.channel}")

    async def _read(self, pubsub: Any) -> None:
        try:
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is not None:
                    data = message["data"]
                    self._on_message(text(data))
        except OUTAGE_ERRORS as exc:
            logger.warning("redis subscription %s at %s lost: %s", self.channel, describe(self._redis), exc)
        finally:
            self._pubsub = None
            self._on_gap()
            with contextlib.suppress(*OUTAGE_ERRORS):
                await pubsub.aclose()

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
