"""Quickstart: reach agents by capability with ReachClient; agents listed in YAML, served by the agent SDK.

Two ``orders`` instances and one ``knowledge`` agent run on 127.0.0.1 (the
agent SDK, real HTTP); a YAML file lists them; the client names a capability,
never a URL. Calls of one conversation stay on one instance (session
affinity), and a business error comes back as a failed response, not retried.

    python examples/quickstart_client.py        # offline, no API key, a few seconds
"""

import asyncio
import tempfile
from pathlib import Path

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer
from reach_plugins.demo.agents import knowledge_agent, orders_agent

AGENTS_YAML = """
agents:
  - name: orders
    endpoints: [{orders_1}, {orders_2}]
    capabilities: [query_order]
    retry: {{max_attempts: 3, base_wait: 50ms}}
  - name: knowledge
    endpoint: {knowledge}
    capabilities: [search_knowledge]
"""


async def main() -> None:
    with (
        BackgroundServer(orders_agent().app) as orders_1,
        BackgroundServer(orders_agent().app) as orders_2,
        BackgroundServer(knowledge_agent().app) as knowledge,
        tempfile.TemporaryDirectory() as folder,
    ):
        config = Path(folder) / "agents.yaml"
        config.write_text(AGENTS_YAML.format(orders_1=orders_1.url, orders_2=orders_2.url, knowledge=knowledge.url))
        async with ReachClient(f"file://{config}") as client:
            served_by = set()
            for order_id in ("A1001", "A1002"):
                response = await client.reach("query_order", {"order_id": order_id}, session_id="conv-1")
                data = response.raise_for_status().data
                served_by.add(response.instance)
                print(f"query_order {order_id} -> {data['status']}, asked so far: {data['asked_in_this_conversation']}")
            print(f"affinity: conv-1 was served by {len(served_by)} instance ({served_by.pop()})")

            answer = await client.reach("search_knowledge", {"query": "return policy"})
            print(f"search_knowledge -> {answer.raise_for_status().data['answers'][0]}")

            refused = await client.reach("query_order", {"order_id": "Z9"})
            assert refused.error is not None
            print(f"query_order Z9 -> {refused.status} ({refused.error.type}): {refused.error.message}")
            print(f"attempts for the refused call: {refused.attempts} (business errors are never retried)")


if __name__ == "__main__":
    asyncio.run(main())
