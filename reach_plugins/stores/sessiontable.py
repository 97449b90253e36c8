"""The agent's session states, namespaced by tenant and bounded in number (least recently used go first).

Tenant B naming tenant A's ``session_id`` gets a state of its own, never A's;
a flood of new session ids evicts the oldest conversations instead of
growing the table without end. Snapshots store each state under a key
joining tenant and session id (``tenant<US>session``; the unit separator
cannot appear in either, :func:`check_session` refuses control characters).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any, Final

MAX_SESSIONS: Final = 10_000
"""Default number of conversations an agent keeps state for."""
MAX_SESSION_ID: Final = 256
"""Longest session id (and tenant name) accepted, in characters."""
_SEP: Final = "\x1f"

Key = tuple[str | None, str]


def check_session(session_id: Any, tenant: Any) -> str | None:
    """Why ``session_id``/``tenant`` cannot key a session (a message naming the field), or ``None``."""
    for field, value in (("session_id", session_id), ("tenant", tenant)):
        if value is None:
            continue
        if not isinstance(value, str):
            return f"{field} must be a string, got {type(value).__name__}"
        if len(value) > MAX_SESSION_ID:
            return f"{field} is {len(value)} characters long; at most {MAX_SESSION_ID}"
        if not value.isprintable():
            return f"{field} must not hold control characters"
    return None


def _encode(key: Key) -> str:
    tenant, session_id = key
    return session_id if tenant is None else f"{tenant}{_SEP}{session_id}"


def _decode(saved: str) -> Key:
    tenant, sep, session_id = saved.partition(_SEP)
    return (tenant, session_id) if sep else (None, saved)


class SessionTable(Mapping[str, dict[str, Any]]):
    """State per (tenant, session id); also readable as a mapping of snapshot keys (``"s1"``, ``"acme<US>s1"``)."""

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._states: OrderedDict[Key, dict[str, Any]] = OrderedDict()

    def state(self, tenant: str | None, session_id: str) -> dict[str, Any]:
        """The live state of one conversation (created empty), marked as the most recently used."""
        key = (tenant, session_id)
        found = self._states.get(key)
        if found is None:
            found = self._states[key] = {}
            while len(self._states) > self.max_sessions:
                self._states.popitem(last=False)
        else:
            self._states.move_to_end(key)
        return found

    def restore(self, saved: Mapping[str, dict[str, Any]]) -> None:
        """Take states back from a snapshot (keys as :meth:`__iter__` gives them)."""
        for name, state in saved.items():
            self.state(*_decode(name)).update(state)

    def __getitem__(self, name: str) -> dict[str, Any]:
        return self._states[_decode(name)]

    def __iter__(self) -> Iterator[str]:
        return (_encode(key) for key in list(self._states))

    def __len__(self) -> int:
        return len(self._states)
