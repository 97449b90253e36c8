"""Text about foreign failures that is safe to show a caller: no credentials, no query strings, no headers.

Redaction by construction (DESIGN.md 11.5): an error, span, event or log line
meant for callers is built from these two functions, never from a foreign
exception's ``str``/``repr`` (aiohttp's carries the request URL with its
query and, for a malformed answer, the request headers) nor from a raw URL.
"""

from __future__ import annotations

from urllib.parse import urlsplit


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
    """What went wrong, by kind only: the exception's class, plus the OS error's text for socket failures."""
    kind = type(exc).__name__
    cause = getattr(exc, "os_error", None)
    if isinstance(exc, OSError) and exc.strerror:
        return f"{kind} ({exc.strerror})"
    if isinstance(cause, OSError) and cause.strerror:
        return f"{kind} ({cause.strerror})"
    return kind
