"""A real A2A 0.3 agent built with ``a2a-sdk`` 0.3.26, run by the tests from ``.venv-a2a03``.

    .venv-a2a03/bin/python tests/peers/a2a03_server.py PORT

The card has the 0.3 ``url`` (no ``supportedInterfaces``). By the first word of
the user's text: ``ask`` asks "Which order?" (input-required) and the next
message of that task completes it; ``status`` completes with a status message
only; ``crash`` raises; anything else works, then answers with an artifact.
``GET /executions`` counts the executor's runs per first word.
"""

from __future__ import annotations

import collections
import sys

import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.apps import A2AStarletteApplication
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentSkill, Part, Task, TaskState, TaskStatus, TextPart
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

EXECUTIONS: collections.Counter[str] = collections.Counter()


def text(value: str) -> Part:
    return Part(root=TextPart(text=value))


class PeerExecutor(AgentExecutor):
    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        EXECUTIONS["cancel"] += 1
        await TaskUpdater(event_queue, context.task_id or "", context.context_id or "").cancel()

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        said = context.get_user_input()
        word = (said.split() or [""])[0]
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        current = context.current_task
        if current is not None and current.status.state == TaskState.input_required:
            EXECUTIONS["answer"] += 1
            await updater.add_artifact([text(f"order {said} is on its way")], name="answer")
            await updater.complete()
            return
        EXECUTIONS[word] += 1
        if current is None:
            task = Task(id=updater.task_id, context_id=updater.context_id, status=TaskStatus(state=TaskState.submitted))
            await event_queue.enqueue_event(task)
        if word == "crash":
            raise RuntimeError("the executor crashed")
        if word == "ask":
            await updater.requires_input(updater.new_agent_message([text("Which order?")]), final=True)
            return
        if word == "status":
            await updater.complete(updater.new_agent_message([text(f"done: {said}")]))
            return
        await updater.start_work(updater.new_agent_message([text("working on it")]))
        await updater.add_artifact([text(f"echo: {said}")], name="reply")
        await updater.complete()


async def executions(request: Request) -> JSONResponse:
    return JSONResponse(dict(EXECUTIONS))


def app(port: int):  # type: ignore[no-untyped-def]
    card = AgentCard(
        name="peer03",
        description="The tests' A2A 0.3 peer.",
        url=f"http://127.0.0.1:{port}/",
        version="0.3.26",
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text"],
        default_output_modes=["text"],
        skills=[AgentSkill(id="echo", name="echo", description="Echo the text.", tags=["test"])],
    )
    handler = DefaultRequestHandler(agent_executor=PeerExecutor(), task_store=InMemoryTaskStore())
    built = A2AStarletteApplication(agent_card=card, http_handler=handler).build()
    built.router.routes.append(Route("/executions", executions))
    return built


if __name__ == "__main__":
    port = int(sys.argv[1])
    uvicorn.run(app(port), host="127.0.0.1", port=port, log_level="warning")
