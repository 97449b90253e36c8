"""A2A file parts and media parts, both ways, in both dialects.

1.0 writes a file part flat: ``{"raw": base64, "mediaType", "filename"}`` or
``{"url", ...}``; 0.3 tags it and nests it: ``{"kind": "file", "file":
{"bytes" | "uri", "mimeType", "name"}}``. Reading accepts either.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import ValidationError

from reach_plugins.media import MediaPart

OCTETS = "application/octet-stream"


def file_part(part: MediaPart, dialect: Literal["1.0", "0.3"]) -> dict[str, Any]:
    """``part`` as an A2A file part of ``dialect``."""
    raw = None if part.data is None else base64.b64encode(part.data).decode("ascii")
    if dialect == "0.3":
        file: dict[str, Any] = {"bytes": raw} if raw is not None else {"uri": part.url}
        file["mimeType"] = part.media_type
        return {"kind": "file", "file": file | ({"name": part.name} if part.name else {})}
    found: dict[str, Any] = {"raw": raw} if raw is not None else {"url": part.url}
    found["mediaType"] = part.media_type
    return found | ({"filename": part.name} if part.name else {})


def media_of_parts(parts: Sequence[Mapping[str, Any]]) -> list[MediaPart]:
    """The file parts among ``parts`` (either dialect) as media parts; ``ValueError`` names a malformed one."""
    found: list[MediaPart] = []
    for index, part in enumerate(parts):
        nested = part.get("file")
        source: Mapping[str, Any] = nested if isinstance(nested, Mapping) else part
        raw, url = source.get("raw", source.get("bytes")), source.get("url", source.get("uri"))
        if raw is None and url is None:
            continue
        media = str(source.get("mediaType") or source.get("mimeType") or OCTETS).partition(";")[0].strip().lower()
        name = source.get("filename", source.get("name"))
        fields: dict[str, Any] = {"media_type": media, "name": str(name) if name else None}
        try:
            fields.update({"data": base64.b64decode(str(raw), validate=True)} if raw is not None else {"url": url})
            found.append(MediaPart.model_validate(fields))
        except (binascii.Error, ValidationError) as exc:
            raise ValueError(f"file part {index} is not a media part: {str(exc).splitlines()[-1].strip()}") from None
    return found
