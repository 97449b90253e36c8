"""The router's pools: O(1) work per call whatever the number of instances, yet never a stale pick."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Mapping

import pytest
from registry_conformance import FakeClock, agent, tracked

from reach_plugins.errors import ConfigError, NoHealthyAgent
from reach_plugins.model import Instance, ReachRequest
from reach_plugins.registry import MemoryRegistry
from reach_plugins.routing import Router

SEQ = itertools.count(1)


class CountingView:
    """A registry view that counts how many instance records the router reads."""

    def __init__(self, registry: MemoryRegistry) -> None:
        self.registry = registry
        self.reads = 0

    @property
    def revision(self) -> int:
        return self.registry.revision

    @property
    def health(self) -> int:
        return self.registry.health

    def agents(self) -> Mapping[str, object]:
        return self.registry.agents()

    def instances(self, agent: str) -> Mapping[str, Instance]:
        found = self.registry.instances(agent)
        self.reads += len(found)
        return found

    def is_alive(self, instance: Instance, now: float) -> bool:
        return self.registry.is_alive(instance, now)


def ask(**fields: object) -> ReachRequest:
    return ReachRequest.model_validate({"capability": "query_order", **fields})


async def estate(registry: MemoryRegistry, agents: int, instances: int) -> None:
    for a in range(agents):
        await registry.register_agent(agent(f"a{a}", "query_order"))
        for n in range(instances):
            await registry.register_instance(tracked(f"a{a}", f"a{a}-{n}", registry.clock))


@pytest.mark.parametrize("session", [False, True])
async def test_a_call_reads_a_bounded_number_of_instances(session: bool) -> None:
    """With 300 agents of 3 instances, a warm call reads at most a few instance maps, not all 900 instances."""
    registry = MemoryRegistry(clock=FakeClock())
    await estate(registry, 300, 3)
    view = CountingView(registry)
    r = Router(view, clock=registry.clock, rng=random.Random(1))  # type: ignore[arg-type]
    r.route(ask(session_id="warm") if session else ask())
    view.reads = 0
    for n in range(100):
        r.route(ask(session_id=f"s{n}") if session else ask())
    assert view.reads <= 100 * 3 * 3  # the pick and one rotating re-check, each reading one agent's 3 instances


async def test_a_recovered_instance_returns_without_time_passing() -> None:
    """A heartbeat bringing an instance back is seen within one rotation of the pool, on a frozen clock."""
    clock = FakeClock()
    registry = MemoryRegistry(clock=clock)
    await estate(registry, 1, 4)
    r = Router(registry, clock=clock, rng=random.Random(2))
    clock.advance(25)
    for n in (1, 2, 3):
        await registry.heartbeat("a0", f"a0-{n}", next(SEQ))
    clock.advance(10)  # a0-0 is now 35 s silent
    assert "a0/a0-0" not in {f"{x.agent.name}/{x.instance.instance_id}" for x in (r.route(ask()) for _ in range(20))}
    await registry.heartbeat("a0", "a0-0", next(SEQ))
    seen = Counter(r.route(ask()).instance.instance_id for _ in range(4 + 8))
    assert seen["a0-0"] >= 1


async def test_an_instance_failing_between_checks_is_never_handed_out() -> None:
    """Breakers opening, statuses turning down and heartbeats stopping are seen on the very next pick."""
    clock = FakeClock()
    registry = MemoryRegistry(clock=clock)
    await estate(registry, 20, 3)
    broken: set[str] = set()
    r = Router(registry, clock=clock, rng=random.Random(3), is_available=lambda _a, i: i not in broken)
    for _ in range(60):
        r.route(ask())
    rng = random.Random(4)
    everyone = [f"a{a}-{n}" for a in range(20) for n in range(3)]
    for _ in range(300):
        broken.add(rng.choice(everyone))
        if len(broken) > 40:
            broken.clear()
        assert r.route(ask()).instance.instance_id not in broken
    for a in range(20):
        for n in range(3):
            await registry.heartbeat(f"a{a}", f"a{a}-{n}", next(SEQ), status="draining" if n else None)
    broken.clear()
    assert {r.route(ask()).instance.instance_id for _ in range(100)} <= {f"a{a}-0" for a in range(20)}
    clock.advance(1_000)
    with pytest.raises(NoHealthyAgent, match="heartbeat missed"):
        r.route(ask())


async def test_load_reported_by_heartbeat_reweighs_without_a_reload() -> None:
    """A new load figure changes the instance's share within one rotation, on a frozen clock."""
    clock = FakeClock()
    registry = MemoryRegistry(clock=clock)
    await estate(registry, 1, 2)
    r = Router(registry, clock=clock, rng=random.Random(5))
    for _ in range(10):
        r.route(ask())
    await registry.heartbeat("a0", "a0-1", next(SEQ), load=0.75)
    for _ in range(10):
        r.route(ask())
    counts = Counter(r.route(ask()).instance.instance_id for _ in range(1_250))
    assert abs(counts["a0-0"] - 1_000) <= 2 and abs(counts["a0-1"] - 250) <= 2


async def test_failover_keeps_the_round_robin_and_skips_the_tried() -> None:
    """With exclusions the router looks in full, never returns a tried instance, and still spreads failovers."""
    registry = MemoryRegistry(clock=FakeClock())
    await estate(registry, 1, 4)
    r = Router(registry, clock=registry.clock, rng=random.Random(6))
    tried = {("a0", "a0-0")}
    chosen = Counter(r.route(ask(), exclude=tried).instance.instance_id for _ in range(30))
    assert set(chosen) == {"a0-1", "a0-2", "a0-3"} and all(count == 10 for count in chosen.values())


def test_refresh_must_be_positive() -> None:
    """A non-positive refresh period is a ConfigError naming the option."""
    with pytest.raises(ConfigError, match="refresh"):
        Router(MemoryRegistry(), refresh=0)


async def test_a_full_look_only_when_the_rotation_fell_behind() -> None:
    """Past ``refresh``, a pool that skipped an instance that heals with time (an open breaker) is kept by a busy
    router whose rotation re-checked every entry, and looked at in full by an idle one; the healed instance
    comes back."""
    clock = FakeClock()
    registry = MemoryRegistry(clock=clock)
    await estate(registry, 2, 3)
    view = CountingView(registry)
    open_breakers = {("a0", "a0-0")}
    r = Router(
        view,  # type: ignore[arg-type]
        clock=clock,
        rng=random.Random(7),
        refresh=1.0,
        is_available=lambda agent, instance: (agent, instance) not in open_breakers,
    )
    for _ in range(10):  # more calls than the 6 entries: the rotation went all the way round
        r.route(ask())
    clock.advance(1.5)
    view.reads = 0
    r.route(ask())
    assert view.reads <= 2 * 3
    open_breakers.clear()  # the breaker closes with time alone: nothing is pushed
    clock.advance(1.5)  # one call in the period: the rotation saw one entry of six
    view.reads = 0
    r.route(ask())
    assert view.reads >= 2 * 3 + 3
    assert "a0-0" in {r.route(ask()).instance.instance_id for _ in range(12)}


async def test_an_idle_caller_keeps_its_pool_until_a_health_change_is_pushed() -> None:
    """With every instance usable, a caller making one call per ``refresh`` or slower never looks in full; a
    pushed change (a heartbeat reporting ``draining``, an instance back up) makes the next call look once."""
    clock = FakeClock()
    registry = MemoryRegistry(clock=clock)
    await estate(registry, 100, 3)
    view = CountingView(registry)
    r = Router(view, clock=clock, rng=random.Random(8), refresh=1.0)  # type: ignore[arg-type]
    r.route(ask())
    for _ in range(10):
        clock.advance(2.0)
        view.reads = 0
        r.route(ask())
        assert view.reads <= 2 * 3  # the pick and one rotating re-check
    await registry.heartbeat("a5", "a5-1", next(SEQ), status="draining")
    view.reads = 0
    r.route(ask())
    assert view.reads >= 100 * 3
    assert all(r.route(ask()).instance.instance_id != "a5-1" for _ in range(600))
    view.reads = 0
    r.route(ask())
    assert view.reads <= 2 * 3  # draining is pushed back when it ends: no time-based look meanwhile
