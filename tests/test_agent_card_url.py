"""The A2A card names the agent's own URL (public_url, where it is served or registered, else its bound address),
never the caller's ``Host`` header: a forged Host must not send A2A clients elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import httpx
import pytest
from servers import free_port, startup_seconds, wait_until

from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.errors import ConfigError
from reach_plugins.registry.memory import MemoryRegistry

pytestmark = pytest.mark.integration

FORGED = "127.9.9.9:1"
"""A Host header naming an address the agent is not at."""
CARD = "/.well-known/agent-card.json"


def an_agent(**options: Any) -> ReachAgent:
    agent = ReachAgent("cardy", tokens="open", **options)

    @agent.capability("ping")
    def ping() -> str:
        return "pong"

    return agent


def urls(card: dict[str, Any]) -> set[str]:
    """Every base URL the card tells an A2A client to call (JSON-RPC at ``/a2a``, HTTP+JSON at ``/a2a/rest``)."""
    found = {interface["url"].removesuffix("/rest") for interface in card["supportedInterfaces"]}
    return found | ({card["url"]} if "url" in card else set())


def card_of(base: str) -> dict[str, Any]:
    answer = httpx.get(base + CARD, headers={"Host": FORGED}, timeout=10)
    assert answer.status_code == 200, answer.text
    card: dict[str, Any] = answer.json()
    return card


def test_a_forged_host_header_does_not_move_the_card_the_bound_address_does() -> None:
    """No public URL given: the card names the address the server is bound to, whatever Host the caller sent."""
    with BackgroundServer(an_agent().app) as server:
        assert urls(card_of(server.url)) == {f"{server.url}/a2a"}


def test_the_card_names_the_public_url_given() -> None:
    """``ReachAgent(public_url=)`` is what the card publishes (behind a proxy, the bound address is not public)."""
    with BackgroundServer(an_agent(public_url="https://127.0.0.5:8443/agents/cardy/").app) as server:
        assert urls(card_of(server.url)) == {"https://127.0.0.5:8443/agents/cardy/a2a"}


def test_the_card_names_the_endpoint_the_agent_registers_at() -> None:
    """``register_on_startup(registry, endpoint)``: the card's URLs are that endpoint's, and it is registered there."""
    agent = an_agent()
    registry = MemoryRegistry()
    endpoint = f"http://127.0.0.8:{free_port()}"
    agent.register_on_startup(registry, endpoint)
    with BackgroundServer(agent.app) as server:
        assert urls(card_of(server.url)) == {f"{endpoint}/a2a"}


def test_the_card_names_the_endpoint_serve_was_given() -> None:
    """``serve(agent, endpoint=)`` in a process of its own (no registry): the card names that endpoint."""
    port = free_port()
    endpoint = "http://127.0.0.7:9443"
    code = (
        "import sys\n"
        "from reach_plugins.agent import ReachAgent, serve\n"
        "agent = ReachAgent('cardy', tokens='open')\n"
        "agent.capability('ping')(lambda: 'pong')\n"
        "serve(agent, '127.0.0.1', int(sys.argv[1]), endpoint=sys.argv[2], log_level='warning')\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(port), endpoint],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            try:
                return httpx.get(f"{base}/healthz", timeout=0.5).status_code == 200 or process.poll() is not None
            except httpx.HTTPError:
                return process.poll() is not None

        wait_until(up, startup_seconds(), "the agent process start")
        assert process.poll() is None, f"the agent exited with {process.returncode}"
        assert urls(card_of(base)) == {f"{endpoint}/a2a"}
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize(
    ("url", "says"),
    [("grpc://127.0.0.1:50051", "http or https"), ("127.0.0.1:8080", "scheme"), ("http://u:p@127.0.0.1", "userinfo")],
)
def test_a_public_url_that_cannot_be_an_agents_is_refused(url: str, says: str) -> None:
    """A public URL no A2A client could call is a ConfigError saying what is wrong with it."""
    with pytest.raises(ConfigError, match=says):
        an_agent(public_url=url)
