"""Properties of the balancing algorithms: SWRR shares, HRW stability, bounded load under skewed keys."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import example, given, settings
from hypothesis import strategies as st
from registry_conformance import FakeClock, agent

from reach_plugins.model import ReachRequest
from reach_plugins.registry import MemoryRegistry
from reach_plugins.routing import Rendezvous, Router, SmoothWeightedRoundRobin

PICKS = 10_000
SESSIONS = 5_000


def best(hrw: Rendezvous, session: str, keys: list[tuple[str, str]]) -> tuple[str, str]:
    """Plain rendezvous choice (no load bound): the top-scoring key."""
    return hrw.scores(session, keys)[0][1]


def instance_keys(count: int) -> list[tuple[str, str]]:
    return [("orders", f"orders-{i}") for i in range(count)]


@settings(max_examples=25, deadline=None)
@given(weights=st.lists(st.integers(min_value=1, max_value=1000), min_size=1, max_size=8), seed=st.integers(0, 2**32))
@example(weights=[1, 1000, 1000, 1000], seed=0)
@example(weights=[5, 1, 1], seed=1)
def test_swrr_follows_weights_within_one_percent(weights: list[int], seed: int) -> None:
    """Over 10,000 picks each peer's share is within 1 point of its weight's share, and every peer is picked."""
    rr: SmoothWeightedRoundRobin[int] = SmoothWeightedRoundRobin(random.Random(seed))
    peers = list(enumerate(weights))
    rr.update(peers)
    counts = Counter(rr.pick() for _ in range(PICKS))
    total = sum(weights)
    for peer, weight in peers:
        assert abs(counts[peer] / PICKS - weight / total) <= 0.01
        assert counts[peer] >= 1


@settings(max_examples=25, deadline=None)
@given(weights=st.lists(st.integers(min_value=1, max_value=200), min_size=1, max_size=8), seed=st.integers(0, 2**32))
@example(weights=[5, 1, 1], seed=1)
@example(weights=[3, 3, 3, 1, 1, 7, 3], seed=2)
def test_swrr_is_smooth(weights: list[int], seed: int) -> None:
    """Any W = sum(weights) consecutive picks hold each peer exactly its weight; a peer waits at most W/w + n picks."""
    rr: SmoothWeightedRoundRobin[int] = SmoothWeightedRoundRobin(random.Random(seed))
    rr.update(enumerate(weights))
    total = sum(weights)
    picks = [rr.pick() for _ in range(3 * total)]
    for start in range(0, 2 * total + 1, max(1, total // 40)):
        assert Counter(picks[start : start + total]) == dict(enumerate(weights))
    last: dict[int, int] = {}
    for position, peer in enumerate(picks):
        if peer in last:
            assert position - last[peer] <= total / weights[peer] + len(weights)
        last[peer] = position


@settings(max_examples=20, deadline=None)
@given(
    weights=st.lists(st.integers(min_value=1, max_value=100), min_size=2, max_size=6),
    changed=st.integers(min_value=1, max_value=100),
    seed=st.integers(0, 2**32),
)
def test_swrr_follows_a_weight_change_and_a_departure(weights: list[int], changed: int, seed: int) -> None:
    """After a reweight and a peer leaving, the next W picks again give each remaining peer exactly its weight."""
    rr: SmoothWeightedRoundRobin[int] = SmoothWeightedRoundRobin(random.Random(seed))
    rr.update(enumerate(weights))
    for _ in range(sum(weights) // 2 + 1):
        rr.pick()
    now = {peer: weight for peer, weight in enumerate(weights) if peer != 0}
    now[1] = changed
    rr.update(now.items())
    total = sum(now.values())
    for _ in range(total):  # one period to settle the served part of each peer's period
        rr.pick()
    assert Counter(rr.pick() for _ in range(total)) == now


@settings(max_examples=10, deadline=None)
@given(weights=st.lists(st.integers(min_value=1, max_value=100), min_size=2, max_size=5))
def test_router_swrr_follows_agent_weights(weights: list[int]) -> None:
    """Through the router, agents' routing weights decide their share of session-less traffic."""
    registry = MemoryRegistry(clock=FakeClock())
    for i, weight in enumerate(weights):
        registry.put_agent(agent(f"a{i}", "query_order", endpoints=1, routing={"weight": weight}))
    router = Router(registry, clock=registry.clock, rng=random.Random(1))
    request = ReachRequest(capability="query_order")
    rounds = 2_000
    counts = Counter(router.route(request).agent.name for _ in range(rounds))
    for i, weight in enumerate(weights):
        assert abs(counts[f"a{i}"] / rounds - weight / sum(weights)) <= 0.01


@settings(max_examples=20, deadline=None)
@given(count=st.integers(min_value=2, max_value=16), gone=st.data())
def test_removing_an_instance_moves_only_its_sessions(count: int, gone: st.DataObject) -> None:
    """Rendezvous hashing: taking one instance away re-homes exactly the sessions that were on it."""
    keys = instance_keys(count)
    removed = keys[gone.draw(st.integers(0, count - 1))]
    hrw = Rendezvous()
    remaining = [key for key in keys if key != removed]
    for i in range(2_000):
        session = f"s-{i}"
        before, after = best(hrw, session, keys), best(hrw, session, remaining)
        assert before in (after, removed)


@settings(max_examples=10, deadline=None)
@given(count=st.integers(min_value=2, max_value=16))
def test_adding_an_instance_moves_about_its_share(count: int) -> None:
    """Rendezvous hashing: a new instance takes about 1/(N+1) of the sessions, all of them to itself."""
    keys = instance_keys(count)
    grown = [*keys, ("orders", "orders-new")]
    hrw = Rendezvous()
    moved = 0
    for i in range(SESSIONS):
        before, after = best(hrw, f"s-{i}", keys), best(hrw, f"s-{i}", grown)
        if before != after:
            assert after == ("orders", "orders-new")
            moved += 1
    assert abs(moved / SESSIONS - 1 / (count + 1)) <= 0.03


def test_router_keeps_sessions_when_an_instance_dies() -> None:
    """Through the router, sessions on surviving instances stay put; those on the dead one are restored."""
    registry = MemoryRegistry(clock=FakeClock())
    registry.put_agent(agent("orders", "query_order", endpoints=6))
    down: set[str] = set()
    router = Router(registry, clock=registry.clock, is_available=lambda agent_name, instance: instance not in down)
    placed = {f"s-{i}": router.route(ReachRequest(capability="query_order", session_id=f"s-{i}")) for i in range(600)}
    broken = "orders-2"
    down.add(broken)
    for session, first in placed.items():
        route = router.route(ReachRequest(capability="query_order", session_id=session))
        if first.instance.instance_id == broken:
            assert route.decision.affinity == "restored" and route.instance.instance_id != broken
        else:
            assert route.instance.instance_id == first.instance.instance_id
            assert route.decision.affinity == "pinned"


@settings(max_examples=8, deadline=None)
@given(
    count=st.integers(min_value=2, max_value=12),
    bounded_load=st.sampled_from([1.1, 1.25, 1.5]),
    prefix=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=0, max_size=12),
)
def test_bounded_load_holds_under_skewed_keys(count: int, bounded_load: float, prefix: str) -> None:
    """5,000 look-alike session ids ending in '-prod': no instance holds more than c x average + 1 sessions."""
    registry = MemoryRegistry(clock=FakeClock())
    registry.put_agent(agent("orders", "query_order", endpoints=count))
    router = Router(registry, clock=registry.clock, bounded_load=bounded_load)
    for i in range(SESSIONS):
        router.route(ReachRequest(capability="query_order", session_id=f"{prefix}{i}-prod"))
    loads = router.sessions.active
    assert sum(loads.values()) == SESSIONS
    assert max(loads.values()) <= bounded_load * SESSIONS / count + 1


def test_bounded_load_spreads_one_hot_key_range() -> None:
    """Even when every session prefers the same instance, the cap spreads them over all instances."""
    registry = MemoryRegistry(clock=FakeClock())
    registry.put_agent(agent("orders", "query_order", endpoints=4))
    router = Router(registry, clock=registry.clock, bounded_load=1.25)
    hrw = Rendezvous()
    keys = [("orders", f"orders-{i}") for i in range(4)]
    hot = [s for s in (f"tenant-{i}-prod" for i in range(20_000)) if best(hrw, s, keys) == keys[0]][:1_000]
    for session in hot:
        router.route(ReachRequest(capability="query_order", session_id=session))
    loads = router.sessions.active
    assert len(loads) == 4
    assert max(loads.values()) <= 1.25 * len(hot) / 4 + 1


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(min_value=1, max_value=12),
    loads=st.lists(st.integers(min_value=0, max_value=6), max_size=12),
    session=st.text(min_size=1, max_size=12),
)
def test_placement_is_the_best_scoring_key_under_the_cap(count: int, loads: list[int], session: str) -> None:
    """place() (no sort, precomputed seeds) picks what the ranking says: the best-scoring key below the cap."""
    hrw = Rendezvous(1.25)
    keys = instance_keys(count)
    active = {key: load for key, load in zip(keys, loads, strict=False) if load}
    placed = hrw.place(session, keys, active, hrw.seeds(keys))
    assert placed == hrw.place(session, keys, active)
    assert placed.key == next(key for _, key in hrw.scores(session, keys) if active.get(key, 0) < placed.cap)
