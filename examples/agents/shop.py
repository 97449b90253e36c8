"""The sample shop every example agent answers from: a few orders, products and help articles.

Each agent process keeps its own copy, so what one run changes (a cancelled
order, a stock hold) lasts until that process stops.
"""

from __future__ import annotations

from typing import Any

ORDERS: dict[str, dict[str, Any]] = {
    "A1001": {"status": "shipped", "items": ["blue kettle"], "carrier": "SF Express", "eta": "tomorrow"},
    "A1002": {"status": "paid", "items": ["tea set", "cups"], "carrier": None, "eta": "in 3 days"},
    "A1003": {"status": "pending", "items": ["cups"], "carrier": None, "eta": "once paid"},
}

PRODUCTS: dict[str, dict[str, Any]] = {
    "K-7": {"name": "blue kettle", "price": 199, "on_hand": 12},
    "T-2": {"name": "tea set", "price": 349, "on_hand": 0},
    "C-4": {"name": "cups", "price": 59, "on_hand": 40},
}

ARTICLES: dict[str, str] = {
    "Returns": "Items can be returned within 7 days of delivery; broken items are replaced free of charge.",
    "Warranty": "Kettles carry a 2-year warranty covering the heating element.",
    "Delivery": "Orders ship within 48 hours of payment; SF Express delivers in 1-3 days.",
    "Invoices": "An e-invoice is e-mailed once an order ships; ask the order agent for a copy.",
}
