"""The demo's customer-service agents, served for real by the agent SDK: orders, inventory, tickets, knowledge.

Their data is a small in-memory shop so every run answers the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Literal

from opentelemetry.trace import TracerProvider

from reach_plugins.agent import ReachAgent, ReachContext
from reach_plugins.errors import BusinessError
from reach_plugins.security.verifier import TokenVerifier

ORDERS: dict[str, dict[str, Any]] = {
    "A1001": {"status": "shipped", "items": ["blue kettle"], "carrier": "SF Express", "eta": "tomorrow"},
    "A1002": {"status": "paid", "items": ["tea set", "cups"], "carrier": None, "eta": "in 3 days"},
}
STOCK = {
    "K-7": {"name": "blue kettle", "on_hand": 12, "warehouse": "Hangzhou"},
    "T-2": {"name": "tea set", "on_hand": 0},
}
KNOWLEDGE = {
    "return": "Items can be returned within 7 days of delivery; broken items are replaced free of charge.",
    "warranty": "Kettles carry a 2-year warranty covering the heating element.",
}

ORDER_ID = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}


def orders_agent(tracer_provider: TracerProvider | None = None) -> ReachAgent:
    """Looks orders up; remembers per conversation which orders it was asked about (session state)."""
    agent = ReachAgent("orders", version="1.4.0", description="Looks orders up by id", tracer_provider=tracer_provider)

    @agent.capability(
        "query_order",
        description="Find an order by its id and report its status, items and delivery estimate",
        params_schema=ORDER_ID,
        return_schema={"type": "object", "required": ["order_id", "status"]},
        scope_tags=["orders"],
    )
    def query_order(order_id: str, ctx: ReachContext) -> dict[str, Any]:
        if order_id not in ORDERS:
            raise BusinessError(f"there is no order {order_id}; order ids look like A1001")
        seen = ctx.state.setdefault("asked_about", [])
        if order_id not in seen:
            seen.append(order_id)
        return {"order_id": order_id, **ORDERS[order_id], "asked_in_this_conversation": list(seen)}

    return agent


def inventory_agent(tracer_provider: TracerProvider | None = None) -> ReachAgent:
    agent = ReachAgent(
        "inventory", description="Knows what is in stock in which warehouse", tracer_provider=tracer_provider
    )

    @agent.capability(
        "check_inventory",
        description="Check how many units of a product (by SKU) are in stock",
        params_schema={"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]},
        scope_tags=["inventory"],
    )
    def check_inventory(sku: str) -> dict[str, Any]:
        if sku not in STOCK:
            raise BusinessError(f"unknown SKU {sku}; SKUs look like K-7")
        return {"sku": sku, **STOCK[sku]}

    return agent


def tickets_agent(tracer_provider: TracerProvider | None = None) -> ReachAgent:
    """Opens after-sales tickets; the work-order number is the idempotency key, so a retry files one ticket."""
    agent = ReachAgent("tickets", description="Opens after-sales tickets", tracer_provider=tracer_provider)
    numbers = itertools.count(5001)

    @agent.capability(
        "create_ticket",
        description="Open an after-sales ticket (a complaint, a broken item, a refund request)",
        params_schema={
            "type": "object",
            "properties": {
                "wo_number": {"type": "string"},
                "order_id": {"type": "string"},
                "summary": {"type": "string"},
            },
            "required": ["wo_number", "summary"],
        },
        idempotency_key="${params.wo_number}",
        retryable=False,
        scope_tags=["after_sales"],
    )
    def create_ticket(wo_number: str, summary: str, order_id: str = "") -> dict[str, Any]:
        return {"ticket": f"T-{next(numbers)}", "wo_number": wo_number, "order_id": order_id, "summary": summary}

    return agent


def knowledge_agent(
    tracer_provider: TracerProvider | None = None, *, tokens: TokenVerifier | Literal["open"] | None = None
) -> ReachAgent:
    """The help-centre agent; ``tokens`` as :class:`ReachAgent` takes them (it verifies by default)."""
    agent = ReachAgent(
        "knowledge",
        description="Answers policy questions from the help centre",
        tracer_provider=tracer_provider,
        tokens=tokens,
    )

    @agent.capability(
        "search_knowledge",
        description="Search the help centre for return, refund and warranty policies",
        params_schema={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        scope_tags=["knowledge"],
    )
    def search_knowledge(query: str) -> dict[str, Any]:
        hits = [text for key, text in KNOWLEDGE.items() if key in query.lower()]
        return {"query": query, "answers": hits or ["No article matches; a human will follow up."]}

    return agent


def scenario() -> list[tuple[Callable[[TracerProvider | None], ReachAgent], int]]:
    """Each agent's factory with how many instances the demo runs (orders runs two, to survive losing one).

    Every instance is its own process-like object with its own session state.
    """
    return [(orders_agent, 2), (inventory_agent, 1), (tickets_agent, 1), (knowledge_agent, 1)]
