"""What a streamed reply's items add up to (``POST /reach/stream``): the closing result event, and one reply.

A streaming handler that also answers unary calls ends its stream with
``{"type": "reach.result", "data": ...}`` (the agent SDK's ``Final``): a
unary caller gets that data alone, a streaming one every item as it comes.
The agent SDK and the framework adapters read a stream the same way here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

RESULT_EVENT: Final = "reach.result"
"""The ``type`` of the item that closes a stream with its reply: ``{"type": "reach.result", "data": ...}``."""


def result_item(data: Any) -> dict[str, Any]:
    """The closing item carrying ``data``."""
    return {"type": RESULT_EVENT, "data": data}


def is_result(item: Any) -> bool:
    """Whether ``item`` is the closing result item."""
    return isinstance(item, Mapping) and item.get("type") == RESULT_EVENT and set(item) == {"type", "data"}


def collected(items: list[Any]) -> Any:
    """What a stream of ``items`` answers as one reply: a closing result's data, strings joined, else the list."""
    if items and is_result(items[-1]):
        return items[-1]["data"]
    return "".join(items) if items and all(isinstance(item, str) for item in items) else items
