"""The agent's session states, one per tenant's conversation, within a :class:`Budget` (least recently used go first).

Tenant B naming tenant A's ``session_id`` gets a state of its own, never A's
(each state is addressed by :func:`~reach_plugins.stores.sessions.session_key`);
a flood of new session ids, or of large states, evicts the oldest
conversations instead of growing the table without end. A state is sized
(as JSON) each time its conversation is touched, i.e. as the last turn left
it; one grown past ``max_bytes`` alone is dropped and refused with
:class:`EntryTooLarge`. Snapshots store each state under the session id, or
``tenant<US>session`` for a named tenant (the unit separator cannot appear in
either, :func:`check_session` refuses control characters).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

from reach_plugins.errors import EntryTooLarge
from reach_plugins.stores.budget import BoundedStore, Budget, LruTable
from reach_plugins.stores.keys import DEFAULT_TENANT, SEP, ScopedKey
from reach_plugins.stores.sessions import session_key

MAX_SESSIONS: Final = 10_000
"""Default number of conversations an agent keeps state for."""
MAX_SESSION_ID: Final = 256
"""Longest session id (and tenant name) accepted, in characters."""


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


def snapshot_name(key: ScopedKey) -> str:
    """The name a snapshot keeps a conversation's state under: the session id, or ``tenant<US>session``."""
    return key.id if key.tenant == DEFAULT_TENANT else f"{key.tenant}{SEP}{key.id}"


def conversation_of(saved: str) -> ScopedKey:
    """The conversation a snapshot name stands for (:func:`snapshot_name` reversed)."""
    tenant, sep, session_id = saved.partition(SEP)
    return session_key(tenant, session_id) if sep else session_key(None, saved)


class SessionTable(BoundedStore, Mapping[str, dict[str, Any]]):
    """State per tenant's conversation; also readable as a mapping of snapshot keys (``"s1"``, ``"acme<US>s1"``)."""

    def __init__(self, *, budget: Budget) -> None:
        super().__init__(budget=budget)
        self.table: LruTable[dict[str, Any]] = LruTable(budget, "session state")

    def state(self, tenant: str | None, session_id: str) -> dict[str, Any]:
        """The live state of one conversation (created empty), sized and marked as the most recently used."""
        key = session_key(tenant, session_id)
        found = self.table.peek(key)
        if found is None:
            found = {}
        try:
            self.table.put(key, found)
        except EntryTooLarge:
            self.table.pop(key)
            raise
        return found

    def restore(self, saved: Mapping[str, dict[str, Any]]) -> None:
        """Take states back from a snapshot (keys as :meth:`__iter__` gives them)."""
        for name, state in saved.items():
            key = conversation_of(name)
            self.table.put(key, {**(self.table.peek(key) or {}), **state})

    def __getitem__(self, name: str) -> dict[str, Any]:
        found = self.table.peek(conversation_of(name))
        if found is None:
            raise KeyError(name)
        return found

    def __iter__(self) -> Iterator[str]:
        return (snapshot_name(key) for key in self.table)

    def __len__(self) -> int:
        return len(self.table)
