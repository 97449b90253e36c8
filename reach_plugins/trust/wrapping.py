"""The base of transports that wrap another (token, trust guard, audit): same retry owner, timer and close."""

from __future__ import annotations

from reach_plugins.transport import BaseTransport, Transport


class Wrapping(BaseTransport):
    """Keeps ``inner``'s ``owns_retries`` and ``enforces_timeout``; closing closes ``inner``."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.owns_retries = inner.owns_retries
        self.enforces_timeout = bool(getattr(inner, "enforces_timeout", False))

    async def aclose(self) -> None:
        await self.inner.aclose()
