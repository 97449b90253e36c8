"""A transport that adds the per-hop token for the chosen agent to every call: how a caller's reaches carry tokens.

It wraps the transport that talks to agents (DirectTransport, or the gateway's
and node's next hop) and leaves everything else to it. Only ``reach``
agents get a token: other protocols (OpenAI-compatible, A2A, raw HTTP) are
foreign servers that must not receive Reach tokens.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from reach_plugins.tokens.claims import HEADER_TOKEN
from reach_plugins.tokens.source import TokenSource
from reach_plugins.transport import BaseTransport, Call, Reply, StreamEvent, Transport


class TokenTransport(BaseTransport):
    """``inner`` with an ``X-Reach-Token`` for ``call.agent`` on every call to a ``reach`` agent."""

    def __init__(self, inner: Transport, tokens: TokenSource) -> None:
        self.inner = inner
        self.tokens = tokens
        self.owns_retries = inner.owns_retries
        self.enforces_timeout = bool(getattr(inner, "enforces_timeout", False))

    async def _signed(self, call: Call) -> Call:
        if call.agent.protocol != "reach":
            return call
        token = await self.tokens.token(call.agent.name, call.request.tenant)
        return replace(call, headers={**call.headers, HEADER_TOKEN: token})

    async def send(self, call: Call) -> Reply:
        return await self.inner.send(await self._signed(call))

    async def stream(self, call: Call) -> AsyncIterator[StreamEvent]:
        signed = await self._signed(call)
        async for event in self.inner.stream(signed):
            yield event

    async def aclose(self) -> None:
        """Close the inner transport; the token source belongs to whoever made it."""
        await self.inner.aclose()
