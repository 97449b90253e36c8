"""The contract every DedupStore keeps (memory now, Redis later): subclass and provide ``make_store``.

    class TestMyStore(DedupStoreConformance):
        @pytest.fixture
        def make_store(self) -> StoreFactory:
            return lambda clock: MyStore(..., clock=clock)

Stores judge expiry by the clock they are given; the suite moves a FakeClock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from reach_plugins.errors import IdempotencyConflict
from reach_plugins.model import ReachResponse
from reach_plugins.stores.dedup import DedupStore
from reach_plugins.stores.keys import SEP, ScopedKey
from reach_plugins.testing.clock import FakeClock

StoreFactory = Callable[[FakeClock], DedupStore]


def key(name: str, tenant: str = "acme") -> ScopedKey:
    """The claim address of idempotency key ``name`` on capability ``cap`` for ``tenant``."""
    return ScopedKey(tenant, "dedup", f"cap{SEP}{name}")


K = key("k")


def answer(data: object = "first") -> ReachResponse:
    return ReachResponse(request_id="r-1", status="success", data=data, agent="tickets", instance="tickets-0")


class DedupStoreConformance:
    """Behaviour shared by every dedup store."""

    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest.fixture
    def store(self, make_store: StoreFactory, clock: FakeClock) -> DedupStore:
        return make_store(clock)

    async def test_first_claim_is_new_then_inflight(self, store: DedupStore) -> None:
        """The first begin owns the key; a second with the same payload sees it in flight."""
        assert (await store.begin(K, "h1", 60)).state == "new"
        second = await store.begin(K, "h1", 60)
        assert (second.state, second.result) == ("inflight", None)

    async def test_completed_key_returns_the_stored_response(self, store: DedupStore) -> None:
        """After complete, begin answers done with the first response's data."""
        await store.begin(K, "h1", 60)
        await store.complete(K, answer({"ticket": 7}))
        again = await store.begin(K, "h1", 60)
        assert again.state == "done"
        assert again.result is not None and again.result.data == {"ticket": 7}

    async def test_same_key_different_payload_conflicts(self, store: DedupStore) -> None:
        """A key reused with another payload is refused, in flight and when done."""
        await store.begin(K, "h1", 60)
        with pytest.raises(IdempotencyConflict, match="different payload"):
            await store.begin(K, "h2", 60)
        await store.complete(K, answer())
        with pytest.raises(IdempotencyConflict):
            await store.begin(K, "h2", 60)

    async def test_failed_claim_frees_the_key(self, store: DedupStore) -> None:
        """fail() keeps no result: the next begin owns the key again."""
        await store.begin(K, "h1", 60)
        await store.fail(K)
        assert (await store.begin(K, "h1", 60)).state == "new"

    async def test_keys_expire_after_their_ttl(self, store: DedupStore, clock: FakeClock) -> None:
        """A done key is forgotten once its TTL has passed."""
        await store.begin(K, "h1", 30)
        await store.complete(K, answer())
        clock.advance(29)
        assert (await store.begin(K, "h1", 30)).state == "done"
        clock.advance(2)
        assert (await store.begin(K, "h1", 30)).state == "new"

    async def test_a_lost_answer_leaves_the_key_unknown_for_the_window(
        self, store: DedupStore, clock: FakeClock
    ) -> None:
        """unknown() is never free: the next begin takes it over as ``unknown`` and learns where it ran."""
        await store.begin(K, "h1", 10, window=300, where="a/a-1")
        await store.unknown(K, "a/a-2")
        clock.advance(100)
        taken = await store.begin(K, "h1", 10, window=300)
        assert (taken.state, taken.where) == ("unknown", "a/a-2")
        assert (await store.begin(K, "h1", 10, window=300)).state == "inflight"
        await store.complete(K, answer("at last"))
        done = await store.begin(K, "h1", 10, window=300)
        assert done.state == "done" and done.result is not None and done.result.data == "at last"

    async def test_a_crashed_owner_blocks_its_key_for_its_lease_only(self, store: DedupStore, clock: FakeClock) -> None:
        """An owner that never settles: in flight for its lease, then ``unknown`` (it may have sent it), not new."""
        await store.begin(K, "h1", 6, window=300, where="a/a-1")
        clock.advance(5.9)
        assert (await store.begin(K, "h1", 6, window=300)).state == "inflight"
        clock.advance(0.2)
        taken = await store.begin(K, "h1", 6, window=300)
        assert (taken.state, taken.where) == ("unknown", "a/a-1")

    async def test_a_crashed_owner_is_looked_for_where_it_last_sent(self, store: DedupStore, clock: FakeClock) -> None:
        """sent() moves the claim's ``where`` (a failed-over owner): its heir asks the instance that may have it."""
        await store.begin(K, "h1", 6, window=300, where="a/a-1")
        await store.sent(K, "a/a-2")
        clock.advance(7)
        assert (await store.begin(K, "h1", 6, window=300)).where == "a/a-2"

    async def test_a_waiter_wakes_when_the_owner_loses_the_answer(self, store: DedupStore) -> None:
        """wait() returns None on unknown(): the waiter then takes the key over (it does not wait the lease out)."""
        await store.begin(K, "h1", 60, window=300)
        waiter = asyncio.create_task(store.wait(K, 10))
        await asyncio.sleep(0.05)
        await store.unknown(K, "a/a-1")
        assert await asyncio.wait_for(waiter, 5) is None
        assert (await store.begin(K, "h1", 60, window=300)).state == "unknown"

    async def test_keys_are_independent(self, store: DedupStore) -> None:
        """Claims on one key say nothing about another."""
        await store.begin(key("a"), "h1", 60)
        assert (await store.begin(key("b"), "h2", 60)).state == "new"

    async def test_wait_returns_the_result_completed_meanwhile(self, store: DedupStore) -> None:
        """A waiter gets the response as soon as the owner completes."""
        await store.begin(K, "h1", 60)
        waiter = asyncio.create_task(store.wait(K, 10))
        await asyncio.sleep(0)
        await store.complete(K, answer("done"))
        result = await waiter
        assert result is not None and result.data == "done"

    async def test_wait_returns_none_when_the_owner_fails(self, store: DedupStore) -> None:
        """A waiter learns of a failed claim as None (and may claim the key itself)."""
        await store.begin(K, "h1", 60)
        waiter = asyncio.create_task(store.wait(K, 10))
        await asyncio.sleep(0)
        await store.fail(K)
        assert await waiter is None
        assert (await store.begin(K, "h1", 60)).state == "new"

    async def test_wait_gives_up_after_its_timeout(self, store: DedupStore, clock: FakeClock) -> None:
        """wait() returns None once ``timeout`` passes with the key still in flight."""
        await store.begin(K, "h1", 60)
        before = clock.now()
        assert await store.wait(K, 5) is None
        assert clock.now() - before == pytest.approx(5)

    async def test_wait_on_a_done_key_returns_at_once(self, store: DedupStore, clock: FakeClock) -> None:
        """wait() on a completed key answers without waiting."""
        await store.begin(K, "h1", 60)
        await store.complete(K, answer("x"))
        before = clock.now()
        result = await store.wait(K, 5)
        assert result is not None and result.data == "x"
        assert clock.now() == before
