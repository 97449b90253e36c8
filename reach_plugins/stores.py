"""Open the shared-state stores from an object or a URL (``memory://``, later ``redis://host:port/db``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from reach_plugins.errors import ConfigError
from reach_plugins.sessions import MemorySessions, SessionStore

if TYPE_CHECKING:
    from reach_plugins.core.dedup import DedupStore

SUPPORTED = ("memory://",)


def _scheme(url: str, what: str) -> str:
    scheme = urlsplit(url).scheme
    if scheme != "memory":
        raise ConfigError(f"unsupported {what} URL {url!r}; supported: {', '.join(SUPPORTED)}")
    return scheme


def open_store(store: DedupStore | str) -> DedupStore:
    """The idempotency/dedup store named by ``store`` (an object is used as is)."""
    from reach_plugins.core.dedup import MemoryDedupStore

    if isinstance(store, str):
        _scheme(store, "store")
        return MemoryDedupStore()
    return store


def open_sessions(sessions: SessionStore | str, *, clock: Callable[[], float] | None = None) -> SessionStore:
    """The session liveness store."""
    if isinstance(sessions, str):
        _scheme(sessions, "sessions")
        return MemorySessions(clock=clock)
    return sessions
