"""The front desk: reads what the customer wrote and says which kind of help it needs.

    python examples/agents/front_desk.py                  # 127.0.0.1:18101, as examples/agents.yaml says

A keyword table stands in for an intent model: the first row with a word in
the message wins, and anything else is a sales question.
"""

from __future__ import annotations

import re

from launch import configured_port, from_config, run_agent

INTENTS = (
    ("after_sales", {"broken", "refund", "repair", "complaint", "damaged", "ticket"}),
    ("order", {"order", "cancel", "deliver", "delivery", "shipped", "where"}),
    ("stock", {"stock", "available", "sku", "units"}),
    ("knowledge", {"policy", "warranty", "return", "invoice", "how"}),
)


async def triage_request(message: str) -> dict[str, str]:
    words = set(re.findall(r"[a-z]+", message.lower()))
    intent = next((name for name, keys in INTENTS if words & keys), "sales")
    return {"intent": intent}


agent = from_config("front-desk", {"triage_request": triage_request})

if __name__ == "__main__":
    run_agent(agent, configured_port("front-desk"))
