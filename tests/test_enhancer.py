"""ReachEnhancer without a framework: mapping rules, policies, liveness, approval, hops, spans, errors."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reach_plugins import AgentDescriptor, Capability, ReachClient, ReachEnhancer
from reach_plugins.errors import (
    ApprovalRequired,
    BusinessError,
    ConfigError,
    LoopDetected,
    SessionClosed,
    UnknownCapability,
)
from reach_plugins.frameworks.toolcalls import PendingApproval, ToolCall
from reach_plugins.matching import CapabilityMatcher, LexicalEmbedder, default_embedder
from reach_plugins.model import ErrorInfo, Hop, Instance
from reach_plugins.registry import MemoryRegistry
from reach_plugins.security.context import chain, current_hops, serving
from reach_plugins.stores.budget import DEFAULT_BUDGET
from reach_plugins.stores.sessions import MemorySessions
from reach_plugins.transport import Call, MockTransport, Reply

CATALOGUE = [
    Capability(name="query_order", description="Look up where a customer's order is and its delivery status"),
    Capability(
        name="check_inventory",
        description="How many units of a product are in stock in the warehouse",
        params_schema={"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]},
    ),
    Capability(
        name="refund_order", description="Refund a customer's order payment", danger_level="high", scope_tags=["orders"]
    ),
    Capability(name="track_parcel", description="Track where a parcel is during delivery", scope_tags=["logistics"]),
    Capability(name="find_shipment", description="Track where a parcel is during delivery", scope_tags=["logistics"]),
]
LEXICAL_EMBEDDER = LexicalEmbedder()
LEXICAL = LEXICAL_EMBEDDER.recommended_threshold
"""The lexical embedder's measured threshold, stated as the enhancer's min_similarity."""


def echo(call: Call) -> dict[str, Any]:
    """The agent's answer: who served what, with which payload and hop chain."""
    request = call.request
    return {
        "instance": call.instance.instance_id,
        "capability": request.capability,
        "payload": request.payload,
        "session": request.session_id,
        "hops": [str(hop) for hop in request.hops],
    }


@pytest.fixture
async def registry() -> MemoryRegistry:
    registry = MemoryRegistry()
    await registry.register_agent(
        AgentDescriptor(name="orders", endpoints=["http://orders-a", "http://orders-b"], capabilities=CATALOGUE)
    )
    return registry


@pytest.fixture
def transport() -> MockTransport:
    return MockTransport(echo)


@pytest.fixture
def enhancer(registry: MemoryRegistry, transport: MockTransport) -> Iterator[ReachEnhancer]:
    """An enhancer that opted in to matching by meaning, with the dependency-free lexical embedder (deterministic)."""
    with ReachEnhancer(
        registry=registry,
        transport=transport,
        tenant="demo",
        match="semantic",
        min_similarity=LEXICAL,
        matcher=LEXICAL_EMBEDDER,
    ) as enhancer:
        yield enhancer


# ----------------------------------------------------------------------------- mapping


def test_capability_map_wins_over_the_exact_name(registry: MemoryRegistry, transport: MockTransport) -> None:
    """An explicit capability_map entry decides, even against a capability with the tool's own name."""
    with ReachEnhancer(registry=registry, transport=transport, capability_map={"query_order": "track_parcel"}) as e:
        assert e.resolve("query_order") == "track_parcel"
        assert e.explain("query_order").rule == "map"


def test_capability_map_none_keeps_a_tool_local(registry: MemoryRegistry, transport: MockTransport) -> None:
    """Mapping a tool to None keeps it local although a capability of that name exists."""
    with ReachEnhancer(registry=registry, transport=transport, capability_map={"query_order": None}) as e:
        assert e.resolve("query_order") is None
        assert not e.decide(ToolCall("query_order")).remote


def test_exact_name_then_semantic_match(enhancer: ReachEnhancer) -> None:
    """A tool named like a capability maps to it; another maps by the meaning of its name and description."""
    assert enhancer.explain("queryOrder").rule == "exact"
    assert enhancer.resolve("queryOrder") == "query_order"
    found = enhancer.explain("stock_level", "How many items of a product remain in stock")
    assert (found.capability, found.rule) == ("check_inventory", "semantic")


def test_default_matcher_makes_the_same_decisions(registry: MemoryRegistry, transport: MockTransport) -> None:
    """Opted in at its measured threshold, the default embedder (a sentence model when installed) agrees below."""
    threshold = default_embedder().recommended_threshold
    with ReachEnhancer(registry=registry, transport=transport, match="semantic", min_similarity=threshold) as e:
        assert e.resolve("lookup_order_status", "Look up where an order is") == "query_order"
        assert e.resolve("stock_level", "How many items of a product remain in stock") == "check_inventory"
        assert e.resolve("get_weather", "Current weather for a city") is None
        assert e.explain("parcel_location", "Track where a parcel is during delivery").rule == "ambiguous"


def test_unrelated_tool_maps_to_nothing(enhancer: ReachEnhancer) -> None:
    """A tool that means nothing in the catalogue stays local instead of being routed somewhere."""
    assert enhancer.resolve("get_weather", "Current weather for a city") is None
    assert not enhancer.decide(ToolCall("get_weather", description="Current weather for a city")).remote


def test_ambiguous_match_stays_local_and_warns(enhancer: ReachEnhancer, caplog: pytest.LogCaptureFixture) -> None:
    """Two near-equal capabilities never win silently: the tool stays local and a warning names both."""
    with caplog.at_level(logging.WARNING, logger="reach_plugins.matching"):
        found = enhancer.explain("parcel_location", "Track where a parcel is during delivery")
    assert (found.capability, found.rule) == (None, "ambiguous")
    assert "track_parcel" in caplog.text and "find_shipment" in caplog.text
    assert not enhancer.decide(
        ToolCall("parcel_location", description="Track where a parcel is during delivery")
    ).remote


def test_decisions_are_cached_until_the_registry_changes(registry: MemoryRegistry, transport: MockTransport) -> None:
    """Asking again embeds nothing new; a newly registered agent is found after the revision moves."""
    texts: list[str] = []

    def embed(batch: Sequence[str]) -> list[list[float]]:
        texts.extend(batch)
        return [[float("ship" in text), float("weather" in text), 0.1] for text in batch]

    matcher = CapabilityMatcher((), embedder=embed, threshold=0.9)
    with ReachEnhancer(registry=registry, transport=transport, match="semantic", matcher=matcher) as e:
        assert e.resolve("weather_now", "weather today") is None
        seen = len(texts)
        assert e.resolve("weather_now", "weather today") is None
        assert len(texts) == seen
        weather = Capability(name="forecast_weather", description="weather forecast")
        asyncio.run(registry.register_agent(AgentDescriptor(name="meteo", capabilities=[weather])))
        assert e.resolve("weather_now", "weather today") == "forecast_weather"


def test_by_default_only_the_map_and_exact_names_route(registry: MemoryRegistry, transport: MockTransport) -> None:
    """Without match="semantic" (or with matcher=False) a tool routes by capability_map or its own name only."""
    for options in ({}, {"matcher": False}):
        with ReachEnhancer(registry=registry, transport=transport, **options) as e:
            assert (e.resolve("query_order"), e.resolve("queryOrder")) == ("query_order", "query_order")
            found = e.explain("stock_level", "How many items of a product remain in stock")
            assert (found.capability, found.rule) == (None, "unmapped")
            assert "match='semantic', min_similarity=" in found.detail and "capability_map=" in found.detail


def test_no_proxy_tools_unless_exposed(enhancer: ReachEnhancer) -> None:
    """By default the model sees no capability as a tool: proxy tools are opt-in."""
    assert enhancer.tools() == [] and enhancer.tools(["query_order"]) == []
    assert not enhancer.exposes("check_inventory")


def test_exposed_proxy_tools_cover_only_capabilities_without_a_local_tool(
    registry: MemoryRegistry, transport: MockTransport
) -> None:
    """expose= by name or scope tag offers those capabilities no local tool reaches, with their params_schema."""
    with ReachEnhancer(
        registry=registry,
        transport=transport,
        match="semantic",
        min_similarity=LEXICAL,
        matcher=LEXICAL_EMBEDDER,
        expose=["check_inventory", "logistics"],
    ) as e:
        specs = {spec.name: spec for spec in e.tools([("lookup_order_status", "Look up where an order is")])}
        assert set(specs) == {"check_inventory", "track_parcel", "find_shipment"}
        assert specs["check_inventory"].params_schema["required"] == ["sku"]
        assert specs["track_parcel"].params_schema["type"] == "object"
        assert [spec.name for spec in e.tools(["check_inventory"])] == ["find_shipment", "track_parcel"]


@pytest.mark.parametrize(
    ("expose", "expected"),
    [
        (["orders"], set()),
        (lambda capability: True, {"check_inventory", "find_shipment", "query_order", "track_parcel"}),
        (["refund_order"], {"refund_order"}),
        (["orders", "refund_order"], {"refund_order"}),
    ],
)
def test_a_dangerous_capability_is_exposed_only_by_its_name(
    registry: MemoryRegistry, transport: MockTransport, expose: Any, expected: set[str]
) -> None:
    """danger_level high is never exposed by a scope tag or a predicate, only when named."""
    with ReachEnhancer(registry=registry, transport=transport, matcher=False, expose=expose) as e:
        assert {spec.name for spec in e.tools()} == expected
        assert e.exposes("refund_order") == ("refund_order" in expected)


def test_expose_refuses_a_bare_string(registry: MemoryRegistry) -> None:
    """expose="name" would be read letter by letter: it is refused with the fix."""
    with pytest.raises(ConfigError, match=r"not a string: \['query_order'\]"):
        ReachEnhancer(registry=registry, expose="query_order")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- policies


def test_remote_first_reaches_when_a_provider_exists(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """A mapped tool goes remote; its args become the payload and the conversation the session id."""
    result = enhancer.reach(ToolCall("query_order", {"order_id": "A1"}, call_id="c1", session_key="t-1"))
    assert result.ok and result.data["payload"] == {"order_id": "A1"} and result.data["session"] == "t-1"
    assert result.route is not None and result.route.agent == "orders" and result.route.attempts == 1
    assert [call.request.capability for call in transport.calls] == ["query_order"]


async def test_remote_first_falls_back_to_local_without_a_healthy_agent(
    registry: MemoryRegistry, transport: MockTransport
) -> None:
    """When every instance offering the capability is down, remote_first runs the local tool."""
    for index in (0, 1):
        instance = registry.instances("orders")[f"orders-{index}"]
        await registry.register_instance(instance.model_copy(update={"status": "down"}))
    async with ReachEnhancer(registry=registry, transport=transport) as e:
        decision = e.decide(ToolCall("query_order"))
    assert not decision.remote and decision.capability is not None
    assert "running the local tool" in decision.reason


def test_remote_only_without_provider_answers_an_error(registry: MemoryRegistry, transport: MockTransport) -> None:
    """remote_only never runs a local tool: an unmapped tool gets an error the model can read."""
    with ReachEnhancer(registry=registry, transport=transport, policy="remote_only", matcher=False) as e:
        decision = e.decide(ToolCall("get_weather"))
        result = e.reach(ToolCall("get_weather"), decision)
    assert decision.remote and isinstance(result.error, UnknownCapability)
    assert result.content.startswith("Error: tool 'get_weather'") and transport.calls == []


def test_local_only_never_reaches(registry: MemoryRegistry, transport: MockTransport) -> None:
    """local_only keeps every tool local and offers no proxy tools."""
    with ReachEnhancer(registry=registry, transport=transport, policy="local_only") as e:
        assert not e.decide(ToolCall("query_order")).remote
        assert e.tools() == []


# ----------------------------------------------------------------------------- errors


def test_business_failure_becomes_a_message(registry: MemoryRegistry) -> None:
    """An agent's refusal comes back as a sentence naming the tool and the reason, not an exception."""
    refuse = MockTransport(
        lambda call: Reply(status="fail", error=ErrorInfo(type="business", message="order A9 does not exist"))
    )
    with ReachEnhancer(registry=registry, transport=refuse) as e:
        result = e.reach(ToolCall("query_order", {"order_id": "A9"}))
    assert isinstance(result.error, BusinessError)
    assert "order A9 does not exist" in result.content and "check the arguments" in result.content
    assert result.route is not None and result.route.attempts == 1


def test_on_error_raise_raises_the_reach_error(registry: MemoryRegistry) -> None:
    """on_error='raise' lets the matching ReachError escape instead of returning a message."""
    refuse = MockTransport(lambda call: Reply(status="fail", error=ErrorInfo(type="business", message="no such order")))
    with (
        ReachEnhancer(registry=registry, transport=refuse, on_error="raise") as e,
        pytest.raises(BusinessError, match="no such order"),
    ):
        e.reach(ToolCall("query_order", {"order_id": "A9"}))


@pytest.mark.parametrize(
    ("options", "fix"),
    [
        ({"policy": "remote_last"}, "policy must be one of"),
        ({"on_error": "ignore"}, "on_error must be one of"),
        ({"capability_map": {"lookup": "Query Order"}}, "not a capability name"),
        ({"auto_register": True}, "serve_as"),
        ({"match": "fuzzy"}, "match must be one of"),
        ({"match": "semantic"}, r"needs min_similarity= \(the cosine"),
        ({"min_similarity": 0.5}, "add match='semantic'"),
        ({"matcher": LEXICAL_EMBEDDER}, "add match='semantic'"),
        ({"match": "semantic", "matcher": False}, "drop matcher=False"),
        ({"match": "semantic", "min_similarity": 0.5, "matcher": CapabilityMatcher(())}, "not both"),
        ({"match": "semantic", "min_similarity": 1.5}, r"must be in \[-1, 1\]"),
    ],
)
def test_bad_settings_name_the_fix(options: dict[str, Any], fix: str) -> None:
    """Wrong settings fail at construction with a ConfigError saying what to change."""
    with pytest.raises(ConfigError, match=fix):
        ReachEnhancer(**options)


def test_client_and_client_settings_are_exclusive(enhancer: ReachEnhancer) -> None:
    """Passing a ready client together with a registry is refused."""
    with pytest.raises(ConfigError, match="either client="):
        ReachEnhancer(client=enhancer.client, registry="memory://")


# ----------------------------------------------------------------------------- sessions


def test_closed_session_sends_nothing(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """After close_session, a call of that conversation is refused with SessionClosed and nothing is sent."""
    assert enhancer.reach(ToolCall("query_order", {"order_id": "A1"}, session_key="t-1")).ok
    enhancer.close_session("t-1")
    result = enhancer.reach(ToolCall("query_order", {"order_id": "A2"}, session_key="t-1"))
    assert isinstance(result.error, SessionClosed) and "conversation is closed" in result.content
    assert len(transport.calls) == 1
    assert enhancer.reach(ToolCall("query_order", {"order_id": "A3"}, session_key="t-2")).ok


def test_a_ready_client_brings_its_session_store(registry: MemoryRegistry, transport: MockTransport) -> None:
    """A ready client's own sessions= store is the one the enhancer closes; sessions= beside client= is refused."""
    sessions = MemorySessions(budget=DEFAULT_BUDGET)
    client = ReachClient(registry, transport, sessions=sessions)
    with ReachEnhancer(client=client) as e:
        e.close_session("t-1")
        assert isinstance(e.reach(ToolCall("query_order", session_key="t-1")).error, SessionClosed)
    assert client.sessions is sessions and transport.calls == []
    with pytest.raises(ConfigError, match=r"either client=.*sessions"):
        ReachEnhancer(client=client, sessions=MemorySessions(budget=DEFAULT_BUDGET))
    asyncio.run(client.aclose())


def test_closing_a_session_of_a_client_without_a_store_names_the_fix(
    registry: MemoryRegistry, transport: MockTransport
) -> None:
    """close_session on a ready client built without sessions= raises a ConfigError naming sessions=."""
    client = ReachClient(registry, transport)
    with ReachEnhancer(client=client) as e, pytest.raises(ConfigError, match="sessions="):
        e.close_session("t-1")
    asyncio.run(client.aclose())


def test_expired_session_is_refused(registry: MemoryRegistry, transport: MockTransport) -> None:
    """A conversation silent for longer than the store's TTL is refused like a closed one."""
    now = [1000.0]
    sessions = MemorySessions(budget=DEFAULT_BUDGET, ttl=60, clock=lambda: now[0])
    with ReachEnhancer(registry=registry, transport=transport, sessions=sessions) as e:
        assert e.reach(ToolCall("query_order", session_key="t-1")).ok
        now[0] += 61
        assert isinstance(e.reach(ToolCall("query_order", session_key="t-1")).error, SessionClosed)
    assert len(transport.calls) == 1


async def test_closing_a_session_cancels_its_call_in_flight(registry: MemoryRegistry) -> None:
    """A call waiting on an agent is cancelled when its conversation closes, and the model is told why."""
    started = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def slow(call: Call) -> str:
        loop.call_soon_threadsafe(started.set)
        await asyncio.sleep(3600)
        return "never"

    async with ReachEnhancer(registry=registry, transport=MockTransport(slow)) as e:
        task = asyncio.create_task(e.areach(ToolCall("query_order", session_key="t-9")))
        await started.wait()
        await e.aclose_session("t-9")
        result = await asyncio.wait_for(task, 5)
    assert isinstance(result.error, SessionClosed) and "in flight" in result.error.message


# ----------------------------------------------------------------------------- approval


def test_dangerous_capability_without_approver_is_not_sent(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """danger_level high with no approver: ApprovalRequired, nothing sent."""
    result = enhancer.reach(ToolCall("refund_order", {"order_id": "A1"}))
    assert isinstance(result.error, ApprovalRequired) and "approver" in result.error.message
    assert transport.calls == []


async def test_approver_decides_per_call(registry: MemoryRegistry, transport: MockTransport) -> None:
    """An async approver sees the pending call; a yes sends it, a no sends nothing."""
    seen: list[PendingApproval] = []

    async def approver(pending: PendingApproval) -> bool:
        seen.append(pending)
        return bool(pending.args["order_id"] == "A1")

    async with ReachEnhancer(registry=registry, transport=transport, approver=approver) as e:
        denied = await e.areach(ToolCall("refund_order", {"order_id": "A2"}, call_id="c2"))
        approved = await e.areach(ToolCall("refund_order", {"order_id": "A1"}, call_id="c1"))
    assert isinstance(denied.error, ApprovalRequired) and "not approved" in denied.error.message
    assert approved.ok and [call.request.payload for call in transport.calls] == [{"order_id": "A1"}]
    assert seen[0].describe()["capability"] == "refund_order" and seen[0].describe()["tool_call_id"] == "c2"


def test_low_danger_capability_needs_no_approver(enhancer: ReachEnhancer) -> None:
    """Ordinary capabilities are sent without asking anyone."""
    assert enhancer.reach(ToolCall("check_inventory", {"sku": "S1"})).ok


# ----------------------------------------------------------------------------- hops and the served context


def test_reach_inside_a_served_request_continues_its_chain(enhancer: ReachEnhancer) -> None:
    """A reach made while serving a request carries the incoming chain plus this agent's hop."""
    with serving("front", "answer_customer", hops=["gateway/route_chat"]):
        assert current_hops() == (Hop.parse("gateway/route_chat"), Hop.parse("front/answer_customer"))
        result = enhancer.reach(ToolCall("query_order"))
    assert result.data["hops"] == ["gateway/route_chat", "front/answer_customer"]
    assert current_hops() == ()


def test_reaching_back_into_the_chain_is_a_loop(enhancer: ReachEnhancer, transport: MockTransport) -> None:
    """A call whose target is already in the chain stops with LoopDetected before anything is sent."""
    with serving("coupons", "apply_coupon", hops=["orders/query_order"]):
        result = enhancer.reach(ToolCall("query_order"))
    assert isinstance(result.error, LoopDetected) and "loop back" in result.content
    assert transport.calls == []


def test_chain_does_not_repeat_the_last_hop() -> None:
    """The SDK's incoming header already ends with this hop: it is not appended twice."""
    assert chain(["a/x", "b/y"], "b", "y") == (Hop.parse("a/x"), Hop.parse("b/y"))
    assert chain([], "b", "y") == (Hop.parse("b/y"),)


async def test_blocking_reach_works_inside_a_running_loop(enhancer: ReachEnhancer) -> None:
    """reach() from a coroutine (a sync tool in an async app) runs on the enhancer's own loop."""
    assert enhancer.reach(ToolCall("query_order", {"order_id": "A1"})).ok
    assert (await enhancer.areach(ToolCall("query_order", {"order_id": "A2"}))).ok


# ----------------------------------------------------------------------------- spans


async def test_tool_span_parents_the_client_span(
    registry: MemoryRegistry, transport: MockTransport, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """Each call is an execute_tool span with GenAI attributes, parent of the core's invoke_agent span."""
    provider, exporter = spans
    async with ReachEnhancer(registry=registry, transport=transport, tracer_provider=provider) as e:
        call = ToolCall("lookup", {"order_id": "A1"}, call_id="c7", session_key="t-3")
        await e.areach(call, e.decide(ToolCall("query_order")))
    by_name = {span.name: span for span in exporter.get_finished_spans()}
    tool, client = by_name["execute_tool lookup"], by_name["invoke_agent orders"]
    assert client.parent is not None and client.parent.span_id == tool.context.span_id
    assert tool.attributes is not None
    assert tool.attributes["gen_ai.tool.name"] == "lookup"
    assert tool.attributes["gen_ai.tool.call.id"] == "c7"
    assert tool.attributes["gen_ai.conversation.id"] == "t-3"
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"


async def test_failed_call_marks_its_tool_span(
    registry: MemoryRegistry, transport: MockTransport, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """A refused call leaves an execute_tool span with error status and the error type."""
    provider, exporter = spans
    async with ReachEnhancer(registry=registry, transport=transport, tracer_provider=provider) as e:
        await e.areach(ToolCall("refund_order", {"order_id": "A1"}))
    (tool,) = [span for span in exporter.get_finished_spans() if span.name == "execute_tool refund_order"]
    assert not tool.status.is_ok and tool.attributes is not None
    assert tool.attributes["error.type"] == "ApprovalRequired"


@pytest.fixture
async def two_instances() -> AsyncIterator[MemoryRegistry]:
    registry = MemoryRegistry()
    await registry.register_agent(AgentDescriptor(name="orders", capabilities=CATALOGUE[:1]))
    for name in ("orders-a", "orders-b"):
        await registry.register_instance(Instance(agent="orders", instance_id=name, endpoint=f"http://{name}"))
    yield registry


async def test_one_conversation_stays_on_one_instance(two_instances: MemoryRegistry) -> None:
    """Every call of a conversation lands on the same instance; different conversations spread."""
    transport = MockTransport(echo)
    placed: dict[str, set[str]] = {}
    async with ReachEnhancer(registry=two_instances, transport=transport) as e:
        for turn in range(3):
            for thread in range(8):
                result = await e.areach(ToolCall("query_order", {"turn": turn}, session_key=f"t-{thread}"))
                placed.setdefault(f"t-{thread}", set()).add(result.data["instance"])
    assert all(len(instances) == 1 for instances in placed.values())
    assert set().union(*placed.values()) == {"orders-a", "orders-b"}


async def test_a_blocking_twin_waits_for_the_async_call_with_its_key() -> None:
    """areach and reach with one idempotency key run the work once and both answer when it ends (one loop)."""
    registry = MemoryRegistry()
    keyed = Capability(name="place_order", idempotency_key="${params.order_id}")
    await registry.register_agent(
        AgentDescriptor(name="orders", endpoints=["http://127.0.0.1:9"], capabilities=[keyed])
    )
    executed: list[str] = []

    async def slow(call: Call) -> dict[str, Any]:
        executed.append(call.request.payload["order_id"])
        await asyncio.sleep(0.5)
        return {"placed": call.request.payload["order_id"]}

    twin = ToolCall("place_order", {"order_id": "k-1"}, has_local=False)
    with ReachEnhancer(registry=registry, transport=MockTransport(slow), timeout_ms=5000) as enhancer:
        loop = asyncio.get_running_loop()
        started = loop.time()
        first = asyncio.create_task(enhancer.areach(twin))
        await asyncio.sleep(0.05)
        second = await asyncio.to_thread(enhancer.reach, twin)
        second_took = loop.time() - started
        first_result = await first
    assert executed == ["k-1"]
    assert first_result.ok and second.ok and first_result.content == second.content
    assert second_took < 2.5, f"the twin waited {second_took:.2f}s: the owner's completion never woke it"
