"""Broadcast / aggregate: one request to the top-k candidates of a capability, answers gathered as they arrive.

The seeds' second mode of reaching: candidates come from the capability index
(never a broadcast to everyone), each copy is pinned to one candidate and goes
through the same resilience core as any reach, and aggregation completes as
early as it can — at the first success, the first N, a quorum (or as soon as
those became impossible), or once all answered — cancelling the stragglers.
The result lists who answered, in order of arrival, and who was cancelled.

Each copy is pinned with ``reach.target`` (:mod:`reach_plugins.routing.pinning`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Literal

from pydantic import BaseModel, ConfigDict

from reach_plugins.core.dedup import resolve_key
from reach_plugins.errors import NoHealthyAgent, ReachError, RequestError
from reach_plugins.model import ErrorInfo, ReachRequest, ReachResponse
from reach_plugins.routing import Route
from reach_plugins.routing.pinning import TARGET

if TYPE_CHECKING:
    from reach_plugins.client import ReachClient

DEFAULT_TIMEOUT: Final = 30.0
"""Seconds a broadcast waits when the request sets neither ``deadline`` nor ``timeout_ms``."""

Aggregate = Literal["first", "first_n", "quorum", "all"]
Status = Literal["success", "fail", "timeout"]


class BroadcastResult(BaseModel):
    """The aggregate of one broadcast: its status, every answer in order of arrival, and the cancelled targets."""

    model_config = ConfigDict(frozen=True)

    request_id: str
    capability: str
    status: Status
    aggregate: Aggregate
    needed: int
    """Successes the aggregate asked for (1, N, a majority of the targets, or all of them)."""
    targets: list[str]
    responses: list[ReachResponse]
    cancelled: list[str]

    @property
    def answered(self) -> list[str]:
        """``agent/instance`` of every target that answered, first answer first."""
        return [f"{response.agent}/{response.instance}" for response in self.responses]

    @property
    def successes(self) -> list[ReachResponse]:
        return [response for response in self.responses if response.ok]

    @property
    def data(self) -> list[Any]:
        """The data of the successful answers, first answer first."""
        return [response.data for response in self.successes]


def _needed(aggregate: Aggregate, n: int | None, targets: int) -> int:
    if aggregate == "first":
        return 1
    if aggregate == "first_n":
        if n is None or n < 1:
            raise RequestError(f"aggregate 'first_n' needs n >= 1 (how many successes to wait for), got {n!r}")
        if n > targets:
            raise NoHealthyAgent(f"aggregate 'first_n' wants {n} successes but only {targets} candidate(s) are usable")
        return n
    if aggregate == "quorum":
        return targets // 2 + 1
    if aggregate == "all":
        return targets
    raise RequestError(f"unknown aggregate {aggregate!r}: use 'first', 'first_n', 'quorum' or 'all'")


def _copies(request: ReachRequest, routes: list[Route], deadline: float) -> list[tuple[str, ReachRequest]]:
    """One pinned copy per candidate, each with its own request id and idempotency key (dedup must not merge them)."""
    copies = []
    for number, route in enumerate(routes, start=1):
        target = f"{route.agent.name}/{route.instance.instance_id}"
        key = resolve_key(request, route.agent, route.capability)
        update = {
            "request_id": f"{request.request_id}.{number}",
            "mode": "broadcast",
            "deadline": deadline,
            "idempotency_key": f"{key}@{target}" if key else None,
            "metadata": {**request.metadata, TARGET: target},
        }
        copies.append((target, request.model_copy(update=update)))
    return copies


async def _one(client: ReachClient, target: str, request: ReachRequest) -> ReachResponse:
    """One copy's answer; a copy refused before sending becomes a failed answer of its target."""
    try:
        return await client.send(request)
    except ReachError as exc:
        agent, _, instance = target.partition("/")
        error = ErrorInfo(type=exc.error_type, message=exc.message)
        return ReachResponse(request_id=request.request_id, status="fail", error=error, agent=agent, instance=instance)


async def broadcast(
    client: ReachClient,
    request: ReachRequest,
    *,
    k: int = 3,
    aggregate: Aggregate = "all",
    n: int | None = None,
    clock: Callable[[], float] = time.time,
) -> BroadcastResult:
    """Send ``request`` to the top ``k`` candidates and aggregate within its deadline.

    Raises before sending anything when the request cannot be routed (unknown
    capability, permission) or the aggregate cannot be met by the candidates.
    """
    if k < 1:
        raise RequestError(f"broadcast needs k >= 1 candidates, got {k}")
    routes = client.router.candidates(request, limit=k)
    needed = _needed(aggregate, n, len(routes))
    started = clock()
    if request.deadline is not None:
        deadline = request.deadline
    else:
        deadline = started + (request.timeout_ms / 1000.0 if request.timeout_ms else DEFAULT_TIMEOUT)
    copies = _copies(request, routes, deadline)
    tasks = {asyncio.create_task(_one(client, target, copy)): target for target, copy in copies}
    try:
        status, responses = await _aggregate(set(tasks), needed, aggregate, deadline, clock)
    finally:
        stragglers = [task for task in tasks if not task.done()]
        for task in stragglers:
            task.cancel()
        await asyncio.gather(*stragglers, return_exceptions=True)
    return BroadcastResult(
        request_id=request.request_id,
        capability=request.capability,
        status=status,
        aggregate=aggregate,
        needed=needed,
        targets=[target for target, _ in copies],
        responses=responses,
        cancelled=[tasks[task] for task in stragglers],
    )


async def _aggregate(
    pending: set[asyncio.Task[ReachResponse]],
    needed: int,
    aggregate: Aggregate,
    deadline: float,
    clock: Callable[[], float],
) -> tuple[Status, list[ReachResponse]]:
    """Collect answers until ``needed`` succeeded, success became impossible, or the deadline passed."""
    responses: list[ReachResponse] = []
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            return "timeout", responses
        done, pending = await asyncio.wait(pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        responses.extend(task.result() for task in done)
        won = sum(1 for response in responses if response.ok)
        if won >= needed:
            return "success", responses
        if won + len(pending) < needed and (aggregate != "all" or not pending):
            late = any(response.status == "timeout" for response in responses)
            return ("timeout" if late else "fail"), responses
