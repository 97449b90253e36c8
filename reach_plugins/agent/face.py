"""What the agent's served faces need of a :class:`~reach_plugins.agent.ReachAgent`, as protocols.

The app (:mod:`.asgi`), the A2A server (:mod:`.a2a`) and the registration (:mod:`.registration`) are built
by the agent; each names here only the part of it it uses, so none of them imports the class that builds it
(no circle inside the room, and each face can be tested against a small stand-in).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from reach_plugins.agent.handlers import CapabilityHandler
    from reach_plugins.agent.outcome import Outcome
    from reach_plugins.model import AgentDescriptor, Capability
    from reach_plugins.security.claims import Claims as TokenClaims
    from reach_plugins.server.inbound import InputLimits
    from reach_plugins.wire.body import WireBody


class Described(Protocol):
    """What a registration announces: the agent's name, its descriptor and whether it is ready."""

    name: str

    def descriptor(self, *endpoints: str) -> AgentDescriptor: ...

    async def is_ready(self) -> bool: ...


class Handling(Described, Protocol):
    """What the A2A server runs a message through: the capabilities, their handlers and the one call path."""

    description: str
    public_url: str | None

    @property
    def capabilities(self) -> list[Capability]: ...

    def handler(self, name: str) -> CapabilityHandler: ...

    async def handle(self, body: WireBody, headers: Mapping[str, str], claims: TokenClaims | None) -> Outcome: ...


class Served(Handling, Protocol):
    """What the HTTP app serves: authentication, limits, both call paths, health and the app's lifespan."""

    limits: InputLimits
    draining: bool

    @property
    def clock_offset(self) -> float | None: ...

    async def authenticate(self, headers: Mapping[str, str]) -> TokenClaims | None: ...

    async def open_stream(
        self, body: WireBody, headers: Mapping[str, str], claims: TokenClaims | None
    ) -> Outcome | AsyncIterator[bytes]: ...

    def lifespan(self) -> AbstractAsyncContextManager[None]: ...
