"""Real processes for the chaos suite: agents that log every completed execution, callers, a gateway, a node.

Every process is a small Python program run with the test's interpreter. Agents
register in etcd (a lease of 2 s: a ``kill -9`` removes them from routing 2 s
later) and append one line per *completed* execution to a log of their own, so
duplicates are counted where they happen: at the agents, by key. Callers print
one JSON summary: each key's first and final outcome and its latency.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servers import free_port, startup_seconds, wait_until

TOKEN = "tok-chaos"
CAPABILITY = "work"

AGENT = """
import asyncio, sqlite3, sys
from reach_plugins.agent import ReachAgent, ReachContext, serve
from reach_plugins.registry import open_registry

name, port, registry, store, work, log, instance_id, effects = sys.argv[1:9]
advertise = sys.argv[9] if len(sys.argv) > 9 else f"http://127.0.0.1:{port}"
out = open(log, "a", buffering=1)

def database() -> sqlite3.Connection:
    return sqlite3.connect(effects, timeout=30, isolation_level=None)

async def committed(scope: str):
    row = database().execute("SELECT n FROM executions WHERE scope = ? LIMIT 1", (scope,)).fetchone()
    return None if row is None else {"n": row[0], "by": "the ledger"}

# The callers are other processes with keys of their own: this agent runs in the named open mode.
agent = ReachAgent(name, idempotency=store, committed=committed if effects != "-" else None, tokens="open")

@agent.capability("work", description="Do some work once per key")
async def work_(n: int, ctx: ReachContext) -> dict:
    await asyncio.sleep(float(work))
    if effects == "-":
        out.write(f"{ctx.idempotency_key}\\n")
    else:  # the effect and its key in one transaction (the hook's documented use)
        database().execute("INSERT INTO executions VALUES (?, ?, ?)", (ctx.idempotency_key, ctx.idempotency_scope, n))
    return {"n": n, "by": instance_id}

agent.register_on_startup(open_registry(registry), advertise, instance_id=instance_id)
serve(agent, "127.0.0.1", int(port), loop="asyncio", log_level="warning")
"""

CALLER = """
import asyncio, json, sys, time
from reach_plugins import ReachClient
from reach_plugins.errors import ReachError

registry, store, hop, prefix, first, count, concurrency, timeout_ms, retry_for = sys.argv[1:10]
kind, _, where = hop.partition("=")
if kind == "gateway":
    from transports.gateway import GatewayTransport
    transport = GatewayTransport(where, token="tok-chaos")
elif kind == "node":
    from transports.grpcnode import GrpcNodeTransport
    transport = GrpcNodeTransport(where, token="tok-chaos")
else:
    from transports.direct import DirectTransport
    transport = DirectTransport()

async def main() -> None:
    client = ReachClient(registry=registry, store=store, transport=transport, tenant="demo")
    gate = asyncio.Semaphore(int(concurrency))
    results = {}

    async def one(n: int) -> None:
        key = f"{prefix}-{n}"
        async with gate:
            started = time.monotonic()
            outcomes, errors = [], []
            while True:
                try:
                    response = await client.reach("work", {"n": n}, idempotency_key=key, timeout_ms=int(timeout_ms))
                    outcome = "success" if response.ok else (response.error.type if response.error else "fail")
                except ReachError as exc:
                    outcome = type(exc).__name__
                    errors.append(str(exc)[:300])
                outcomes.append(outcome)
                if outcome == "success" or time.monotonic() - started > float(retry_for):
                    break
                await asyncio.sleep(0.5)
            results[key] = {"outcomes": outcomes, "seconds": time.monotonic() - started, "errors": errors[-1:]}

    print("ready", flush=True)
    sys.stdin.readline()
    await asyncio.gather(*(one(n) for n in range(int(first), int(first) + int(count))))
    print(json.dumps(results), flush=True)
    await client.aclose()

asyncio.run(main())
"""

HOP = """
import asyncio, sys
from reach_plugins.config.loader import load_config
from reach_plugins.server.access import Access
from reach_plugins.server.forwarder import Forwarder
from reach_plugins.registry import open_registry
from reach_plugins.stores.urls import open_store

kind, port, config, registry, store = sys.argv[1:6]
tenants = load_config(config).tenants
environ = {"CHAOS_TOKEN": "tok-chaos"}
forwarder = Forwarder(open_registry(registry), tenants=tenants, store=open_store(store), environ=environ,
                      owns_registry=True)
access = Access(tenants, environ)
if kind == "gateway":
    import uvicorn
    from reach_plugins.server.uvicorn import uvicorn_config
    from reach_plugins.gateway.app import Gateway
    app = Gateway(forwarder, access).app()
    uvicorn.Server(uvicorn_config(app, host="127.0.0.1", port=int(port), log_level="warning")).run()
else:
    from reach_plugins.node.server import NodeServer

    async def main() -> None:
        node = NodeServer(forwarder, access, host="127.0.0.1", port=int(port))
        await node.start()
        await asyncio.Event().wait()

    asyncio.run(main())
"""


def _spawn(code: str, *args: str, stdin: bool = False) -> subprocess.Popen[str]:
    """A Python process running ``code``; its stderr goes to a file (a pipe nobody reads would fill up and stall
    it after a few dozen logged tracebacks), read back by :func:`errors_of`."""
    with tempfile.NamedTemporaryFile("w", prefix="chaos-", suffix=".stderr", delete=False) as errors:
        process = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    _ERRORS[process.pid] = Path(errors.name)
    return process


_ERRORS: dict[int, Path] = {}
"""Each spawned process's stderr file, by pid."""


def errors_of(process: subprocess.Popen[str]) -> str:
    """What ``process`` wrote to stderr so far."""
    path = _ERRORS.get(process.pid)
    return path.read_text(errors="replace") if path is not None and path.exists() else ""


def port_answers(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


@dataclass
class AgentProc:
    """One agent instance process."""

    instance_id: str
    port: int
    log: Path
    args: tuple[str, ...]
    process: subprocess.Popen[str] | None = None

    def spawn(self) -> None:
        self.process = _spawn(AGENT, *self.args)

    def started(self) -> None:
        wait_until(
            lambda: port_answers(self.port) or self._died(), startup_seconds(), f"agent {self.instance_id} start"
        )
        assert not self._died(), self._stderr()

    def _died(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def _stderr(self) -> str:
        assert self.process is not None
        return errors_of(self.process)

    def kill(self) -> None:
        """``kill -9``: no chance to answer, deregister or store anything."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def executions(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []


@dataclass
class Cluster:
    """Agent instances of one agent, sharing a registry prefix; callers and hops started beside them."""

    folder: Path
    registry: str
    name: str
    agents: list[AgentProc] = field(default_factory=list)
    others: list[subprocess.Popen[str]] = field(default_factory=list)

    def add_agents(
        self,
        count: int,
        store: str,
        work: float,
        *,
        ports: dict[int, tuple[int, int]] | None = None,
        transactional: bool = False,
    ) -> None:
        """Start ``count`` instances at once (``ports``: index -> (listen, advertised) for one behind a proxy).

        ``transactional`` agents commit each execution and its key in one SQLite transaction shared by every
        instance and pass the agent SDK's ``committed`` hook; the others append each execution to a log.
        """
        effects = "-"
        if transactional:
            effects = str(self.effects)
            with sqlite3.connect(self.effects) as db:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("CREATE TABLE IF NOT EXISTS executions (key TEXT, scope TEXT, n INTEGER)")
        made = []
        for index in range(count):
            instance_id = f"{self.name}-{len(self.agents)}"
            port, advertised = (ports or {}).get(index, (free_port(), 0))
            log = self.folder / f"{instance_id}.log"
            args = [self.name, str(port), self.registry, store, str(work), str(log), instance_id, effects]
            if advertised:
                args.append(f"http://127.0.0.1:{advertised}")
            agent = AgentProc(instance_id, port, log, tuple(args))
            agent.spawn()
            self.agents.append(agent)
            made.append(agent)
        for agent in made:
            agent.started()

    @property
    def effects(self) -> Path:
        return self.folder / "effects.db"

    def executions(self) -> Counter[str]:
        """Completed executions by key: every instance's log plus the transactional agents' database."""
        counts = Counter(key for agent in self.agents for key in agent.executions())
        if self.effects.exists():
            with contextlib.closing(sqlite3.connect(self.effects, timeout=30)) as db:
                counts.update(key for (key,) in db.execute("SELECT key FROM executions"))
        return counts

    def duplicates(self) -> dict[str, int]:
        """Keys completed more than once, across every instance."""
        return {key: n for key, n in self.executions().items() if n > 1}

    def completed(self) -> int:
        return sum(self.executions().values())

    def config(self) -> Path:
        path = self.folder / "tenants.yaml"
        path.write_text('tenants:\n  demo:\n    token_env: CHAOS_TOKEN\n    agents: ["*"]\nagents: []\n')
        return path

    def hop(self, kind: str, store: str, port: int | None = None) -> tuple[subprocess.Popen[str], int]:
        """A gateway (``kind="gateway"``) or node process routing over the same registry, with ``store``."""
        port = port or free_port()
        process = _spawn(HOP, kind, str(port), str(self.config()), self.registry, store)
        wait_until(lambda: port_answers(port) or process.poll() is not None, startup_seconds(), f"{kind} start")
        assert process.poll() is None, errors_of(process)
        self.others.append(process)
        return process, port

    def callers(
        self,
        store: str,
        *,
        hop: str = "direct",
        keys: int,
        processes: int = 2,
        same_keys: bool = True,
        concurrency: int = 20,
        timeout_ms: int = 4000,
        retry_for: float = 0.0,
        prefix: str | None = None,
    ) -> list[subprocess.Popen[str]]:
        """Caller processes, ready and waiting for :func:`go`; each sends ``keys`` keys (the same ones by default)."""
        prefix = prefix or uuid.uuid4().hex[:8]
        started = []
        for index in range(processes):
            first = 0 if same_keys else index * keys
            args = [self.registry, store, hop, prefix, str(first), str(keys), str(concurrency)]
            process = _spawn(CALLER, *args, str(timeout_ms), str(retry_for), stdin=True)
            self.others.append(process)
            started.append(process)
        for process in started:
            assert process.stdout is not None
            line = process.stdout.readline()
            assert line.strip() == "ready", errors_of(process) or line
        return started

    def stop(self) -> None:
        for agent in self.agents:
            agent.kill()
            if agent.process is not None:
                _ERRORS.pop(agent.process.pid, Path()).unlink(missing_ok=True)
        for process in self.others:
            if process.poll() is None:
                process.kill()
            process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()
            _ERRORS.pop(process.pid, Path()).unlink(missing_ok=True)


def go(callers: list[subprocess.Popen[str]]) -> None:
    for process in callers:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()


def results(callers: list[subprocess.Popen[str]], timeout: float = 120.0) -> dict[str, list[dict[str, Any]]]:
    """Every caller's per-key summary (key -> list of one summary per caller that sent it)."""
    merged: dict[str, list[dict[str, Any]]] = {}
    for process in callers:
        out, err = process.communicate(timeout=timeout)
        assert process.returncode == 0, err[-3000:]
        for key, summary in json.loads(out.strip().splitlines()[-1]).items():
            merged.setdefault(key, []).append(summary)
    return merged


@dataclass(frozen=True)
class Tally:
    """What the callers saw: first-try and final outcomes by kind, and latency percentiles (seconds)."""

    calls: int
    first: Counter[str]
    final: Counter[str]
    p50: float
    p99: float

    def line(self, scenario: str, duplicates: int) -> str:
        unknown = self.final.get("outcome_unknown", 0) + self.final.get("OutcomeUnknown", 0)
        failed = self.calls - self.final.get("success", 0) - unknown
        return (
            f"{scenario}: calls={self.calls} duplicates={duplicates} first-try={dict(self.first)} "
            f"final OutcomeUnknown={unknown} other failures={failed} p50={self.p50:.3f}s p99={self.p99:.3f}s"
        )


def tally(merged: dict[str, list[dict[str, Any]]]) -> Tally:
    summaries = [summary for per_key in merged.values() for summary in per_key]
    seconds = sorted(summary["seconds"] for summary in summaries)

    def pick(q: float) -> float:
        return seconds[min(len(seconds) - 1, int(q * len(seconds)))] if seconds else 0.0

    return Tally(
        calls=len(summaries),
        first=Counter(summary["outcomes"][0] for summary in summaries),
        final=Counter(summary["outcomes"][-1] for summary in summaries),
        p50=pick(0.5),
        p99=pick(0.99),
    )


def wait_for_executions(cluster: Cluster, at_least: int, timeout: float = 30.0) -> None:
    wait_until(lambda: cluster.completed() >= at_least, timeout, f"{at_least} executions")


@contextmanager
def cluster(folder: Path, etcd_url: str, name: str = "tickets") -> Iterator[Cluster]:
    """A cluster under a registry prefix of its own (etcd lease 2 s); every process killed at the end."""
    prefix = uuid.uuid4().hex[:8]
    registry = f"{etcd_url}/chaos-{prefix}?lease_ttl=2"
    made = Cluster(folder, registry, f"{name}-{prefix}")
    try:
        yield made
    finally:
        made.stop()
