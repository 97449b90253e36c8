"""Session snapshots in Redis: an agent's conversations survive a restart, on any host.

Implements :class:`reach_plugins.stores.snapshots.SnapshotStore`. One hash per
agent, ``{prefix}snapshots:{agent}``, one field per conversation (its
:class:`~reach_plugins.stores.keys.ScopedKey`, so the tenant is in every
field) holding its JSON state and its expiry, at most ``max_value_bytes``.
``save`` merges rather than replaces, so several instances of one agent sharing Redis each keep their conversations; a
conversation's state is dropped ``ttl`` seconds (a week unless told) after it
was last saved.

While Redis is unreachable ``save`` raises ``BackendUnavailable`` (a lost
snapshot must not pass silently) and ``load`` returns no sessions with a
warning (the agent still starts, with fresh conversations).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from reach_plugins.errors import ConfigError, InvalidPayload
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.stores.redis import MAX_VALUE_BYTES, OUTAGE_ERRORS, RedisStore, connect, describe, text, unavailable
from reach_plugins.stores.sessiontable import conversation_of, snapshot_name

logger = logging.getLogger(__name__)


class RedisSnapshotStore(RedisStore):
    """:class:`~reach_plugins.stores.snapshots.SnapshotStore` in Redis."""

    def __init__(
        self,
        redis: Any,
        *,
        ttl: float = 7 * 86_400.0,
        prefix: str = "reach:",
        clock: Callable[[], float] | None = None,
        max_value_bytes: int = MAX_VALUE_BYTES,
        owns_client: bool = False,
    ) -> None:
        if ttl <= 0:
            raise ConfigError(f"snapshot ttl must be positive seconds, got {ttl!r}")
        super().__init__(redis, prefix=prefix, max_value_bytes=max_value_bytes, owns_client=owns_client)
        self.ttl = ttl
        self._clock = clock or time.time

    def _hash(self, agent: str) -> str:
        return f"{self._prefix}snapshots:{agent}"

    async def save(self, agent: str, sessions: Mapping[str, dict[str, Any]]) -> None:
        """Store each conversation's state (merged with what other instances saved) for ``ttl`` seconds."""
        if not sessions:
            return
        expires = self._clock() + self.ttl
        fields: dict[str, str] = {}
        for name, state in sessions.items():
            conversation = conversation_of(name)
            try:
                value = json.dumps({"expires": expires, "state": state})
            except (TypeError, ValueError) as exc:
                raise InvalidPayload(
                    f"agent {agent!r}: state of conversation {name!r} cannot be saved as JSON ({exc}); "
                    "keep session state to JSON values (str, numbers, lists, dicts)"
                ) from exc
            fields[conversation.encode()] = self._bounded(conversation, value, f"agent {agent!r}: the state")
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(self._hash(agent), mapping=fields)
                pipe.pexpire(self._hash(agent), round(self.ttl * 1000))
                await pipe.execute()
        except OUTAGE_ERRORS as exc:
            raise unavailable(self.redis, f"the sessions of agent {agent!r} were not saved", exc) from exc

    async def load(self, agent: str) -> dict[str, dict[str, Any]]:
        """Every conversation of ``agent`` saved within ``ttl``; expired ones are removed on the way."""
        try:
            saved = await self.redis.hgetall(self._hash(agent))
        except OUTAGE_ERRORS as exc:
            logger.warning(
                "redis at %s unreachable; agent %r starts without its saved sessions: %s",
                describe(self.redis),
                agent,
                exc,
            )
            return {}
        now = self._clock()
        sessions: dict[str, dict[str, Any]] = {}
        expired: list[Any] = []
        for field, raw in saved.items():
            record = json.loads(raw)
            if record["expires"] > now:
                encoded = text(field)
                sessions[snapshot_name(ScopedKey.decode(encoded))] = record["state"]
            else:
                expired.append(field)
        if expired:
            try:
                await self.redis.hdel(self._hash(agent), *expired)
            except OUTAGE_ERRORS as exc:
                logger.warning("redis at %s: expired snapshots of %r not removed: %s", describe(self.redis), agent, exc)
        return sessions

    async def aclose(self) -> None:
        """Close the client if this store opened it."""
        await self._close_client()


def from_url(url: str, *, clock: Callable[[], float] | None = None) -> RedisSnapshotStore:
    """``redis://host:port/db[?prefix=reach:&timeout=0.5&ttl=604800]`` -> a store owning its client."""
    client, options = connect(url, options=("ttl",))
    try:
        ttl = float(options.get("ttl", 7 * 86_400.0))
    except ValueError as exc:
        raise ConfigError(f"Redis URL {url!r}: ttl must be seconds, got {options['ttl']!r}") from exc
    return RedisSnapshotStore(
        client,
        ttl=ttl,
        prefix=options["prefix"],
        clock=clock,
        max_value_bytes=int(options["max_value_bytes"]),
        owns_client=True,
    )
