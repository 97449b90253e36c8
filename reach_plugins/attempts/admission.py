"""Admission state: per agent a retry budget, a rate limit and the pool's cap; per instance an adaptive limit.

One :class:`AgentGuards` per target agent, built from its descriptor and
rebuilt when the descriptor's limits change (a registry reload). The adaptive
concurrency limit and a declared ``max_concurrency`` are kept per *instance*
(:class:`InstanceGuards`): one overloaded or unreachable instance narrows only
its own window, never its healthy peers'. ``admit`` is the only place that
waits: for a rate-limit token, then for concurrency slots, both bounded by
``max_wait`` and the request's deadline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reach_plugins.attempts.limiter import ConcurrencyLimiter
from reach_plugins.clock import Clock
from reach_plugins.errors import RateLimited
from reach_plugins.model import AgentDescriptor, Capability
from reach_plugins.policy.budget import RetryBudget
from reach_plugins.policy.classify import Verdict
from reach_plugins.policy.deadline import Deadline
from reach_plugins.policy.limits import AGENT_QUEUE, AdaptiveLimit, TokenBucket

DEFAULT_MAX_WAIT = 3.0
"""Longest wait for a concurrency slot when the agent sets no ``rate_limit.max_wait``."""

MAX_INSTANCES = 1024
"""Instances whose guards one agent keeps; past it, the idle ones are dropped (instances come and go)."""


class InstanceGuards:
    """One instance's adaptive concurrency window and its declared per-capability limits."""

    def __init__(self, agent: AgentDescriptor, instance: str) -> None:
        size = agent.pool.max_conns
        self.adaptive = AdaptiveLimit(size)
        self.limiter = ConcurrencyLimiter(size, max_queue=size, name=f"instance {agent.name}/{instance}")
        self.by_capability: dict[str, ConcurrencyLimiter] = {}

    def capability_limiter(self, capability: Capability | None) -> ConcurrencyLimiter | None:
        """The limiter of a capability declaring ``max_concurrency`` (running plus the agent's line), else None."""
        if capability is None or capability.max_concurrency is None:
            return None
        size = capability.max_concurrency * (1 + AGENT_QUEUE)
        limiter = self.by_capability.get(capability.name)
        if limiter is None or limiter.limit != size:
            name = f"{self.limiter.name} capability {capability.name!r}"
            limiter = ConcurrencyLimiter(size, max_queue=size, name=name)
            self.by_capability[capability.name] = limiter
        return limiter

    @property
    def idle(self) -> bool:
        return self.limiter.in_flight == 0 and self.limiter.queued == 0


@dataclass(frozen=True, slots=True)
class Slot:
    """The concurrency slots one attempt holds, the instance they are for, and how long it waited for them."""

    limiters: tuple[ConcurrencyLimiter, ...]
    waited: float
    instance: InstanceGuards


class AgentGuards:
    """The mutable, per-agent part of the core."""

    def __init__(self, agent: AgentDescriptor, now: float) -> None:
        self.agent = agent
        self.budget = RetryBudget.from_policy(agent.retry)
        limit = agent.rate_limit
        self.bucket = TokenBucket(limit.qps, limit.burst, now=now) if limit else None
        self.max_wait = limit.max_wait if limit else DEFAULT_MAX_WAIT
        size = agent.pool.max_conns
        self.limiter = ConcurrencyLimiter(size, max_queue=size, name=f"agent {agent.name!r}")
        """The agent's pool: at most ``pool.max_conns`` attempts in flight over all its instances."""
        self._instances: dict[str, tuple[InstanceGuards, Slot]] = {}
        """Each instance's guards, and the slot of an attempt that got both limiters at once (the usual case):
        immutable, so shared."""

    def fits(self, agent: AgentDescriptor) -> bool:
        """Whether these guards were built from limits equal to ``agent``'s (else they are rebuilt)."""
        mine = self.agent
        return mine.retry == agent.retry and mine.rate_limit == agent.rate_limit and mine.pool == agent.pool

    def instance(self, instance: str) -> tuple[InstanceGuards, Slot]:
        """The guards of ``instance`` (made on first use) and its shared no-wait slot."""
        found = self._instances.get(instance)
        if found is None:
            if len(self._instances) >= MAX_INSTANCES:
                self._instances = {name: pair for name, pair in self._instances.items() if not pair[0].idle}
            guards = InstanceGuards(self.agent, instance)
            found = guards, Slot((guards.limiter, self.limiter), 0.0, guards)
            self._instances[instance] = found
        return found

    def window(self, instance: str) -> tuple[int, int] | None:
        """``instance``'s attempts in flight and its adaptive window now, if a call made its guards."""
        found = self._instances.get(instance)
        return None if found is None else (found[0].limiter.in_flight, found[0].limiter.limit)

    def window_full(self, instance: str, capability: Capability | None) -> bool:
        """Whether ``instance``'s own limits (its window, or the capability's there), not the pool, have no room."""
        guards = self.instance(instance)[0]
        own = (guards.limiter, guards.capability_limiter(capability))
        return any(limiter is not None and limiter.in_flight >= limiter.limit for limiter in own)

    def try_admit(self, capability: Capability | None, instance: str) -> Slot | None:
        """The slot of an attempt that needs no wait (no rate limit, no capability limit, free slots), else None."""
        if self.bucket is not None or (capability is not None and capability.max_concurrency is not None):
            return None
        guards, alone = self.instance(instance)
        if guards.limiter.try_acquire():
            if self.limiter.try_acquire():
                return alone
            guards.limiter.release()
        return None

    async def admit(self, capability: Capability | None, instance: str, clock: Clock, deadline: Deadline) -> Slot:
        """Wait (bounded) for a rate token and concurrency slots; raise RateLimited when none frees up."""
        guards, _ = self.instance(instance)
        extra = guards.capability_limiter(capability)
        start = clock.now()
        wait_until = start + min(self.max_wait, deadline.remaining(start))
        if self.bucket is not None:
            delay = self.bucket.reserve(clock.monotonic(), wait_until - start)
            if delay is None:
                raise RateLimited(
                    f"agent {self.agent.name!r} allows {self.bucket.rate:g} calls/s (burst {self.bucket.burst}) and "
                    f"no call slot frees up within {wait_until - start:.3g}s; slow down or raise rate_limit.qps"
                )
            if delay > 0:
                try:
                    await clock.sleep(delay)
                except BaseException:
                    self.bucket.refund(clock.monotonic())
                    raise
        held: list[ConcurrencyLimiter] = []
        # The instance's own limits first: a call waiting for a busy instance holds none of the agent's pool.
        limiters = [guards.limiter] if extra is None else [guards.limiter, extra]
        limiters.append(self.limiter)
        try:
            for limiter in limiters:
                if not limiter.try_acquire():
                    await self._queue(limiter, clock, wait_until, start)
                held.append(limiter)
        except BaseException:
            self._release(held)
            raise
        return Slot(tuple(held), clock.now() - start, guards)

    @staticmethod
    async def _queue(limiter: ConcurrencyLimiter, clock: Clock, wait_until: float, start: float) -> None:
        try:
            async with clock.timeout_at(wait_until):
                await limiter.acquire()
        except TimeoutError:
            raise RateLimited(
                f"{limiter.name} has {limiter.in_flight} calls in flight (limit {limiter.limit}) and no slot "
                f"freed up within {wait_until - start:.3g}s; slow down or raise the concurrency limit"
            ) from None

    @staticmethod
    def at_capacity(slot: Slot, verdict: Verdict) -> bool:
        """Whether a timeout came while its instance held as many calls as its window allows: its overload, not
        its fault. At the narrowest window a timeout is no longer read as load: a dead instance must open its
        breaker."""
        guards = slot.instance
        limiter = guards.limiter
        return verdict.outcome == "timeout" and limiter.in_flight >= limiter.limit > guards.adaptive.min_limit

    def done(self, slot: Slot, now: float, *, latency: float | None, overload: bool, refused: bool = False) -> None:
        """Give the slots back and let the instance's adaptive limit learn from the attempt (``refused``: the
        instance answered "not executed" at its limit)."""
        guards = slot.instance
        in_flight = guards.limiter.in_flight
        self._release(slot.limiters)
        limit = guards.adaptive.record(now, latency, overload=overload, in_flight=in_flight, refused=refused)
        if limit != guards.limiter.limit:
            # The line is as long as the window: a call waits about one round trip at most, then is shed.
            guards.limiter.limit = guards.limiter.max_queue = limit

    def release(self, slot: Slot) -> None:
        """Give the slots back without a result to learn from (nothing was sent)."""
        self._release(slot.limiters)

    @staticmethod
    def _release(held: Sequence[ConcurrencyLimiter]) -> None:
        for limiter in held:
            limiter.release()


class GuardTable:
    """``AgentGuards`` by agent name, created on first use."""

    def __init__(self) -> None:
        self._guards: dict[str, AgentGuards] = {}

    def find(self, agent: str) -> AgentGuards | None:
        """The guards of ``agent`` if a call made them (status views read them without creating any)."""
        return self._guards.get(agent)

    def get(self, agent: AgentDescriptor, now: float) -> AgentGuards:
        guards = self._guards.get(agent.name)
        if guards is None or (guards.agent is not agent and not guards.fits(agent)):
            guards = AgentGuards(agent, now)
            self._guards[agent.name] = guards
        elif guards.agent is not agent:
            guards.agent = agent
        return guards
