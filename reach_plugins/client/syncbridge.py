"""Run coroutines from synchronous code, inside or outside a running event loop.

Frameworks call tools synchronously, sometimes from a thread that already runs
an event loop (Jupyter, LlamaIndex's sync ``call``). ``asyncio.run`` fails there,
so blocking calls go to one private loop on a daemon thread, owned by the bridge
and reused for every call (pooled connections stay bound to one loop).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import TypeVar

from reach_plugins.errors import ConfigError

T = TypeVar("T")


class SyncBridge:
    """A private event loop on a daemon thread; ``run(coro)`` blocks until the coroutine ends."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="reach-sync", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run ``awaitable`` on the private loop and block until it ends.

        The task starts in a copy of the caller's context (``call_soon_threadsafe`` captures it),
        so the caller's current span stays the parent of what runs there.
        """
        if threading.current_thread() is self._thread:
            raise ConfigError(
                "a blocking reach was made from the client's own event loop, which would wait on itself forever; "
                "await the async call (areach / ReachClient.reach) there instead"
            )
        return asyncio.run_coroutine_threadsafe(_awaited(awaitable), self.loop).result()

    async def submit(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` on the private loop from another loop (cancelling this await cancels it there)."""
        if asyncio.get_running_loop() is self._loop:
            return await awaitable
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_awaited(awaitable), self.loop))

    def close(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            loop.close()


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable
