"""A streaming handler's items as the SSE frames of ``/reach/stream``: JSON data, and media parts in chunks.

An item that is media (a part, a list of parts, :class:`~reach_plugins.agent.handlers.WithMedia`) goes as its
data (if any), then each part as a start, chunks and an end (:mod:`reach_plugins.wire.media_stream`), once the
capability's ``max_media_bytes`` allows it: the parts of one stream count together, as the parts of one reply
do, and a part past the limit ends the stream with ``media_too_large`` before any of its bytes is sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from reach_plugins.agent.handlers import dumps, split_media
from reach_plugins.media import check_size
from reach_plugins.model import Capability
from reach_plugins.wire.media_stream import sse_frames
from reach_plugins.wire.sse import encode_sse


class StreamedItems:
    """Frames of one stream's items, counting the media bytes sent against the capability's limit."""

    def __init__(self, capability: Capability) -> None:
        self.capability = capability
        self.sent = 0
        """Media bytes of this stream so far."""

    def frames(self, item: Any) -> Iterator[bytes]:
        data, media = split_media(item)
        if not media:
            yield encode_sse(dumps(item), "data")
            return
        if data is not None:
            yield encode_sse(dumps(data), "data")
        for part in media:
            check_size(self.sent + part.size, self.capability.max_media_bytes, self.capability.name)
            self.sent += part.size
            yield from sse_frames(part)
