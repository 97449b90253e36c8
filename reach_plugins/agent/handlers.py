"""Capability handlers: plain Python functions (sync, async, generators) called with the payload as keywords.

A handler takes the payload's fields as keyword arguments, plus ``ctx`` (a
:class:`ReachContext`) and ``media`` (the request's
:class:`~reach_plugins.media.MediaPart` list) when it declares parameters of
those names. It answers with media by returning a part, a list of parts, or
:class:`WithMedia` (data and parts). Generators and async generators stream:
each item is one event.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import time
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
from jsonschema import SchemaError
from jsonschema.validators import validator_for
from pydantic import BaseModel

from reach_plugins.attempts.limiter import ConcurrencyLimiter
from reach_plugins.errors import ConfigError, InvalidPayload, RateLimited
from reach_plugins.media import MediaPart
from reach_plugins.model import Capability
from reach_plugins.policy.limits import AGENT_QUEUE
from reach_plugins.wire.items import collected, result_item

_DONE = object()

SEAT_WAIT = 1.0
"""The longest a call waits in a capability's line for one of its ``max_concurrency`` seats (less when the
caller's deadline is nearer); then it is answered "not executed" (503, Retry-After) and goes elsewhere."""


@dataclass(frozen=True, slots=True)
class ReachContext:
    """What a handler may want to know about the call besides its payload."""

    request_id: str
    capability: str
    action: str | None = None
    session_id: str | None = None
    tenant: str | None = None
    idempotency_key: str | None = None
    idempotency_scope: str | None = None
    """The key namespaced by tenant, agent and capability: commit it with the effect in your own transaction
    (see ``ReachAgent(committed=...)``)."""
    deadline: float | None = None
    """``time.monotonic()`` value by which the caller stops waiting (from ``X-Reach-Deadline``)."""
    hops: tuple[str, ...] = ()
    media: tuple[MediaPart, ...] = ()
    """The request's media parts (images, audio, files), as the ``media`` argument also gets them."""
    headers: Mapping[str, str] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    """The session's state (kept across calls of one ``session_id``, saved by the snapshot store)."""
    streaming: bool = False
    """Whether the caller streams this call (``/reach/stream``): a streaming handler's items reach it as they come;
    a unary caller gets them :func:`collected`, so a handler may skip the work only a stream shows."""

    def remaining(self) -> float | None:
        """Seconds left before the deadline, or ``None`` when the caller gave none."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    @property
    def summary(self) -> list[dict[str, Any]]:
        """A broadcast copy's view of the answers already in (``agent``, ``status``, ``answer``), first first.

        Empty unless the caller broadcast with ``share_summary=True``. A handler may skip or shorten its
        work when the answers so far settle the question (seed 004, section 6.2).
        """
        raw = self.headers.get("x-reach-summary")
        try:
            items = json.loads(raw) if raw else []
        except ValueError:
            return []
        return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


@dataclass(frozen=True, slots=True)
class Final:
    """The last item of a streaming handler that also answers unary calls: a unary call gets ``data`` alone,
    a stream gets every item, this one as the closing ``{"type": "reach.result", "data": data}``
    (:mod:`reach_plugins.wire.items`)."""

    data: Any


@dataclass(frozen=True, slots=True)
class WithMedia:
    """A handler's answer carrying media parts beside its JSON ``data``."""

    data: Any = None
    media: tuple[MediaPart, ...] = ()


def split_media(result: Any) -> tuple[Any, tuple[MediaPart, ...]]:
    """A handler's result as ``(data, media)``: a part or a non-empty list of parts is media alone."""
    if isinstance(result, WithMedia):
        return result.data, tuple(result.media)
    if isinstance(result, MediaPart):
        return None, (result,)
    if isinstance(result, list) and result and all(isinstance(item, MediaPart) for item in result):
        return None, tuple(result)
    return result, ()


def to_jsonable(value: Any) -> Any:
    """``json.dumps`` fallback for pydantic models and dataclasses a handler may return."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"a handler returned {type(value).__name__}, which is not JSON serialisable")


def dumps(value: Any) -> str:
    return json.dumps(value, default=to_jsonable, ensure_ascii=False, separators=(",", ":"))


class CapabilityHandler:
    """One capability and the function that serves it."""

    def __init__(self, capability: Capability, fn: Callable[..., Any]) -> None:
        self.capability = capability
        self.fn = fn
        self.signature = inspect.signature(fn)
        self.wants_ctx = "ctx" in self.signature.parameters
        self.wants_media = "media" in self.signature.parameters
        self.streaming = inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn)
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)
        schema = capability.params_schema
        if schema is not None:
            try:
                validator_for(schema).check_schema(schema)
            except SchemaError as exc:
                message = f"params_schema of {capability.name!r} is not a valid JSON Schema: {exc.message}"
                raise ConfigError(message) from None
        self._validator = validator_for(schema)(schema) if schema is not None else None
        limit = capability.max_concurrency
        self.seats = None if limit is None else ConcurrencyLimiter(limit, max_queue=limit * AGENT_QUEUE)
        """The declared ``max_concurrency``, enforced here: that many run, as many more wait, the rest are refused."""

    async def take_seat(self, remaining: float | None) -> bool:
        """One of the capability's seats, waiting in line at most :data:`SEAT_WAIT` (or ``remaining``, if sooner);
        False when the line is full or no seat frees up in time. Give it back with :meth:`leave_seat`."""
        seats = self.seats
        if seats is None or seats.try_acquire():
            return True
        try:
            async with asyncio.timeout(SEAT_WAIT if remaining is None else min(SEAT_WAIT, remaining)):
                await seats.acquire()
        except (RateLimited, TimeoutError):
            return False
        return True

    def leave_seat(self) -> None:
        if self.seats is not None:
            self.seats.release()

    def arguments(self, payload: Mapping[str, Any], ctx: ReachContext) -> dict[str, Any]:
        """The keyword arguments for one call; :class:`InvalidPayload` names what does not fit."""
        name = self.capability.name
        if self._validator is not None:
            error = next(iter(sorted(self._validator.iter_errors(payload), key=lambda e: list(e.path))), None)
            if error is not None:
                where = "/".join(str(part) for part in error.path) or "(root)"
                raise InvalidPayload(f"payload of {name!r} does not fit params_schema at {where}: {error.message}")
        kwargs = dict(payload)
        if self.wants_ctx:
            kwargs["ctx"] = ctx
        if self.wants_media:
            if "media" in payload:
                raise InvalidPayload(f"payload of {name!r} has a field 'media'; send media parts as media, not payload")
            kwargs["media"] = list(ctx.media)
        try:
            self.signature.bind(**kwargs)
        except TypeError as exc:
            takes = ", ".join(p for p in self.signature.parameters if p not in ("ctx", "media")) or "no fields"
            raise InvalidPayload(f"payload of {name!r} does not fit its handler ({exc}); it takes: {takes}") from None
        return kwargs

    async def call(self, kwargs: dict[str, Any]) -> Any:
        """The handler's result; a streaming handler's items are :func:`collected`, the parts among them its media."""
        if self.streaming:
            items = [item async for item in self.chunks(kwargs)]
            media = tuple(item for item in items if isinstance(item, MediaPart))
            if not media:
                return collected(items)
            rest = [item for item in items if not isinstance(item, MediaPart)]
            return WithMedia(collected(rest) if rest else None, media)
        if self._is_async:
            return await self.fn(**kwargs)
        return await anyio.to_thread.run_sync(lambda: self.fn(**kwargs))

    async def chunks(self, kwargs: dict[str, Any], *, streaming: bool = False) -> AsyncGenerator[Any, None]:
        """The handler's items, one per event (a plain handler yields its one result); ``streaming`` tells its
        ``ctx`` that a caller watches them."""
        if streaming and self.wants_ctx:
            kwargs = {**kwargs, "ctx": dataclasses.replace(kwargs["ctx"], streaming=True)}
        if not self.streaming:
            yield await self.call(kwargs)
            return
        if self._is_async:
            async for item in self.fn(**kwargs):
                yield _wire_item(item)
            return
        iterator: Iterator[Any] = await anyio.to_thread.run_sync(lambda: iter(self.fn(**kwargs)))
        while (item := await anyio.to_thread.run_sync(next, iterator, _DONE)) is not _DONE:
            yield _wire_item(item)


def _wire_item(item: Any) -> Any:
    """A stream item as sent: a :class:`Final` becomes the closing result event."""
    return result_item(item.data) if isinstance(item, Final) else item
