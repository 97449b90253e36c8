"""A fake cloud chat model behind an OpenAI-compatible API: the ``cloud-chat-sales`` agent of examples/agents.yaml.

    python examples/agents/cloud_chat.py                  # 127.0.0.1:18106, POST /v1/chat/completions

It answers product questions from the sample shop, asks for the
``query_order`` tool when the customer names an order, streams word by word
when asked (``"stream": true``), and refuses a request without an
``Authorization`` header as the real API would (HTTP 401).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from launch import configured_port, health_routes, run_app
from shop import PRODUCTS
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

NAME = "cloud-chat-sales"


def answer(text: str) -> dict[str, Any]:
    """The assistant message for the customer's ``text``: a tool call for an order, else words about products."""
    order = re.search(r"\b([A-Z]\d{4})\b", text)
    if order:
        arguments = json.dumps({"order_id": order.group(1)})
        call = {"id": "call_1", "type": "function", "function": {"name": "query_order", "arguments": arguments}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    named = [p for p in PRODUCTS.values() if p["name"].split()[-1].rstrip("s") in text.lower()]
    lines = [f"The {p['name']} costs {p['price']} yuan; {p['on_hand']} in stock." for p in named]
    return {"role": "assistant", "content": " ".join(lines) or "We sell kettles, tea sets and cups. Which one?"}


def _envelope(model: str, **fields: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-demo", "created": int(time.time()), "model": model, **fields}


async def _chunks(model: str, message: dict[str, Any]) -> AsyncIterator[str]:
    words = (message["content"] or "").split(" ")
    for n, word in enumerate(words):
        delta = {"content": word if n == 0 else f" {word}"}
        chunk = _envelope(model, object="chat.completion.chunk", choices=[{"index": 0, "delta": delta}])
        yield f"data: {json.dumps(chunk)}\n\n"
    last = _envelope(
        model, object="chat.completion.chunk", choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]
    )
    yield f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n"


async def chat_completions(request: Request) -> Response:
    if not request.headers.get("authorization"):
        error = {"message": "missing API key in the Authorization header", "type": "invalid_request_error"}
        return JSONResponse({"error": error}, 401)
    body = await request.json()
    said = next((m.get("content") or "" for m in reversed(body.get("messages", [])) if m.get("role") == "user"), "")
    message, model = answer(said), body.get("model", NAME)
    if body.get("stream") and message["content"] is not None:
        return StreamingResponse(_chunks(model, message), media_type="text/event-stream")
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    usage = {"prompt_tokens": len(said.split()), "completion_tokens": len((message["content"] or "").split())}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    choice = {"index": 0, "message": message, "finish_reason": finish}
    return JSONResponse(_envelope(model, object="chat.completion", choices=[choice], usage=usage))


app = Starlette(routes=[Route("/v1/chat/completions", chat_completions, methods=["POST"]), *health_routes(NAME)])

if __name__ == "__main__":
    run_app(NAME, app, configured_port(NAME), "OpenAI-compatible: POST /v1/chat/completions")
