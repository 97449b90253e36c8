"""The wire of the gateway and the node: the reach body, and refusals as bodies (their statuses are the errors').

The body is DESIGN.md section 4's (``request_id``, ``capability``, ``action``,
``payload``, ``session_id``, ``tenant``, ``idempotency_key``, ``deadline_ms``)
plus ``media`` (binary parts, base64 in JSON: :mod:`reach_plugins.media`) and three routing fields an agent never
needs: ``intent``, ``priority`` and
``scope_tags``. Unknown fields are refused so a typo fails loudly. The headers
are the agent protocol's, plus routing hints between hops: ``X-Reach-Prefer``
/ ``X-Reach-Target`` (the instance the caller picked, softly or strictly) and
``X-Reach-Via`` (the nodes a request was forwarded through).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reach_plugins.errors import Backpressure, DeadlineExceeded, ReachError, RequestError, from_wire
from reach_plugins.ids import new_request_id
from reach_plugins.media import MAX_PARTS, MediaPart
from reach_plugins.model import ErrorInfo, HeaderText, Hop, Priority, ReachRequest, ReachResponse
from reach_plugins.policy.loopguard import parse_hops_header
from reach_plugins.wire.headers import (
    HEADER_DEADLINE,
    HEADER_HOPS,
    HEADER_IDEMPOTENCY_KEY,
    HEADER_PREFER,
    HEADER_RETRY,
    HEADER_SAFE,
    HEADER_SOURCE,
    HEADER_SUMMARY,
    HEADER_TARGET,
    HEADER_VIA,
    META_SUMMARY,
    PREFER,
    RETRY_UPSTREAM,
    SOURCE,
    SUMMARY_BYTES,
    TARGET,
    UNKNOWN_SOURCE,
    VIA,
)
from reach_plugins.wire.redact import without_addresses

REFUSED: Final = "refused"
"""Body field of a hop's refusal: true when no agent saw the request (the client raises the error)."""
MAX_REPLY: Final = 16 << 20
"""Largest whole reply a transport accepts from an agent or a hop, in bytes (16 MiB)."""
MAX_DEADLINE_MS: Final = 86_400_000


class WireBody(BaseModel):
    """A reach request as it arrives at a gateway or a node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: str | None = Field(default=None, min_length=1, max_length=128)
    capability: str = Field(min_length=1, max_length=200)
    action: str | None = Field(default=None, max_length=200)
    payload: dict[str, Any] | None = None
    session_id: HeaderText | None = Field(default=None, max_length=256)
    tenant: str | None = Field(default=None, max_length=128, pattern=HEADER_SAFE)
    idempotency_key: str | None = Field(default=None, max_length=256, pattern=HEADER_SAFE)
    deadline_ms: int | None = Field(default=None, ge=0, le=MAX_DEADLINE_MS)
    intent: HeaderText | None = Field(default=None, max_length=200)
    priority: Priority = "online"
    scope_tags: list[str] = Field(default_factory=list, max_length=32)
    media: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_PARTS)
    """Media parts in their JSON form, kept undecoded until their size is checked (``parts_from_wire``)."""


def invalid(exc: ValidationError, what: str = "request body") -> RequestError:
    """A pydantic failure as a ``RequestError`` naming every field at fault (never the value sent)."""
    problems = "; ".join(
        f"{'.'.join(str(part) for part in error['loc'])[:100] or 'body'}: {error['msg']}" for error in exc.errors()
    )
    return RequestError(f"invalid {what}: {problems}")


def parse_body(raw: Any) -> WireBody:
    """Validate a decoded JSON body; a ``RequestError`` names every field at fault."""
    if not isinstance(raw, dict):
        raise RequestError(f"the body must be a JSON object with at least 'capability', got {type(raw).__name__}")
    try:
        return WireBody.model_validate(raw)
    except ValidationError as exc:
        raise invalid(exc) from None


def _deadline_ms(header: str | None, default: int | None) -> int | None:
    """``X-Reach-Deadline`` as milliseconds (``default`` without it); digits only, so ``nan``, ``-5``, ``1e3`` or
    ``²`` are a RequestError naming the header, never a deadline."""
    if header is None:
        return default
    text = header.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 9) or int(text) > MAX_DEADLINE_MS:
        raise RequestError(
            f"{HEADER_DEADLINE} must be the remaining budget in milliseconds, digits 0-9 (0..{MAX_DEADLINE_MS})"
        )
    return int(text)


def _hops(header: str | None) -> list[Hop]:
    try:
        return parse_hops_header(header)
    except ValueError as exc:
        raise RequestError(f"{HEADER_HOPS}: {exc}") from None


def _pin(value: str | None, header: str) -> str | None:
    if value is None:
        return None
    agent, slash, instance = value.strip().partition("/")
    if not slash or not agent or not instance:
        raise RequestError(f"{header} names an instance as 'agent/instance_id'")
    return f"{agent}/{instance}"


def to_request(
    body: WireBody,
    header: Callable[[str], str | None],
    *,
    tenant: str | None,
    source: str | None,
    media: list[MediaPart],
) -> ReachRequest:
    """The :class:`ReachRequest` a server runs: the body, completed by headers (headers win), for ``tenant``,
    carrying ``media`` (the body's parts, decoded once their size was checked).

    ``header(name)`` looks a header up case-insensitively. A remaining budget
    of 0 ms means the caller has already given up: ``DeadlineExceeded``.
    """
    deadline_ms = _deadline_ms(header(HEADER_DEADLINE), body.deadline_ms)
    if deadline_ms == 0:
        raise DeadlineExceeded("the caller's deadline had passed on arrival; nothing was sent")
    metadata: dict[str, str] = {}
    for key, name in ((PREFER, HEADER_PREFER), (TARGET, HEADER_TARGET)):
        pin = _pin(header(name), name)
        if pin is not None:
            metadata[key] = pin
    via = header(HEADER_VIA)
    if via:
        metadata[VIA] = via
    summary = header(HEADER_SUMMARY)
    if summary:
        metadata[META_SUMMARY] = summary[:SUMMARY_BYTES]
    carried = [address.strip() for address in (header(HEADER_SOURCE) or "").split(",") if address.strip()]
    # servers append what they saw, so the last entries are observed ones; a caller's own only restrict it
    metadata[SOURCE] = ",".join([*carried[-16:], source or UNKNOWN_SOURCE])
    try:
        return _request(body, header, tenant=tenant, deadline_ms=deadline_ms, metadata=metadata, media=media)
    except ValidationError as exc:
        raise invalid(exc, "request headers") from None


def _request(
    body: WireBody,
    header: Callable[[str], str | None],
    *,
    tenant: str | None,
    deadline_ms: int | None,
    metadata: dict[str, str],
    media: list[MediaPart],
) -> ReachRequest:
    return ReachRequest(
        request_id=body.request_id or new_request_id(),
        capability=body.capability,
        action=body.action,
        payload=body.payload or {},
        session_id=body.session_id,
        tenant=tenant,
        intent=body.intent,
        idempotency_key=header(HEADER_IDEMPOTENCY_KEY) or body.idempotency_key,
        timeout_ms=deadline_ms,
        hops=_hops(header(HEADER_HOPS)),
        priority=body.priority,
        scope_tags=body.scope_tags,
        retried_upstream=(header(HEADER_RETRY) or "").strip().lower() == RETRY_UPSTREAM,
        metadata=metadata,
        media=media,
    )


def response_body(response: ReachResponse) -> dict[str, Any]:
    """A routed outcome on the wire: the agent reply's fields plus who served it, how many tries, how long."""
    body = {
        "request_id": response.request_id,
        "status": response.status,
        "data": response.data,
        "error": _error_info(response.error) if response.error else None,
        "agent": response.agent,
        "instance": response.instance,
        "attempts": response.attempts,
        "cost_ms": round(response.cost_ms, 3),
        "context_restore": response.context_restore,
        "degraded": response.degraded,
    }
    if response.media:
        body["media"] = [part.to_wire() for part in response.media]
    return body


def _error_info(error: ErrorInfo) -> dict[str, Any]:
    """An agent's or an attempt's error for the caller: the message without the addresses of backends or agents."""
    return {**error.model_dump(exclude_none=True), "message": without_addresses(error.message)}


def error_body(exc: ReachError, request_id: str | None = None) -> dict[str, Any]:
    """A refusal on the wire, shaped like a failed agent reply and marked ``refused``: no agent saw it.

    It is sent with the error's own ``exc.http_status`` (a class attribute, like its code).

        Backpressure is not marked: it asks the caller to come back (the core retries or fails over).

        ``error.type`` is the error's own code (:data:`reach_plugins.errors.WIRE_CODES`), so the client
        raises the same class as when it refuses a request itself (:func:`raise_refusal`).
    """
    error: dict[str, Any] = {"type": exc.error_type, "message": without_addresses(exc.message)}
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        error["retry_after"] = retry_after
    body: dict[str, Any] = {"request_id": request_id, "status": "fail", "data": None, "error": error}
    if not isinstance(exc, Backpressure):
        body[REFUSED] = True
    return body


def refusal(kind: str, message: str, retry_after: float | None = None) -> ReachError:
    """The error a hop's refusal names, marked ``refused`` so the client's core raises it as it is.

    A ``retry_after`` that is not a finite number of seconds >= 0 (a hostile or broken hop's nan, inf or -1)
    is dropped: a caller sleeping on it, or a gateway writing it as ``Retry-After``, would fail.
    """
    if retry_after is not None and not (math.isfinite(retry_after) and retry_after >= 0):
        retry_after = None
    error = from_wire(ErrorInfo(type=kind, message=message, retry_after=retry_after))
    error.refused = True
    return error


def check_headers(headers: Mapping[str, str]) -> None:
    """Refuse header values that cannot travel (non-ASCII or control characters) with a RequestError naming them."""
    for name, value in headers.items():
        if not (value.isascii() and value.isprintable()):
            raise RequestError(
                f"header {name} cannot carry {value!r}: header values are printable ASCII; "
                "use an ASCII idempotency key, tenant and session id"
            )


def check_deadline(headers: Mapping[str, str]) -> None:
    """Refuse an ``X-Reach-Deadline`` that is not a number of milliseconds (``headers`` with lowercase names)."""
    _deadline_ms(headers.get(HEADER_DEADLINE.lower()), None)


def header_lookup(headers: Mapping[str, str]) -> Callable[[str], str | None]:
    """A case-insensitive lookup over headers whose names may be in any case."""
    lowered = {name.lower(): value for name, value in headers.items()}
    return lambda name: lowered.get(name.lower())
