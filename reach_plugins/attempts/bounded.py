"""Run an awaitable within an absolute deadline on a clock, arming the timer only if it has to wait.

Most sends of an in-process transport (and every cached or refused one)
finish without ever suspending; a timer set and cancelled around each of them
is most of what the core would add to such a call. :func:`within` takes the
first step of the coroutine itself: a coroutine that finishes there needed no
timer; one that suspends is resumed under ``clock.timeout_at(deadline)``,
exactly as if it had been awaited inside it from the start (the deadline is
absolute, so arming it a step later moves nothing).
"""

from __future__ import annotations

import types
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

from reach_plugins.clock import Clock

T = TypeVar("T")


async def within(clock: Clock, deadline: float, coro: Coroutine[Any, Any, T]) -> T:
    """``await coro``, cut at ``deadline`` with :class:`TimeoutError` (as ``clock.timeout_at`` does) if it waits."""
    try:
        waiting = coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    async with clock.timeout_at(deadline):
        return await resume(coro, waiting)


@types.coroutine
def resume(coro: Coroutine[Any, Any, T], waiting: Any) -> Generator[Any, Any, T]:
    """Carry on driving ``coro`` from where its first step left it, passing sends and throws through."""
    while True:
        try:
            sent = yield waiting
        except BaseException as exc:  # cancellation (the timer) and the rest go into the coroutine
            try:
                waiting = coro.throw(exc)
            except StopIteration as done:
                result: T = done.value
                return result
        else:
            try:
                waiting = coro.send(sent)
            except StopIteration as done:
                result = done.value
                return result
