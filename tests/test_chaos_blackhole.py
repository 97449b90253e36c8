"""One of three instances unreachable for 20 s, blackholed or resetting: no call fails for good, none runs twice.

Three agent processes register in etcd; one is advertised behind a fault
proxy in the test process. Keyed calls (each agent checks its own keys) go
out at a steady rate; for 20 s the proxy swallows every request (blackhole:
accepts, never answers) or resets the connection once the request arrives.
A call whose attempt reached nothing (connect refused, reset before the
request was written) fails over at once; one whose request was written is
answer-unknown and pinned to that instance, and its key is sent again by the
caller until it succeeds there once the instance is back. Counted: calls not
successful within ``RETRY_FOR`` seconds, and keys executed twice (at the agents).
The healthy two never stall: the adaptive limit is per instance and only the
faulty one's is cut, so no first try fails but those the faulty one swallowed
(``outcome_unknown``); with one limit per agent, the healthy ones were shed
as ``RateLimited`` too.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest
from chaos_support import cluster
from faultproxy import FaultProxy, Mode
from servers import free_port

from reach_plugins import ReachClient
from reach_plugins.errors import ReachError

RATE = 40.0
FAULT_AT = 3.0
FAULT_FOR = 20.0
RUN_FOR = 30.0
RETRY_FOR = 40.0
"""Seconds a caller keeps sending a key that did not succeed (every 0.5 s), as a client with a durable key would."""


async def keyed(client: ReachClient, key: str, outcomes: dict[str, list[str]]) -> None:
    """One keyed call, sent again with the same key until it succeeds or ``RETRY_FOR`` passed."""
    started = time.monotonic()
    seen = outcomes.setdefault(key, [])
    while True:
        try:
            response = await client.reach("work", {"n": 1}, idempotency_key=key, timeout_ms=3_000)
            seen.append("success" if response.ok else (response.error.type if response.error else "fail"))
        except ReachError as exc:
            seen.append(type(exc).__name__)
        if seen[-1] == "success" or time.monotonic() - started > RETRY_FOR:
            return
        await asyncio.sleep(0.5)


@pytest.mark.parametrize("mode", ["blackhole", "reset"])
async def test_one_unreachable_instance_of_three_fails_no_call(mode: Mode, etcd_url: str, tmp_path: Path) -> None:
    """Blackholed or resetting for 20 s: 0 calls failed for good, 0 keys run twice, no healthy instance stalled."""
    listen, advertised = free_port(), free_port()
    with cluster(tmp_path, etcd_url) as c:
        async with FaultProxy(("127.0.0.1", listen)) as proxy:
            await proxy.aclose()
            proxy.port = advertised
            await proxy.up()
            c.add_agents(3, "memory://", 0.02, ports={0: (listen, advertised)})
            outcomes: dict[str, list[str]] = {}
            async with (
                asyncio.timeout(RUN_FOR + RETRY_FOR + 30),
                ReachClient(registry=c.registry, tenant="demo") as client,
            ):
                tasks = []
                begin = time.monotonic()
                while (now := time.monotonic() - begin) < RUN_FOR:
                    proxy.mode = mode if FAULT_AT <= now < FAULT_AT + FAULT_FOR else "pass"
                    tasks.append(asyncio.create_task(keyed(client, f"k{len(tasks)}", outcomes)))
                    await asyncio.sleep(1 / RATE)
                proxy.mode = "pass"
                await asyncio.gather(*tasks)
        duplicates = c.duplicates()
    first = Counter(seen[0] for seen in outcomes.values())
    final = Counter(seen[-1] for seen in outcomes.values())
    resent = sum(1 for seen in outcomes.values() if len(seen) > 1)
    print(f"{mode}: {len(outcomes)} keys; first try {dict(first)}; final {dict(final)}; resent {resent}")
    assert final == Counter({"success": len(outcomes)}), final
    assert set(first) <= {"success", "outcome_unknown"}, first
    assert duplicates == {}, duplicates
