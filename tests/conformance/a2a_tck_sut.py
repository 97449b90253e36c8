"""The A2A TCK's system under test written with our agent SDK: the scenarios of the TCK's own SUT
(``a2a-tck/sut/official_sut.py``, chosen by the message id's prefix) as one capability's handler.

``python a2a_tck_sut.py PORT`` serves it on 127.0.0.1 (tokens open: the TCK carries no Reach token).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from typing import Any

from reach_plugins.agent import File, ReachAgent, ReachContext, Reply, ask, serve
from reach_plugins.errors import BusinessError

agent = ReachAgent("tck", version="1.0.0", description="The A2A TCK's scenarios on the Reach agent SDK", tokens="open")
TEXT = {
    "tck-artifact-text": "Generated text content",
    "tck-complete-task": "Hello from TCK",
    "tck-stream-001": "Stream hello from TCK",
    "tck-stream-003": "Stream task lifecycle",
    "tck-stream-artifact-text": "Streamed text content",
    "tck-stream-ordering-001": "Ordered output",
}


def _scenario(ctx: ReachContext) -> str:
    return next(
        (prefix for prefix in sorted(SCENARIOS, key=len, reverse=True) if ctx.request_id.startswith(prefix)), ""
    )


async def _chunked() -> AsyncIterator[str]:
    yield "chunk-1 "
    yield "chunk-2"


SCENARIOS = (
    "tck-stream-artifact-chunked",
    "test-resubscribe-message-id",
    "tck-stream-artifact-file",
    "tck-artifact-file-url",
    "tck-message-response",
    "tck-input-required",
    "tck-artifact-file",
    "tck-artifact-data",
    "tck-reject-task",
    "tck-stream-002",
    *TEXT,
)


@agent.capability("tck", description="Handles the TCK's conformance messages")
async def tck(text: str, ctx: ReachContext) -> AsyncIterator[Any]:
    """Streams: each item is one artifact update (the chunked scenario yields two)."""
    scenario = _scenario(ctx)
    if scenario == "tck-stream-artifact-chunked":
        async for chunk in _chunked():
            yield chunk
    elif scenario == "test-resubscribe-message-id":
        await asyncio.sleep(4)
    elif scenario in ("tck-artifact-file", "tck-stream-artifact-file"):
        yield File(raw=b"tck", media_type="text/plain", filename="output.txt")
    elif scenario == "tck-artifact-file-url":
        yield File(url="http://127.0.0.1/output.txt", media_type="text/plain", filename="output.txt")
    elif scenario == "tck-message-response":
        yield Reply(text="Direct message response")
    elif scenario == "tck-input-required":
        yield ask("Input required by the TCK scenario")
    elif scenario == "tck-artifact-data":
        yield {"key": "value", "count": 42}
    elif scenario == "tck-reject-task":
        raise BusinessError("rejected")
    elif scenario in TEXT:
        yield TEXT[scenario]
    elif scenario != "tck-stream-002":
        yield f"Unhandled messageId prefix: {ctx.request_id}"


if __name__ == "__main__":
    serve(agent, "127.0.0.1", int(sys.argv[1]))
