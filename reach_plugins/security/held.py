"""The token the request being served arrived with, so reaches made while serving it exchange it (never forward it).

The agent SDK enters :func:`holding` around every handler; a
:class:`~reach_plugins.security.source.TokenSource` reads :func:`received`.
A ContextVar follows the handler into its tasks and threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_RECEIVED: ContextVar[str | None] = ContextVar("reach_plugins_received_token", default=None)


def received() -> str | None:
    """The token of the request being served here, or ``None`` outside a served handler."""
    return _RECEIVED.get()


@contextmanager
def holding(token: str | None) -> Iterator[None]:
    """Mark the enclosed code as serving a request that arrived with ``token``."""
    mark = _RECEIVED.set(token)
    try:
        yield
    finally:
        _RECEIVED.reset(mark)
