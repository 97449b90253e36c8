"""``a2a`` agents: A2A 1.x and 0.3 over JSON-RPC, or 1.x over HTTP+JSON, the binding chosen from the agent card.

The card at ``/.well-known/agent-card.json`` is read once per endpoint
(:mod:`reach_plugins.protocols.a2a_wire` picks its 1.x JSON-RPC interface,
else 0.3, else 1.x HTTP+JSON); ``protocol_options.url`` (with ``version``,
default ``"1.0"``) skips it, and ``protocol_options.version`` prefers a
version the card offers.

A blocking reach of a 1.x agent never waits on a held-open request: the
message is sent with ``returnImmediately`` and a task still ``submitted`` or
``working`` is :class:`~reach_plugins.protocols.base.Pending`: the transport
polls ``GetTask`` within the attempt's time and sends ``CancelTask`` when it
gives up (deadline, cancellation, the client closing), so an abandoned task
does not run on at the agent. An executor that raises then shows as a task
that ended ``failed``: a business failure, never re-run. 0.3 agents are sent
``blocking: true`` as before: the 0.3 SDK leaves the task of a crashed
non-blocking executor ``submitted`` for ever (measured with a2a-sdk 0.3), so
polling would turn every crash into a timeout. A stream left early is
cancelled in both versions.

A conversation is an A2A context: ``contextId`` is the request's
``session_id``. A task that stops at ``input-required`` (or ``auth-required``)
is remembered per endpoint, tenant and session, and the next reach of that
session continues it with its ``taskId``. Replies — a ``Message`` or a ``Task``
— are normalised to ``reply_content`` (text parts, else the status message's
text), ``tool_calls`` (always empty) and ``raw_meta`` (ids, state, data parts).

A2A has no idempotency of its own: an executor error answered as JSON-RPC
-32603 (0.3, or a 1.x agent that ignores ``returnImmediately``) is a
``business`` failure, never retried, unless the request carries an idempotency
key and the capability is ``retryable``.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from reach_plugins.media import MediaPart
from reach_plugins.model import ErrorInfo
from reach_plugins.protocols.a2a_files import file_part, media_of_parts
from reach_plugins.protocols.a2a_wire import (
    REST_SEND,
    VERSION_HEADER,
    Binding,
    Operation,
    binding_from_card,
    binding_of,
    data_parts,
    dialect_of,
    failure_type,
    parts_of,
    rpc_body,
    state_of,
    status_parts,
    task_parts,
    task_request,
    texts,
    unwrap,
    user_message,
)
from reach_plugins.protocols.base import (
    EndsOnce,
    HttpRequest,
    HttpResponse,
    NoHandshake,
    Pending,
    decode_json,
    encode_json,
    endpoint_url,
    failure,
    http_failure,
    invalid,
    reach_headers,
    success,
)
from reach_plugins.transport import Call, Reply, StreamEvent
from reach_plugins.wire.sse import SseEvent

CARD_PATH = "/.well-known/agent-card.json"
FAILED_STATES = frozenset({"failed", "rejected", "canceled"})
WAITING_STATES = frozenset({"input-required", "auth-required"})
"""The task paused for the caller: the session's next message continues it."""
FINAL_STATES = FAILED_STATES | WAITING_STATES | {"completed"}
RUNNING_STATES = frozenset({"submitted", "working"})
"""The task is still at work: a blocking reach polls it."""
INTERNAL_ERROR = -32603
TASK_NOT_FOUND = -32001
OPEN_TASKS_KEPT = 4096

TaskKey = tuple[str, str | None, str]


class OpenTasks:
    """Tasks waiting for the caller's next message, per (endpoint, tenant, session); bounded, oldest dropped."""

    def __init__(self, size: int = OPEN_TASKS_KEPT) -> None:
        self._size = size
        self._tasks: OrderedDict[TaskKey, str] = OrderedDict()
        self._lock = threading.Lock()
        """Blocking clients run their own loop in another thread: the map is shared across them."""

    @staticmethod
    def key(call: Call) -> TaskKey | None:
        session = call.request.session_id
        return (call.instance.endpoint, call.request.tenant, session) if session else None

    def get(self, call: Call) -> str | None:
        key = self.key(call)
        with self._lock:
            return self._tasks.get(key) if key else None

    def settle(self, call: Call, task_id: Any, state: str) -> None:
        """Remember a task that waits for the caller; forget it once it reached any other final state."""
        key = self.key(call)
        if key is None or not isinstance(task_id, str):
            return
        with self._lock:
            if state in WAITING_STATES:
                self._tasks[key] = task_id
                self._tasks.move_to_end(key)
                while len(self._tasks) > self._size:
                    self._tasks.popitem(last=False)
            elif state in FINAL_STATES and self._tasks.get(key) == task_id:
                del self._tasks[key]

    def forget(self, call: Call) -> None:
        key = self.key(call)
        with self._lock:
            if key:
                self._tasks.pop(key, None)


def rpc_error(call: Call, raw: Any) -> ErrorInfo:
    """A JSON-RPC error; an executor error (-32603) is retried only with a key on a retryable capability."""
    code = raw.get("code") if isinstance(raw, Mapping) else None
    message = f"A2A error {code}: {(raw.get('message') if isinstance(raw, Mapping) else None) or 'no message'}"
    if code != INTERNAL_ERROR:
        return ErrorInfo(type="business", message=message)
    capability = call.capability or call.agent.capability(call.request.capability)
    if call.request.idempotency_key and (capability is None or capability.retryable):
        return ErrorInfo(type="transient", message=message)
    hint = " (the agent may have acted: A2A has no idempotency, so it is retried only with an idempotency key)"
    return ErrorInfo(type="business", message=message + hint)


def normalised(parts: list[Mapping[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    data = data_parts(parts)
    if data:
        meta["data"] = data
    return {"reply_content": texts(parts), "tool_calls": [], "raw_meta": meta}


def rest_error(response: HttpResponse) -> dict[str, Any] | None:
    """An HTTP+JSON error (a ``google.rpc.Status`` body) as the JSON-RPC error it stands for, else ``None``."""
    try:
        body = json.loads(response.body) if response.body else None
    except (ValueError, UnicodeDecodeError):
        return None
    error = body.get("error") if isinstance(body, Mapping) else None
    if not isinstance(error, Mapping) or not isinstance(error.get("status"), str):
        return None
    reasons = {str(d.get("reason")) for d in error.get("details") or () if isinstance(d, Mapping)}
    codes = {"INTERNAL": INTERNAL_ERROR, "NOT_FOUND": TASK_NOT_FOUND if "TASK_NOT_FOUND" in reasons else None}
    return {"code": codes.get(error["status"]) or error["status"], "message": error.get("message")}


class A2AAdapter(NoHandshake):
    """Client side of an A2A agent (1.x or 0.3 over JSON-RPC, 1.x over HTTP+JSON)."""

    protocol = "a2a"

    def __init__(self) -> None:
        self.open_tasks = OpenTasks()

    def discovery(self, call: Call) -> HttpRequest | None:
        if "url" in call.agent.protocol_options:
            return None
        path = str(call.agent.protocol_options.get("card_path", CARD_PATH))
        return HttpRequest("GET", endpoint_url(call, path), {"Accept": "application/json"})

    def discovered(self, call: Call, response: HttpResponse) -> Binding:
        if response.status != 200:
            raise invalid(call, f"no agent card: HTTP {response.status} at {CARD_PATH}")
        card = decode_json(call, response.body)
        prefer = call.agent.protocol_options.get("version")
        base = call.instance.endpoint.rstrip("/") + "/"
        binding = binding_from_card(card, base, str(prefer) if prefer else None) if isinstance(card, Mapping) else None
        if binding is None:
            raise invalid(call, "the agent card offers no JSON-RPC (A2A 1.x or 0.3) or HTTP+JSON (1.x) interface")
        return binding

    def _binding(self, call: Call, discovered: Any) -> Binding:
        if isinstance(discovered, Binding):
            return discovered
        version = str(call.agent.protocol_options.get("version", "1.0"))
        dialect = dialect_of(version) or "1.0"
        return Binding(endpoint_url(call, str(call.agent.protocol_options.get("url", "/"))), dialect, version)

    def build(self, call: Call, *, stream: bool = False, discovered: Any = None) -> HttpRequest:
        request = call.request
        binding = self._binding(call, discovered)
        message = user_message(
            request.payload,
            binding.dialect,
            message_id=request.request_id,
            context_id=request.session_id,
            task_id=self.open_tasks.get(call),
        )
        message["parts"] += [file_part(part, binding.dialect) for part in request.media]
        params: dict[str, Any] = {
            "message": message,
            "metadata": {"reach.capability": request.capability, "reach.action": request.action},
        }
        if binding.dialect == "0.3":
            params["configuration"] = {"blocking": True}  # see the module docstring: 0.3 is never polled
        elif not stream:
            params["configuration"] = {"returnImmediately": True}
        headers = reach_headers(call, accept="text/event-stream" if stream else "application/json")
        if binding.dialect == "1.0":
            headers[VERSION_HEADER] = binding.version
        operation: Operation = "stream" if stream else "send"
        if binding.transport == "HTTP+JSON":
            return HttpRequest("POST", binding.url.rstrip("/") + REST_SEND[operation], headers, encode_json(params))
        body = rpc_body(request.request_id, binding, operation, params)
        return HttpRequest("POST", binding.url, headers, encode_json(body))

    def pending(self, call: Call, sent: HttpRequest, response: HttpResponse) -> Pending | None:
        """A task answered at once and still at work: ``GetTask`` to poll it, ``CancelTask`` to stop it."""
        if not 200 <= response.status < 300:
            return None
        try:
            result = _result(json.loads(response.body))
        except (ValueError, UnicodeDecodeError):
            return None  # parse says what is wrong with it
        kind, task = unwrap(result) if isinstance(result, Mapping) else (None, {})
        task_id = task.get("id")
        if kind != "task" or not isinstance(task_id, str) or state_of(task) not in RUNNING_STATES:
            return None
        binding, rpc_id = binding_of(sent), call.request.request_id
        poll = task_request(binding, sent.headers, task_id, "get", f"get-{rpc_id}")
        return Pending(poll, task_request(binding, sent.headers, task_id, "cancel", f"cancel-{rpc_id}"))

    def failed_rpc(self, call: Call, raw: Any) -> ErrorInfo:
        """The error of a JSON-RPC error answer; a continued task the agent no longer knows is forgotten."""
        if isinstance(raw, Mapping) and raw.get("code") == TASK_NOT_FOUND:
            self.open_tasks.forget(call)
        return rpc_error(call, raw)

    def parse(self, call: Call, response: HttpResponse) -> Reply:
        if not 200 <= response.status < 300:
            error = rest_error(response)
            if error is None:
                return http_failure(call, response)
            return failure(call, self.failed_rpc(call, error), response.status)
        body = decode_json(call, response.body)
        if isinstance(body, Mapping) and "error" in body:
            return failure(call, self.failed_rpc(call, body["error"]), response.status)
        result = _result(body)
        if not isinstance(result, Mapping):
            raise invalid(call, "expected a JSON-RPC response with 'result' or 'error', or an A2A result object")
        kind, item = unwrap(result)
        if kind == "message":
            meta = {"kind": "message", "message_id": item.get("messageId"), "context_id": item.get("contextId")}
            found = parts_of(item)
            return success(call, normalised(found, meta), response.status, _media(call, found))
        if kind == "task":
            state, parts = state_of(item), task_parts(item)
            self.open_tasks.settle(call, item.get("id"), state)
            if state in FAILED_STATES:
                return failure(call, ErrorInfo(type=failure_type(item), message=texts(parts) or f"A2A task {state}"))
            meta = {"kind": "task", "task_id": item.get("id"), "context_id": item.get("contextId"), "state": state}
            return success(call, normalised(parts, meta), response.status, _media(call, parts))
        raise invalid(call, f"expected a Message or a Task result, got kind {kind!r}")

    def decoder(self, call: Call) -> A2AStreamDecoder:
        return A2AStreamDecoder(call, self)


class A2AStreamDecoder(EndsOnce):
    """Stream events (message, task, status update, artifact update) into stream events.

    A status message's text is a ``data`` event (``raw_meta.kind`` ``status-update``
    and its ``state``), so a task that answers only in its status reaches a
    streaming caller as it reaches a blocking one.
    """

    def __init__(self, call: Call, adapter: A2AAdapter) -> None:
        super().__init__(call)
        self._adapter = adapter
        self._task_id: str | None = None
        """The task this stream follows, once an event named it: what ``abandoned`` cancels."""

    def abandoned(self, opened: HttpRequest) -> HttpRequest | None:
        """``CancelTask`` (``tasks/cancel`` in 0.3) for the task the caller left, over the stream's binding."""
        if self._task_id is None:
            return None
        rpc_id = f"cancel-{self._call.request.request_id}"
        return task_request(binding_of(opened), opened.headers, self._task_id, "cancel", rpc_id)

    def feed(self, event: SseEvent) -> list[StreamEvent]:
        if self._done:
            return []
        try:
            body = json.loads(event.data)
        except ValueError:
            raise invalid(self._call, f"a stream event is not JSON ({event.data[:80]!r})") from None
        if isinstance(body, Mapping) and "error" in body:
            return self._finish(StreamEvent("error", error=self._adapter.failed_rpc(self._call, body["error"])))
        result = _result(body)
        if not isinstance(result, Mapping):
            raise invalid(self._call, "a stream event has no 'result'")
        kind, item = unwrap(result)
        named = item.get("id") if kind == "task" else item.get("taskId")
        if isinstance(named, str) and named:
            self._task_id = named
        if kind == "artifact-update":
            parts = parts_of(item.get("artifact"))
            meta = {"kind": kind, "task_id": item.get("taskId"), "last_chunk": item.get("lastChunk")}
            return [StreamEvent("data", normalised(parts, meta))] if parts else []
        if kind == "message":
            data = normalised(parts_of(item), {"kind": kind, "message_id": item.get("messageId")})
            return [StreamEvent("data", data), *self._finish(StreamEvent("end"))]
        return self._status(kind, item)

    def _status(self, kind: str | None, item: Mapping[str, Any]) -> list[StreamEvent]:
        """A task snapshot or status update: its message's text, then the end or the error it implies."""
        state, parts = state_of(item), status_parts(item)
        task_id = item.get("taskId") if kind == "status-update" else item.get("id")
        self._adapter.open_tasks.settle(self._call, task_id, state)
        if state in FAILED_STATES:
            message = texts(parts) or f"A2A task {state}"
            return self._finish(StreamEvent("error", error=ErrorInfo(type=failure_type(item), message=message)))
        events = [StreamEvent("data", normalised(parts, {"kind": kind, "task_id": task_id, "state": state}))]
        events = events if parts else []
        if state in FINAL_STATES or item.get("final") is True:
            events.extend(self._finish(StreamEvent("end")))
        return events

    def _cut(self) -> str:
        return f"the A2A stream from instance {self._call.instance.instance_id} was cut"


def _media(call: Call, parts: list[Mapping[str, Any]]) -> list[MediaPart]:
    """The answer's file parts as media parts (a malformed one is an invalid response)."""
    try:
        return media_of_parts(parts)
    except ValueError as exc:
        raise invalid(call, str(exc)) from None


def _result(body: Any) -> Any:
    """The A2A result of a body: a JSON-RPC envelope's ``result``, or (HTTP+JSON) the body itself."""
    if isinstance(body, Mapping) and ("result" in body or "jsonrpc" in body):
        return body.get("result")
    return body
