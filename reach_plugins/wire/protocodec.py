"""Between our records and the node's protobuf messages, both directions; shared by the transport and the node.

Payloads and data are JSON bytes (exact for integers, unlike ``Struct``);
media parts are ``Media`` messages whose bytes travel as they are.
Headers travel as gRPC metadata under their HTTP names, lowercased. A node
refuses a request with a gRPC status plus ``x-reach-error-type`` and
``x-reach-http-status`` trailers, so the caller gets the same error type and
status as from the HTTP gateway; backpressure is its own message type.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

from reach_plugins.errors import Backpressure, DeadlineExceeded, InvalidResponse, RemoteError, RequestError
from reach_plugins.media import MAX_MEDIA_BYTES, MAX_PARTS, MediaPart, check_size
from reach_plugins.model import ErrorInfo, ReachResponse
from reach_plugins.transport import Call, Reply
from reach_plugins.wire.body import WireBody, check_headers, parse_body
from reach_plugins.wire.headers import (
    HEADER_DEADLINE,
    HEADER_HOPS,
    HEADER_PREFER,
    HEADER_TARGET,
    HEADER_VIA,
    TARGET,
    VIA,
)
from reach_plugins.wire.media_stream import chunks
from reach_plugins.wire.proto import reach_pb2 as pb
from reach_plugins.wire.redact import without_addresses

_STATUS = {"success": pb.SUCCESS, "fail": pb.FAIL, "timeout": pb.TIMEOUT}
_STATUS_NAME = {value: key for key, value in _STATUS.items()}


_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str)
"""Made once: ``json.dumps`` with options builds a new encoder per call."""


def dumps(value: Any) -> bytes:
    return _ENCODER.encode(value).encode()


def loads(raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError):
        raise InvalidResponse(f"{what} is not JSON ({raw[:80]!r})") from None


def media_messages(parts: Iterable[MediaPart]) -> list[pb.Media]:
    return [
        pb.Media(media_type=part.media_type, data=part.data or b"", url=part.url or "", name=part.name or "")
        for part in parts
    ]


def media_parts(messages: Sequence[pb.Media], *, limit: int, capability: str) -> list[MediaPart]:
    """Media parts from their messages, refused with ``MediaTooLarge`` above ``limit`` bytes before being built;
    a malformed part is a ``RequestError`` naming its index."""
    if len(messages) > MAX_PARTS:
        raise RequestError(f"media: at most {MAX_PARTS} parts travel with one request or reply, got {len(messages)}")
    check_size(sum(len(message.data) for message in messages), limit, capability)
    parts = []
    for index, message in enumerate(messages):
        fields: dict[str, Any] = {"media_type": message.media_type, "name": message.name or None}
        fields.update({"url": message.url} if message.url else {"data": message.data})
        try:
            parts.append(MediaPart.model_validate(fields))
        except ValueError as exc:
            raise RequestError(f"media.{index}: {str(exc).splitlines()[-1].strip()}") from None
    return parts


def media_replies(part: MediaPart) -> Iterator[pb.StreamReply]:
    """A streamed part as messages: its start, its bytes in chunks of at most 64 KiB (raw), its end."""
    start = pb.MediaStart(media_type=part.media_type, name=part.name or "", size=part.size, url=part.url or "")
    yield pb.StreamReply(media_start=start)
    for chunk in chunks(part):
        yield pb.StreamReply(media_chunk=bytes(chunk))
    yield pb.StreamReply(media_end=True)


def start_of(message: pb.MediaStart) -> dict[str, Any]:
    """A ``MediaStart`` as the fields :meth:`~reach_plugins.wire.media_stream.MediaAssembler.start` reads."""
    fields: dict[str, Any] = {"media_type": message.media_type, "name": message.name or None}
    fields.update({"url": message.url} if message.url else {"size": message.size})
    return fields


# --------------------------------------------------------------------------- caller side


def call_message(call: Call) -> pb.ReachCall:
    """The request body for ``call``; ``deadline_ms`` is the attempt's budget, as the gRPC deadline."""
    request = call.request
    return pb.ReachCall(
        request_id=request.request_id,
        capability=request.capability,
        action=request.action or "",
        payload=dumps(request.payload),
        session_id=request.session_id or "",
        tenant=request.tenant or "",
        idempotency_key=request.idempotency_key or "",
        deadline_ms=max(1, int(call.timeout * 1000)),
        intent=request.intent or "",
        priority=pb.BATCH if request.priority == "batch" else pb.ONLINE,
        scope_tags=request.scope_tags,
        media=media_messages(request.media),
    )


def call_metadata(call: Call, token: str | None) -> tuple[tuple[str, str], ...]:
    """The core's headers as metadata, with the chain before this hop, the picked instance and the token."""
    metadata = {name.lower(): value for name, value in call.headers.items()}
    metadata[HEADER_DEADLINE.lower()] = str(max(1, int(call.timeout * 1000)))
    hops = call.request.hops
    if hops:
        metadata[HEADER_HOPS.lower()] = ",".join(str(hop) for hop in hops)
    else:
        metadata.pop(HEADER_HOPS.lower(), None)
    metadata[HEADER_PREFER.lower()] = f"{call.agent.name}/{call.instance.instance_id}"
    extra = call.request.metadata
    if TARGET in extra:
        metadata[HEADER_TARGET.lower()] = extra[TARGET]
    if VIA in extra:
        metadata[HEADER_VIA.lower()] = extra[VIA]
    if token:
        metadata["authorization"] = f"Bearer {token}"
    check_headers(metadata)
    return tuple(metadata.items())


def error_info(message: pb.Error) -> ErrorInfo:
    kind = message.type or RemoteError.code
    return ErrorInfo(type=kind, message=message.message, retry_after=message.retry_after or None)


def _reply_media(call: Call, result: pb.Result) -> tuple[MediaPart, ...]:
    limit = call.media_limit
    try:
        return tuple(media_parts(result.media, limit=limit, capability=call.request.capability))
    except RequestError as exc:
        raise InvalidResponse(f"the node's reply to request {result.request_id}: {exc.message}") from None


def reply_from_result(call: Call, result: pb.Result) -> Reply:
    """A node's routed outcome as the Reply of this attempt (``attempts`` = what the node tried)."""
    data = loads(result.data, f"the data of request {result.request_id}")
    common: dict[str, Any] = {
        "agent": result.agent or call.agent.name,
        "instance": result.instance or call.instance.instance_id,
        "attempts": max(1, result.attempts),
    }
    if result.status == pb.SUCCESS:
        return Reply(status="success", data=data, media=_reply_media(call, result), **common)
    error = error_info(result.error) if result.HasField("error") else ErrorInfo(type=RemoteError.code, message="failed")
    if result.status == pb.TIMEOUT and error.type == RemoteError.code:
        error = error.model_copy(update={"type": DeadlineExceeded.code})
    return Reply(status="fail", data=data, error=error, retry_after=error.retry_after, **common)


def backpressure_reply(message: pb.Backpressure) -> Reply:
    reason = message.reason or "the node's queue is full"
    error = ErrorInfo(type=Backpressure.code, message=reason, retry_after=message.retry_after or None)
    return Reply(status="fail", error=error, retry_after=error.retry_after)


def response_from_result(result: pb.Result) -> ReachResponse:
    return ReachResponse(
        request_id=result.request_id,
        status=_STATUS_NAME.get(result.status, "fail"),
        data=loads(result.data, f"the data of request {result.request_id}"),
        error=error_info(result.error) if result.HasField("error") else None,
        agent=result.agent or None,
        instance=result.instance or None,
        attempts=result.attempts,
        cost_ms=result.cost_ms,
        context_restore=result.context_restore,
        degraded=result.degraded,
        media=media_parts(result.media, limit=MAX_MEDIA_BYTES, capability=result.request_id),
    )


# --------------------------------------------------------------------------- node side


def body_from_message(message: pb.ReachCall, payload: Any) -> WireBody:
    """The gateway's wire body for a gRPC request (``payload`` already decoded), checked by the same rules."""
    raw: dict[str, Any] = {"capability": message.capability, "payload": payload}
    optional = {
        "request_id": message.request_id,
        "action": message.action,
        "session_id": message.session_id,
        "tenant": message.tenant,
        "idempotency_key": message.idempotency_key,
        "intent": message.intent,
    }
    raw.update({key: value for key, value in optional.items() if value})
    if message.deadline_ms:
        raw["deadline_ms"] = message.deadline_ms
    if message.priority == pb.BATCH:
        raw["priority"] = "batch"
    if message.scope_tags:
        raw["scope_tags"] = list(message.scope_tags)
    return parse_body(raw)


def result_message(response: ReachResponse) -> pb.Result:
    result = pb.Result(
        request_id=response.request_id,
        status=_STATUS.get(response.status, pb.FAIL),
        data=dumps(response.data),
        agent=response.agent or "",
        instance=response.instance or "",
        attempts=response.attempts,
        cost_ms=response.cost_ms,
        context_restore=response.context_restore,
        degraded=response.degraded,
        media=media_messages(response.media),
    )
    if response.error is not None:
        result.error.CopyFrom(error_message(response.error))
    return result


def error_message(error: ErrorInfo) -> pb.Error:
    """An error as the node sends it to its callers: without the addresses of backends or agents."""
    return pb.Error(type=error.type, message=without_addresses(error.message), retry_after=error.retry_after or 0.0)


def metadata_lookup(metadata: Iterable[tuple[str, str | bytes]] | None) -> dict[str, str]:
    """Invocation metadata as a lowercase-keyed dict (binary ``-bin`` entries are skipped)."""
    return {key.lower(): value for key, value in metadata or () if isinstance(value, str)}
