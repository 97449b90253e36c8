"""What every protocol adapter shares: plain HTTP records, status mapping, reply checks.

An adapter turns a :class:`~reach_plugins.transport.Call` into one
:class:`HttpRequest` and one :class:`HttpResponse` back into a
:class:`~reach_plugins.transport.Reply`. It never does I/O, so any wire engine
(aiohttp, httpx, a gateway) can drive it and tests need no server.
"""

from __future__ import annotations

import email.utils
import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from reach_plugins.errors import WIRE_CODES, InvalidResponse, RequestError
from reach_plugins.media import MediaPart, parts_from_wire
from reach_plugins.model import ErrorInfo
from reach_plugins.policy.validation import compiled
from reach_plugins.transport import Call, Reply, StreamEvent
from reach_plugins.wire.sse import SseEvent

log = logging.getLogger("reach_plugins.protocols")

TRANSIENT_STATUSES = frozenset({408, 429})
TEXT_FIELDS = ("input", "query", "message", "prompt", "question", "text")
"""Payload fields read as the user's text by chat-style protocols, first found wins."""


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One downstream HTTP request, as plain data."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None = None
    params: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """One downstream HTTP response; ``headers`` lookups should be case-insensitive."""

    status: int
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class Pending:
    """Work the agent accepted and has not finished (an A2A task answered at once): how to ask again, how to stop.

    The transport sends ``poll`` until the answer is no longer pending or the
    attempt's time is up, and sends ``stop`` when the caller gives up on it
    (deadline, cancellation, the client closing), so the work does not run on.
    """

    poll: HttpRequest
    stop: HttpRequest


class StreamDecoder(Protocol):
    """Turns the SSE events of one stream into normalised stream events."""

    def feed(self, event: SseEvent) -> list[StreamEvent]: ...

    def close(self) -> list[StreamEvent]:
        """The connection ended: the final events (``end`` if the stream was complete, else ``error``)."""
        ...

    def abandoned(self, opened: HttpRequest) -> HttpRequest | None:
        """The caller left before the end: a request that stops the far side's work (given the one that opened
        the stream), or ``None``."""
        ...


def decoded(decoder: StreamDecoder, frames: Iterable[SseEvent], *, closing: bool) -> Iterator[StreamEvent]:
    """The events of ``frames`` one by one (then the final ones when the connection ``closing`` ended): events
    decoded before a bad frame are passed on before its error is raised."""
    for frame in frames:
        yield from decoder.feed(frame)
    if closing:
        yield from decoder.close()


class Exchange(Protocol):
    """One call whose answer is an event stream to read, talk back to and reconnect to (MCP's Streamable HTTP):
    the transport feeds it the events until it is done, sends what it asks, and reconnects where it says."""

    def feed(self, event: SseEvent) -> list[HttpRequest]:
        """Read one event; return the requests to send now (answers to what the server asked)."""
        ...

    def done(self) -> bool:
        """The answer has arrived (or the exchange gave up waiting for it)."""
        ...

    def listen(self) -> HttpRequest | None:
        """A stream to read beside the answer's for what the server asks meanwhile (MCP's GET stream), or ``None``."""
        ...

    def progress(self) -> list[StreamEvent]:
        """Stream events learnt since the last call (progress notifications), for a caller that streams."""
        ...

    def resume(self, retry: float | None) -> tuple[HttpRequest, float] | None:
        """The stream ended before the answer: the request that resumes it and after how many seconds (``retry``:
        what the stream's ``retry:`` field said), or ``None``."""
        ...

    def whole(self, response: HttpResponse) -> None:
        """The answer came as one body (JSON, or a refusal), not as a stream."""
        ...

    def response(self) -> HttpResponse:
        """The answer as a plain response, for :meth:`Adapter.parse`."""
        ...


class Adapter(Protocol):
    """Builds requests for, and normalises replies of, agents speaking one protocol."""

    protocol: str

    def discovery(self, call: Call) -> HttpRequest | None:
        """A request to run once per endpoint before the first call (an agent card), or ``None``."""
        ...

    def discovered(self, call: Call, response: HttpResponse) -> Any:
        """What the discovery response teaches (cached per endpoint, passed back to ``build``)."""
        ...

    def handshake(self, call: Call) -> HttpRequest | None:
        """The next request this call's conversation needs answered first (an MCP session's opening), or ``None``.

        The transport sends it, hands the answer to :meth:`handshaken` and asks again until ``None``.
        """
        ...

    def handshaken(self, call: Call, response: HttpResponse) -> None:
        """Learn from the answer to a :meth:`handshake` request (raise a ReachError when it failed)."""
        ...

    def farewell(self, conversation: tuple[str | None, str] | None) -> list[HttpRequest]:
        """Requests ending what the far side keeps for a conversation (tenant, session id), or for every one when
        ``None`` (the transport is closing): MCP's DELETE of its sessions."""
        ...

    def renegotiate(self, call: Call, response: HttpResponse) -> bool:
        """Whether ``response`` refused the call in a way a new handshake fixes (an MCP server's OAuth challenge):
        the transport then runs :meth:`handshake` again and resends the call, once."""
        ...

    def build(self, call: Call, *, stream: bool = False, discovered: Any = None) -> HttpRequest: ...

    def pending(self, call: Call, sent: HttpRequest, response: HttpResponse) -> Pending | None:
        """The unfinished work ``response`` (to ``sent``) announces, or ``None`` when it is the answer to parse."""
        ...

    def exchange(self, call: Call) -> Exchange | None:
        """An :class:`Exchange` reading this call's answer when it comes as an event stream, or ``None`` (the body is
        read whole)."""
        ...

    def parse(self, call: Call, response: HttpResponse) -> Reply: ...

    def decoder(self, call: Call) -> StreamDecoder | None:
        """A decoder for the protocol's native stream, or ``None`` (a stream is then the one reply)."""
        ...


def payload_text(payload: Mapping[str, Any]) -> str | None:
    """The user's text in a payload: the first :data:`TEXT_FIELDS` string, or the last user message."""
    text = next((payload[name] for name in TEXT_FIELDS if isinstance(payload.get(name), str)), None)
    messages = payload.get("messages")
    if text is None and isinstance(messages, list):
        users = [m.get("content") for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
        text = next((content for content in reversed(users) if isinstance(content, str)), None)
    return text


def mapping_at(container: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``container[key]`` when it is an object, else an empty one (replies are untrusted)."""
    value = container.get(key)
    return value if isinstance(value, Mapping) else {}


def list_at(container: Mapping[str, Any], key: str) -> list[Any]:
    """``container[key]`` when it is a list, else an empty one."""
    value = container.get(key)
    return value if isinstance(value, list) else []


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
"""For what orjson refuses (integers past 64 bits): ``json.dumps`` with options builds a new encoder per call."""
_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS
_DECODER = json.JSONDecoder()
"""Replies stay with the stdlib: orjson turns integers past 64 bits into floats and refuses lone surrogates."""


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON; orjson (about 20x the stdlib's speed on a call body), the stdlib for what orjson refuses."""
    try:
        return orjson.dumps(value, option=_ORJSON_OPTIONS)
    except TypeError:
        return _ENCODER.encode(value).encode()


def endpoint_url(call: Call, path: str) -> str:
    """``path`` under the instance's endpoint; an absolute URL is kept as is."""
    if path.startswith(("http://", "https://")):
        return path
    return call.instance.endpoint.rstrip("/") + "/" + path.lstrip("/")


def reach_headers(call: Call, *, accept: str = "application/json") -> dict[str, str]:
    """The core's propagation headers, completed from the request when the core did not set them."""
    given = call.headers
    headers = {"Content-Type": "application/json", "Accept": accept}
    if given:
        headers.update(given)
    request = call.request
    fallback: list[tuple[str, str]] = []
    if "X-Reach-Deadline" not in given:
        fallback.append(("X-Reach-Deadline", str(max(0, int(call.timeout * 1000)))))
    if request.idempotency_key and "Idempotency-Key" not in given:
        fallback.append(("Idempotency-Key", request.idempotency_key))
    if request.tenant and "X-Tenant" not in given:
        fallback.append(("X-Tenant", request.tenant))
    if request.hops and "X-Reach-Hops" not in given:
        fallback.append(("X-Reach-Hops", ",".join(str(hop) for hop in request.hops)))
    if fallback:
        present = {name.lower() for name in given}
        for name, value in fallback:
            if name.lower() not in present:
                headers[name] = value
    return headers


def invalid(call: Call, message: str) -> InvalidResponse:
    """Log a bad reply (it is never passed upstream as data) and return the error to raise."""
    text = f"agent {call.agent.name!r} ({call.instance.instance_id}) answered {call.request.capability!r}: {message}"
    log.warning("invalid response: %s", text)
    return InvalidResponse(text, agent=call.agent.name, instance=call.instance.instance_id)


def decode_json(call: Call, body: bytes) -> Any:
    """The JSON value of a reply body (UTF-8, as RFC 8259 requires: no encoding sniffing per reply)."""
    try:
        return _DECODER.decode(body.decode())
    except (ValueError, UnicodeDecodeError):
        snippet = body[:80].decode(errors="replace")
        raise invalid(call, f"the body is not JSON ({snippet!r})") from None


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` header: delta-seconds or an HTTP date."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def header(headers: Mapping[str, str], name: str) -> str | None:
    return headers.get(name) or headers.get(name.lower())


def success(call: Call, data: Any, status_code: int = 200, media: Sequence[MediaPart] = ()) -> Reply:
    """A success reply, after checking ``data`` against the capability's ``return_schema``."""
    check_return(call, data)
    return Reply(
        status="success",
        data=data,
        status_code=status_code,
        agent=call.agent.name,
        instance=call.instance.instance_id,
        media=tuple(media),
    )


def reply_media(call: Call, raw: Any) -> tuple[MediaPart, ...]:
    """The media parts of a JSON reply (``media``: base64 parts), within the capability's ``max_media_bytes``;
    a reply whose parts are malformed or too large is an :class:`InvalidResponse`."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise invalid(call, "'media' must be a list of parts")
    limit = call.media_limit
    try:
        return tuple(parts_from_wire(raw, limit=limit, capability=call.request.capability))
    except RequestError as exc:
        raise invalid(call, exc.message) from None


def failure(call: Call, error: ErrorInfo, status_code: int = 200, retry_after: float | None = None) -> Reply:
    return Reply(
        status="fail",
        error=error,
        status_code=status_code,
        retry_after=retry_after,
        agent=call.agent.name,
        instance=call.instance.instance_id,
    )


def error_info(raw: Any, default_type: str, fallback: str) -> ErrorInfo:
    """An :class:`ErrorInfo` from a body's ``error`` object; unknown types fall back to ``default_type``."""
    if isinstance(raw, Mapping):
        kind = raw.get("type")
        message = raw.get("message")
        return ErrorInfo(
            type=kind if isinstance(kind, str) and kind in WIRE_CODES else default_type,
            message=str(message) if message else fallback,
        )
    if isinstance(raw, str) and raw:
        return ErrorInfo(type=default_type, message=raw)
    return ErrorInfo(type=default_type, message=fallback)


def http_failure(call: Call, response: HttpResponse) -> Reply:
    """A non-2xx answer: 408/429/5xx are transient, other codes business, unless the body names a type."""
    status = response.status
    default = "transient" if status in TRANSIENT_STATUSES or status >= 500 else "business"
    retry_after = parse_retry_after(header(response.headers, "Retry-After"))
    try:
        body = json.loads(response.body) if response.body else None
    except (ValueError, UnicodeDecodeError):
        body = None
    raw = body.get("error") if isinstance(body, dict) else None
    info = error_info(raw, default, f"HTTP {status} from instance {call.instance.instance_id}")
    if retry_after is not None:
        info = info.model_copy(update={"retry_after": retry_after})
    return failure(call, info, status_code=status, retry_after=retry_after)


def check_return(call: Call, data: Any) -> None:
    """Raise :class:`InvalidResponse` when ``data`` breaks the capability's ``return_schema``."""
    capability = call.capability or call.agent.capability(call.request.capability)
    if capability is None or capability.return_schema is None:
        return
    validator = compiled(capability.return_schema, "return_schema")
    if validator.is_valid(data):
        return
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "/".join(str(part) for part in first.path) or "(root)"
        raise invalid(call, f"the reply does not fit return_schema at {where}: {first.message}")


class NoHandshake:
    """For protocols whose conversations need no opening exchange (everything but MCP's sessions).

    Their answers are final too, unless the adapter says otherwise (A2A's tasks answered at once).
    """

    def handshake(self, call: Call) -> HttpRequest | None:
        return None

    def handshaken(self, call: Call, response: HttpResponse) -> None:
        return None

    def pending(self, call: Call, sent: HttpRequest, response: HttpResponse) -> Pending | None:
        return None

    def renegotiate(self, call: Call, response: HttpResponse) -> bool:
        return False

    def farewell(self, conversation: tuple[str | None, str] | None) -> list[HttpRequest]:
        return []

    def exchange(self, call: Call) -> Exchange | None:
        return None


class NoDiscovery(NoHandshake):
    """For protocols that learn nothing before their first call (everything but A2A's agent card)."""

    def discovery(self, call: Call) -> HttpRequest | None:
        return None

    def discovered(self, call: Call, response: HttpResponse) -> Any:
        return None


class EndsOnce:
    """What every stream decoder shares: it ends once, and a stream cut before its end is a transient error."""

    def __init__(self, call: Call) -> None:
        self._call = call
        self._done = False

    def _finish(self, event: StreamEvent) -> list[StreamEvent]:
        self._done = True
        return [event]

    def _cut(self) -> str:
        """How the stream was cut short, for the error event that ``close`` sends."""
        return f"the stream from instance {self._call.instance.instance_id} ended before 'end'"

    def _on_close(self) -> StreamEvent:
        return StreamEvent("error", error=ErrorInfo(type="transient", message=self._cut()))

    def close(self) -> list[StreamEvent]:
        if self._done:
            return []
        return self._finish(self._on_close())

    def abandoned(self, opened: HttpRequest) -> HttpRequest | None:
        return None
