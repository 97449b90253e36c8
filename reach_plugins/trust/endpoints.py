"""Endpoint policy (DESIGN.md 11.4): where the reach layer may send a tenant's request and credentials.

An endpoint is ``http``, ``https`` or ``grpc``, names no userinfo
(``user:pass@``), and never a link-local address (cloud metadata services
live there). Operators may also limit endpoints to networks; the check is the
same on load (``reach agents --load``, YAML) and on read (registry records).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Final
from urllib.parse import urlsplit

from reach_plugins.errors import ConfigError

SCHEMES: Final = frozenset({"http", "https", "grpc"})
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def endpoint_problem(url: str, networks: Iterable[Network] | None = None) -> str | None:
    """Why ``url`` may not be an agent endpoint, or ``None`` when it may."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _ = parts.port
    except ValueError as exc:
        return f"endpoint {url!r} is not a URL ({exc})"
    if parts.scheme not in SCHEMES:
        return f"endpoint {url!r}: the scheme must be http, https or grpc, not {parts.scheme or 'missing'!r}"
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return f"endpoint {url!r} carries userinfo; credentials belong in auth (value_env), never in the URL"
    if not host:
        return f"endpoint {url!r} names no host"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None and address.is_link_local:
        return f"endpoint {url!r} is link-local ({address}); agents never live there (metadata services do)"
    if networks is not None:
        allowed = list(networks)
        if address is None or not any(address in network for network in allowed):
            listed = ", ".join(str(n) for n in allowed) or "none"
            return f"endpoint {url!r} is outside the allowed networks ({listed}); name an address inside them"
    return None


def parse_networks(text: str | Iterable[str]) -> list[Network]:
    """``"10.0.0.0/8,127.0.0.0/8"`` (or a list) -> networks; ``ConfigError`` naming a bad entry."""
    items = text.split(",") if isinstance(text, str) else list(text)
    networks = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ConfigError(f"allowed network {item!r} is not a CIDR block ({exc})") from None
    return networks
