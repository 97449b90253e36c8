"""The agent-side SDK: capability handlers served over the reach wire protocol, idempotency, health, lifecycle."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

from reach_plugins.agent import ReachAgent, ReachContext
from reach_plugins.errors import BusinessError, ConfigError
from reach_plugins.protocols import SseDecoder
from reach_plugins.security.context import current


class Clock:
    """A fake monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def build_agent(**options: Any) -> tuple[ReachAgent, list[str]]:
    """An orders agent whose handlers record every execution."""
    options.setdefault("tokens", "open")  # these tests speak the wire protocol by hand, without tokens
    agent = ReachAgent("orders", version="1.2", **options)
    executed: list[str] = []

    @agent.capability("query_order", params_schema={"type": "object", "required": ["order_id"]})
    async def query_order(order_id: str) -> dict[str, str]:
        """Where an order is."""
        executed.append(order_id)
        if order_id == "missing":
            raise BusinessError(f"order {order_id} does not exist")
        if order_id == "crash":
            raise RuntimeError("database down")
        return {"order_id": order_id, "status": "shipped"}

    @agent.capability("create_ticket", idempotency_key="${params.wo_number}")
    def create_ticket(wo_number: str, ctx: ReachContext) -> dict[str, Any]:
        executed.append(wo_number)
        ctx.state["tickets"] = ctx.state.get("tickets", 0) + 1
        return {"ticket": f"T-{wo_number}", "tenant": ctx.tenant, "hops": list(ctx.hops), "n": ctx.state["tickets"]}

    @agent.capability("count")
    def count(upto: int) -> Iterator[int]:
        yield from range(upto)

    return agent, executed


@pytest.fixture
async def client() -> AsyncIterator[tuple[httpx.AsyncClient, ReachAgent, list[str]]]:
    agent, executed = build_agent()
    transport = httpx.ASGITransport(app=agent.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
        yield http, agent, executed


def body(capability: str, payload: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"request_id": "r-1", "capability": capability, "payload": payload, **fields}


Client = tuple[httpx.AsyncClient, ReachAgent, list[str]]

# ----------------------------------------------------------------------------- the wire protocol


async def test_success_reply_follows_the_wire_protocol(client: Client) -> None:
    """A handler's return value is the data of a 200 success reply echoing the request id."""
    http, _, _ = client
    response = await http.post("/reach", json=body("query_order", {"order_id": "A1"}))
    assert response.status_code == 200
    assert response.json() == {
        "request_id": "r-1",
        "status": "success",
        "data": {"order_id": "A1", "status": "shipped"},
        "error": None,
    }


async def test_business_error_is_typed_business(client: Client) -> None:
    """A BusinessError raised by the handler is a fail reply with error type business."""
    http, _, _ = client
    reply = (await http.post("/reach", json=body("query_order", {"order_id": "missing"}))).json()
    assert (reply["status"], reply["error"]) == (
        "fail",
        {"type": "business", "message": "order missing does not exist"},
    )


async def test_crash_is_a_handler_failed_500(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    """An unexpected exception is a 500, type handler_failed, naming its class and an error id; its text is logged."""
    http, _, _ = client
    response = await http.post("/reach", json=body("query_order", {"order_id": "crash"}))
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "handler_failed"
    message = response.json()["error"]["message"]
    assert "database down" not in message and "RuntimeError" in message
    error_id = message.rpartition("error id ")[2]
    logged = [r for r in caplog.records if error_id in r.getMessage()]
    assert len(error_id) == 16 and logged and "database down" in str(logged[0].exc_info[1])


async def test_return_values_are_encoded_or_refused(caplog: pytest.LogCaptureFixture) -> None:
    """Pydantic models are returned as JSON; a value JSON cannot carry is a 500, its type named in the agent's log."""

    class Order(BaseModel):
        order_id: str

    agent = ReachAgent("typed", tokens="open")

    @agent.capability("model")
    def model() -> Order:
        return Order(order_id="A1")

    @agent.capability("odd")
    def odd() -> set[int]:
        return {1}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=agent.app), base_url="http://a") as http:
        good = await http.post("/reach", json=body("model", {}))
        bad = await http.post("/reach", json=body("odd", {}))
    assert good.json()["data"] == {"order_id": "A1"}
    assert bad.status_code == 500
    assert "error id" in bad.json()["error"]["message"]
    assert any("set" in str(r.exc_info[1]) for r in caplog.records if r.exc_info)


async def test_unknown_capability_lists_what_is_offered(client: Client) -> None:
    """Asking for a capability the agent lacks is a 404 naming what it offers."""
    http, _, _ = client
    response = await http.post("/reach", json=body("cancel_order", {}))
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "unknown_capability"
    assert "count, create_ticket, query_order" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("payload", "hint"), [({}, "'order_id' is a required property"), ({"order_id": "A1", "extra": 1}, "extra")]
)
async def test_payload_that_does_not_fit_is_refused(client: Client, payload: dict[str, Any], hint: str) -> None:
    """A payload failing params_schema or the handler's signature is a 400 naming the field; nothing runs."""
    http, _, executed = client
    response = await http.post("/reach", json=body("query_order", payload))
    assert response.status_code == 400
    assert hint in response.json()["error"]["message"]
    assert executed == []


async def test_malformed_hops_header_is_refused(client: Client) -> None:
    """An X-Reach-Hops header that is not 'agent/capability' items is a 400, not a crash."""
    http, _, executed = client
    response = await http.post("/reach", json=body("count", {"upto": 1}), headers={"X-Reach-Hops": "nonsense"})
    assert response.status_code == 400
    assert "X-Reach-Hops" in response.json()["error"]["message"]
    assert executed == []


async def test_garbage_body_is_refused(client: Client) -> None:
    """A body that is not a reach request is a 400 saying what the body must be."""
    http, _, _ = client
    response = await http.post("/reach", content=b"not json")
    assert response.status_code == 400
    assert "capability" in response.json()["error"]["message"]


async def test_context_carries_headers_and_session_state(client: Client) -> None:
    """ctx gives the tenant and hops from the headers, and state that lives across one session's calls."""
    http, _, _ = client
    headers = {"X-Tenant": "acme", "X-Reach-Hops": "router/triage"}
    first = await http.post("/reach", json=body("create_ticket", {"wo_number": "W1"}, session_id="s1"), headers=headers)
    again = await http.post(
        "/reach", json=body("create_ticket", {"wo_number": "W2"}, session_id="s1"), headers={"X-Tenant": "acme"}
    )
    other = await http.post("/reach", json=body("create_ticket", {"wo_number": "W3"}, session_id="s2"))
    assert first.json()["data"] == {"ticket": "T-W1", "tenant": "acme", "hops": ["router/triage"], "n": 1}
    assert (again.json()["data"]["n"], other.json()["data"]["n"]) == (2, 1)


# ----------------------------------------------------------------------------- deadlines


async def test_expired_deadline_is_not_executed(client: Client) -> None:
    """A request whose X-Reach-Deadline is already spent is refused with 504 and never runs."""
    http, _, executed = client
    response = await http.post(
        "/reach", json=body("query_order", {"order_id": "A1"}), headers={"X-Reach-Deadline": "0"}
    )
    assert response.status_code == 504
    assert response.json()["error"]["type"] == "timeout"
    assert executed == []


async def test_handler_outliving_the_deadline_is_cut() -> None:
    """An async handler still running at the caller's deadline is cancelled and answered with a timeout."""
    agent = ReachAgent("slow", tokens="open")
    cancelled = asyncio.Event()

    @agent.capability("think")
    async def think() -> str:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        return "never"

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=agent.app), base_url="http://a") as http:
        response = await http.post("/reach", json=body("think", {}), headers={"X-Reach-Deadline": "30"})
    assert response.status_code == 504
    assert cancelled.is_set()


# ----------------------------------------------------------------------------- streaming, health, tracing


async def test_sync_generator_streams_sse_frames(client: Client) -> None:
    """A generator handler is served at /reach/stream as data frames then an end frame."""
    http, _, _ = client
    response = await http.post("/reach/stream", json=body("count", {"upto": 3}))
    frames = SseDecoder().feed(response.content)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert [(frame.event, frame.data) for frame in frames] == [("data", "0"), ("data", "1"), ("data", "2"), ("end", "")]


async def test_streaming_handler_on_plain_route_collects(client: Client) -> None:
    """A streaming capability asked without streaming answers the list of its items."""
    http, _, _ = client
    assert (await http.post("/reach", json=body("count", {"upto": 3}))).json()["data"] == [0, 1, 2]


async def test_readiness_callback_drives_readyz() -> None:
    """/healthz says alive; /readyz follows the (async) readiness callback: 503 when the pool is full."""
    full = False

    async def ready() -> bool:
        return not full

    agent = ReachAgent("workers", readiness=ready, tokens="open")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=agent.app), base_url="http://a") as http:
        assert (await http.get("/readyz")).status_code == 200
        full = True
        assert (await http.get("/readyz")).status_code == 503
        assert (await http.get("/healthz")).status_code == 200


async def test_draining_agent_refuses_new_work(client: Client) -> None:
    """While draining the agent answers 503 backpressure with Retry-After, so callers go elsewhere."""
    http, agent, executed = client
    agent.draining = True
    response = await http.post("/reach", json=body("query_order", {"order_id": "A1"}))
    assert (response.status_code, response.headers["Retry-After"]) == (503, "1")
    assert response.json()["error"]["type"] == "backpressure"
    assert executed == []


async def test_server_span_continues_the_callers_trace() -> None:
    """The handler's span belongs to the trace named by the incoming traceparent."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent, _ = build_agent(tracer_provider=provider)
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    headers = {"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=agent.app), base_url="http://a") as http:
        await http.post("/reach", json=body("query_order", {"order_id": "A1"}), headers=headers)
    (span,) = exporter.get_finished_spans()
    assert span.name == "reach.agent query_order"
    assert format(span.context.trace_id, "032x") == trace_id
    assert span.parent is not None
    assert format(span.parent.span_id, "016x") == "b7ad6b7169203331"


# ----------------------------------------------------------------------------- declaring


def test_descriptor_lists_capabilities_with_docstrings() -> None:
    """The descriptor names the agent's capabilities, described by the handlers' docstrings."""
    agent, _ = build_agent()
    descriptor = agent.descriptor("http://127.0.0.1:8101")
    assert [cap.name for cap in descriptor.capabilities] == ["query_order", "create_ticket", "count"]
    assert descriptor.capability("query_order").description == "Where an order is."  # type: ignore[union-attr]
    assert descriptor.capability("create_ticket").idempotency_key == "${params.wo_number}"  # type: ignore[union-attr]
    assert (descriptor.version, descriptor.endpoints) == ("1.2", ["http://127.0.0.1:8101"])


@pytest.mark.parametrize("name", ["Orders", "9lives", "has space"])
def test_bad_agent_names_are_config_errors(name: str) -> None:
    """Agent names must be lowercase identifiers; the error says so."""
    with pytest.raises(ConfigError, match="lowercase"):
        ReachAgent(name)


def test_duplicate_capability_is_a_config_error() -> None:
    """One capability name serves one handler."""
    agent, _ = build_agent()
    with pytest.raises(ConfigError, match="already has"):
        agent.capability("count")(lambda upto: upto)


def test_invalid_params_schema_is_a_config_error() -> None:
    """A params_schema that is not JSON Schema is refused when declared, not when called."""
    agent = ReachAgent("orders")
    with pytest.raises(ConfigError, match="params_schema"):
        agent.capability("query_order", params_schema={"type": "no-such-type"})(lambda: None)


async def test_handlers_know_the_request_they_serve() -> None:
    """Plain and streaming handlers run inside the served request, so nested reaches extend its hop chain."""
    agent = ReachAgent("router", tokens="open")

    @agent.capability("route")
    def route() -> list[str]:
        served = current()
        return [str(hop) for hop in served.hops] if served else []

    @agent.capability("route_stream")
    async def route_stream() -> AsyncIterator[list[str]]:
        served = current()
        yield [str(hop) for hop in served.hops] if served else []

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=agent.app), base_url="http://a") as http:
        headers = {"X-Reach-Hops": "app/chat"}
        plain = (await http.post("/reach", json=body("route", {}), headers=headers)).json()["data"]
        streamed = SseDecoder().feed(
            (await http.post("/reach/stream", json=body("route_stream", {}), headers=headers)).content
        )
    assert plain == ["app/chat", "router/route"]
    assert streamed[0].data == '["app/chat","router/route_stream"]'
