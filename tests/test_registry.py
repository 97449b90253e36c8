"""Registry backends: the conformance suite for memory and file, plus what only they do."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from registry_conformance import (
    EVENT_TIMEOUT,
    FakeClock,
    RegistryConformance,
    RegistryFactory,
    agent,
    next_events,
    tracked,
)

from reach_plugins.errors import ConfigError
from reach_plugins.registry import FileRegistry, MemoryRegistry, Registry, RegistryEvent, open_registry

ORDERS = """
agents:
  - name: orders
    endpoints: [http://127.0.0.1:18101, http://127.0.0.1:18102]
    capabilities: [query_order]
"""

ORDERS_AND_TICKETS = (
    ORDERS
    + """
  - name: tickets
    endpoint: http://127.0.0.1:18201
    capabilities: [create_ticket]
"""
)


def write(path: Path, text: str, *, bump: int = 0) -> None:
    """Write ``text`` and move the mtime forward so even a same-size edit is seen."""
    path.write_text(text)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + bump * 1_000_000_000))


class TestMemoryRegistry(RegistryConformance):
    """MemoryRegistry passes the conformance suite."""

    @pytest.fixture
    def make_registry(self) -> RegistryFactory:
        async def make(clock: FakeClock) -> Registry:
            return MemoryRegistry(clock=clock)

        return make


class TestFileRegistry(RegistryConformance):
    """FileRegistry (over an empty file) passes the conformance suite."""

    @pytest.fixture
    def make_registry(self, tmp_path: Path) -> RegistryFactory:
        async def make(clock: FakeClock) -> Registry:
            path = tmp_path / "agents.yaml"
            write(path, "agents: []\n")
            return FileRegistry(path, clock=clock)

        return make


@pytest.fixture(params=["memory", "file"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MemoryRegistry | FileRegistry]:
    """Either embedded backend (both offer sweep())."""
    clock = FakeClock()
    if request.param == "memory":
        yield MemoryRegistry(clock=clock)
    else:
        write(tmp_path / "agents.yaml", "agents: []\n")
        yield FileRegistry(tmp_path / "agents.yaml", clock=clock)


# ---------------------------------------------------------------------- sweep and watch buffering


async def test_sweep_reports_each_transition_once(backend: MemoryRegistry | FileRegistry) -> None:
    """sweep() emits instance_down once when heartbeats stop, and the next heartbeat emits instance_up."""
    clock = backend.clock
    assert isinstance(clock, FakeClock)
    await backend.register_agent(agent("orders", "query_order"))
    await backend.register_instance(tracked("orders", "o-1", clock))
    stream = backend.watch()
    assert backend.sweep() == []
    clock.advance(31)
    assert [(e.kind, e.instance_id) for e in backend.sweep()] == [("instance_down", "o-1")]
    assert backend.sweep() == []
    await backend.heartbeat("orders", "o-1", 1)
    assert backend.sweep() == []
    assert [e.kind for e in await next_events(stream, 2)] == ["instance_down", "instance_up"]


async def test_heartbeat_reporting_down_emits_instance_down(backend: MemoryRegistry | FileRegistry) -> None:
    """A heartbeat that reports status 'down' takes the instance out at once, with an event."""
    clock = backend.clock
    assert isinstance(clock, FakeClock)
    await backend.register_agent(agent("orders", "query_order"))
    await backend.register_instance(tracked("orders", "o-1", clock))
    stream = backend.watch()
    await backend.heartbeat("orders", "o-1", 1, status="down")
    assert [(e.kind, e.instance_id) for e in await next_events(stream, 1)] == [("instance_down", "o-1")]
    assert not backend.is_alive(backend.instances("orders")["o-1"], clock())


async def test_close_releases_a_waiting_reader(backend: MemoryRegistry | FileRegistry) -> None:
    """A reader blocked on an empty watch stream ends when the registry closes."""
    stream = backend.watch()
    reader = asyncio.create_task(drain(stream))
    await asyncio.sleep(0)  # one loop turn (no waiting on time): the reader now blocks on the empty stream
    await backend.aclose()
    assert await asyncio.wait_for(reader, EVENT_TIMEOUT) == []


async def test_slow_watcher_loses_oldest_events_only(caplog: pytest.LogCaptureFixture) -> None:
    """A watcher that falls behind its buffer keeps the newest events; one warning per episode."""
    registry = MemoryRegistry(clock=FakeClock(), watch_buffer=2)
    stream = registry.watch()
    with caplog.at_level(logging.WARNING):
        for name in ("a", "b", "c", "d"):
            await registry.register_agent(agent(name, "query_order"))
    assert [e.agent for e in await next_events(stream, 2)] == ["c", "d"]
    assert caplog.text.count("fell 2 events behind") == 1
    with pytest.raises(ConfigError, match="watch_buffer"):
        MemoryRegistry(watch_buffer=0)


async def test_dropped_watch_stream_unsubscribes() -> None:
    """A watch stream nobody holds any more stops receiving events (no leak)."""
    registry = MemoryRegistry(clock=FakeClock())
    registry.watch()
    await registry.register_agent(agent("orders", "query_order"))
    kept = registry.watch()
    await registry.register_agent(agent("tickets", "create_ticket"))
    assert [e.agent for e in await next_events(kept, 1)] == ["tickets"]


# ---------------------------------------------------------------------- open_registry


def test_open_memory() -> None:
    """memory:// opens a fresh in-process registry using the given clock."""
    clock = FakeClock()
    registry = open_registry("memory://", clock=clock)
    assert isinstance(registry, MemoryRegistry)
    assert registry.clock is clock


@pytest.mark.parametrize("form", ["file://{rel}", "file://{abs}", "{rel}", "{abs}"])
def test_open_file_forms(form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """file://relative, file:///absolute and bare .yaml paths open a FileRegistry with the file's agents."""
    write(tmp_path / "agents.yaml", ORDERS)
    monkeypatch.chdir(tmp_path.parent)
    url = form.format(rel=f"{tmp_path.name}/agents.yaml", abs=tmp_path / "agents.yaml")
    registry = open_registry(url)
    assert isinstance(registry, FileRegistry)
    assert list(registry.agents()) == ["orders"]


def test_open_passes_registry_objects_through() -> None:
    """A registry object is returned as it is."""
    registry = MemoryRegistry()
    assert open_registry(registry) is registry


def test_open_etcd_without_its_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """etcd:// whose backend cannot be imported (extra not installed) is a ConfigError naming the 'etcd' extra."""
    monkeypatch.setitem(sys.modules, "reach_plugins.registry.etcd", None)
    with pytest.raises(ConfigError, match=r"reach-plugins\[etcd\]"):
        open_registry("etcd://127.0.0.1:2379")


@pytest.mark.parametrize("url", ["redis://x", "agents.json", ""])
def test_open_refuses_unknown_schemes(url: str) -> None:
    """Unknown schemes are ConfigErrors that list the supported forms."""
    with pytest.raises(ConfigError, match=r"supported forms: memory://, file://PATH.yaml"):
        open_registry(url)


@pytest.mark.parametrize("url", ["memory://somewhere", "file://"])
def test_open_refuses_malformed_urls(url: str) -> None:
    """A known scheme written wrongly is a ConfigError showing how to write it."""
    with pytest.raises(ConfigError, match=r"write (exactly )?'?(memory|file)://"):
        open_registry(url)


# ---------------------------------------------------------------------- FileRegistry reload


def test_file_loads_agents_and_tenants(tmp_path: Path) -> None:
    """The file's agents become registered agents with static instances; its tenants are exposed."""
    path = tmp_path / "agents.yaml"
    write(path, ORDERS + "tenants:\n  demo:\n    agents: [orders]\n")
    registry = FileRegistry(path)
    assert sorted(registry.instances("orders")) == ["orders-0", "orders-1"]
    assert registry.tenants["demo"].allows("orders")
    assert registry.config.agents[0].name == "orders"


async def test_reload_applies_the_difference(tmp_path: Path) -> None:
    """An edited file adds, changes and removes agents, seen by watchers as ordinary events."""
    path = tmp_path / "agents.yaml"
    write(path, ORDERS_AND_TICKETS)
    registry = FileRegistry(path, clock=FakeClock())
    stream = registry.watch()
    write(path, ORDERS.replace("query_order]", "query_order, cancel_order]"), bump=1)
    assert registry.reload() is True
    assert sorted(registry.agents()) == ["orders"]
    assert registry.agents()["orders"].capability("cancel_order") is not None
    kinds = [(e.kind, e.agent) for e in await next_events(stream, 3)]
    assert kinds == [("instance_deleted", "tickets"), ("agent_deleted", "tickets"), ("agent_put", "orders")]


def test_reload_without_change_does_nothing(tmp_path: Path) -> None:
    """An untouched or merely touched file does not reload agents or move the revision."""
    path = tmp_path / "agents.yaml"
    write(path, ORDERS)
    registry = FileRegistry(path)
    revision = registry.revision
    assert registry.reload() is False
    write(path, ORDERS, bump=1)
    assert registry.reload() is False
    assert registry.revision == revision


async def test_reload_leaves_api_registered_agents_alone(tmp_path: Path) -> None:
    """Agents registered through the API, not in the file, survive a reload."""
    path = tmp_path / "agents.yaml"
    write(path, ORDERS_AND_TICKETS)
    registry = FileRegistry(path)
    await registry.register_agent(agent("self-registered", "chat"))
    write(path, ORDERS, bump=1)
    registry.reload()
    assert sorted(registry.agents()) == ["orders", "self-registered"]


def test_broken_file_keeps_last_good_state(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A broken edit keeps the previous agents, logs the ConfigError and keeps it in last_error; a fix clears it."""
    path = tmp_path / "agents.yaml"
    write(path, ORDERS)
    registry = FileRegistry(path)
    write(path, ORDERS.replace("capabilities", "capabilitiez"), bump=1)
    with caplog.at_level(logging.ERROR):
        assert registry.reload() is False
    assert list(registry.agents()) == ["orders"]
    assert isinstance(registry.last_error, ConfigError)
    assert "capabilitiez" in str(registry.last_error)
    assert "keeping the last good state" in caplog.text
    write(path, ORDERS_AND_TICKETS, bump=2)
    assert registry.reload() is True
    assert registry.last_error is None
    assert sorted(registry.agents()) == ["orders", "tickets"]


def test_deleted_file_keeps_last_good_state(tmp_path: Path) -> None:
    """A file that disappears keeps the agents and reports a ConfigError naming the path."""
    path = tmp_path / "agents.yaml"
    write(path, ORDERS)
    registry = FileRegistry(path)
    path.unlink()
    assert registry.reload() is False
    assert list(registry.agents()) == ["orders"]
    assert registry.last_error is not None and str(path) in str(registry.last_error)


def test_broken_file_at_start_is_refused(tmp_path: Path) -> None:
    """A registry cannot start from a broken or missing file."""
    path = tmp_path / "agents.yaml"
    with pytest.raises(ConfigError, match=r"agents\.yaml"):
        FileRegistry(path)
    write(path, "agents: [{name: Bad Name}]\n")
    with pytest.raises(ConfigError):
        FileRegistry(path)


def test_poll_interval_must_be_positive(tmp_path: Path) -> None:
    """A non-positive poll interval is a ConfigError."""
    write(tmp_path / "agents.yaml", ORDERS)
    with pytest.raises(ConfigError, match="poll_interval"):
        FileRegistry(tmp_path / "agents.yaml", poll_interval=0)


async def test_poller_reloads_until_closed(tmp_path: Path) -> None:
    """start() picks up an edit on its own; aclose() stops the poller and ends watch streams."""
    path = tmp_path / "agents.yaml"
    write(path, ORDERS)
    registry = FileRegistry(path, poll_interval=0.01)
    stream = registry.watch()
    await registry.start()
    write(path, ORDERS_AND_TICKETS, bump=1)
    assert [e.agent for e in await next_events(stream, 1)] == ["tickets"]
    await registry.aclose()
    rest = await asyncio.wait_for(drain(stream), 1)
    assert [(e.kind, e.instance_id) for e in rest] == [("instance_put", "tickets-0")]


async def drain(stream: AsyncIterator[RegistryEvent]) -> list[RegistryEvent]:
    """Every event left in a stream that is ending."""
    return [event async for event in stream]
