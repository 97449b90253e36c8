"""The chaos suite (DESIGN 11.1/11.2): real processes, ``kill -9``, lost replies, Redis and hop crashes.

Each scenario asserts **0 duplicate completed executions**, counted at the agents
by key, and prints what the callers saw (OutcomeUnknown, other failures,
latency). ``shared`` agents run with a Redis idempotency store and declare it;
``local`` agents keep keys in memory. Callers keep their dedup claims in Redis.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest
from chaos_support import Cluster, cluster, go, results, tally, wait_for_executions
from faultproxy import FaultProxy
from servers import Server, wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.integration]


def fresh(redis_url: str) -> str:
    """A Redis URL with a key prefix of its own (stores of different tests never meet)."""
    return f"{redis_url}?prefix=chaos-{uuid.uuid4().hex[:8]}:"


def agent_store(kind: str, redis_url: str) -> str:
    return fresh(redis_url) if kind == "shared" else "memory://"


def report(scenario: str, cluster_: Cluster, merged: dict[str, list[dict[str, object]]]) -> int:
    duplicates = cluster_.duplicates()
    print("\n" + tally(merged).line(scenario, len(duplicates)), [len(a.executions()) for a in cluster_.agents])
    return len(duplicates)


@pytest.mark.parametrize(("agents", "work"), [("shared", 0.5), ("local", 0.5), ("shared", 0.02), ("local", 0.02)])
async def test_instance_killed_mid_run(agents: str, work: float, etcd_url: str, redis_url: str, tmp_path: Path) -> None:
    """3 instances, 2 caller processes sending the same keys, ``kill -9`` one instance mid-run: no key runs twice."""
    with cluster(tmp_path, etcd_url) as c:
        store = agent_store(agents, redis_url)
        for _ in range(3):
            c.add_agent(store, work)
        callers = c.callers(fresh(redis_url), keys=150, concurrency=15, timeout_ms=4000, retry_for=12.0)
        go(callers)
        wait_for_executions(c, 30)
        c.agents[0].kill()
        merged = results(callers)
        assert report(f"instance kill -9 ({agents} agents, {work * 1000:g} ms handlers)", c, merged) == 0
        final = tally(merged).final
        if agents == "shared":
            assert final == {"success": 300}, final
        else:
            assert set(final) <= {"success", "outcome_unknown", "OutcomeUnknown"}, final
