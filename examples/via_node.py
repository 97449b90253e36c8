"""Reach agents through a Reach node: the client speaks gRPC to a node next to the agents.

One process starts two ``orders`` instances, a node (the same server ``reach
node --config agents.yaml`` runs) and a client with ``GrpcNodeTransport``. The
node authenticates the tenant, routes, retries and keeps a bounded queue; the
client code is the same as with any other transport.

    python examples/via_node.py
"""

import asyncio
import tempfile
from pathlib import Path

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer
from reach_plugins.demo.agents import orders_agent
from reach_plugins.node import build_node
from transports.grpcnode import GrpcNodeTransport

CONFIG = """
agents:
  - name: orders
    endpoints: [{first}, {second}]
    capabilities: [query_order]
tenants:
  demo:
    token_env: DEMO_TOKEN
    agents: "*"
"""
ENVIRON = {"DEMO_TOKEN": "token-of-demo"}
"""Where the node reads tenant tokens from; in production, the real environment."""


async def main() -> None:
    with (
        BackgroundServer(orders_agent().app) as first,
        BackgroundServer(orders_agent().app) as second,
        tempfile.TemporaryDirectory() as folder,
    ):
        config = Path(folder) / "agents.yaml"
        config.write_text(CONFIG.format(first=first.url, second=second.url))
        async with build_node(config, environ=ENVIRON) as node:
            print(f"node at {node.target}")
            transport = GrpcNodeTransport(node.target, token=ENVIRON["DEMO_TOKEN"])
            async with ReachClient(str(config), transport, tenant="demo", environ=ENVIRON) as client:
                for order_id in ("A1001", "A1002"):
                    response = await client.reach("query_order", {"order_id": order_id}, session_id="conv-n")
                    data = response.raise_for_status().data
                    print(f"query_order {order_id} -> {data['status']} via the node, from {response.instance}")
                missing = await client.reach("query_order", {"order_id": "Z9"})
                assert missing.error is not None
                print(f"query_order Z9 -> {missing.status} ({missing.error.type}) after {missing.attempts} attempt")


if __name__ == "__main__":
    asyncio.run(main())
