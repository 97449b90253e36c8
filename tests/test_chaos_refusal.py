"""A refusal that proves nothing ran fails over (issue 25, deliverable 4): an agent whose clock is 300 s ahead.

Three agent processes verify Ed25519 tokens of one issuer; one of them reads the time 300 s ahead, so every
token the caller's issuer signs (120 s of life: past it on that clock, whatever the leeway) is "expired"
there. The skewed instance ran nothing: each refusal fails over at once to a peer, counts against the
skewed instance (its breaker opens) and is logged; none is final.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from gray_support import Outcomes, gray_cluster, paced

from reach_plugins import ReachClient
from reach_plugins.errors import ReachError

CALLS = 800
RATE = 100.0
SKEW = 300.0


async def test_an_instance_with_a_skewed_clock_costs_no_call(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One of 3 agents' clock +300 s, 800 keyed calls: 0 failed; its refusals failed over, counted and logged."""
    outcomes = Outcomes()
    refused_at: list[str] = []
    with gray_cluster(tmp_path) as cluster:
        cluster.start(3, "memory://", skew={2: SKEW})
        registry = cluster.registry()
        async with ReachClient(registry, tenant="demo", tokens=cluster.tokens(ttl=120.0)) as client:

            async def one(n: int) -> None:
                try:
                    response = await client.reach("work", {"n": n}, idempotency_key=f"k-{n}", trace=True)
                except ReachError as exc:
                    outcomes.final[type(exc).__name__] += 1
                    return
                outcomes.final["success" if response.ok else (response.error.type if response.error else "fail")] += 1
                assert response.trace is not None
                for attempt in response.trace.attempts:
                    outcomes.attempts[f"{attempt.outcome}/{attempt.delivery}"] += 1
                    if attempt.delivery == "not_delivered":
                        refused_at.append(attempt.instance)

            with caplog.at_level(logging.WARNING, logger="reach_plugins.attempts"):
                async with asyncio.timeout(CALLS / RATE + 60):
                    await paced(RATE, CALLS, one)
        executions = cluster.executions()
        skewed_ran = cluster.agents[2].executions()
    print(f"clock +{SKEW:g} s on 1 of 3: final={dict(outcomes.final)} attempts={dict(outcomes.attempts)}")
    assert outcomes.failed == 0, f"{outcomes.failed} of {outcomes.calls} failed: {dict(outcomes.final)}"
    assert refused_at and set(refused_at) == {"gray-2"}
    assert skewed_ran == []
    assert sum(executions.values()) == CALLS and max(executions.values()) == 1
    assert len(refused_at) < CALLS / 10  # counted against it: its breaker opened and kept it out
    messages = [record.getMessage() for record in caplog.records]
    assert any("gray/gray-2 refused a call before running it (is its clock skewed?)" in m for m in messages)
    assert any("breaker gray/gray-2: closed -> open" in m for m in messages)
