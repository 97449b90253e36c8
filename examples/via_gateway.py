"""Reach agents through a Reach gateway: the client sends to the gateway, which authenticates, routes and retries.

One process starts two ``orders`` instances, the gateway (the same app
``reach gateway --config agents.yaml`` serves) and a client with
``GatewayTransport``. The client code is the same as with the direct
transport; only the transport changes. The gateway owns the retries, so the
client does not multiply them.

    python examples/via_gateway.py
"""

import asyncio
import tempfile
from pathlib import Path

from reach_plugins import ReachClient, errors
from reach_plugins.agent import BackgroundServer
from reach_plugins.demo.agents import orders_agent
from reach_plugins.gateway import create_app
from transports.gateway import GatewayTransport

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
"""Where the gateway reads tenant tokens from; in production, the real environment."""


async def main() -> None:
    with (
        BackgroundServer(orders_agent().app) as first,
        BackgroundServer(orders_agent().app) as second,
        tempfile.TemporaryDirectory() as folder,
    ):
        config = Path(folder) / "agents.yaml"
        config.write_text(CONFIG.format(first=first.url, second=second.url))
        with BackgroundServer(create_app(config, environ=ENVIRON)) as gateway:
            print(f"gateway at {gateway.url}")
            transport = GatewayTransport(gateway.url, token=ENVIRON["DEMO_TOKEN"])
            async with ReachClient(str(config), transport, tenant="demo", environ=ENVIRON) as client:
                for order_id in ("A1001", "A1002"):
                    response = await client.reach("query_order", {"order_id": order_id}, session_id="conv-g")
                    data = response.raise_for_status().data
                    print(f"query_order {order_id} -> {data['status']} via the gateway, from {response.instance}")
            intruder = GatewayTransport(gateway.url, token="wrong-token")
            async with ReachClient(str(config), intruder, tenant="demo", environ=ENVIRON) as client:
                try:
                    await client.reach("query_order", {"order_id": "A1001"})
                except errors.Unauthenticated as refused:
                    print(f"wrong token -> {type(refused).__name__} ({refused.code}): {refused.message}")


if __name__ == "__main__":
    asyncio.run(main())
