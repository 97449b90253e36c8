"""What a 1 MB media part costs per transport: direct HTTP, through the gateway, through the node.

One agent (the SDK, uvicorn), a gateway (``reach gateway``) and a node (``reach node``) in front of it, each
its own process on loopback; the client in this one.
For each transport, calls made one after another: without media (``base``),
with a 1 MB part sent and a small answer (``up``), and with the part sent and
returned (``round``). Overhead = p50(up or round) - p50(base). HTTP carries
parts as base64 in the JSON body, gRPC as a ``bytes`` field; the table also
gives the base64 encode + checked decode of 1 MB alone (``codec``).

    python benchmarks/bench_media.py          # prints the table, writes benchmarks/results/media.json
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from reach_plugins import MediaPart, ReachClient
from reach_plugins.media import parts_from_wire
from reach_plugins.transport import Transport
from transports.direct import DirectTransport
from transports.gateway import GatewayTransport
from transports.grpcnode import GrpcNodeTransport

CALLS = 40
WARMUP = 5
SIZE = 1_000_000
LIMIT = 2 << 20
"""Each capability's ``max_media_bytes`` (media is opted into): room for one part of SIZE."""
TOKEN = "tok-bench"
ENVIRON = {"BENCH_TOKEN": TOKEN}
RESULTS = Path(__file__).parent / "results" / "media.json"


AGENT = textwrap.dedent(
    """
    import sys
    from reach_plugins import MediaPart
    from reach_plugins.agent import ReachAgent, WithMedia, serve

    agent = ReachAgent("studio", tokens="open")

    @agent.capability("sizes", max_media_bytes=LIMIT)
    def sizes(media: list[MediaPart]) -> list[int]:
        return [part.size for part in media]

    @agent.capability("echo_media", max_media_bytes=LIMIT)
    def echo_media(media: list[MediaPart]) -> WithMedia:
        return WithMedia(data=len(media), media=tuple(media))

    serve(agent, port=int(sys.argv[1]), log_level="warning")
    """
)
CLI = [sys.executable, "-c", "from reach_plugins.cli import main; main()"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextmanager
def process(command: list[str], port: int) -> Iterator[None]:
    """``command`` running until it listens on ``port``; stopped on exit."""
    env = {**os.environ, **ENVIRON}
    running = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end and running.poll() is None:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"{command[:4]} did not listen on {port}")
        yield
    finally:
        running.terminate()
        running.wait(10)


def write_config(folder: Path, url: str) -> Path:
    doc = {
        "agents": [
            {
                "name": "studio",
                "endpoints": [url],
                "capabilities": [{"name": name, "max_media_bytes": LIMIT} for name in ("sizes", "echo_media")],
            }
        ],
        "tenants": {"bench": {"token_env": "BENCH_TOKEN", "agents": "*", "networks": ["127.0.0.0/8"]}},
    }
    path = folder / "agents.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@contextmanager
def servers(folder: Path) -> Iterator[tuple[dict[str, Callable[[], Transport]], str]]:
    """The agent, a gateway and a node, each a process; how to reach the agent through each."""
    agent_port, gateway_port, node_port = free_port(), free_port(), free_port()
    with process([sys.executable, "-c", AGENT, str(agent_port)], agent_port):
        config = str(write_config(folder, f"http://127.0.0.1:{agent_port}"))
        with (
            process([*CLI, "gateway", "--config", config, "--port", str(gateway_port)], gateway_port),
            process([*CLI, "node", "--config", config, "--port", str(node_port)], node_port),
        ):
            yield (
                {
                    "direct": DirectTransport,
                    "gateway": lambda: GatewayTransport(f"http://127.0.0.1:{gateway_port}", token=TOKEN),
                    "node": lambda: GrpcNodeTransport(f"127.0.0.1:{node_port}", token=TOKEN),
                },
                config,
            )


async def p50_ms(call: Callable[[], Awaitable[Any]]) -> float:
    for _ in range(WARMUP):
        await call()
    times = []
    for _ in range(CALLS):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def measure(client: ReachClient, part: MediaPart) -> dict[str, float]:
    async def base() -> None:
        (await client.reach("sizes", timeout_ms=10_000)).raise_for_status()

    async def up() -> None:
        (await client.reach("sizes", media=[part], timeout_ms=10_000)).raise_for_status()

    async def round_trip() -> None:
        response = (await client.reach("echo_media", media=[part], timeout_ms=10_000)).raise_for_status()
        assert response.media[0].data == part.data

    figures = {"base_p50_ms": await p50_ms(base), "up_p50_ms": await p50_ms(up)}
    figures["round_p50_ms"] = await p50_ms(round_trip)
    figures["up_overhead_ms"] = figures["up_p50_ms"] - figures["base_p50_ms"]
    figures["round_overhead_ms"] = figures["round_p50_ms"] - figures["base_p50_ms"]
    return figures


def codec_ms(part: MediaPart) -> float:
    times = []
    for _ in range(CALLS):
        started = time.perf_counter()
        wire = json.loads(json.dumps([part.to_wire()]))
        parts_from_wire(wire, limit=SIZE, capability="sizes")
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def main() -> None:
    part = MediaPart(media_type="application/octet-stream", data=os.urandom(SIZE))
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder, servers(Path(folder)) as (made, config):
        for name, make in made.items():
            async with ReachClient(f"file://{config}", make(), tenant="bench") as client:
                results[name] = await measure(client, part)
    results["codec"] = {"p50_ms": codec_ms(part)}
    report = {
        "size_bytes": SIZE,
        "calls": CALLS,
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "results": results,
    }
    print(f"1 MB media part, p50 of {CALLS} sequential calls (load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f})")
    print(f"{'transport':<10}{'base ms':>10}{'up ms':>10}{'+up ms':>10}{'round ms':>10}{'+round ms':>11}")
    for name in ("direct", "gateway", "node"):
        r = results[name]
        print(
            f"{name:<10}{r['base_p50_ms']:>10.2f}{r['up_p50_ms']:>10.2f}{r['up_overhead_ms']:>10.2f}"
            f"{r['round_p50_ms']:>10.2f}{r['round_overhead_ms']:>11.2f}"
        )
    print(f"base64 encode + JSON + checked decode of 1 MB alone: {results['codec']['p50_ms']:.2f} ms")
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
