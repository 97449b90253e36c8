"""Real servers on 127.0.0.1 for the gateway, node and broadcast tests: agents, config files, tokens.

Agents are served by the agent SDK (uvicorn in a thread, or a separate process
for the tests that kill one). Every agent records what it executed, so tests
count attempts where they happen: at the agent.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from reach_plugins.agent import BackgroundServer, ReachAgent, ReachContext
from reach_plugins.errors import BusinessError, Retryable

TOKENS = {"DEMO_TOKEN": "tok-demo", "ACME_TOKEN": "tok-acme", "DEMO_KEY": "key-of-demo", "ACME_KEY": "key-of-acme"}
"""The environment every server of these tests reads its secrets from."""


@dataclass
class Agent:
    """One served agent instance and what it executed (capability, payload) in order."""

    name: str
    label: str
    server: BackgroundServer
    executed: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)
    """``hold`` requests block until the gate opens."""

    @property
    def url(self) -> str:
        return self.server.url

    def count(self, capability: str) -> int:
        return sum(1 for name, _ in self.executed if name == capability)


def build_agent(name: str, label: str) -> tuple[ReachAgent, list[tuple[str, dict[str, Any]]], threading.Event]:
    """An agent whose capabilities cover the scenarios: answer, fail, hold, stream, echo credentials."""
    agent = ReachAgent(name)
    executed: list[tuple[str, dict[str, Any]]] = []
    gate = threading.Event()

    @agent.capability("query_order", description="Where an order is")
    def query_order(order_id: str) -> dict[str, str]:
        executed.append(("query_order", {"order_id": order_id}))
        return {"order_id": order_id, "by": label}

    @agent.capability("whoami")
    def whoami(ctx: ReachContext) -> dict[str, Any]:
        executed.append(("whoami", {}))
        return {"by": label, "x-api-key": ctx.headers.get("x-api-key"), "tenant": ctx.tenant, "hops": list(ctx.hops)}

    @agent.capability("outage")
    def outage() -> None:
        executed.append(("outage", {}))
        raise Retryable("database down")

    @agent.capability("refuse")
    def refuse() -> None:
        executed.append(("refuse", {}))
        raise BusinessError("order already shipped")

    @agent.capability("hold")
    def hold(n: int, seconds: float = 10.0) -> dict[str, Any]:
        gate.wait(seconds)
        executed.append(("hold", {"n": n}))
        return {"n": n, "by": label}

    @agent.capability("pick")
    def pick(refuse: list[str]) -> dict[str, str]:
        executed.append(("pick", {"refuse": refuse}))
        if label in refuse:
            raise BusinessError(f"{label} refuses")
        return {"by": label}

    @agent.capability("count")
    async def count(upto: int) -> Any:
        executed.append(("count", {"upto": upto}))
        for number in range(upto):
            yield number

    return agent, executed, gate


@contextmanager
def serve_agents(*specs: tuple[str, str]) -> Iterator[list[Agent]]:
    """Serve one instance per ``(agent name, label)`` on free ports."""
    agents: list[Agent] = []
    try:
        for name, label in specs:
            app, executed, gate = build_agent(name, label)
            server = BackgroundServer(app.app).start()
            agents.append(Agent(name, label, server, executed, gate))
        yield agents
    finally:
        for agent in agents:
            agent.gate.set()
            agent.server.stop()


def write_config(path: Path, agents: dict[str, Any], tenants: dict[str, Any] | None = None) -> Path:
    """A config file: ``agents`` maps a name to its endpoints (or a full agent body), plus ``tenants``."""
    listed = []
    for name, spec in agents.items():
        body = {"endpoints": spec} if isinstance(spec, list) else dict(spec)
        body.setdefault("capabilities", ["query_order", "whoami", "outage", "refuse", "hold", "pick", "count"])
        listed.append({"name": name, **body})
    doc: dict[str, Any] = {"agents": listed}
    if tenants is not None:
        doc["tenants"] = tenants
    path.write_text(yaml.safe_dump(doc))
    return path


def demo_tenants(*, networks: list[str] | None = None, agents: list[str] | str = "*") -> dict[str, Any]:
    """Two tenants with their own tokens and their own downstream key for agent ``orders``."""
    return {
        "demo": {
            "token_env": "DEMO_TOKEN",
            "agents": agents,
            "networks": networks if networks is not None else ["127.0.0.0/8"],
            "credentials": {"orders": {"type": "header", "key": "X-Api-Key", "value_env": "DEMO_KEY"}},
        },
        "acme": {
            "token_env": "ACME_TOKEN",
            "agents": ["orders"],
            "networks": ["10.0.0.0/8"],
            "credentials": {"orders": {"type": "header", "key": "X-Api-Key", "value_env": "ACME_KEY"}},
        },
    }


_AGENT_PROCESS = textwrap.dedent(
    """
    import sys
    from reach_plugins.agent import ReachAgent, serve

    agent = ReachAgent(sys.argv[1])

    @agent.capability("query_order")
    def query_order(order_id: str) -> dict:
        print(f"executed {order_id}", flush=True)
        return {"order_id": order_id, "by": sys.argv[2]}

    serve(agent, port=int(sys.argv[3]), log_level="info")
    """
)


class AgentProcess:
    """An agent in its own OS process, so a test can kill it mid-run; it prints each execution."""

    def __init__(self, name: str, label: str, port: int) -> None:
        self.label = label
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-c", _AGENT_PROCESS, name, label, str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.executed: list[str] = []
        self._reader: threading.Thread | None = None

    def wait_ready(self) -> None:
        """Block until uvicorn reports the app started (or the process died)."""
        assert self.process.stderr is not None
        for line in self.process.stderr:
            if "Application startup complete" in line:
                self._reader = threading.Thread(target=self._drain, daemon=True)
                self._reader.start()
                return
        raise RuntimeError(f"agent process {self.label} exited before starting")

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("executed "):
                self.executed.append(line.split()[1])

    def kill(self) -> None:
        """SIGKILL, then collect every execution it reported before dying."""
        self.process.kill()
        self.process.wait()
        if self._reader is not None:
            self._reader.join(5)


async def until(condition: Callable[[], bool], *, within: float = 5.0) -> None:
    """Yield to the event loop until ``condition()`` holds (an assertion error after ``within`` seconds)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not condition():
        if loop.time() > end:
            raise AssertionError(f"condition not reached within {within}s")
        await asyncio.sleep(0.002)


async def until_true(probe: Callable[[], Awaitable[bool]], *, within: float = 15.0) -> None:
    """Await ``probe()`` again and again until it answers True (an assertion error after ``within`` seconds)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not await probe():
        if loop.time() > end:
            raise AssertionError(f"probe did not succeed within {within}s")
        await asyncio.sleep(0.02)


def free_port() -> int:
    """A port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
