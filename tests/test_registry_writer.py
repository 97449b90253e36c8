"""An agent opens its registry URL as a writer: it starts while the registry is down; readers still refuse to."""

from __future__ import annotations

import time
import uuid

import pytest
from hop_support import until
from servers import free_port
from test_agent_sdk import build_agent

from reach_plugins.errors import BackendUnavailable, ConfigError
from reach_plugins.registry import open_registry


async def test_agent_given_the_default_etcd_url_starts_while_etcd_is_down() -> None:
    """With a plain etcd URL nobody answers, a reader's open is BackendUnavailable, but the agent's registration
    returns at once (unregistered, retried in the background) and its stop closes the registry it opened."""
    url = f"etcd://127.0.0.1:{free_port()}?timeout=0.5"
    with pytest.raises(BackendUnavailable):
        open_registry(url)
    agent, _ = build_agent()
    started = time.monotonic()
    registration = await agent.register(url, "http://127.0.0.1:8111", instance_id="orders-w")
    assert time.monotonic() - started < 2.0, "the agent does not wait for a snapshot it never reads"
    assert registration.registered is False
    await registration.stop()
    with pytest.raises(ConfigError, match="closed"):
        await registration.registry.get("orders")


async def test_agent_registers_through_a_url_it_opens_and_leaves_on_stop(etcd_url: str) -> None:
    """An agent given an etcd URL registers its instance there (a reader sees it) and deregisters on stop."""
    url = f"{etcd_url}/writer-{uuid.uuid4().hex[:8]}/"
    reader = open_registry(url)
    await reader.start()
    agent, _ = build_agent()
    registration = await agent.register(url, "http://127.0.0.1:8112", instance_id="orders-u")
    try:
        assert registration.registered and registration.registry is not reader
        await until(lambda: "orders-u" in reader.instances("orders"), within=5.0)
    finally:
        await registration.stop()
    await until(lambda: "orders-u" not in reader.instances("orders"), within=5.0)
    await reader.aclose()
