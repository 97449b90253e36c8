"""What the pipeline needs from its neighbours, stated structurally so either side can change alone.

``reach_plugins.routing.Router`` satisfies :class:`RouterLike`; its ``Route``
(a frozen dataclass) satisfies :class:`RouteLike`. Tests use small fakes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

from reach_plugins.model import AgentDescriptor, Capability, Instance, ReachRequest, RouteDecision
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.transport import Credential


class RouteLike(Protocol):
    """One routing answer: where to send, what serves it there, and why.

    ``decision`` may be built on first read (the router's is): the core reads
    it only for a trace that someone will see; ``affinity`` is what it needs
    on every response.
    """

    @property
    def decision(self) -> RouteDecision: ...

    @property
    def affinity(self) -> str:
        """How a session was placed: ``restored`` and ``degraded`` are reported on the response."""
        ...

    @property
    def agent(self) -> AgentDescriptor: ...

    @property
    def instance(self) -> Instance: ...

    @property
    def capability(self) -> Capability: ...


class RouterLike(Protocol):
    """Picks an instance for a request, skipping ``exclude`` (agent, instance_id) pairs.

    Raises UnknownCapability, PermissionDenied, NoHealthyAgent or CircuitOpen itself.
    """

    def route(self, request: ReachRequest, *, exclude: Collection[tuple[str, str]] = ()) -> RouteLike: ...


class TurnHook(Protocol):
    """Hears when a conversation's turn starts (routed, where to) and ends: hot-spot relief moves idle ones only."""

    def turn_started(self, conversation: ScopedKey, where: tuple[str, str]) -> None: ...

    def turn_ended(self, conversation: ScopedKey, now: float) -> None: ...


CredentialResolver = Callable[[AgentDescriptor, str | None], Credential]
"""``(agent, tenant) -> Credential``: the secret this tenant presents to that agent."""
