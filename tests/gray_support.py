"""Gray faults for the chaos suite (issue 25): agent processes that are slow, skewed or lossy, and a caller's tally.

Each agent is a real uvicorn process serving one ``work`` capability; it
appends the idempotency key of every *completed* execution to a log of its
own, so duplicates are counted where they happen, at the agents. Options:

* ``slow="2,5"``: every ``POST /reach`` waits uniform(2, 5) s before the agent
  sees it (a starved host or a long accept queue: probes of ``/readyz`` and
  ``/healthz`` still answer at once, so the instance looks healthy);
* ``skew=300``: the agent verifies tokens on a clock 300 s ahead of the real one.

Every agent verifies tokens of the cluster's own issuer key (``REACH_ISSUER_KEYS``
in its environment); callers take theirs from :meth:`GrayCluster.tokens`.

Replies lost after executing are a proxy's doing (:class:`LossyProxy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from faultproxy import FaultProxy, _Link
from servers import free_port

from reach_plugins.security.issuer import TokenIssuer
from reach_plugins.security.keys import ENV_KEYS, KeyRing, SigningKey
from reach_plugins.security.source import LocalTokens

AGENT = """
import asyncio, random, sys, time
import uvicorn
from reach_plugins.agent import ReachAgent, ReachContext
from reach_plugins.security.issuer import RingKeys
from reach_plugins.security.keys import KeyRing
from reach_plugins.security.verifier import TokenVerifier
from reach_plugins.server.uvicorn import uvicorn_config

name, port, store, log, instance_id, slow, skew = sys.argv[1:8]
out = open(log, "a", buffering=1)
offset = float(skew)
tokens = TokenVerifier(issuer="reach", keys=RingKeys(KeyRing.load()), clock=lambda: time.time() + offset)
agent = ReachAgent(name, idempotency=store, tokens=tokens)

@agent.capability("work", description="Do some work once per key")
async def work_(n: int, ctx: ReachContext) -> dict:
    await asyncio.sleep(0.005)
    out.write(f"{ctx.idempotency_key or '-'}\\n")
    return {"n": n, "by": instance_id}

app = agent.app
lo, _, hi = slow.partition(",")

async def served(scope, receive, send):
    if scope["type"] != "http" or scope["path"] != "/reach":
        return await app(scope, receive, send)
    if hi:
        await asyncio.sleep(random.uniform(float(lo), float(hi)))
    return await app(scope, receive, send)

uvicorn.Server(uvicorn_config(served, host="127.0.0.1", port=int(port), log_level="critical")).run()
"""


class LossyProxy(FaultProxy):
    """A :class:`FaultProxy` that loses each reply with probability ``loss`` (seeded, one draw per HTTP request):
    the agent has executed the request and answered; the caller sees nothing at all until its own timeout."""

    def __init__(self, upstream: tuple[str, int], *, loss: float, seed: int = 25) -> None:
        super().__init__(upstream)
        self.loss = loss
        self.rng = random.Random(seed)
        self.requests = 0
        self.lost = 0

    async def _requests(self, reader: asyncio.StreamReader, link: _Link) -> None:
        while chunk := await reader.read(65536):
            if chunk.startswith((b"POST ", b"GET ")):
                link.lose_reply = self.rng.random() < self.loss
                self.requests += 1
                self.lost += link.lose_reply
            link.upstream.write(chunk)
            await link.upstream.drain()
        link.upstream.transport.abort()

    async def _replies(self, reader: asyncio.StreamReader, link: _Link) -> None:
        while chunk := await reader.read(65536):
            if not link.lose_reply:
                link.client.write(chunk)
                await link.client.drain()
        link.client.transport.abort()


@dataclass
class GrayAgent:
    """One agent process and the log of the keys it executed."""

    instance_id: str
    port: int
    log: Path
    process: subprocess.Popen[str]

    def executions(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []


@dataclass
class GrayCluster:
    """Instances of agent ``name``, a file registry naming them, and the descriptor's extra YAML."""

    folder: Path
    name: str = "gray"
    agents: list[GrayAgent] = field(default_factory=list)
    key: SigningKey = field(default_factory=SigningKey.generate)
    """The issuer key every agent of the cluster verifies tokens with."""

    def tokens(self, *, ttl: float = 300.0) -> LocalTokens:
        """A caller's token source: tokens signed with the cluster's key, living ``ttl`` seconds."""
        return LocalTokens(TokenIssuer(KeyRing([self.key]), ttl=ttl))

    def start(
        self,
        count: int,
        store: str,
        *,
        slow: dict[int, str] | None = None,
        skew: dict[int, float] | None = None,
    ) -> None:
        for index in range(count):
            instance_id = f"{self.name}-{index}"
            port = free_port()
            log = self.folder / f"{instance_id}.log"
            args = [
                self.name,
                str(port),
                store,
                str(log),
                instance_id,
                (slow or {}).get(index, "0"),
                str((skew or {}).get(index, 0.0)),
            ]
            # stderr to a file: a pipe nobody reads fills up with logged refusals and stalls the agent
            with log.with_suffix(".stderr").open("w") as errors:
                process = subprocess.Popen(
                    [sys.executable, "-c", AGENT, *args],
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                    text=True,
                    env={**os.environ, "PYTHONUNBUFFERED": "1", ENV_KEYS: self.key.pem().decode()},
                )
            self.agents.append(GrayAgent(instance_id, port, log, process))
        for agent in self.agents:
            _wait_listening(agent)

    def registry(self, extra: str = "", *, ports: dict[int, int] | None = None) -> str:
        """A ``file://`` registry with the agent's descriptor: its instances' endpoints (``ports`` replaces some,
        for an instance behind a proxy) and ``extra`` (indented YAML lines under the agent)."""
        lines = [f"      - http://127.0.0.1:{(ports or {}).get(i, a.port)}\n" for i, a in enumerate(self.agents)]
        path = self.folder / "agents.yaml"
        path.write_text(
            f"agents:\n  - name: {self.name}\n    capabilities: [work]\n    endpoints:\n{''.join(lines)}{extra}"
        )
        return f"file://{path}"

    def executions(self) -> Counter[str]:
        """Completed executions by idempotency key, over every instance."""
        return Counter(key for agent in self.agents for key in agent.executions())

    def stop(self) -> None:
        for agent in self.agents:
            if agent.process.poll() is None:
                agent.process.kill()
            agent.process.wait()


def _wait_listening(agent: GrayAgent, within: float = 60.0) -> None:
    """Poll until the agent's port accepts (bounded); fail with its output if it died or never listened."""
    import socket

    end = time.monotonic() + within
    while time.monotonic() < end:
        assert agent.process.poll() is None, agent.log.with_suffix(".stderr").read_text()
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", agent.port), timeout=0.2):
            return
        time.sleep(0.05)
    raise AssertionError(f"agent {agent.instance_id} did not listen on {agent.port} within {within}s")


@contextlib.contextmanager
def gray_cluster(folder: Path, name: str = "gray") -> Iterator[GrayCluster]:
    made = GrayCluster(folder, name)
    try:
        yield made
    finally:
        made.stop()


@dataclass
class Outcomes:
    """What the caller saw per call: final outcome by kind, and how many attempts of each kind its trace shows."""

    final: Counter[str] = field(default_factory=Counter)
    attempts: Counter[str] = field(default_factory=Counter)

    @property
    def calls(self) -> int:
        return sum(self.final.values())

    @property
    def failed(self) -> int:
        return self.calls - self.final["success"]


async def paced(rate: float, count: int, one: object) -> None:
    """Start ``count`` calls ``one(n)`` at ``rate`` a second, then wait for them all."""
    assert callable(one)
    tasks = []
    start = time.monotonic()
    for n in range(count):
        tasks.append(asyncio.create_task(one(n)))
        delay = start + (n + 1) / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
    await asyncio.gather(*tasks)
