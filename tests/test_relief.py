"""Hot-spot relief (seed 001, 4.2, fault 3): an instance hot for 30 s gives a share of its idle conversations back."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest
from registry_conformance import FakeClock

from reach_plugins import ReachClient
from reach_plugins.config.loader import parse_config
from reach_plugins.errors import ConfigError
from reach_plugins.model import AgentDescriptor, Instance, ReachRequest
from reach_plugins.registry import MemoryRegistry
from reach_plugins.routing import Router
from reach_plugins.routing.relief import ReliefPolicy, ReliefTracker
from reach_plugins.server.build import build_forwarder
from reach_plugins.stores.sessions import session_key
from reach_plugins.testing.clock import FakeClock as CoreClock
from reach_plugins.transport import Call, MockTransport

HOT = ("chat", "c1")
SEQ = itertools.count(1)
CAPACITY = 60
"""Conversations an instance holds at load 1.0 in the simulation."""
CONVERSATIONS = 160
INSTANCES = 4


def key(n: int) -> Any:
    return session_key(None, f"user-{n}-prod")


def test_only_idle_conversations_of_an_instance_hot_for_hold_are_marked() -> None:
    """Hot for less than ``hold``: nothing; then ``ceil(share * idle)``; mid-call and recently active ones never."""
    relief = ReliefTracker(ReliefPolicy())
    for n in range(10):
        relief.turn_started(key(n), HOT)
        if n != 0:  # conversation 0 stays mid-call
            relief.turn_ended(key(n), 0.0 if n < 9 else 50.0)  # conversation 9 spoke at t=50
    assert relief.relieve({HOT: 0.9}, 60.0) == []  # hot since 60
    assert relief.relieve({HOT: 0.9}, 89.0) == []  # 29 s: not yet
    marked = relief.relieve({HOT: 0.9}, 90.0)
    assert len(marked) == 2  # ceil(0.25 * 8 idle): 1..8
    assert key(0) not in marked and key(9) not in marked
    assert relief.relieve({HOT: 0.9}, 100.0) == []  # another hold first
    assert all(relief.take(k, HOT) is not None for k in marked)
    assert relief.take(marked[0], HOT) is None  # consumed


def test_a_cooled_instance_starts_its_hold_again() -> None:
    """Dropping below the threshold resets the hold: 20 s hot, cool, 20 s hot is not 30 s."""
    relief = ReliefTracker(ReliefPolicy(idle=0.0))
    relief.turn_started(key(1), HOT)
    relief.turn_ended(key(1), 0.0)
    relief.relieve({HOT: 0.9}, 0.0)
    relief.relieve({HOT: 0.5}, 20.0)
    relief.relieve({HOT: 0.9}, 21.0)
    assert relief.relieve({HOT: 0.9}, 41.0) == []
    assert relief.relieve({HOT: 0.9}, 51.0) == [key(1)]


def test_a_mark_is_not_taken_mid_call_or_from_elsewhere() -> None:
    """A marked conversation that started a turn meanwhile, or moved already, stays where it is."""
    relief = ReliefTracker(ReliefPolicy(hold=0.0, idle=0.0, share=1.0))
    for n in (1, 2):
        relief.turn_started(key(n), HOT)
        relief.turn_ended(key(n), 0.0)
    assert len(relief.relieve({HOT: 0.9}, 1.0)) == 2
    relief.turn_started(key(1), HOT)
    assert relief.take(key(1), HOT) is None
    assert relief.take(key(2), ("chat", "c2")) is None


@pytest.mark.parametrize(
    ("field", "value"), [("threshold", 0.0), ("threshold", 1.5), ("share", 0.0), ("hold", -1.0), ("idle", -1.0)]
)
def test_bad_policies_say_what_to_fix(field: str, value: float) -> None:
    """Out-of-range settings are refused naming the setting; in a config file, as a ConfigError at its path."""
    with pytest.raises(ValueError, match=field):
        ReliefPolicy.model_validate({field: value})
    with pytest.raises(ConfigError, match=rf"relief\.{field}"):
        parse_config({"agents": [], "relief": {field: value}})


def test_the_config_sections_reach_the_gateway_forwarder(tmp_path: Path) -> None:
    """``loops:`` and ``relief:`` in a server's config file are what its forwarder's pipeline and router run with."""
    config = tmp_path / "agents.yaml"
    config.write_text("agents: []\nloops: {window: 60s, on_loop: shed}\nrelief: {hold: 10s, share: 0.5}\n")
    forwarder, _ = build_forwarder(config, allow_open=True)
    assert forwarder.router.relief is not None and forwarder.router.relief.policy.hold == 10.0
    assert forwarder.pipeline.loops.rates is not None and forwarder.pipeline.loops.rates.settings.window == 60.0
    config.write_text("agents: []\nrelief: {enabled: false}\n")
    assert build_forwarder(config, allow_open=True)[0].router.relief is None


def instance(instance_id: str, clock: FakeClock, load: float = 0.0) -> Instance:
    port = 9000 + int(instance_id[1:])
    return Instance(
        agent="chat", instance_id=instance_id, endpoint=f"http://127.0.0.1:{port}", last_heartbeat=clock(), load=load
    )


async def chat_registry(clock: FakeClock) -> MemoryRegistry:
    registry = MemoryRegistry(clock=clock)
    await registry.register_agent(AgentDescriptor.model_validate({"name": "chat", "capabilities": ["talk"]}))
    await registry.register_instance(instance("c1", clock))
    return registry


def spread(counts: list[int]) -> float:
    """max / mean of the conversations held per instance."""
    return max(counts) / (sum(counts) / len(counts))


async def test_skewed_sessions_spread_back_within_the_bounded_load(capsys: pytest.CaptureFixture[str]) -> None:
    """160 ``-prod`` conversations pinned on c1 while it was alone; peers join; relief brings max/mean under 1.25."""
    clock = FakeClock()
    registry = await chat_registry(clock)
    router = Router(registry, clock=clock, rng=random.Random(7))
    relief = router.relief
    assert relief is not None

    def turn(n: int) -> str:
        route = router.route(ReachRequest(capability="talk", session_id=f"user-{n}-prod"), exclude=())
        where = (route.agent.name, route.instance.instance_id)
        relief.turn_started(key(n), where)
        relief.turn_ended(key(n), clock())
        return route.decision.relieved_from or ""

    assert {turn(n) for n in range(CONVERSATIONS)} == {""}
    for n in range(2, INSTANCES + 1):
        await registry.register_instance(instance(f"c{n}", clock))
    relief.turn_started(key(0), HOT)  # conversation 0 is mid-call from here on

    def held() -> list[int]:
        return [router.sessions.active.get(("chat", f"c{n}"), 0) for n in range(1, INSTANCES + 1)]

    before = spread(held())
    moved: list[str] = []
    for step in range(180):  # 15 minutes in 5 s steps; each conversation speaks every 2 minutes
        clock.advance(5.0)
        for n, count in enumerate(held(), start=1):
            await registry.heartbeat("chat", f"c{n}", next(SEQ), load=min(1.0, count / CAPACITY))
        moved += [turn(n) for n in range(1, CONVERSATIONS) if (n + step) % 24 == 0]
    after = spread(held())
    print(f"relief: conversations per instance {held()}, max/mean {before:.2f} -> {after:.2f}")
    assert before == 4.0
    assert after <= router._hrw.bounded_load  # back within the bounded-load bound (1.25)
    assert held()[0] / CAPACITY < ReliefPolicy().threshold
    assert router.sessions.get(key(0)) is not None and router.sessions.get(key(0)).instances == {"chat": "c1"}  # type: ignore[union-attr]
    assert {m for m in moved if m} == {"chat/c1"} and relief.moved == sum(1 for m in moved if m)


async def test_relief_through_the_client_reports_context_restore_and_the_source() -> None:
    """Through ReachClient: a relieved conversation's next reply says context_restore, its trace names c1."""
    clock = CoreClock(1_000.0)
    registry = await chat_registry(clock)  # type: ignore[arg-type]

    def answer(call: Call) -> dict[str, Any]:
        return {"by": call.instance.instance_id}

    async with ReachClient(registry, MockTransport(answer), clock=clock, tokens=False) as client:
        for n in range(8):
            assert (await client.reach("talk", session_id=f"s-{n}")).instance == "c1"
        await registry.register_instance(instance("c2", clock))  # type: ignore[arg-type]
        clock.advance(61.0)
        await registry.heartbeat("chat", "c1", next(SEQ), load=0.95)
        await registry.heartbeat("chat", "c2", next(SEQ), load=0.1)
        await client.reach("talk", session_id="s-0")  # c1 is seen hot from now
        clock.advance(31.0)
        await registry.heartbeat("chat", "c1", next(SEQ), load=0.95)
        await registry.heartbeat("chat", "c2", next(SEQ), load=0.1)
        replies = [await client.reach("talk", session_id=f"s-{n}", trace=True) for n in range(8)]
    relieved = [r for r in replies if r.trace and r.trace.route and r.trace.route.relieved_from]
    assert len(relieved) == 2  # ceil(0.25 * 7 idle); s-0 spoke 31 s ago
    for reply in relieved:
        assert reply.context_restore and reply.instance == "c2"
        assert reply.trace is not None and reply.trace.route is not None
        assert reply.trace.route.relieved_from == "chat/c1" and "relieved from chat/c1" in reply.trace.route.reason
    assert all(r.instance == "c1" and not r.context_restore for r in replies if r not in relieved)


def test_followed_conversations_are_bounded_oldest_out() -> None:
    """Past ``max_conversations`` the least recently served goes, and is no longer a candidate."""
    relief = ReliefTracker(ReliefPolicy(hold=0.0, idle=0.0, share=1.0), max_conversations=3)
    for n in range(5):
        relief.turn_started(key(n), HOT)
        relief.turn_ended(key(n), 0.0)
    assert sorted(map(str, relief.relieve({HOT: 0.9}, 1.0))) == sorted(map(str, [key(2), key(3), key(4)]))
