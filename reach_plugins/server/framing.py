"""Strict request framing: one unambiguous way to tell where a request body ends, or a 400 (request smuggling).

Two parsers that disagree on a body's length let a request hide inside
another one's body. httptools refuses most ambiguous heads and h11 accepts
several (``Content-Length`` and ``Transfer-Encoding`` together, a repeated
or listed ``Content-Length``, obs-fold, bare LF, chunked over HTTP/1.0), so
:mod:`reach_plugins.server.guard` checks every request head with
:func:`framing_problem` before either parser sees it. Sans-IO: a head in,
the problem (or ``None``) out.
"""

from __future__ import annotations

import re
from typing import Final

_TOKEN: Final = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_REQUEST_LINE: Final = re.compile(rb"^[A-Z]+ \S+ HTTP/1\.[01]$")


def framing_problem(head: bytes) -> str | None:
    """Why ``head`` (request line and headers, and the blank line ending them) frames its body ambiguously, or None.

    Accepted: CRLF line ends, field names that are tokens right before the
    colon, at most one ``Content-Length`` of plain digits, at most one
    ``Transfer-Encoding`` that is exactly ``chunked`` (HTTP/1.1 only), and
    never both.
    """
    if head.count(b"\n") != head.count(b"\r\n") or not head.endswith(b"\r\n\r\n"):
        return "a line ends with a bare LF; end every line with CRLF"
    lines = head[:-4].split(b"\r\n")
    if not _REQUEST_LINE.match(lines[0]):
        return "the request line must be 'METHOD target HTTP/1.1'"
    length: list[bytes] = []
    encoding: list[bytes] = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            return "a header is folded over two lines (obs-fold); send each header on one line"
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.match(name):
            return "a header name is not a token directly followed by ':'"
        lowered = name.lower()
        if lowered == b"content-length":
            length.append(value.strip(b" \t"))
        elif lowered == b"transfer-encoding":
            encoding.append(value.strip(b" \t").lower())
    if length and encoding:
        return "both Content-Length and Transfer-Encoding are set; send one"
    if len(length) > 1 or len(encoding) > 1:
        return "Content-Length or Transfer-Encoding appears more than once; send it once"
    if length and not (length[0].isdigit() and len(length[0]) <= 18):
        return "Content-Length must be a number of bytes (digits 0-9)"
    if encoding and encoding[0] != b"chunked":
        return "Transfer-Encoding must be exactly 'chunked'"
    if encoding and lines[0].endswith(b"HTTP/1.0"):
        return "Transfer-Encoding is not allowed in an HTTP/1.0 request"
    return None
