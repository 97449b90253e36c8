"""When a hedged attempt is due: a latency percentile of each capability, and which calls may be hedged at all.

gRPC's hedging policy sends the next copy of a call after ``hedgingDelay``;
"The Tail at Scale" (Dean and Barroso) waits the 95th percentile of the
expected latency, so about one call in twenty costs a second attempt while the
slowest ones stop deciding the tail. :class:`HedgeDelays` keeps the recent
successful latencies of each (agent, capability) and answers that percentile,
clamped to the policy's bounds. Only answers that won are recorded: an attempt
cancelled because its hedge answered first is never timed, so a slow instance
does not drag the delay up to its own pace. Pure: durations come in as
arguments, no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import deque

from reach_plugins.model import AgentDescriptor, Capability, Hedging

_MAX_TRACKED = 4096
"""(agent, capability) pairs tracked at most; the oldest pair is forgotten beyond that."""


def hedging_of(agent: AgentDescriptor, capability: Capability, *, keyed: bool) -> Hedging | None:
    """The hedging policy of a call, or None when it may not be hedged.

    A call may run twice only when that changes nothing: the capability is
    declared ``safe`` (a read), or the call carries an idempotency key and every
    instance of the agent checks it (``idempotency.shared``). An unkeyed write,
    or a keyed call to an agent whose instances each keep their own keys, never.
    """
    policy = capability.hedging or agent.hedging
    if policy is None:
        return None
    return policy if capability.safe or (keyed and agent.idempotency.shared) else None


class _Window:
    """The last ``size`` latencies of one capability, with its sorted view cached until the next sample."""

    __slots__ = ("_ordered", "samples")

    def __init__(self, size: int) -> None:
        self.samples: deque[float] = deque(maxlen=size)
        self._ordered: list[float] | None = None

    def add(self, seconds: float) -> None:
        self.samples.append(seconds)
        self._ordered = None

    def quantile(self, q: float) -> float:
        """The nearest-rank ``q`` quantile of the window (not empty)."""
        ordered = self._ordered
        if ordered is None:
            ordered = self._ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class HedgeDelays:
    """Recent successful latencies per (agent, capability), and the hedge delay they give."""

    def __init__(self) -> None:
        self._windows: dict[tuple[str, str], _Window] = {}

    def record(self, agent: str, capability: str, policy: Hedging, seconds: float) -> None:
        """An attempt of ``agent``'s ``capability`` answered successfully in ``seconds`` (and won its race)."""
        window = self._windows.get((agent, capability))
        if window is None or window.samples.maxlen != policy.window:
            if len(self._windows) >= _MAX_TRACKED:
                del self._windows[next(iter(self._windows))]
            window = self._windows[(agent, capability)] = _Window(policy.window)
        window.add(seconds)

    def delay(self, agent: str, capability: str, policy: Hedging) -> float:
        """Seconds to wait before hedging: ``max_delay`` until ``min_samples`` are known, then the percentile,
        clamped to ``[min_delay, max_delay]``."""
        window = self._windows.get((agent, capability))
        if window is None or len(window.samples) < policy.min_samples:
            return policy.max_delay
        return min(policy.max_delay, max(policy.min_delay, window.quantile(policy.percentile)))
