"""Text about foreign failures that is safe to show a caller: no credentials, no query strings, no headers.

Redaction by construction (DESIGN.md 11.5): an error, span, event or log line
meant for callers is built from these two functions, never from a foreign
exception's ``str``/``repr`` (aiohttp's carries the request URL with its
query and, for a malformed answer, the request headers) nor from a raw URL.
"""

from __future__ import annotations

import os
import re
from typing import Final
from urllib.parse import urlsplit

_ADDRESS: Final = re.compile(
    r"[a-z][a-z0-9+.-]*://[^\s'\"),;]+"  # a URL (redis://, etcd://, https://...)
    r"|\[[0-9a-f:.]+\](?::\d+)?"  # [IPv6]:port
    r"|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?"  # IPv4[:port]
    r"|\b[a-z0-9][a-z0-9.-]*:\d{2,5}\b",  # host:port
    re.IGNORECASE,
)


def safe_url(url: str) -> str:
    """``url`` without userinfo, query or fragment: ``scheme://host:port/path``."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return "<unparsable URL>"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{port}{parts.path}" if parts.scheme else parts.path.partition("?")[0]


def url_path(url: str) -> str:
    """Only the path of ``url`` (``/reach``): what a caller may learn of an agent's address."""
    try:
        return urlsplit(url).path or "/"
    except ValueError:
        return "<unparsable URL>"


def describe(exc: BaseException) -> str:
    """What went wrong, by kind only: the exception's class, plus the OS's name for a socket error's errno.

    Never the OS error's own text: asyncio's reads "Connect call failed ('10.0.0.5', 8080)".
    """
    kind = type(exc).__name__
    cause = exc if isinstance(exc, OSError) else getattr(exc, "os_error", None)
    if isinstance(cause, OSError) and cause.errno:
        return f"{kind} ({os.strerror(cause.errno)})"
    return kind


def without_addresses(text: str) -> str:
    """``text`` with every URL, IP address and ``host:port`` replaced by ``<address>``: what a caller may read of
    an error that names a backend (Redis, etcd, the issuer) — its kind stays, where it runs does not."""
    return _ADDRESS.sub("<address>", text)
