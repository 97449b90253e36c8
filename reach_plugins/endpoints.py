"""Endpoint policy (DESIGN.md 11.4): where the reach layer may send a tenant's request and credentials.

An endpoint is ``http``, ``https`` or ``grpc``, names no userinfo
(``user:pass@``), and never a link-local address (cloud metadata services
live there). Operators may also limit endpoints to networks
(``$REACH_ENDPOINT_NETWORKS="10.0.0.0/8,127.0.0.0/8"`` or
:func:`allow_networks`): then only literal addresses inside them pass. The
models check every endpoint with :func:`policy_problem`, so the rule is the
same on load (``reach agents --load``, YAML) and on read (registry records
that break it are ignored with a warning).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from typing import Final
from urllib.parse import urlsplit

from reach_plugins.errors import ConfigError

SCHEMES: Final = frozenset({"http", "https", "grpc"})
ENV_NETWORKS: Final = "REACH_ENDPOINT_NETWORKS"
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
        shown = f"{parts.scheme}://***@{parts.netloc.rpartition('@')[2]}"
        return f"endpoint {shown!r} carries userinfo; credentials belong in auth (value_env), never in the URL"
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


_allowed: list[Network] | None = None
_loaded = False


def allow_networks(networks: str | Iterable[str] | None) -> None:
    """Limit every endpoint of this process to ``networks`` (``None``: any address, the default)."""
    global _allowed, _loaded
    _allowed = None if networks is None else parse_networks(networks)
    _loaded = True


def policy_problem(url: str) -> str | None:
    """:func:`endpoint_problem` under this process's allowed networks (read from the environment once)."""
    if not _loaded:
        allow_networks(os.environ.get(ENV_NETWORKS) or None)
    return endpoint_problem(url, _allowed)
