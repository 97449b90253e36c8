"""Errors survive the wire: one code per class, and a hop's refusal raises the same class as a local one."""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from hop_support import TOKENS, demo_tenants, serve_agents, write_config
from transport_conformance import make_call

from reach_plugins import ReachClient, errors
from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.config.loader import load_config
from reach_plugins.gateway import create_app
from reach_plugins.model import AgentDescriptor, Capability, ErrorInfo
from reach_plugins.node import build_node
from reach_plugins.registry import MemoryRegistry
from reach_plugins.security import RemoteTokens, TokenIssuer
from reach_plugins.server.forwarder import Forwarder
from reach_plugins.server.issuer_server import create_issuer_app
from reach_plugins.transport import Transport
from reach_plugins.wire.body import error_body
from reach_plugins.wire.headers import ERROR_TYPE, HTTP_STATUS
from reach_plugins.wire.proto import reach_pb2 as pb
from reach_plugins.wire.proto import reach_pb2_grpc as pb_grpc
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


def test_token_and_audit_refusals_are_classes_of_errors_with_codes_of_their_own() -> None:
    """InvalidToken, TokenDenied, AuditRefused: in errors.py under codes of their own, on their parents' statuses."""
    refusals = {errors.InvalidToken: errors.Unauthenticated, errors.TokenDenied: errors.PermissionDenied}
    refusals[errors.AuditRefused] = errors.PermissionDenied
    for kind, parent in refusals.items():
        assert kind.__module__ == errors.__name__ and errors.WIRE_CODES[kind.code] is kind
        assert kind.code != parent.code and (kind.http_status, kind.grpc_code) == (parent.http_status, parent.grpc_code)
    assert (errors.InvalidToken.http_status, errors.TokenDenied.http_status) == (401, 403)


@pytest.mark.parametrize(("code", "kind"), ALL)
def test_every_class_names_an_http_status_and_a_grpc_code(code: str, kind: type[errors.ReachError]) -> None:
    """Each class's http_status is an HTTP error status and its grpc_code names a grpc.StatusCode other than OK."""
    assert isinstance(kind.http_status, int) and 400 <= kind.http_status <= 599
    assert kind.grpc_code in grpc.StatusCode.__members__ and kind.grpc_code != "OK"
    instance = _instance(kind)
    assert (instance.http_status, instance.grpc_code, instance.error_type) == (kind.http_status, kind.grpc_code, code)


def test_errors_imports_nothing_of_ours() -> None:
    """errors.py is a leaf: no import of reach_plugins or transports anywhere in it, TYPE_CHECKING blocks included."""
    tree = ast.parse(Path(inspect.getfile(errors)).read_text())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    froms = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert all(node.level == 0 for node in froms), "a relative import in errors.py"
    imported += [node.module or "" for node in froms]
    ours = [name for name in imported if name.split(".")[0] in {"reach_plugins", "transports"}]
    assert ours == [] and imported, ours


def _drawn_tree() -> dict[str, str]:
    """The class -> parent pairs drawn in errors.py's docstring (indentation says the parent)."""
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in (errors.__doc__ or "").splitlines():
        stripped = line.strip()
        name = stripped.lstrip("│├└─ ").split(" ")[0]
        if not name or not ("── " in line or stripped == "ReachError"):
            continue
        depth = len(line) - len(line.lstrip("│├└─ ")) if stripped != "ReachError" else 0
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            parents[name] = stack[-1][1]
        stack.append((depth, name))
    return parents


def test_the_tree_in_the_docstring_is_the_class_tree() -> None:
    """Every class of errors.py is drawn in its docstring under its real parent, and nothing else is drawn."""
    drawn = _drawn_tree()
    real = {kind.__name__: kind.__base__.__name__ for kind in _module_classes() if kind is not errors.ReachError}
    assert drawn == real


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


# --------------------------------------------------------------------------- each server, each class (DESIGN 11.6)

ROUTED = "query_order"


@pytest.fixture
def refuse_with(monkeypatch: pytest.MonkeyPatch) -> Callable[[errors.ReachError], None]:
    """Make every server's forwarder refuse with the given error, as if routing had found it."""

    def install(error: errors.ReachError) -> None:
        async def run(self: Forwarder, request: Any) -> Any:
            raise error

        monkeypatch.setattr(Forwarder, "run", run)

    return install


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config with one agent (never reached: the forwarder refuses) and the demo tenants."""
    return write_config(
        tmp_path_factory.mktemp("codes") / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants()
    )


@pytest.fixture(scope="module")
def gateway(config: Path) -> Iterator[str]:
    """A gateway on a thread of its own; its URL."""
    with BackgroundServer(create_app(config, environ=TOKENS), proxy_headers=False) as server:
        yield server.url


@pytest.fixture(scope="module")
def node(config: Path) -> Iterator[str]:
    """A node on a loop of its own thread (the test's loop only runs the client); its target."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    started = asyncio.run_coroutine_threadsafe(build_node(config, environ=TOKENS).start(), loop).result(30)
    yield started.target
    asyncio.run_coroutine_threadsafe(started.stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


class _Refusing:
    """A token verifier that refuses every call with the error the test put in ``error``."""

    error: errors.ReachError = errors.ReachError("unset")

    async def verify(self, token: str | None, *, audience: str | None = None) -> Any:
        raise self.error


@pytest.fixture(scope="module")
def agent() -> Iterator[tuple[str, _Refusing]]:
    """An agent SDK app whose token check refuses with the error of the test; its URL and the verifier."""
    verifier = _Refusing()
    served = ReachAgent("orders", tokens=verifier)  # type: ignore[arg-type]

    @served.capability(ROUTED)
    def query_order(order_id: str) -> dict[str, str]:
        raise AssertionError("a refused call ran")

    with BackgroundServer(served.app) as server:
        yield server.url, verifier


DEMO = {"Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}"}


@pytest.mark.parametrize(("code", "kind"), ALL)
async def test_gateway_refuses_with_the_class_status_and_the_client_raises_it(
    gateway: str, refuse_with: Callable[[errors.ReachError], None], code: str, kind: type[errors.ReachError]
) -> None:
    """A gateway refusal: HTTP status = kind.http_status, error.type = its code, GatewayTransport raises kind."""
    refuse_with(_instance(kind))
    async with httpx.AsyncClient(base_url=gateway) as http:
        raw = await http.post("/v1/reach", json={"capability": ROUTED, "payload": {"order_id": "A1"}}, headers=DEMO)
    assert raw.status_code == kind.http_status and raw.json()["error"]["type"] == code
    transport = GatewayTransport(gateway, token=TOKENS["DEMO_TOKEN"])
    try:
        if kind is errors.Backpressure:  # asks to come back: a reply the core retries, not a refusal
            reply = await transport.send(make_call(gateway, ROUTED, {"order_id": "A1"}))
            assert reply.error is not None and type(errors.from_wire(reply.error)) is kind
            assert reply.status_code == kind.http_status
            return
        with pytest.raises(kind) as raised:
            await transport.send(make_call(gateway, ROUTED, {"order_id": "A1"}))
    finally:
        await transport.aclose()
    assert type(raised.value) is kind and raised.value.refused and raised.value.error_type == code


@pytest.mark.parametrize(("code", "kind"), ALL)
async def test_node_refuses_with_the_class_grpc_code_and_the_client_raises_it(
    node: str, refuse_with: Callable[[errors.ReachError], None], code: str, kind: type[errors.ReachError]
) -> None:
    """A node refusal: gRPC code = kind.grpc_code, trailers name code and HTTP status; GrpcNodeTransport raises kind."""
    refuse_with(_instance(kind))
    message = pb.ReachCall(capability=ROUTED, payload=json.dumps({"order_id": "A1"}).encode())
    metadata = (("authorization", DEMO["Authorization"]),)
    async with grpc.aio.insecure_channel(node) as channel:
        stub = pb_grpc.ReachNodeStub(channel)  # type: ignore[no-untyped-call]
        if kind is errors.Backpressure:  # the node's own message type, never a reused status code
            answer = await stub.Call(message, metadata=metadata, timeout=10)
            assert answer.HasField("backpressure") and answer.backpressure.retry_after == 1.5
        else:
            with pytest.raises(grpc.aio.AioRpcError) as aborted:
                await stub.Call(message, metadata=metadata, timeout=10)
            trailers = dict(aborted.value.trailing_metadata() or ())
            assert aborted.value.code() == grpc.StatusCode[kind.grpc_code]
            assert trailers[ERROR_TYPE] == code and trailers[HTTP_STATUS] == str(kind.http_status)
    transport = GrpcNodeTransport(node, token=TOKENS["DEMO_TOKEN"])
    try:
        if kind is errors.Backpressure:
            reply = await transport.send(make_call(f"grpc://{node}", ROUTED, {"order_id": "A1"}))
            assert reply.error is not None and type(errors.from_wire(reply.error)) is kind
            return
        with pytest.raises(kind) as raised:
            await transport.send(make_call(f"grpc://{node}", ROUTED, {"order_id": "A1"}))
    finally:
        await transport.aclose()
    assert type(raised.value) is kind and raised.value.refused and raised.value.error_type == code


@pytest.mark.parametrize(("code", "kind"), ALL)
async def test_agent_sdk_refuses_with_the_class_status_and_the_client_reads_it(
    agent: tuple[str, _Refusing], code: str, kind: type[errors.ReachError]
) -> None:
    """An agent SDK refusal: HTTP status = kind.http_status, error.type = its code; DirectTransport's reply names it."""
    url, verifier = agent
    verifier.error = _instance(kind)
    async with httpx.AsyncClient(base_url=url) as http:
        raw = await http.post("/reach", json={"capability": ROUTED, "payload": {"order_id": "A1"}})
    assert raw.status_code == kind.http_status and raw.json()["error"]["type"] == code
    transport = DirectTransport()
    try:
        reply = await transport.send(make_call(url, ROUTED, {"order_id": "A1"}))
    finally:
        await transport.aclose()
    assert reply.status == "fail" and reply.status_code == kind.http_status
    assert reply.error is not None and type(errors.from_wire(reply.error)) is kind


@pytest.fixture(scope="module")
def issuer(config: Path) -> Iterator[str]:
    """A ``reach issuer`` app on a thread of its own; its URL."""
    with BackgroundServer(create_issuer_app(config, environ=TOKENS)) as server:
        yield server.url


@pytest.mark.parametrize(("code", "kind"), ALL)
async def test_issuer_refuses_with_the_class_status_and_remote_tokens_raise_it(
    issuer: str, monkeypatch: pytest.MonkeyPatch, code: str, kind: type[errors.ReachError]
) -> None:
    """POST /v1/tokens refused: HTTP status = kind.http_status, error.type = its code; RemoteTokens raises kind."""

    def refuse(self: TokenIssuer, tenant: str | None, audience: str, *, via: str | None = None) -> Any:
        raise _instance(kind)

    monkeypatch.setattr(TokenIssuer, "for_tenant", refuse)
    async with httpx.AsyncClient(base_url=issuer) as http:
        raw = await http.post("/v1/tokens", json={"audience": "orders"}, headers=DEMO)
    assert raw.status_code == kind.http_status and raw.json()["error"]["type"] == code
    tokens = RemoteTokens(issuer, bearer=TOKENS["DEMO_TOKEN"])
    try:
        with pytest.raises(kind) as raised:
            await tokens.token("orders", "demo")
    finally:
        await tokens.aclose()
    assert type(raised.value) is kind and f"{kind.__name__} happened" in raised.value.message
