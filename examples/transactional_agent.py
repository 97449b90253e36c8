"""Commit a handler's effect and its idempotency key in one transaction of its own (the agent SDK's hook).

The SDK claims each ``Idempotency-Key`` before the handler runs and stores the
result afterwards. Between the handler's commit and that store there is a gap:
an instance killed there would leave the key claimable again once its lease
ends. A handler that writes ``ctx.idempotency_scope`` in the same database
transaction as its effect closes the gap: ``ReachAgent(committed=...)`` looks
the key up there before any run, and a committed key is answered, never re-run.

Here the "database" is SQLite; the second agent stands for an instance started
after a crash, with an empty idempotency store, sharing the same database.

    python examples/transactional_agent.py
"""

import asyncio
import json
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer, ReachAgent, ReachContext
from reach_plugins.registry import MemoryRegistry


def build(database: Path) -> ReachAgent:
    """One instance of the payments agent over ``database``."""

    async def committed(scope: str) -> Any:
        with sqlite3.connect(database) as db:
            row = db.execute("SELECT result FROM idempotency WHERE scope = ?", (scope,)).fetchone()
        return None if row is None else json.loads(row[0])

    agent = ReachAgent("payments", committed=committed)

    @agent.capability("charge", idempotency_key="${params.order_id}")
    def charge(order_id: str, cents: int, ctx: ReachContext) -> dict[str, Any]:
        """Charge once per order: the charge and its key commit together, or neither does."""
        with sqlite3.connect(database) as db:  # one transaction: committed on leaving the block
            charge_id = db.execute("INSERT INTO charges (order_id, cents) VALUES (?, ?)", (order_id, cents)).lastrowid
            result = {"charge": charge_id, "order_id": order_id, "cents": cents}
            db.execute("INSERT INTO idempotency VALUES (?, ?)", (ctx.idempotency_scope, json.dumps(result)))
        return result

    return agent


async def charge_once(agent: ReachAgent, name: str) -> dict[str, Any]:
    registry = MemoryRegistry()
    with BackgroundServer(agent.app) as server:
        await agent.register(registry, server.url, instance_id=name)
        async with ReachClient(registry) as client:
            response = await client.reach("charge", {"order_id": "A-7", "cents": 1299})
    data: dict[str, Any] = response.raise_for_status().data
    return data


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        database = Path(folder) / "payments.db"
        with sqlite3.connect(database) as db:
            db.execute("CREATE TABLE charges (id INTEGER PRIMARY KEY, order_id TEXT, cents INTEGER)")
            db.execute("CREATE TABLE idempotency (scope TEXT PRIMARY KEY, result TEXT)")
        first = await charge_once(build(database), "payments-1")
        print(f"first instance charged: {first}")
        again = await charge_once(build(database), "payments-2")  # a fresh instance: its own store is empty
        print(f"a fresh instance answered the same key with: {again}")
        with sqlite3.connect(database) as db:
            (charges,) = db.execute("SELECT COUNT(*) FROM charges").fetchone()
        print(f"charges in the database: {charges}")


if __name__ == "__main__":
    asyncio.run(main())
