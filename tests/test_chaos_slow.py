"""A slow instance that still answers its probes: found by outlier detection within seconds, its share cut.

Three real agent processes serve ``query_order``. A client sends 20 calls a
second with a 3 s deadline; after a warm-up (the breakers' 60 s windows fill
with successes, as in production) one instance turns slow: 2-5 s a call, while
its ``/healthz`` answers at once, so probes call it healthy. Smooth weighted
round robin alone keeps sending it a third of the calls until its breaker's
window tips (issue 25: 33.3 %, ~13 s); the outlier detector cuts its weight,
ejects it and gives it probations.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from chaos_support import port_answers
from servers import free_port, wait_until

from reach_plugins import ReachClient
from reach_plugins.errors import ReachError
from reach_plugins.routing.probes import Prober
from transports.direct import DirectTransport

AGENT = """
import asyncio, os, random, sys
from reach_plugins.agent import ReachAgent, serve

port, slow = int(sys.argv[1]), sys.argv[2]
agent = ReachAgent("orders")

@agent.capability("query_order")
async def query_order(n: int) -> dict:
    await asyncio.sleep(random.uniform(2.0, 5.0) if os.path.exists(slow) else 0.01)
    return {"n": n}

serve(agent, "127.0.0.1", port, loop="asyncio", log_level="warning")
"""

RATE = 20.0
WARM = 15.0
"""Seconds of load before the instance turns slow."""
SLOW_FOR = 12.0
FOUND_WITHIN = 6.0
"""Seconds after it turns slow by which the slow instance must be judged an outlier."""
SETTLED_AFTER = 5.0
"""The share is measured over attempts started this long after it turned slow."""


@pytest.fixture
def instances(tmp_path: Path) -> Iterator[tuple[str, list[int], Path]]:
    """Three agent processes behind a file registry (the last turns slow when the flag file exists); killed."""
    ports = [free_port() for _ in range(3)]
    flag = tmp_path / "slow"
    processes = [
        subprocess.Popen([sys.executable, "-c", AGENT, str(port), str(flag if n == 2 else tmp_path / "never")])
        for n, port in enumerate(ports)
    ]
    endpoints = "".join(f"      - http://127.0.0.1:{port}\n" for port in ports)
    path = tmp_path / "agents.yaml"
    path.write_text(
        "agents:\n  - name: orders\n    capabilities: [query_order]\n"
        f"    health_check: {{probe_interval: 500ms, ready_interval: 2s}}\n    endpoints:\n{endpoints}"
    )
    try:
        yield f"file://{path}", ports, flag
    finally:
        for process in processes:
            process.kill()
            process.wait()


async def test_a_slow_instance_loses_its_share_within_seconds(instances: tuple[str, list[int], Path]) -> None:
    """An instance turning slow (healthy to probes) is judged an outlier within 6 s; after 5 s it gets far under 1/3."""
    registry, ports, flag = instances
    for port in ports:
        wait_until(lambda port=port: port_answers(port), 30, f"agent on port {port} listening")
    attempts: list[tuple[float, str]] = []
    found: float | None = None
    warm_share = 1.0
    async with asyncio.timeout(WARM + SLOW_FOR + 40), ReachClient(registry, DirectTransport(), probes=True) as client:
        slow = next(i.instance_id for i in client.registry.instances("orders").values() if str(ports[2]) in i.endpoint)
        begin, wall = time.monotonic(), time.time()

        async def one(n: int) -> None:
            try:
                response = await client.reach("query_order", {"n": n}, timeout_ms=3000, trace=True)
            except ReachError:
                return
            assert response.trace is not None
            attempts.extend((a.started_at - wall, a.instance) for a in response.trace.attempts)

        tasks = []
        while time.monotonic() - begin < WARM + SLOW_FOR:
            tasks.append(asyncio.create_task(one(len(tasks))))
            if not flag.exists() and time.monotonic() - begin >= WARM:
                flag.touch()
            share, _ = client.pipeline.standing("orders", slow)
            if not flag.exists():
                warm_share = min(warm_share, share)
            elif found is None and share < 1.0:
                found = time.monotonic() - begin - WARM
            await asyncio.sleep(1 / RATE)
        healthy_to_probes = Prober.shared(client.registry).available("orders", slow)
        await asyncio.gather(*tasks)
    assert healthy_to_probes, "the slow instance must look healthy to the probes (else they, not outliers, acted)"
    assert warm_share > 0.0, "an instance was ejected while all were fast"
    assert found is not None and found <= FOUND_WITHIN, f"judged an outlier after {found} s"
    late = [instance for at, instance in attempts if at >= WARM + SETTLED_AFTER]
    n = len(late)
    p = 0.1 / 2.1  # at most a probation's share: 10 % of one weight beside two full ones
    bound = n * p + 3 * math.sqrt(n * p * (1 - p)) + 3  # 3 sigma, + the min_samples calls of one probation
    share = Counter(late)[slow]
    assert n >= RATE * (SLOW_FOR - SETTLED_AFTER) * 0.8, f"only {n} attempts after {SETTLED_AFTER}s"
    assert share <= bound < n / 3, f"the slow instance took {share} of {n} attempts (bound {bound:.1f})"
    print(f"found after {found:.2f}s; slow share after {SETTLED_AFTER:g}s: {share}/{n} (bound {bound:.1f})")
