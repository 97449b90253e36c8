"""The A2A tasks an agent keeps: one transition table, the continuity rules, listing and history (sans-IO).

A task moves through the states of A2A's lifecycle by :data:`MOVES` only
(``submitted`` -> ``working`` -> a terminal state, or ``input-required`` and
back to ``working`` on the caller's next message); an impossible move raises.
Times are arguments (wall-clock seconds, written on the wire as RFC 3339), so
the table is tested on a fake clock. Tasks are kept in an
:class:`~reach_plugins.stores.budget.LruTable` under their creator's tenant
(:class:`~reach_plugins.stores.keys.ScopedKey`), within its budget of entries
and bytes: another tenant's task is "no task", as an unknown one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from reach_plugins.agent.a2a_parts import in_dialect
from reach_plugins.agent.a2a_rpc import INVALID_PARAMS, TASK_NOT_FOUND, UNSUPPORTED, RpcError
from reach_plugins.errors import EntryTooLarge
from reach_plugins.protocols.a2a_wire import Dialect
from reach_plugins.stores.budget import Budget, LruTable, json_size
from reach_plugins.stores.keys import ScopedKey

KIND = "a2a-task"
TERMINAL: Final = frozenset({"completed", "failed", "canceled", "rejected"})
WAITING: Final = frozenset({"input-required", "auth-required"})
MOVES: Final[dict[str, frozenset[str]]] = {
    "submitted": frozenset({"working", "input-required", *TERMINAL}),
    "working": frozenset({"input-required", "completed", "failed", "canceled"}),
    "input-required": frozenset({"working", "canceled"}),
    "auth-required": frozenset({"working", "canceled"}),
}
"""The lifecycle's moves: from a state (terminal states have none) to the states it may take next."""
MAX_PAGE = 100


def state_name(state: str, dialect: Dialect) -> str:
    """``completed`` as ``dialect`` writes it (1.0: ``TASK_STATE_COMPLETED``)."""
    return state if dialect == "0.3" else "TASK_STATE_" + state.upper().replace("-", "_")


def stamp(now: float) -> str:
    """Wall-clock seconds as the RFC 3339 UTC timestamp A2A statuses carry (to the microsecond, so it sorts)."""
    return datetime.fromtimestamp(now, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def message_in(message: Mapping[str, Any], dialect: Dialect) -> dict[str, Any]:
    """A 1.0 message (role, parts, ids) as ``dialect`` writes it."""
    shaped = {key: value for key, value in message.items() if key not in ("role", "parts")}
    shaped["parts"] = in_dialect(message.get("parts", []), dialect)
    role = str(message.get("role", "ROLE_AGENT"))
    if dialect == "0.3":
        return {**shaped, "kind": "message", "role": "user" if role == "ROLE_USER" else "agent"}
    return {**shaped, "role": role}


@dataclass(slots=True)
class Task:
    """One task: its state and status message, the messages exchanged (``history``) and its artifacts."""

    id: str
    context_id: str
    capability: str
    state: str
    updated: float
    """Wall-clock seconds of the last status change."""
    message: dict[str, Any] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    refusal: str | None = None
    """Why the agent refused the message before running it (a blocking send answers it as -32602)."""

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    def move(self, state: str, now: float, message: dict[str, Any] | None = None) -> None:
        """Take ``state`` (by :data:`MOVES`), its status message and its time; the message joins the history."""
        if state not in MOVES.get(self.state, frozenset()):
            raise ValueError(f"task {self.id}: no move from {self.state!r} to {state!r}")
        self.state, self.updated, self.message = state, now, message
        if message is not None:
            self.history.append(message)

    def status(self, dialect: Dialect) -> dict[str, Any]:
        status: dict[str, Any] = {"state": state_name(self.state, dialect), "timestamp": stamp(self.updated)}
        if self.message is not None:
            status["message"] = message_in(self.message, dialect)
        return status

    def artifact_in(self, artifact: Mapping[str, Any], dialect: Dialect) -> dict[str, Any]:
        return {**artifact, "parts": in_dialect(artifact.get("parts", []), dialect)}

    def shaped(self, dialect: Dialect, *, history: int | None = None, artifacts: bool = True) -> dict[str, Any]:
        """The task in ``dialect``: the last ``history`` messages (all when ``None``, none for 0)."""
        task: dict[str, Any] = {"id": self.id, "contextId": self.context_id, "status": self.status(dialect)}
        if artifacts and self.artifacts:
            task["artifacts"] = [self.artifact_in(a, dialect) for a in self.artifacts]
        kept = self.history if history is None else self.history[-history:] if history > 0 else []
        if kept:
            task["history"] = [message_in(m, dialect) for m in kept]
        return {"kind": "task", **task} if dialect == "0.3" else task

    def size(self) -> int:
        """Bytes this task holds, as the store's budget counts them."""
        return 128 + len(self.id) + len(self.context_id) + json_size([self.message, self.history, self.artifacts])


class TaskBook:
    """The tasks of one agent by tenant, within a budget; the continuity and listing rules of A2A."""

    def __init__(self, budget: Budget) -> None:
        self.table: LruTable[Task] = LruTable(budget, "A2A task")

    def keep(self, tenant: str | None, task: Task) -> None:
        """Store (or re-measure) ``task``; one too large alone is answered but not kept."""
        with contextlib.suppress(EntryTooLarge):
            self.table.put(ScopedKey.of(tenant, KIND, task.id), task, task.size())

    def drop(self, tenant: str | None, task: Task) -> None:
        self.table.pop(ScopedKey.of(tenant, KIND, task.id))

    def find(self, tenant: str | None, task_id: Any) -> Task:
        """The tenant's task ``task_id``; TaskNotFound (-32001) for an unknown one or another tenant's."""
        task = self.table.get(ScopedKey.of(tenant, KIND, task_id)) if isinstance(task_id, str) else None
        if task is None:
            raise RpcError(TASK_NOT_FOUND, f"no task {task_id!r}")
        return task

    def continued(self, tenant: str | None, task_id: Any, context_id: Any) -> Task:
        """The task a message names, if it may take one: not terminal, in the same context, waiting for input."""
        task = self.find(tenant, task_id)
        if task.done:
            raise RpcError(UNSUPPORTED, f"task {task.id} is {task.state}: send a new message without its taskId")
        if context_id and context_id != task.context_id:
            raise RpcError(INVALID_PARAMS, f"task {task.id} belongs to context {task.context_id!r}, not {context_id!r}")
        if task.state not in WAITING:
            raise RpcError(UNSUPPORTED, f"task {task.id} is {task.state}: it takes a message once it asks for one")
        return task

    def listed(self, tenant: str | None, params: Mapping[str, Any], dialect: Dialect) -> dict[str, Any]:
        """ListTasks: the tenant's tasks, newest status first, filtered by context and state, a page at a time."""
        context, state = params.get("contextId"), params.get("status")
        size, token = params.get("pageSize", 50), params.get("pageToken") or "0"
        if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_PAGE:
            raise RpcError(INVALID_PARAMS, f"pageSize must be an integer from 1 to {MAX_PAGE}")
        if not isinstance(token, str) or not token.isdigit():
            raise RpcError(INVALID_PARAMS, "pageToken must be a token a previous ListTasks returned")
        history = history_length(params)
        after = params.get("statusTimestampAfter")
        owner = ScopedKey.of(tenant, KIND, "-").tenant
        found = [
            task
            for key, task in ((key, self.table.peek(key)) for key in list(self.table))
            if task is not None
            and key.tenant == owner
            and (context is None or task.context_id == context)
            and (state is None or state_name(task.state, dialect) == state or task.state == state)
            and (not isinstance(after, str) or stamp(task.updated) > after)
        ]
        found.sort(key=lambda task: task.updated, reverse=True)
        start = int(token)
        page = found[start : start + size]
        more = start + size < len(found)
        artifacts = params.get("includeArtifacts") is not False
        return {
            "tasks": [task.shaped(dialect, history=history, artifacts=artifacts) for task in page],
            "nextPageToken": str(start + size) if more else "",
            "pageSize": size,
            "totalSize": len(found),
        }


def history_length(params: Mapping[str, Any]) -> int | None:
    """``historyLength`` (of GetTask / ListTasks, or a send's ``configuration``); ``None`` when not given."""
    value = params.get("historyLength")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RpcError(INVALID_PARAMS, "historyLength must be a non-negative integer")
    return value
