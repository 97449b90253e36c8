"""Circuit breaker per target: a time-sliding window, a short open that grows on repeat, half-open probes.

Closed: calls flow and land in a window of ``buckets`` time buckets spanning
``window`` seconds. With at least ``min_calls`` in the window, a failure rate
``>= error_threshold`` (or a slow-call rate ``>= slow_call_threshold``) opens
the breaker. Open: nothing is admitted for the open time — ``open_wait``
(5 s) the first time, doubled on each consecutive re-open, at most
``max_open_wait`` (60 s) — so a 3 s blip costs seconds, not the half minute
of a fixed 30 s open, while a dead target is asked ever more rarely.
Half-open: up to ``half_open_probes`` calls go through; the first probe to
finish decides — success closes (fresh window, open time back to
``open_wait``), failure re-opens for twice as long. Every transition goes to
the listener. Time is the caller's monotonic clock (DESIGN 11.3, STYLE 15).

The transitions, in one place (anything else is impossible):

============  ===========================  ==========  ===============================
state         event                        next        open time after
============  ===========================  ==========  ===============================
closed        window over a threshold      open        ``open_wait * 2**reopens``
open          open time passed (acquire)   half_open   unchanged
half_open     a probe succeeds             closed      reset (``reopens = 0``)
half_open     a probe fails or is slow     open        doubled (``reopens += 1``), capped
============  ===========================  ==========  ===============================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal

from reach_plugins.model import AgentDescriptor, CircuitBreakerConfig

BreakerState = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, slots=True)
class BreakerTransition:
    """One change of state of one instance's breaker, with the reason in words."""

    kind: ClassVar[str] = "breaker"
    agent: str
    instance: str
    before: BreakerState
    after: BreakerState
    at: float
    reason: str


Listener = Callable[[BreakerTransition], None]


@dataclass(frozen=True, slots=True)
class Permit:
    """Admission for one call; hand it back to ``record`` or ``release``."""

    probe: bool
    generation: int


_FIRST_PERMIT = Permit(False, 0)
"""The closed-state permit of generation 0, shared by every new breaker (permits are immutable)."""


class _Window:
    """Counts of calls, failures and slow calls over the last ``window`` seconds, in buckets.

    Running sums are kept next to the buckets, so reading the totals (after
    every call) costs the same for ten buckets as for a thousand. The three
    counts of every bucket share one list (calls, failures, slow, bucket by
    bucket), cleared in place: a caller spreading calls over thousands of
    instances makes one window per instance, each one object for the garbage
    collector to track rather than several.
    """

    __slots__ = ("all_calls", "all_failures", "all_slow", "counts", "head", "size", "width")

    def __init__(self, window: float, buckets: int) -> None:
        self.width = window / buckets
        self.size = buckets
        self.counts = [0] * (3 * buckets)
        self.all_calls = self.all_failures = self.all_slow = 0
        self.head = -1

    def _slot(self, now: float) -> int:
        """The first index in ``counts`` of the bucket ``now`` falls in (stale buckets emptied on the way)."""
        index = int(now // self.width)
        head = self.head
        size = self.size
        if 0 <= index <= head:
            return 3 * (head % size)
        if head >= 0 and index - head < size:
            counts = self.counts
            for stale in range(head + 1, index + 1):
                at = 3 * (stale % size)
                self.all_calls -= counts[at]
                self.all_failures -= counts[at + 1]
                self.all_slow -= counts[at + 2]
                counts[at] = counts[at + 1] = counts[at + 2] = 0
        elif head >= 0:
            self.clear()
        self.head = max(head, index)
        return 3 * (self.head % size)

    def add(self, now: float, *, failure: bool, slow: bool) -> None:
        at = self._slot(now)
        counts = self.counts
        counts[at] += 1
        self.all_calls += 1
        if failure:
            counts[at + 1] += 1
            self.all_failures += 1
        if slow:
            counts[at + 2] += 1
            self.all_slow += 1

    def totals(self, now: float) -> tuple[int, int, int]:
        self._slot(now)
        return self.all_calls, self.all_failures, self.all_slow

    def clear(self) -> None:
        counts = self.counts
        for at in range(len(counts)):
            counts[at] = 0
        self.all_calls = self.all_failures = self.all_slow = 0


class CircuitBreaker:
    """The breaker of one instance. Pure state: every method takes ``now``."""

    def __init__(
        self,
        config: CircuitBreakerConfig | None = None,
        *,
        agent: str = "",
        instance: str = "",
        listener: Listener | None = None,
    ) -> None:
        self.config = config or CircuitBreakerConfig()
        self.agent = agent
        self.instance = instance
        self._listener = listener
        self._window = _Window(self.config.window, self.config.buckets)
        self._state: BreakerState = "closed"
        self._opened_at = 0.0
        self._open_for = self.config.open_wait
        self._reopens = 0
        """Consecutive re-opens (failed probes) since the breaker last closed: the open time doubles with each."""
        self._probes = 0
        self._generation = 0
        self._permit = _FIRST_PERMIT
        """The permit of a call admitted while closed in this generation (immutable, so shared)."""

    def state(self, now: float) -> BreakerState:
        """The state as of ``now`` (an open breaker whose wait is over reads as half-open)."""
        if self._state == "open" and now >= self._opened_at + self._open_for:
            return "half_open"
        return self._state

    @property
    def open_for(self) -> float:
        """Seconds the current (or next) opening lasts."""
        return self._open_for

    @property
    def is_closed(self) -> bool:
        return self._state == "closed"

    def reopens_in(self, now: float) -> float | None:
        """Seconds until an open breaker admits a half-open probe (0 once it would), ``None`` unless open."""
        if self._state != "open":
            return None
        return max(0.0, self._opened_at + self._open_for - now)

    def available(self, now: float) -> bool:
        """Whether a call could be admitted now; never changes state (the router asks this)."""
        state = self.state(now)
        if state == "closed":
            return True
        if state == "half_open":
            return self._state == "open" or self._probes < self.config.half_open_probes
        return False

    def acquire(self, now: float, *, on_move: Listener | None = None) -> Permit | None:
        """Admit one call (``None``: rejected). Past the open time this moves open to half-open.

        ``on_move`` hears a transition this call causes, beside the breaker's own listener (the calling
        request's trace): passed per call, so no listener is ever set and reset around it.
        """
        if self._state == "closed":
            return self._permit
        if self._state == "open":
            if now < self._opened_at + self._open_for:
                return None
            self._move("half_open", now, f"open for {self._open_for:g}s; probing", on_move)
        if self._probes >= self.config.half_open_probes:
            return None
        self._probes += 1
        return Permit(True, self._generation)

    def record(
        self, permit: Permit, now: float, *, failure: bool, duration: float, on_move: Listener | None = None
    ) -> None:
        """Feed the result of an admitted call; results from before the last transition only count if closed."""
        slow_after = self.config.slow_call_duration
        slow = slow_after is not None and duration >= slow_after
        if permit.generation != self._generation:
            if self._state == "closed":
                self._window.add(now, failure=failure, slow=slow)
            return
        if permit.probe:
            self._probes = max(0, self._probes - 1)
            if failure or slow:
                why = "a half-open probe failed" if failure else f"a half-open probe took {duration:.3g}s"
                self._open(now, why, on_move)
            else:
                self._move("closed", now, "a half-open probe succeeded", on_move)
            return
        self._window.add(now, failure=failure, slow=slow)
        self._check(now, on_move)

    def release(self, permit: Permit) -> None:
        """Give back an admission whose call was abandoned (cancelled) without a result."""
        if permit.probe and permit.generation == self._generation:
            self._probes = max(0, self._probes - 1)

    def _check(self, now: float, on_move: Listener | None) -> None:
        calls, failures, slow = self._window.totals(now)
        if calls < self.config.min_calls:
            return
        config = self.config
        if failures / calls >= config.error_threshold:
            self._open(now, f"failure rate {failures / calls:.0%} over {calls} calls in {config.window:g}s", on_move)
        elif config.slow_call_duration is not None and slow / calls >= config.slow_call_threshold:
            why = f"slow-call rate {slow / calls:.0%} over {calls} calls in {config.window:g}s"
            self._open(now, why, on_move)

    def _open(self, now: float, reason: str, on_move: Listener | None) -> None:
        config = self.config
        if self._state == "half_open":
            self._reopens += 1
        cap = max(config.max_open_wait, config.open_wait)
        self._open_for = min(cap, config.open_wait * 2.0 ** min(self._reopens, 62))
        self._opened_at = now
        self._move("open", now, f"{reason}; open for {self._open_for:g}s", on_move)

    def _move(self, after: BreakerState, now: float, reason: str, on_move: Listener | None) -> None:
        before = self._state
        self._state = after
        self._generation += 1
        self._permit = Permit(False, self._generation)
        self._probes = 0
        if after == "closed":
            self._window.clear()
            self._reopens = 0
            self._open_for = self.config.open_wait
        if self._listener is None and on_move is None:
            return
        transition = BreakerTransition(self.agent, self.instance, before, after, now, reason)
        if self._listener is not None:
            self._listener(transition)
        if on_move is not None:
            on_move(transition)


class Breakers:
    """One breaker per (agent, instance, tenant) and one per hop, created on first use.

    Per tenant, so that failures one tenant's input causes cannot open the
    breaker other tenants go through (DESIGN 11.3); per hop (a gateway or node
    the transport goes through), so that a hop that does not answer opens its
    own breaker, never those of the agent instances behind it. Bounded: past
    ``max_breakers`` the closed, idle breakers are dropped first.
    """

    def __init__(self, listener: Listener | None = None, *, max_breakers: int = 10_000) -> None:
        self._listener = listener
        self._emits = self._emit
        """One bound method handed to every breaker (not one made per breaker)."""
        self._max = max_breakers
        self._breakers: dict[tuple[str, str, str], CircuitBreaker] = {}

    def get(self, agent: AgentDescriptor, instance_id: str, tenant: str | None = None) -> CircuitBreaker:
        return self._get((agent.name, instance_id, tenant or ""), agent.circuit_breaker)

    def hop(self, address: str) -> CircuitBreaker:
        """The breaker of the gateway or node at ``address`` (default settings)."""
        return self._get((HOP, address, ""), None)

    def _get(self, key: tuple[str, str, str], config: CircuitBreakerConfig | None) -> CircuitBreaker:
        breaker = self._breakers.get(key)
        if breaker is None or (config is not None and breaker.config is not config and breaker.config != config):
            if breaker is None and len(self._breakers) >= self._max:
                self._prune()
            breaker = CircuitBreaker(config, agent=key[0], instance=key[1], listener=self._emits)
            self._breakers[key] = breaker
        return breaker

    def find(self, agent: str, instance_id: str, tenant: str | None = None) -> CircuitBreaker | None:
        return self._breakers.get((agent, instance_id, tenant or ""))

    def worst(self, agent: str, instance_id: str, now: float) -> CircuitBreaker | None:
        """Of the instance's breakers (one per tenant), the one furthest from closed now: what a status view shows."""
        rank = {"open": 0, "half_open": 1, "closed": 2}
        found = [b for (name, instance, _), b in self._breakers.items() if (name, instance) == (agent, instance_id)]
        return min(found, key=lambda b: (rank[b.state(now)], -(b.reopens_in(now) or 0.0)), default=None)

    def _emit(self, transition: BreakerTransition) -> None:
        if self._listener is not None:
            self._listener(transition)

    def _prune(self) -> None:
        closed = [key for key, breaker in self._breakers.items() if breaker.is_closed]
        for key in closed[: max(1, len(closed) // 2)]:
            del self._breakers[key]


HOP = "(hop)"
"""The agent name a hop's breaker is filed and reported under (its instance is the hop's address)."""
