"""MCP content items as media parts: what a ``tools/call`` result's image, audio and resource items carry.

``image`` and ``audio`` items hold base64 ``data`` and a ``mimeType``; an
embedded ``resource`` holds a base64 ``blob`` (text resources stay text); a
``resource_link`` (or a resource without a blob) whose ``uri`` is http(s)
becomes a URL part. Anything else is left to the reply's ``content``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from reach_plugins.media import MediaPart

OCTETS = "application/octet-stream"


def media_of_content(content: Sequence[Mapping[str, Any]]) -> list[MediaPart]:
    """The media parts of MCP content items; ``ValueError`` names an item whose bytes or URL are malformed."""
    found: list[MediaPart] = []
    for index, item in enumerate(content):
        kind = item.get("type")
        source: Mapping[str, Any] = item
        if kind == "resource":
            resource = item.get("resource")
            source = resource if isinstance(resource, Mapping) else {}
        elif kind not in ("image", "audio", "resource_link"):
            continue
        data = source.get("data" if kind in ("image", "audio") else "blob")
        uri = source.get("uri")
        fields: dict[str, Any] = {"media_type": str(source.get("mimeType") or OCTETS).lower()}
        if isinstance(uri, str) and kind != "image" and kind != "audio":
            fields["name"] = str(item.get("name") or uri)[:256]
        try:
            if isinstance(data, str):
                fields["data"] = base64.b64decode(data, validate=True)
            elif isinstance(uri, str) and uri.startswith(("http://", "https://")):
                fields["url"] = uri
            else:
                continue
            found.append(MediaPart.model_validate(fields))
        except (binascii.Error, ValidationError) as exc:
            raise ValueError(f"content[{index}] ({kind}) is not a media part: {str(exc).splitlines()[-1]}") from None
    return found
