"""Registration of a running agent in a Registry, kept alive by heartbeats with sequence numbers.

On start: one Instance (``ready``), and the agent's descriptor if the registry has none yet. Then a heartbeat every
``health_check.interval`` (10 s by default), reporting ``draining`` while the
agent's readiness says no; a registry that forgot the instance (restarted,
lease lost) gets it registered again. On stop: a last ``draining`` heartbeat, then
deregistration, so routers stop sending before the process goes.

A registry that cannot be reached at start (``BackendUnavailable``) does not stop the agent: it serves, and the
registration is retried in the background (0.5 s, doubling up to the heartbeat interval) until it succeeds, so an
instance can be added while the registry is down (issue 25). Given a registry URL, the agent opens it itself as
a writer (``open_registry(url, snapshot=False)``): it never waits for a first snapshot it does not read, so the
default etcd URL starts an agent while etcd is down; that registry is the registration's, closed on stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from reach_plugins.errors import BackendUnavailable, RequestError
from reach_plugins.model import Instance, InstanceStatus
from reach_plugins.registry import open_registry
from reach_plugins.registry.base import Registry

if TYPE_CHECKING:
    from reach_plugins.agent.face import Described
    from reach_plugins.telemetry.metrics import ReachMetrics

log = logging.getLogger("reach_plugins.agent")

RETRY_FIRST: Final = 0.5
"""Seconds before the first retry of a registration the registry could not take at start; doubles up to the
heartbeat interval."""


class Registration:
    """One instance of an agent, registered at ``endpoint`` in ``registry`` (an object, or a URL this registration
    opens and closes); ``metrics`` counts each try."""

    def __init__(
        self,
        agent: Described,
        registry: Registry | str,
        endpoint: str,
        *,
        instance_id: str | None = None,
        interval: float | None = None,
        load: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        metrics: ReachMetrics | None = None,
    ) -> None:
        self.agent = agent
        self.registry = open_registry(registry, snapshot=False)
        self._owned = isinstance(registry, str)
        """Opened from a URL here: closed by :meth:`stop`."""
        self.endpoint = endpoint
        self.instance_id = instance_id or f"{agent.name}-{uuid.uuid4().hex[:8]}"
        descriptor = agent.descriptor()
        self.interval = interval if interval is not None else descriptor.health_check.interval
        self.seq = 0
        self.registered = False
        """Whether the registry took this instance (False while a registry down at start is retried)."""
        self._load = load
        self._sleep = sleep
        self._metrics = metrics
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Register the descriptor and this instance (in the background if the registry is down), then heartbeat."""
        try:
            await self._register()
        except BackendUnavailable as exc:
            log.warning("%s; %s serves and registers once the registry answers", exc, self.instance_id)
        self._task = asyncio.create_task(self._beat_forever(), name=f"heartbeat {self.instance_id}")

    async def _register(self) -> None:
        try:
            await self._register_once()
        except Exception:
            if self._metrics is not None:
                self._metrics.registration(self.agent.name, ok=False)
            raise
        self.registered = True
        if self._metrics is not None:
            self._metrics.registration(self.agent.name, ok=True)

    async def _register_once(self) -> None:
        """The instance, under a descriptor: the operator's when there is one (never overwritten), else the agent's own.

        An agent's registry user may write only its own instance keys (DESIGN.md 11.4): descriptors — auth
        references, trust, routing — belong to operators (``reach agents --load``).
        """
        if await self.registry.get(self.agent.name) is None:
            await self.registry.register_agent(self.agent.descriptor())
        instance = Instance(
            agent=self.agent.name,
            instance_id=self.instance_id,
            endpoint=self.endpoint,
            status="ready",
            heartbeat_seq=self.seq,
            last_heartbeat=self.registry.clock(),
        )
        await self.registry.register_instance(instance)

    async def beat(self, status: InstanceStatus | None = None) -> None:
        """Send one heartbeat with the next sequence number (status from readiness unless given)."""
        self.seq += 1
        if status is None:
            status = "ready" if await self.agent.is_ready() else "draining"
        load = self._load() if self._load else None
        await self.registry.heartbeat(self.agent.name, self.instance_id, self.seq, load=load, status=status)

    async def _beat_forever(self) -> None:
        delay = RETRY_FIRST
        while not self.registered:
            await self._sleep(delay)
            delay = min(delay * 2, self.interval)
            await self._reregister()
        while True:
            await self._sleep(self.interval)
            try:
                await self.beat()
            except RequestError:
                log.warning("registry forgot %s; registering it again", self.instance_id)
                await self._reregister()
            except Exception:
                log.warning("heartbeat of %s failed; will try again", self.instance_id, exc_info=True)

    async def _reregister(self) -> None:
        try:
            await self._register()
        except Exception:
            log.warning("registering %s again failed; will try again", self.instance_id, exc_info=True)

    async def halt(self) -> None:
        """Stop heartbeats without a goodbye, as a crashed process would; the registry notices by itself."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def stop(self) -> None:
        """Stop heartbeats, announce ``draining``, deregister the instance (if it ever was registered); close a
        registry opened from a URL."""
        await self.halt()
        try:
            if self.registered:
                await self.beat("draining")
                await self.registry.deregister_instance(self.agent.name, self.instance_id)
        finally:
            if self._owned:
                await self.registry.aclose()

    async def __aenter__(self) -> Registration:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
