"""MCP content items as media parts: what a ``tools/call`` result's image, audio and resource items carry.

``image`` and ``audio`` items hold base64 ``data`` and a ``mimeType``; an
embedded ``resource`` holds a base64 ``blob`` (text resources stay text); a
``resource_link`` (or a resource without a blob) whose ``uri`` is http(s)
becomes a URL part. Anything else is left to the reply's ``content``.
:func:`content_of_media` is the same mapping the other way (the gateway's
``/mcp`` answering with a Reach reply's media).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from reach_plugins.media import MediaPart

OCTETS = "application/octet-stream"
BYTES_FIELD = {"image": "data", "audio": "data", "resource": "blob"}
"""Where each content kind carrying bytes holds them (base64)."""


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
        data = source.get(BYTES_FIELD.get(str(kind), "blob"))
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


def content_of_media(parts: Sequence[MediaPart]) -> list[dict[str, Any]]:
    """MCP content items for media parts: ``image/*`` and ``audio/*`` bytes as image and audio items, other bytes
    as an embedded blob ``resource``, a URL part as a ``resource_link``; a resource's ``uri`` is the part's name
    when that is a URI, else ``urn:reach:media:<index>``."""
    items: list[dict[str, Any]] = []
    for index, part in enumerate(parts):
        name = part.name if part.name and urlsplit(part.name).scheme else None
        if part.url is not None:
            items.append(
                {"type": "resource_link", "uri": part.url, "name": part.name or part.url, "mimeType": part.media_type}
            )
            continue
        kind = part.media_type.split("/")[0]
        kind = kind if kind in ("image", "audio") else "resource"
        encoded = base64.b64encode(part.data or b"").decode("ascii")
        if kind == "resource":
            resource = {
                "uri": name or f"urn:reach:media:{index}",
                "mimeType": part.media_type,
                BYTES_FIELD[kind]: encoded,
            }
            items.append({"type": kind, "resource": resource})
        else:
            items.append({"type": kind, BYTES_FIELD[kind]: encoded, "mimeType": part.media_type})
    return items
