"""What a streamed reply's items add up to (``POST /reach/stream``): the closing result event, and one reply.

A streaming handler that also answers unary calls ends its stream with
``{"type": "reach.result", "data": ...}`` (the agent SDK's ``Final``): a
unary caller gets that data alone, a streaming one every item as it comes.
A served framework agent sends its work before it as *progress* items
(``{"type": "token" | "update" | "custom", "agent": ..., ...}``): shown by a
host that streams, never part of the reply. The agent SDK and the framework
adapters read a stream the same way here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

PROGRESS_TYPES: Final = frozenset({"token", "update", "custom"})
"""The ``type`` of a progress item: a token of text, a step (node, tool) that finished, the agent's own write."""
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


def is_progress(item: Any) -> bool:
    """Whether ``item`` is a served agent's progress item (shown while it runs, not part of the reply)."""
    return isinstance(item, Mapping) and item.get("type") in PROGRESS_TYPES and isinstance(item.get("agent"), str)


def reply_of(items: list[Any]) -> Any:
    """What a caller that streamed a reach gets as its reply: :func:`collected` without the progress items, and
    the one item of a plain handler's stream as itself (as the unary reach would have it)."""
    kept = [item for item in items if not is_progress(item)]
    return kept[0] if len(kept) == 1 and not is_result(kept[0]) else collected(kept)
