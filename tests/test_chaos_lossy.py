"""A lossy instance (issue 25, deliverable 9): 20 % of its replies lost after executing, keys checked by the agent.

Three agent processes, each checking idempotency keys in its own store (no shared idempotency: a keyed
call whose answer was lost may be retried only where it ran). One sits behind a real TCP proxy that
swallows the agent's answer and leaves the connection hanging, for each reply with probability 0.2
(seeded). Every call is keyed (deadline 4 s); the agents log each execution by key.

On the first release the hung attempt took the whole deadline (the per-attempt timeout is the response
timeout, 120 s), so every lost answer failed its call: 46 of 600. Now, once the capability's latency is
known, an attempt of a keyed call takes at most its share of the deadline; a call whose first attempt
lands on the lossy instance is retried there with its key and the agent replays the stored result.
Each attempt there is lost independently with p = 0.2, so with max_attempts 3 such a call fails with
probability p**3 = 0.008: the success rate of those calls is 0.992 >= 0.99. The breaker judges requests,
not attempts (a retry that succeeds keeps it closed), so it does not open on an instance whose retries
succeed: it executes everything and 80 % of its answers arrive, shutting it out would only shift load.
The outlier detector (policy/outliers.py) does see its cut attempts as slow ones and lowers its share, so
how many calls go there varies; the margin is computed from the number that did.
The failures allowed are the 1e-4 upper quantile of Binomial(n, p**3).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

from gray_support import LossyProxy, Outcomes, gray_cluster, paced

from reach_plugins import ReachClient
from reach_plugins.errors import ReachError

CALLS = 600
RATE = 100.0
LOSS = 0.2
MAX_ATTEMPTS = 3


def binomial_upper(n: int, p: float, tail: float) -> int:
    """The smallest k with P(X > k) <= tail for X ~ Binomial(n, p)."""
    cumulative, k = 0.0, 0
    while True:
        cumulative += math.comb(n, k) * p**k * (1 - p) ** (n - k)
        if 1.0 - cumulative <= tail:
            return k
        k += 1


async def test_a_lossy_instance_costs_at_most_its_binomial_share(tmp_path: Path) -> None:
    """20 % of one instance's replies lost after executing, 600 keyed calls: success of the calls that went
    there >= 0.99 within a binomial margin, 0 duplicates, and the other calls all succeed."""
    outcomes = Outcomes()
    lossy_calls = Outcomes()
    with gray_cluster(tmp_path) as cluster:
        cluster.start(3, "memory://")
        async with LossyProxy(("127.0.0.1", cluster.agents[0].port), loss=LOSS) as proxy:
            registry = cluster.registry(f"    retry: {{max_attempts: {MAX_ATTEMPTS}}}\n", ports={0: proxy.port})
            async with ReachClient(registry, tenant="demo", tokens=cluster.tokens()) as client:

                async def one(n: int) -> None:
                    try:
                        response = await client.reach(
                            "work", {"n": n}, idempotency_key=f"k-{n}", timeout_ms=4000, trace=True
                        )
                    except ReachError as exc:
                        outcomes.final[type(exc).__name__] += 1
                        return
                    kind = "success" if response.ok else (response.error.type if response.error else "fail")
                    outcomes.final[kind] += 1
                    assert response.trace is not None
                    attempts = response.trace.attempts
                    if response.instance == "gray-0" or (attempts and attempts[0].instance == "gray-0"):
                        lossy_calls.final[kind] += 1
                    outcomes.attempts.update(f"{a.instance}:{a.outcome}" for a in attempts if a.outcome != "success")

                async with asyncio.timeout(CALLS / RATE + 60):
                    await paced(RATE, CALLS, one)
            lost, sent = proxy.lost, proxy.requests
        executions = cluster.executions()
    print(f"lossy 20 %: lost {lost} of {sent} final={dict(outcomes.final)} there={dict(lossy_calls.final)}")
    assert {key: count for key, count in executions.items() if count > 1} == {}
    assert lost > 0 and lossy_calls.calls > 0
    allowed = binomial_upper(lossy_calls.calls, LOSS**MAX_ATTEMPTS, 1e-4)
    assert lossy_calls.failed <= allowed, f"{lossy_calls.failed} of {lossy_calls.calls} failed (allowed {allowed})"
    assert outcomes.failed == lossy_calls.failed  # the healthy instances failed nothing
