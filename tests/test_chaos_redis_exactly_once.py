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
import redis.asyncio as aioredis
from chaos_support import AGENT, Cluster, cluster, go, results, tally, wait_for_executions
from dedup_store_conformance import K, answer, key
from servers import Server, _binary, free_port, redis_answers

from reach_plugins.errors import BackendUnavailable
from reach_plugins.stores.redis_dedup import RESTORE_HOLD, RedisDedupStore

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
    twice; every call succeeds but for a few keys left ``outcome_unknown`` (never another failure)."""
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
            # a claim the store cannot settle from what its live owners remember ends OutcomeUnknown (its key
            # is safe to retry later), never in a second run: seen for 0-3 keys of 150 with fsync always
            assert set(tally(merged).final) <= {"success", "outcome_unknown"}, tally(merged).final
            assert succeeded(merged) >= 300 - 2 * 5, tally(merged).final


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


async def test_a_dataset_that_lost_a_claim_gets_it_back_from_its_owner_before_anyone_takes_the_key(
    redis_url: str,
) -> None:
    """Every key of a store wiped (a restart without persistence): a twin's begin is held, not new; the owner notices
    the new epoch by itself (it watches while it holds claims) and writes its claim back, so once the hold ends the
    twin sees it in flight, never free; the owner's result lands."""
    prefix = f"restore-{uuid.uuid4().hex[:8]}:"
    owner = RedisDedupStore(aioredis.Redis.from_url(redis_url), prefix=prefix, owns_client=True)
    twin = RedisDedupStore(aioredis.Redis.from_url(redis_url), prefix=prefix, owns_client=True)
    claim, other = key("claimed"), key("other")
    assert (await owner.begin(claim, "h", 30)).state == "new"
    assert (await twin.begin(other, "h", 30)).state == "new"
    wiper = aioredis.Redis.from_url(redis_url)
    await wiper.delete(*await wiper.keys(f"{prefix}*"))
    await wiper.aclose()
    with pytest.raises(BackendUnavailable, match="restoring the claims"):
        await twin.begin(claim, "h", 30)
    assert await held_out(twin, claim) == "inflight"
    await owner.complete(claim, answer("once"))
    done = await twin.begin(claim, "h", 30)
    assert done.state == "done" and done.result is not None and done.result.data == "once"
    await owner.aclose()
    await twin.aclose()


async def held_out(store: RedisDedupStore, claimed: Any) -> str:
    """The first answer to ``begin`` after the restore hold (at most a few seconds)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + 5 * RESTORE_HOLD
    while True:
        try:
            return (await store.begin(claimed, "h", 30)).state
        except BackendUnavailable:
            assert loop.time() < end, "still held after five restore holds"
            await asyncio.sleep(0.05)


async def test_a_claim_whose_begin_lost_its_answer_is_released_when_redis_answers(redis_url: str) -> None:
    """begin wrote its claim but the answer was lost (the caller saw an outage): once Redis answers again, the
    claim is released, so the key is free instead of blocked for its lease and then ``unknown``."""
    prefix = f"abandon-{uuid.uuid4().hex[:8]}:"
    store = RedisDedupStore(aioredis.Redis.from_url(redis_url), prefix=prefix, owns_client=True)
    other = RedisDedupStore(aioredis.Redis.from_url(redis_url), prefix=prefix, owns_client=True)
    lost = store._scripts["begin"]

    async def written_then_lost(**kwargs: Any) -> Any:
        await lost(**kwargs)
        raise ConnectionError("the answer was lost")

    store._scripts["begin"] = written_then_lost
    with pytest.raises(BackendUnavailable):
        await store.begin(K, "h", 30)
    store._scripts["begin"] = lost
    assert (await other.begin(K, "h", 30)).state == "inflight"
    loop = asyncio.get_running_loop()
    end = loop.time() + 5
    while (state := (await other.begin(K, "h", 30)).state) == "inflight" and loop.time() < end:
        await asyncio.sleep(0.05)
    assert state == "new"
    await store.aclose()
    await other.aclose()


async def left_unknown(twin: RedisDedupStore) -> None:
    """Wait for the owner's short lease on ``K`` to lapse: the twin takes the key as ``unknown`` and leaves it so."""
    loop = asyncio.get_running_loop()
    end = loop.time() + 5
    while (taken := await twin.begin(K, "h", 30, window=60)).state == "inflight":
        assert loop.time() < end, "the lapsed lease never read as unknown"
        await asyncio.sleep(0.05)
    assert taken.state == "unknown"
    await twin.unknown(K, None)


async def test_a_result_kept_through_an_outage_settles_a_key_left_unknown_meanwhile(redis_url: str) -> None:
    """The owner finished while Redis could not be told, and its lease lapsed meanwhile (a twin took the key as
    ``unknown`` and left it so): once Redis answers the owner, it writes its result over the unknown, and the
    twin gets that result."""
    prefix = f"settle-{uuid.uuid4().hex[:8]}:"
    owner = RedisDedupStore(aioredis.Redis.from_url(redis_url), prefix=prefix, owns_client=True)
    twin = RedisDedupStore(aioredis.Redis.from_url(redis_url), prefix=prefix, owns_client=True)
    assert (await owner.begin(K, "h", 0.3, window=60)).state == "new"
    reachable = dict(owner._scripts)

    async def unreachable(**_: Any) -> Any:
        raise ConnectionError("redis went away")

    owner._scripts.update(complete=unreachable, restore=unreachable)
    await owner.complete(K, answer("ran once"))
    await left_unknown(twin)
    owner._scripts.update(reachable)
    loop = asyncio.get_running_loop()
    end = loop.time() + 5
    while (done := await twin.begin(K, "h", 30, window=60)).state == "unknown":
        await twin.unknown(K, None)
        assert loop.time() < end, "the owner's result was never written"
        await asyncio.sleep(0.05)
    assert done.state == "done" and done.result is not None and done.result.data == "ran once"
    await owner.aclose()
    await twin.aclose()


async def test_a_late_result_settles_a_key_left_unknown(redis_url: str) -> None:
    """The owner's lease lapsed while its handler ran (a twin found the key ``unknown`` and left it so): the owner's
    result, when it comes, settles the key, so the twin's next look replays it instead of ``unknown`` forever."""
    prefix = f"late-{uuid.uuid4().hex[:8]}:"
    owner = RedisDedupStore(aioredis.Redis.from_url(redis_url), prefix=prefix, owns_client=True)
    twin = RedisDedupStore(aioredis.Redis.from_url(redis_url), prefix=prefix, owns_client=True)
    assert (await owner.begin(K, "h", 0.2, window=60)).state == "new"
    await left_unknown(twin)
    await owner.complete(K, answer("late"))
    done = await twin.begin(K, "h", 30, window=60)
    assert done.state == "done" and done.result is not None and done.result.data == "late"
    await owner.aclose()
    await twin.aclose()
