"""The route table a server routes from: a registry snapshot with a short TTL, dropped on every watch event.

A gateway or node answers many callers from one registry. Reading the
registry once per TTL (instead of per request) bounds what a remote registry
costs, and following its watch stream makes a change visible at once rather
than after the TTL. Liveness is still judged by the registry at read time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from types import MappingProxyType
from typing import Final

from reach_plugins.model import AgentDescriptor, Instance
from reach_plugins.registry.base import Registry, RegistryEvent, RegistryView

logger = logging.getLogger("reach_plugins.gateway")

_NONE: Final[Mapping[str, Instance]] = MappingProxyType({})


class RouteTable:
    """A :class:`RegistryView` cached for ``ttl`` seconds; ``invalidate()`` (or a watch event) forces a re-read.

    ``revision`` moves only when the underlying registry's revision moved, so
    the router's per-revision caches survive refreshes caused by heartbeats.
    """

    def __init__(self, source: RegistryView, *, ttl: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._source = source
        self._ttl = ttl
        self._clock = clock
        self._revision = 0
        self._health = 0
        self._seen: int | None = None
        self._taken = 0.0
        self._stale = True
        self._agents: Mapping[str, AgentDescriptor] = MappingProxyType({})
        self._instances: dict[str, Mapping[str, Instance]] = {}
        self.refreshes = 0
        """How many times the registry was read (for tests and metrics)."""

    def invalidate(self) -> None:
        """Re-read the registry on the next lookup."""
        self._stale = True

    def _refresh(self) -> None:
        now = self._clock()
        if not self._stale and now - self._taken < self._ttl:
            return
        source = self._source
        agents = dict(source.agents())
        self._agents = MappingProxyType(agents)
        self._instances = {name: MappingProxyType(dict(source.instances(name))) for name in agents}
        if source.revision != self._seen:
            self._seen = source.revision
            self._revision += 1
        self._health = source.health
        self._taken, self._stale = now, False
        self.refreshes += 1

    @property
    def revision(self) -> int:
        self._refresh()
        return self._revision

    @property
    def health(self) -> int:
        """The source's ``health`` as of the snapshot the instances are read from."""
        self._refresh()
        return self._health

    def agents(self) -> Mapping[str, AgentDescriptor]:
        self._refresh()
        return self._agents

    def instances(self, agent: str) -> Mapping[str, Instance]:
        self._refresh()
        return self._instances.get(agent, _NONE)

    def is_alive(self, instance: Instance, now: float) -> bool:
        return self._source.is_alive(instance, now)

    async def follow(self, events: AsyncIterator[RegistryEvent]) -> None:
        """Invalidate on every event of a ``registry.watch()`` stream until it ends or is cancelled."""
        try:
            async for _ in events:
                self.invalidate()
        finally:
            close = getattr(events, "aclose", None)
            if close is not None:
                with contextlib.suppress(RuntimeError):
                    await close()


def watch_task(table: RouteTable, registry: Registry) -> asyncio.Task[None]:
    """Follow ``registry`` from now on (subscribed before returning); a watch that fails is logged."""
    events = registry.watch()

    async def run() -> None:
        try:
            await table.follow(events)
        except Exception:
            logger.exception("registry watch stopped; the route table now refreshes by TTL only")

    return asyncio.create_task(run(), name="reach route table watch")
