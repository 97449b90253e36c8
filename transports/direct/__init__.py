"""Direct HTTP transport: reach agents at their own endpoints (aiohttp by default, httpx on request)."""

from transports.direct.transport import DirectTransport

__all__ = ["DirectTransport"]
