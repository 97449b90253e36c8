"""Exactly-once through the agents' shared Redis: a ``kill -9`` and restart of Redis, and agents' skewed clocks.

Agents share idempotency in Redis (they declare it); two caller processes send the same keys; every completed
execution is logged at the agents, so duplicates are counted where they happen. The agents keep no ledger of
their own (no ``committed`` hook): only the store guards the keys.

* Redis ``kill -9`` and back, with its data lost (no persistence) or kept (append-only file, fsync always):
  the restarted dataset is told apart by its epoch, the agents write back the claims they journaled, and missing
  keys are held meanwhile; a refusal while Redis is away is ``backend_unavailable`` ("not executed"), which the
  callers fail over and retry. Run twice per setting.
* Agents' clocks skewed by +60 s and -60 s (the agent process's ``SystemClock`` offset; its registry keeps the
  true clock so routing is unaffected): leases are judged by Redis ``TIME``, so no claim lapses early.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chaos_support
import pytest
from chaos_support import AGENT, Cluster, cluster, go, results, tally, wait_for_executions
from servers import Server, _binary, free_port, redis_answers

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

QUIET = "import sys\nsys.stderr = open(sys.argv[6] + '.stderr', 'a', buffering=1)\n"
"""The agents' stderr goes to a file: a refusal logs a traceback, and an unread pipe fills in ~25 of them and then
blocks the agent's event loop (its etcd lease lapses, and every instance drops out of routing)."""

SKEWED = (
    QUIET + "import os, time\n"
    "import reach_plugins.clock\n"
    "_wall, _skew = time.time, float(os.environ['CHAOS_CLOCK_SKEW'])\n"
    "reach_plugins.clock.SystemClock.__init__.__defaults__ = (lambda: _wall() + _skew,)\n"
    + AGENT.replace("open_registry(registry)", "open_registry(registry, clock=reach_plugins.clock.SystemClock(_wall))")
)
"""The chaos agent whose clocks (every ``SystemClock`` it builds) are off by ``CHAOS_CLOCK_SKEW`` seconds; its
registry keeps the true one, so routing is not what is tested (gRPC and the event loop keep theirs too)."""


def volatile_redis(folder: Path, *, persistent: bool) -> Server:
    """A redis-server of the test's own: ``persistent`` = append-only, fsync always; else nothing survives a crash."""
    port, data = free_port(), folder / f"redis-{uuid.uuid4().hex[:6]}"
    data.mkdir()
    command = [_binary("redis-server"), "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data), "--save", ""]
    command += ["--appendonly", "yes", "--appendfsync", "always"] if persistent else ["--appendonly", "no"]
    return Server("redis", command, port, data, redis_answers)


@pytest.fixture(params=["data lost", "fsync always"])
def agents_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    server = volatile_redis(tmp_path, persistent=request.param == "fsync always")
    server.start()
    yield server
    server.stop()


async def finish(scenario: str, c: Cluster, callers: Any) -> dict[str, list[dict[str, Any]]]:
    """The callers' results; prints the scenario's line and asserts that no key completed twice at the agents."""
    merged: dict[str, list[dict[str, Any]]] = await asyncio.to_thread(results, callers)
    duplicates = c.duplicates()
    print("\n" + tally(merged).line(scenario, len(duplicates)))
    assert duplicates == {}, f"keys completed more than once: {duplicates}"
    return merged


def succeeded(merged: dict[str, list[dict[str, Any]]]) -> int:
    return sum(summary["outcomes"][-1] == "success" for per_key in merged.values() for summary in per_key)


async def test_agents_redis_killed_and_restarted_runs_no_key_twice(
    agents_redis: Server, etcd_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 agents sharing Redis, 2 callers with the same 150 keys; Redis ``kill -9``, down 2 s, back: 0 duplicates,
    twice; every key's execution is answered to at least one caller."""
    store = f"redis://127.0.0.1:{agents_redis.port}/0?prefix=chaos-{uuid.uuid4().hex[:8]}:"
    monkeypatch.setattr(chaos_support, "AGENT", QUIET + AGENT)
    with cluster(tmp_path, etcd_url) as c:
        c.add_agents(3, store, 0.2)
        for run in range(2):
            callers = c.callers("memory://", keys=150, concurrency=15, timeout_ms=4000, retry_for=15.0)
            go(callers)
            await asyncio.to_thread(wait_for_executions, c, 40 + run * 150)
            await asyncio.to_thread(agents_redis.stop, crash=True)
            await asyncio.sleep(2)
            await asyncio.to_thread(agents_redis.start)
            merged = await finish(f"agents' redis kill -9 for 2 s, run {run + 1}", c, callers)
            assert succeeded(merged) == 300, tally(merged).final


@pytest.mark.parametrize("skews", [(60.0, -60.0, 0.0)])
async def test_agents_with_skewed_clocks_run_no_key_twice(
    skews: tuple[float, ...], etcd_url: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agents at +60 s, -60 s and 0 sharing Redis; 2 callers with the same 150 keys: no claim lapses early by a
    skewed clock, so 0 duplicates and every call succeeds."""
    store = f"{redis_url}?prefix=chaos-{uuid.uuid4().hex[:8]}:"
    monkeypatch.setattr(chaos_support, "AGENT", SKEWED)
    with cluster(tmp_path, etcd_url) as c:
        for skew in skews:
            monkeypatch.setenv("CHAOS_CLOCK_SKEW", repr(skew))
            c.add_agents(1, store, 0.3)
        callers = c.callers("memory://", keys=150, concurrency=20, timeout_ms=4000, retry_for=15.0)
        go(callers)
        merged = await finish(f"agents' clocks skewed {skews}", c, callers)
        assert succeeded(merged) == 300, tally(merged).final
