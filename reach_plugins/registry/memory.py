"""The embedded registry: agents and instances in dicts, liveness judged at read time.

This is the default backend (``memory://``) and the state store the file
backend delegates to. Writes are ``async`` to honour the :class:`Registry`
contract but never wait on anything; the read side is plain dict lookups so the
router can decide without awaiting. A heartbeat replaces one ``Instance``
record in place and does not bump ``revision``: only a change to the set of
agents or instances does, so caches keyed by ``revision`` survive heartbeats.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator, Mapping
from types import MappingProxyType
from typing import Final

from reach_plugins.endpoints import ANY_NETWORK, EndpointPolicy
from reach_plugins.errors import ConfigError, RequestError
from reach_plugins.model import AgentDescriptor, HealthCheck, Instance, InstanceStatus
from reach_plugins.registry.base import Clock, EventKind, RegistryEvent, default_clock

logger = logging.getLogger(__name__)

_NO_INSTANCES: Final[Mapping[str, Instance]] = MappingProxyType({})
_DEFAULT_GRACE: Final[float] = HealthCheck().interval * HealthCheck().missed_heartbeats
_CLOSED: Final = None


class _Watcher:
    """One ``watch()`` stream: a bounded queue fed by the registry.

    A watcher that falls ``maxsize`` events behind loses its oldest events (one
    warning per episode): a slow consumer must never block or grow the registry.
    The registry holds watchers weakly, so a stream the caller drops unsubscribes
    itself.
    """

    def __init__(self, maxsize: int) -> None:
        self._queue: asyncio.Queue[RegistryEvent | None] = asyncio.Queue(maxsize)
        self._closed = False
        self._lagging = False

    def push(self, event: RegistryEvent | None) -> None:
        if self._closed:
            return
        if self._queue.full():
            self._queue.get_nowait()
            if not self._lagging:
                logger.warning("registry watcher fell %d events behind; dropping the oldest", self._queue.maxsize)
            self._lagging = True
        self._queue.put_nowait(event)
        if event is _CLOSED:
            self._closed = True

    def __aiter__(self) -> _Watcher:
        return self

    async def __anext__(self) -> RegistryEvent:
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        event = await self._queue.get()
        if self._queue.empty():
            self._lagging = False
        if event is _CLOSED:
            raise StopAsyncIteration
        return event


def check_filed(descriptor: AgentDescriptor) -> None:
    """Refuse a descriptor listing an instance of another agent: a record agrees with where it is filed.

    An instance's identity is where it was allowed to be written (here: under
    its agent's descriptor), never what its value claims (issue 24).
    """
    for instance in descriptor.instances:
        if instance.agent != descriptor.name:
            raise ConfigError(
                f"agent {descriptor.name!r}: its instance {instance.instance_id!r} says agent {instance.agent!r}; "
                f"an agent lists only its own instances (write agent: {descriptor.name}, or list it under "
                f"{instance.agent})"
            )


class MemoryRegistry:
    """In-process :class:`~reach_plugins.registry.base.Registry`; passes the conformance suite.

    ``clock`` judges liveness: a heartbeat-tracked instance is down once
    ``health_check.missed_heartbeats`` x ``health_check.interval`` passed
    without a heartbeat, and alive again as soon as one arrives. ``sweep()``
    turns those transitions into ``instance_down`` / ``instance_up`` events.
    ``endpoints`` is the policy every written agent and instance must pass
    (a ``ConfigError`` names the endpoint and the rule otherwise).
    """

    def __init__(
        self, *, clock: Clock | None = None, watch_buffer: int = 1024, endpoints: EndpointPolicy = ANY_NETWORK
    ) -> None:
        if watch_buffer < 1:
            raise ConfigError(f"watch_buffer must be at least 1 event, got {watch_buffer}")
        self.clock: Clock = clock or default_clock
        self.endpoints = endpoints
        self._watch_buffer = watch_buffer
        self._agents: dict[str, AgentDescriptor] = {}
        self._instances: dict[str, dict[str, Instance]] = {}
        self._static: dict[str, set[str]] = {}
        self._grace: dict[str, float] = {}
        self._down: set[tuple[str, str]] = set()
        self._revision = 0
        self._health = 0
        self._watchers: weakref.WeakSet[_Watcher] = weakref.WeakSet()

    # ------------------------------------------------------------------ read side (sync)

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def health(self) -> int:
        """Moves on every event and on a heartbeat that reports another status (see :class:`RegistryView`)."""
        return self._health

    @property
    def tenants(self) -> None:
        """No tenant table comes with these agents: a client takes its own (``tenants=``)."""
        return None

    def agents(self) -> Mapping[str, AgentDescriptor]:
        return self._agents

    def instances(self, agent: str) -> Mapping[str, Instance]:
        return self._instances.get(agent, _NO_INSTANCES)

    def is_alive(self, instance: Instance, now: float) -> bool:
        """Static instances are alive unless ``down``; tracked ones need a fresh heartbeat."""
        if instance.status == "down":
            return False
        seen = instance.last_heartbeat
        return seen is None or now - seen <= self._grace.get(instance.agent, _DEFAULT_GRACE)

    # ------------------------------------------------------------------ sync writes

    def put_agent(self, descriptor: AgentDescriptor) -> bool:
        """Insert or replace an agent; return whether anything changed.

        Its ``endpoints`` / ``instances`` become static instances; instances
        registered separately (heartbeat-tracked) survive a replacement.
        """
        name = descriptor.name
        if self._agents.get(name) == descriptor:
            return False
        check_filed(descriptor)
        self.endpoints.admit((i.endpoint for i in descriptor.static_instances()), f"agent {descriptor.name!r}")
        self._agents[name] = descriptor
        check = descriptor.health_check
        self._grace[name] = check.interval * check.missed_heartbeats
        self._emit("agent_put", name)
        current = self._instances.setdefault(name, {})
        wanted = {inst.instance_id: inst for inst in descriptor.static_instances()}
        for instance_id in self._static.get(name, set()) - wanted.keys():
            self._drop_instance(name, instance_id)
        for instance_id, instance in wanted.items():
            if current.get(instance_id) != instance:
                current[instance_id] = instance
                self._emit("instance_put", name, instance_id, status=instance.status)
        self._static[name] = set(wanted)
        return True

    def delete_agent(self, name: str) -> bool:
        """Remove an agent and all its instances; return whether it existed."""
        if name not in self._agents:
            return False
        for instance_id in list(self._instances.get(name, ())):
            self._drop_instance(name, instance_id)
        del self._agents[name]
        self._instances.pop(name, None)
        self._static.pop(name, None)
        self._grace.pop(name, None)
        self._emit("agent_deleted", name)
        return True

    def sweep(self) -> list[RegistryEvent]:
        """Compare every instance's liveness with the last sweep; emit and return the transitions."""
        now = self.clock()
        events: list[RegistryEvent] = []
        for instances in self._instances.values():
            for instance in instances.values():
                event = self._judge(instance, now)
                if event is not None:
                    events.append(event)
        return events

    # ------------------------------------------------------------------ async writes (Registry contract)

    async def register_agent(self, descriptor: AgentDescriptor) -> None:
        self.put_agent(descriptor)

    async def deregister_agent(self, name: str) -> None:
        self.delete_agent(name)

    async def register_instance(self, instance: Instance) -> None:
        """Add or replace an instance of a registered agent."""
        agent = instance.agent
        if agent not in self._agents:
            raise RequestError(
                f"cannot register instance {instance.instance_id!r}: agent {agent!r} is not registered; "
                "register the agent first"
            )
        instances = self._instances[agent]
        if instances.get(instance.instance_id) == instance:
            return
        self.endpoints.admit([instance.endpoint], f"instance {instance.agent}/{instance.instance_id}")
        instances[instance.instance_id] = instance
        self._static.get(agent, set()).discard(instance.instance_id)
        self._emit("instance_put", agent, instance.instance_id, status=instance.status)
        self._judge(instance, self.clock())

    async def deregister_instance(self, agent: str, instance_id: str) -> None:
        self._drop_instance(agent, instance_id)

    async def heartbeat(
        self,
        agent: str,
        instance_id: str,
        seq: int,
        *,
        load: float | None = None,
        status: InstanceStatus | None = None,
    ) -> None:
        """Refresh one instance; a ``seq`` not greater than the last one is stale and ignored."""
        current = self._instances.get(agent, {}).get(instance_id)
        if current is None:
            raise RequestError(
                f"heartbeat for unknown instance {agent}/{instance_id}; register the instance again "
                "(the registry may have restarted or deregistered it)"
            )
        if seq <= current.heartbeat_seq:
            return
        if load is not None and not 0.0 <= load <= 1.0:
            raise RequestError(f"heartbeat load must lie in [0, 1], got {load!r} from {agent}/{instance_id}")
        now = self.clock()
        changes: dict[str, object] = {"heartbeat_seq": seq, "last_heartbeat": now}
        if load is not None:
            changes["load"] = load
        if status is not None:
            changes["status"] = status
            self._health += status != current.status
        refreshed = current.model_copy(update=changes)
        self._instances[agent][instance_id] = refreshed
        self._judge(refreshed, now)

    # ------------------------------------------------------------------ async reads

    async def get(self, name: str) -> AgentDescriptor | None:
        return self._agents.get(name)

    async def match(self, capability: str, *, intent: str | None = None) -> list[AgentDescriptor]:
        """Agents offering ``capability``; with ``intent``, those whose intents are empty or contain it."""
        return [
            agent
            for agent in self._agents.values()
            if agent.capability(capability) is not None
            and (intent is None or not agent.intents or intent in agent.intents)
        ]

    def watch(self) -> AsyncIterator[RegistryEvent]:
        """Stream of changes from now on; each stream has its own bounded buffer."""
        watcher = _Watcher(self._watch_buffer)
        self._watchers.add(watcher)
        return watcher

    async def aclose(self) -> None:
        """End every watch stream."""
        for watcher in list(self._watchers):
            watcher.push(_CLOSED)
        self._watchers.clear()

    # ------------------------------------------------------------------ internals

    def _drop_instance(self, agent: str, instance_id: str) -> None:
        instances = self._instances.get(agent)
        gone = instances.pop(instance_id, None) if instances is not None else None
        if gone is None:
            return
        self._static.get(agent, set()).discard(instance_id)
        self._down.discard((agent, instance_id))
        tracked = gone.last_heartbeat is not None  # a static instance's removal is no heartbeat's doing
        self._emit("instance_deleted", agent, instance_id, status=gone.status if tracked else None)

    def _judge(self, instance: Instance, now: float) -> RegistryEvent | None:
        """Emit ``instance_down``/``instance_up`` when liveness differs from what was last reported."""
        key = (instance.agent, instance.instance_id)
        alive = self.is_alive(instance, now)
        if alive == (key not in self._down):
            return None
        if alive:
            self._down.discard(key)
            return self._emit("instance_up", instance.agent, instance.instance_id, bump=False)
        self._down.add(key)
        return self._emit("instance_down", instance.agent, instance.instance_id, bump=False)

    def _emit(
        self,
        kind: EventKind,
        agent: str,
        instance_id: str | None = None,
        *,
        bump: bool = True,
        status: InstanceStatus | None = None,
    ) -> RegistryEvent:
        if bump:
            self._revision += 1
        self._health += 1
        event = RegistryEvent(kind=kind, agent=agent, instance_id=instance_id, revision=self._revision, status=status)
        for watcher in list(self._watchers):
            watcher.push(event)
        return event

    async def list(self) -> list[AgentDescriptor]:
        """Every registered agent (last in the class: the name shadows ``list`` in annotations)."""
        return list(self._agents.values())


def from_url(
    url: str, *, clock: Clock | None = None, endpoints: EndpointPolicy = ANY_NETWORK, snapshot: bool = True
) -> MemoryRegistry:
    """``memory://`` -> a fresh, empty in-process registry (no snapshot to wait for, whatever ``snapshot`` says)."""
    if url != "memory://":
        raise ConfigError(f"registry URL {url!r}: memory:// takes no host or path; write exactly 'memory://'")
    return MemoryRegistry(clock=clock, endpoints=endpoints)
