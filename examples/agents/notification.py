"""The notification agent: sends a message to a customer by SMS, e-mail or app push.

    python examples/agents/notification.py                # 127.0.0.1:18107
    python examples/agents/notification.py --registry etcd://127.0.0.1:2379

It is not in examples/agents.yaml (whose ports 18101-18106 are taken), so it
declares its capability itself; register it (``--registry``) or give a client
``agent.descriptor(url)``. The same text to the same person within the
idempotency window is sent once.
"""

from __future__ import annotations

import itertools
from typing import Any

from launch import run_agent

from reach_plugins.agent import ReachAgent
from reach_plugins.errors import BusinessError

PORT = 18107
sent = itertools.count(1)

agent = ReachAgent(
    "notification",
    version="1.0.0",
    description="Sends messages to customers by SMS, e-mail or app push",
    namespace="customer-service",
)


@agent.capability(
    "send_message",
    description="Send a short message to a customer (sms to a phone number, email to an address, app to a user id)",
    params_schema={
        "type": "object",
        "properties": {
            "to": {"type": "string", "minLength": 1},
            "text": {"type": "string", "minLength": 1, "maxLength": 500},
            "channel": {"type": "string", "enum": ["sms", "email", "app"]},
        },
        "required": ["to", "text"],
        "additionalProperties": False,
    },
    return_schema={"type": "object", "required": ["message_id", "status"]},
    scope_tags=["notify", "write"],
    danger_level="medium",
    idempotency_key="${params.to}|${params.text}",
)
async def send_message(to: str, text: str, channel: str = "sms") -> dict[str, Any]:
    if channel == "email" and "@" not in to:
        raise BusinessError(f"{to!r} is not an e-mail address; use channel 'sms' for a phone number")
    return {"message_id": f"M-{next(sent)}", "status": "sent", "channel": channel, "to": to, "characters": len(text)}


if __name__ == "__main__":
    run_agent(agent, PORT)
