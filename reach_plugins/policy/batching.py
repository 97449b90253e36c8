"""Batching of stream events on their way to the caller, as a pure state machine fed a clock.

A token stream arrives as many small events; waking the caller for each one
costs more than the event is worth. The batcher holds data events back until
``max_events`` are waiting or the oldest has waited ``max_delay`` seconds,
never delays a stream's first event (time to first token is what users feel),
and lets everything out at once when the stream ends or fails. It does no
I/O and never sleeps: the relay in :mod:`reach_plugins.attempts.streaming` asks
:meth:`StreamBatcher.due` when to look again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reach_plugins.errors import ConfigError
from reach_plugins.transport import StreamEvent


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """How long and how many stream events may wait to be handed on together."""

    max_events: int = 16
    """A batch this size goes at once: about one screen line of tokens."""
    max_delay: float = 0.05
    """Seconds the oldest waiting event may wait: below what a reader notices."""

    def __post_init__(self) -> None:
        if self.max_events < 1 or not self.max_delay >= 0:
            raise ConfigError(
                f"stream batching needs max_events >= 1 and max_delay >= 0, got {self.max_events} and {self.max_delay}"
            )


class StreamBatcher:
    """Decides when buffered stream events are flushed; ``take`` hands them over."""

    __slots__ = ("_pending", "_seen", "_since", "policy")

    def __init__(self, policy: BatchPolicy | None = None) -> None:
        self.policy = policy or BatchPolicy()
        self._pending: list[StreamEvent] = []
        self._since = 0.0
        self._seen = False

    def add(self, event: StreamEvent, now: float) -> bool:
        """Buffer ``event``; True when the buffer should be flushed now.

        That is: the stream's first event, a full batch, an overdue oldest
        event, or the stream's ``end``/``error`` (which carry the rest along).
        """
        first = not self._seen
        self._seen = True
        if not self._pending:
            self._since = now
        self._pending.append(event)
        if first or event.kind != "data":
            return True
        return len(self._pending) >= self.policy.max_events or now - self._since >= self.policy.max_delay

    def due(self) -> float | None:
        """When the buffered events must go out at the latest (``None``: nothing is waiting)."""
        return self._since + self.policy.max_delay if self._pending else None

    @property
    def full(self) -> bool:
        """A whole batch is waiting: whoever fills the buffer should wait for it to be taken."""
        return len(self._pending) >= self.policy.max_events

    @property
    def pending(self) -> int:
        return len(self._pending)

    def take(self) -> list[StreamEvent]:
        """Everything buffered, oldest first; the buffer is empty afterwards."""
        batch, self._pending = self._pending, []
        return batch


def streamed_chars(data: Any) -> int:
    """Characters of text an event carries: a string chunk, or the ``reply_content`` of a normalised chat chunk.

    Structured chunks without text count as events but carry no characters.
    """
    if isinstance(data, str):
        return len(data)
    if isinstance(data, Mapping):
        text = data.get("reply_content")
        if isinstance(text, str):
            return len(text)
    return 0
