"""Request ids: random (version 4) UUIDs as 32 hex digits, made in batches because one is made per request."""

from __future__ import annotations

import os

_IDS_AT_ONCE = 256
_VERSION_4 = bytes((byte & 0x0F) | 0x40 for byte in range(256))
_VARIANT_RFC = bytes((byte & 0x3F) | 0x80 for byte in range(256))
_ready_ids: list[str] = []
os.register_at_fork(after_in_child=_ready_ids.clear)  # a child must never hand out its parent's ids


def new_request_id() -> str:
    """A random (version 4) UUID as 32 hex digits, like ``uuid.uuid4().hex``.

    Made 256 at a time from one ``os.urandom`` read (a system call per id was
    a visible share of a request's cost); a forked child starts a batch of its own.
    """
    if not _ready_ids:
        raw = bytearray(os.urandom(16 * _IDS_AT_ONCE))
        raw[6::16] = raw[6::16].translate(_VERSION_4)
        raw[8::16] = raw[8::16].translate(_VARIANT_RFC)
        text = raw.hex()
        _ready_ids.extend(text[n : n + 32] for n in range(0, len(text), 32))
    return _ready_ids.pop()
