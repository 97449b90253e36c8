"""Resumable response streams (SEP-1699): a call's events are kept, so a client that lost the stream gets the rest.

A session's ``tools/call`` runs in a task of its own that writes each message,
as an SSE event with an id (``STREAM-N``), into a :class:`Replay`; the POST's
response follows the replay. When the connection drops, the call goes on;
``GET /mcp`` with ``Last-Event-ID`` follows the same replay from the next
event. An agent may also hand the client over to polling: a chunk
``{"method": "reach/poll", "params": {"retry": MS}}`` closes the POST's stream
there with that ``retry``, and the client comes back with ``GET``. Replays are
kept under the tenant's session key, bounded in entries and bytes; a replay
past its byte cap stops recording (it cannot be resumed, the live stream is
unaffected).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any

log = logging.getLogger("reach_plugins.gateway")

POLL = "reach/poll"
"""The chunk method with which an agent hands the client over to polling."""
RETRY_MS = 1000
"""The ``retry`` a priming event advises."""
MAX_REPLAY_BYTES = 1 << 20
"""A replay records at most this much."""


def _frame(event_id: str, message: dict[str, Any]) -> bytes:
    data = json.dumps(message, separators=(",", ":"), ensure_ascii=False, default=str)
    return f"id: {event_id}\nevent: message\ndata: {data}\n\n".encode()


class Replay:
    """One response stream's frames, in order, and whether its call is done."""

    def __init__(self) -> None:
        self.stream = secrets.token_hex(8)
        self.frames: list[bytes] = []
        self.polls: set[int] = set()
        """Indexes of frames after which the POST's stream closes (the agent handed the client over)."""
        self.size = 0
        self.done = False
        self.recording = True
        self._changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def priming(self) -> bytes:
        return f"id: {self.stream}-0\nretry: {RETRY_MS}\ndata: \n\n".encode()

    def _add(self, frame: bytes) -> None:
        self.frames.append(frame)
        self.size += len(frame)
        if self.size > MAX_REPLAY_BYTES:
            self.recording = False
        self._changed.set()

    async def pump(self, messages: AsyncIterator[dict[str, Any]]) -> None:
        """Write the call's messages; runs as a task of its own, so a dropped connection does not stop the call."""
        try:
            async for message in messages:
                if message.get("method") == POLL:
                    params = message.get("params")
                    retry = params.get("retry", RETRY_MS) if isinstance(params, dict) else RETRY_MS
                    self.polls.add(len(self.frames))
                    self._add(f"id: {self.stream}-{len(self.frames) + 1}\nretry: {int(retry)}\ndata: \n\n".encode())
                    continue
                self._add(_frame(f"{self.stream}-{len(self.frames) + 1}", message))
        except Exception:
            log.exception("an MCP response stream failed; its client sees the stream end without a result")
        finally:
            self.done = True
            self._changed.set()

    def start(self, messages: AsyncIterator[dict[str, Any]]) -> Replay:
        self.task = asyncio.get_running_loop().create_task(self.pump(messages))
        return self

    async def follow(self, after: int, *, until_poll: bool) -> AsyncIterator[bytes]:
        """The frames after index ``after`` as they come; a POST's stream stops at a poll, a GET's at the end."""
        index = after + 1
        while True:
            while index < len(self.frames):
                frame = self.frames[index]
                yield frame
                if until_poll and index in self.polls:
                    return
                index += 1
            if self.done:
                return
            self._changed.clear()
            if index < len(self.frames) or self.done:
                continue
            await self._changed.wait()

    def resume_from(self, last_event_id: str) -> int | None:
        """The frame index a ``Last-Event-ID`` of this stream names (-1: the priming event), or None."""
        stream, _, number = last_event_id.rpartition("-")
        if stream != self.stream or not number.isdigit() or not self.recording:
            return None
        return int(number) - 1
