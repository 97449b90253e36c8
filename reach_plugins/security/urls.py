"""Where a verifier or a caller may fetch keys and tokens from: https, or plain http on a loopback address only.

A JWKS or a token fetched over plain http from another host can be swapped by
anyone on the path (new keys, then forged tokens that verify), so only the
machine itself may be spoken to in the clear (a development issuer).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def secure_url_problem(url: str) -> str | None:
    """Why ``url`` may not serve keys or tokens (not https, and not http on a loopback address), or ``None``."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        return "not a URL"
    if parts.scheme == "https" and host:
        return None
    if parts.scheme != "http" or not host:
        return "write https://host[:port]"
    if _loopback(host):
        return None
    return "plain http only to a loopback address (127.0.0.0/8, ::1); use https for any other host"


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
