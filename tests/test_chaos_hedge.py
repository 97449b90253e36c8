"""Hedged attempts against a slow instance (issue 25, deliverable 2): real agent processes sharing Redis keys.

One of three instances takes 2-5 s before it sees each call (its probes answer at once); every call has a
3 s deadline and an idempotency key, and the agent declares shared idempotency. Without hedging about a
third of the calls land there and time out; with hedging the call is hedged to a peer after the
capability's latency percentile, the first answer wins and the slow attempt is cancelled (a censored
latency for the outlier detector, which so ejects the slow instance). Executions are
counted per key at the agents, after the slow instance has had the time to run whatever reached it.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from pathlib import Path

from gray_support import Outcomes, gray_cluster, paced

from reach_plugins import ReachClient
from reach_plugins.errors import ReachError
from reach_plugins.policy.outliers import OutlierPolicy

CALLS = 360
RATE = 40.0
SLOW = (2.0, 5.0)
DESCRIPTOR = "    idempotency: {shared: true}\n    hedging: {max_delay: 0.5}\n"


async def test_hedging_keeps_every_keyed_call_off_a_slow_instance(tmp_path: Path, redis_url: str) -> None:
    """1 of 3 instances +2-5 s, deadline 3 s, 360 keyed calls: 0 failed, each key executed exactly once."""
    store = f"{redis_url}?prefix=reach-hedge:{uuid.uuid4().hex}:"
    outcomes = Outcomes()
    with gray_cluster(tmp_path) as cluster:
        cluster.start(3, store, slow={1: f"{SLOW[0]},{SLOW[1]}"})
        registry = cluster.registry(DESCRIPTOR)
        async with ReachClient(registry, tenant="demo", tokens=cluster.tokens()) as client:

            async def one(n: int) -> None:
                try:
                    response = await client.reach(
                        "work", {"n": n}, idempotency_key=f"k-{n}", timeout_ms=3000, trace=True
                    )
                except ReachError as exc:
                    outcomes.final[type(exc).__name__] += 1
                    return
                outcomes.final["success" if response.ok else (response.error.type if response.error else "fail")] += 1
                assert response.trace is not None
                outcomes.attempts.update(attempt.outcome for attempt in response.trace.attempts)

            async with asyncio.timeout(CALLS / RATE + 60):
                await paced(RATE, CALLS, one)
        ended = time.monotonic()
        # whatever reached the slow instance runs there within SLOW[1] s of being sent: give it that long
        while time.monotonic() < ended + SLOW[1] + 1.0:
            await asyncio.sleep(0.25)
        executions = cluster.executions()
    print(f"hedging, 1 of 3 slow +2-5 s, deadline 3 s: final={dict(outcomes.final)} attempts={dict(outcomes.attempts)}")
    assert outcomes.failed == 0, f"{outcomes.failed} of {outcomes.calls} failed: {dict(outcomes.final)}"
    duplicates = {key: count for key, count in executions.items() if count > 1}
    assert duplicates == {}
    assert set(executions) == {f"k-{n}" for n in range(CALLS)}
    # the slow instance's attempts were hedged and cancelled, and those censored latencies got it ejected: it kept
    # well under the third of the calls it would take if never judged (Binomial(CALLS, 1/3), 4 sd below the mean)
    third, spread = CALLS / 3, math.sqrt(CALLS * (1 / 3) * (2 / 3))
    assert OutlierPolicy().min_samples <= outcomes.attempts["cancelled"] < third - 4 * spread
