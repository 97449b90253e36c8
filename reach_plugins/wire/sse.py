"""Server-sent events, sans-IO: decode a byte stream into events, encode events into bytes.

Chunks may split lines, CRLF pairs and multi-byte characters anywhere; the
decoder keeps the partial line and an incremental UTF-8 decoder between
``feed`` calls. What it holds is bounded (DESIGN.md 11.5): an event (or a line)
longer than ``max_event`` characters is an ``InvalidResponse``, not a buffer
that grows with whatever a hostile upstream sends. An event with an empty
``data`` line (a priming event: ``id``, ``retry``, ``data:``) is dispatched with
empty data; ``retry`` lines set :attr:`SseDecoder.retry`.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from reach_plugins.errors import InvalidResponse
from reach_plugins.wire.body import MAX_REPLY

_LINE_END = re.compile(r"\r\n|\r|\n")
"""SSE lines end with CRLF, CR or LF (and nothing else: ``str.splitlines`` would split on more)."""


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event: its name (``message`` by default) and its joined ``data`` lines."""

    event: str
    data: str
    id: str | None = None


class SseDecoder:
    """Feed bytes as they arrive; get back the events completed by them."""

    def __init__(self, *, max_event: int = MAX_REPLY) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._event = ""
        self._data: list[str] = []
        self._held = 0
        """Characters of ``data`` lines held for the event being read."""
        self._id: str | None = None
        self._max = max_event
        self.retry: float | None = None
        """The reconnection time (seconds) the stream's last ``retry:`` line set, ``None`` until one did."""

    def feed(self, chunk: bytes) -> list[SseEvent]:
        text = self._pending + self._text.decode(chunk)
        held = ""
        if text.endswith("\r"):
            text, held = text[:-1], "\r"
        lines = _LINE_END.split(text)
        self._pending = lines.pop() + held
        events: list[SseEvent] = []
        for line in lines:
            event = self._line(line)
            if event is not None:
                events.append(event)
        if self._held + len(self._pending) > self._max:
            raise InvalidResponse(f"a streamed event is longer than {self._max} characters, the most accepted")
        return events

    def _line(self, line: str) -> SseEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
            self._held += len(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        elif name == "retry" and value.isdigit():
            self.retry = int(value) / 1000
        return None

    def _dispatch(self) -> SseEvent | None:
        if not self._data and not self._event:
            return None
        event = SseEvent(event=self._event or "message", data="\n".join(self._data), id=self._id)
        self._event, self._data, self._held = "", [], 0
        return event


def encode_sse(data: str, event: str | None = None) -> bytes:
    """One SSE frame; multi-line ``data`` becomes several ``data:`` lines."""
    head = f"event: {event}\n" if event else ""
    body = "".join(f"data: {line}\n" for line in data.split("\n"))
    return (head + body + "\n").encode()
