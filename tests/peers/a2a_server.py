"""A real A2A agent built with the official ``a2a-sdk`` (1.x), run by the tests in the peers' virtualenv.

    .venv-peers/bin/python tests/peers/a2a_server.py PORT

At the root, the card lists JSON-RPC 1.0 and 0.3 (the SDK's compat mode) at
``/a2a``; under ``/v1only`` the same agent is served as a plain 1.x agent
(its card has ``supportedInterfaces`` and no ``url``); under ``/rest`` it is
served over HTTP+JSON only (its card offers no JSON-RPC). What
the executor does depends on the first word of the user's text:

* ``ask``: ``input-required`` with the question "Which order?"; the next
  message of the same task completes it with an artifact naming the answer;
* ``status``: completes with a status message only (no artifact);
* ``crash``: the executor raises (the SDK answers JSON-RPC -32603);
* ``refuse``: the task fails with a status message;
* ``slow``: works for 30 s unless cancelled;
* anything else: a "working" status message, then an artifact echoing the text.

``GET /executions`` returns how many times the executor ran, per first word,
so tests count what the agent actually executed; it also counts the requests
the handler served that were not messages (``get_task``, ``cancel_task``),
the messages sent with ``returnImmediately``, and the executor's cancellations
(``cancel``). ``GET /tasks-of/{context}`` lists the states of that context's tasks.
"""

from __future__ import annotations

import asyncio
import collections
import sys

import uvicorn
from a2a.server.agent_execution.agent_executor import AgentExecutor
from a2a.server.agent_execution.context import RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    CancelTaskRequest,
    GetTaskRequest,
    Part,
    SendMessageRequest,
    Task,
    TaskState,
    TaskStatus,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

EXECUTIONS: collections.Counter[str] = collections.Counter()
STATES: dict[str, tuple[str, str]] = {}
"""Task id -> (context id, latest state name), as the agents' stores saved them."""


class WatchedStore(InMemoryTaskStore):
    """The SDK's in-memory store, noting each task's latest state (``GET /tasks-of/{context}``)."""

    async def save(self, task: Task, context: ServerCallContext) -> None:
        STATES[task.id] = (task.context_id, TaskState.Name(task.status.state))
        await super().save(task, context)


class CountingHandler(DefaultRequestHandler):
    """The SDK's handler, counting GetTask, CancelTask and messages sent with returnImmediately."""

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        EXECUTIONS["get_task"] += 1
        return await super().on_get_task(params, context)

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        EXECUTIONS["cancel_task"] += 1
        return await super().on_cancel_task(params, context)

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> object:
        if params.configuration.return_immediately:
            EXECUTIONS["return_immediately"] += 1
        return await super().on_message_send(params, context)


class PeerExecutor(AgentExecutor):
    """The behaviours listed in the module docstring."""

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        EXECUTIONS["cancel"] += 1
        await TaskUpdater(event_queue, context.task_id or "", context.context_id or "").cancel()

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = context.get_user_input()
        word = (text.split() or [""])[0]
        task_id, context_id = context.task_id or "", context.context_id or ""
        updater = TaskUpdater(event_queue, task_id, context_id)
        current = context.current_task
        if current is not None and current.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            EXECUTIONS["answer"] += 1
            await updater.add_artifact([Part(text=f"order {text} is on its way")], name="answer")
            await updater.complete()
            return
        EXECUTIONS[word] += 1
        if current is None:
            status = TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)
            await event_queue.enqueue_event(Task(id=task_id, context_id=context_id, status=status))
        if word == "crash":
            raise RuntimeError("the executor crashed")
        if word == "ask":
            await updater.requires_input(updater.new_agent_message([Part(text="Which order?")]))
            return
        if word == "status":
            await updater.complete(updater.new_agent_message([Part(text=f"done: {text}")]))
            return
        if word == "refuse":
            await updater.failed(updater.new_agent_message([Part(text="cannot do that")]))
            return
        await updater.start_work(updater.new_agent_message([Part(text="working on it")]))
        if word == "slow":
            await asyncio.sleep(30)
        await updater.add_artifact([Part(text=f"echo: {text}")], name="reply")
        await updater.complete()


def card(port: int, *, compat: bool, rest: bool = False) -> AgentCard:
    """The card: JSON-RPC 1.0 (and 0.3 with ``compat``, which also adds the 0.3 ``url``), or HTTP+JSON only."""
    url = f"http://127.0.0.1:{port}/a2a" if compat else f"http://127.0.0.1:{port}/v1only/a2a"
    interfaces = [AgentInterface(protocol_binding="JSONRPC", protocol_version="1.0", url=url)]
    if rest:
        interfaces = [
            AgentInterface(protocol_binding="HTTP+JSON", protocol_version="1.0", url=f"http://127.0.0.1:{port}/rest/v1")
        ]
    if compat:
        interfaces.append(AgentInterface(protocol_binding="JSONRPC", protocol_version="0.3", url=url))
    return AgentCard(
        name="peer",
        description="The tests' A2A peer.",
        version="1.0.0",
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text"],
        default_output_modes=["text"],
        skills=[AgentSkill(id="echo", name="echo", description="Echo the text.", tags=["test"])],
        supported_interfaces=interfaces,
    )


async def executions(request: Request) -> JSONResponse:
    return JSONResponse(dict(EXECUTIONS))


async def tasks_of(request: Request) -> JSONResponse:
    """The latest state of every task of one context (what a test checks was cancelled)."""
    context = request.path_params["context"]
    return JSONResponse([state for owner, state in list(STATES.values()) if owner == context])


def agent_routes(port: int, *, compat: bool, rest: bool = False) -> list[Route]:
    """One agent's card and endpoint: JSON-RPC (without ``compat`` under ``/v1only``), or HTTP+JSON under ``/rest``."""
    agent_card = card(port, compat=compat, rest=rest)
    executor, store = PeerExecutor(), WatchedStore()
    handler = CountingHandler(agent_executor=executor, task_store=store, agent_card=agent_card)
    prefix = "/rest" if rest else "" if compat else "/v1only"
    served = (
        create_rest_routes(request_handler=handler, path_prefix="/rest/v1")
        if rest
        else create_jsonrpc_routes(request_handler=handler, rpc_url=f"{prefix}/a2a", enable_v0_3_compat=compat)
    )
    return [*create_agent_card_routes(agent_card=agent_card, card_url=f"{prefix}/.well-known/agent-card.json"), *served]


def app(port: int) -> Starlette:
    """Three agents sharing one executor count: 1.x + 0.3 compat at the root, 1.x only, HTTP+JSON only."""
    routes = [
        Route("/executions", executions),
        Route("/tasks-of/{context}", tasks_of),
        *agent_routes(port, compat=True),
        *agent_routes(port, compat=False),
        *agent_routes(port, compat=False, rest=True),
    ]
    return Starlette(routes=routes)


if __name__ == "__main__":
    port = int(sys.argv[1])
    uvicorn.run(app(port), host="127.0.0.1", port=port, log_level="warning")
