"""`reach usage` and `reach trace` print trace-file data as inert text: no control sequence, no markup, reaches the
terminal (issue 24, deliverable 11)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = "\x1b[2J[bold red]x[/]\r\x9b2J\u202e"
"""Clear the screen (7-bit and 8-bit CSI), rich markup, a carriage return that rewrites the line, a bidi override."""
SHOWN = "\\x1b[2J[bold red]x[/]\\x0d\\x9b2J\\u202e"
"""How the console must show it: every control written out, the markup literal."""
SHOWN_IN_JSON = "\\u001b[2J[bold red]x[/]\\r\\x9b2J\\u202e"
"""The same inside an event's details, which are printed as JSON (ESC and CR in JSON's own escapes)."""
SGR = re.compile(r"\x1b\[[0-9;]*m")
"""The only sequence a colour console may emit itself: select graphic rendition (colour and weight)."""


def _field(name: str) -> str:
    return f"{name}:{HOSTILE}"


def _trace() -> dict[str, Any]:
    """One record with the hostile text in every string field the two commands print."""
    started = 1_900_000_000.0
    attempt = {
        "number": 1,
        "agent": _field("attempt.agent"),
        "instance": _field("attempt.instance"),
        "endpoint": "http://127.0.0.1:9",
        "started_at": started,
        "duration_ms": 3.0,
        "outcome": "transient",
        "error": _field("attempt.error"),
        "breaker_state": _field("attempt.breaker"),
    }
    return {
        "request_id": "rid-" + _field("request_id"),
        "capability": _field("capability"),
        "tenant": _field("tenant"),
        "session_id": _field("session"),
        "route": {
            "capability": _field("route.capability"),
            "candidates": [{"agent": _field("cand.agent"), "instance": _field("cand.inst"), "skipped": _field("skip")}],
            "agent": _field("route.agent"),
            "instance": _field("route.instance"),
            "endpoint": "http://127.0.0.1:9",
            "reason": _field("route.reason"),
        },
        "attempts": [attempt],
        "events": [{"event": _field("event.name"), "at": started, _field("event.key"): _field("event.value")}],
        "status": _field("status"),
        "error": {"type": _field("error.type"), "message": _field("error.message")},
        "started_at": started,
        "duration_ms": 4.0,
    }


PRINTED = {
    "usage": ["tenant", "attempt.agent", "capability"],
    "trace": [
        "request_id", "capability", "tenant", "session", "cand.agent", "cand.inst", "skip", "route.agent",
        "route.instance", "route.reason", "attempt.agent", "attempt.instance", "attempt.error", "attempt.breaker",
        "event.name", "event.key", "event.value", "status", "error.type", "error.message",
    ],
}  # fmt: skip
"""The fields each command prints (usage: tenant, agent of the last attempt, capability)."""


def _run(tmp_path: Path, command: str, colour: bool) -> str:
    """The real `reach` command in a process of its own, its output as the terminal would receive it."""
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(_trace()) + "\n", encoding="utf-8")
    args = ["usage", str(path)] if command == "usage" else ["trace", "rid-", "--file", str(path)]
    env = {name: value for name, value in os.environ.items() if name not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="1000", TERM="xterm-256color", **({"FORCE_COLOR": "1"} if colour else {}))
    done = subprocess.run(
        [sys.executable, "-m", "reach_plugins.cli", *args], env=env, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode("utf-8")


@pytest.mark.parametrize("command", ["usage", "trace"])
@pytest.mark.parametrize("colour", [False, True], ids=["plain", "colour"])
def test_trace_data_reaches_the_terminal_as_inert_text(tmp_path: Path, command: str, colour: bool) -> None:
    """Every printed field shows ESC, CR, 8-bit CSI and bidi controls written out and its markup literally."""
    out = _run(tmp_path, command, colour)
    assert bool(SGR.search(out)) == colour, "the console styles its own text in colour, and only then"
    bare = SGR.sub("", out)
    controls = sorted(
        {f"{ord(char):#x}" for char in bare if (ord(char) < 0x20 and char != "\n") or 0x7F <= ord(char) < 0xA0}
    )
    assert controls == [], f"control characters reached the terminal: {controls}"
    assert "\u202e" not in bare
    for name in PRINTED[command]:
        shown = SHOWN_IN_JSON if name in ("event.key", "event.value") else SHOWN
        assert f"{name}:{shown}" in bare, f"{name} is not shown as inert text"
