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

HOST = "http://agent.test"
"""The host every cassette is stored under."""
FOLDER = Path(__file__).parent
_LOCAL = re.compile(r"^http://127\.0\.0\.1:\d+")
_VOLATILE_HEADERS = ("date", "server")


def _stable_request(request: Request) -> Request:
    request.uri = _LOCAL.sub(HOST, request.uri)
    return request


def _stable_response(response: dict[str, Any]) -> dict[str, Any]:
    headers = response["headers"]
    for name in [name for name in headers if name.lower() in _VOLATILE_HEADERS]:
        del headers[name]
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
    return AgentDescriptor(name="kb", protocol="a2a", endpoints=[endpoint], capabilities=["search_kb"])


def reach_agent(endpoint: str) -> AgentDescriptor:
    return AgentDescriptor(name="kb", protocol="reach", endpoints=[endpoint], capabilities=["search_kb"])


OPENAI_KEY = Credential(type="bearer", value="sk-test")


@dataclass(frozen=True, slots=True)
class Scenario:
    """One recorded call: which server answers it, the agent as the client sees it, and what is sent."""

    name: str
    server: Literal["fake", "reach"]
    """``fake``: the openai / raw-http / a2a app of test_direct_adapters; ``reach``: a ReachAgent."""
    agent: Callable[[str], AgentDescriptor]
    capability: str
    payload: dict[str, Any]
    credential: Credential = field(default_factory=Credential)
    stream: bool = False

    @property
    def cassette(self) -> str:
        return f"{self.name}.yaml"

    def call(self, endpoint: str = HOST, *, agent: AgentDescriptor | None = None) -> Call:
        """The call, to ``endpoint`` (the recording server, or :data:`HOST` in a replay); ``agent`` replaces the
        descriptor, e.g. to parse a recorded reply with another ``response_mapping`` or ``return_schema``."""
        descriptor = agent or self.agent(endpoint)
        request = ReachRequest(
            request_id=f"vcr-{self.name}", capability=self.capability, payload=self.payload, session_id="s-42"
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
        Scenario("openai_reply", "fake", openai_agent, "chat", {"input": "hi"}, OPENAI_KEY),
        Scenario(
            "openai_tool_call",
            "fake",
            openai_agent,
            "chat",
            {"messages": [{"role": "user", "content": "use a tool"}]},
            OPENAI_KEY,
        ),
        Scenario("openai_renamed_field", "fake", openai_agent, "chat", {"input": "upgrade"}, OPENAI_KEY),
        Scenario("openai_bad_key", "fake", openai_agent, "chat", {"input": "hi"}),
        Scenario("openai_stream", "fake", openai_agent, "chat", {"input": "one two three"}, OPENAI_KEY, stream=True),
        Scenario("raw_http_reply", "fake", raw_agent, "ask", {"query": "where is A1"}),
        Scenario("raw_http_business_code", "fake", raw_agent, "ask", {"query": "unknown order"}),
        Scenario("a2a_task", "fake", a2a_agent, "search_kb", {"query": "refunds"}),
        Scenario("a2a_failed_task", "fake", a2a_agent, "search_kb", {"query": "fail"}),
        Scenario("a2a_stream", "fake", a2a_agent, "search_kb", {"query": "alpha beta"}, stream=True),
        Scenario("reach_reply", "reach", reach_agent, "search_kb", {"query": "refunds"}),
        Scenario("reach_business_error", "reach", reach_agent, "search_kb", {"query": ""}),
    )
}
