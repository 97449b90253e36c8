"""A fake cloud chat model behind an OpenAI-compatible API: the ``cloud-chat-sales`` agent of examples/agents.yaml.

    python examples/agents/cloud_chat.py                  # 127.0.0.1:18106, POST /v1/chat/completions

It answers product questions from the sample shop, asks for the
``query_order`` tool when the customer names an order, refuses to talk about
passwords (``content: null`` and a ``refusal``, as OpenAI models do), streams
when asked (``"stream": true``: words, refusal pieces or tool-call argument
fragments, then the usage chunk when ``stream_options.include_usage`` asks for
it), and refuses a request without an ``Authorization`` header as the real API
would (HTTP 401).
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
    if "password" in text.lower():
        return {"role": "assistant", "content": None, "refusal": "I can't help with account passwords."}
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


def _deltas(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The message as stream deltas: words, refusal pieces, or a tool call whose arguments come in fragments."""
    if message.get("refusal"):
        return [{"refusal": f"{word} "} for word in message["refusal"].split(" ")]
    if message.get("tool_calls"):
        call = message["tool_calls"][0]
        head = {"index": 0, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"]}}
        arguments = call["function"]["arguments"]
        cut = len(arguments) // 2
        pieces = [arguments[:cut], arguments[cut:]]
        return [{"tool_calls": [head]}, *({"tool_calls": [{"index": 0, "function": {"arguments": p}}]} for p in pieces)]
    words = (message["content"] or "").split(" ")
    return [{"content": word if n == 0 else f" {word}"} for n, word in enumerate(words)]


async def _chunks(model: str, message: dict[str, Any], usage: dict[str, int] | None) -> AsyncIterator[str]:
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    choices = [[{"index": 0, "delta": delta}] for delta in _deltas(message)]
    choices.append([{"index": 0, "delta": {}, "finish_reason": finish}])
    for choice in choices:
        yield f"data: {json.dumps(_envelope(model, object='chat.completion.chunk', choices=choice))}\n\n"
    if usage is not None:
        yield f"data: {json.dumps(_envelope(model, object='chat.completion.chunk', choices=[], usage=usage))}\n\n"
    yield "data: [DONE]\n\n"


async def chat_completions(request: Request) -> Response:
    if not request.headers.get("authorization"):
        error = {"message": "missing API key in the Authorization header", "type": "invalid_request_error"}
        return JSONResponse({"error": error}, 401)
    body = await request.json()
    said = next((m.get("content") or "" for m in reversed(body.get("messages", [])) if m.get("role") == "user"), "")
    message, model = answer(said), body.get("model", NAME)
    usage = {"prompt_tokens": len(said.split()), "completion_tokens": len((message["content"] or "").split())}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    if body.get("stream"):
        wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(
            _chunks(model, message, usage if wants_usage else None), media_type="text/event-stream"
        )
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    choice = {"index": 0, "message": message, "finish_reason": finish}
    return JSONResponse(_envelope(model, object="chat.completion", choices=[choice], usage=usage))


app = Starlette(routes=[Route("/v1/chat/completions", chat_completions, methods=["POST"]), *health_routes(NAME)])

if __name__ == "__main__":
    run_app(NAME, app, configured_port(NAME), "OpenAI-compatible: POST /v1/chat/completions")
