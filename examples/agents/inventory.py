"""The inventory agent: stock levels, and holds on stock for an order.

    python examples/agents/inventory.py                   # 127.0.0.1:18105, as examples/agents.yaml says

``lock_stock`` holds units for an order; its idempotency key is the order and
the product, so a retried hold never takes the units twice.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

from launch import configured_port, from_config, run_agent
from shop import PRODUCTS

from reach_plugins.errors import BusinessError

products = copy.deepcopy(PRODUCTS)
holds = itertools.count(1)


def _product(sku: str) -> dict[str, Any]:
    if sku not in products:
        raise BusinessError(f"unknown SKU {sku}; known SKUs: {', '.join(products)}")
    return products[sku]


async def check_inventory(sku: str) -> dict[str, Any]:
    product = _product(sku)
    return {"sku": sku, "name": product["name"], "available": product["on_hand"]}


async def lock_stock(sku: str, quantity: int, order_id: str) -> dict[str, Any]:
    product = _product(sku)
    if quantity > product["on_hand"]:
        raise BusinessError(f"only {product['on_hand']} x {product['name']} in stock; {quantity} asked for {order_id}")
    product["on_hand"] -= quantity
    lock = f"L-{next(holds)}"
    return {"lock_id": lock, "sku": sku, "quantity": quantity, "order_id": order_id, "available": product["on_hand"]}


agent = from_config("inventory", {"check_inventory": check_inventory, "lock_stock": lock_stock})

if __name__ == "__main__":
    run_agent(agent, configured_port("inventory"))
