"""What a handler returns to an A2A caller besides data, and how results and messages become A2A parts.

A handler's plain result keeps working everywhere (``/reach`` too): a string
is a text part; a mapping with ``reply_content`` that text, then a data part;
any other JSON value a data part, then its JSON as text (for clients that read
only text; the data part comes first, where A2A readers look for it). For A2A it may also return

* :class:`File` (bytes or a URL, with ``media_type`` / ``filename``): a file part;
  a list of files and strings is one part each;
* :func:`ask` (``return ask("Which account?")``): the task stays
  ``input-required`` with that question, and the caller's next message to the
  task calls the handler again (``ctx.session_id`` is the task's context, so
  ``ctx.state`` carries what it knew);
* :class:`Reply`: a direct Message answer, no task.

Each is a pydantic model with a ``kind`` tag, so it crosses ``/reach``, the
stream and the idempotency store as JSON and is still recognised here.
A message's file parts reach a handler that declares a ``files`` parameter
(a list of :class:`File` fields as JSON), or one that declares ``media`` (as
:class:`~reach_plugins.media.MediaPart` objects, within the capability's
``max_media_bytes``); a media type the agent does not accept is refused with
ContentTypeNotSupported (-32005). Media parts a handler returns are file parts
of the task's artifact.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from reach_plugins.agent.a2a_rpc import CONTENT_TYPE, INVALID_PARAMS, RpcError
from reach_plugins.agent.handlers import dumps
from reach_plugins.protocols.a2a_wire import Dialect

INPUT_MODES = ("text/plain", "application/json")
"""Media types every agent accepts: text parts and data parts."""
FILE_MODES = ("application/octet-stream", "image/*", "audio/*", "video/*", "text/*", "application/*")
"""What a handler declaring ``files`` also accepts, as file parts."""


class File(BaseModel):
    """A file part: ``raw`` bytes (base64 on the wire) or a ``url``, with its media type and file name."""

    model_config = ConfigDict(frozen=True, ser_json_bytes="base64", val_json_bytes="base64")
    kind: Literal["a2a.file"] = "a2a.file"
    raw: bytes | None = None
    url: str | None = None
    media_type: str | None = None
    filename: str | None = None


class Ask(BaseModel):
    """The handler needs more input: the task waits ``input-required`` with ``question`` as its status message."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["a2a.ask"] = "a2a.ask"
    question: str


class Reply(BaseModel):
    """A direct Message answer (no task): its text."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["a2a.message"] = "a2a.message"
    text: str


def ask(question: str) -> Ask:
    """``return ask("...")`` from a handler: the A2A task asks its caller and waits for the next message."""
    return Ask(question=question)


def as_json(value: Any) -> Any:
    """A handler's result as plain JSON (its models dumped), whichever path it came back by."""
    return json.loads(dumps(value)) if value is not None else None


def _kind(value: Any) -> str | None:
    return value.get("kind") if isinstance(value, Mapping) and isinstance(value.get("kind"), str) else None


def ask_of(value: Any) -> str | None:
    """The question of an :func:`ask` result, else ``None``."""
    return str(value.get("question", "")) if _kind(value) == "a2a.ask" else None


def reply_of(value: Any) -> str | None:
    """The text of a :class:`Reply` result, else ``None``."""
    return str(value.get("text", "")) if _kind(value) == "a2a.message" else None


def _file_part(value: Mapping[str, Any]) -> dict[str, Any]:
    part: dict[str, Any] = {}
    if value.get("raw") is not None:
        part["raw"] = value["raw"]
    elif value.get("url") is not None:
        part["url"] = value["url"]
    for name, wire in (("media_type", "mediaType"), ("filename", "filename")):
        if value.get(name):
            part[wire] = value[name]
    return part


def _one(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"text": value}]
    if _kind(value) == "a2a.file":
        return [_file_part(value)]
    if isinstance(value, Mapping) and isinstance(value.get("reply_content"), str):
        return [{"text": value["reply_content"]}, {"data": value}]
    return [{"data": value}, {"text": json.dumps(value, ensure_ascii=False)}]


def parts(value: Any) -> list[dict[str, Any]]:
    """A (JSON) result as 1.0 parts; a list of strings and files is one part each, ``None`` no part."""
    if value is None:
        return []
    if isinstance(value, list) and value and all(isinstance(v, str) or _kind(v) == "a2a.file" for v in value):
        return [part for item in value for part in _one(item)]
    return _one(value)


def in_dialect(found: Sequence[Mapping[str, Any]], dialect: Dialect) -> list[dict[str, Any]]:
    """1.0 parts as ``dialect`` writes them (0.3 tags each with its kind and nests a file)."""
    if dialect == "1.0":
        return [dict(part) for part in found]
    shaped: list[dict[str, Any]] = []
    for part in found:
        if "text" in part:
            shaped.append({"kind": "text", "text": part["text"]})
        elif "data" in part:
            shaped.append({"kind": "data", "data": part["data"]})
        else:
            file = {"bytes": part["raw"]} if "raw" in part else {"uri": part.get("url")}
            file |= {k: part[w] for k, w in (("mimeType", "mediaType"), ("name", "filename")) if w in part}
            shaped.append({"kind": "file", "file": file})
    return shaped


def normal(part: Mapping[str, Any]) -> dict[str, Any]:
    """A part as 1.0 writes it (0.3's ``kind`` tags and nested ``file`` read too)."""
    if "text" in part:
        return {"text": part["text"]}
    if "data" in part:
        return {"data": part["data"]}
    file = part.get("file")
    source: Mapping[str, Any] = file if isinstance(file, Mapping) else part
    found: dict[str, Any] = {}
    raw, url = source.get("raw", source.get("bytes")), source.get("url", source.get("uri"))
    if raw is not None:
        found["raw"] = raw
    elif url is not None:
        found["url"] = url
    media, name = source.get("mediaType", source.get("mimeType")), source.get("filename", source.get("name"))
    found |= {"mediaType": media} if media else {}
    found |= {"filename": name} if name else {}
    return found


def _media(part: Mapping[str, Any]) -> str:
    return str(part.get("mediaType") or "application/octet-stream")


def _accepts(media: str, modes: Sequence[str]) -> bool:
    media = media.partition(";")[0].strip().lower()
    return any(mode == media or (mode.endswith("/*") and media.startswith(mode[:-1])) for mode in modes)


def media_of(found: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The (1.0) message's file parts as media parts in their JSON form (``raw`` is already base64 text)."""
    media: list[dict[str, Any]] = []
    for part in found:
        if "raw" not in part and "url" not in part:
            continue
        wire = {"media_type": _media(part).partition(";")[0].strip().lower()}
        wire |= {"data": part["raw"]} if "raw" in part else {"url": part["url"]}
        media.append(wire | ({"name": part["filename"]} if part.get("filename") else {}))
    return media


def media_parts(media: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Media parts in their JSON form (a reply's ``media``) as 1.0 file parts."""
    found: list[dict[str, Any]] = []
    for wire in media:
        part: dict[str, Any] = {"raw": wire["data"]} if "data" in wire else {"url": wire.get("url")}
        part["mediaType"] = wire.get("media_type")
        found.append(part | ({"filename": wire["name"]} if wire.get("name") else {}))
    return found


def files_of(found: Sequence[Mapping[str, Any]], takes_files: bool) -> list[dict[str, Any]]:
    """The (1.0) message's file parts as :class:`File` JSON; -32005 for a media type the handler cannot take."""
    files: list[dict[str, Any]] = []
    for part in found:
        if "raw" not in part and "url" not in part:
            continue
        media = _media(part)
        if not (takes_files and _accepts(media, FILE_MODES)):
            raise RpcError(CONTENT_TYPE, f"this agent does not accept {media!r} parts; it accepts {list(INPUT_MODES)}")
        raw = part.get("raw")
        if raw is not None:
            try:
                base64.b64decode(str(raw), validate=True)
            except ValueError:
                raise RpcError(INVALID_PARAMS, "a file part's raw bytes must be base64") from None
        file = {"kind": "a2a.file", "raw": raw, "url": part.get("url"), "media_type": media}
        files.append(file | {"filename": part.get("filename")})
    return files
