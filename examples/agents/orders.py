"""The order agent: looks orders up, and cancels the ones that have not shipped.

    python examples/agents/orders.py                      # 127.0.0.1:18102, as examples/agents.yaml says
    python examples/agents/orders.py --port 9102 --registry etcd://127.0.0.1:2379

``cancel_order`` is ``danger_level: high`` in examples/agents.yaml: an enhancer
asks for approval before the call is sent, and the agent asks its own approver
(a scripted stand-in for the support desk here; a webhook URL in production)
before it runs; a shipped order is a business error that tells the caller
what to do instead. Calls must carry a token of the Reach issuer (the SDK's
default; processes started with the same ``$REACH_ISSUER_KEYS`` share one).
"""

from __future__ import annotations

import copy
from typing import Any

from launch import configured_port, from_config, run_agent
from shop import ORDERS

from reach_plugins.agent import ApprovalDecision, ApprovalRequest
from reach_plugins.errors import BusinessError

orders = copy.deepcopy(ORDERS)


def _order(order_id: str) -> dict[str, Any]:
    if order_id not in orders:
        raise BusinessError(f"there is no order {order_id}; order ids look like A1001")
    return orders[order_id]


async def query_order(order_id: str) -> dict[str, Any]:
    return {"order_id": order_id, **_order(order_id)}


async def cancel_order(order_id: str, reason: str = "") -> dict[str, Any]:
    order = _order(order_id)
    if order["status"] in ("shipped", "delivered"):
        raise BusinessError(f"order {order_id} has {order['status']}; open an after-sales ticket instead")
    order["status"] = "cancelled"
    return {"cancelled": True, "order_id": order_id, "reason": reason}


def support_desk(request: ApprovalRequest) -> ApprovalDecision:
    """The support desk's approval, scripted: a cancellation asked for by a verified tenant of one order is approved."""
    if not request.verified or request.tenant is None:
        return ApprovalDecision(False, "support-desk", "the caller's tenant is not verified")
    return ApprovalDecision(
        True, "support-desk", f"order {request.payload.get('order_id')} for tenant {request.tenant}"
    )


agent = from_config("orders", {"query_order": query_order, "cancel_order": cancel_order}, approver=support_desk)

if __name__ == "__main__":
    run_agent(agent, configured_port("orders"))
