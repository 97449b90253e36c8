"""A handler stops when nobody waits for its answer any more (DESIGN 11.3).

When the caller goes away — it gave up, or its conversation was closed and
the client cut the call — the HTTP connection closes and the server sees
``http.disconnect``. :func:`while_connected` runs the handler beside a
watcher of that event: an async handler is cancelled at its next ``await``;
a sync handler (running in a worker thread, which nothing can interrupt)
sees :func:`cancelled` turn true and is expected to check it between steps::

    @agent.capability("reindex")
    def reindex(shards: int) -> dict:
        for shard in range(shards):
            if cancelled():
                return {"stopped_at": shard}
            work_on(shard)

Streams need nothing here: the server's streaming response already stops
(and closes) a stream whose client disconnected.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
"""An ASGI ``receive`` callable."""

_flag: ContextVar[threading.Event | None] = ContextVar("reach_agent_cancelled", default=None)


def cancelled() -> bool:
    """True once the caller of the request this code serves has gone away (sync handlers poll it).

    Works in the handler's own thread: the handler runs with a copy of the
    request's context, which holds the flag.
    """
    flag = _flag.get()
    return flag is not None and flag.is_set()


async def _disconnected(receive: Receive) -> None:
    """Return when the client disconnects (the request body must have been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def while_connected(receive: Receive, work: Coroutine[Any, Any, T]) -> T | None:
    """``await work`` unless the client disconnects first; then cancel it, set the flag, and return None."""
    flag = threading.Event()
    token = _flag.set(flag)
    try:
        task = asyncio.ensure_future(work)
    finally:
        _flag.reset(token)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        flag.set()
        task.cancel()
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    if task.done():
        return task.result()
    flag.set()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None
