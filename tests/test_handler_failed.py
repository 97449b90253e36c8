"""A handler that ran and raised runs once per call on every path; one that raised ``Retryable`` is retried per policy.

The agent runs in a process of its own and appends one line per handler run
to a file, so runs are counted where they happen. Paths: direct (aiohttp and
httpx), through a gateway, through a node (gRPC), to the agent's A2A face and
through the gateway's MCP face; keyed and unkeyed where the path carries a key.
Last, the README's LangChain recipe (``on_error="raise"`` +
``ToolRetryMiddleware(retry_on=errors.is_retryable)``) over the real
``create_agent``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hop_support import TOKENS, demo_tenants, free_port, write_config
from langchain.agents.middleware import ToolErrorMiddleware, ToolRetryMiddleware
from langchain_core.tools import tool
from servers import interrupt, startup_seconds, wait_until

from reach_plugins import ReachClient, ReachEnhancer
from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.demo.model import Rule, ScriptedChatModel
from reach_plugins.errors import (
    Backpressure,
    ConnectionLost,
    HandlerFailed,
    NoHealthyAgent,
    ReachError,
    Retryable,
    is_retryable,
)
from reach_plugins.gateway import create_app
from reach_plugins.langchain import create_agent, reach_error_message
from reach_plugins.model import AgentDescriptor, ErrorInfo, ReachResponse, RetryPolicy
from reach_plugins.node import build_node
from reach_plugins.registry import MemoryRegistry
from reach_plugins.testing.clock import FakeClock
from reach_plugins.transport import Call, MockTransport, Reply, Transport
from transports.direct import DirectTransport
from transports.gateway import GatewayTransport
from transports.grpcnode import GrpcNodeTransport

ATTEMPTS = 3
"""The default ``retry.max_attempts``: what a ``Retryable`` handler is run per call."""
FAST_RETRY = {"base_wait": 0.01, "max_wait": 0.02}
CAPABILITIES = ["crash", "crash_stream", "flaky"]

_AGENT = textwrap.dedent(
    """
    import sys
    from reach_plugins.agent import ReachAgent, serve
    from reach_plugins.errors import Retryable

    runs, port = sys.argv[1], int(sys.argv[2])
    agent = ReachAgent("orders", tokens="open")

    def ran(capability, call):
        with open(runs, "a") as out:
            out.write(f"{capability} {call}\\n")

    @agent.capability("crash")
    def crash(call: str) -> dict:
        ran("crash", call)
        raise RuntimeError("the ledger at postgres://svc:PaSsWoRd@127.0.0.1:5432 dropped the connection")

    @agent.capability("crash_stream")
    def crash_stream(call: str):
        ran("crash_stream", call)
        if call:
            raise RuntimeError("the stream broke before its first event")
        yield {}

    @agent.capability("flaky")
    def flaky(call: str) -> dict:
        ran("flaky", call)
        raise Retryable("inventory busy")

    serve(agent, host="127.0.0.1", port=port, log_level="warning")
    """
)


@dataclass
class AgentProcess:
    """The counting agent in its own process."""

    url: str
    runs: Path
    process: subprocess.Popen[bytes]

    def count(self, capability: str, call: str) -> int:
        """How often the handler of ``capability`` ran for ``call``."""
        lines = self.runs.read_text().splitlines() if self.runs.exists() else []
        return lines.count(f"{capability} {call}")


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    runs = tmp_path_factory.mktemp("handler-failed") / "runs.txt"
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-c", _AGENT, str(runs), str(port)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    served = AgentProcess(f"http://127.0.0.1:{port}", runs, process)
    try:

        def ready() -> bool:
            try:
                return httpx.get(f"{served.url}/healthz", timeout=0.5).status_code == 200
            except httpx.HTTPError:
                return process.poll() is not None

        wait_until(ready, startup_seconds(), "the counting agent's start")
        assert process.poll() is None, "the counting agent exited at start"
        yield served
    finally:
        interrupt(process)


@pytest.fixture
def config(agent: AgentProcess, tmp_path: Path) -> Path:
    body = {"endpoints": [agent.url], "capabilities": CAPABILITIES, "retry": FAST_RETRY}
    return write_config(tmp_path / "agents.yaml", {"orders": body}, demo_tenants())


Opened = Callable[[Path], AbstractAsyncContextManager[ReachClient]]


@asynccontextmanager
async def _client(config: Path, transport: Transport) -> AsyncIterator[ReachClient]:
    async with ReachClient(str(config), transport, tenant="demo", environ=TOKENS) as client:
        yield client


@asynccontextmanager
async def direct_aiohttp(config: Path) -> AsyncIterator[ReachClient]:
    async with _client(config, DirectTransport(engine="aiohttp")) as client:
        yield client


@asynccontextmanager
async def direct_httpx(config: Path) -> AsyncIterator[ReachClient]:
    async with _client(config, DirectTransport(engine="httpx")) as client:
        yield client


@asynccontextmanager
async def gateway(config: Path) -> AsyncIterator[ReachClient]:
    with BackgroundServer(create_app(config, environ=TOKENS), proxy_headers=False) as server:
        async with _client(config, GatewayTransport(server.url, token=TOKENS["DEMO_TOKEN"])) as client:
            yield client


@asynccontextmanager
async def node(config: Path) -> AsyncIterator[ReachClient]:
    async with (
        build_node(config, environ=TOKENS) as served,
        _client(config, GrpcNodeTransport(served.target, token=TOKENS["DEMO_TOKEN"])) as client,
    ):
        yield client


PATHS: dict[str, Opened] = {
    "direct-aiohttp": direct_aiohttp,
    "direct-httpx": direct_httpx,
    "gateway": gateway,
    "node": node,
}


def _call() -> str:
    return uuid.uuid4().hex[:12]


def _raised(response: ReachResponse) -> Exception:
    """What ``raise_for_status`` raises for a failed response."""
    with pytest.raises(Exception) as caught:
        response.raise_for_status()
    assert isinstance(caught.value, Exception)
    return caught.value


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
async def test_a_raising_handler_runs_once_per_call(agent: AgentProcess, config: Path, path: str, keyed: bool) -> None:
    """A plain exception is handler_failed, with its class and an error id; the handler ran exactly once."""
    call = _call()
    key = f"k-{call}" if keyed else None
    async with PATHS[path](config) as client:
        response = await client.reach("crash", {"call": call}, idempotency_key=key, timeout_ms=10_000)
        replayed = await client.reach("crash", {"call": call}, idempotency_key=key, timeout_ms=10_000) if key else None
    assert response.status == "fail" and response.error is not None, response
    assert response.error.type == HandlerFailed.code, response.error
    assert "RuntimeError" in response.error.message and "PaSsWoRd" not in response.error.message
    error = _raised(response)
    assert type(error) is HandlerFailed and not is_retryable(error)
    assert error.error_id is not None and len(error.error_id) == 16
    if replayed is not None:  # the key keeps the failure: its replay answers it again, nothing runs
        assert replayed.error is not None and replayed.error.message == response.error.message
    assert agent.count("crash", call) == 1


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_a_stream_whose_handler_raised_is_one_run_and_an_error_event(
    agent: AgentProcess, config: Path, path: str
) -> None:
    """A streaming handler raising before its first event ends the stream with handler_failed; it is not re-opened."""
    call = _call()
    async with PATHS[path](config) as client:
        events = [event async for event in client.stream("crash_stream", {"call": call}, timeout_ms=10_000)]
    assert [event.kind for event in events] == ["error"]
    assert events[0].error is not None and events[0].error.type == HandlerFailed.code, events[0].error
    assert agent.count("crash_stream", call) == 1


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
async def test_a_retryable_handler_is_retried_per_policy(
    agent: AgentProcess, config: Path, path: str, keyed: bool
) -> None:
    """``raise Retryable(...)`` is retried like a transient fault: max_attempts runs, then handler_retryable."""
    call = _call()
    key = f"k-{call}" if keyed else None
    async with PATHS[path](config) as client:
        response = await client.reach("flaky", {"call": call}, idempotency_key=key, timeout_ms=10_000)
    assert response.status == "fail" and response.error is not None
    assert response.error.type == Retryable.code and "inventory busy" in response.error.message, response.error
    error = _raised(response)
    assert type(error) is Retryable and is_retryable(error)
    assert agent.count("flaky", call) == ATTEMPTS


async def _a2a_client(agent: AgentProcess) -> ReachClient:
    registry = MemoryRegistry()
    descriptor = AgentDescriptor(
        name="orders",
        protocol="a2a",
        endpoints=[agent.url],
        capabilities=CAPABILITIES,
        retry=RetryPolicy.model_validate(FAST_RETRY),
    )
    await registry.register_agent(descriptor)
    return ReachClient(registry=registry, transport=DirectTransport())


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed"])
async def test_the_a2a_face_answers_a_raising_handler_as_a_failed_task_run_once(
    agent: AgentProcess, keyed: bool
) -> None:
    """Through the agent's A2A face a handler that raised is a failed task naming the error id, never re-sent."""
    call = _call()
    async with await _a2a_client(agent) as client:
        key = f"k-{call}" if keyed else None
        response = await client.reach("crash", {"call": call}, idempotency_key=key, timeout_ms=10_000)
    assert response.status == "fail" and response.error is not None
    assert "error id" in response.error.message and "PaSsWoRd" not in response.error.message
    assert not is_retryable(_raised(response))
    assert agent.count("crash", call) == 1


async def test_the_a2a_face_retries_a_retryable_handler_as_every_path_does(agent: AgentProcess) -> None:
    """The failed task names the handler's ``Retryable`` (status-message metadata), so the client re-sends it per
    policy, keyed or not, as on the direct paths."""
    keyed, unkeyed = _call(), _call()
    async with await _a2a_client(agent) as client:
        await client.reach("flaky", {"call": keyed}, idempotency_key=f"k-{keyed}", timeout_ms=10_000)
        await client.reach("flaky", {"call": unkeyed}, timeout_ms=10_000)
    assert (agent.count("flaky", keyed), agent.count("flaky", unkeyed)) == (ATTEMPTS, ATTEMPTS)


def _mcp_call(url: str, capability: str, call: str) -> dict[str, Any]:
    """One ``tools/call`` at the gateway's ``/mcp`` as a plain MCP client sends it; the JSON-RPC result."""
    headers = {"Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}", "Accept": "application/json, text/event-stream"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    opened = httpx.post(f"{url}/mcp", json=init, headers=headers, timeout=10)
    session = {**headers, "Mcp-Session-Id": opened.headers["mcp-session-id"]}
    body = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": capability, "arguments": {"call": call}},
    }
    answer = httpx.post(f"{url}/mcp", json=body, headers=session, timeout=30)
    said = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ") and line[6:].strip()]
    result: dict[str, Any] = json.loads(said[-1])["result"]  # an SSE response stream: its result is the last event
    return result


def test_the_mcp_face_runs_a_raising_handler_once_and_retries_a_retryable_one(
    agent: AgentProcess, config: Path
) -> None:
    """Through the gateway's /mcp a handler that raised is one run and a tool error naming the error id."""
    crash, flaky = _call(), _call()
    with BackgroundServer(create_app(config, environ=TOKENS), proxy_headers=False) as server:
        crashed = _mcp_call(server.url, "crash", crash)
        _mcp_call(server.url, "flaky", flaky)
    text = crashed["content"][0]["text"]
    assert crashed["isError"] is True and "error id" in text and "PaSsWoRd" not in text, crashed
    assert (agent.count("crash", crash), agent.count("flaky", flaky)) == (1, ATTEMPTS)


@tool
def crash(call: str) -> str:
    """Look up the ledger (the agent serves it)."""
    raise AssertionError("the local tool is never run: the agent serves it")


@tool
def flaky(call: str) -> str:
    """Check the inventory (the agent serves it)."""
    raise AssertionError("the local tool is never run: the agent serves it")


MIDDLEWARE_RETRIES = 2
"""The recipe's ``ToolRetryMiddleware(max_retries=2)``: three tries of the tool per call."""


async def _recipe_run(agent: AgentProcess, tmp_path: Path, tool_name: str, call: str) -> str:
    """One run of a LangGraph agent built by the README's recipe, the core at its default retry; the tool's text."""
    body = {"name": "orders", "endpoints": [agent.url], "capabilities": CAPABILITIES, "retry": FAST_RETRY}
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump({"agents": [body]}))
    rules = [Rule(r"(\w+) (\w+)", tool_name, lambda match: {"call": match.group(2)})]
    middleware = [
        ToolErrorMiddleware(on_error=reach_error_message),
        ToolRetryMiddleware(
            max_retries=MIDDLEWARE_RETRIES, retry_on=is_retryable, on_failure="error", initial_delay=0.01
        ),
    ]
    async with ReachEnhancer(registry=f"file://{config}", on_error="raise") as enhancer:
        desk = create_agent(ScriptedChatModel(rules=rules), [crash, flaky], middleware=middleware, enhanced_by=enhancer)
        state = await desk.ainvoke({"messages": [("user", f"{tool_name} {call}")]})
    return str(state["messages"][-2].content)


async def test_the_langchain_retry_recipe_runs_a_raising_handler_once(agent: AgentProcess, tmp_path: Path) -> None:
    """on_error="raise" + ToolRetryMiddleware(retry_on=is_retryable): a plain exception is one run (main: 9)."""
    call = _call()
    text = await _recipe_run(agent, tmp_path, "crash", call)
    assert "error id" in text and "PaSsWoRd" not in text, text
    assert agent.count("crash", call) == 1


async def test_the_langchain_retry_recipe_retries_a_retryable_handler(agent: AgentProcess, tmp_path: Path) -> None:
    """The recipe's retry_on retries what the handler marked Retryable: every middleware try, each per the core."""
    call = _call()
    text = await _recipe_run(agent, tmp_path, "flaky", call)
    assert "inventory busy" in text, text
    assert agent.count("flaky", call) == ATTEMPTS * (1 + MIDDLEWARE_RETRIES)


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (HandlerFailed("'crash' failed (RuntimeError); error id 0123456789abcdef", "0123456789abcdef"), False),
        (Retryable("inventory busy"), True),
    ],
)
def test_is_retryable_follows_the_handlers_mark(error: Exception, retryable: bool) -> None:
    """errors.is_retryable: a handler that raised is final, unless it raised Retryable."""
    assert is_retryable(error) is retryable


async def test_a_handler_that_raised_after_a_lost_answer_ends_as_its_failure_not_outcome_unknown() -> None:
    """Keyed: the first answer is lost (pinned there), the retry's answer is handler_failed: that is the call's end."""
    registry = MemoryRegistry()
    await registry.register_agent(
        AgentDescriptor.model_validate(
            {"name": "orders", "endpoints": ["http://127.0.0.1:9"], "capabilities": ["crash"], "retry": FAST_RETRY}
        )
    )
    failure = ErrorInfo(type=HandlerFailed.code, message="'crash' failed (RuntimeError); error id 0123456789abcdef")
    script: list[Callable[[], Reply]] = [lambda: _lost(), lambda: Reply("fail", error=failure, status_code=500)]

    def answer(call: Call) -> Reply:
        return script.pop(0)()

    transport = MockTransport(answer)
    async with ReachClient(registry, transport, clock=FakeClock()) as client:
        response = await client.reach("crash", {"call": "c"}, idempotency_key="k-1", timeout_ms=10_000)
    assert len(transport.calls) == 2 and response.error is not None
    assert response.error.type == HandlerFailed.code, response.error


def _lost() -> Reply:
    raise ConnectionLost("reset after the request was written")


async def test_a_handlers_own_timeout_is_a_handler_failure_the_callers_deadline_is_not() -> None:
    """A TimeoutError the handler raised itself is handler_failed; the caller's deadline passing stays a timeout."""
    served = ReachAgent("clock", tokens="open")

    @served.capability("own_timeout")
    async def own_timeout() -> None:
        raise TimeoutError("the carrier API timed out")

    @served.capability("own_stream")
    async def own_stream() -> AsyncIterator[int]:
        raise TimeoutError("the carrier API timed out")
        yield 0

    @served.capability("slow")
    async def slow() -> None:
        await asyncio.Event().wait()

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=served.app), base_url="http://127.0.0.1") as http:
        own = await http.post("/reach", json={"request_id": "r1", "capability": "own_timeout", "payload": {}})
        late = await http.post(
            "/reach", json={"request_id": "r2", "capability": "slow", "payload": {}}, headers={"X-Reach-Deadline": "50"}
        )
        streamed = await http.post(
            "/reach/stream", json={"request_id": "r3", "capability": "own_stream", "payload": {}}
        )
    assert (own.status_code, own.json()["error"]["type"]) == (500, HandlerFailed.code)
    assert late.json()["error"]["type"] == "timeout"
    assert f'"type":"{HandlerFailed.code}"' in streamed.text, streamed.text


@pytest.mark.parametrize(
    "raised",
    [Backpressure("the ledger agent is busy", retry_after=1.0), NoHealthyAgent("no ledger agent is healthy")],
    ids=["backpressure", "no-healthy-agent"],
)
async def test_a_transient_error_of_the_handlers_own_reach_is_its_failure(raised: ReachError) -> None:
    """A handler that ran and re-raised its own reach's transient error answers handler_failed, never "not executed"."""
    served = ReachAgent("chain", tokens="open")

    @served.capability("forward")
    async def forward() -> None:
        raise raised

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=served.app), base_url="http://127.0.0.1") as http:
        answer = await http.post("/reach", json={"request_id": "r1", "capability": "forward", "payload": {}})
    assert (answer.status_code, answer.json()["error"]["type"]) == (500, HandlerFailed.code)
    assert type(raised).__name__ in answer.json()["error"]["message"]
