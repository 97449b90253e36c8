"""Tenant-scoped state on real servers: sessions, closes and pins; a served LangGraph thread; A2A tasks; MCP sessions.

Two tenants name the same conversation (``conv-1``) or the same thread (``1``): each gets its own state. Agents
run under uvicorn on 127.0.0.1; the tenant comes from a token the agent verifies (an ``X-Tenant`` header would
be a claim, not a fact); the shared session store is the real test Redis.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from hop_support import write_config
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph

from reach_plugins import AgentDescriptor, ReachClient
from reach_plugins.agent import BackgroundServer, ReachAgent, ReachContext, add_langgraph
from reach_plugins.errors import SessionClosed
from reach_plugins.gateway import create_app
from reach_plugins.registry import MemoryRegistry
from reach_plugins.security import HEADER_TOKEN, KeyRing, SigningKey, TokenIssuer
from reach_plugins.stores.budget import DEFAULT_BUDGET
from reach_plugins.stores.keys import SEP
from reach_plugins.stores.redis_sessions import RedisSessions
from reach_plugins.stores.sessions import MemorySessions, SessionStore
from transports.direct import DirectTransport

WITHIN = 10.0
"""Seconds any awaited condition of these tests may take."""


class Holding:
    """An agent whose ``hold`` calls wait until released, recording (tenant, session) as they start and finish."""

    def __init__(self) -> None:
        self.started: list[tuple[str | None, str | None]] = []
        self.finished: list[tuple[str | None, str | None]] = []
        self.release = threading.Event()
        self.agent = ReachAgent("holder")

        @self.agent.capability("hold")
        async def hold(ctx: ReachContext) -> dict[str, Any]:
            self.started.append((ctx.tenant, ctx.session_id))
            await asyncio.to_thread(self.release.wait, WITHIN)
            self.finished.append((ctx.tenant, ctx.session_id))
            return {"tenant": ctx.tenant}


@pytest.fixture
def holding() -> Iterator[tuple[Holding, MemoryRegistry]]:
    served = Holding()
    with BackgroundServer(served.agent.app) as server:
        registry = MemoryRegistry()
        registry.put_agent(AgentDescriptor(name="holder", endpoints=[server.url], capabilities=["hold"]))
        yield served, registry
        served.release.set()


@pytest.fixture(params=["memory", "redis"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[tuple[SessionStore, SessionStore, str]]:
    """Two session stores as two processes would hold them (the same one in memory), and the Redis prefix."""
    if request.param == "memory":
        store = MemorySessions(budget=DEFAULT_BUDGET)
        yield store, store, ""
        return
    prefix = f"tenant-scope-{uuid.uuid4().hex[:8]}:"
    url = request.getfixturevalue("redis_url")
    first = RedisSessions(aioredis.Redis.from_url(url), prefix=prefix, owns_client=True)
    second = RedisSessions(aioredis.Redis.from_url(url), prefix=prefix, owns_client=True)
    yield first, second, prefix
    await first.aclose()
    await second.aclose()


async def until(condition: Any, what: str) -> None:
    """Poll ``condition`` until it holds, failing with ``what`` after :data:`WITHIN` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + WITHIN
    while not condition():
        assert loop.time() < end, f"not reached within {WITHIN}s: {what}"
        await asyncio.sleep(0.01)


async def test_a_tenant_closing_its_conversation_leaves_anothers_of_the_same_id_running(
    holding: tuple[Holding, MemoryRegistry], stores: tuple[SessionStore, SessionStore, str], redis_url: str
) -> None:
    """acme closes its conv-1 (from another process's store when shared): beta's in-flight call on its own conv-1
    runs to its answer, beta may go on; acme's conv-1 is closed; beta's other conversation closed after it is
    cancelled, which proves beta's process heard the closes in order."""
    served, registry = holding
    acme_side, beta_side, prefix = stores
    acme = ReachClient(registry, DirectTransport(), sessions=acme_side, tenant="acme")
    beta = ReachClient(registry, DirectTransport(), sessions=beta_side, tenant="beta")
    kept = asyncio.create_task(beta.reach("hold", {}, session_id="conv-1"))
    witness = asyncio.create_task(beta.reach("hold", {}, session_id="conv-2"))
    await until(lambda: len(served.started) == 2, "both beta calls running")

    await acme.close_session("conv-1")
    await acme.close_session("conv-2", tenant="beta")
    with pytest.raises(SessionClosed):
        await asyncio.wait_for(witness, WITHIN)
    assert not kept.done()
    served.release.set()
    answer = await asyncio.wait_for(kept, WITHIN)
    assert answer.ok and answer.data == {"tenant": "beta"}
    assert (await beta.reach("hold", {}, session_id="conv-1")).ok
    with pytest.raises(SessionClosed):
        await acme.reach("hold", {}, session_id="conv-1")
    if prefix:
        redis = aioredis.Redis.from_url(redis_url)
        keys = {key.decode() for key in await redis.keys(f"{prefix}*")}
        await redis.aclose()
        assert f"{prefix}acme{SEP}session{SEP}conv-1" in keys and f"{prefix}beta{SEP}session{SEP}conv-1" in keys
        assert f"{prefix}beta{SEP}pin{SEP}conv-1" in keys and f"{prefix}acme{SEP}pin{SEP}conv-1" not in keys
    await acme.aclose()
    await beta.aclose()


@pytest.fixture
def issuer() -> TokenIssuer:
    return TokenIssuer(KeyRing([SigningKey.generate()]), issuer="reach")


def said(state: MessagesState) -> dict[str, Any]:
    """Repeat every user message of the thread so far."""
    history = [str(message.content) for message in state["messages"] if message.type == "human"]
    return {"messages": [AIMessage(content=" | ".join(history))]}


def test_two_tenants_on_thread_1_of_a_served_graph_get_separate_histories(issuer: TokenIssuer) -> None:
    """acme and globex both chat on thread "1" of one served LangGraph graph: each thread holds its own turns."""
    builder = StateGraph(MessagesState)
    builder.add_node("said", said)
    builder.add_edge(START, "said")
    agent = ReachAgent("assistant", tokens=issuer.verifier())
    add_langgraph(agent, builder.compile(checkpointer=InMemorySaver()))

    def chat(url: str, tenant: str, text: str) -> str:
        token = issuer.for_tenant(tenant, "assistant").token
        body = {"request_id": "r", "capability": "chat", "payload": {"input": text}, "session_id": "1"}
        answer = httpx.post(f"{url}/reach", json=body, headers={HEADER_TOKEN: token}, timeout=WITHIN).json()
        content: str = answer["data"]["reply_content"]
        return content

    with BackgroundServer(agent.app) as server:
        assert chat(server.url, "acme", "I am acme") == "I am acme"
        assert chat(server.url, "globex", "I am globex") == "I am globex"
        assert chat(server.url, "acme", "again") == "I am acme | again"
        assert chat(server.url, "globex", "again") == "I am globex | again"


@pytest.mark.parametrize(
    ("dialect", "send", "get"), [("1.0", "SendMessage", "GetTask"), ("0.3", "message/send", "tasks/get")]
)
def test_an_a2a_task_is_read_only_by_the_tenant_that_created_it(
    issuer: TokenIssuer, dialect: str, send: str, get: str
) -> None:
    """acme's finished task: acme reads it back; globex (its own valid token) and a caller without a token do not."""
    agent = ReachAgent("kb", tokens=issuer.verifier())

    @agent.capability("search_kb")
    def search_kb(query: str) -> dict[str, Any]:
        return {"reply_content": f"found {query} for you"}

    def rpc(url: str, method: str, params: dict[str, Any], tenant: str | None) -> httpx.Response:
        headers = {"A2A-Version": dialect}
        if tenant is not None:
            headers[HEADER_TOKEN] = issuer.for_tenant(tenant, "kb").token
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        return httpx.post(f"{url}/a2a", json=body, headers=headers, timeout=WITHIN)

    part = {"text": "refunds"} if dialect == "1.0" else {"kind": "text", "text": "refunds"}
    message = {"messageId": "m-1", "role": "ROLE_USER" if dialect == "1.0" else "user", "parts": [part]}
    with BackgroundServer(agent.app) as server:
        sent = rpc(server.url, send, {"message": message}, "acme").json()["result"]
        task_id = (sent.get("task") or sent)["id"]
        mine = rpc(server.url, get, {"id": task_id}, "acme").json()
        assert "found refunds for you" in str(mine["result"])
        theirs = rpc(server.url, get, {"id": task_id}, "globex").json()
        assert theirs["error"]["code"] == -32001 and "result" not in theirs
        anonymous = rpc(server.url, get, {"id": task_id}, None)
        assert anonymous.status_code == 401 and "found refunds" not in anonymous.text


def test_an_mcp_session_belongs_to_the_tenant_that_opened_it(tmp_path: Path) -> None:
    """demo's MCP session id, presented by acme (its own valid bearer), is unknown (404) for reading and for
    ending it; demo's session keeps working until demo ends it."""
    tenants = {
        name: {"token_env": f"{name.upper()}_TOKEN", "agents": ["*"], "networks": ["127.0.0.0/8"]}
        for name in ("demo", "acme")
    }
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, tenants)
    environ = {"DEMO_TOKEN": "tok-demo", "ACME_TOKEN": "tok-acme"}

    def mcp(url: str, token: str, session: str | None, method: str = "tools/list") -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        if session is not None:
            headers["Mcp-Session-Id"] = session
        if method == "DELETE":
            return httpx.delete(f"{url}/mcp", headers=headers, timeout=WITHIN)
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"protocolVersion": "2025-06-18"}}
        return httpx.post(f"{url}/mcp", json=body, headers=headers, timeout=WITHIN)

    with BackgroundServer(create_app(config, environ=environ), proxy_headers=False) as server:
        session = mcp(server.url, "tok-demo", None, "initialize").headers["Mcp-Session-Id"]
        assert mcp(server.url, "tok-demo", session).status_code == 200
        assert mcp(server.url, "tok-acme", session).status_code == 404
        assert mcp(server.url, "tok-acme", session, "DELETE").status_code == 404
        assert mcp(server.url, "tok-demo", session).status_code == 200
        assert mcp(server.url, "tok-demo", session, "DELETE").status_code == 200
        assert mcp(server.url, "tok-demo", session).status_code == 404
