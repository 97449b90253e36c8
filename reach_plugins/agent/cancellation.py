"""A handler stops when nobody waits for its answer any more (DESIGN 11.3).

When the caller goes away — it gave up, or its conversation was closed and
the client cut the call — the HTTP connection closes and the server sees
``http.disconnect``. :func:`while_connected` runs the handler in the
request's task and, once it suspends, watches for that event: an async
handler is cancelled at its next ``await``;
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

from reach_plugins.attempts.bounded import resume

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
    """``await work`` unless the client disconnects first; then cancel it, set the flag, and return None.

    ``work`` runs in the request's own task, not one spawned for it, and its
    first step is taken before anything watches: a handler that answers
    without suspending needs no watcher (its answer is there before a
    disconnect could matter). One that suspends is watched by one task, which
    on ``http.disconnect`` cancels the request's task at its next ``await``.
    """
    flag = threading.Event()
    token = _flag.set(flag)
    try:
        try:
            waiting = work.send(None)
        except StopIteration as done:
            result: T = done.value
            return result
        return await _watched(receive, work, waiting, flag)
    finally:
        _flag.reset(token)


async def _watched(receive: Receive, work: Coroutine[Any, Any, T], waiting: Any, flag: threading.Event) -> T | None:
    """Resume ``work`` in this task beside a watcher of the disconnect; None if the client went away."""
    task = asyncio.current_task()
    assert task is not None, "while_connected runs inside a request's task"
    running = True

    def gone(watcher: asyncio.Future[None]) -> None:
        if running and not watcher.cancelled() and watcher.exception() is None:
            flag.set()
            task.cancel()

    watcher = asyncio.ensure_future(_disconnected(receive))
    watcher.add_done_callback(gone)
    try:
        return await resume(work, waiting)
    except asyncio.CancelledError:
        flag.set()
        if watcher.done() and not watcher.cancelled() and task.uncancel() == 0:
            return None  # cancelled by the disconnect alone: the answer nobody waits for is no answer
        raise
    finally:
        running = False
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
