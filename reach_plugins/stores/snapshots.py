"""Session snapshots: an agent saves its sessions' state on shutdown and restores it on start.

So a restarted instance picks conversations up where they were; the store is
pluggable (in memory here, Redis when several processes share it). A
snapshot's sessions are named as :class:`~reach_plugins.stores.sessiontable.SessionTable`
names them (``s1``, ``acme<US>s1``); the memory store keeps each conversation
as one entry addressed by its tenant's key, within a :class:`Budget`, and
``save`` merges (as the Redis store does) so instances of one agent keep
each other's conversations.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final, Protocol

from reach_plugins.stores.budget import BoundedStore, Budget, LruTable
from reach_plugins.stores.keys import SEP, ScopedKey
from reach_plugins.stores.sessions import session_key
from reach_plugins.stores.sessiontable import conversation_of, snapshot_name

KIND: Final = "snapshot"


class SnapshotStore(Protocol):
    """Keeps the session state of each agent between runs."""

    async def save(self, agent: str, sessions: Mapping[str, dict[str, Any]]) -> None: ...

    async def load(self, agent: str) -> dict[str, dict[str, Any]]: ...


class MemorySnapshotStore(BoundedStore):
    """In-process store (survives an agent app's restart within one process, e.g. in tests)."""

    def __init__(self, *, budget: Budget) -> None:
        super().__init__(budget=budget)
        self.table: LruTable[dict[str, Any]] = LruTable(budget, "snapshot")

    async def save(self, agent: str, sessions: Mapping[str, dict[str, Any]]) -> None:
        for name, state in sessions.items():
            conversation = conversation_of(name)
            key = ScopedKey(conversation.tenant, KIND, f"{agent}{SEP}{conversation.id}")
            self.table.put(key, copy.deepcopy(state))

    async def load(self, agent: str) -> dict[str, dict[str, Any]]:
        mine = f"{agent}{SEP}"
        return {
            snapshot_name(session_key(key.tenant, key.id.removeprefix(mine))): copy.deepcopy(state)
            for key in self.table
            if key.id.startswith(mine) and (state := self.table.peek(key)) is not None
        }
