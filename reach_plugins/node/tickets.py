"""Callback mode: tickets for submitted requests, their results, and pushing a result to the caller's callback.

A ticket's result stays fetchable (``Result``) for ``ttl`` seconds after it
completes, whether or not the push succeeded, so a failed delivery loses
nothing. A callback is ``http(s)://...`` (the result JSON is POSTed there) or
``grpc://host:port`` (the node calls ``ReachCallback.Deliver`` there).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc

from reach_plugins.errors import RequestError
from reach_plugins.model import ReachResponse
from reach_plugins.wire import response_body
from transports.grpcnode import reach_pb2 as pb
from transports.grpcnode import reach_pb2_grpc as pb_grpc
from transports.grpcnode.codec import result_message

log = logging.getLogger("reach_plugins.node")

HEADER_TICKET = "X-Reach-Ticket"


def check_callback(callback: str) -> str:
    """``callback`` itself when it is a URL the node can push to; ``RequestError`` naming the forms otherwise."""
    if callback.startswith(("http://", "https://")):
        return callback
    host, _, port = callback.removeprefix("grpc://").rpartition(":")
    if callback.startswith("grpc://") and host and port.isdigit():
        return callback
    raise RequestError(f"callback must be http(s)://... or grpc://host:port, got {callback!r}")


@dataclass(slots=True)
class _Ticket:
    done: asyncio.Future[ReachResponse]
    callback: str | None
    delivered: bool | None = None
    delivery_error: str | None = None


class Tickets:
    """Issued tickets and their results, bounded in number and kept ``ttl`` seconds after completion."""

    def __init__(
        self, *, ttl: float = 600.0, max_tickets: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self.max_tickets = max_tickets
        self._clock = clock
        self._tickets: dict[str, _Ticket] = {}
        self._finished: dict[str, float] = {}
        """Completion time of finished tickets, oldest first (dicts keep insertion order)."""
        self._session: aiohttp.ClientSession | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}

    @property
    def full(self) -> bool:
        self._prune()
        return len(self._tickets) >= self.max_tickets

    def issue(self, callback: str | None) -> str:
        self._prune()
        ticket = uuid.uuid4().hex
        self._tickets[ticket] = _Ticket(asyncio.get_running_loop().create_future(), callback)
        return ticket

    def delivery(self, ticket: str) -> tuple[bool | None, str | None]:
        """Whether the push of ``ticket``'s result succeeded (``None`` before it was tried), and why not."""
        entry = self._tickets[ticket]
        return entry.delivered, entry.delivery_error

    async def complete(self, ticket: str, response: ReachResponse) -> None:
        """Record the result, then push it to the ticket's callback (if any)."""
        entry = self._tickets.get(ticket)
        if entry is None:
            return
        self._finished[ticket] = self._clock()
        entry.done.set_result(response)
        if entry.callback:
            try:
                await self._push(entry.callback, ticket, response)
                entry.delivered = True
            except Exception as exc:
                entry.delivered, entry.delivery_error = False, f"{type(exc).__name__}: {exc}"
                log.warning("ticket %s: pushing the result to %s failed: %s", ticket, entry.callback, exc)

    async def wait(self, ticket: str, timeout: float) -> ReachResponse | None:
        """The result of ``ticket`` within ``timeout`` seconds, ``None`` while pending; ``KeyError`` if unknown."""
        entry = self._tickets[ticket]
        if entry.done.done():
            return entry.done.result()
        if timeout <= 0:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(entry.done), timeout)
        except TimeoutError:
            return None

    async def _push(self, callback: str, ticket: str, response: ReachResponse) -> None:
        if callback.startswith("grpc://"):
            target = callback.removeprefix("grpc://")
            channel = self._channels.get(target)
            if channel is None:
                channel = self._channels[target] = grpc.aio.insecure_channel(target)
            stub = pb_grpc.ReachCallbackStub(channel)  # type: ignore[no-untyped-call]
            delivery = pb.Delivery(ticket=ticket, result=result_message(response))
            await stub.Deliver(delivery, timeout=10.0)
            return
        if self._session is None:
            self._session = aiohttp.ClientSession(trust_env=False)
        body: dict[str, Any] = {"ticket": ticket, "result": response_body(response)}
        data = json.dumps(body, separators=(",", ":"), default=str).encode()
        headers = {"Content-Type": "application/json", HEADER_TICKET: ticket}
        timeout = aiohttp.ClientTimeout(total=10.0)
        async with self._session.post(callback, data=data, headers=headers, timeout=timeout) as answer:
            if answer.status >= 300:
                raise RequestError(f"the callback answered HTTP {answer.status}")

    def _prune(self) -> None:
        """Forget results older than ``ttl`` (the oldest finish first, so this stops at the first fresh one)."""
        horizon = self._clock() - self.ttl
        while self._finished:
            key, finished = next(iter(self._finished.items()))
            if finished >= horizon:
                break
            del self._finished[key]
            self._tickets.pop(key, None)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
