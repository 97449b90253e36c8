"""A fake private order assistant speaking its own JSON (a ``raw-http`` agent), as in the seeds.

    python examples/agents/private_orders.py              # 127.0.0.1:18108, POST /api/chat

It takes ``{"question", "uid"}`` and wraps its answer in business fields:
``{"code": 0, "data": {"message": {"role", "content"}, "order_info": {...}}}``,
or ``{"code": 1001, "msg": "..."}`` when it cannot help. :func:`descriptor` is
how a client describes it: the request template and the response mapping
turn that into ``reply_content`` (the message) and ``raw_meta`` (the rest).
"""

from __future__ import annotations

import re

from launch import health_routes, run_app
from shop import ORDERS
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reach_plugins.model import AgentDescriptor, Capability

NAME = "private-orders"
PORT = 18108


def descriptor(endpoint: str = f"http://127.0.0.1:{PORT}") -> AgentDescriptor:
    """The agent as a client configures it (the same fields go under ``agents:`` in a YAML file)."""
    return AgentDescriptor(
        name=NAME,
        description="The in-house order assistant (answers in its own JSON)",
        protocol="raw-http",
        endpoints=[endpoint],
        capabilities=[
            Capability(
                name="ask_order",
                description="Ask the in-house assistant about an order, in words",
                params_schema={
                    "type": "object",
                    "properties": {"question": {"type": "string"}},
                    "required": ["question"],
                },
                return_schema={"type": "object", "required": ["reply_content", "raw_meta"]},
            )
        ],
        protocol_options={
            "path": "/api/chat",
            "request_template": {"question": "${payload.question}", "uid": "${request.session_id}"},
            "response_mapping": {"reply_content": "data.message.content"},
            "success_path": "code",
            "error_path": "msg",
        },
    )


async def chat(request: Request) -> Response:
    body = await request.json()
    found = re.search(r"\b([A-Z]\d{4})\b", str(body.get("question", "")))
    if found is None or found.group(1) not in ORDERS:
        return JSONResponse({"code": 1001, "msg": "order not found; give an order id such as A1001"})
    order_id = found.group(1)
    order = ORDERS[order_id]
    content = f"Your order {order_id} is {order['status']}; it arrives {order['eta']}."
    info = {"id": order_id, "status": order["status"], "items": order["items"], "asked_by": body.get("uid")}
    return JSONResponse({"code": 0, "data": {"message": {"role": "assistant", "content": content}, "order_info": info}})


app = Starlette(routes=[Route("/api/chat", chat, methods=["POST"]), *health_routes(NAME)])

if __name__ == "__main__":
    run_app(NAME, app, PORT, "raw-http: POST /api/chat")
