"""Errors survive the wire: one code per class, and a hop's refusal raises the same class as a local one."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from hop_support import TOKENS, demo_tenants, serve_agents, write_config
from transport_conformance import make_call

from reach_plugins import ReachClient, errors
from reach_plugins.agent import BackgroundServer
from reach_plugins.config.loader import load_config
from reach_plugins.gateway import create_app
from reach_plugins.model import AgentDescriptor, Capability, ErrorInfo
from reach_plugins.node import build_node
from reach_plugins.registry import MemoryRegistry
from reach_plugins.transport import Transport
from reach_plugins.wire.body import error_body
from reach_plugins.wire.headers import ERROR_TYPE
from transports.direct import DirectTransport
from transports.gateway import GatewayTransport
from transports.gateway.transport import parse_reply
from transports.grpcnode import GrpcNodeTransport
from transports.grpcnode.transport import _refusal

ALL = sorted(errors.WIRE_CODES.items())


def _module_classes() -> set[type[errors.ReachError]]:
    found, pending = set(), [errors.ReachError]
    while pending:
        kind = pending.pop()
        pending.extend(kind.__subclasses__())
        if kind.__module__ == errors.__name__:
            found.add(kind)
    return found


def test_every_error_class_has_its_own_code() -> None:
    """The table holds every class of reach_plugins.errors once, each under a code no other class has."""
    assert set(errors.WIRE_CODES.values()) == _module_classes()
    assert len({kind.code for kind in _module_classes()}) == len(_module_classes())
    assert errors.WIRE_CODES["unknown_capability"] is errors.UnknownCapability
    assert errors.WIRE_CODES["permission_denied"] is not errors.WIRE_CODES["rejected"]


@pytest.mark.parametrize(("code", "kind"), ALL)
def test_from_wire_rebuilds_the_exact_class(code: str, kind: type[errors.ReachError]) -> None:
    """The code a hop sends rebuilds exactly its class, message kept."""
    rebuilt = errors.from_wire(ErrorInfo(type=code, message="told by the hop", retry_after=2.0))
    assert type(rebuilt) is kind and rebuilt.message == "told by the hop" and rebuilt.error_type == code


def _instance(kind: type[errors.ReachError]) -> errors.ReachError:
    return kind.from_wire(f"{kind.__name__} happened", 1.5)


@pytest.mark.parametrize(("code", "kind"), ALL)
def test_gateway_refusal_body_raises_the_same_class(code: str, kind: type[errors.ReachError]) -> None:
    """GatewayTransport raises what the gateway refused with; backpressure stays a reply the core retries."""
    body = json.dumps(error_body(_instance(kind), "r-1")).encode()
    call = make_call("http://127.0.0.1:9", "query_order")
    if kind is errors.Backpressure:
        reply = parse_reply(call, 429, body)
        assert reply.error is not None and reply.error.type == "backpressure" and reply.retry_after == 1.5
        return
    with pytest.raises(kind) as raised:
        parse_reply(call, 400, body)
    assert type(raised.value) is kind and raised.value.refused


@pytest.mark.parametrize(("code", "kind"), ALL)
def test_node_refusal_trailers_raise_the_same_class(code: str, kind: type[errors.ReachError]) -> None:
    """GrpcNodeTransport turns a node's abort with the wire code in its trailers into that class."""
    failure = grpc.aio.AioRpcError(
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.aio.Metadata(),
        grpc.aio.Metadata((ERROR_TYPE, code)),
        details=f"{kind.__name__} happened",
    )
    refused = _refusal(failure)
    assert type(refused) is kind and refused.refused and refused.message == f"{kind.__name__} happened"


Route = Callable[[Path], AbstractAsyncContextManager[Callable[[], Transport]]]


@asynccontextmanager
async def _direct(config: Path) -> AsyncIterator[Callable[[], Transport]]:
    yield DirectTransport


@asynccontextmanager
async def _gateway(config: Path) -> AsyncIterator[Callable[[], Transport]]:
    with BackgroundServer(create_app(config, environ=TOKENS), proxy_headers=False) as server:
        yield lambda: GatewayTransport(server.url, token=TOKENS["ACME_TOKEN"])


@asynccontextmanager
async def _node(config: Path) -> AsyncIterator[Callable[[], Transport]]:
    async with build_node(config, environ=TOKENS) as node:
        yield lambda: GrpcNodeTransport(node.target, token=TOKENS["ACME_TOKEN"])


TRANSPORTS: dict[str, Route] = {"direct": _direct, "gateway": _gateway, "node": _node}
SCHEMA = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}

SCENARIOS: dict[str, tuple[type[errors.ReachError], str, dict[str, Any]]] = {
    "unknown": (errors.UnknownCapability, "launch_rocket", {}),
    "forbidden": (errors.PermissionDenied, "create_ticket", {}),
    "bad payload": (errors.InvalidPayload, "query_order", {"order": 1}),
}


def _client_registry(config: Path) -> MemoryRegistry:
    """What a client routing for a hop knows: every capability and one the hop lacks, no schema, no tenant rules."""
    registry = MemoryRegistry()
    for agent in load_config(config).agents:
        loose = [Capability(name=c.name) for c in agent.capabilities] + [Capability(name="launch_rocket")]
        registry.put_agent(AgentDescriptor(name=agent.name, endpoints=list(agent.endpoints), capabilities=loose))
    return registry


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
async def test_a_refusal_raises_the_same_class_over_every_transport(
    tmp_path: Path, transport: str, scenario: str
) -> None:
    """Who refuses (the client itself, a gateway, a node) does not change what the caller catches."""
    kind, capability, payload = SCENARIOS[scenario]
    with serve_agents(("orders", "o1"), ("tickets", "t1")) as agents:
        orders = {"endpoints": [agents[0].url], "capabilities": [{"name": "query_order", "params_schema": SCHEMA}]}
        tickets = {"endpoints": [agents[1].url], "capabilities": ["create_ticket"]}
        config = write_config(tmp_path / "agents.yaml", {"orders": orders, "tickets": tickets}, demo_tenants())
        async with TRANSPORTS[transport](config) as make:
            if transport == "direct":
                client = ReachClient(f"file://{config}", make(), tenant="acme")
            else:
                client = ReachClient(_client_registry(config), make(), tenant="acme")
            async with client:
                with pytest.raises(kind) as raised:
                    await client.reach(capability, payload, timeout_ms=3000)
        executed = [entry for agent in agents for entry in agent.executed]
    assert type(raised.value) is kind
    assert executed == []
