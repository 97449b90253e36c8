"""Usage per tenant, agent and capability (seed 000, section 4.4): who spends how many calls and tokens.

Tokens come from what the agent reported (OpenAI-compatible ``usage``, kept on
the request's trace), or are estimated from the characters a stream carried
(about four characters a token) when it reported none. :func:`summarise` sums
JSON-lines traces (the :class:`~reach_plugins.telemetry.trace.JsonLinesSink`) over a
time range; ``reach usage`` prints it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from reach_plugins.model import ReachTrace
from reach_plugins.telemetry.spans import EVENT_STREAMED
from reach_plugins.telemetry.trace import trace_files
from reach_plugins.units import estimate_tokens


def usage_of(data: Any) -> dict[str, int] | None:
    """The token counts a reply carries (``raw_meta.usage`` or ``usage``, OpenAI's shape), else None."""
    if not isinstance(data, Mapping):
        return None
    meta = data.get("raw_meta")
    usage = data.get("usage") or (meta.get("usage") if isinstance(meta, Mapping) else None)
    if not isinstance(usage, Mapping):
        return None
    counts = {key: value for key, value in usage.items() if isinstance(value, int) and not isinstance(value, bool)}
    return counts or None


@dataclass
class UsageRow:
    """Calls and tokens of one (tenant, agent, capability)."""

    tenant: str
    agent: str
    capability: str
    calls: int = 0
    succeeded: int = 0
    reported_tokens: int = 0
    estimated_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.reported_tokens + self.estimated_tokens


def tokens_of(trace: ReachTrace) -> tuple[int, int]:
    """(reported, estimated) tokens of one request."""
    return tokens_in(trace.usage, trace.events)


def tokens_in(usage: Mapping[str, int] | None, events: Iterable[Mapping[str, Any]]) -> tuple[int, int]:
    """(reported, estimated) tokens of a request that reported ``usage`` and had ``events`` (a trace's, or its
    recorder's)."""
    if usage:
        total = usage.get("total_tokens")
        if total is None:
            total = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
        return total, 0
    chars = sum(int(event.get("chars", 0)) for event in events if event.get("event") == EVENT_STREAMED)
    return 0, estimate_tokens(chars)


def summarise(
    traces: Iterable[ReachTrace], *, since: float | None = None, until: float | None = None
) -> list[UsageRow]:
    """Usage rows, biggest spender first, of the traces that started in ``[since, until)`` (epoch seconds)."""
    rows: dict[tuple[str, str, str], UsageRow] = {}
    for trace in traces:
        if (since is not None and trace.started_at < since) or (until is not None and trace.started_at >= until):
            continue
        agent = trace.attempts[-1].agent if trace.attempts else (trace.route.agent if trace.route else "-")
        key = (trace.tenant or "-", agent, trace.capability)
        row = rows.setdefault(key, UsageRow(*key))
        row.calls += 1
        row.succeeded += trace.status == "success"
        reported, estimated = tokens_of(trace)
        row.reported_tokens += reported
        row.estimated_tokens += estimated
    return sorted(rows.values(), key=lambda row: (-row.tokens, -row.calls, row.tenant, row.agent, row.capability))


def read_traces(path: Path) -> Iterator[ReachTrace]:
    """The traces of a JSON-lines file and its rotated backups (oldest first), skipping lines that are not one (a
    torn last line, say)."""
    files = trace_files(path)
    if not files:
        raise FileNotFoundError(f"no trace file at {path}; write one with `reach gateway --trace-file {path}`")
    for file in files:
        with file.open(encoding="utf-8") as lines:
            for line in lines:
                try:
                    yield ReachTrace.model_validate_json(line)
                except ValidationError:
                    continue
