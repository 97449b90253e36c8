"""Callback mode: tickets for submitted requests, their results, and pushing a result to the caller's callback.

A ticket's result stays fetchable (``Result``, by the tenant that submitted
it only) for ``ttl`` seconds after it completes, whether or not the push
succeeded, so a failed delivery loses nothing; the push's outcome is kept on
the ticket. A callback is ``http(s)://host[:port]/...`` (the result JSON is
POSTed there, redirects not followed) or ``grpc://host:port`` (the node calls
``ReachCallback.Deliver`` there), and only to hosts the node's operator
allowed (``callback_hosts``): a node must not be a way to reach arbitrary
addresses from inside the network.
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

from reach_plugins.errors import RequestError
from reach_plugins.model import ReachResponse
from reach_plugins.wire.body import response_body
from reach_plugins.wire.headers import HEADER_TICKET
from reach_plugins.wire.proto import reach_pb2 as pb
from reach_plugins.wire.proto import reach_pb2_grpc as pb_grpc
from reach_plugins.wire.protocodec import result_message
from reach_plugins.wire.redact import describe, safe_url

log = logging.getLogger("reach_plugins.node")


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
    tenant: str | None = None
    delivered: bool | None = None
    delivery_error: str | None = None


class Tickets:
    """Issued tickets and their results, bounded in number and kept ``ttl`` seconds after completion."""

    def __init__(
        self,
        *,
        ttl: float = 600.0,
        max_tickets: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        callback_hosts: Collection[str] = (),
    ) -> None:
        self.ttl = ttl
        self.callback_hosts = frozenset(callback_hosts)
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

    def check(self, callback: str) -> str:
        """``callback`` when this node may push there (see :func:`check_callback`)."""
        return check_callback(callback, self.callback_hosts)

    def issue(self, callback: str | None, tenant: str | None = None) -> str:
        self._prune()
        ticket = uuid.uuid4().hex
        self._tickets[ticket] = _Ticket(asyncio.get_running_loop().create_future(), callback, tenant)
        return ticket

    def _entry(self, ticket: str, tenant: str | None) -> _Ticket:
        """The ticket, if ``tenant`` submitted it; ``KeyError`` otherwise (another tenant's ticket is unknown)."""
        entry = self._tickets[ticket]
        if entry.tenant != tenant:
            raise KeyError(ticket)
        return entry

    def delivery(self, ticket: str, tenant: str | None = None) -> tuple[bool | None, str | None]:
        """Whether the push of ``ticket``'s result succeeded (``None`` before it was tried), and why not."""
        entry = self._entry(ticket, tenant)
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
