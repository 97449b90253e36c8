"""The calls behind each cassette: ``record.py`` makes them against live servers, ``test_adapters_vcr.py`` replays them.

Each scenario is one call (or stream) through DirectTransport's httpx engine.
Cassettes are stored under one host name, :data:`HOST`, whatever port the
recording server had, so a replay needs no server and no free port. A replay
matches on method, URL and JSON body: a change in how an adapter builds its
request fails loudly instead of replaying a stale answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import vcr  # type: ignore[import-untyped]
from vcr.request import Request  # type: ignore[import-untyped]

from reach_plugins.model import AgentDescriptor, ReachRequest
from reach_plugins.transport import Call, Credential

HOST = "http://127.0.0.1:9"
"""The host every cassette is stored under."""
FOLDER = Path(__file__).parent
_LOCAL = re.compile(r"^http://127\.0\.0\.1:\d+")
_LOCAL_ANYWHERE = re.compile(r"http://127\.0\.0\.1:\d+")
_VOLATILE_HEADERS = ("date", "server")


def _stable_request(request: Request) -> Request:
    request.uri = _LOCAL.sub(HOST, request.uri)
    return request


def _stable_response(response: dict[str, Any]) -> dict[str, Any]:
    """Drop volatile headers; the server's own address in a body (an A2A card's URLs) becomes :data:`HOST`."""
    headers = response["headers"]
    for name in [name for name in headers if name.lower() in _VOLATILE_HEADERS]:
        del headers[name]
    body = response["body"].get("string")
    if isinstance(body, bytes):
        response["body"]["string"] = _LOCAL_ANYWHERE.sub(HOST, body.decode()).encode()
    elif isinstance(body, str):
        response["body"]["string"] = _LOCAL_ANYWHERE.sub(HOST, body)
    return response


def cassettes(record_mode: Literal["all", "none"]) -> vcr.VCR:
    """The VCR both sides use: ``"all"`` records (record.py), ``"none"`` only replays (the tests)."""
    return vcr.VCR(
        cassette_library_dir=str(FOLDER),
        record_mode=record_mode,
        match_on=["method", "scheme", "host", "port", "path", "query", "body"],
        filter_headers=["authorization", "host"],
        before_record_request=_stable_request,
        before_record_response=_stable_response,
        decode_compressed_response=True,
    )


def openai_agent(endpoint: str) -> AgentDescriptor:
    return AgentDescriptor(
        name="assistant",
        protocol="openai-compatible",
        endpoints=[f"{endpoint}/v1"],
        capabilities=["chat"],
        protocol_options={"model": "fake-gpt-4"},
    )


def raw_agent(endpoint: str, **options: Any) -> AgentDescriptor:
    """The seeds' private agent: the answer is wrapped as ``{"code": 0, "data": {"message": ..., ...}}``."""
    settings = {
        "path": "/api/chat",
        "request_template": {"question": "${payload.query}", "uid": "${request.session_id}"},
        "response_mapping": {"reply_content": "data.message.content"},
        "success_path": "code",
        "error_path": "msg",
        **options,
    }
    return AgentDescriptor(
        name="private", protocol="raw-http", endpoints=[endpoint], capabilities=["ask"], protocol_options=settings
    )


def a2a_agent(endpoint: str) -> AgentDescriptor:
    """The a2a peer's plain 1.x agent (its card has supportedInterfaces and no url)."""
    return AgentDescriptor(name="kb", protocol="a2a", endpoints=[f"{endpoint}/v1only"], capabilities=["search_kb"])


def reach_agent(endpoint: str) -> AgentDescriptor:
    return AgentDescriptor(name="kb", protocol="reach", endpoints=[endpoint], capabilities=["search_kb"])


OPENAI_KEY = Credential(type="bearer", value="sk-test")


@dataclass(frozen=True, slots=True)
class Scenario:
    """One recorded call: which server answers it, the agent as the client sees it, and what is sent."""

    name: str
    server: Literal["fake", "reach", "openai", "a2a"]
    """``openai`` / ``a2a``: the real peers of tests/peers (built with the ``openai`` models, ``a2a-sdk`` 1.x);
    ``fake``: the app of test_direct_adapters (raw-http, and openai failures the peer does not make);
    ``reach``: a ReachAgent."""
    agent: Callable[[str], AgentDescriptor]
    capability: str
    payload: dict[str, Any]
    credential: Credential = field(default_factory=Credential)
    stream: bool = False
    session_id: str = "s-42"
    """A task left waiting (input-required) is continued by its session's next call: such a scenario has its own."""

    @property
    def cassette(self) -> str:
        return f"{self.name}.yaml"

    def call(self, endpoint: str = HOST, *, agent: AgentDescriptor | None = None) -> Call:
        """The call, to ``endpoint`` (the recording server, or :data:`HOST` in a replay); ``agent`` replaces the
        descriptor, e.g. to parse a recorded reply with another ``response_mapping`` or ``return_schema``."""
        descriptor = agent or self.agent(endpoint)
        request = ReachRequest(
            request_id=f"vcr-{self.name}", capability=self.capability, payload=self.payload, session_id=self.session_id
        )
        return Call(
            request=request,
            agent=descriptor,
            instance=descriptor.static_instances()[0],
            timeout=3.0,
            credential=self.credential,
        )


SCENARIOS = {
    scenario.name: scenario
    for scenario in (
        Scenario("openai_reply", "openai", openai_agent, "chat", {"input": "hi"}, OPENAI_KEY),
        Scenario(
            "openai_tool_call",
            "openai",
            openai_agent,
            "chat",
            {"messages": [{"role": "user", "content": "tool please"}], "parallel_tool_calls": False},
            OPENAI_KEY,
        ),
        Scenario("openai_refusal", "openai", openai_agent, "chat", {"input": "refuse"}, OPENAI_KEY),
        Scenario("openai_renamed_field", "fake", openai_agent, "chat", {"input": "upgrade"}, OPENAI_KEY),
        Scenario("openai_bad_key", "fake", openai_agent, "chat", {"input": "hi"}),
        Scenario("openai_stream", "openai", openai_agent, "chat", {"input": "one two three"}, OPENAI_KEY, stream=True),
        Scenario("openai_stream_tool_call", "openai", openai_agent, "chat", {"input": "tool"}, OPENAI_KEY, stream=True),
        Scenario("openai_stream_refusal", "openai", openai_agent, "chat", {"input": "refuse"}, OPENAI_KEY, stream=True),
        Scenario("raw_http_reply", "fake", raw_agent, "ask", {"query": "where is A1"}),
        Scenario("raw_http_business_code", "fake", raw_agent, "ask", {"query": "unknown order"}),
        Scenario("a2a_task", "a2a", a2a_agent, "search_kb", {"query": "refunds", "lang": "en"}),
        Scenario("a2a_failed_task", "a2a", a2a_agent, "search_kb", {"query": "refuse"}),
        Scenario("a2a_input_required", "a2a", a2a_agent, "search_kb", {"query": "ask"}, session_id="s-ask"),
        Scenario("a2a_stream", "a2a", a2a_agent, "search_kb", {"query": "alpha beta"}, stream=True),
        Scenario("a2a_status_stream", "a2a", a2a_agent, "search_kb", {"query": "status only"}, stream=True),
        Scenario("reach_reply", "reach", reach_agent, "search_kb", {"query": "refunds"}),
        Scenario("reach_business_error", "reach", reach_agent, "search_kb", {"query": ""}),
    )
}
