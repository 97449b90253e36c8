"""Callback mode: tickets for submitted requests, their results, and pushing a result to the caller's callback.

A ticket's result stays fetchable (``Result``, by the tenant that submitted
it only) for ``ttl`` seconds after it completes, whether or not the push
succeeded, so a failed delivery loses nothing; the push's outcome is kept on
the ticket. A callback is ``http(s)://host[:port]/...`` (the result JSON is
POSTed there, redirects not followed) or ``grpc://host:port`` (the node calls
``ReachCallback.Deliver`` there), and only to hosts the node's operator
allowed (``callback_hosts``): a node must not be a way to reach arbitrary
addresses from inside the network.

Tickets are addressed by :class:`~reach_plugins.stores.keys.ScopedKey`
(the submitting tenant's) and held within a
:class:`~reach_plugins.stores.budget.Budget`: past ``max_entries`` the node
answers backpressure, past ``max_bytes`` the oldest tickets go first, and a
result larger than ``max_bytes`` alone is kept as an ``entry_too_large``
failure instead.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import grpc

from reach_plugins.errors import EntryTooLarge, RequestError
from reach_plugins.model import ErrorInfo, ReachResponse
from reach_plugins.stores.budget import BoundedStore, Budget, LruTable, json_size
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.wire.body import response_body
from reach_plugins.wire.headers import HEADER_TICKET
from reach_plugins.wire.proto import reach_pb2 as pb
from reach_plugins.wire.proto import reach_pb2_grpc as pb_grpc
from reach_plugins.wire.protocodec import result_message
from reach_plugins.wire.redact import describe, safe_url

log = logging.getLogger("reach_plugins.node")

KIND = "ticket"
_TICKET_BYTES = 256
"""Estimated bytes of a ticket without its result (future, callback, delivery)."""


def check_callback(callback: str, allowed: Collection[str]) -> str:
    """``callback`` itself when the node may push there; ``RequestError`` naming the field and the rule otherwise.

    ``allowed`` holds ``host`` or ``host:port`` entries; a bare host allows any port.
    """
    try:
        parts = urlsplit(callback)
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
        parts = urlsplit("")
    if parts.scheme not in ("http", "https", "grpc") or not host or parts.username is not None:
        raise RequestError("callback must be http(s)://host[:port]/path or grpc://host:port, without user or password")
    if parts.scheme == "grpc" and (port is None or parts.path not in ("", "/")):
        raise RequestError("a grpc callback is grpc://host:port, nothing more")
    where = f"{host}:{port}" if port is not None else host
    if host not in allowed and where not in allowed:
        raise RequestError(
            f"callback host {where} is not one this node pushes to; its operator lists them in callback_hosts"
        )
    return callback


@dataclass(slots=True)
class _Ticket:
    done: asyncio.Future[ReachResponse]
    callback: str | None
    delivered: bool | None = None
    delivery_error: str | None = None


class Tickets(BoundedStore):
    """Issued tickets and their results, within a :class:`Budget`, kept ``ttl`` seconds after completion."""

    def __init__(
        self,
        *,
        budget: Budget,
        ttl: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        callback_hosts: Collection[str] = (),
    ) -> None:
        super().__init__(budget=budget)
        self.ttl = ttl
        self.callback_hosts = frozenset(callback_hosts)
        self._clock = clock
        self._finished: dict[ScopedKey, float] = {}
        self.table: LruTable[_Ticket] = LruTable(budget, "ticket", self._evicted)
        """Completion time of finished tickets, oldest first (dicts keep insertion order)."""
        self._session: aiohttp.ClientSession | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}

    @property
    def full(self) -> bool:
        self._prune()
        return len(self.table) >= self.budget.max_entries

    def check(self, callback: str) -> str:
        """``callback`` when this node may push there (see :func:`check_callback`)."""
        return check_callback(callback, self.callback_hosts)

    def issue(self, callback: str | None, tenant: str | None = None) -> str:
        self._prune()
        ticket = uuid.uuid4().hex
        entry = _Ticket(asyncio.get_running_loop().create_future(), callback)
        self.table.put(ScopedKey.of(tenant, KIND, ticket), entry, _TICKET_BYTES + len(callback or ""))
        return ticket

    def _entry(self, ticket: str, tenant: str | None) -> _Ticket:
        """The ticket, if ``tenant`` submitted it; ``KeyError`` otherwise (another tenant's ticket is unknown)."""
        entry = self.table.peek(ScopedKey.of(tenant, KIND, ticket))
        if entry is None:
            raise KeyError(ticket)
        return entry

    def delivery(self, ticket: str, tenant: str | None = None) -> tuple[bool | None, str | None]:
        """Whether the push of ``ticket``'s result succeeded (``None`` before it was tried), and why not."""
        entry = self._entry(ticket, tenant)
        return entry.delivered, entry.delivery_error

    async def complete(self, ticket: str, response: ReachResponse, tenant: str | None = None) -> None:
        """Record the result of ``tenant``'s ticket, then push it to the ticket's callback (if any)."""
        key = ScopedKey.of(tenant, KIND, ticket)
        entry = self.table.peek(key)
        if entry is None:
            return
        size = _TICKET_BYTES + len(entry.callback or "") + json_size(response)
        try:
            self.table.put(key, entry, size)
        except EntryTooLarge as exc:
            error = ErrorInfo(type=exc.error_type, message=exc.message)
            response = ReachResponse(request_id=response.request_id, status="fail", error=error)
            self.table.put(key, entry, _TICKET_BYTES + len(entry.callback or "") + json_size(response))
        self._finished[key] = self._clock()
        entry.done.set_result(response)
        if entry.callback:
            try:
                await self._push(entry.callback, ticket, response)
                entry.delivered = True
            except Exception as exc:
                reason = exc.message if isinstance(exc, RequestError) else describe(exc)
                entry.delivered, entry.delivery_error = False, reason
                log.warning("ticket %s: pushing the result to %s failed: %s", ticket, safe_url(entry.callback), reason)

    async def wait(self, ticket: str, timeout: float, tenant: str | None = None) -> ReachResponse | None:
        """``tenant``'s ``ticket``'s result within ``timeout`` s, ``None`` while pending; ``KeyError`` if unknown."""
        entry = self._entry(ticket, tenant)
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
        async with self._session.post(
            callback, data=data, headers=headers, timeout=timeout, allow_redirects=False
        ) as answer:
            if answer.status >= 300:
                raise RequestError(f"the callback answered HTTP {answer.status} (redirects are not followed)")

    def _evicted(self, key: ScopedKey, _entry: _Ticket) -> None:
        self._finished.pop(key, None)

    def _prune(self) -> None:
        """Forget results older than ``ttl`` (the oldest finish first, so this stops at the first fresh one)."""
        horizon = self._clock() - self.ttl
        while self._finished:
            key, finished = next(iter(self._finished.items()))
            if finished >= horizon:
                break
            del self._finished[key]
            self.table.pop(key)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
