"""Adapter normalisation replayed from vcrpy cassettes: no server, no port, only what real servers once answered.

The cassettes under ``tests/cassettes/`` were recorded from the project's own
test servers by ``tests/cassettes/record.py`` (run it to re-record). Replays
go through DirectTransport's httpx engine, which vcrpy patches; a request the
cassette does not hold fails instead of reaching the network.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import pytest
from cassettes.scenarios import FOLDER, HOST, SCENARIOS, Scenario, cassettes, raw_agent, reach_agent
from vcr.errors import CannotOverwriteExistingCassetteException  # type: ignore[import-untyped]

from reach_plugins.errors import InvalidResponse
from reach_plugins.model import Capability
from reach_plugins.transport import Call, StreamEvent
from transports.direct import DirectTransport


@pytest.fixture
async def transport() -> AsyncIterator[DirectTransport]:
    async with DirectTransport(engine="httpx") as transport:
        yield transport


@contextmanager
def replay(name: str, *, every_interaction: bool = True) -> Iterator[Scenario]:
    """Replay the cassette of scenario ``name`` (no recording); check every recorded interaction was asked for."""
    with cassettes("none").use_cassette(SCENARIOS[name].cassette) as cassette:
        yield SCENARIOS[name]
    assert cassette.all_played or not every_interaction, f"{name}: a recorded request was not made"


async def collect(transport: DirectTransport, call: Call) -> list[StreamEvent]:
    return [event async for event in transport.stream(call)]


# ----------------------------------------------------------------------------- openai-compatible


async def test_openai_reply_is_normalised(transport: DirectTransport) -> None:
    """A chat completion becomes reply_content, no tool_calls, and raw_meta with usage and finish_reason."""
    with replay("openai_reply") as scenario:
        reply = await transport.send(scenario.call())
    assert reply.data["reply_content"] == "you said: hi"
    assert reply.data["tool_calls"] == []
    meta = reply.data["raw_meta"]
    assert (meta["id"], meta["model"], meta["usage"]["total_tokens"], meta["finish_reason"]) == (
        "chatcmpl-1",
        "fake-gpt-4",
        12,
        "stop",
    )


async def test_openai_tool_calls_are_parsed(transport: DirectTransport) -> None:
    """Tool calls come back as id, name and decoded JSON arguments, with empty reply_content."""
    with replay("openai_tool_call") as scenario:
        reply = await transport.send(scenario.call())
    assert reply.data["tool_calls"] == [{"id": "call_1", "name": "lookup_order", "arguments": {"order_id": "12"}}]
    assert reply.data["reply_content"] == ""


async def test_openai_refusal_is_a_refusal(transport: DirectTransport) -> None:
    """content null + refusal is a 'refusal' failure keeping the text, not an invalid response."""
    with replay("openai_refusal") as scenario:
        reply = await transport.send(scenario.call())
    assert reply.error is not None
    assert (reply.status, reply.error.type, reply.data["refusal"]) == ("fail", "refusal", "I can't help with that.")


async def test_openai_renamed_field_is_invalid(transport: DirectTransport, caplog: pytest.LogCaptureFixture) -> None:
    """A message that lost 'content' is an InvalidResponse, logged, never data."""
    with (
        replay("openai_renamed_field") as scenario,
        caplog.at_level(logging.WARNING, "reach_plugins.protocols"),
        pytest.raises(InvalidResponse, match="content"),
    ):
        await transport.send(scenario.call())
    assert "invalid response" in caplog.text


async def test_openai_auth_failure_is_business(transport: DirectTransport) -> None:
    """A 401 with an OpenAI error body is a business failure carrying the server's message."""
    with replay("openai_bad_key") as scenario:
        reply = await transport.send(scenario.call())
    assert reply.error is not None
    assert (reply.status, reply.status_code, reply.error.type, reply.error.message) == (
        "fail",
        401,
        "business",
        "bad key",
    )


async def test_openai_stream_is_normalised(transport: DirectTransport) -> None:
    """Recorded chunks become reply_content deltas, the usage chunk a usage event; [DONE] ends the stream."""
    with replay("openai_stream") as scenario:
        events = await collect(transport, scenario.call())
    data = [event.data for event in events if event.kind == "data"]
    assert "".join(chunk["reply_content"] for chunk in data) == "you said: one two three "
    assert data[-2]["raw_meta"]["finish_reason"] == "stop"
    assert data[-1]["usage"]["total_tokens"] == 12
    assert events[-1].kind == "end"


async def test_openai_streamed_tool_call_is_assembled(transport: DirectTransport) -> None:
    """Recorded argument fragments ('{"order_id": "', '12', '"}') become one call; "12" stays a string."""
    with replay("openai_stream_tool_call") as scenario:
        events = await collect(transport, scenario.call())
    calls = [call for event in events if event.kind == "data" for call in event.data["tool_calls"]]
    assert calls == [{"id": "call_1", "name": "lookup_order", "arguments": {"order_id": "12"}, "index": 0}]


async def test_openai_streamed_refusal_ends_with_a_refusal(transport: DirectTransport) -> None:
    """Recorded refusal deltas end the stream with one 'refusal' error carrying the joined text."""
    with replay("openai_stream_refusal") as scenario:
        events = await collect(transport, scenario.call())
    assert events[-1].error is not None
    assert (events[-1].kind, events[-1].error.type) == ("error", "refusal")
    assert events[-1].error.message.endswith("I can't help with that.")


# ----------------------------------------------------------------------------- raw-http


async def test_raw_http_reply_is_mapped(transport: DirectTransport) -> None:
    """The wrapped answer lands in reply_content; the business fields stay in raw_meta without it."""
    with replay("raw_http_reply") as scenario:
        reply = await transport.send(scenario.call())
    assert reply.data["reply_content"] == "shipped (s-42)"
    assert reply.data["raw_meta"] == {
        "code": 0,
        "data": {"message": {"role": "assistant"}, "order_info": {"id": 123, "status": "shipped"}},
    }


async def test_raw_http_mapping_to_a_missing_path_is_invalid(transport: DirectTransport) -> None:
    """The same recorded reply under a mapping to a path it lacks is an InvalidResponse naming the path."""
    agent = raw_agent(HOST, response_mapping={"reply_content": "data.message.text"})
    with replay("raw_http_reply") as scenario, pytest.raises(InvalidResponse, match=r"data\.message\.text"):
        await transport.send(scenario.call(agent=agent))


async def test_raw_http_return_schema_applies_to_the_mapped_reply(transport: DirectTransport) -> None:
    """return_schema checks the normalised reply: one demanding a field the mapping does not give refuses it."""
    schema = {"type": "object", "required": ["order_status"]}
    agent = raw_agent(HOST).model_copy(update={"capabilities": [Capability(name="ask", return_schema=schema)]})
    with replay("raw_http_reply") as scenario, pytest.raises(InvalidResponse, match="order_status"):
        await transport.send(scenario.call(agent=agent))


async def test_raw_http_error_code_is_business(transport: DirectTransport) -> None:
    """A non-zero business code is a business failure with the body's message."""
    with replay("raw_http_business_code") as scenario:
        reply = await transport.send(scenario.call())
    assert reply.error is not None
    assert (reply.status, reply.error.type, reply.error.message) == ("fail", "business", "order not found")


# ----------------------------------------------------------------------------- a2a


async def test_a2a_task_is_normalised(transport: DirectTransport) -> None:
    """The 1.x agent card is read, then the completed task's artifact text becomes reply_content."""
    with replay("a2a_task") as scenario:
        reply = await transport.send(scenario.call())
    assert reply.data["reply_content"] == "echo: refunds"
    meta = reply.data["raw_meta"]
    assert (meta["kind"], meta["context_id"], meta["state"]) == ("task", "s-42", "completed")


async def test_a2a_failed_task_is_business(transport: DirectTransport) -> None:
    """A failed task is a business failure carrying its status message's text."""
    with replay("a2a_failed_task") as scenario:
        reply = await transport.send(scenario.call())
    assert reply.error is not None
    assert (reply.status, reply.error.type, reply.error.message) == ("fail", "business", "cannot do that")


async def test_a2a_input_required_returns_the_question(transport: DirectTransport) -> None:
    """An input-required task is a success whose reply is the agent's question, its state in raw_meta."""
    with replay("a2a_input_required") as scenario:
        reply = await transport.send(scenario.call())
    assert (reply.data["reply_content"], reply.data["raw_meta"]["state"]) == ("Which order?", "input-required")


async def test_a2a_stream_yields_progress_and_artifacts_then_end(transport: DirectTransport) -> None:
    """Recorded status text and artifact updates become data events; the final status update ends the stream."""
    with replay("a2a_stream") as scenario:
        events = await collect(transport, scenario.call())
    assert [event.data["reply_content"] for event in events if event.kind == "data"] == [
        "working on it",
        "echo: alpha beta",
    ]
    assert events[-1].kind == "end"


async def test_a2a_status_only_stream_carries_the_status_text(transport: DirectTransport) -> None:
    """A task answering only in its final status message streams that text, then end."""
    with replay("a2a_status_stream") as scenario:
        events = await collect(transport, scenario.call())
    assert [(event.kind, event.data["reply_content"] if event.data else None) for event in events] == [
        ("data", "done: status only"),
        ("end", None),
    ]


# ----------------------------------------------------------------------------- reach


async def test_reach_reply_is_the_agents_data(transport: DirectTransport) -> None:
    """A reach agent's success body is passed on as its data, untouched."""
    with replay("reach_reply") as scenario:
        reply = await transport.send(scenario.call())
    assert (reply.status, reply.data) == ("success", {"text": "found refunds"})


async def test_reply_breaking_return_schema_is_invalid(
    transport: DirectTransport, caplog: pytest.LogCaptureFixture
) -> None:
    """The seeds' upgrade story: the recorded reply renamed 'content' to 'text', so return_schema refuses it."""
    schema = {"type": "object", "required": ["content"], "properties": {"content": {"type": "string"}}}
    agent = reach_agent(HOST).model_copy(update={"capabilities": [Capability(name="search_kb", return_schema=schema)]})
    with (
        replay("reach_reply") as scenario,
        caplog.at_level(logging.WARNING, "reach_plugins.protocols"),
        pytest.raises(InvalidResponse, match="content"),
    ):
        await transport.send(scenario.call(agent=agent))
    assert "return_schema" in caplog.text


async def test_reach_business_error_is_a_failure(transport: DirectTransport) -> None:
    """A business error from the agent is a 'business' failure with the agent's message."""
    with replay("reach_business_error") as scenario:
        reply = await transport.send(scenario.call())
    assert reply.error is not None
    assert (reply.status, reply.error.type, reply.error.message) == (
        "fail",
        "business",
        "say what to search for in 'query'",
    )


# ----------------------------------------------------------------------------- the cassettes themselves


async def test_a_request_the_cassette_lacks_fails_instead_of_reaching_out(transport: DirectTransport) -> None:
    """A request whose body differs from the recorded one is refused by the replay (record_mode none)."""
    with replay("reach_reply", every_interaction=False), pytest.raises(CannotOverwriteExistingCassetteException):
        await transport.send(SCENARIOS["reach_business_error"].call())


def test_every_scenario_has_a_cassette_without_local_address_or_secret() -> None:
    """Each scenario's cassette exists, uses the fixed (loopback) host and no recording-time port, and stores no
    Authorization header."""
    for scenario in SCENARIOS.values():
        text = (FOLDER / scenario.cassette).read_text(encoding="utf-8")
        assert HOST in text, scenario.cassette
        recorded_ports = {port for port in re.findall(r"127\.0\.0\.1:(\d+)", text)} - {HOST.rsplit(":", 1)[1]}
        assert not recorded_ports and "sk-test" not in text, scenario.cassette
        assert "authorization" not in text.lower(), scenario.cassette
