"""Active health probes: refused connects mark an instance down at once, readiness is the agent's own answer."""

from __future__ import annotations

import asyncio
import itertools
import random
from pathlib import Path
from typing import Any

import httpx
import yaml
from hop_support import free_port

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.gateway import create_app
from reach_plugins.model import AgentDescriptor, HealthCheck
from reach_plugins.registry import MemoryRegistry
from reach_plugins.routing.probes import JITTER, PROBE_TIMEOUT, ProbeBook, Prober
from transports.direct import DirectTransport

CHECK = HealthCheck(probe_interval=5, ready_interval=30, refusals_to_down=2)


def test_two_failed_probes_in_a_row_mark_down_and_one_answer_restores() -> None:
    """One failed liveness probe is noise, two in a row are down (a timeout counts); an answer restores."""
    book = ProbeBook()
    book.alive("orders", "o1", ok=False, why="refused", check=CHECK)
    assert book.available("orders", "o1")
    book.alive("orders", "o1", ok=True, check=CHECK)
    book.alive("orders", "o1", ok=False, why="TimeoutError", check=CHECK)
    assert book.available("orders", "o1"), "the answer in between reset the count"
    book.alive("orders", "o1", ok=False, why="TimeoutError", check=CHECK)
    assert not book.available("orders", "o1") and book.available("orders", "o2")
    book.alive("orders", "o1", ok=True, check=CHECK)
    assert book.available("orders", "o1")


def test_probes_are_jittered_and_readiness_is_rarer() -> None:
    """Connect probes come about every 5 s, readiness about every 30 s, each within the jitter band."""
    book = ProbeBook(random.Random(3))
    now, connects, readies = 0.0, [], []
    while now < 300:
        connect, ready = book.due("orders", "o1", CHECK, now)
        if connect:
            connects.append(now)
        if ready:
            readies.append(now)
        now += 0.1
    gaps = [b - a for a, b in itertools.pairwise(connects)]
    assert min(gaps) >= 5 * (1 - JITTER) - 0.11 and max(gaps) <= 5 * (1 + JITTER) + 0.11
    assert len(set(round(gap, 1) for gap in gaps)) > 3, "probes must not march in step"
    assert 7 <= len(readies) <= 13


async def test_a_prober_finds_a_closed_port_and_an_unready_agent() -> None:
    """Against real sockets: a refused endpoint goes down after two rounds; readiness follows the agent's callback."""
    ready = [True]
    agent = ReachAgent("orders", readiness=lambda: ready[0])

    @agent.capability("query_order")
    def query_order(order_id: str) -> dict[str, str]:
        return {"order_id": order_id}

    clock = [0.0]
    with BackgroundServer(agent.app) as server:
        registry = MemoryRegistry()
        closed = f"http://127.0.0.1:{free_port()}"
        registry.put_agent(AgentDescriptor(name="orders", endpoints=[server.url, closed], capabilities=["query_order"]))
        live, dead = (
            i.instance_id for i in sorted(registry.instances("orders").values(), key=lambda i: i.endpoint != server.url)
        )
        prober = Prober(registry, clock=lambda: clock[0])
        await prober.probe_once()
        assert prober.available("orders", live) and prober.available("orders", dead), "one refusal is not down"
        clock[0] += 10
        await prober.probe_once()
        assert prober.available("orders", live) and not prober.available("orders", dead)
        ready[0] = False
        clock[0] += 40
        await prober.probe_once()
        assert not prober.available("orders", live)
        ready[0] = True
        clock[0] += 40
        await prober.probe_once()
        assert prober.available("orders", live)
        await prober.aclose()


async def test_the_readiness_probe_gets_the_configured_path() -> None:
    """health_check.path is what the prober GETs on a real server: 200 there is ready, whatever /readyz says."""
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        seen.append(scope["path"])
        status = 200 if scope["path"] == "/ops/ready" else 503
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    with BackgroundServer(app, lifespan="off") as server:
        clock = [0.0]
        registry = MemoryRegistry()
        for name, check in (("custom", HealthCheck(path="/ops/ready")), ("default", HealthCheck())):
            registry.put_agent(
                AgentDescriptor(name=name, endpoints=[server.url], capabilities=["query_order"], health_check=check)
            )
        prober = Prober(registry, clock=lambda: clock[0])
        await prober.probe_once()
        await prober.aclose()
    assert prober.available("custom", "custom-0"), "the configured path answered 200: ready"
    assert not prober.available("default", "default-0"), "the default path is /readyz, which answered 503"
    assert sorted(seen) == ["/healthz", "/healthz", "/ops/ready", "/readyz"], "liveness is /healthz, for both"


async def test_liveness_is_the_agents_answer_not_a_tcp_accept() -> None:
    """A port that accepts and never answers, and a /healthz answering 503, go down; a live agent stays up."""
    agent = ReachAgent("orders")

    @agent.capability("query_order")
    def query_order(order_id: str) -> dict[str, str]:
        return {"order_id": order_id}

    held: list[asyncio.StreamWriter] = []

    async def blackhole(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, read by nobody, never answered

    async def sick(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 503, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})

    hole = await asyncio.start_server(blackhole, "127.0.0.1", 0)
    hole_url = f"http://127.0.0.1:{hole.sockets[0].getsockname()[1]}"
    with BackgroundServer(agent.app) as live, BackgroundServer(sick, lifespan="off") as unwell:
        registry = MemoryRegistry()
        endpoints = [live.url, hole_url, unwell.url]
        registry.put_agent(AgentDescriptor(name="orders", endpoints=endpoints, capabilities=["query_order"]))
        ids = {i.endpoint: i.instance_id for i in registry.instances("orders").values()}
        clock = [0.0]
        prober = Prober(registry, clock=lambda: clock[0])
        started = asyncio.get_running_loop().time()
        for _ in range(2):
            await prober.probe_once()
            clock[0] += 10
        took = asyncio.get_running_loop().time() - started
        await prober.aclose()
    hole.close()
    for writer in held:
        writer.close()
    assert prober.available("orders", ids[live.url])
    assert not prober.available("orders", ids[hole_url]), "an accepted connection that never answers is not alive"
    assert not prober.available("orders", ids[unwell.url])
    assert took < 2 * (PROBE_TIMEOUT + 1.0), "each probe is bounded by PROBE_TIMEOUT"


def test_one_prober_per_registry() -> None:
    """Every caller of Prober.shared gets the same prober for one registry (bounded cost)."""
    registry = MemoryRegistry()
    assert Prober.shared(registry) is Prober.shared(registry)
    assert Prober.shared(MemoryRegistry()) is not Prober.shared(registry)


async def test_a_client_with_probes_stops_sending_to_a_dead_instance() -> None:
    """ReachClient(probes=True): once the probes saw two refusals, no call tries the dead instance first."""
    agent = ReachAgent("orders")

    @agent.capability("query_order")
    def query_order(order_id: str) -> dict[str, str]:
        return {"order_id": order_id}

    with BackgroundServer(agent.app) as server:
        registry = MemoryRegistry()
        closed = f"http://127.0.0.1:{free_port()}"
        quick = HealthCheck(probe_interval=0.1, ready_interval=60)
        descriptor = AgentDescriptor(
            name="orders", endpoints=[server.url, closed], capabilities=["query_order"], health_check=quick
        )
        registry.put_agent(descriptor)
        dead = next(i.instance_id for i in registry.instances("orders").values() if i.endpoint == closed)
        async with ReachClient(registry, DirectTransport(), probes=True) as client:
            await client.reach("query_order", {"order_id": "warm"})
            prober = Prober.shared(registry)
            for _ in range(100):
                if not prober.available("orders", dead):
                    break
                await asyncio.sleep(0.05)
            assert not prober.available("orders", dead), "two refusals never marked the closed port down"
            answers = [await client.reach("query_order", {"order_id": f"o{n}"}, trace=True) for n in range(20)]
    assert all(answer.ok and answer.trace is not None and len(answer.trace.attempts) == 1 for answer in answers)
    assert dead not in {answer.instance for answer in answers}


async def test_the_gateway_probes_the_instances_behind_it(tmp_path: Path) -> None:
    """A gateway's prober marks a closed port down: calls through it then take one attempt, at the live one.

    The breaker is kept out of it (it would need 1,000 calls to judge), so only the probes can learn.
    """
    agent = ReachAgent("orders")

    @agent.capability("query_order")
    def query_order(order_id: str) -> dict[str, str]:
        return {"order_id": order_id}

    with BackgroundServer(agent.app) as server:
        closed = f"http://127.0.0.1:{free_port()}"
        config = tmp_path / "agents.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "agents": [
                        {
                            "name": "orders",
                            "endpoints": [server.url, closed],
                            "capabilities": ["query_order"],
                            "health_check": {"probe_interval": "100ms"},
                            "circuit_breaker": {"min_calls": 1000},
                        }
                    ],
                    "tenants": {"demo": {"token_env": "DEMO_TOKEN", "agents": "*"}},
                }
            )
        )
        app = create_app(config, environ={"DEMO_TOKEN": "tok"})
        with BackgroundServer(app, proxy_headers=False) as gateway:
            headers = {"Authorization": "Bearer tok"}
            async with httpx.AsyncClient(base_url=gateway.url, headers=headers) as http:
                answers: list[dict[str, Any]] = []

                async def ask(n: int) -> dict[str, Any]:
                    body = {"capability": "query_order", "payload": {"order_id": f"o{n}"}}
                    answer: dict[str, Any] = (await http.post("/v1/reach", json=body)).json()
                    answers.append(answer)
                    return answer

                single = 0
                deadline = asyncio.get_running_loop().time() + 4  # probes: 2 refusals, ticks of 0.5 s
                while single < 10 and asyncio.get_running_loop().time() < deadline:
                    single = single + 1 if (await ask(len(answers)))["attempts"] == 1 else 0
                assert single == 10, "the dead instance kept being tried first: nothing marked it down"
                settled = [await ask(len(answers)) for _ in range(20)]
    assert all(answer["status"] == "success" and answer["attempts"] == 1 for answer in settled)
    assert {answer["instance"] for answer in settled} == {answers[-1]["instance"]}
