"""One agent of the chain in ``02_multi_agent_chain``, run as its own process.

    python chain_agent.py NAME PORT REGISTRY_URL SPANS_FILE

``desk`` offers ``handle_request`` and reaches ``query_order``; ``orders``
offers ``query_order`` and reaches ``check_inventory``; ``inventory`` answers.
Each process exports its OpenTelemetry spans as JSON lines to ``SPANS_FILE``,
so the notebook can draw one trace across the three processes.
"""

import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from reach_plugins import ReachClient
from reach_plugins.agent import ReachAgent, ReachContext, serve


class JsonLinesExporter(SpanExporter):
    """Appends each finished span to a file, one JSON object a line."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                out.write(span.to_json(indent=None) + "\n")
        return SpanExportResult.SUCCESS


def build(name: str, registry: str, provider: TracerProvider) -> ReachAgent:
    agent = ReachAgent(name, tracer_provider=provider)
    client = ReachClient(registry, tracer_provider=provider)

    if name == "desk":

        @agent.capability("handle_request", description="Answer a customer's message")
        async def handle_request(message: str, order_id: str) -> dict[str, Any]:
            await asyncio.sleep(0.004)  # reading the message
            order = await client.reach("query_order", {"order_id": order_id}, timeout_ms=5000)
            return {"reply": f"{message}: {order.raise_for_status().data}"}

    elif name == "orders":

        @agent.capability("query_order", description="Find an order and whether its items are in stock")
        async def query_order(order_id: str, ctx: ReachContext) -> dict[str, Any]:
            await asyncio.sleep(0.006)  # the order database
            stock = await client.reach("check_inventory", {"sku": "K-7"}, session_id=ctx.session_id)
            return {"order_id": order_id, "status": "shipped", "stock": stock.raise_for_status().data}

    else:

        @agent.capability("check_inventory", description="Units of a product in stock")
        def check_inventory(sku: str) -> dict[str, Any]:
            time.sleep(0.008)  # the warehouse system (a blocking handler runs in a worker thread)
            return {"sku": sku, "on_hand": 12}

    return agent


if __name__ == "__main__":
    name, port, registry, spans = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(spans)))
    serve(build(name, registry, provider), "127.0.0.1", port)
