"""The etcd registry's local state: a :class:`MemoryRegistry` kept equal to the keys under one prefix.

No I/O here: the registry feeds it etcd's listings and watch events (any
objects shaped like aetcd's: ``kv.key``, ``kv.value``, ``kv.lease``,
``kv.mod_revision``, ``event.kind``, ``listing.header.revision``) and it turns
them into ordinary registry events. It also tracks the revision applied so far,
so a writer can wait until its own write is visible (read-your-writes).

Key layout under the prefix, names percent-encoded so any name is one segment::

    {prefix}agents/{name}             AgentDescriptor JSON
    {prefix}instances/{agent}/{id}    Instance JSON (bound to a lease)
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final
from urllib.parse import quote, unquote

from pydantic import ValidationError

from reach_plugins.endpoints import EndpointPolicy
from reach_plugins.errors import ConfigError
from reach_plugins.model import AgentDescriptor, Instance
from reach_plugins.registry.base import Clock
from reach_plugins.registry.memory import MemoryRegistry, check_filed

logger = logging.getLogger(__name__)

_BEAT_FIELDS: Final = ("heartbeat_seq", "last_heartbeat", "load", "status")
SETTLE_WINDOW: Final = 1.0
"""Seconds after etcd first answers again after an outage in which deletions are read as the hang's revocations
(resuming from a hang, etcd revokes at once the leases that ran out; after a restart it renews every lease for
its TTL, at least 2 s, so a dead process's key goes later than this and is dropped as usual)."""
SETTLE: Final = 2.0
"""Seconds an instance whose key is deleted just after an outage stays routable. etcd resuming from a hang revokes
at once every lease that ran out meanwhile, though the processes holding them live on; they write their keys again
under new leases within this (a process that did die meanwhile is left by its breaker, then by this timeout)."""


class Keys:
    """The key layout under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix.encode()
        self.agents = self.prefix + b"agents/"
        self.instances = self.prefix + b"instances/"

    def agent(self, name: str) -> bytes:
        return self.agents + quote(name, safe="").encode()

    def instances_of(self, agent: str) -> bytes:
        return self.instances + quote(agent, safe="").encode() + b"/"

    def instance(self, agent: str, instance_id: str) -> bytes:
        return self.instances_of(agent) + quote(instance_id, safe="").encode()

    def parse(self, key: bytes) -> tuple[str, str | None] | None:
        """``(agent, None)`` for an agent key, ``(agent, instance_id)`` for an instance key, else None."""
        if key.startswith(self.agents):
            return unquote(key[len(self.agents) :].decode()), None
        if key.startswith(self.instances):
            agent, sep, instance_id = key[len(self.instances) :].decode().partition("/")
            return (unquote(agent), unquote(instance_id)) if sep else None
        return None


def _is_beat(current: Instance, new: Instance) -> bool:
    """Whether ``new`` is ``current`` plus a newer heartbeat (seq, time, load, status) and nothing else."""
    if new.last_heartbeat is None or new.heartbeat_seq <= current.heartbeat_seq:
        return False
    return current.model_copy(update={name: getattr(new, name) for name in _BEAT_FIELDS}) == new


class EtcdMirror:
    """A MemoryRegistry (``cache``) that mirrors etcd, plus the lease of each instance key and the applied revision."""

    def __init__(
        self, keys: Keys, clock: Clock, endpoints: EndpointPolicy, *, monotonic: Clock = time.monotonic
    ) -> None:
        self.keys = keys
        self.monotonic = monotonic
        """Times the settling after an outage (how fast processes write their keys again): real time, even under a
        test's fake registry clock."""
        self.endpoints = endpoints
        """Records read back are admitted under it: one that breaks it is ignored with a warning."""
        self.clock = clock
        """The registry's clock: a heartbeat counts from when the watch showed it, never from the writer's stamp."""
        self.cache = MemoryRegistry(clock=lambda: self.clock())
        self.applied = 0
        """The etcd revision the cache reflects."""
        self._leases: dict[tuple[str, str], int] = {}
        self.settle_until = 0.0
        """Until when (``monotonic``) a deleted key of a ready instance lingers (set as etcd answers again)."""
        self._lingering: dict[tuple[str, str], float] = {}
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def lease_of(self, agent: str, instance_id: str) -> int:
        """The lease the instance key was last seen with (0: none known)."""
        return self._leases.get((agent, instance_id), 0)

    async def apply_listing(self, listing: Any) -> None:
        """Make the cache equal to a full listing of the prefix, emitting the differences as events."""
        agents: dict[str, AgentDescriptor] = {}
        instances: dict[tuple[str, str], tuple[Instance, int]] = {}
        for kv in listing:
            record = self._decode(kv.key, kv.value)
            if isinstance(record, AgentDescriptor):
                agents[record.name] = record
            elif isinstance(record, Instance):
                instances[record.agent, record.instance_id] = (record, int(kv.lease))
        cache = self.cache
        for name in [name for name in cache.agents() if name not in agents]:
            self._forget_agent(name)
        for descriptor in agents.values():
            cache.put_agent(descriptor)
        for name, descriptor in cache.agents().items():
            static = {instance.instance_id for instance in descriptor.static_instances()}
            for instance_id in [i for i in cache.instances(name) if i not in static and (name, i) not in instances]:
                await self._deleted(name, instance_id)
        for instance, lease in instances.values():
            await self._put_instance(instance, lease)
        self.applied = int(listing.header.revision)
        self._wake_writers()

    async def apply_event(self, event: Any) -> None:
        """Apply one watch event (a put or delete of an agent or instance key)."""
        kv = event.kv
        parsed = self.keys.parse(kv.key)
        if parsed is not None and event.kind == "DELETE":
            name, instance_id = parsed
            if instance_id is None:
                self._forget_agent(name)
            else:
                await self._deleted(name, instance_id)
        elif parsed is not None:
            record = self._decode(kv.key, kv.value)
            if isinstance(record, AgentDescriptor):
                self.cache.put_agent(record)
            elif isinstance(record, Instance):
                await self._put_instance(record, int(kv.lease))
        self.applied = max(self.applied, int(kv.mod_revision))
        self._wake_writers()

    def outage_over(self) -> None:
        """etcd answers again after an outage: ready instances deleted within SETTLE_WINDOW linger (see SETTLE)."""
        self.settle_until = self.monotonic() + SETTLE_WINDOW

    async def expire(self) -> None:
        """Drop the lingering instances whose key did not come back within SETTLE."""
        now = self.monotonic()
        for key, until in list(self._lingering.items()):
            if until <= now:
                logger.info("etcd instance %s/%s did not come back after the outage; dropped", *key)
                await self._drop_instance(*key)

    async def caught_up(self, revision: int, timeout: float) -> bool:
        """Wait until ``revision`` is applied; False if it was not within ``timeout`` seconds."""
        if self.applied >= revision:
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((revision, waiter))
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            return False
        return True

    def _wake_writers(self) -> None:
        pending = []
        for revision, waiter in self._waiters:
            if revision <= self.applied:
                if not waiter.done():
                    waiter.set_result(None)
            elif not waiter.done():
                pending.append((revision, waiter))
        self._waiters = pending

    def _decode(self, key: bytes, value: bytes) -> AgentDescriptor | Instance | None:
        """The record at ``key``, or None (logged) when it is invalid or claims another identity than its key's.

        The key is the authority: the secured layout lets an agent's user write only under
        ``instances/<agent>/``, so a value saying another agent or id there is a forgery (issue 24).
        """
        parsed = self.keys.parse(key)
        if parsed is None:
            return None
        try:
            record: AgentDescriptor | Instance
            claimed: tuple[str, str | None]
            if parsed[1] is None:
                record = AgentDescriptor.model_validate_json(value)
                claimed = (record.name, None)
                check_filed(record)
                self.endpoints.admit((i.endpoint for i in record.static_instances()), f"agent {record.name!r}")
            else:
                record = Instance.model_validate_json(value)
                claimed = (record.agent, record.instance_id)
                self.endpoints.admit([record.endpoint], f"instance {record.agent}/{record.instance_id}")
        except (ValidationError, ConfigError) as exc:
            logger.warning("etcd key %r holds no valid registry record, ignored: %s", key, exc)
            return None
        if claimed != parsed:
            logger.warning(
                "etcd key %r refused: its value says %s, but the key is %s's (identity comes from the key)",
                key,
                "/".join(part for part in claimed if part is not None),
                "/".join(part for part in parsed if part is not None),
            )
            return None
        return record

    async def _put_instance(self, instance: Instance, lease: int) -> None:
        """Apply an instance key: a newer heartbeat of a known instance, else a (re)registration.

        Its ``last_heartbeat`` becomes the time it is seen here (the registry's clock): an agent's clock running
        ahead or behind neither keeps a dead instance alive nor kills a live one (issue 25).
        """
        agent, instance_id = instance.agent, instance.instance_id
        if agent not in self.cache.agents():
            logger.debug("etcd instance %s/%s of an unregistered agent ignored", agent, instance_id)
            return
        self._leases[agent, instance_id] = lease
        self._lingering.pop((agent, instance_id), None)
        current = self.cache.instances(agent).get(instance_id)
        if instance.last_heartbeat is not None:
            if (
                current is not None
                and current.model_copy(update={"last_heartbeat": instance.last_heartbeat}) == instance
            ):
                return  # the record as already seen (a relist, an owner writing it again): it keeps its time
            instance = instance.model_copy(update={"last_heartbeat": self.clock()})
        if current is not None and _is_beat(current, instance):
            await self.cache.heartbeat(
                agent, instance_id, instance.heartbeat_seq, load=instance.load, status=instance.status
            )
        else:
            await self.cache.register_instance(instance)

    async def _deleted(self, agent: str, instance_id: str) -> None:
        """An instance key is gone: drop the instance, unless etcd just came back and it was ready (see SETTLE)."""
        now = self.monotonic()
        current = self.cache.instances(agent).get(instance_id)
        if now < self.settle_until and current is not None and current.status == "ready" and current.last_heartbeat:
            if (agent, instance_id) not in self._lingering:
                logger.info(
                    "etcd deleted %s/%s right after an outage; kept %gs for it to come back", agent, instance_id, SETTLE
                )
                self._lingering[agent, instance_id] = now + SETTLE
            return
        await self._drop_instance(agent, instance_id)

    async def _drop_instance(self, agent: str, instance_id: str) -> None:
        self._lingering.pop((agent, instance_id), None)
        self._leases.pop((agent, instance_id), None)
        await self.cache.deregister_instance(agent, instance_id)

    def _forget_agent(self, name: str) -> None:
        self.cache.delete_agent(name)
        for key in [key for key in self._leases if key[0] == name]:
            del self._leases[key]
        for key in [key for key in self._lingering if key[0] == name]:
            del self._lingering[key]
