"""The Registry contract: who is registered, what they can do, which instances are alive.

Every backend (memory, file, etcd) keeps a local, synchronously readable view
(:class:`RegistryView`) so the router decides in microseconds without awaiting
I/O; writes and the watch stream are async. Liveness is judged at read time
from ``last_heartbeat`` and an injectable clock, so tests never sleep.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from reach_plugins.model import AgentDescriptor, Instance, InstanceStatus

if TYPE_CHECKING:
    from reach_plugins.config.loader import TenantConfig

Clock = Callable[[], float]
"""Seconds since the epoch; ``time.time`` unless a test injects a fake."""

EventKind = Literal["agent_put", "agent_deleted", "instance_put", "instance_deleted", "instance_down", "instance_up"]


@dataclass(frozen=True, slots=True)
class RegistryEvent:
    """One change seen by ``watch()``; ``revision`` grows with every change."""

    kind: EventKind
    agent: str
    instance_id: str | None = None
    revision: int = 0
    status: InstanceStatus | None = None
    """An ``instance_put``'s new status, an ``instance_deleted``'s last (None for a static instance): gone while
    ``ready`` is a lease that expired, after ``draining`` a stop (read here: the view may already be past it)."""


@runtime_checkable
class RegistryView(Protocol):
    """Synchronous read side used by the router on every decision.

    ``revision`` changes whenever agents or the set of instances change (not on
    mere heartbeats), so an index built from the view can be cached by it.
    ``health`` also moves when an instance's standing changes without time
    passing (it comes back up, is judged down, reports another status): the
    router's pools keep a look until it moves, instead of re-checking every
    instance of an idle caller's pool (:mod:`reach_plugins.routing.pool`).
    """

    @property
    def revision(self) -> int: ...

    @property
    def health(self) -> int: ...

    def agents(self) -> Mapping[str, AgentDescriptor]: ...

    def instances(self, agent: str) -> Mapping[str, Instance]: ...

    def is_alive(self, instance: Instance, now: float) -> bool: ...


@runtime_checkable
class Registry(RegistryView, Protocol):
    """Async write side plus the watch stream. Every backend passes ``tests/registry_conformance.py``."""

    clock: Clock

    @property
    def tenants(self) -> Mapping[str, TenantConfig] | None:
        """The tenant table that comes with the agents (a YAML file's ``tenants:``), or ``None`` when none does.

        The tenants port: a client built without ``tenants=`` takes this one, so
        a registry that carries tenants says so here rather than being probed for it.
        """
        ...

    async def register_agent(self, descriptor: AgentDescriptor) -> None:
        """Insert or replace an agent; its ``endpoints`` become static instances."""
        ...

    async def deregister_agent(self, name: str) -> None: ...

    async def register_instance(self, instance: Instance) -> None: ...

    async def deregister_instance(self, agent: str, instance_id: str) -> None: ...

    async def heartbeat(
        self,
        agent: str,
        instance_id: str,
        seq: int,
        *,
        load: float | None = None,
        status: InstanceStatus | None = None,
    ) -> None:
        """Record a heartbeat; a ``seq`` not greater than the last one seen is ignored."""
        ...

    async def get(self, name: str) -> AgentDescriptor | None: ...

    async def match(self, capability: str, *, intent: str | None = None) -> list[AgentDescriptor]: ...

    def watch(self) -> AsyncIterator[RegistryEvent]: ...

    async def aclose(self) -> None: ...

    async def list(self) -> list[AgentDescriptor]:
        """Every registered agent (declared last: the name shadows ``list`` in annotations below it)."""
        ...


def default_clock() -> float:
    return time.time()
