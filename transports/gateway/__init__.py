"""Gateway transport: reach agents through a Reach gateway (``reach gateway``) over HTTP, on aiohttp."""

from transports.gateway.transport import GatewayTransport

__all__ = ["GatewayTransport"]
