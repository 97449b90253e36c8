"""The MCP sessions a client holds: one per (endpoint, tenant, conversation), bounded, the oldest pushed out.

A pushed-out session is remembered (a few hundred at most) so the next
handshake with its server can DELETE it, rather than leave it to the server's
expiry.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass

from reach_plugins.transport import Call

SESSIONS_KEPT = 4096
EVICTED_KEPT = 256
"""Pushed-out sessions remembered for their DELETE; past that, the server's own expiry ends them."""

SessionKey = tuple[str, str | None, str | None]


@dataclass(slots=True)
class McpSession:
    """One MCP session: the server's id (``None`` for a stateless server), its version, whether it is initialised."""

    session_id: str | None
    version: str
    ready: bool = False
    url: str | None = None
    """Where the session lives (its DELETE goes there)."""
    stateless: bool = False
    """The 2026-07-28 wire: no initialize, every request carries the protocol ``_meta`` instead."""


class McpSessions:
    """MCP sessions per (endpoint, tenant, conversation); bounded, the least recently used dropped first."""

    def __init__(self, size: int = SESSIONS_KEPT) -> None:
        self._size = size
        self._sessions: OrderedDict[SessionKey, McpSession] = OrderedDict()
        self._evicted: deque[tuple[SessionKey, McpSession]] = deque(maxlen=EVICTED_KEPT)
        """Sessions pushed out by newer ones: the next handshake with their server DELETEs them."""
        self._lock = threading.Lock()
        """Blocking clients run their own loop in another thread: the map is shared across them."""

    @staticmethod
    def key(call: Call) -> SessionKey:
        return (call.instance.endpoint, call.request.tenant, call.request.session_id)

    def get(self, call: Call) -> McpSession | None:
        key = self.key(call)
        with self._lock:
            session = self._sessions.get(key)
            if session is not None:
                self._sessions.move_to_end(key)
            return session

    def put(self, call: Call, session: McpSession) -> None:
        with self._lock:
            self._sessions[self.key(call)] = session
            while len(self._sessions) > self._size:
                self._evicted.append(self._sessions.popitem(last=False))

    def evicted(self, call: Call) -> McpSession | None:
        """One session of this call's server and tenant that was pushed out, taken off the list."""
        endpoint, tenant, _ = self.key(call)
        with self._lock:
            for index, (key, session) in enumerate(self._evicted):
                if key[:2] == (endpoint, tenant):
                    del self._evicted[index]
                    return session
            return None

    def forget(self, call: Call) -> None:
        with self._lock:
            self._sessions.pop(self.key(call), None)

    def drop(self, conversation: tuple[str | None, str] | None) -> list[tuple[SessionKey, McpSession]]:
        """Remove and return the sessions of a conversation (tenant, session id), or every one when ``None``."""
        with self._lock:
            keys = [key for key in self._sessions if conversation is None or key[1:] == conversation]
            dropped = [(key, self._sessions.pop(key)) for key in keys]
            if conversation is None:
                dropped.extend(self._evicted)
                self._evicted.clear()
            return dropped
