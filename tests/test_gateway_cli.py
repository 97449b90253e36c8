"""``reach gateway`` as a real process: it serves the config's agents and refuses a bad config plainly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from hop_support import TOKENS, demo_tenants, free_port, serve_agents, until_true, write_config

from reach_plugins import ReachClient
from transports.gateway import GatewayTransport

CLI = "from reach_plugins.cli import main; main()"


async def answers(url: str, process: subprocess.Popen[bytes]) -> bool:
    assert process.poll() is None, "the gateway process exited"
    try:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"{url}/healthz")).status_code == 200
    except httpx.TransportError:
        return False


async def test_gateway_command_serves_the_config(tmp_path: Path) -> None:
    """`reach gateway --config F --host H --port P` serves /v1/reach for the config's tenants and agents."""
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        port = free_port()
        command = [sys.executable, "-c", CLI, "gateway", "--config", str(config), "--host", "127.0.0.1"]
        process = subprocess.Popen([*command, "--port", str(port)], env={**os.environ, **TOKENS})
        url = f"http://127.0.0.1:{port}"
        try:
            await until_true(lambda: answers(url, process))
            transport = GatewayTransport(url, token=TOKENS["DEMO_TOKEN"])
            async with ReachClient(str(config), transport, tenant="demo", environ=TOKENS) as client:
                response = await client.reach("query_order", {"order_id": "CLI"})
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(10)
    assert response.ok and response.data == {"order_id": "CLI", "by": "o1"}


def test_gateway_command_reports_a_bad_config(tmp_path: Path) -> None:
    """A missing config file ends the command with exit status 2 and a message naming the file."""
    missing = tmp_path / "nowhere.yaml"
    done = subprocess.run(
        [sys.executable, "-c", CLI, "gateway", "--config", str(missing)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert "nowhere.yaml" in done.stdout and "cannot read" in done.stdout
