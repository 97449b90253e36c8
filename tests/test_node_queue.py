"""The node's bounded priority queue: slots, online before batch, explicit backpressure, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from reach_plugins.errors import Backpressure, ConfigError
from reach_plugins.model import Priority
from reach_plugins.node import WorkQueue
from reach_plugins.node.queue import MAX_HINT, MIN_HINT


class Clock:
    """A fake monotonic clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def settle() -> None:
    """Let every ready task run until it blocks."""
    for _ in range(5):
        await asyncio.sleep(0)


async def hold(queue: WorkQueue, priority: Priority, release: asyncio.Event, log: list[str], name: str) -> None:
    async with queue.slot(priority):
        log.append(name)
        await release.wait()


async def test_workers_bound_what_runs_and_online_goes_first() -> None:
    """Two workers run at once; of the waiting, online requests get freed slots before older batch ones."""
    queue = WorkQueue(capacity=10, workers=2)
    release = asyncio.Event()
    log: list[str] = []
    order: list[tuple[Priority, str]] = [
        ("online", "r1"),
        ("online", "r2"),
        ("batch", "b1"),
        ("batch", "b2"),
        ("online", "o1"),
        ("online", "o2"),
    ]
    tasks = []
    for priority, name in order:
        tasks.append(asyncio.create_task(hold(queue, priority, release, log, name)))
        await settle()
    assert (queue.running, queue.depth, log) == (2, 4, ["r1", "r2"])
    release.set()
    await asyncio.gather(*tasks)
    assert log == ["r1", "r2", "o1", "o2", "b1", "b2"]
    assert (queue.running, queue.depth, queue.accepted) == (0, 0, 6)


async def test_full_queue_refuses_with_a_bounded_hint() -> None:
    """With every slot taken and capacity waiting, the next request gets Backpressure with retry_after at once."""
    clock = Clock()
    queue = WorkQueue(capacity=2, workers=1, clock=clock)
    release = asyncio.Event()
    log: list[str] = []
    tasks = [asyncio.create_task(hold(queue, "online", release, log, f"r{n}")) for n in range(3)]
    await settle()
    assert queue.full
    with pytest.raises(Backpressure) as refused:
        await hold(queue, "batch", release, log, "late")
    assert MIN_HINT <= (refused.value.retry_after or 0) <= MAX_HINT
    assert "queue is full" in refused.value.message and queue.refused == 1
    release.set()
    await asyncio.gather(*tasks)
    assert log == ["r0", "r1", "r2"]


async def test_hint_grows_with_the_measured_service_time() -> None:
    """The retry hint is the time the queue needs to drain, from how long requests held their slot."""
    clock = Clock()
    queue = WorkQueue(capacity=4, workers=1, clock=clock)
    before = queue.retry_after()
    for _ in range(10):
        async with queue.slot("online"):
            clock.now += 1.0
    assert queue.retry_after() > before
    assert queue.retry_after() <= MAX_HINT


async def test_cancelled_waiter_leaves_the_queue() -> None:
    """A caller that gives up while waiting frees its place; the slot goes to the next waiter."""
    queue = WorkQueue(capacity=5, workers=1)
    release = asyncio.Event()
    log: list[str] = []
    running = asyncio.create_task(hold(queue, "online", release, log, "first"))
    await settle()
    quitter = asyncio.create_task(hold(queue, "online", release, log, "quitter"))
    stayer = asyncio.create_task(hold(queue, "online", release, log, "stayer"))
    await settle()
    assert queue.depth == 2
    quitter.cancel()
    await settle()
    assert queue.depth == 1
    release.set()
    await asyncio.gather(running, stayer)
    assert log == ["first", "stayer"] and (queue.running, queue.depth) == (0, 0)


async def test_unbounded_slot_waits_even_when_full() -> None:
    """A request already accepted (a callback ticket) waits for a slot instead of being refused."""
    queue = WorkQueue(capacity=0, workers=1)
    release = asyncio.Event()
    log: list[str] = []
    first = asyncio.create_task(hold(queue, "online", release, log, "first"))
    await settle()
    with pytest.raises(Backpressure):
        await hold(queue, "online", release, log, "refused")

    async def accepted() -> None:
        async with queue.slot("batch", bounded=False):
            log.append("ticket")

    ticket = asyncio.create_task(accepted())
    await settle()
    release.set()
    await asyncio.gather(first, ticket)
    assert log == ["first", "ticket"]


def test_bad_sizes_are_refused() -> None:
    """A queue without workers, or with negative capacity, is a ConfigError naming both numbers."""
    with pytest.raises(ConfigError, match="workers >= 1"):
        WorkQueue(capacity=10, workers=0)
    with pytest.raises(ConfigError, match="-1"):
        WorkQueue(capacity=-1)
