"""Replay why a request went where it went: a trace file's records as a tree (``reach trace``).

The JSON-lines sink (:class:`~reach_plugins.telemetry.trace.JsonLinesSink`) writes
one :class:`~reach_plugins.model.ReachTrace` per request. :func:`find_trace`
picks one by request id, :func:`follow` yields records as they are appended,
and :func:`trace_tree` draws the route decision (candidates, scores, pick,
reason), every attempt and every event with times from the request's start,
rounded for people (seed 001, section 6: a replay of each routing decision).
Everything taken from a trace file is data, never terminal input: it goes
through :func:`terminal_text`, so a record cannot clear the screen, move the
cursor, rewrite a line or style itself (``reach usage`` prints the same way).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, TextIO

import httpx
from pydantic import ValidationError
from rich.markup import escape
from rich.tree import Tree

from reach_plugins.errors import ConfigError
from reach_plugins.model import Attempt, ReachTrace
from reach_plugins.telemetry.trace import trace_files

_BIDI: Final = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_CONTROLS: Final = {
    code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" for code in (*range(0x20), *range(0x7F, 0xA0), *_BIDI)
}
"""C0 and C1 controls (ESC, CR, BEL, the 8-bit CSI ...), DEL and the bidirectional overrides, written out as escapes."""

TRACE_STREAM = "/v1/traces/stream"
"""A gateway's route of recent traces, as server-sent events (behind its metrics token)."""
_STATUS_STYLE = {"success": "green", "fail": "red", "timeout": "red", "error": "red", "cancelled": "yellow"}


def terminal_text(value: object) -> str:
    """``value`` as inert text for a rich console: controls shown as ``\\x1b``-style escapes, markup escaped.

    With the controls written out, an ANSI sequence is only its printable
    tail (``\\x1b[2J`` prints as those five characters), and a ``\\r`` cannot
    rewrite the line before it; :func:`rich.markup.escape` keeps ``[bold]``
    and the like literal.
    """
    return escape(str(value).translate(_CONTROLS))


def rounded(value: Any) -> Any:
    """A number as people read it: 1 decimal from 1 up, 3 significant digits below; other values as they are."""
    if isinstance(value, bool) or not isinstance(value, float):
        return value
    return round(value, 1) if abs(value) >= 1 else float(f"{value:.3g}")


def read_traces(lines: Iterator[str] | TextIO) -> Iterator[ReachTrace]:
    """Every trace record in JSON lines; blank and unreadable lines are skipped (a file may end mid-write)."""
    for line in lines:
        if not line.strip():
            continue
        try:
            yield ReachTrace.model_validate_json(line)
        except ValidationError:
            continue


def find_trace(path: Path, request_id: str) -> ReachTrace:
    """The record of ``request_id`` (a unique prefix will do); ``ConfigError`` naming what was there otherwise."""
    files = trace_files(path)
    if not files:
        raise ConfigError(
            f"no trace file at {path}; write one with `reach gateway --trace-file {path}` or sink='file://{path}'"
        )
    found = []
    for file in files:  # the rotated backups first: the newest record of a request wins
        with file.open(encoding="utf-8") as lines:
            found += [trace for trace in read_traces(lines) if trace.request_id.startswith(request_id)]
    exact = [trace for trace in found if trace.request_id == request_id]
    if exact or len(found) == 1:
        return (exact or found)[-1]
    if found:
        raise ConfigError(f"{request_id!r} matches {len(found)} requests; give more of the id")
    raise ConfigError(f"no request {request_id!r} in {path}; `reach trace --file {path} --tail` lists new ones")


def follow(
    path: Path,
    *,
    ready: Callable[[], None] = lambda: None,
    poll: float = 0.2,
    stop: Callable[[], bool] = lambda: False,
) -> Iterator[ReachTrace]:
    """Records appended to ``path`` from now on (``tail -f``); ``ready`` is called once the end is found."""
    path.touch(exist_ok=True)
    with path.open(encoding="utf-8") as handle:
        handle.seek(0, 2)
        ready()
        pending = ""
        while not stop():
            chunk = handle.readline()
            if not chunk:
                time.sleep(poll)
                continue
            pending += chunk
            if pending.endswith("\n"):
                yield from read_traces(iter([pending]))
                pending = ""


def follow_url(url: str, token: str | None, *, ready: Callable[[], None] = lambda: None) -> Iterator[ReachTrace]:
    """The recent traces a live gateway keeps, then each new one, from its ``GET /v1/traces/stream`` (``url`` is
    the gateway's base URL or that route); ``token`` is its operator (metrics) token."""
    route = url if url.rstrip("/").endswith(TRACE_STREAM) else url.rstrip("/") + TRACE_STREAM
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with httpx.stream("GET", route, headers=headers, timeout=httpx.Timeout(10.0, read=None)) as answer:
            if answer.status_code != 200:
                answer.read()
                raise ConfigError(f"GET {route} answered {answer.status_code}: {answer.text[:300]}")
            ready()
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    yield from read_traces(iter([line.removeprefix("data: ")]))
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot follow {route}: {type(exc).__name__}: {exc}; is the gateway up?") from None


def summary(trace: ReachTrace) -> str:
    """One line: id, capability, where it went, status, time."""
    route = trace.route
    where = f"{route.agent}/{route.instance}" if route is not None else "not routed"
    style = _STATUS_STYLE.get(trace.status, "white")
    return (
        f"[bold]{terminal_text(trace.request_id)}[/bold] {terminal_text(trace.capability)} -> {terminal_text(where)} "
        f"[{style}]{terminal_text(trace.status)}[/{style}] {rounded(trace.duration_ms)} ms"
    )


def trace_tree(trace: ReachTrace) -> Tree:
    """The request as a tree: route decision (candidates, scores, pick, reason), attempts and events, timed."""
    tree = Tree(summary(trace))
    known = (("tenant", trace.tenant), ("session", trace.session_id))
    context = [f"{label} {value}" for label, value in known if value]
    if context:
        tree.add("[dim]" + terminal_text(", ".join(context)) + "[/dim]")
    _route(tree, trace)
    items: list[Attempt | dict[str, Any]] = [*trace.attempts, *trace.events]
    timeline = [(item.started_at if isinstance(item, Attempt) else float(item.get("at", 0.0)), n, item)
                for n, item in enumerate(items)]  # fmt: skip
    for at, _, item in sorted(timeline, key=lambda entry: entry[:2]):
        offset = rounded((at - trace.started_at) * 1000.0)
        if isinstance(item, Attempt):
            _attempt(tree, offset, item)
        else:
            details = {key: rounded(value) for key, value in item.items() if key not in ("event", "at")}
            text = json.dumps(details, ensure_ascii=False, default=str) if details else ""
            tree.add(f"+{offset} ms [yellow]{terminal_text(item.get('event', '?'))}[/yellow] {terminal_text(text)}")
    if trace.error is not None:
        tree.add(f"[red]{terminal_text(trace.error.type)}: {terminal_text(trace.error.message)}[/red]")
    return tree


def _attempt(tree: Tree, offset: float, attempt: Attempt) -> None:
    style = "green" if attempt.outcome == "success" else "red"
    delivered = "" if attempt.delivered else " [yellow]not delivered[/yellow]"
    node = tree.add(
        f"+{offset} ms attempt {attempt.number} -> {terminal_text(attempt.agent)}/{terminal_text(attempt.instance)} "
        f"[{style}]{terminal_text(attempt.outcome)}[/{style}]{delivered} {rounded(attempt.duration_ms)} ms"
    )
    if attempt.error:
        node.add(f"[red]{terminal_text(attempt.error)}[/red]")
    if attempt.retry_delay_ms is not None:
        node.add(f"retry after {rounded(attempt.retry_delay_ms)} ms")
    if attempt.breaker_state:
        node.add(f"breaker {terminal_text(attempt.breaker_state)}")


def _route(tree: Tree, trace: ReachTrace) -> None:
    route = trace.route
    if route is None:
        tree.add("[dim]no route decision (refused before routing, or a replayed answer)[/dim]")
        return
    flags = [flag for flag, on in (("context_restore", route.context_restore), ("degraded", route.degraded)) if on]
    node = tree.add(
        f"route: [bold]{terminal_text(route.agent)}/{terminal_text(route.instance)}[/bold]"
        + f" affinity {terminal_text(route.affinity)}"
        + (f" [yellow]{', '.join(flags)}[/yellow]" if flags else "")
        + f" [dim]({rounded(route.elapsed_us)} µs)[/dim]"
    )
    node.add(f"reason: {terminal_text(route.reason)}")
    for candidate in route.candidates:
        name = candidate.agent + (f"/{candidate.instance}" if candidate.instance else "")
        score = f" score {rounded(candidate.score)}" if candidate.score is not None else ""
        skipped = f" [red]skipped: {terminal_text(candidate.skipped)}[/red]" if candidate.skipped else ""
        picked = " [green]<- picked[/green]" if candidate.instance == route.instance else ""
        node.add(f"candidate {terminal_text(name)}{score}{skipped}{picked}")
