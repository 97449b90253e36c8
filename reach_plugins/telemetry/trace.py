"""The trajectory of a request (ReachTrace) and where it goes: nowhere, a JSON-lines file, a logger.

The recorder collects attempts and events as the pipeline runs and mirrors
them as span events; the pydantic ``ReachTrace`` is built only when someone
asked for it (``trace=True``), a sink is set, or the request did not succeed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO, runtime_checkable

from opentelemetry.trace import Span

from reach_plugins.errors import ConfigError
from reach_plugins.model import Attempt, ErrorInfo, ReachRequest, ReachTrace
from reach_plugins.telemetry.spans import (
    ATTR_BREAKER_FROM,
    ATTR_BREAKER_TO,
    EVENT_ATTEMPT,
    EVENT_BREAKER,
    EVENT_CONSISTENCY_STATE,
    EVENT_OUTLIER,
)

if TYPE_CHECKING:
    from reach_plugins.model import AgentDescriptor, AttemptRecord, Instance, RouteDecision

logger = logging.getLogger("reach_plugins.trace")

AttributeValue = str | bool | int | float


@runtime_checkable
class TraceSink(Protocol):
    """Receives every finished request's trace; must not raise (errors are logged and dropped)."""

    def emit(self, trace: ReachTrace) -> None: ...


class RecorderReader(Protocol):
    """Reads a finished request off its :class:`TraceRecorder`, so no trace is built for it (metrics)."""

    def finished(self, rec: TraceRecorder, status: str, now: float) -> None: ...


class JsonLinesSink:
    """Appends one JSON line per request to ``path`` (opened lazily, flushed per line).

    With ``max_bytes`` the file is rotated by size, as the standard library's ``RotatingFileHandler``: past it,
    ``path`` becomes ``path.1``, ``path.1`` becomes ``path.2``, ... and ``path.{backups}`` is dropped, so the files
    take at most ``max_bytes * (backups + 1)``; :func:`trace_files` lists them for the readers, oldest first.
    """

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int | None = None, backups: int = 5) -> None:
        if (max_bytes is not None and max_bytes < 1) or backups < 0:
            raise ConfigError(f"a trace file needs max_bytes >= 1 and backups >= 0, got {max_bytes} and {backups}")
        self.path = os.fspath(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self._file: TextIO | None = None
        self._lock = threading.Lock()

    def emit(self, trace: ReachTrace) -> None:
        line = trace.model_dump_json(exclude_none=True) + "\n"
        with self._lock:
            if self._file is None:
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open across emits
            limit = self.max_bytes
            if limit is not None and self._file.tell() > 0 and self._file.tell() + len(line.encode()) > limit:
                self._file = self._rotate(self._file)
            self._file.write(line)
            self._file.flush()

    def _rotate(self, current: TextIO) -> TextIO:
        """Shift the backups up by one (the oldest drops out) and start ``path`` afresh."""
        current.close()
        for number in range(self.backups, 0, -1):
            older = f"{self.path}.{number - 1}" if number > 1 else self.path
            if os.path.exists(older):
                os.replace(older, f"{self.path}.{number}")
        return open(self.path, "w" if self.backups == 0 else "a", encoding="utf-8")

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def trace_files(path: str | os.PathLike[str]) -> list[Path]:
    """A trace file and its rotated backups (``path.1``, ``path.2``, ...) that exist, oldest first."""
    current = Path(path)
    backups = []
    number = 1
    while (backup := current.with_name(f"{current.name}.{number}")).exists():
        backups.append(backup)
        number += 1
    return [*reversed(backups), *([current] if current.exists() else [])]


class RecentTraces:
    """The latest ``keep`` traces as JSON and the live followers of new ones: what a gateway streams to
    ``reach trace --follow``. Bounded: a follower that reads slower than ``backlog`` traces loses the overflow."""

    END = ""
    """What a follower's queue yields when the server stops: its stream ends there."""

    def __init__(self, keep: int = 100, backlog: int = 1000) -> None:
        self._recent: deque[str] = deque(maxlen=keep)
        self._backlog = backlog
        self._followers: set[asyncio.Queue[str]] = set()
        self.closed = False

    def emit(self, trace: ReachTrace) -> None:
        line = trace.model_dump_json(exclude_none=True)
        self._recent.append(line)
        for queue in self._followers:
            if queue.qsize() < self._backlog:
                queue.put_nowait(line)

    def follow(self) -> asyncio.Queue[str]:
        """A new follower: a queue holding the recent traces, then each new one (end it with :meth:`leave`)."""
        queue: asyncio.Queue[str] = asyncio.Queue(self._backlog + 1)
        for line in self._recent:
            queue.put_nowait(line)
        if self.closed:
            queue.put_nowait(self.END)
        else:
            self._followers.add(queue)
        return queue

    def leave(self, queue: asyncio.Queue[str]) -> None:
        self._followers.discard(queue)

    def close(self) -> None:
        """The server stops: end every follower's stream (an endless response would hold its shutdown)."""
        self.closed = True
        for queue in self._followers:
            while queue.full():
                queue.get_nowait()
            queue.put_nowait(self.END)
        self._followers.clear()


TRACE_MAX_BYTES = 10_000_000
"""Size at which a server's ``--trace-file`` rotates unless told otherwise."""
TRACE_BACKUPS = 5
"""Rotated trace files a server keeps unless told otherwise."""


def file_sink(
    path: str | None, *, max_bytes: int = TRACE_MAX_BYTES, backups: int = TRACE_BACKUPS
) -> JsonLinesSink | None:
    """A server's ``--trace-file``: a JSON-lines file rotated by size, or ``None`` when no path is given."""
    return None if path is None else JsonLinesSink(path, max_bytes=max_bytes, backups=backups)


class LoggingSink:
    """Logs each trace as one JSON message on ``logger`` (default ``reach_plugins.trace``) at ``level``."""

    def __init__(self, logger_: logging.Logger | None = None, level: int = logging.INFO) -> None:
        self.logger = logger_ or logger
        self.level = level

    def emit(self, trace: ReachTrace) -> None:
        if self.logger.isEnabledFor(self.level):
            self.logger.log(self.level, "%s", trace.model_dump_json(exclude_none=True))


def open_sink(spec: str | None) -> TraceSink | None:
    """``None``/``"none"`` (no sink), ``"logging"``, or ``"file://path"`` / a path ending in ``.jsonl``."""
    if spec is None or spec in ("", "none"):
        return None
    if spec == "logging":
        return LoggingSink()
    if spec.startswith("file://"):
        return JsonLinesSink(spec.removeprefix("file://"))
    if spec.endswith((".jsonl", ".json")):
        return JsonLinesSink(spec)
    raise ConfigError(f"unknown trace sink {spec!r}; use 'none', 'logging', 'file://traces.jsonl' or a .jsonl path")


def emit_safely(sink: TraceSink, trace: ReachTrace) -> None:
    """A broken sink must never break a request."""
    try:
        sink.emit(trace)
    except Exception:
        logger.exception("trace sink %r failed; trace of request %s dropped", sink, trace.request_id)


_SCALARS = (str, bool, int, float)
"""What a span attribute may hold (a tuple: ``isinstance`` checks it faster than a union)."""


def _attributes(attrs: dict[str, Any]) -> dict[str, AttributeValue]:
    return {key: value for key, value in attrs.items() if isinstance(value, _SCALARS)}


def _fields(record: AttemptRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in record.__slots__}


class Routed(Protocol):
    """A route as the trace reads it: its decision (built on first read), how a session was placed, the agent and
    the instance it names."""

    @property
    def decision(self) -> RouteDecision: ...

    @property
    def affinity(self) -> str: ...

    @property
    def agent(self) -> AgentDescriptor: ...

    @property
    def instance(self) -> Instance: ...


class StateChange(Protocol):
    """An instance's state change as the trace reads it (a breaker, consistency or outlier transition)."""

    @property
    def kind(self) -> str: ...

    @property
    def instance(self) -> str: ...

    @property
    def before(self) -> str: ...

    @property
    def after(self) -> str: ...

    @property
    def at(self) -> float: ...

    @property
    def reason(self) -> str: ...


_MOVED_EVENTS = {"breaker": EVENT_BREAKER, "consistency": EVENT_CONSISTENCY_STATE, "outlier": EVENT_OUTLIER}
"""The trace event of each kind of instance state change."""


class TraceRecorder:
    """Collects one request's route, attempts and events; mirrors events onto its span.

    It subscribes to the attempt path's hooks
    (:class:`~reach_plugins.attempts.hooks.AttemptHooks`): ``attempt`` and ``moved``.

    ``keep`` says whether anyone will read a successful attempt (a trace was
    asked for, or a ``sink`` is set): when nobody will, the pipeline skips
    recording it — the common case, and a hot path. A recording span reads
    attempts only once the request retried (:meth:`keeps`): a first attempt
    that succeeded is the span itself, whose attributes say who answered, so
    span events mark retries, failovers and failed attempts only.

    Events carry wall-clock times (``started_at``'s clock), so a trace can be
    drawn beside anything else timed by that clock. State changes arrive timed
    by the policies' monotonic clock; ``monotonic_at_start`` (a reading taken
    with ``started_at``) converts them.
    """

    __slots__ = (
        "_offset",
        "attempts",
        "dedup_hit",
        "events",
        "keep",
        "reader",
        "request",
        "route",
        "sink",
        "span",
        "started_at",
        "usage",
    )

    def __init__(
        self,
        request: ReachRequest,
        started_at: float,
        monotonic_at_start: float,
        span: Span,
        *,
        sink: TraceSink | None = None,
        reader: RecorderReader | None = None,
        keep: bool = False,
    ) -> None:
        self.request = request
        self.started_at = started_at
        self._offset = started_at - monotonic_at_start
        self.span = span
        self.sink = sink
        """Where the finished request's trace goes (None: nowhere)."""
        self.reader = reader
        """Who reads the finished request off this recorder (None: nobody)."""
        self.keep = keep or sink is not None or reader is not None
        self.route: Routed | None = None
        """The latest route; its decision is read (and so built) only by :meth:`build`."""
        self.attempts: list[AttemptRecord] = []
        self.events: list[dict[str, Any]] = []
        self.dedup_hit = False
        self.usage: dict[str, int] | None = None
        """Tokens the answer reported (set when the request ends)."""

    def event(self, name: str, at: float, **attrs: Any) -> None:
        """A named moment of the request (retry, failover, breaker transition...), also as a span event."""
        self.events.append({"event": name, "at": at, **attrs})
        if self.span.is_recording():
            self.span.add_event(name, attributes=_attributes(attrs))

    def keeps(self, number: int) -> bool:
        """Whether anyone reads attempt ``number`` should it succeed: a kept trace, or a span once retried."""
        return self.keep or (number > 1 and self.span.is_recording())

    def attempt(self, record: AttemptRecord) -> None:
        """One finished attempt; the :class:`Attempt` model is built only if the trace is.

        A span event only for a retried request's attempts or a failed one (not a first attempt that succeeded).
        """
        self.attempts.append(record)
        if (record.number > 1 or record.outcome != "success") and self.span.is_recording():
            self.span.add_event(EVENT_ATTEMPT, attributes=_attributes(_fields(record)))

    def moved(self, change: StateChange) -> None:
        """An instance's breaker or consistency state changed during this request."""
        self.event(
            _MOVED_EVENTS[change.kind],
            change.at + self._offset,
            instance=change.instance,
            reason=change.reason,
            **{ATTR_BREAKER_FROM: change.before, ATTR_BREAKER_TO: change.after},
        )

    @property
    def read(self) -> bool:
        """Whether the finished request goes anywhere (a sink or a reader)."""
        return self.sink is not None or self.reader is not None

    def finish(self, status: str, error: ErrorInfo | None, now: float, built: ReachTrace | None = None) -> None:
        """Hand the finished request to its reader, and to its sink as a trace (``built``, else built now)."""
        if self.reader is not None:
            try:
                self.reader.finished(self, status, now)
            except Exception:
                logger.exception("reader %r failed; request %s not counted", self.reader, self.request.request_id)
        if self.sink is not None:
            emit_safely(self.sink, built if built is not None else self.build(status, error, now))

    def build(self, status: str, error: ErrorInfo | None, now: float) -> ReachTrace:
        request = self.request
        return ReachTrace(
            request_id=request.request_id,
            capability=request.capability,
            tenant=request.tenant,
            session_id=request.session_id,
            route=self.route.decision if self.route is not None else None,
            attempts=[Attempt(**_fields(record)) for record in self.attempts],
            dedup_hit=self.dedup_hit,
            events=list(self.events),
            status=status,
            error=error,
            started_at=self.started_at,
            duration_ms=(now - self.started_at) * 1000.0,
            usage=self.usage,
        )
