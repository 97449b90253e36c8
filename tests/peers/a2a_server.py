"""A real A2A agent built with the official ``a2a-sdk`` (1.x), run by the tests in the peers' virtualenv.

    .venv-peers/bin/python tests/peers/a2a_server.py PORT

At the root, the card lists JSON-RPC 1.0 and 0.3 (the SDK's compat mode) at
``/a2a``; under ``/v1only`` the same agent is served as a plain 1.x agent
(its card has ``supportedInterfaces`` and no ``url``). What
the executor does depends on the first word of the user's text:

* ``ask``: ``input-required`` with the question "Which order?"; the next
  message of the same task completes it with an artifact naming the answer;
* ``status``: completes with a status message only (no artifact);
* ``crash``: the executor raises (the SDK answers JSON-RPC -32603);
* ``refuse``: the task fails with a status message;
* ``slow``: works for 30 s unless cancelled;
* anything else: a "working" status message, then an artifact echoing the text.

``GET /executions`` returns how many times the executor ran, per first word,
so tests count what the agent actually executed.
"""

from __future__ import annotations

import asyncio
import collections
import sys

import uvicorn
from a2a.server.agent_execution.agent_executor import AgentExecutor
from a2a.server.agent_execution.context import RequestContext
from a2a.server.events.event_queue import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part, Task, TaskState, TaskStatus
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

EXECUTIONS: collections.Counter[str] = collections.Counter()


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


def card(port: int, *, compat: bool) -> AgentCard:
    """The card: JSON-RPC 1.0 (and 0.3 with ``compat``, which also adds the 0.3 ``url`` to the served card)."""
    url = f"http://127.0.0.1:{port}/a2a" if compat else f"http://127.0.0.1:{port}/v1only/a2a"
    interfaces = [AgentInterface(protocol_binding="JSONRPC", protocol_version="1.0", url=url)]
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


def agent_routes(port: int, *, compat: bool) -> list[Route]:
    """The card and the JSON-RPC endpoint of one agent; without ``compat`` it lives under ``/v1only``."""
    agent_card = card(port, compat=compat)
    executor, store = PeerExecutor(), InMemoryTaskStore()
    handler = DefaultRequestHandler(agent_executor=executor, task_store=store, agent_card=agent_card)
    prefix = "" if compat else "/v1only"
    return [
        *create_agent_card_routes(agent_card=agent_card, card_url=f"{prefix}/.well-known/agent-card.json"),
        *create_jsonrpc_routes(request_handler=handler, rpc_url=f"{prefix}/a2a", enable_v0_3_compat=compat),
    ]


def app(port: int) -> Starlette:
    """Two agents sharing one executor count: 1.x + 0.3 compat at the root, 1.x only under ``/v1only``."""
    routes = [*agent_routes(port, compat=True), *agent_routes(port, compat=False), Route("/executions", executions)]
    return Starlette(routes=routes)


if __name__ == "__main__":
    port = int(sys.argv[1])
    uvicorn.run(app(port), host="127.0.0.1", port=port, log_level="warning")
