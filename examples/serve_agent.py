"""Serve Python functions as a Reach agent with the agent SDK, register it, and reach it.

A capability is a decorated function; the SDK serves it over the reach wire
protocol (``POST /reach``, ``/healthz``, ``/readyz``), answers business errors
as such, runs each ``Idempotency-Key`` once, and keeps the registration alive
with heartbeats.

    python examples/serve_agent.py               # serve, reach it twice, stop (offline, seconds)
    python examples/serve_agent.py --forever     # serve on 127.0.0.1:8101 until Ctrl-C
"""

import argparse
import asyncio
import itertools

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer, ReachAgent, ReachContext, serve
from reach_plugins.errors import BusinessError
from reach_plugins.registry import MemoryRegistry

agent = ReachAgent("tickets", version="1.0.0", description="Opens after-sales tickets")
numbers = itertools.count(5001)


@agent.capability(
    "create_ticket",
    description="Open an after-sales ticket for a broken item or a complaint",
    params_schema={
        "type": "object",
        "properties": {"wo_number": {"type": "string"}, "summary": {"type": "string"}},
        "required": ["wo_number", "summary"],
    },
    idempotency_key="${params.wo_number}",
    retryable=False,
)
def create_ticket(wo_number: str, summary: str, ctx: ReachContext) -> dict[str, str]:
    """Runs once per work-order number: a repeated key gets the first answer back."""
    if not summary.strip():
        raise BusinessError("describe the problem in summary")
    return {"ticket": f"T-{next(numbers)}", "wo_number": wo_number, "conversation": ctx.session_id or ""}


async def demo() -> None:
    registry = MemoryRegistry()
    with BackgroundServer(agent.app) as server:
        registration = await agent.register(registry, server.url, instance_id="tickets-1")
        print(f"serving {agent.name} at {server.url}: {[c.name for c in agent.capabilities]}")
        async with ReachClient(registry) as client:
            for attempt in (1, 2):
                response = await client.reach(
                    "create_ticket", {"wo_number": "WO-88", "summary": "kettle arrived broken"}, session_id="conv-9"
                )
                print(f"call {attempt}: {response.raise_for_status().data} from {response.instance}")
        await registration.stop()
    print("deregistered and stopped")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forever", action="store_true", help="serve until interrupted")
    parser.add_argument("--port", type=int, default=8101)
    options = parser.parse_args()
    if options.forever:
        serve(agent, "127.0.0.1", options.port)
    else:
        asyncio.run(demo())
