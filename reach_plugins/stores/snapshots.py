"""Session snapshots: an agent saves its sessions' state on shutdown and restores it on start.

So a restarted instance picks conversations up where they were; the store is
pluggable (in memory here, Redis when several processes share it).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Protocol


class SnapshotStore(Protocol):
    """Keeps the session state of each agent between runs."""

    async def save(self, agent: str, sessions: Mapping[str, dict[str, Any]]) -> None: ...

    async def load(self, agent: str) -> dict[str, dict[str, Any]]: ...


class MemorySnapshotStore:
    """In-process store (survives an agent app's restart within one process, e.g. in tests)."""

    def __init__(self) -> None:
        self._saved: dict[str, dict[str, dict[str, Any]]] = {}

    async def save(self, agent: str, sessions: Mapping[str, dict[str, Any]]) -> None:
        self._saved[agent] = copy.deepcopy(dict(sessions))

    async def load(self, agent: str) -> dict[str, dict[str, Any]]:
        return copy.deepcopy(self._saved.get(agent, {}))
