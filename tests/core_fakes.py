"""Fakes for the resilience core's tests: a small router and a fault-injecting agent behind MockTransport.

``FakeAgent`` plays every instance of an agent on the fake clock. Each
instance has a default behaviour and an optional queue of scripted ones:

    ok            answer (after ``latency``)
    503 / 502 / 504 / 500 / 404 / 429:<s>   HTTP-style failures (429 with Retry-After)
    business      an ``error.type == "business"`` refusal
    backpressure:<s>  an explicit backpressure reply with a hinted delay
    connect       ConnectError (never executed)
    reset         execute, then ConnectionLost
    lost          execute, then ReadTimeout (the reply is lost after the commit)
    hang          never answer (the pipeline's timeout must cut it)
    slow:<s>      answer after <s> seconds
    flaky:<p>     503 with probability <p> (seeded), else ok
    lossy:<p>     lost with probability <p> (seeded), else ok
    garbage       InvalidResponse
"""

from __future__ import annotations

import itertools
import random
from collections import Counter, deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from reach_plugins.errors import (
    CircuitOpen,
    ConnectError,
    ConnectionLost,
    InvalidResponse,
    NoHealthyAgent,
    ReadTimeout,
    UnknownCapability,
)
from reach_plugins.model import (
    AgentDescriptor,
    CandidateScore,
    Capability,
    ErrorInfo,
    Instance,
    ReachRequest,
    RouteDecision,
)
from reach_plugins.testing.clock import FakeClock
from reach_plugins.transport import Call, MockTransport, Reply


def make_agent(
    name: str = "orders", *, instances: int = 3, capability: Capability | str = "query_order", **fields: Any
) -> AgentDescriptor:
    """An agent with ``instances`` instances ``{name}-0..``; extra fields go to AgentDescriptor."""
    cap = Capability(name=capability) if isinstance(capability, str) else capability
    listed = [
        Instance(agent=name, instance_id=f"{name}-{i}", endpoint=f"http://{name}-{i}.test") for i in range(instances)
    ]
    return AgentDescriptor(name=name, capabilities=[cap], instances=listed, **fields)


@dataclass(frozen=True, slots=True)
class FakeRoute:
    decision: RouteDecision
    agent: AgentDescriptor
    instance: Instance
    capability: Capability

    @property
    def affinity(self) -> str:
        return self.decision.affinity


@dataclass
class FakeRouter:
    """Round robin over the instances of agents offering the capability; honours exclude and is_available."""

    agents: Sequence[AgentDescriptor]
    is_available: Any = None
    context_restore: bool = False
    degraded: bool = False
    routed: int = 0
    _turn: itertools.count[int] = field(default_factory=itertools.count)

    def route(self, request: ReachRequest, *, exclude: Collection[tuple[str, str]] = ()) -> FakeRoute:
        self.routed += 1
        offering = [agent for agent in self.agents if agent.capability(request.capability) is not None]
        if not offering:
            raise UnknownCapability(request.capability)
        pairs = [(agent, inst) for agent in offering for inst in agent.instances]
        allowed = [(a, i) for a, i in pairs if (a.name, i.instance_id) not in exclude]
        if not allowed:
            raise NoHealthyAgent(f"every instance offering {request.capability!r} was excluded")
        healthy = [(a, i) for a, i in allowed if self.is_available is None or self.is_available(a.name, i.instance_id)]
        if not healthy:
            raise CircuitOpen(f"every breaker for {request.capability!r} is open")
        agent, instance = healthy[next(self._turn) % len(healthy)]
        capability = agent.capability(request.capability)
        assert capability is not None
        decision = RouteDecision(
            capability=capability.name,
            candidates=[CandidateScore(agent=a.name, instance=i.instance_id, score=1.0) for a, i in healthy],
            agent=agent.name,
            instance=instance.instance_id,
            endpoint=instance.endpoint,
            reason="round robin (fake)",
            affinity="restored" if self.context_restore else "degraded" if self.degraded else "none",
            context_restore=self.context_restore,
            degraded=self.degraded,
        )
        return FakeRoute(decision, agent, instance, capability)


class FakeAgent:
    """Every instance of the agents under test, on virtual time, counting side effects."""

    def __init__(
        self, clock: FakeClock, *, latency: float = 0.01, honours_idempotency: bool = True, seed: int = 0
    ) -> None:
        self.clock = clock
        self.rng = random.Random(seed)
        self.latency = latency
        self.honours_idempotency = honours_idempotency
        self.defaults: dict[str, str] = {}
        self.scripts: dict[str, deque[str]] = {}
        self.executions: Counter[str] = Counter()
        """Side effects per operation (the payload's ``op`` if present, else the request id)."""
        self.sent: Counter[str] = Counter()
        """Calls received per instance."""
        self.results: dict[str, Any] = {}
        self.transport = MockTransport(self.handle, record=1_000_000)

    @property
    def calls(self) -> list[Call]:
        return self.transport.calls

    def default(self, behaviour: str, *instances: str) -> None:
        for instance in instances or ("*",):
            self.defaults[instance] = behaviour

    def script(self, instance: str, *behaviours: str) -> None:
        self.scripts.setdefault(instance, deque()).extend(behaviours)

    def _behaviour(self, instance: str) -> str:
        queue = self.scripts.get(instance) or self.scripts.get("*")
        if queue:
            return queue.popleft()
        return self.defaults.get(instance, self.defaults.get("*", "ok"))

    def _execute(self, call: Call) -> Any:
        key = call.headers.get("Idempotency-Key")
        if self.honours_idempotency and key is not None and key in self.results:
            return self.results[key]
        operation = str(call.request.payload.get("op", call.request.request_id))
        self.executions[operation] += 1
        result = {
            "served_by": call.instance.instance_id,
            "payload": call.request.payload,
            "n": self.executions[operation],
        }
        if key is not None:
            self.results[key] = result
        return result

    async def handle(self, call: Call) -> Reply:
        instance = call.instance.instance_id
        self.sent[instance] += 1
        kind, _, arg = self._behaviour(instance).partition(":")
        if kind == "flaky":
            kind, arg = ("503", "") if self.rng.random() < float(arg) else ("ok", "")
        if kind == "lossy":
            kind, arg = ("lost", "") if self.rng.random() < float(arg) else ("ok", "")
        if kind == "hang":
            await self.clock.sleep(1e9)
        await self.clock.sleep(float(arg) if kind == "slow" else self.latency)
        if kind in ("ok", "slow"):
            return Reply(status="success", data=self._execute(call), agent=call.agent.name, instance=instance)
        if kind == "connect":
            raise ConnectError(f"connection refused by {instance}")
        if kind == "reset":
            self._execute(call)
            raise ConnectionLost(f"{instance} reset the connection")
        if kind == "lost":
            self._execute(call)
            raise ReadTimeout(f"{instance} executed but the reply was lost")
        if kind == "garbage":
            raise InvalidResponse(f"{instance} answered something that is not JSON")
        if kind == "business":
            return Reply(status="fail", error=ErrorInfo(type="business", message="order not found"), status_code=200)
        if kind == "backpressure":
            error = ErrorInfo(type="backpressure", message="queue full", retry_after=float(arg))
            return Reply(status="fail", error=error, status_code=200)
        retry_after = float(arg) if arg else None
        return Reply(status="fail", status_code=int(kind), retry_after=retry_after)
