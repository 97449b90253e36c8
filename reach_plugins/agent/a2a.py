"""Every :class:`~reach_plugins.agent.ReachAgent` answers A2A too, so a stock A2A client reaches it.

``GET /.well-known/agent-card.json`` publishes a 1.x card (:mod:`.a2a_card`);
JSON-RPC is served at ``/a2a`` and ``/a2a/`` (both 1.0 and 0.3 method names,
answered in the dialect asked) and HTTP+JSON under ``/a2a/rest``
(:mod:`.a2a_rest`). Both bindings run the operations of :class:`A2AServer`.

A message runs one capability through :meth:`ReachAgent.handle` (so its
checks, idempotency and tokens apply) — the one named by the
``reach.capability`` metadata, else the agent's only one — as a task of its
own, in the background: ``SendMessage`` waits for it (unless
``returnImmediately``), a stream and ``SubscribeToTask`` follow it as it
goes, ``CancelTask`` cancels the running handler. A streaming handler's
items are artifact updates as they come. A handler that returns
:func:`~reach_plugins.agent.a2a_parts.ask` leaves the task
``input-required``; a message naming the task (``taskId``) continues it. The
tasks are kept by tenant within a byte budget (:mod:`.a2a_tasks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from reach_plugins.agent.a2a_parts import (
    as_json,
    ask_of,
    files_of,
    in_dialect,
    media_of,
    media_parts,
    normal,
    parts,
    reply_of,
)
from reach_plugins.agent.a2a_rpc import (
    EXTENDED_CARD,
    INTERNAL,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    NOT_CANCELABLE,
    PUSH_NOT_SUPPORTED,
    UNSUPPORTED,
    VERSION,
    RpcError,
)
from reach_plugins.agent.a2a_tasks import TERMINAL, WAITING, TaskBook, history_length, message_in, state_name
from reach_plugins.agent.a2a_tasks import Task as A2ATask
from reach_plugins.agent.outcome import Outcome
from reach_plugins.protocols.a2a_wire import (
    ERROR_META,
    HANDLER_FAILURES,
    METHODS,
    VERSION_HEADER,
    Dialect,
    data_parts,
    parts_of,
    texts,
)
from reach_plugins.server.layer import Inbound
from reach_plugins.stores.budget import DEFAULT_BUDGET, Budget
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.wire.body import WireBody, invalid
from reach_plugins.wire.media_stream import MEDIA_EVENTS, MediaAssembler
from reach_plugins.wire.sse import SseDecoder

if TYPE_CHECKING:
    from reach_plugins.agent.face import Served

OPERATIONS: dict[str, tuple[Dialect, str]] = {
    **{method: (dialect, kind) for dialect, methods in METHODS.items() for kind, method in methods.items()},
    "ListTasks": ("1.0", "list"),
    "SubscribeToTask": ("1.0", "subscribe"),
    "tasks/resubscribe": ("0.3", "subscribe"),
}
PUSH_METHODS = frozenset(
    {
        "CreateTaskPushNotificationConfig",
        "GetTaskPushNotificationConfig",
        "ListTaskPushNotificationConfigs",
        "DeleteTaskPushNotificationConfig",
        "tasks/pushNotificationConfig/set",
        "tasks/pushNotificationConfig/get",
        "tasks/pushNotificationConfig/list",
        "tasks/pushNotificationConfig/delete",
    }
)
EXTENDED_CARD_METHODS = frozenset({"GetExtendedAgentCard", "agent/getAuthenticatedExtendedCard"})
log = logging.getLogger(__name__)
MESSAGE_FIELDS = frozenset({"messageId", "contextId", "taskId", "parts", "metadata", "extensions", "referenceTaskIds"})
"""The fields of a Message kept in a task's history (whatever else a caller sent is not echoed)."""
MAX_RUNNING = 1_000
"""Tasks running at once per agent: a flood of ``returnImmediately`` sends cannot start handlers without end."""
CANCEL_WAIT = 5.0
"""How long CancelTask waits for a cancelled handler to stop before it answers."""
Event = tuple[str, dict[str, Any]]
"""``(kind, 1.0 object)``: ``task``, ``message``, ``statusUpdate`` or ``artifactUpdate``."""


def tenant_of(inbound: Inbound) -> str | None:
    """Whose task: the verified token's tenant, else (tokens off) the ``X-Tenant`` the agent serves it as."""
    claims = inbound.caller
    return claims.tenant if claims is not None else inbound.headers.get("x-tenant")


def check_version(headers: Mapping[str, str]) -> None:
    """``A2A-Version``: absent (0.3), 0.3.x or 1.x are served; any other is VersionNotSupported (-32009)."""
    version = headers.get(VERSION_HEADER.lower(), "").strip()
    if version and not (version.startswith(("0.3", "1.")) or version == "1"):
        raise RpcError(VERSION, f"A2A-Version {version!r} is not served; this agent speaks 1.0 and 0.3")


def shape(event: Event, dialect: Dialect) -> dict[str, Any]:
    """A stream item (or a send's result) in ``dialect``: 1.0 wraps it by kind, 0.3 tags it."""
    kind, item = event
    if kind == "message":
        item = message_in(item, dialect)
    elif kind == "statusUpdate":
        status = dict(item["status"])
        state, status["state"] = status["state"], state_name(status["state"], dialect)
        if "message" in status:
            status["message"] = message_in(status["message"], dialect)
        item = {**item, "status": status}
        if dialect == "0.3":  # 0.3 marks the stream's last event
            item["final"] = state in TERMINAL | WAITING
    elif kind == "artifactUpdate":
        item = {**item, "artifact": {**item["artifact"], "parts": in_dialect(item["artifact"]["parts"], dialect)}}
    if dialect == "1.0":
        return {kind: item}
    names = {"task": "task", "message": "message", "artifactUpdate": "artifact-update", "statusUpdate": "status-update"}
    return {**item, "kind": names[kind]}


def final(event: Event) -> bool:
    """The event a stream ends on: a message, or a status that is terminal or waits for the caller."""
    kind, item = event
    return kind == "message" or (kind == "statusUpdate" and item["status"]["state"] in TERMINAL | WAITING)


@dataclass(eq=False)
class Live:
    """A task being run or followed: its handler's asyncio task and the queues of those following it."""

    runner: asyncio.Task[None] | None = None
    listeners: list[asyncio.Queue[Event]] = field(default_factory=list)

    def publish(self, event: Event) -> None:
        for queue in self.listeners:
            queue.put_nowait(event)


class A2AServer:
    """The A2A face of one agent: its operations (both bindings call them) and the tasks it keeps."""

    def __init__(
        self,
        agent: Served,
        *,
        budget: Budget = DEFAULT_BUDGET,
        wall: Callable[[], float] = time.time,
        max_running: int = MAX_RUNNING,
    ) -> None:
        self.agent = agent
        self.max_running = max_running
        self.book = TaskBook(budget)
        self.live: dict[ScopedKey, Live] = {}
        self.wall = wall
        """Wall-clock seconds for the tasks' timestamps (only on the wire)."""

    async def close(self) -> None:
        """Cancel the handlers still running (the agent is stopping): their tasks end ``canceled``."""
        runners = [live.runner for live in self.live.values() if live.runner is not None and not live.runner.done()]
        for runner in runners:
            runner.cancel()
        await asyncio.gather(*runners, return_exceptions=True)

    # ------------------------------------------------------------------ operations

    def get(self, params: Mapping[str, Any], inbound: Inbound, dialect: Dialect) -> dict[str, Any]:
        task = self.book.find(tenant_of(inbound), params.get("id"))
        return task.shaped(dialect, history=history_length(params))

    def list_tasks(self, params: Mapping[str, Any], inbound: Inbound, dialect: Dialect) -> dict[str, Any]:
        return self.book.listed(tenant_of(inbound), params, dialect)

    async def cancel(self, params: Mapping[str, Any], inbound: Inbound, dialect: Dialect) -> dict[str, Any]:
        """Cancel the task: its running handler is cancelled (and awaited a moment), then it is ``canceled``."""
        tenant = tenant_of(inbound)
        task = self.book.find(tenant, params.get("id"))
        if task.done:
            raise RpcError(NOT_CANCELABLE, f"task {task.id} is {task.state}: it can no longer be cancelled")
        live = self.live.get(self._key(tenant, task))
        runner = live.runner if live is not None else None
        if runner is not None and not runner.done():
            runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(runner), CANCEL_WAIT)
        if not task.done:
            self._move(tenant, task, "canceled")
        return task.shaped(dialect)

    async def subscribe(
        self, params: Mapping[str, Any], inbound: Inbound, dialect: Dialect
    ) -> AsyncIterator[dict[str, Any]]:
        """The task now, then its updates until it ends (UnsupportedOperation for a task that has ended)."""
        tenant = tenant_of(inbound)
        task = self.book.find(tenant, params.get("id"))
        if task.done:
            raise RpcError(UNSUPPORTED, f"task {task.id} is {task.state}: there is nothing left to follow")
        queue = self._follow(tenant, task)
        return self._items(tenant, task, queue, dialect, first=("task", task.shaped("1.0")))

    async def send(
        self, params: Mapping[str, Any], inbound: Inbound, dialect: Dialect, *, stream: bool
    ) -> dict[str, Any] | AsyncIterator[dict[str, Any]]:
        """Run the message's capability as a task: its result (a send), or its events (a stream)."""
        tenant = tenant_of(inbound)
        running = sum(1 for live in self.live.values() if live.runner is not None and not live.runner.done())
        if running >= self.max_running:
            raise RpcError(INTERNAL, f"this agent is running {running} tasks, its most at once; retry later")
        sent = _mapping(params.get("message"))
        given, new = sent.get("contextId"), sent.get("taskId") is None
        task = None if new else self.book.continued(tenant, sent["taskId"], given)
        message, name, payload, media = self._read(params, None if task is None else task.capability)
        if task is None:
            context = given if isinstance(given, str) and given else uuid.uuid4().hex
            task = A2ATask(uuid.uuid4().hex, context, name, "submitted", self.wall())
        try:
            body = WireBody(
                request_id=str(message["messageId"]),
                capability=name,
                payload=payload,
                session_id=task.context_id,
                media=media,
            )
        except ValidationError as exc:
            raise RpcError(INVALID_PARAMS, invalid(exc, "message").message) from None
        user = {k: v for k, v in message.items() if k in MESSAGE_FIELDS}
        task.history.append({**user, "role": "ROLE_USER", "taskId": task.id, "contextId": task.context_id})
        self.book.keep(tenant, task)
        config = _mapping(params.get("configuration"))
        queue = self._follow(tenant, task)
        live = self.live[self._key(tenant, task)]
        live.runner = asyncio.create_task(self._run(tenant, task, body, inbound))
        first: Event = ("task", task.shaped("1.0"))
        if stream:
            return self._items(tenant, task, queue, dialect, first=first, lazy=True)
        history = history_length(config)
        if config.get("returnImmediately") is True or config.get("blocking") is False:
            self._leave(tenant, task, queue)
            return shape(("task", task.shaped("1.0", history=history)), dialect)
        try:
            while not final(event := await queue.get()):
                pass
        finally:
            self._leave(tenant, task, queue)
        if event[0] == "message":
            return shape(event, dialect)
        if task.refusal is not None and new:  # a new task the agent refused to run: no task, an error
            self.book.drop(tenant, task)
            raise RpcError(INVALID_PARAMS, task.refusal)
        return shape(("task", task.shaped("1.0", history=history)), dialect)

    # ------------------------------------------------------------------ running

    def _key(self, tenant: str | None, task: A2ATask) -> ScopedKey:
        return ScopedKey.of(tenant, "a2a-live", task.id)

    def _follow(self, tenant: str | None, task: A2ATask) -> asyncio.Queue[Event]:
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self.live.setdefault(self._key(tenant, task), Live()).listeners.append(queue)
        return queue

    def _leave(self, tenant: str | None, task: A2ATask, queue: asyncio.Queue[Event]) -> None:
        key = self._key(tenant, task)
        live = self.live.get(key)
        if live is None:
            return
        with contextlib.suppress(ValueError):
            live.listeners.remove(queue)
        if not live.listeners and (live.runner is None or live.runner.done()):
            del self.live[key]

    async def _items(
        self,
        tenant: str | None,
        task: A2ATask,
        queue: asyncio.Queue[Event],
        dialect: Dialect,
        *,
        first: Event,
        lazy: bool = False,
    ) -> AsyncIterator[dict[str, Any]]:
        """The events a follower sees, in ``dialect``; ``lazy``: the task snapshot waits for a task event
        (a direct Message answer comes alone)."""
        try:
            if not lazy:
                yield shape(first, dialect)
            while True:
                event = await queue.get()
                if lazy and event[0] != "message":
                    yield shape(first, dialect)
                lazy = False
                yield shape(event, dialect)
                if final(event):
                    return
        finally:
            self._leave(tenant, task, queue)

    def _publish(self, tenant: str | None, task: A2ATask, event: Event) -> None:
        live = self.live.get(self._key(tenant, task))
        if live is not None:
            live.publish(event)

    def _move(
        self, tenant: str | None, task: A2ATask, state: str, text: str | None = None, failure: str | None = None
    ) -> None:
        """Move the task, keep it re-measured, and tell its followers (``failure``: a handler failure's wire code,
        named in the status message's metadata so our client can tell a ``Retryable`` from a business failure)."""
        if task.done:  # cancelled meanwhile: what the handler answered after that is not applied
            return
        message: dict[str, Any] | None = None
        if text is not None:
            message = {
                "messageId": uuid.uuid4().hex,
                "role": "ROLE_AGENT",
                "parts": [{"text": text}],
                "taskId": task.id,
                "contextId": task.context_id,
            }
            if failure in HANDLER_FAILURES:
                message["metadata"] = {ERROR_META: failure}
        task.move(state, self.wall(), message)
        self.book.keep(tenant, task)
        ids = {"taskId": task.id, "contextId": task.context_id}
        self._publish(tenant, task, ("statusUpdate", {**ids, "status": {**task.status("1.0"), "state": state}}))

    def _artifact(self, tenant: str | None, task: A2ATask, found: list[dict[str, Any]], append: bool) -> None:
        """Add ``found`` parts to the run's artifact (text joined to text) and tell the followers."""
        if task.done:
            return
        artifact_id = f"{task.id}-{len(task.history)}"
        artifact = next((a for a in task.artifacts if a["artifactId"] == artifact_id), None)
        if artifact is None:
            artifact = {"artifactId": artifact_id, "name": task.capability, "parts": []}
            task.artifacts.append(artifact)
        kept = artifact["parts"]
        for part in found:
            if "text" in part and kept and "text" in kept[-1]:
                kept[-1] = {"text": kept[-1]["text"] + part["text"]}
            else:
                kept.append(dict(part))
        self.book.keep(tenant, task)
        update = {"artifactId": artifact_id, "name": task.capability, "parts": found}
        ids = {"taskId": task.id, "contextId": task.context_id}
        self._publish(tenant, task, ("artifactUpdate", {**ids, "artifact": update, "append": append}))

    async def _run(self, tenant: str | None, task: A2ATask, body: WireBody, inbound: Inbound) -> None:
        """Run the handler for this message and move the task by what it answered (``working`` is not told:
        a direct Message answer is then the only event)."""
        try:
            task.move("working", self.wall())
            if self.agent.handler(body.capability).streaming:
                await self._stream(tenant, task, body, inbound)
            else:
                self._answered(tenant, task, await self.agent.handle(body, inbound.headers, inbound.caller))
        except asyncio.CancelledError:
            self._move(tenant, task, "canceled")
        except Exception:  # ours, not the handler's (its errors are outcomes): the task fails, no follower hangs
            log.exception("A2A task %s of %r could not be finished", task.id, body.capability)
            self._move(tenant, task, "failed", "the agent could not finish this task")
        finally:
            live = self.live.get(self._key(tenant, task))
            if live is not None and not live.listeners:
                self.live.pop(self._key(tenant, task), None)

    def _answered(self, tenant: str | None, task: A2ATask, outcome: Outcome) -> None:
        error = _mapping(outcome.body.get("error"))
        if outcome.body.get("status") != "success":
            why = str(error.get("message") or f"the agent answered HTTP {outcome.status}")
            if 400 <= outcome.status < 500 and error.get("type") != "business":
                task.refusal = why
            self._move(tenant, task, "failed", why, str(error.get("type")))
        elif not self._result(tenant, task, as_json(outcome.body.get("data")), append=False):
            media = outcome.body.get("media")
            if media:
                self._artifact(tenant, task, media_parts(media), append=outcome.body.get("data") is not None)
            self._move(tenant, task, "completed")

    def _result(self, tenant: str | None, task: A2ATask, value: Any, *, append: bool) -> bool:
        """Apply one result (or streamed item); True when it ended the run: a question, or a direct reply."""
        question, reply = ask_of(value), reply_of(value)
        if question is not None:
            self._move(tenant, task, "input-required", question)
        elif reply is not None:
            self.book.drop(tenant, task)
            message = {
                "messageId": uuid.uuid4().hex,
                "role": "ROLE_AGENT",
                "parts": [{"text": reply}],
                "contextId": task.context_id,
            }
            self._publish(tenant, task, ("message", message))
        else:
            found = parts(value)
            if found:
                self._artifact(tenant, task, found, append=append)
            return False
        return True

    async def _stream(self, tenant: str | None, task: A2ATask, body: WireBody, inbound: Inbound) -> None:
        """A streaming handler: each item an artifact update as it comes, then the task completes (or fails)."""
        opened = await self.agent.open_stream(body, inbound.headers, inbound.caller)
        if isinstance(opened, Outcome):
            self._answered(tenant, task, opened)
            return
        decoder, first = SseDecoder(), True
        limit = self.agent.handler(body.capability).capability.max_media_bytes  # the agent checked it already
        media = MediaAssembler(limit=limit, capability=body.capability)
        frames = aiter(opened)
        try:
            async for frame in frames:
                for event in decoder.feed(frame):
                    if event.event in MEDIA_EVENTS:
                        part = media.feed_sse(event.event, event.data)
                        if part is not None:
                            self._artifact(tenant, task, media_parts([part.to_wire()]), append=not first)
                            first = False
                        continue
                    if event.event == "error":
                        error = json.loads(event.data)
                        self._move(tenant, task, "failed", str(error.get("message", "failed")), str(error.get("type")))
                        return
                    if event.event == "data" and self._result(tenant, task, json.loads(event.data), append=not first):
                        return
                    first = False
        finally:
            await _closed(frames)
        self._move(tenant, task, "completed")

    # ------------------------------------------------------------------ reading a message

    def _read(
        self, params: Mapping[str, Any], continued: str | None
    ) -> tuple[Mapping[str, Any], str, dict[str, Any], list[dict[str, Any]]]:
        """(message, capability, payload, media) of a send request (a continued task keeps its ``continued``
        capability); -32602 naming what is missing. File parts are media for a handler taking ``media``."""
        message = params.get("message")
        if not isinstance(message, Mapping):
            raise RpcError(INVALID_PARAMS, "params.message is required (a Message object)")
        if not isinstance(message.get("messageId"), str) or not message["messageId"]:
            raise RpcError(INVALID_PARAMS, "params.message.messageId is required (a non-empty string)")
        found: list[Mapping[str, Any]] = [normal(part) for part in parts_of(message)]
        if not found:
            raise RpcError(INVALID_PARAMS, "params.message.parts must hold at least one part")
        metadata = {**_mapping(message.get("metadata")), **_mapping(params.get("metadata"))}
        offered = self.agent.capabilities
        name = continued or metadata.get("reach.capability") or (offered[0].name if len(offered) == 1 else None)
        capability = next((c for c in offered if c.name == name), None)
        if capability is None:
            names = ", ".join(c.name for c in offered)
            raise RpcError(INVALID_PARAMS, f"name the skill in metadata 'reach.capability': one of {names}")
        slots, takes_files = self._slots(capability.name)
        payload: dict[str, Any] = {}
        for value in data_parts(found):
            if isinstance(value, Mapping):
                payload.update(value)
        takes_media = self.agent.handler(capability.name).wants_media
        files = [] if takes_media else files_of(found, takes_files)
        if files:
            payload["files"] = files
        text = texts(found)
        slot = next((n for n in slots if n not in payload), None)
        if text and slot:
            payload[slot] = text
        return {**message, "parts": found}, capability.name, payload, media_of(found) if takes_media else []

    def _slots(self, name: str) -> tuple[list[str], bool]:
        """Where a text part may go (the required string parameters of the schema, else of the signature) and
        whether the handler takes ``files``."""
        handler = self.agent.handler(name)
        schema = handler.capability.params_schema
        if schema is not None:
            properties = schema.get("properties", {})
            slots = [n for n in schema.get("required", []) if properties.get(n, {}).get("type") == "string"]
            return slots, "files" in properties
        parameters = handler.signature.parameters
        slots = [
            p.name
            for p in parameters.values()
            if p.name not in ("ctx", "files", "media") and p.default is inspect.Parameter.empty
        ]
        return slots, "files" in parameters


def refused_method(method: str) -> RpcError:
    """The answer to a method this server does not run: push config (-32003), extended card (-32007), else -32601."""
    if method in PUSH_METHODS:
        return RpcError(PUSH_NOT_SUPPORTED, "push notifications are not supported by this agent (see its card)")
    if method in EXTENDED_CARD_METHODS:
        return RpcError(EXTENDED_CARD, "this agent has no extended agent card")
    return RpcError(METHOD_NOT_FOUND, f"method {method!r} is not served")


async def _closed(frames: AsyncIterator[bytes]) -> None:
    """Close the handler's stream when the task stops following it (an ask, a reply, a cancel)."""
    if isinstance(frames, AsyncGenerator):
        await frames.aclose()


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
