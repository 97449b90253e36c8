"""The gateway's source rule under callers' pins: a pinned internal_only instance stays hidden from outside."""

from __future__ import annotations

import random

import pytest
from registry_conformance import FakeClock, agent

from reach_plugins.config.loader import TenantConfig
from reach_plugins.errors import NoHealthyAgent
from reach_plugins.model import ReachRequest
from reach_plugins.registry import MemoryRegistry
from reach_plugins.routing import Router
from reach_plugins.routing.pinning import TargetedRouter
from reach_plugins.server.access import SourceRule
from reach_plugins.wire.headers import PREFER, SOURCE, TARGET

TENANTS = {"ops": TenantConfig(agents=["ledger", "orders"], networks=["127.0.0.0/8"])}


@pytest.fixture
def targeted() -> TargetedRouter:
    registry = MemoryRegistry(clock=FakeClock())
    registry.put_agent(agent("ledger", "query_order", endpoints=1, internal_only=True))
    registry.put_agent(agent("orders", "query_order", endpoints=1))
    router = Router(registry, clock=registry.clock, rng=random.Random(7), tenants=TENANTS)
    return TargetedRouter(SourceRule(router, registry, TENANTS))


def ask(pin: str, wanted: str, source: str | None) -> ReachRequest:
    metadata = {pin: wanted} | ({SOURCE: source} if source is not None else {})
    return ReachRequest(capability="query_order", tenant="ops", metadata=metadata)


def ledger_pin(targeted: TargetedRouter) -> str:
    """``ledger/<instance>``, as a caller inside the tenant's networks sees it among the candidates."""
    routes = targeted.candidates(ReachRequest(capability="query_order", tenant="ops", metadata={SOURCE: "127.0.0.1"}))
    return next(f"{r.agent.name}/{r.instance.instance_id}" for r in routes if r.agent.name == "ledger")


def test_a_pin_to_a_hidden_instance_is_refused_from_outside_and_served_from_inside(targeted: TargetedRouter) -> None:
    """target ledger/<instance> from an unknown source: NoHealthyAgent; from inside its networks: served there."""
    wanted = ledger_pin(targeted)
    inside = targeted.route(ask(TARGET, wanted, "127.0.0.1"))
    assert f"{inside.agent.name}/{inside.instance.instance_id}" == wanted
    with pytest.raises(NoHealthyAgent, match="not a usable candidate"):
        targeted.route(ask(TARGET, wanted, None))


def test_a_preference_for_a_hidden_instance_falls_back_to_a_visible_one(targeted: TargetedRouter) -> None:
    """prefer ledger/... from outside is routed to orders, never to the hidden ledger instance."""
    wanted = ledger_pin(targeted)
    for _ in range(20):
        assert targeted.route(ask(PREFER, wanted, None)).agent.name == "orders"
