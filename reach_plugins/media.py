"""Media parts: images, audio and other binary content carried beside a request's or reply's JSON (seed 000).

A :class:`MediaPart` holds either the bytes themselves (``data``) or an
``http(s)`` URL where they live, with a ``media_type`` (``image/png``) and an
optional ``name``. On an HTTP wire a part is a JSON object whose ``data`` is
base64 text (:meth:`MediaPart.to_wire`); over gRPC it is a ``bytes`` field.
Whoever reads parts from a wire checks their size against the capability's
``max_media_bytes`` from the base64 text's length, before decoding a byte of
it (:func:`parts_from_wire`), and refuses with :class:`MediaTooLarge`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any, Final
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from reach_plugins.errors import MediaTooLarge, RequestError

MAX_MEDIA_BYTES: Final = 8 << 20
"""Largest total of media bytes a reply carries when its capability is unknown, and the node's gRPC bound (8 MiB);
a capability takes media only when it declares ``max_media_bytes`` (0 by default, so every body stays 1 MiB)."""
MAX_PARTS: Final = 64
"""The most media parts one request or reply carries."""
MEDIA_TYPE: Final = r"^[a-z0-9][a-z0-9!#$&^_.+\-]*/[a-z0-9][a-z0-9!#$&^_.+\-]*$"
"""``type/subtype`` in lowercase, without parameters (RFC 6838 names)."""


class MediaPart(BaseModel):
    """One piece of binary content: ``data`` (the bytes) or ``url`` (``http(s)``, where to fetch them)."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_bytes="base64", val_json_bytes="base64")

    media_type: str = Field(pattern=MEDIA_TYPE, max_length=127)
    data: bytes | None = None
    url: str | None = Field(default=None, max_length=2048)
    name: str | None = Field(default=None, max_length=256)

    @field_validator("url")
    @classmethod
    def _web_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
            raise ValueError("a media url is http:// or https:// with a host and no user:password@")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> MediaPart:
        if (self.data is None) == (self.url is None):
            raise ValueError("a media part carries exactly one of 'data' (bytes) and 'url'")
        return self

    @property
    def size(self) -> int:
        """Bytes carried inline (a URL part carries none)."""
        return 0 if self.data is None else len(self.data)

    def to_wire(self) -> dict[str, Any]:
        """The part as JSON: ``data`` as base64 text; absent fields left out."""
        wire: dict[str, Any] = {"media_type": self.media_type}
        if self.data is not None:
            wire["data"] = base64.b64encode(self.data).decode("ascii")
        if self.url is not None:
            wire["url"] = self.url
        if self.name is not None:
            wire["name"] = self.name
        return wire

    def data_url(self) -> str:
        """The part as a URL: its own ``url``, else a ``data:`` URL (OpenAI's ``image_url``)."""
        if self.url is not None:
            return self.url
        return f"data:{self.media_type};base64,{base64.b64encode(self.data or b'').decode('ascii')}"


def digests(parts: Iterable[MediaPart]) -> list[str]:
    """One SHA-256 per part, over its type, name and bytes or URL: what an idempotency key's fingerprint includes,
    so the same key with other media is a conflict, never a replay."""
    found = []
    for part in parts:
        digest = hashlib.sha256(f"{part.media_type}\0{part.name or ''}\0{part.url or ''}\0".encode())
        digest.update(part.data or b"")
        found.append(digest.hexdigest())
    return found


def total_size(parts: Iterable[MediaPart]) -> int:
    return sum(part.size for part in parts)


def reply_limit(declared: int | None) -> int:
    """The most media bytes a caller takes in one reply: what the capability declares, or :data:`MAX_MEDIA_BYTES`
    when its record declares none (the caller's view of a capability may be older or written by hand)."""
    return declared or MAX_MEDIA_BYTES


def check_size(size: int, limit: int, capability: str) -> None:
    """Refuse ``size`` media bytes above ``limit`` with an error naming both and how to raise the limit."""
    if size and not limit:
        raise MediaTooLarge(
            f"{capability!r} takes no media parts ({size} bytes sent); declare max_media_bytes on the capability "
            "(and the gateway) to accept them, or send the media by url"
        )
    if size > limit:
        raise MediaTooLarge(
            f"the media parts of {capability!r} are {size} bytes; it accepts at most {limit} "
            f"(raise the capability's max_media_bytes to take more)"
        )


def _decoded_size(text: str) -> int:
    """Bytes that base64 ``text`` decodes to, counted without decoding it."""
    return len(text) * 3 // 4 - text[-2:].count("=")


def parts_from_wire(raw: Sequence[Any], *, limit: int, capability: str) -> list[MediaPart]:
    """Media parts from their JSON form; sizes are checked against ``limit`` before any base64 is decoded.

    A malformed part is a ``RequestError`` naming its index and field; too many bytes, :class:`MediaTooLarge`.
    """
    if len(raw) > MAX_PARTS:
        raise RequestError(f"media: at most {MAX_PARTS} parts travel with one request or reply, got {len(raw)}")
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            raise RequestError(f"media.{index}: a part is a JSON object with 'media_type' and 'data' or 'url'")
        if not isinstance(item.get("data", ""), str):
            raise RequestError(f"media.{index}.data: the bytes travel as base64 text")
    check_size(sum(_decoded_size(item.get("data", "")) for item in raw), limit, capability)
    return [_part(index, item) for index, item in enumerate(raw)]


def _part(index: int, item: dict[str, Any]) -> MediaPart:
    fields = dict(item)
    if "data" in fields:
        try:
            fields["data"] = base64.b64decode(fields["data"], validate=True)
        except (binascii.Error, ValueError):
            raise RequestError(f"media.{index}.data: not base64 text (RFC 4648, with padding)") from None
    try:
        return MediaPart.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'part'}: {e['msg']}" for e in exc.errors())
        raise RequestError(f"media.{index}: {problems}") from None


def wire_size(limit: int) -> int:
    """The largest JSON text that ``limit`` media bytes take as base64 parts (what a body bound must allow)."""
    return (limit + 2) // 3 * 4 + MAX_PARTS * 512
