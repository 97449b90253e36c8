"""DNS rebinding and cross-site calls on ``/mcp``: ``Host`` and ``Origin`` must name the server they reach.

A gateway listening on a loopback address answers only requests whose
``Host`` (and ``Origin``, when sent) name it (its address, ``localhost``,
``127.0.0.1`` or ``::1``): a page that rebinds its own name to 127.0.0.1
sends its own name. On any other address a browser's ``Origin`` must name the
host the request was sent to. The endpoint answers 403 otherwise, as the
spec's "servers MUST validate the Origin header" asks.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from reach_plugins.server.layer import Inbound


def _names(served: str) -> frozenset[str]:
    """What ``Host`` and ``Origin`` may name on a server listening on the loopback address ``served``."""
    return frozenset({served, "localhost", "127.0.0.1", "::1"})


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def foreign(inbound: Inbound) -> str | None:
    """Why a request looks like DNS rebinding or a cross-site browser call (``None`` when it does not)."""
    host = urlsplit(f"//{inbound.headers.get('host', '')}").hostname
    origin = inbound.headers.get("origin")
    origin_host = urlsplit(origin).hostname if origin else None
    served = inbound.request.scope.get("server")
    if served and _loopback(str(served[0])):
        names = _names(str(served[0]))
        if host not in names:
            return f"Host {host!r} does not name this loopback server"
        if origin is not None and origin_host not in names:
            return f"Origin {origin!r} is not this loopback server's"
    elif origin is not None and origin_host != host:
        return f"Origin {origin!r} is not the host the request was sent to"
    return None
