"""Per-agent admission state: retry budget, rate limit, adaptive concurrency, per-capability limits.

One :class:`AgentGuards` per target agent, built from its descriptor and
rebuilt when the descriptor's limits change (a registry reload). ``admit``
is the only place that waits: for a rate-limit token, then for a
concurrency slot, both bounded by ``max_wait`` and the request's deadline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reach_plugins.attempts.limiter import ConcurrencyLimiter
from reach_plugins.clock import Clock
from reach_plugins.errors import RateLimited
from reach_plugins.model import AgentDescriptor, Capability
from reach_plugins.policy.budget import RetryBudget
from reach_plugins.policy.deadline import Deadline
from reach_plugins.policy.limits import AdaptiveLimit, TokenBucket

DEFAULT_MAX_WAIT = 3.0
"""Longest wait for a concurrency slot when the agent sets no ``rate_limit.max_wait``."""


@dataclass(frozen=True, slots=True)
class Slot:
    """The concurrency slots one attempt holds, and how long it waited for them."""

    limiters: tuple[ConcurrencyLimiter, ...]
    waited: float


class AgentGuards:
    """The mutable, per-agent part of the core."""

    def __init__(self, agent: AgentDescriptor, now: float) -> None:
        self.agent = agent
        self.budget = RetryBudget.from_policy(agent.retry)
        limit = agent.rate_limit
        self.bucket = TokenBucket(limit.qps, limit.burst, now=now) if limit else None
        self.max_wait = limit.max_wait if limit else DEFAULT_MAX_WAIT
        size = agent.pool.max_conns
        self.adaptive = AdaptiveLimit(size)
        self.limiter = ConcurrencyLimiter(size, max_queue=size, name=f"agent {agent.name!r}")
        self._alone = Slot((self.limiter,), 0.0)
        """The slot of an attempt that got the agent's limiter at once (the usual case): immutable, so shared."""
        self._by_capability: dict[str, ConcurrencyLimiter] = {}

    def fits(self, agent: AgentDescriptor) -> bool:
        """Whether these guards were built from limits equal to ``agent``'s (else they are rebuilt)."""
        mine = self.agent
        return mine.retry == agent.retry and mine.rate_limit == agent.rate_limit and mine.pool == agent.pool

    def _capability_limiter(self, capability: Capability | None) -> ConcurrencyLimiter | None:
        if capability is None or capability.max_concurrency is None:
            return None
        limiter = self._by_capability.get(capability.name)
        if limiter is None or limiter.limit != capability.max_concurrency:
            size = capability.max_concurrency
            limiter = ConcurrencyLimiter(size, max_queue=size, name=f"capability {capability.name!r}")
            self._by_capability[capability.name] = limiter
        return limiter

    def try_admit(self, capability: Capability | None) -> Slot | None:
        """The slot of an attempt that needs no wait (no rate limit, no capability limit, a free slot), else None."""
        unlimited = capability is None or capability.max_concurrency is None
        if self.bucket is None and unlimited and self.limiter.try_acquire():
            return self._alone
        return None

    async def admit(self, capability: Capability | None, clock: Clock, deadline: Deadline) -> Slot:
        """Wait (bounded) for a rate token and concurrency slots; raise RateLimited when none frees up."""
        extra = self._capability_limiter(capability)
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
        limiters = [self.limiter]
        if extra is not None:
            limiters.append(extra)
        try:
            for limiter in limiters:
                if not limiter.try_acquire():
                    await self._queue(limiter, clock, wait_until, start)
                held.append(limiter)
        except BaseException:
            self._release(held)
            raise
        return Slot(tuple(held), clock.now() - start)

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

    def done(self, slot: Slot, now: float, *, latency: float | None, overload: bool) -> None:
        """Give the slots back and let the adaptive limit learn from the attempt."""
        in_flight = self.limiter.in_flight
        self._release(slot.limiters)
        limit = self.adaptive.record(now, latency, overload=overload, in_flight=in_flight)
        if limit != self.limiter.limit:
            self.limiter.limit = limit

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

    def get(self, agent: AgentDescriptor, now: float) -> AgentGuards:
        guards = self._guards.get(agent.name)
        if guards is None or (guards.agent is not agent and not guards.fits(agent)):
            guards = AgentGuards(agent, now)
            self._guards[agent.name] = guards
        elif guards.agent is not agent:
            guards.agent = agent
        return guards
