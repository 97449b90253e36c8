"""Broadcast / aggregate: one request to the top-k candidates of a capability, answers gathered as they arrive.

The seeds' second mode of reaching: candidates come from the capability index
(never a broadcast to everyone), each copy is pinned to one candidate and goes
through the same resilience core as any reach, and aggregation completes as
early as it can — at the first success, the first N, a quorum, as soon as N
answers agree (or as soon as those became impossible), or once all answered —
cancelling the stragglers. The result lists who answered, in order of arrival,
and who was cancelled.

``share_summary=True`` is the seeds' other half (004, section 6.2): the first
copy starts at once, each later copy starts when an answer comes in (or
``stagger`` seconds after the previous start) carrying a summary of the
answers already in (``X-Reach-Summary``; ``ReachContext.summary`` at the agent),
so a later target can confirm instead of computing from scratch.

Each copy is pinned with ``reach.target`` (:mod:`reach_plugins.routing.pinning`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Hashable
from typing import Any, Final, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from reach_plugins.errors import NoHealthyAgent, ReachError, RequestError
from reach_plugins.model import ErrorInfo, ReachRequest, ReachResponse
from reach_plugins.policy.dedup import resolve_key
from reach_plugins.routing import Route
from reach_plugins.wire.headers import META_SUMMARY, SUMMARY_BYTES, TARGET


class Sender(Protocol):
    """What a broadcast needs of a client (:class:`~reach_plugins.ReachClient`): candidates, and a way to send."""

    async def candidates(self, request: ReachRequest, *, limit: int | None = None) -> list[Route]: ...

    async def send(self, request: ReachRequest, *, trace: bool = False) -> ReachResponse: ...


DEFAULT_TIMEOUT: Final = 30.0
"""Seconds a broadcast waits when the request sets neither ``deadline`` nor ``timeout_ms``."""

ANSWER_CHARS: Final = 300
"""How much of each answer (as JSON) a summary carries."""

Aggregate = Literal["first", "first_n", "quorum", "agree", "all"]
AgreeKey = Callable[[Any], Hashable]
"""What makes two answers agree (``agree`` aggregate): equal keys. Default: the answer's canonical JSON."""
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
    if aggregate in ("first_n", "agree"):
        n = 2 if n is None and aggregate == "agree" else n
        if n is None or n < 1:
            raise RequestError(f"aggregate {aggregate!r} needs n >= 1 (how many answers to wait for), got {n!r}")
        if n > targets:
            raise NoHealthyAgent(
                f"aggregate {aggregate!r} wants {n} answers but only {targets} candidate(s) are usable"
            )
        return n
    if aggregate == "quorum":
        return targets // 2 + 1
    if aggregate == "all":
        return targets
    raise RequestError(f"unknown aggregate {aggregate!r}: use 'first', 'first_n', 'quorum', 'agree' or 'all'")


def _canonical(data: Any) -> Hashable:
    return json.dumps(data, sort_keys=True, default=str)


def summary_of(responses: list[ReachResponse]) -> str:
    """The answers so far as a compact ASCII JSON list (newest dropped last), within :data:`SUMMARY_BYTES`."""
    items = [
        {
            "agent": response.agent,
            "status": response.status,
            "answer": json.dumps(response.data, default=str)[:ANSWER_CHARS] if response.ok else None,
        }
        for response in responses
    ]
    while True:
        text = json.dumps(items, separators=(",", ":"), ensure_ascii=True)
        if len(text) <= SUMMARY_BYTES or not items:
            return text
        items.pop(0)


def _copies(request: ReachRequest, routes: list[Route], deadline: float) -> list[tuple[str, ReachRequest]]:
    """One pinned copy per candidate, each with its own request id and idempotency key (dedup must not merge them)."""
    copies = []
    for number, route in enumerate(routes, start=1):
        target = f"{route.agent.name}/{route.instance.instance_id}"
        key = resolve_key(request, route.agent, route.capability)
        update = {
            "request_id": f"{request.request_id}.{number}",
            "deadline": deadline,
            "idempotency_key": f"{key}@{target}" if key else None,
            "metadata": {**request.metadata, TARGET: target},
        }
        copies.append((target, request.model_copy(update=update)))
    return copies


async def _one(client: Sender, target: str, request: ReachRequest) -> ReachResponse:
    """One copy's answer; a copy refused before sending becomes a failed answer of its target."""
    try:
        return await client.send(request)
    except ReachError as exc:
        agent, _, instance = target.partition("/")
        error = ErrorInfo(type=exc.error_type, message=exc.message)
        return ReachResponse(request_id=request.request_id, status="fail", error=error, agent=agent, instance=instance)


class _Launcher:
    """Starts the copies: all at once, or (sharing summaries) the first at once and the rest one by one."""

    def __init__(self, client: Sender, copies: list[tuple[str, ReachRequest]], lead: int, stagger: float) -> None:
        self.client, self.waiting, self.stagger = client, list(copies), stagger
        self.tasks: dict[asyncio.Task[ReachResponse], str] = {}
        self.next_at = 0.0
        self.start(lead, [], now=asyncio.get_running_loop().time())

    def start(self, count: int, answers: list[ReachResponse], *, now: float) -> set[asyncio.Task[ReachResponse]]:
        """Start up to ``count`` waiting copies, each carrying the summary of ``answers`` (if any)."""
        started = set()
        summary = summary_of(answers) if answers else None
        for target, copy in self.waiting[:count]:
            if summary is not None:
                copy = copy.model_copy(update={"metadata": {**copy.metadata, META_SUMMARY: summary}})
            task = asyncio.create_task(_one(self.client, target, copy))
            self.tasks[task] = target
            started.add(task)
        del self.waiting[:count]
        self.next_at = now + self.stagger
        return started


async def broadcast(
    client: Sender,
    request: ReachRequest,
    *,
    k: int = 3,
    aggregate: Aggregate = "all",
    n: int | None = None,
    share_summary: bool = False,
    stagger: float = 0.2,
    agree: AgreeKey | None = None,
    clock: Callable[[], float] = time.time,
) -> BroadcastResult:
    """Send ``request`` to the top ``k`` candidates and aggregate within its deadline.

    Raises before sending anything when the request cannot be routed (unknown
    capability, permission) or the aggregate cannot be met by the candidates.
    ``aggregate="agree"`` ends as soon as ``n`` (default 2) answers agree
    (``agree(data)`` keys equal; the answers' JSON by default).
    """
    if k < 1:
        raise RequestError(f"broadcast needs k >= 1 candidates, got {k}")
    routes = await client.candidates(request, limit=k)
    needed = _needed(aggregate, n, len(routes))
    started = clock()
    if request.deadline is not None:
        deadline = request.deadline
    else:
        deadline = started + (request.timeout_ms / 1000.0 if request.timeout_ms else DEFAULT_TIMEOUT)
    copies = _copies(request, routes, deadline)
    launcher = _Launcher(client, copies, 1 if share_summary else len(copies), stagger)
    key = agree or _canonical
    try:
        status, responses = await _aggregate(launcher, needed, aggregate, key, deadline, clock)
    finally:
        stragglers = [task for task in launcher.tasks if not task.done()]
        for task in stragglers:
            task.cancel()
        await asyncio.gather(*stragglers, return_exceptions=True)
    tasks = launcher.tasks
    return BroadcastResult(
        request_id=request.request_id,
        capability=request.capability,
        status=status,
        aggregate=aggregate,
        needed=needed,
        targets=[target for target, _ in copies],
        responses=responses,
        cancelled=[tasks[task] for task in stragglers] + [target for target, _ in launcher.waiting],
    )


def _settled(responses: list[ReachResponse], needed: int, aggregate: Aggregate, key: AgreeKey) -> bool:
    """Whether the answers so far complete the aggregate."""
    wins = [response for response in responses if response.ok]
    if aggregate != "agree":
        return len(wins) >= needed
    counts: dict[Hashable, int] = {}
    for response in wins:
        agreed = counts[key(response.data)] = counts.get(key(response.data), 0) + 1
        if agreed >= needed:
            return True
    return False


async def _aggregate(
    launcher: _Launcher,
    needed: int,
    aggregate: Aggregate,
    key: AgreeKey,
    deadline: float,
    clock: Callable[[], float],
) -> tuple[Status, list[ReachResponse]]:
    """Collect answers until the aggregate is met, became impossible, or the deadline passed."""
    responses: list[ReachResponse] = []
    pending = set(launcher.tasks)
    loop = asyncio.get_running_loop()
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            return "timeout", responses
        wait = min(remaining, max(0.0, launcher.next_at - loop.time())) if launcher.waiting else remaining
        done, pending = await asyncio.wait(pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        responses.extend(task.result() for task in done)
        if _settled(responses, needed, aggregate, key):
            return "success", responses
        if launcher.waiting and (done or loop.time() >= launcher.next_at):
            pending |= launcher.start(max(1, len(done)), responses, now=loop.time())
        possible = sum(1 for response in responses if response.ok) + len(pending) + len(launcher.waiting)
        if possible < needed and (aggregate != "all" or not (pending or launcher.waiting)):
            late = any(response.status == "timeout" for response in responses)
            return ("timeout" if late else "fail"), responses
        if not pending and not launcher.waiting:
            late = any(response.status == "timeout" for response in responses)
            return ("timeout" if late else "fail"), responses
