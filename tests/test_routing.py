"""The capability router, rule by rule, through Router.route / candidates / release."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Collection
from typing import Any

import pytest
from registry_conformance import FakeClock, agent, tracked

from reach_plugins.config.loader import TenantConfig
from reach_plugins.errors import CircuitOpen, ConfigError, NoHealthyAgent, PermissionDenied, UnknownCapability
from reach_plugins.model import AgentDescriptor, Capability, Instance, ReachRequest
from reach_plugins.registry import MemoryRegistry
from reach_plugins.routing import Route, Router, TenantLike
from reach_plugins.routing.pinning import TargetedRouter
from reach_plugins.routing.router import MAX_RECORDED
from reach_plugins.stores.sessions import session_key
from reach_plugins.wire.headers import PREFER, TARGET


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry(clock: FakeClock) -> MemoryRegistry:
    return MemoryRegistry(clock=clock)


def router(registry: MemoryRegistry, **options: Any) -> Router:
    return Router(registry, clock=registry.clock, rng=random.Random(7), **options)


def ask(capability: str = "query_order", **fields: object) -> ReachRequest:
    return ReachRequest.model_validate({"capability": capability, **fields})


def picks(r: Router, request: ReachRequest, times: int) -> Counter[str]:
    """How often each ``agent/instance`` was chosen."""
    return Counter(f"{x.agent.name}/{x.instance.instance_id}" for x in (r.route(request) for _ in range(times)))


async def live(registry: MemoryRegistry, name: str, ids: list[str], **fields: Any) -> None:
    """Register agent ``name`` with heartbeat-tracked instances ``ids``, heard from just now."""
    await registry.register_agent(agent(name, "query_order", **fields))
    for instance_id in ids:
        await registry.register_instance(tracked(name, instance_id, registry.clock))


SEQ = itertools.count(1)


async def beat(registry: MemoryRegistry, name: str, instance_id: str, **fields: Any) -> None:
    """Send a heartbeat (with a fresh sequence number) for one instance."""
    await registry.heartbeat(name, instance_id, next(SEQ), **fields)


def test_unknown_capability_names_the_closest(registry: MemoryRegistry) -> None:
    """A capability nobody offers raises UnknownCapability listing similar known names."""
    registry.put_agent(agent("orders", "query_order", "cancel_order", endpoints=1))
    with pytest.raises(UnknownCapability) as caught:
        router(registry).route(ask("query_ordr"))
    assert caught.value.known[0] == "query_order"
    assert "closest known: query_order" in str(caught.value)


def test_index_follows_registry_changes(registry: MemoryRegistry) -> None:
    """An agent registered after the router was built is routable (a full Route); a removed one is not."""
    r = router(registry)
    registry.put_agent(agent("orders", "query_order", endpoints=1))
    route = r.route(ask())
    assert isinstance(route, Route) and route.agent.name == "orders"
    assert route.instance.endpoint == "http://orders.test:8000" == route.decision.endpoint
    assert route.capability == route.agent.capability("query_order")
    registry.delete_agent("orders")
    with pytest.raises(UnknownCapability):
        r.route(ask())


def test_intent_keeps_agents_listing_it_or_none(registry: MemoryRegistry) -> None:
    """With an intent, agents whose intents lack it are out (NoHealthyAgent says why); agents with none stay in."""
    registry.put_agent(agent("refunds", "query_order", endpoints=1, intents=["refund"]))
    registry.put_agent(agent("tracking", "query_order", endpoints=1, intents=["track"]))
    registry.put_agent(agent("general", "query_order", endpoints=1, routing={"priority": 2}))
    r = router(registry)
    assert {r.route(ask(intent="refund")).agent.name for _ in range(4)} == {"refunds"}
    assert {r.route(ask(intent="other")).agent.name for _ in range(4)} == {"general"}
    registry.delete_agent("general")
    with pytest.raises(NoHealthyAgent) as caught:
        r.route(ask(intent="other"))
    assert caught.value.reasons == {
        "refunds/*": "intent 'other' not among ['refund']",
        "tracking/*": "intent 'other' not among ['track']",
    }


def test_scope_tags_are_a_hard_filter(registry: MemoryRegistry) -> None:
    """Only capabilities carrying every requested scope tag qualify."""
    finance = Capability(name="query_order", scope_tags=["finance", "eu"])
    registry.put_agent(AgentDescriptor(name="fin", endpoints=["http://fin.test"], capabilities=[finance]))
    registry.put_agent(agent("plain", "query_order", endpoints=1))
    r = router(registry)
    assert {r.route(ask(scope_tags=["finance"])).agent.name for _ in range(4)} == {"fin"}
    with pytest.raises(NoHealthyAgent) as caught:
        r.route(ask(scope_tags=["finance", "us"]))
    assert caught.value.reasons["fin/*"] == "capability lacks scope tags ['us']"


def tenants(**allow: list[str] | str) -> dict[str, TenantLike]:
    return {name: TenantConfig(agents=agents) for name, agents in allow.items()}


def test_tenant_allow_list_narrows_the_choice(registry: MemoryRegistry) -> None:
    """A tenant reaches only admitted agents; when the only fitting ones are not, it is PermissionDenied."""
    registry.put_agent(agent("orders", "query_order", endpoints=1))
    registry.put_agent(agent("orders-b", "query_order", endpoints=1, intents=["refund"]))
    r = router(registry, tenants=tenants(demo=["orders-b"]))
    assert {r.route(ask(tenant="demo")).agent.name for _ in range(4)} == {"orders-b"}
    with pytest.raises(PermissionDenied, match="orders: not in tenant 'demo'"):
        r.route(ask(tenant="demo", intent="track"))


@pytest.mark.parametrize("tenant", ["stranger", None])
def test_tenant_outside_the_table_is_denied(registry: MemoryRegistry, tenant: str | None) -> None:
    """With a tenant table, an unknown or missing tenant gets PermissionDenied naming tenant and capability."""
    registry.put_agent(agent("orders", "query_order", endpoints=1))
    with pytest.raises(PermissionDenied, match=rf"tenant {tenant!r} may not reach capability 'query_order'"):
        router(registry, tenants=tenants(demo="*")).route(ask(tenant=tenant))


def test_agent_tenant_list_is_enforced(registry: MemoryRegistry) -> None:
    """An agent's own tenants list refuses other tenants even without a tenant table."""
    registry.put_agent(agent("orders", "query_order", endpoints=1, tenants=["acme"]))
    r = router(registry)
    assert r.route(ask(tenant="acme")).agent.name == "orders"
    with pytest.raises(PermissionDenied, match="admits only tenants"):
        r.route(ask(tenant="demo"))


def test_internal_only_needs_an_explicit_grant(registry: MemoryRegistry) -> None:
    """internal_only agents are reached by tenants naming them or named in the agent's list, never via '*'."""
    registry.put_agent(agent("ledger", "query_order", endpoints=1, internal_only=True))
    registry.put_agent(agent("vault", "read_vault", endpoints=1, internal_only=True, tenants=["wide"]))
    r = router(registry, tenants=tenants(ops=["ledger"], wide="*"))
    assert r.route(ask(tenant="ops")).agent.name == "ledger"
    assert r.route(ask("read_vault", tenant="wide")).agent.name == "vault"
    with pytest.raises(PermissionDenied, match="internal_only"):
        r.route(ask(tenant="wide"))
    with pytest.raises(PermissionDenied, match="not in tenant 'ops'"):
        r.route(ask("read_vault", tenant="ops"))


async def test_missed_heartbeats_leave_routing_and_come_back(registry: MemoryRegistry, clock: FakeClock) -> None:
    """An instance silent past 3 intervals is skipped with the age of its last heartbeat; a heartbeat restores it."""
    await live(registry, "orders", ["o-1", "o-2"])
    r = router(registry)
    clock.advance(20)
    await beat(registry, "orders", "o-2")
    clock.advance(15)
    route = r.route(ask())
    assert route.instance.instance_id == "o-2"
    skipped = {c.instance: c.skipped for c in route.decision.candidates if c.skipped}
    assert skipped == {"o-1": "heartbeat missed: last one 35s ago"}
    await beat(registry, "orders", "o-1")
    assert set(picks(r, ask(), 4)) == {"orders/o-1", "orders/o-2"}


async def test_nobody_healthy_says_why_for_each(registry: MemoryRegistry, clock: FakeClock) -> None:
    """NoHealthyAgent carries a reason per agent/instance."""
    await live(registry, "orders", ["o-1"])
    registry.put_agent(agent("empty", "query_order"))
    draining = Instance(agent="orders", instance_id="o-2", endpoint="http://127.0.0.1:1", status="draining")
    await registry.register_instance(draining)
    clock.advance(100)
    with pytest.raises(NoHealthyAgent) as caught:
        router(registry).route(ask())
    assert not isinstance(caught.value, CircuitOpen)
    assert caught.value.reasons == {
        "orders/o-1": "heartbeat missed: last one 100s ago",
        "orders/o-2": "draining",
        "empty/*": "no instances registered",
    }


def test_down_and_draining_take_no_new_work(registry: MemoryRegistry) -> None:
    """Instances with status down or draining are skipped for requests without a pinned session."""
    statuses = {"up": "ready", "dn": "down", "dr": "draining"}
    static = [Instance(agent="orders", instance_id=i, endpoint=f"http://{i}", status=st) for i, st in statuses.items()]
    registry.put_agent(agent("orders", "query_order", instances=static))
    r = router(registry)
    assert set(picks(r, ask(), 6)) == {"orders/up"}
    assert r.route(ask(session_id="fresh")).instance.instance_id == "up"


def test_open_breakers_are_skipped(registry: MemoryRegistry) -> None:
    """The is_available hook removes instances whose breaker is open; all open is CircuitOpen."""
    registry.put_agent(agent("orders", "query_order", endpoints=3))
    open_breakers = {"orders-1"}
    r = router(registry, is_available=lambda agent, instance: instance not in open_breakers)
    assert set(picks(r, ask(), 9)) == {"orders/orders-0", "orders/orders-2"}
    open_breakers |= {"orders-0", "orders-2"}
    with pytest.raises(CircuitOpen) as caught:
        r.route(ask())
    assert set(caught.value.reasons.values()) == {"circuit open"}


def test_exclude_avoids_instances(registry: MemoryRegistry) -> None:
    """Excluded (agent, instance) pairs are skipped; excluding all raises NoHealthyAgent saying 'excluded'."""
    registry.put_agent(agent("orders", "query_order", endpoints=2))
    r = router(registry)
    for _ in range(4):
        assert r.route(ask(), exclude={("orders", "orders-0")}).instance.instance_id == "orders-1"
    with pytest.raises(NoHealthyAgent) as caught:
        r.route(ask(), exclude=[("orders", "orders-0"), ("orders", "orders-1")])
    assert set(caught.value.reasons.values()) == {"excluded"}


def test_weight_zero_takes_no_traffic(registry: MemoryRegistry) -> None:
    """An agent with routing weight 0 is never chosen."""
    registry.put_agent(agent("orders", "query_order", endpoints=1))
    registry.put_agent(agent("parked", "query_order", endpoints=1, routing={"weight": 0}))
    assert set(picks(router(registry), ask(), 6)) == {"orders/orders-0"}


async def test_best_priority_tier_wins_while_healthy(registry: MemoryRegistry, clock: FakeClock) -> None:
    """Priority 1 takes all traffic while it has a healthy instance; priority 2 takes over when it has none."""
    await live(registry, "primary", ["p-1"], routing={"priority": 1})
    registry.put_agent(agent("backup", "query_order", endpoints=1, routing={"priority": 2, "weight": 1000}))
    r = router(registry)
    assert set(picks(r, ask(), 6)) == {"primary/p-1"}
    clock.advance(31)
    route = r.route(ask())
    assert route.agent.name == "backup"
    assert "priority tier 2" in route.decision.reason


def test_weights_split_traffic_exactly(registry: MemoryRegistry) -> None:
    """Smooth weighted round robin gives each agent its weight's share of picks."""
    registry.put_agent(agent("big", "query_order", endpoints=1, routing={"weight": 300}))
    registry.put_agent(agent("small", "query_order", endpoints=1, routing={"weight": 100}))
    counts = picks(router(registry), ask(), 400)
    assert abs(counts["big/big-0"] - 300) <= 2 and abs(counts["small/small-0"] - 100) <= 2


async def test_load_scales_weights_but_never_to_zero(registry: MemoryRegistry, clock: FakeClock) -> None:
    """An instance at load 0.75 gets a quarter of an idle one's share; a fully loaded one still gets some."""
    await live(registry, "orders", ["idle", "busy", "full"])
    for instance_id, load in (("busy", 0.75), ("full", 1.0)):
        await beat(registry, "orders", instance_id, load=load)
    counts = picks(router(registry), ask(), 1260)
    assert abs(counts["orders/idle"] - 1000) <= 3
    assert abs(counts["orders/busy"] - 250) <= 3
    assert 5 <= counts["orders/full"] <= 15


def test_session_stays_on_its_instance(registry: MemoryRegistry) -> None:
    """The first request of a session is placed by rendezvous hashing, the following ones are pinned."""
    registry.put_agent(agent("orders", "query_order", endpoints=5))
    r = router(registry)
    first = r.route(ask(session_id="conv-1"))
    assert first.decision.affinity == "new"
    following = [r.route(ask(session_id="conv-1")) for _ in range(5)]
    assert {route.instance.instance_id for route in following} == {first.instance.instance_id}
    assert {route.decision.affinity for route in following} == {"pinned"}


async def test_pinned_session_survives_draining(registry: MemoryRegistry, clock: FakeClock) -> None:
    """A draining instance keeps serving the sessions already pinned to it, but takes no new one."""
    await live(registry, "orders", ["o-1"])
    r = router(registry)
    assert r.route(ask(session_id="old")).instance.instance_id == "o-1"
    await registry.register_instance(tracked("orders", "o-2", clock))
    await beat(registry, "orders", "o-1", status="draining")
    assert r.route(ask(session_id="old")).decision.affinity == "pinned"
    assert {r.route(ask(session_id=f"new-{i}")).instance.instance_id for i in range(10)} == {"o-2"}


@pytest.mark.parametrize("failure", ["heartbeat", "breaker", "exclude"])
async def test_gone_pinned_instance_restores_on_another(
    registry: MemoryRegistry, clock: FakeClock, failure: str
) -> None:
    """When the pinned instance is gone, another instance of the same agent serves it with context_restore."""
    await live(registry, "orders", ["o-1", "o-2", "o-3"])
    broken: set[str] = set()
    r = router(registry, is_available=lambda agent, instance: instance not in broken)
    pinned = r.route(ask(session_id="conv")).instance.instance_id
    exclude: set[tuple[str, str]] = set()
    if failure == "heartbeat":
        clock.advance(31)
        for other in {"o-1", "o-2", "o-3"} - {pinned}:
            await beat(registry, "orders", other)
    elif failure == "breaker":
        broken.add(pinned)
    else:
        exclude.add(("orders", pinned))
    restored = r.route(ask(session_id="conv"), exclude=exclude)
    assert restored.instance.instance_id != pinned
    assert (restored.decision.affinity, restored.decision.context_restore) == ("restored", True)
    assert not restored.decision.degraded
    again = r.route(ask(session_id="conv"), exclude=exclude)
    assert (again.instance.instance_id, again.decision.affinity) == (restored.instance.instance_id, "pinned")


async def test_gone_agent_degrades_to_another_agent(registry: MemoryRegistry, clock: FakeClock) -> None:
    """When no instance of the pinned agent is left, another agent with the capability serves it, degraded."""
    await live(registry, "orders", ["o-1"], routing={"priority": 1})
    registry.put_agent(agent("orders-b", "query_order", endpoints=1, routing={"priority": 2}))
    r = router(registry)
    assert r.route(ask(session_id="conv")).agent.name == "orders"
    clock.advance(31)
    moved = r.route(ask(session_id="conv"))
    decision = moved.decision
    assert moved.agent.name == "orders-b" and decision.affinity == "degraded"
    assert decision.degraded and not decision.context_restore
    assert "no usable instance of pinned agent orders" in decision.reason
    await beat(registry, "orders", "o-1")
    assert r.route(ask(session_id="conv")).agent.name == "orders-b"


def test_deregistered_agent_degrades(registry: MemoryRegistry) -> None:
    """A session whose agent was deregistered moves to another agent, marked degraded."""
    registry.put_agent(agent("orders", "query_order", endpoints=1))
    r = router(registry)
    r.route(ask(session_id="conv"))
    registry.delete_agent("orders")
    registry.put_agent(agent("orders-b", "query_order", endpoints=1))
    assert r.route(ask(session_id="conv")).decision.affinity == "degraded"


def test_session_sticks_to_its_agent_across_capabilities(registry: MemoryRegistry) -> None:
    """A session pinned to an agent for one capability uses the same instance for another it offers."""
    for name in ("a", "b", "c"):
        registry.put_agent(agent(name, "query_order", "cancel_order", endpoints=3))
    r = router(registry)
    first = r.route(ask(session_id="conv"))
    second = r.route(ask("cancel_order", session_id="conv"))
    assert (second.agent.name, second.instance.instance_id) == (first.agent.name, first.instance.instance_id)
    assert second.decision.affinity == "pinned"


def test_release_forgets_the_session(registry: MemoryRegistry) -> None:
    """After release() the session is placed afresh; releasing twice reports nothing to forget."""
    registry.put_agent(agent("orders", "query_order", endpoints=3))
    r = router(registry)
    r.route(ask(session_id="conv"))
    assert r.release(session_key(None, "conv")) is True
    assert r.forget(session_key(None, "conv")) is False
    assert r.route(ask(session_id="conv")).decision.affinity == "new"
    assert len(r.sessions) == 1


def test_session_table_is_bounded(registry: MemoryRegistry) -> None:
    """Beyond max_sessions the least recently used session is forgotten; a bounded_load under 1 is refused."""
    registry.put_agent(agent("orders", "query_order", endpoints=1))
    r = router(registry, max_sessions=2)
    for session in ("s1", "s2", "s1", "s3"):
        r.route(ask(session_id=session))
    assert len(r.sessions) == 2
    assert dict(r.sessions.active) == {("orders", "orders-0"): 2}
    assert r.route(ask(session_id="s2")).decision.affinity == "new"
    assert r.route(ask(session_id="s1")).decision.affinity == "new"
    with pytest.raises(ConfigError, match="bounded_load"):
        router(registry, bounded_load=0.9)


def test_decision_records_candidates_skips_and_timing(registry: MemoryRegistry) -> None:
    """The decision lists scored and skipped candidates (at most 16), the pick, the reason and the time."""
    registry.put_agent(agent("orders", "query_order", endpoints=3, routing={"weight": 50}))
    route = router(registry, is_available=lambda agent, instance: instance != "orders-2").route(ask())
    decision = route.decision
    assert (decision.agent, decision.instance) == ("orders", route.instance.instance_id)
    scored = {c.instance: c.score for c in decision.candidates if c.skipped is None}
    assert scored == {"orders-0": 50.0, "orders-1": 50.0}
    assert [(c.instance, c.skipped) for c in decision.candidates if c.skipped] == [("orders-2", "circuit open")]
    assert decision.reason == "smooth weighted round robin over 2 healthy instance(s) in priority tier 1"
    assert decision.elapsed_us > 0
    for i in range(10):
        registry.put_agent(agent(f"more-{i}", "query_order", endpoints=3))
    assert len(router(registry).route(ask()).decision.candidates) == MAX_RECORDED == 16
    assert len(router(registry).route(ask(session_id="s")).decision.candidates) == MAX_RECORDED


def test_candidates_lists_every_healthy_instance_best_first(registry: MemoryRegistry) -> None:
    """candidates() orders tiers by priority and instances by weight, honours limit, pins nothing, raises like route."""
    registry.put_agent(agent("light", "query_order", endpoints=1, routing={"weight": 10}))
    registry.put_agent(agent("heavy", "query_order", endpoints=1, routing={"weight": 90}))
    registry.put_agent(agent("backup", "query_order", endpoints=1, routing={"priority": 2}))
    tripped: set[str] = set()
    r = router(registry, is_available=lambda agent, instance: agent not in tripped)
    listed = r.candidates(ask())
    assert [route.agent.name for route in listed] == ["heavy", "light", "backup"]
    assert [route.agent.name for route in r.candidates(ask(), limit=2)] == ["heavy", "light"]
    with_session = r.candidates(ask(session_id="conv"))
    assert [route.agent.name for route in with_session][-1] == "backup"
    assert len(r.sessions) == 0
    tripped.update({"light", "heavy", "backup"})
    with pytest.raises(CircuitOpen):
        r.candidates(ask())


async def test_pinned_answers_exactly_for_the_candidates(registry: MemoryRegistry) -> None:
    """Router.pinned (O(1)) finds an instance iff candidates() lists it: health, breaker, tenant, weight, exclude."""
    await live(registry, "orders", ["o-0", "o-1", "o-2"])
    await live(registry, "spare", ["s-0"], tenants=["acme"])
    await live(registry, "idle", ["i-0"], routing={"weight": 0})
    await beat(registry, "orders", "o-1", status="draining")
    broken = {"o-2"}
    r = router(registry, is_available=lambda agent, instance: instance not in broken)
    pairs = [("orders", f"o-{n}") for n in range(3)] + [("spare", "s-0"), ("idle", "i-0"), ("orders", "nope")]
    for tenant in (None, "acme"):
        for exclude in ((), (("orders", "o-0"),)):
            request = ask(tenant=tenant)
            listed = {(route.agent.name, route.instance.instance_id) for route in r.candidates(request)}
            listed -= set(exclude)
            found = {pair for pair in pairs if r.pinned(request, *pair, exclude=exclude) is not None}
            assert found == listed, (tenant, exclude)
    route = r.pinned(ask(), "orders", "o-0")
    assert route is not None and route.decision.reason == "pinned by the caller to orders/o-0"


async def test_the_route_decision_is_built_only_when_read(registry: MemoryRegistry) -> None:
    """A route is explained lazily, once, with what was true when it was routed (elapsed, candidates, affinity)."""
    await live(registry, "orders", ["o-0", "o-1"])
    r = router(registry)
    route = r.route(ask(session_id="conv"))
    assert route.affinity == "new"
    await beat(registry, "orders", route.instance.instance_id, status="down")
    decision = route.decision
    assert decision is route.decision
    assert decision.affinity == "new" and decision.instance == route.instance.instance_id
    assert {c.instance for c in decision.candidates} == {"o-0", "o-1"}
    assert "rendezvous hash over 2 instance(s)" in decision.reason and decision.elapsed_us > 0


def test_a_route_needs_one_explanation() -> None:
    """A Route is given a built decision or a way to build one, not both and not neither."""
    plain = agent("orders", "query_order")
    inst = tracked("orders", "o-0", lambda: 0.0)
    with pytest.raises(ConfigError, match="exactly one of decision="):
        Route(plain, inst, plain.capabilities[0])


class ListingOnly:
    """A router that can only list its candidates (no ``pinned``, like a wrapping rule): TargetedRouter scans them."""

    def __init__(self, inner: Router) -> None:
        self.inner = inner

    def route(self, request: ReachRequest, *, exclude: Collection[tuple[str, str]] = ()) -> Route:
        return self.inner.route(request, exclude=exclude)

    def candidates(self, request: ReachRequest, *, limit: int | None = None) -> list[Route]:
        return self.inner.candidates(request, limit=limit)


async def test_caller_pins_agree_with_and_without_the_o1_check(registry: MemoryRegistry) -> None:
    """TargetedRouter serves the same pins (target, prefer, excluded, unhealthy) whether it asks pinned() or scans."""
    await live(registry, "orders", ["o-0", "o-1"])
    await beat(registry, "orders", "o-1", status="down")
    inner = router(registry)
    fast, scanning = TargetedRouter(inner), TargetedRouter(ListingOnly(inner))
    for key in (TARGET, PREFER):
        for wanted in ("orders/o-0", "orders/o-1", "orders/nope"):
            for exclude in ((), (("orders", "o-0"),)):
                request = ask(metadata={key: wanted})
                answers = []
                for targeted in (fast, scanning):
                    try:
                        route = targeted.route(request, exclude=exclude)
                    except NoHealthyAgent as exc:
                        answers.append(type(exc).__name__)
                    else:
                        answers.append(f"{route.instance.instance_id}: {route.decision.reason}")
                assert answers[0] == answers[1], (key, wanted, exclude)
    assert fast.route(ask(metadata={TARGET: "orders/o-0"})).decision.reason == "pinned by the caller to orders/o-0"
