"""The after-sales agent: opens work orders for returns, repairs and complaints.

    python examples/agents/tickets.py                     # 127.0.0.1:18103, as examples/agents.yaml says

``create_ticket`` takes its idempotency key from the work-order number
(``${params.wo_number}``) and is ``retryable: false``: the old ticket system
behind it is not idempotent, so a repeated key gets the first ticket back
instead of a second one.
"""

from __future__ import annotations

import itertools

from launch import configured_port, from_config, run_agent
from shop import ORDERS

from reach_plugins.errors import BusinessError

numbers = itertools.count(5001)


async def create_ticket(wo_number: str, order_id: str, problem: str) -> dict[str, str]:
    if order_id not in ORDERS:
        raise BusinessError(f"there is no order {order_id}; a ticket needs the order it is about")
    if not problem.strip():
        raise BusinessError("describe the problem in 'problem'")
    return {"ticket_id": f"T-{next(numbers)}", "wo_number": wo_number, "order_id": order_id, "status": "open"}


agent = from_config("tickets", {"create_ticket": create_ticket})

if __name__ == "__main__":
    run_agent(agent, configured_port("tickets"))
