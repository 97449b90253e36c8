"""The YAML file registry (``file://agents.yaml``): agents from a config file that reloads without restart.

State lives in a :class:`MemoryRegistry` (composition): a reload computes the
difference between the file's agents and the last good ones and applies it, so
watchers see ordinary ``agent_put`` / ``agent_deleted`` events. A broken file
never empties the registry: the last good state stays and the error is logged
and kept in ``last_error``. Agents registered through the API (not in the file)
are left alone by reloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from reach_plugins.config.loader import ReachConfig, TenantConfig, load_config
from reach_plugins.endpoints import ANY_NETWORK, EndpointPolicy
from reach_plugins.errors import ConfigError
from reach_plugins.model import AgentDescriptor, Instance, InstanceStatus
from reach_plugins.registry.base import Clock, RegistryEvent
from reach_plugins.registry.memory import MemoryRegistry, check_filed

logger = logging.getLogger(__name__)


class FileRegistry:
    """A :class:`~reach_plugins.registry.base.Registry` whose agents come from a YAML file.

    The constructor loads the file (a broken file raises :class:`ConfigError`).
    ``reload()`` re-reads it when its size, mtime or content changed;
    ``start()`` runs a poller that reloads and sweeps liveness every
    ``poll_interval`` seconds until ``aclose()``. Every load and every write
    obeys ``endpoints`` (a file naming an endpoint outside it does not load).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        poll_interval: float = 1.0,
        endpoints: EndpointPolicy = ANY_NETWORK,
    ) -> None:
        if poll_interval <= 0:
            raise ConfigError(f"poll_interval must be positive seconds, got {poll_interval!r}")
        self.path = Path(path)
        self.poll_interval = poll_interval
        self.last_error: ConfigError | None = None
        self._memory = MemoryRegistry(clock=clock, endpoints=endpoints)
        self._stamp, self._digest = self._fingerprint()
        self._config = load_config(self.path, endpoints=endpoints)
        self._from_file: set[str] = set()
        self._poller: asyncio.Task[None] | None = None
        self._apply(self._config.agents)

    @property
    def config(self) -> ReachConfig:
        """The last configuration that loaded without error (agents, tenants, defaults)."""
        return self._config

    @property
    def tenants(self) -> Mapping[str, TenantConfig]:
        """The tenant table of the last good file, for the router's allow-list."""
        return self._config.tenants

    def reload(self) -> bool:
        """Re-read the file if it changed; return whether agents changed. Errors keep the last good state."""
        try:
            if self._stat() == self._stamp:
                return False
            self._stamp, digest = self._fingerprint()
            if digest == self._digest:
                self.last_error = None
                return False
            config = load_config(self.path, endpoints=self._memory.endpoints)
            for agent in config.agents:
                check_filed(agent)
        except ConfigError as exc:
            if self.last_error is None or str(exc) != str(self.last_error):
                logger.error("registry file %s not applied, keeping the last good state: %s", self.path, exc)
            self.last_error = exc
            return False
        self._digest, self._config, self.last_error = digest, config, None
        return self._apply(config.agents)

    def _stat(self) -> tuple[int, int]:
        try:
            stat = self.path.stat()
        except OSError as exc:
            raise ConfigError(f"cannot read registry file {self.path}: {exc.strerror or exc}") from exc
        return stat.st_mtime_ns, stat.st_size

    def _fingerprint(self) -> tuple[tuple[int, int], bytes]:
        """``(mtime_ns, size)`` and a content hash: a touch without an edit does not reload agents."""
        stamp = self._stat()
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read registry file {self.path}: {exc.strerror or exc}") from exc
        return stamp, hashlib.blake2b(data, digest_size=16).digest()

    def _apply(self, agents: list[AgentDescriptor]) -> bool:
        wanted = {agent.name: agent for agent in agents}
        changed = False
        for name in sorted(self._from_file - wanted.keys()):
            changed |= self._memory.delete_agent(name)
        for agent in agents:
            changed |= self._memory.put_agent(agent)
        self._from_file = set(wanted)
        return changed

    async def start(self) -> None:
        """Poll the file (and sweep liveness) every ``poll_interval`` seconds in a background task."""
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name=f"reach-registry-poll:{self.path}")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                self.reload()
                self._memory.sweep()
            except Exception:
                logger.exception("registry file %s: poll failed; polling goes on", self.path)

    async def aclose(self) -> None:
        """Stop the poller and end every watch stream."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        await self._memory.aclose()

    # ------------------------------------------------------------------ Registry, delegated

    @property
    def clock(self) -> Clock:
        return self._memory.clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        self._memory.clock = clock

    @property
    def revision(self) -> int:
        return self._memory.revision

    @property
    def health(self) -> int:
        return self._memory.health

    def agents(self) -> Mapping[str, AgentDescriptor]:
        return self._memory.agents()

    def instances(self, agent: str) -> Mapping[str, Instance]:
        return self._memory.instances(agent)

    def is_alive(self, instance: Instance, now: float) -> bool:
        return self._memory.is_alive(instance, now)

    def sweep(self) -> list[RegistryEvent]:
        return self._memory.sweep()

    async def register_agent(self, descriptor: AgentDescriptor) -> None:
        await self._memory.register_agent(descriptor)

    async def deregister_agent(self, name: str) -> None:
        await self._memory.deregister_agent(name)

    async def register_instance(self, instance: Instance) -> None:
        await self._memory.register_instance(instance)

    async def deregister_instance(self, agent: str, instance_id: str) -> None:
        await self._memory.deregister_instance(agent, instance_id)

    async def heartbeat(
        self,
        agent: str,
        instance_id: str,
        seq: int,
        *,
        load: float | None = None,
        status: InstanceStatus | None = None,
    ) -> None:
        await self._memory.heartbeat(agent, instance_id, seq, load=load, status=status)

    async def get(self, name: str) -> AgentDescriptor | None:
        return await self._memory.get(name)

    async def match(self, capability: str, *, intent: str | None = None) -> list[AgentDescriptor]:
        return await self._memory.match(capability, intent=intent)

    def watch(self) -> AsyncIterator[RegistryEvent]:
        return self._memory.watch()

    async def list(self) -> list[AgentDescriptor]:
        """Every registered agent (last in the class: the name shadows ``list`` in annotations)."""
        return await self._memory.list()


def from_url(
    url: str, *, clock: Clock | None = None, endpoints: EndpointPolicy = ANY_NETWORK, snapshot: bool = True
) -> FileRegistry:
    """``file://agents.yaml`` (relative) or ``file:///etc/reach/agents.yaml`` (absolute) -> a file registry (read
    from the local file at once, whatever ``snapshot`` says)."""
    path = url.removeprefix("file://")
    if not path:
        raise ConfigError(f"registry URL {url!r} names no file; write file://agents.yaml or file:///abs/agents.yaml")
    return FileRegistry(path, clock=clock, endpoints=endpoints)
