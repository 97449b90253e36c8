"""Open the shared-state stores from an object or a URL (``memory://``, ``redis://host:port/db``).

A memory store gets :data:`~reach_plugins.stores.budget.DEFAULT_BUDGET`. Redis
stores live in :mod:`reach_plugins.stores.redis` and are imported only when a
``redis://`` URL asks for them (the ``redis`` extra).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from reach_plugins.errors import ConfigError
from reach_plugins.stores.budget import DEFAULT_BUDGET
from reach_plugins.stores.dedup import MemoryDedupStore
from reach_plugins.stores.sessions import MemorySessions, SessionStore

if TYPE_CHECKING:
    from reach_plugins.stores.dedup import DedupStore
    from reach_plugins.stores.quotas import QuotaStore

SUPPORTED = ("memory://", "redis://HOST:PORT/DB")


def _backend(url: str, what: str, module: str) -> ModuleType | None:
    """None for ``memory://``; the Redis backend module for ``redis://`` (imported now); else ConfigError."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        return None
    if scheme not in ("redis", "rediss"):
        raise ConfigError(f"unsupported {what} URL {url!r}; supported: {', '.join(SUPPORTED)}")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f'{what} URL {url!r} needs the redis extra: pip install "reach-plugins[redis]"') from exc


def open_store(store: DedupStore | str) -> DedupStore:
    """The idempotency/dedup store named by ``store`` (an object is used as is)."""
    if isinstance(store, str):
        backend = _backend(store, "store", "reach_plugins.stores.redis_dedup")
        opened: DedupStore = backend.from_url(store) if backend else MemoryDedupStore(budget=DEFAULT_BUDGET)
        return opened
    return store


def open_sessions(sessions: SessionStore | str, *, clock: Callable[[], float] | None = None) -> SessionStore:
    """The session liveness store."""
    if isinstance(sessions, str):
        backend = _backend(sessions, "sessions", "reach_plugins.stores.redis_sessions")
        if backend is not None:
            opened: SessionStore = backend.from_url(sessions, clock=clock)
            return opened
        return MemorySessions(budget=DEFAULT_BUDGET, clock=clock)
    return sessions


def open_quota_store(url: str) -> QuotaStore | None:
    """The shared quota store of ``quotas.store`` (``redis://``); None for ``memory://`` (this process alone)."""
    backend = _backend(url, "quotas.store", "reach_plugins.stores.redis_quotas")
    if backend is None:
        return None
    store: QuotaStore = backend.from_url(url)
    return store
