"""The agent SDK's token gate: every reach must carry a valid token for this agent (DESIGN.md 11.4).

With tokens on, the tenant is the token's (``X-Tenant`` and the body's
``tenant`` are ignored), an L3 agent takes only tokens the gateway obtained
for itself, and the handler runs holding the token it received so that reaches
it makes exchange it for new ones (:mod:`reach_plugins.security.held`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Literal

from reach_plugins.errors import TokenDenied
from reach_plugins.security.claims import VIA_GATEWAY, Claims
from reach_plugins.security.context import Served
from reach_plugins.security.held import holding
from reach_plugins.security.verifier import TokenVerifier
from reach_plugins.wire.headers import HEADER_TOKEN

TrustLevel = Literal["L1", "L2", "L3"]
_HEADER = HEADER_TOKEN.lower()


class TokenGate:
    """Verify the ``X-Reach-Token`` of calls to agent ``name`` at ``trust``."""

    def __init__(self, name: str, verifier: TokenVerifier, trust: TrustLevel) -> None:
        self.name = name
        self.verifier = verifier
        self.trust = trust

    async def admit(self, headers: Mapping[str, str]) -> Claims:
        """The caller's claims; ``InvalidToken`` (401) or ``TokenDenied`` (403) naming what is wrong."""
        claims = await self.verifier.verify(headers.get(_HEADER), audience=self.name)
        if self.trust == "L3" and claims.via != VIA_GATEWAY:
            raise TokenDenied(
                f"agent {self.name!r} is L3: it takes calls only through the gateway, and this token was not "
                "obtained by a gateway"
            )
        return claims


@contextmanager
def serving_holding(inner: AbstractContextManager[Served], headers: Mapping[str, str]) -> Iterator[Served]:
    """``inner`` (the served request) plus the token it arrived with — verified by the gate — for the handler's
    own reaches to exchange."""
    with inner as served, holding(headers.get(_HEADER)):
        yield served
