"""The two A2A wire dialects a client meets today, read and written in one place.

* A2A 1.x (the current spec, ``a2a-sdk`` 1.x): the agent card lists
  ``supportedInterfaces`` (``url``, ``protocolBinding``, ``protocolVersion``);
  JSON-RPC methods ``SendMessage`` / ``SendStreamingMessage`` / ``GetTask`` /
  ``CancelTask``; every request carries the header ``A2A-Version``; parts are
  ``{"text"}`` / ``{"data"}``, roles ``ROLE_USER``, states
  ``TASK_STATE_COMPLETED``; a result is wrapped by its kind
  (``{"task": {...}}``, ``{"statusUpdate": {...}}``).
* A2A 0.3: the card has ``url`` (plus ``additionalInterfaces``); methods
  ``message/send`` / ``message/stream``; parts and results carry ``kind``.

Two 1.x bindings: JSON-RPC (preferred) and HTTP+JSON (spec section 11:
``POST /message:send``, ``POST /message:stream``, ``GET /tasks/{id}``,
``POST /tasks/{id}:cancel``; bodies are the JSON-RPC ``params`` and
``result`` without the envelope), used when a card offers no JSON-RPC.

Reading accepts both shapes everywhere; writing follows the binding chosen
from the card.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, urljoin

from reach_plugins.errors import HandlerFailed, Retryable
from reach_plugins.protocols.base import TEXT_FIELDS, HttpRequest, encode_json, list_at, mapping_at, payload_text

Dialect = Literal["1.0", "0.3"]
Transport = Literal["JSONRPC", "HTTP+JSON"]
Operation = Literal["send", "stream", "get", "cancel"]
METHODS: dict[Dialect, dict[str, str]] = {
    "1.0": {"send": "SendMessage", "stream": "SendStreamingMessage", "get": "GetTask", "cancel": "CancelTask"},
    "0.3": {"send": "message/send", "stream": "message/stream", "get": "tasks/get", "cancel": "tasks/cancel"},
}
VERSION_HEADER = "A2A-Version"
REST_SEND = {"send": "/message:send", "stream": "/message:stream"}
_WRAPPED = (
    ("task", "task"),
    ("message", "message"),
    ("statusUpdate", "status-update"),
    ("artifactUpdate", "artifact-update"),
)


@dataclass(frozen=True, slots=True)
class Binding:
    """Where and how to speak JSON-RPC to one agent: learnt from its card, or configured."""

    url: str
    dialect: Dialect
    version: str
    """The ``protocolVersion`` sent in ``A2A-Version`` (1.x only)."""
    transport: Transport = "JSONRPC"
    """``HTTP+JSON`` (1.x only) when the card offers no JSON-RPC interface."""


def dialect_of(version: str) -> Dialect | None:
    """``"1.0"`` for any 1.x version, ``"0.3"`` for 0.3.x, else ``None`` (a version this client does not speak)."""
    if version.startswith("1."):
        return "1.0"
    if version.startswith("0.3"):
        return "0.3"
    return None


def binding_from_card(card: Mapping[str, Any], base: str, prefer: str | None = None) -> Binding | None:
    """The binding to use: JSON-RPC 1.x first (or the ``prefer``red version), then 0.3, then 1.x HTTP+JSON."""
    offered: list[Binding] = []
    for item in list_at(card, "supportedInterfaces"):
        if not isinstance(item, Mapping):
            continue
        transport = str(item.get("protocolBinding", "")).upper()
        version, url = str(item.get("protocolVersion", "")), item.get("url")
        dialect = dialect_of(version)
        if transport == "HTTP+JSON" and dialect == "1.0" and isinstance(url, str):
            offered.append(Binding(urljoin(base, url), dialect, version, "HTTP+JSON"))
        elif transport == "JSONRPC" and dialect is not None and isinstance(url, str):
            offered.append(Binding(urljoin(base, url), dialect, version))
    legacy = _legacy_url(card)
    if legacy is not None:
        offered.append(Binding(urljoin(base, legacy), "0.3", str(card.get("protocolVersion", "0.3"))))
    wanted = dialect_of(prefer) if prefer else None
    ranked = sorted(offered, key=lambda b: (b.transport != "JSONRPC", b.dialect != wanted, b.dialect != "1.0"))
    return ranked[0] if ranked else None


def binding_of(sent: HttpRequest) -> Binding:
    """The binding a request we built was sent over (to ask about, or stop, the task it started)."""
    version = sent.headers.get(VERSION_HEADER)
    dialect: Dialect = "1.0" if version else "0.3"
    for path in REST_SEND.values():
        if sent.url.endswith(path):
            return Binding(sent.url.removesuffix(path), dialect, version or "1.0", "HTTP+JSON")
    return Binding(sent.url, dialect, version or "0.3")


def rpc_body(rpc_id: str, binding: Binding, operation: Operation, params: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON-RPC request for ``operation`` in the binding's dialect."""
    return {"jsonrpc": "2.0", "id": rpc_id, "method": METHODS[binding.dialect][operation], "params": dict(params)}


def task_request(
    binding: Binding, headers: Mapping[str, str], task_id: str, operation: Operation, rpc_id: str
) -> HttpRequest:
    """``GetTask`` or ``CancelTask`` of ``task_id`` (HTTP+JSON: ``GET /tasks/{id}``, ``POST /tasks/{id}:cancel``)."""
    sent = {**headers, "Accept": "application/json"}
    if binding.transport == "JSONRPC":
        body = rpc_body(rpc_id, binding, operation, {"id": task_id})
        return HttpRequest("POST", binding.url, sent, encode_json(body))
    url = f"{binding.url.rstrip('/')}/tasks/{quote(task_id, safe='')}"
    if operation == "get":
        return HttpRequest("GET", url, {k: v for k, v in sent.items() if k.lower() != "content-type"})
    return HttpRequest("POST", f"{url}:cancel", sent, b"{}")


def _legacy_url(card: Mapping[str, Any]) -> str | None:
    """A 0.3 card's JSON-RPC URL: ``url`` when its preferred transport is JSON-RPC, else an additional interface."""
    if str(card.get("preferredTransport", "JSONRPC")).upper() == "JSONRPC" and isinstance(card.get("url"), str):
        return str(card["url"])
    for item in list_at(card, "additionalInterfaces"):
        if isinstance(item, Mapping) and str(item.get("transport", "")).upper() == "JSONRPC":
            url = item.get("url")
            if isinstance(url, str):
                return url
    return None


def message_parts(payload: Mapping[str, Any], dialect: Dialect) -> list[dict[str, Any]]:
    """A text part for the user's text, a data part for everything else in the payload."""
    text = payload_text(payload)
    source = next((name for name in TEXT_FIELDS if isinstance(payload.get(name), str)), "messages")
    parts: list[dict[str, Any]] = [{"text": text}] if text is not None else []
    rest = {key: value for key, value in payload.items() if key != source}
    if rest or not parts:
        parts.append({"data": rest})
    if dialect == "0.3":
        return [{"kind": "text" if "text" in part else "data", **part} for part in parts]
    return parts


def user_message(
    payload: Mapping[str, Any], dialect: Dialect, *, message_id: str, context_id: str | None, task_id: str | None
) -> dict[str, Any]:
    """The user's ``Message`` in the binding's dialect, continuing ``task_id`` when one is open."""
    message: dict[str, Any] = {"messageId": message_id, "parts": message_parts(payload, dialect)}
    message.update({"role": "user", "kind": "message"} if dialect == "0.3" else {"role": "ROLE_USER"})
    if context_id:
        message["contextId"] = context_id
    if task_id:
        message["taskId"] = task_id
    return message


def unwrap(result: Mapping[str, Any]) -> tuple[str | None, Mapping[str, Any]]:
    """``(kind, object)`` of a result in either dialect: 0.3 names its ``kind``, 1.x wraps it under one key."""
    kind = result.get("kind")
    if isinstance(kind, str):
        return kind, result
    for key, name in _WRAPPED:
        inner = result.get(key)
        if isinstance(inner, Mapping):
            return name, inner
    if isinstance(result.get("id"), str) and isinstance(result.get("status"), Mapping):
        return "task", result  # GetTask and CancelTask answer a bare Task
    return None, result


def parts_of(container: Any) -> list[Mapping[str, Any]]:
    parts = container.get("parts") if isinstance(container, Mapping) else None
    return [part for part in parts if isinstance(part, Mapping)] if isinstance(parts, list) else []


def texts(parts: list[Mapping[str, Any]]) -> str:
    return "".join(str(part["text"]) for part in parts if part.get("kind", "text") == "text" and "text" in part)


def data_parts(parts: list[Mapping[str, Any]]) -> list[Any]:
    return [part["data"] for part in parts if part.get("kind", "data") == "data" and "data" in part]


def state_of(item: Mapping[str, Any]) -> str:
    """The task state as 0.3 spells it (``TASK_STATE_INPUT_REQUIRED`` -> ``input-required``)."""
    raw = str(mapping_at(item, "status").get("state", ""))
    return raw.lower().removeprefix("task_state_").replace("_", "-")


ERROR_META = "reach.error"
"""The status-message metadata key where our agent SDK names why a task failed when its handler failed."""
HANDLER_FAILURES = frozenset({HandlerFailed.code, Retryable.code})


def failure_type(item: Mapping[str, Any]) -> str:
    """Why a failed task failed: the handler failure our agent SDK named (a ``Retryable`` may be re-run with a
    key), else ``business`` (it ran and failed: never re-run)."""
    named = mapping_at(mapping_at(mapping_at(item, "status"), "message"), "metadata").get(ERROR_META)
    return named if isinstance(named, str) and named in HANDLER_FAILURES else "business"


def status_parts(item: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The parts of a task's (or status update's) status message."""
    return parts_of(mapping_at(item, "status").get("message"))


def task_parts(task: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A finished task's answer: its artifacts' parts, else its status message's."""
    parts = [part for artifact in list_at(task, "artifacts") for part in parts_of(artifact)]
    return parts or status_parts(task)
