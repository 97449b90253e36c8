"""The Reach gateway: one HTTP entry point that authenticates tenants, routes, injects credentials and retries.

``reach gateway --config agents.yaml --host 0.0.0.0 --port 8080`` serves it
under uvicorn; :func:`create_app` builds the Starlette app for any ASGI server
(needs the ``server`` extra); ``/ops`` is its operations page, and
:func:`serve_ops` serves that page alone for a direct-transport fleet (``reach ops``).
What is not HTTP-specific lives in
:mod:`reach_plugins.server` (the forwarder: router + core + next hop; access:
tokens, ``internal_only`` by address; the server layer every route goes
through) and is shared with the gRPC node (:mod:`reach_plugins.node`).
"""

from reach_plugins.gateway.ops import serve_ops
from reach_plugins.gateway.serve import create_app, serve_gateway
from reach_plugins.registry.routetable import RouteTable
from reach_plugins.server.access import Access, SourceRule
from reach_plugins.server.build import build_forwarder
from reach_plugins.server.forwarder import Forwarder, HopTransport

__all__ = [
    "Access",
    "Forwarder",
    "HopTransport",
    "RouteTable",
    "SourceRule",
    "build_forwarder",
    "create_app",
    "serve_gateway",
    "serve_ops",
]
