"""An agent for the hostile agent-SDK tests: notes kept in session state, and a handler that fails with a secret."""

from __future__ import annotations

from typing import Any

from reach_plugins.agent import ReachAgent, ReachContext

SECRET_DSN = "postgres://svc:PaSsWoRd-4e1d@127.0.0.1:5432/orders"

agent = ReachAgent("notes", max_sessions=50, tokens="open")
"""Open (no token): these tests probe what an agent does with hostile bodies and headers, past any token."""


@agent.capability("note")
def note(ctx: ReachContext, text: str | None = None) -> dict[str, Any]:
    """Store ``text`` in the session (when given) and return what the session holds."""
    if text is not None:
        ctx.state["note"] = text
    return {"note": ctx.state.get("note")}


@agent.capability("connect")
def connect() -> None:
    """Fail the way a real handler does: with a credentialed URL in the exception text."""
    raise ConnectionError(f"db connect failed: {SECRET_DSN}")


@agent.capability("connect_stream")
def connect_stream() -> Any:
    """The same failure, from a streaming handler, after one event."""
    yield "first"
    raise ConnectionError(f"db connect failed: {SECRET_DSN}")
