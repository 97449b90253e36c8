"""A transport that adds the per-hop token for the chosen agent to every call: how a caller's reaches carry tokens.

It wraps the transport that talks to agents (DirectTransport, or the gateway's
and node's next hop) and leaves everything else to it. Only ``reach``
agents get a token: other protocols (OpenAI-compatible, A2A, raw HTTP) are
foreign servers that must not receive Reach tokens.
"""

from __future__ import annotations

from reach_plugins.security.source import TokenSource
from reach_plugins.security.wrapping import Wrapping
from reach_plugins.transport import Call, EventStream, Reply, Transport
from reach_plugins.wire.headers import HEADER_TOKEN


class TokenTransport(Wrapping):
    """``inner`` with an ``X-Reach-Token`` for ``call.agent`` on every call to a ``reach`` agent.

    Closing closes ``inner``; the token source belongs to whoever made it.
    """

    def __init__(self, inner: Transport, tokens: TokenSource) -> None:
        super().__init__(inner)
        self.tokens = tokens

    async def _signed(self, call: Call) -> Call:
        if call.agent.protocol != "reach":
            return call
        token = await self.tokens.token(call.agent.name, call.request.tenant, trust=call.agent.trust_level)
        headers = {**call.headers, HEADER_TOKEN: token}
        # Built field by field: dataclasses.replace introspects the fields on every call (a hot path).
        return Call(
            call.request,
            call.agent,
            call.instance,
            call.timeout,
            call.attempt,
            call.capability,
            call.credential,
            headers,
            call.span,
        )

    async def send(self, call: Call) -> Reply:
        return await self.inner.send(await self._signed(call))

    async def stream(self, call: Call) -> EventStream:
        signed = await self._signed(call)
        async for event in self.inner.stream(signed):
            yield event
