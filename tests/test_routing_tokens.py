"""input_tokens_required, the seeds' rejection condition (seed 001, section 4.2): a payload estimated above an
agent's limit is routed to one that takes it, or refused before anything is sent, saying the estimate, the limit
and what to do."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from registry_conformance import agent

from reach_plugins import ReachClient
from reach_plugins.config.loader import load_config
from reach_plugins.errors import ConfigError, InputTooLong
from reach_plugins.model import ReachRequest
from reach_plugins.registry import MemoryRegistry
from reach_plugins.routing import Router
from reach_plugins.routing.policy import payload_tokens
from reach_plugins.transport import Call, MockTransport


def limited(name: str, limit: int | None, **fields: Any) -> Any:
    """An agent offering ``chat`` that takes at most ``limit`` input tokens (``None``: no limit)."""
    capability: dict[str, Any] = {"name": "chat"}
    if limit is not None:
        capability["input_tokens_required"] = limit
    return agent(name, endpoints=1, capabilities=[capability], **fields)


def sized(tokens: int, **fields: Any) -> ReachRequest:
    """A ``chat`` request whose payload is exactly ``tokens`` estimated tokens (4 characters each)."""
    frame = len(json.dumps({"text": ""}, separators=(",", ":")))
    payload = {"text": "x" * (4 * tokens - frame)}
    request = ReachRequest(capability="chat", payload=payload, **fields)
    assert payload_tokens(request.payload) == tokens
    return request


def router(registry: MemoryRegistry) -> Router:
    return Router(registry, clock=registry.clock, rng=random.Random(7))


def test_the_estimate_is_four_characters_a_token_of_the_payloads_json() -> None:
    """The payload's compact JSON text, about four characters a token, rounded up; non-ASCII counts as characters."""
    assert payload_tokens({}) == 1  # "{}"
    assert payload_tokens({"q": "abcdefgh"}) == 4  # {"q":"abcdefgh"} is 16 characters
    assert payload_tokens({"q": "é" * 12}) == 5  # 20 characters, not 80 once escaped


def test_a_payload_over_a_limit_goes_to_an_agent_that_takes_it() -> None:
    """A small request may go to either agent; one above the small agent's limit goes only to the large one."""
    registry = MemoryRegistry()
    registry.put_agent(limited("small", 100))
    registry.put_agent(limited("large", 10_000))
    r = router(registry)
    assert {r.route(sized(100)).agent.name for _ in range(20)} == {"small", "large"}
    assert {r.route(sized(101)).agent.name for _ in range(20)} == {"large"}
    skipped = [(c.agent, c.skipped) for c in r.route(sized(101)).decision.candidates if c.skipped]
    assert skipped == [("small", "estimated input over its input_tokens_required 100")]
    assert [route.agent.name for route in r.candidates(sized(5_000))] == ["large"]


def test_an_agent_without_a_limit_takes_any_size() -> None:
    """No input_tokens_required means no limit: it serves what a limited agent refuses."""
    registry = MemoryRegistry()
    registry.put_agent(limited("bounded", 10))
    registry.put_agent(limited("open", None))
    r = router(registry)
    assert {r.route(sized(5)).agent.name for _ in range(10)} == {"bounded", "open"}
    assert {r.route(sized(500)).agent.name for _ in range(10)} == {"open"}


def test_nobody_takes_it_refuses_with_the_estimate_the_limit_and_the_fix() -> None:
    """Above every limit: InputTooLong naming the estimate, the largest limit and how to fix it."""
    registry = MemoryRegistry()
    registry.put_agent(limited("small", 100))
    registry.put_agent(limited("medium", 300))
    with pytest.raises(InputTooLong) as caught:
        router(registry).route(sized(301))
    message = str(caught.value)
    assert "about 301 tokens" in message and "largest input_tokens_required: 300" in message
    assert "shorten or split the payload to at most 300 tokens" in message
    assert "small/*: estimated input over its input_tokens_required 100" in message and "medium/*" in message
    assert (caught.value.details["tokens"], caught.value.details["limit"]) == (301, 300)


def test_a_session_over_its_agents_limit_moves_to_one_that_takes_it() -> None:
    """A conversation pinned to a small agent degrades to a large one when a turn outgrows the small one's limit."""
    registry = MemoryRegistry()
    registry.put_agent(limited("small", 100, routing={"priority": 1}))
    registry.put_agent(limited("large", 10_000, routing={"priority": 2}))
    r = router(registry)
    assert r.route(sized(10, session_id="s")).agent.name == "small"
    moved = r.route(sized(200, session_id="s"))
    assert (moved.agent.name, moved.affinity) == ("large", "degraded")


async def test_the_client_refuses_before_sending() -> None:
    """ReachClient.reach raises InputTooLong and the transport never sees the call."""
    registry = MemoryRegistry()
    await registry.register_agent(limited("small", 10))

    def answer(call: Call) -> dict[str, str]:
        return {"ok": "yes"}

    transport = MockTransport(answer)
    async with ReachClient(registry, transport) as client:
        assert (await client.reach("chat", {"text": "hi"})).ok
        with pytest.raises(InputTooLong, match="input_tokens_required"):
            await client.reach("chat", {"text": "x" * 200})
    assert len(transport.calls) == 1


def test_a_zero_limit_is_a_config_error(tmp_path: Path) -> None:
    """input_tokens_required 0 would refuse every request: the loader says so instead."""
    path = tmp_path / "agents.yaml"
    path.write_text(
        "agents:\n  - name: chat\n    endpoint: http://127.0.0.1:9\n"
        "    capabilities: [{name: chat, input_tokens_required: 0}]\n"
    )
    with pytest.raises(ConfigError, match="input_tokens_required"):
        load_config(path)
