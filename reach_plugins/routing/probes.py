"""Active health probes (seed 003, section 5.2): see a dead or unready instance before a caller does.

Heartbeats say a process is alive; breakers learn from failed calls. Between
the two, an instance that stops answering keeps receiving calls until a
heartbeat expires or a breaker opens. A :class:`Prober` looks itself:

* often (``health_check.probe_interval``, 5 s): ``GET {endpoint}/healthz`` must
  answer 200 within :data:`PROBE_TIMEOUT` (an agent of another protocol: any
  answer under 500 at its endpoint) — ``refusals_to_down`` (2) consecutive
  failures (refused, reset, timed out, a wrong status) mark the instance down
  at once. An accepted TCP connection proves nothing: a blackholed or hung
  process accepts and never answers (issue 25);
* rarely (``health_check.ready_interval``, 30 s): ``GET {endpoint}{health_check.path}``
  (``/readyz`` by default), which runs the agent's own readiness callback — "alive" is not "can work".

An instance is down until a liveness probe is answered and (if it answered
readiness) readiness is back. Intervals are jittered (±20 %) so probes never march in
step, and there is one prober per registry per process (:meth:`Prober.shared`),
whatever the number of clients. :class:`ProbeBook` is the sans-IO part.
"""

from __future__ import annotations

import asyncio
import logging
import random
import weakref
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from reach_plugins.model import HealthCheck, Instance
from reach_plugins.registry.base import RegistryView

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger("reach_plugins.routing.probes")

JITTER = 0.2
"""Each wait is the interval times U(1 - JITTER, 1 + JITTER)."""
PROBE_TIMEOUT = 1.0
"""Seconds a liveness or a readiness check may take before it counts as failed."""
LIVENESS_PATH = "/healthz"
"""What a ``reach`` agent answers 200 on while its process serves (DESIGN section 4)."""


@dataclass(slots=True)
class _Health:
    failures: int = 0
    down: bool = False
    unready: bool = False
    next_alive: float = 0.0
    next_ready: float = 0.0
    last: Probed | None = None


@dataclass(frozen=True, slots=True)
class Probed:
    """The latest liveness probe of an instance: answered in time (``ok``) or why not, when, and its standing."""

    ok: bool
    why: str
    at: float
    failures: int
    down: bool
    unready: bool


class ProbeBook:
    """What the probes found, per instance (sans-IO: times are arguments)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._health: dict[tuple[str, str], _Health] = {}

    def available(self, agent: str, instance: str) -> bool:
        health = self._health.get((agent, instance))
        return health is None or not (health.down or health.unready)

    def last(self, agent: str, instance: str) -> Probed | None:
        """The latest liveness probe of the instance, ``None`` before the first."""
        health = self._health.get((agent, instance))
        if health is None or health.last is None:
            return None
        return replace(health.last, down=health.down, unready=health.unready)

    def due(self, agent: str, instance: str, check: HealthCheck, now: float) -> tuple[bool, bool]:
        """Whether a liveness probe and a readiness probe are due now (and schedule the next ones)."""
        health = self._health.setdefault((agent, instance), _Health(next_alive=now, next_ready=now))
        alive = now >= health.next_alive
        ready = now >= health.next_ready
        if alive:
            health.next_alive = now + self._jittered(check.probe_interval)
        if ready:
            health.next_ready = now + self._jittered(check.ready_interval)
        return alive, ready

    def alive(
        self, agent: str, instance: str, *, ok: bool, why: str = "", check: HealthCheck, now: float = 0.0
    ) -> None:
        """A liveness probe's result at ``now``: answered in time (``ok``), or ``why`` not; failures in a row mark
        down."""
        health = self._health.setdefault((agent, instance), _Health())
        health.last = Probed(ok, why, now, 0 if ok else health.failures + 1, False, False)
        if ok:
            if health.down:
                log.info("probe: %s/%s answers its liveness probe again", agent, instance)
            health.failures, health.down = 0, False
            return
        health.failures += 1
        if health.failures >= check.refusals_to_down and not health.down:
            health.down = True
            log.warning(
                "probe: %s/%s failed %d liveness probes in a row (%s): down", agent, instance, health.failures, why
            )

    def readiness(self, agent: str, instance: str, *, ready: bool) -> None:
        health = self._health.setdefault((agent, instance), _Health())
        if health.unready != (not ready):
            log.log(logging.INFO if ready else logging.WARNING, "probe: %s/%s ready=%s", agent, instance, ready)
        health.unready = not ready

    def forget(self, keep: set[tuple[str, str]]) -> None:
        """Drop instances that left the registry."""
        for key in set(self._health) - keep:
            del self._health[key]

    def _jittered(self, interval: float) -> float:
        return interval * self._rng.uniform(1 - JITTER, 1 + JITTER)


_SHARED: weakref.WeakKeyDictionary[object, Prober] = weakref.WeakKeyDictionary()


class Prober:
    """Probes every instance of ``registry`` on the running loop; :meth:`available` is the routing hook."""

    def __init__(self, registry: RegistryView, *, tick: float = 0.5, clock: Callable[[], float] | None = None) -> None:
        self.registry = registry
        self.book = ProbeBook()
        self._tick = tick
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._users = 0

    @classmethod
    def shared(cls, registry: RegistryView) -> Prober:
        """The one prober of ``registry`` in this process (created on first use)."""
        prober = _SHARED.get(registry)
        if prober is None:
            prober = _SHARED[registry] = cls(registry)
        return prober

    def available(self, agent: str, instance_id: str) -> bool:
        return self.book.available(agent, instance_id)

    def start(self) -> None:
        """Start probing on the running loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="reach-prober")

    def acquire(self) -> None:
        """One more user (a client, a gateway): probing starts with the first."""
        self._users += 1
        self.start()

    async def release(self) -> None:
        """One user fewer: probing stops with the last."""
        self._users = max(0, self._users - 1)
        if self._users == 0:
            await self.aclose()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def probe_once(self) -> None:
        """One round: every instance whose probes are due, concurrently."""
        now = self.now()
        jobs, present = [], set()
        for name, descriptor in self.registry.agents().items():
            check = descriptor.health_check
            for instance in self.registry.instances(name).values():
                present.add((name, instance.instance_id))
                if not check.probe or instance.status != "ready" or not instance.endpoint.startswith("http"):
                    continue
                alive, ready = self.book.due(name, instance.instance_id, check, now)
                if alive:
                    path = LIVENESS_PATH if descriptor.protocol == "reach" else ""
                    jobs.append(self._alive(instance, check, path))
                if ready:
                    jobs.append(self._ready(instance, check))
        self.book.forget(present)
        await asyncio.gather(*jobs)

    async def sweep(self) -> None:
        """Probe every instance's liveness now, up to ``refusals_to_down`` times in a row while it fails: what a
        gateway's prober would conclude after that many intervals (``reach agents`` looks once, at once)."""
        checks = []
        for name, descriptor in self.registry.agents().items():
            check = descriptor.health_check
            path = LIVENESS_PATH if descriptor.protocol == "reach" else ""
            for instance in self.registry.instances(name).values():
                if check.probe and instance.status == "ready" and instance.endpoint.startswith("http"):
                    checks.append(self._until_down(instance, check, path))
        await asyncio.gather(*checks)

    async def _until_down(self, instance: Instance, check: HealthCheck, path: str) -> None:
        for _ in range(check.refusals_to_down):
            await self._alive(instance, check, path)
            last = self.book.last(instance.agent, instance.instance_id)
            if last is None or last.ok:
                return

    async def _run(self) -> None:
        while True:
            try:
                await self.probe_once()
            except Exception:
                log.exception("probe round failed; probing goes on")
            await asyncio.sleep(self._tick)

    async def _alive(self, instance: Instance, check: HealthCheck, path: str) -> None:
        """GET ``path`` (``/healthz`` of a reach agent): 200 within the timeout (any answer under 500 at the
        endpoint itself, for another protocol) is alive; anything else counts toward down."""
        import aiohttp  # imported when probing starts: importing reach_plugins pulls in no HTTP client

        ok, why = False, ""
        try:
            async with self._http().get(instance.endpoint.rstrip("/") + path, allow_redirects=False) as answer:
                ok = answer.status == 200 if path else answer.status < 500
                why = f"status {answer.status}"
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        self.book.alive(instance.agent, instance.instance_id, ok=ok, why=why, check=check, now=self.now())

    async def _ready(self, instance: Instance, check: HealthCheck) -> None:
        import aiohttp  # imported when probing starts: importing reach_plugins pulls in no HTTP client

        url = instance.endpoint.rstrip("/") + check.path
        try:
            async with self._http().get(url, allow_redirects=False) as answer:
                ready = answer.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return  # unreachable: the liveness probe decides
        self.book.readiness(instance.agent, instance.instance_id, ready=ready)

    def _http(self) -> aiohttp.ClientSession:
        """The probes' HTTP session (every request bounded by :data:`PROBE_TIMEOUT`), opened on first use."""
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(trust_env=False, timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT))
        return self._session

    def now(self) -> float:
        """The prober's clock (the ``at`` of its results)."""
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()
