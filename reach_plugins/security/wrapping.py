"""The base of transports that wrap another (token, trust guard, audit): same promises, same close."""

from __future__ import annotations

from reach_plugins.transport import BaseTransport, Transport


class Wrapping(BaseTransport):
    """Keeps every promise of ``inner`` (``owns_retries``, ``hop``); closing closes ``inner``."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.owns_retries = inner.owns_retries
        self.hop = inner.hop

    async def end_session(self, tenant: str | None, session_id: str) -> None:
        await self.inner.end_session(tenant, session_id)

    async def aclose(self) -> None:
        await self.inner.aclose()
