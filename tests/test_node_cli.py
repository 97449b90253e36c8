"""``reach node`` as a real process: it serves the config's agents over gRPC and stops cleanly on SIGINT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from hop_support import TOKENS, demo_tenants, free_port, serve_agents, until_true, write_config

from reach_plugins import ReachClient, errors
from transports.grpcnode import GrpcNodeTransport

CLI = "from reach_plugins.cli import main; main()"


async def test_node_command_serves_the_config(tmp_path: Path) -> None:
    """`reach node --config F --host H --port P` answers reaches for the config's tenants and agents."""
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        port = free_port()
        command = [sys.executable, "-c", CLI, "node", "--config", str(config), "--host", "127.0.0.1"]
        process = subprocess.Popen([*command, "--port", str(port), "--workers", "4"], env={**os.environ, **TOKENS})
        transport = GrpcNodeTransport(f"127.0.0.1:{port}", token=TOKENS["DEMO_TOKEN"])

        async def listening() -> bool:
            assert process.poll() is None, "the node process exited"
            try:
                await transport.result("probe")
            except errors.ConnectError:
                return False
            except errors.RequestError:
                pass
            return True

        try:
            await until_true(listening)
            async with ReachClient(str(config), transport, tenant="demo", environ=TOKENS) as client:
                response = await client.reach("query_order", {"order_id": "CLI"}, timeout_ms=2000)
        finally:
            process.send_signal(signal.SIGINT)
            code = process.wait(10)
    assert response.ok and response.data == {"order_id": "CLI", "by": "o1"}
    assert code == 0
