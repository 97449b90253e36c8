"""Media parts in a streamed reply: sent in chunks, reassembled within the capability's limit (sans-IO).

A part travels as a start (``media_type``, ``name``, and ``size`` in bytes or
an http(s) ``url``), then chunks of at most :data:`CHUNK_BYTES` raw bytes each,
then an end marker. Over SSE (``/reach/stream``, the gateway's
``/v1/reach/stream``)::

    event: media          data: {"media_type": "image/png", "name": "a.png", "size": 1000000}
    event: media.chunk    data: <base64 of at most 64 KiB>
    event: media.end      data:

over gRPC, the ``StreamReply`` kinds ``media_start`` / ``media_chunk`` (raw
bytes) / ``media_end``. A URL part has a start and an end, no chunk.

:class:`MediaAssembler` reads that sequence on the receiving side. The size a
start announces is checked against the reply's limit (every part of one stream
counts toward it, as every part of one reply does) before a chunk is taken, and
a chunk past the announced size is refused as it arrives: what it holds never
exceeds the limit. It writes chunks into one growing buffer whose bytes become
the part without a copy, so a part is held once and no chunk is kept.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any, Final

from pydantic import ValidationError

from reach_plugins.errors import InvalidResponse
from reach_plugins.media import MAX_PARTS, MediaPart, check_size
from reach_plugins.wire.sse import encode_sse

CHUNK_BYTES: Final = 64 << 10
"""The most raw bytes one chunk of a streamed part carries (64 KiB)."""
MEDIA_EVENT: Final = "media"
CHUNK_EVENT: Final = "media.chunk"
END_EVENT: Final = "media.end"
MEDIA_EVENTS: Final = frozenset({MEDIA_EVENT, CHUNK_EVENT, END_EVENT})
"""The SSE event names of a part's start, chunks and end."""


def start_fields(part: MediaPart) -> dict[str, Any]:
    """What a part's start announces: its type, name, and ``size`` (bytes to follow) or ``url``."""
    fields: dict[str, Any] = {"media_type": part.media_type}
    if part.name is not None:
        fields["name"] = part.name
    if part.url is not None:
        fields["url"] = part.url
    else:
        fields["size"] = part.size
    return fields


def chunks(part: MediaPart) -> Iterator[memoryview]:
    """The part's bytes in slices of at most :data:`CHUNK_BYTES`, views of its data (nothing copied)."""
    data = memoryview(part.data or b"")
    for offset in range(0, len(data), CHUNK_BYTES):
        yield data[offset : offset + CHUNK_BYTES]


def sse_frames(part: MediaPart) -> Iterator[bytes]:
    """The SSE frames of one part: its start (JSON), its chunks (base64), its end."""
    yield encode_sse(json.dumps(start_fields(part), ensure_ascii=False, separators=(",", ":")), MEDIA_EVENT)
    for chunk in chunks(part):
        yield encode_sse(base64.b64encode(chunk).decode("ascii"), CHUNK_EVENT)
    yield encode_sse("", END_EVENT)


class MediaAssembler:
    """Reassembles a stream's media parts, one at a time, within ``limit`` bytes for the whole stream.

    ``start`` / ``add`` / ``end`` follow the wire; a move out of order (a chunk
    without a start, a start inside a part, an end short of the announced size)
    is an :class:`InvalidResponse`, more bytes than the limit a
    :class:`~reach_plugins.errors.MediaTooLarge` saying to raise ``max_media_bytes``.
    """

    def __init__(self, *, limit: int, capability: str) -> None:
        self.limit = limit
        self.capability = capability
        self.total = 0
        """Bytes of every part taken so far, the open one included."""
        self.parts = 0
        self._head: MediaPart | None = None
        self._size = 0
        self._buffer: io.BytesIO | None = None

    @property
    def open(self) -> bool:
        """A part has started and not ended (a stream must not end, or carry data, now)."""
        return self._head is not None

    @property
    def held(self) -> int:
        """Bytes of the open part received so far."""
        return 0 if self._buffer is None else self._buffer.tell()

    def start(self, fields: Any) -> None:
        """A part starts: ``fields`` as :func:`start_fields` wrote them; its size is checked before any chunk."""
        if self._head is not None:
            raise InvalidResponse("a media part started inside another one")
        if not isinstance(fields, dict):
            raise InvalidResponse("a media start is a JSON object with 'media_type' and 'size' or 'url'")
        size, url = fields.get("size"), fields.get("url")
        if not ((url is not None and size is None) or (url is None and type(size) is int and size >= 0)):
            raise InvalidResponse("a media start carries exactly one of 'size' (bytes, >= 0) and 'url'")
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise InvalidResponse(f"a stream carries at most {MAX_PARTS} media parts")
        source = {"url": url} if url is not None else {"data": b""}
        try:
            head = MediaPart(media_type=fields.get("media_type"), name=fields.get("name"), **source)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'part'}: {e['msg']}" for e in exc.errors())
            raise InvalidResponse(f"a media start is malformed: {problems}") from None
        if size:
            check_size(self.total + size, self.limit, self.capability)
            self._buffer = io.BytesIO()
        self._head, self._size = head, size or 0
        self.total += self._size

    def add(self, chunk: bytes | memoryview) -> None:
        """One chunk of the open part, refused when it would pass the size its start announced."""
        if self._head is None:
            raise InvalidResponse("a media chunk came without a media start")
        if len(chunk) > CHUNK_BYTES:
            raise InvalidResponse(f"a media chunk carries {len(chunk)} bytes, more than {CHUNK_BYTES}")
        if self._buffer is None or self.held + len(chunk) > self._size:
            raise InvalidResponse(f"a media part sent more than the {self._size} bytes its start announced")
        self._buffer.write(chunk)

    def feed_sse(self, event: str, data: str) -> MediaPart | None:
        """One SSE event of :data:`MEDIA_EVENTS` (start JSON, base64 chunk, end): the part when it ends."""
        if event == END_EVENT:
            return self.end()
        if event == CHUNK_EVENT:
            if len(data) > (CHUNK_BYTES + 2) // 3 * 4:
                raise InvalidResponse(f"a media chunk carries more than {CHUNK_BYTES} bytes")
            try:
                self.add(base64.b64decode(data, validate=True))
            except ValueError:
                raise InvalidResponse("a media chunk is not base64 text (RFC 4648, with padding)") from None
            return None
        try:
            fields = json.loads(data)
        except ValueError:
            raise InvalidResponse(f"a media start is not JSON ({data[:80]!r})") from None
        self.start(fields)
        return None

    def end(self) -> MediaPart:
        """The open part ends: the part, its bytes exactly the announced size."""
        head, buffer = self._head, self._buffer
        if head is None:
            raise InvalidResponse("a media end came without a media start")
        if self.held != self._size:
            raise InvalidResponse(f"a media part ended after {self.held} of the {self._size} bytes it announced")
        self._head, self._buffer = None, None
        if buffer is None:
            return head
        return head.model_copy(update={"data": buffer.getvalue()})  # the buffer's own bytes: no copy
