"""Served frameworks verify tokens as ``ReachAgent`` does (DESIGN.md 11.4): ``serve_graph``, ``serve_langgraph`` and
``serve_llamaindex`` take ``tokens=`` (a verifier of your issuer; by default this process's issuer; ``"open"``, the
named development mode that warns).

Real LangGraph graphs and a real LlamaIndex ``FunctionAgent`` under uvicorn: in a thread (``serve_graph``) or in a
process of their own (the foreground ``serve_*``).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from hop_support import free_port, until_true
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from servers import interrupt

from reach_plugins import ReachClient, ReachEnhancer
from reach_plugins.agent import ServedAgent, serve_graph
from reach_plugins.frameworks.toolcalls import ServeSpec
from reach_plugins.langchain import create_agent
from reach_plugins.registry import MemoryRegistry
from reach_plugins.security import KeyRing, SigningKey, TokenIssuer
from reach_plugins.security.source import default_issuer
from transports.direct import DirectTransport


def echo_graph(ran: list[str]) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A graph answering each turn with its text, recording every turn it ran."""

    def reply(state: MessagesState) -> dict[str, Any]:
        said = str(state["messages"][-1].content)
        ran.append(said)
        return {"messages": [AIMessage(content=f"heard: {said}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    return builder.compile(checkpointer=InMemorySaver())


def chat(url: str, token: str | None) -> httpx.Response:
    """One ``chat`` call to the agent at ``url``, with ``token`` as its ``X-Reach-Token`` (or none)."""
    body = {"capability": "chat", "payload": {"input": "hello"}, "tenant": "acme"}
    return httpx.post(f"{url}/reach", json=body, headers={"X-Reach-Token": token} if token else {}, timeout=10)


@contextmanager
def served(graph: Any, registry: MemoryRegistry, **options: Any) -> Iterator[ServedAgent]:
    agent = serve_graph(graph, "helper", ["chat"], registry=registry, **options)
    try:
        yield agent
    finally:
        agent.stop()


async def test_a_served_graph_refuses_a_call_without_a_token_by_default() -> None:
    """serve_graph with every default: a token-less call is 401 and the graph never runs; a client of this process
    (tokens of its in-process issuer) is served."""
    ran: list[str] = []
    registry = MemoryRegistry()
    with served(echo_graph(ran), registry) as agent:
        bare = chat(agent.url, None)
        async with ReachClient(registry, DirectTransport(), tenant="acme") as client:
            reply = await client.reach("chat", {"input": "hello"})
    assert bare.status_code == 401 and bare.json()["error"]["type"] == "invalid_token"
    assert reply.ok and reply.data["reply_content"] == "heard: hello"
    assert ran == ["hello"]


def test_a_served_graph_takes_the_tokens_its_verifier_accepts() -> None:
    """serve_graph(tokens=verifier): a token of that issuer is served as its tenant; no token, or one of this
    process's default issuer (which a default agent would take), is 401 and the graph never runs."""
    ran: list[str] = []
    issuer = TokenIssuer(KeyRing([SigningKey.generate()]))
    with served(echo_graph(ran), MemoryRegistry(), tokens=issuer.verifier()) as agent:
        bare = chat(agent.url, None)
        foreign = chat(agent.url, default_issuer().for_tenant("acme", "helper").token)
        valid = chat(agent.url, issuer.for_tenant("acme", "helper").token)
    for refused in (bare, foreign):
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "invalid_token"
    assert valid.status_code == 200 and valid.json()["data"]["reply_content"] == "heard: hello"
    assert ran == ["hello"]


def test_a_graph_served_open_takes_calls_without_tokens_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    """serve_graph(tokens="open"), the named development mode: a token-less call is served, with a warning."""
    ran: list[str] = []
    warnings = caplog.at_level(logging.WARNING, logger="reach_plugins.agent")
    with warnings, served(echo_graph(ran), MemoryRegistry(), tokens="open") as agent:
        answer = chat(agent.url, None)
    assert answer.status_code == 200 and ran == ["hello"]
    assert any("runs OPEN" in record.getMessage() for record in caplog.records)


class ScriptedModel(GenericFakeChatModel):
    """A fake chat model that accepts tools (langchain_core's fakes refuse bind_tools)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(**kwargs)


def test_an_auto_registered_agent_takes_the_tokens_its_serve_spec_names() -> None:
    """create_agent(..., enhanced_by=ReachEnhancer(auto_register=True, serve_as=ServeSpec(tokens=verifier))): the
    served graph takes that issuer's token and refuses a token of this process's default issuer (401)."""
    issuer = TokenIssuer(KeyRing([SigningKey.generate()]))
    registry = MemoryRegistry()
    spec = ServeSpec("helper", ["chat"], tokens=issuer.verifier())
    llm = ScriptedModel(messages=iter(["heard: hello"]))
    with ReachEnhancer(
        registry=registry, transport=DirectTransport(), auto_register=True, serve_as=spec
    ) as enhancer:
        create_agent(llm, [], enhanced_by=enhancer)
        [instance] = registry.instances("helper").values()
        foreign = chat(instance.endpoint, default_issuer().for_tenant("acme", "helper").token)
        valid = chat(instance.endpoint, issuer.for_tenant("acme", "helper").token)
    assert foreign.status_code == 401 and foreign.json()["error"]["type"] == "invalid_token"
    assert valid.status_code == 200 and valid.json()["data"]["reply_content"] == "heard: hello"


_FOREGROUND = textwrap.dedent(
    """
    import sys
    from reach_plugins.security import KeyRing, TokenIssuer

    framework, port, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    verifier = TokenIssuer(KeyRing.load([key])).verifier()
    if framework == "langgraph":
        from langchain_core.messages import AIMessage
        from langgraph.graph import START, MessagesState, StateGraph
        from reach_plugins.agent import serve_langgraph

        builder = StateGraph(MessagesState)
        builder.add_node("reply", lambda state: {"messages": [AIMessage(content="heard: hello")]})
        builder.add_edge(START, "reply")
        serve_langgraph(builder.compile(), "helper", port=port, tokens=verifier)
    else:
        from llama_index.core.agent.workflow import FunctionAgent
        from llama_index.core.llms import ChatMessage
        from llama_index.core.llms.mock import MockFunctionCallingLLM
        from reach_plugins.agent.llamaindex import serve_llamaindex

        answer = ChatMessage(role="assistant", content="heard: hello")
        llm = MockFunctionCallingLLM(response_generator=lambda messages, **_: answer)
        serve_llamaindex(FunctionAgent(tools=[], llm=llm), "helper", port=port, tokens=verifier)
    """
)


async def _healthy(url: str, process: subprocess.Popen[bytes], errors: Path) -> bool:
    assert process.poll() is None, errors.read_text()
    try:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"{url}/healthz", timeout=0.5)).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.parametrize("framework", ["langgraph", "llamaindex"])
async def test_serve_in_the_foreground_with_tokens(tmp_path: Path, framework: str) -> None:
    """serve_langgraph / serve_llamaindex(tokens=verifier) in a process of their own: a token of that issuer is
    served; no token, or one of the fleet's default keys ($REACH_ISSUER_KEYS, which a default agent takes), is 401."""
    key = tmp_path / "issuer.pem"
    key.write_bytes(SigningKey.generate().pem())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    errors = tmp_path / "agent.err"
    with errors.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", _FOREGROUND, framework, str(port), str(key)], env=dict(os.environ), stderr=stderr
        )
    try:
        await until_true(lambda: _healthy(url, process, errors), within=60)
        bare = chat(url, None)
        fleet = chat(url, default_issuer().for_tenant("acme", "helper").token)
        valid = chat(url, TokenIssuer(KeyRing.load([key])).for_tenant("acme", "helper").token)
    finally:
        interrupt(process)
    for refused in (bare, fleet):
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "invalid_token"
    assert valid.status_code == 200, valid.text
    assert valid.json()["data"]["reply_content"] == "heard: hello"
