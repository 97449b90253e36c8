"""Trace files from every process (issue 28, deliverable 4): a ``reach gateway`` and a ``reach node`` process
started with ``--trace-file`` write each request's trace there, rotated by size with a bounded number of backups,
and ``reach trace`` / ``reach usage`` read the file and its backups."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from chaos_support import port_answers
from hop_support import TOKENS, demo_tenants, free_port, serve_agents, write_config
from servers import wait_until
from test_credentials_hop import hop

from reach_plugins import ReachClient
from reach_plugins.telemetry.trace import trace_files
from transports.gateway import GatewayTransport

MAX_BYTES = 4000
BACKUPS = 2
CALLS = 30


def _reach(*args: str) -> str:
    """A ``reach`` command run as its own process; its standard output."""
    command = [sys.executable, "-m", "reach_plugins.cli", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "250"})
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


def _written(path: Path, request_id: str) -> bool:
    return any(request_id in file.read_text(encoding="utf-8") for file in trace_files(path))


@pytest.mark.parametrize("kind", ["gateway", "node"])
async def test_a_servers_trace_file_is_written_rotated_and_replayed(tmp_path: Path, kind: str) -> None:
    """30 calls through the hop: every file stays within the size, at most 1 + backups files exist, the newest
    call is replayed by ``reach trace`` (its route decision: agent, instance, reason) and counted by ``reach usage``."""
    traces = tmp_path / "traces.jsonl"
    extra = ("--trace-file", str(traces), "--trace-max-bytes", str(MAX_BYTES), "--trace-backups", str(BACKUPS))
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        async with hop(kind, config, TOKENS, *extra) as transport:
            caller_env = {name: value for name, value in TOKENS.items() if name != "DEMO_KEY"}
            async with ReachClient(str(config), transport, tenant="demo", environ=caller_env) as client:
                answers = [await client.reach("whoami", timeout_ms=5000) for _ in range(CALLS)]
            assert all(answer.ok for answer in answers), [a.error for a in answers if not a.ok]
            last = answers[-1].request_id
            deadline = time.monotonic() + 10
            while not _written(traces, last):
                assert time.monotonic() < deadline, f"request {last} never reached {traces}"
                time.sleep(0.05)

    files = trace_files(traces)
    sizes = {file.name: file.stat().st_size for file in files}
    print(f"{kind}: {CALLS} calls -> trace files {sizes} (max {MAX_BYTES} bytes, {BACKUPS} backups)")
    assert [file.name for file in files] == [f"traces.jsonl.{n}" for n in range(BACKUPS, 0, -1)] + ["traces.jsonl"]
    assert all(size <= MAX_BYTES for size in sizes.values()), sizes
    kept = sum(len(file.read_text(encoding="utf-8").splitlines()) for file in files)
    assert 0 < kept < CALLS, "rotation must have dropped the oldest traces"

    replay = _reach("trace", last[:12], "--file", str(traces))
    assert last in replay and "whoami" in replay and "orders" in replay, replay
    usage = _reach("usage", str(traces))
    row = next(line for line in usage.splitlines() if "demo" in line and "whoami" in line)
    assert f" {kept} " in f" {row.replace('│', ' ')} ", usage


async def test_reach_trace_follows_a_live_gateway_behind_the_operators_token(tmp_path: Path) -> None:
    """``reach trace --follow URL`` (its own process) prints the reaches made through a live gateway after it
    connected; the stream refuses a caller without the operator's (metrics) token, and a tenant's token too."""
    env = {**TOKENS, "OPS_TOKEN": "tok-operator"}
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        async with hop("gateway", config, env, "--metrics-token-env", "OPS_TOKEN") as transport:
            assert isinstance(transport, GatewayTransport)
            route = f"{transport.url}/v1/traces/stream"
            async with httpx.AsyncClient() as http:
                assert (await http.get(route, timeout=5)).status_code == 401
                tenant = {"Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}"}
                assert (await http.get(route, headers=tenant, timeout=5)).status_code == 401
            command = [sys.executable, "-m", "reach_plugins.cli", "trace", "--follow", transport.url]
            command += ["--token-env", "OPS_TOKEN", "--count", "3"]
            follower = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env}
            )
            try:
                assert follower.stdout is not None
                first = await asyncio.wait_for(asyncio.to_thread(follower.stdout.readline), 30)
                assert first.startswith("following"), first + (follower.stderr.read() if follower.stderr else "")
                async with ReachClient(str(config), transport, tenant="demo", environ=TOKENS) as client:
                    answers = [await client.reach("whoami", timeout_ms=5000) for _ in range(3)]
                out, err = await asyncio.to_thread(follower.communicate, timeout=30)
            finally:
                if follower.poll() is None:
                    follower.kill()
                    follower.wait()
    assert follower.returncode == 0, err
    for answer in answers:
        assert answer.ok and answer.request_id in out, (answer.request_id, out)


def test_a_gateway_with_a_follower_connected_stops_at_once(tmp_path: Path) -> None:
    """SIGINT while ``reach trace --follow`` is connected: the gateway ends the stream and exits within seconds
    (uvicorn waits for every response to end; an endless one would hold the shutdown), the follower exits 0."""
    env = {**os.environ, **TOKENS, "OPS_TOKEN": "tok-operator"}
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "reach_plugins.cli", "gateway", "--config", str(config), "--port", str(port)]
    gateway = subprocess.Popen(
        [*command, "--metrics-token-env", "OPS_TOKEN"],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    follower = None
    try:
        wait_until(lambda: port_answers(port) or gateway.poll() is not None, 30, "the gateway listens")
        follower = subprocess.Popen(
            [sys.executable, "-m", "reach_plugins.cli", "trace", "--follow", url, "--token-env", "OPS_TOKEN"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert follower.stdout is not None
        assert follower.stdout.readline().startswith("following")
        gateway.send_signal(signal.SIGINT)
        stopped = time.monotonic()
        gateway.wait(10)
        print(f"gateway exited {time.monotonic() - stopped:.2f}s after SIGINT with a follower connected")
        assert follower.wait(10) == 0, follower.stderr.read() if follower.stderr else ""
    finally:
        for process in (gateway, follower):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
