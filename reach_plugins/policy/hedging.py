"""When a hedged attempt is due: a latency percentile of each capability, and which calls may be hedged at all.

gRPC's hedging policy sends the next copy of a call after ``hedgingDelay``;
"The Tail at Scale" (Dean and Barroso) waits the 95th percentile of the
expected latency, so about one call in twenty costs a second attempt while the
slowest ones stop deciding the tail. :func:`hedge_delay` is that percentile of
the capability's recent winning latencies
(:class:`~reach_plugins.policy.latency.Latencies`), clamped to the policy's
bounds. Pure: no clock, no I/O.
"""

from __future__ import annotations

from reach_plugins.model import AgentDescriptor, Capability, Hedging
from reach_plugins.policy.latency import Latencies


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


def hedge_delay(latencies: Latencies, agent: str, capability: str, policy: Hedging) -> float:
    """Seconds to wait before hedging: ``max_delay`` until ``min_samples`` latencies are known, then their
    ``percentile``, clamped to ``[min_delay, max_delay]``."""
    seen = latencies.quantile(agent, capability, policy.percentile, min_samples=policy.min_samples)
    if seen is None:
        return policy.max_delay
    return min(policy.max_delay, max(policy.min_delay, seen))
