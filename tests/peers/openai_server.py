"""An OpenAI-compatible chat-completions server whose every reply is built from the ``openai`` package's models.

    .venv-peers/bin/python tests/peers/openai_server.py PORT

``POST /v1/chat/completions`` answers by the first word of the last user message:

* ``refuse``: ``content: null`` and a ``refusal`` (streamed as refusal deltas);
* ``tool``: a ``lookup_order`` tool call with arguments ``{"order_id": "12"}``,
  streamed as the fragments ``{"order_id": "``, ``12``, ``"}`` (a fragment is not JSON);
* anything else: ``you said: <text>`` (streamed word by word).

A stream honours ``stream_options.include_usage`` with the final
``choices: []`` usage chunk, as OpenAI does. ``GET /last`` returns the last
request body as received, so tests see which fields reached the server.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_chunk import ChoiceDelta, ChoiceDeltaToolCall, ChoiceDeltaToolCallFunction
from openai.types.chat.chat_completion_message_function_tool_call import ChatCompletionMessageFunctionToolCall, Function
from openai.types.completion_usage import CompletionUsage
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

LAST: dict[str, Any] = {}
REFUSAL = "I can't help with that."
ARGUMENT_FRAGMENTS = ['{"order_id": "', "12", '"}']
USAGE = CompletionUsage(prompt_tokens=7, completion_tokens=5, total_tokens=12)


def _text(body: dict[str, Any]) -> str:
    users = [m.get("content") for m in body.get("messages", []) if m.get("role") == "user"]
    return str(users[-1]) if users else ""


def _completion(body: dict[str, Any]) -> ChatCompletion:
    text = _text(body)
    word = (text.split() or [""])[0]
    if word == "refuse":
        message = ChatCompletionMessage(role="assistant", content=None, refusal=REFUSAL)
        finish = "stop"
    elif word == "tool":
        function = Function(name="lookup_order", arguments="".join(ARGUMENT_FRAGMENTS))
        call = ChatCompletionMessageFunctionToolCall(id="call_1", type="function", function=function)
        message = ChatCompletionMessage(role="assistant", content=None, tool_calls=[call])
        finish = "tool_calls"
    else:
        message = ChatCompletionMessage(role="assistant", content=f"you said: {text}")
        finish = "stop"
    choice = Choice(index=0, message=message, finish_reason=finish)
    return ChatCompletion(
        id="chatcmpl-1",
        object="chat.completion",
        created=int(time.time()),
        model=body["model"],
        choices=[choice],
        usage=USAGE,
    )


def _chunk(body: dict[str, Any], delta: ChoiceDelta | None, finish: Any = None) -> str:
    choices = [] if delta is None else [ChunkChoice(index=0, delta=delta, finish_reason=finish)]
    chunk = ChatCompletionChunk(
        id="chatcmpl-1",
        object="chat.completion.chunk",
        created=int(time.time()),
        model=body["model"],
        choices=choices,
        usage=USAGE if delta is None else None,
    )
    return f"data: {chunk.model_dump_json(exclude_none=delta is not None)}\n\n"


def _deltas(body: dict[str, Any]) -> Iterator[tuple[ChoiceDelta, Any]]:
    text = _text(body)
    word = (text.split() or [""])[0]
    if word == "refuse":
        for piece in (REFUSAL[:8], REFUSAL[8:]):
            yield ChoiceDelta(role="assistant", refusal=piece), None
        yield ChoiceDelta(), "stop"
    elif word == "tool":
        head = ChoiceDeltaToolCallFunction(name="lookup_order", arguments="")
        first = ChoiceDeltaToolCall(index=0, id="call_1", type="function", function=head)
        yield ChoiceDelta(role="assistant", tool_calls=[first]), None
        for fragment in ARGUMENT_FRAGMENTS:
            piece = ChoiceDeltaToolCallFunction(arguments=fragment)
            yield ChoiceDelta(tool_calls=[ChoiceDeltaToolCall(index=0, function=piece)]), None
        yield ChoiceDelta(), "tool_calls"
    else:
        for piece in f"you said: {text}".split(" "):
            yield ChoiceDelta(content=piece + " "), None
        yield ChoiceDelta(), "stop"


def _stream(body: dict[str, Any]) -> Iterator[str]:
    for delta, finish in _deltas(body):
        yield _chunk(body, delta, finish)
    if (body.get("stream_options") or {}).get("include_usage"):
        yield _chunk(body, None)
    yield "data: [DONE]\n\n"


async def completions(request: Request) -> Response:
    body = json.loads(await request.body())
    LAST.clear()
    LAST.update(body)
    if body.get("stream"):
        return StreamingResponse(_stream(body), media_type="text/event-stream")
    return Response(_completion(body).model_dump_json(), media_type="application/json")


async def last(request: Request) -> JSONResponse:
    return JSONResponse(LAST)


app = Starlette(routes=[Route("/v1/chat/completions", completions, methods=["POST"]), Route("/last", last)])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
