"""Trace files from every process (issue 28, deliverable 4): a ``reach gateway`` and a ``reach node`` process
started with ``--trace-file`` write each request's trace there, rotated by size with a bounded number of backups,
and ``reach trace`` / ``reach usage`` read the file and its backups."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hop_support import TOKENS, demo_tenants, serve_agents, write_config
from test_credentials_hop import hop

from reach_plugins import ReachClient
from reach_plugins.telemetry.trace import trace_files

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
