"""The agent's HTTP answers as records: :class:`Outcome` (status, JSON body, headers) and the fail-shaped one.

A record of its own so that the agent, its idempotency claims and its app all
import it from below, never from one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reach_plugins.agent.handlers import dumps
from reach_plugins.errors import HandlerFailed, ReachError


@dataclass(frozen=True, slots=True)
class Outcome:
    """One HTTP answer of the agent: status code, JSON body, extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    encoded: bytes = field(init=False, repr=False, compare=False)
    """The JSON body, encoded once when the outcome is made (a value that cannot be encoded fails right there)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "encoded", dumps(self.body).encode())

    @property
    def settled(self) -> bool:
        """An answer its idempotency key keeps: below 500, or a handler that ran and raised (its own 500)."""
        error = self.body.get("error")
        return self.status < 500 or (isinstance(error, dict) and error.get("type") == HandlerFailed.code)


def fail(request_id: Any, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Outcome:
    """A failed reply in the agent's wire shape: ``error.type`` is ``kind``, ``error.message`` says why."""
    body = {"request_id": request_id, "status": "fail", "data": None, "error": {"type": kind, "message": message}}
    return Outcome(status, body, headers or {})


def refused(request_id: Any, exc: ReachError) -> Outcome:
    """A fail answer carrying the error's own HTTP status and wire code (:mod:`reach_plugins.errors`)."""
    return fail(request_id, exc.http_status, exc.error_type, exc.message)
